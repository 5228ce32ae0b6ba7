"""What an embedded ``Profiler`` costs an app: generation throughput with no profiler, with one that is
off (constructed, never started) and with one recording, interleaved in one process.

    python benchmarks/embedding_overhead.py [--model-path DIR] [--devices cpu|gpu] [--tokens 64] [--repeats 9]

Without ``--model-path`` a tiny random Llama is built (the project's CPU test model). Each repeat
runs the three arms in a rotating order; tokens/s is output tokens over the wall time of the whole
generation (so it includes what the hook adds per step). Prints per-arm medians and the ratios.
Target: off = no measurable cost (nothing is installed); recording costs the step hook plus sampling.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path")
    ap.add_argument("--devices", default="cpu")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()

    from max_profile import Profiler
    from max_profile.runner import generate, load_model
    from max_profile.tinymodel import build_tiny_llama

    model_path = args.model_path or str(build_tiny_llama(Path(tempfile.mkdtemp(prefix="mp-embed-")) / "tiny-llama-f32"))
    model = load_model(model_path, devices=args.devices)
    generate(model, ["warm up"], 16)
    prompt = ["I believe the meaning of life is"]
    arms = ("none", "off", "recording")
    rates: dict[str, list[float]] = {a: [] for a in arms}
    idle = Profiler(model.pipeline)  # the "off" arm: exists, never started
    for i in range(args.repeats):
        for arm in arms[i % 3:] + arms[: i % 3]:
            profiler = Profiler(model.pipeline) if arm == "recording" else idle if arm == "off" else None
            if arm == "recording":
                assert profiler is not None
                profiler.start()
            t0 = time.perf_counter()
            out = generate(model, prompt, args.tokens)
            took = time.perf_counter() - t0
            if arm == "recording":
                assert profiler is not None
                profiler.stop()
            rates[arm].append(len(out[0]) / took)
        print(f"repeat {i}: " + ", ".join(f"{a} {rates[a][-1]:.1f} tok/s" for a in arms), flush=True)
    med = {a: statistics.median(v) for a, v in rates.items()}
    spread = {a: (max(v) - min(v)) / med[a] * 100 for a, v in rates.items()}
    print("median tok/s: " + ", ".join(f"{a} {med[a]:.1f} (spread {spread[a]:.0f} %)" for a in arms))
    print(f"ratio off/none {med['off'] / med['none']:.4f}, recording/none {med['recording'] / med['none']:.4f} "
          f"({args.devices}, {args.tokens} tokens per generation, {args.repeats} repeats)")
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
