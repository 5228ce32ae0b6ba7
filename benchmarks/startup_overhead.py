"""What the start-up profile costs a start-up: fresh processes that load a model and generate its first tokens, with
and without max_profile's StartupRecorder, interleaved.

    python benchmarks/startup_overhead.py [--model-path DIR] [--devices cpu|gpu] [--repeats 6]

Without ``--model-path`` a tiny random Llama is built (the project's CPU test model) and compiled once first, so every
measured start-up reads MAX's compile cache (a cold compile's minutes would hide any cost). Each repeat starts one
process per arm in alternating order; each process reports its own process start (``/proc`` start time, the clock the
start-up profile uses) -> the end of a 4-token warm-up generation, its profile built (the profiled arm's whole cost).
Printed: the median of each arm and their ratio (target: profiled / plain <= 1.01), and, load-independent, the
recorder's own work measured inside the profiled processes (the cache folder scanned before and after, MAX's log and
native stderr kept, the profile built) as a share of that start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[3])
arm, path, devices = sys.argv[1], sys.argv[2], sys.argv[4]
from max_profile.collect.probes import startup
from max_profile.collect.probes.startup import _process_start
started = _process_start()
own = {"cache_scan_s": 0.0}
scan = startup.cache_files
def timed_scan(folder):
    t = time.perf_counter()
    try:
        return scan(folder)
    finally:
        own["cache_scan_s"] += time.perf_counter() - t
startup.cache_files = timed_scan
if arm == "profiled":
    from max_profile.runner import LoadSettings, load_and_warm_up
    build = startup.startup_profile  # load_and_warm_up imports it at call time: the timed one is used
    def timed_build(*a, **k):
        t = time.perf_counter()
        try:
            return build(*a, **k)
        finally:
            own["profile_build_s"] = time.perf_counter() - t
    startup.startup_profile = timed_build
    model, profile, _ = load_and_warm_up(LoadSettings(model_path=path, devices=devices, warmup_tokens=4))
    out = {"total_s": time.time() - started, "cache": profile.cache, "own": own}
else:
    from max_profile.runner import generate, load_model
    model = load_model(path, devices=devices)
    generate(model, ["I believe the meaning of life is"], 4)
    out = {"total_s": time.time() - started, "own": own}
model.close()
print("RESULT " + json.dumps(out), flush=True)
"""


def run_child(arm: str, model_path: str, devices: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, arm, model_path, str(REPO), devices],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{arm} child failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(line.removeprefix("RESULT "))  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path")
    ap.add_argument("--devices", default="cpu")
    ap.add_argument("--repeats", type=int, default=6)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from max_profile.tinymodel import build_tiny_llama

    model_path = args.model_path or str(
        build_tiny_llama(Path(tempfile.mkdtemp(prefix="mp-startup-")) / "tiny-llama-f32")
    )
    print(
        "compiling once (not measured) ... "
        f"MODULAR_CACHE_DIR={os.environ.get('MODULAR_CACHE_DIR', '~/.cache/modular')}",
        flush=True,
    )
    run_child("profiled", model_path, args.devices)
    totals: dict[str, list[float]] = {"plain": [], "profiled": []}
    own_share: list[float] = []
    for i in range(args.repeats):
        order = ("plain", "profiled") if i % 2 == 0 else ("profiled", "plain")
        for arm in order:
            res = run_child(arm, model_path, args.devices)
            total = float(res["total_s"])  # type: ignore[arg-type]
            totals[arm].append(total)
            if arm == "profiled":
                own = res["own"]
                assert isinstance(own, dict)
                own_share.append(100.0 * sum(float(v) for v in own.values()) / total)
                if res.get("cache") != "hit":
                    print(
                        f"  note: cache {res.get('cache')} in repeat {i} (a compile happened: this repeat is not a "
                        "fair pair)"
                    )
        print(
            f"repeat {i}: plain {totals['plain'][-1]:.2f} s, profiled {totals['profiled'][-1]:.2f} s, recorder's own "
            "work "
            f"{own_share[-1]:.3f} % of that start-up",
            flush=True,
        )
    med = {a: statistics.median(v) for a, v in totals.items()}
    print(
        f"median process start -> 4 tokens generated: plain {med['plain']:.2f} s, profiled {med['profiled']:.2f} s "
        f"(n={args.repeats} each, {args.devices})"
    )
    print(
        f"ratio profiled / plain: {med['profiled'] / med['plain']:.4f} (target <= 1.01; the spread between repeats of "
        "one arm: "
        f"plain {min(totals['plain']):.2f}-{max(totals['plain']):.2f} s, profiled "
        f"{min(totals['profiled']):.2f}-{max(totals['profiled']):.2f} s)"
    )
    paired = [b / a for a, b in zip(totals["plain"], totals["profiled"], strict=True)]
    print(
        "median of the paired ratios (each repeat's profiled / plain, started back to back): "
        f"{statistics.median(paired):.4f}"
    )
    print(
        f"recorder's own work (cache scans + profile build), measured inside each profiled start-up: median "
        f"{statistics.median(own_share):.3f} %, max {max(own_share):.3f} %"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
