"""Where the test suite's CPU goes: each test's CPU seconds (its own process and the children it reaped: servers, CLI
runs, model workers), to find what a 2-core CI machine spends its time on.

    PYTHONPATH=benchmarks python -m pytest -q -p suite_cpu [PYTEST ARGS]   # records one line per test
    python benchmarks/suite_cpu.py [RECORD.jsonl] [--top 30]                # per module, the top tests, the floor

The record goes to ``$SUITE_CPU_OUT`` (default ``.cache/max_profile/suite_cpu.jsonl``; each pytest-xdist worker appends
its tests). A child's CPU counts where the child is reaped: a module fixture's server is counted in the test that
stopped it, so a test's idle share (wall minus CPU) can hold a fixture's start-up. The floor printed is the CPU total
over the cores, the wall time no scheduling can beat (as ``/usr/bin/time -v`` would add user and system time).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_RECORD = REPO / ".cache" / "max_profile" / "suite_cpu.jsonl"


def _cpu_s() -> float:
    """User + system seconds of this process and of the children it has reaped."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cpu0, wall0 = _cpu_s(), time.monotonic()
    yield
    line = {
        "id": item.nodeid,
        "cpu_s": round(_cpu_s() - cpu0, 3),
        "wall_s": round(time.monotonic() - wall0, 3),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
    }
    path = Path(os.environ.get("SUITE_CPU_OUT", str(DEFAULT_RECORD)))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:  # one short line per write: the workers' lines do not interleave
        fh.write(json.dumps(line) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record", nargs="?", default=str(DEFAULT_RECORD))
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()
    rows = [json.loads(line) for line in Path(args.record).read_text().splitlines() if line.strip()]
    total = sum(r["cpu_s"] for r in rows)
    workers = Counter(r["worker"] for r in rows)
    print(f"{len(rows)} tests, {total:.0f} CPU-s; floor on {args.cores} cores: {total / args.cores:.0f} s")
    for worker, count in sorted(workers.items()):
        mine = [r for r in rows if r["worker"] == worker]
        print(
            f"  {worker}: {count} tests, {sum(r['wall_s'] for r in mine):.0f} s in tests, "
            f"{sum(r['cpu_s'] for r in mine):.0f} CPU-s"
        )
    by_module: Counter[str] = Counter()
    for r in rows:
        by_module[r["id"].split("::")[0]] += r["cpu_s"]
    print("\nCPU-s per module")
    for module, cpu in by_module.most_common(args.top):
        print(f"{cpu:8.1f}  {module}")
    print(f"\nthe {args.top} tests with the most CPU (CPU-s, wall s)")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[: args.top]:
        print(f"{r['cpu_s']:8.1f} {r['wall_s']:7.1f}  {r['id']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
