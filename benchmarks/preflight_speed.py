"""Preflight time of a clean custom architecture (goal <= 3 s), with the cost of a bare `import max.pipelines` beside
it.

python benchmarks/preflight_speed.py [SPEC] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec", nargs="?", default=str(REPO / "custom_archs" / "llama_custom"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from max_profile.preflight import check_architecture

    times, floor = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import max.pipelines"], check=True, capture_output=True)
        floor.append(time.perf_counter() - t)
        t = time.perf_counter()
        r = check_architecture(args.spec)
        times.append(time.perf_counter() - t)
        assert r.ok, r.checks
    print(
        f"preflight of {args.spec}: median {statistics.median(times):.2f} s over {args.repeats} (all: "
        f"{', '.join(f'{x:.2f}' for x in times)})"
    )
    print(
        f"a bare `python -c 'import max.pipelines'` on this machine: median {statistics.median(floor):.2f} s (the "
        "floor of any real import)"
    )
    print(f"goal <= 3 s: {'met' if statistics.median(times) <= 3 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
