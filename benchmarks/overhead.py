"""Overhead of ``profile()``: decode tokens/s with and without it, in one process, interleaved.

    python benchmarks/overhead.py --model-path DIR [--devices gpu] [--tokens 128] [--repeats 6] [--kernels off|cupti]

Each repeat runs one unprofiled and one profiled generation (order alternating), after a
warm-up; decode tokens/s come from the host step times of the same pipeline hook in both
arms (the unprofiled arm uses a bare hook with no markers, sampling or kernel tracing), so
both are measured identically. Prints every repeat (with the host's load), each arm's spread, the median ratio and the
ratio paired per repeat.
Target: <= 1 % overhead on the H200 (phase markers + GPU sampling).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from repeats import RepeatLoad, report_arms  # noqa: E402


def decode_tps(steps: list) -> float:  # type: ignore[type-arg]
    dec = [s for s in steps if s.phase == "decode" and s.batch_size > 0]
    secs = sum(s.duration_ns for s in dec) / 1e9
    return sum(s.batch_size for s in dec) / secs if secs else 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--devices", default="cpu")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--kernels", default="off", choices=["off", "cupti"])
    ap.add_argument("--interval", type=float, default=0.1)
    args = ap.parse_args()

    from max_profile.collect.live.pipeline_hook import PipelineHook
    from max_profile.runner import generate, load_model
    from max_profile.session import profile

    t = time.perf_counter()
    model = load_model(args.model_path, devices=args.devices)
    print(
        f"loaded {args.model_path} on {args.devices} in {time.perf_counter() - t:.1f} s "
        f"({type(model.pipeline).__name__})",
        flush=True,
    )
    generate(model, ["warm up"], 16)
    prompt = ["I believe the meaning of life is"]
    base: list[float] = []
    prof: list[float] = []
    wall_base: list[float] = []
    wall_prof: list[float] = []

    def run_repeat(order: tuple[str, str]) -> None:
        for arm in order:
            if arm == "base":
                hook = PipelineHook(model.pipeline)
                hook.install()
                t0 = time.perf_counter()
                try:
                    generate(model, prompt, args.tokens)
                finally:
                    hook.uninstall()
                wall_base.append(time.perf_counter() - t0)
                base.append(decode_tps(hook.steps))
            else:
                t0 = time.perf_counter()
                with profile(model.pipeline, kernels=args.kernels, sample_interval_s=args.interval) as p:
                    generate(model, prompt, args.tokens)
                wall_prof.append(time.perf_counter() - t0)
                prof.append(decode_tps(p.steps))

    load = RepeatLoad()
    for i in range(args.repeats):
        order = ("base", "prof") if i % 2 == 0 else ("prof", "base")
        with load.repeat(i):
            run_repeat(order)
        print(
            f"repeat {i}: decode tok/s without {base[-1]:.1f}, with profile() {prof[-1]:.1f}   ({load.describe(i)})",
            flush=True,
        )
    report_arms({"without": base, "with profile()": prof}, {"with profile()": "without"}, load)
    mb, mp = statistics.median(base), statistics.median(prof)
    overhead = 100.0 * (mb - mp) / mb if mb else float("nan")
    print(f"median decode tok/s: without {mb:.1f}, with profile(kernels={args.kernels}) {mp:.1f}")
    print(f"overhead on decode throughput: {overhead:+.2f} % (ratio {mp / mb:.4f})")
    print(
        f"median wall per generation incl. recorder start/stop: without {statistics.median(wall_base):.3f} s, with "
        f"{statistics.median(wall_prof):.3f} s"
    )
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
