"""What an embedded ``Profiler`` costs an app: generation throughput with no profiler, with one that is
off (constructed, never started) and with one recording, interleaved in one process.

    python benchmarks/embedding_overhead.py [--model-path DIR] [--devices cpu|gpu] [--tokens 64] [--repeats 9]

Without ``--model-path`` a tiny random Llama is built (the project's CPU test model). Each repeat
runs the three arms in a rotating order. The app times every ``GenerateIterator.step()`` itself (the
same clock in all arms, outside anything max_profile installs), so each arm yields hundreds of
per-step times; the medians of those are compared (a whole-generation rate swings by tens of % on a
small VM). Target: off = no measurable cost (nothing is installed); hook-only is the step hook (phase markers,
step records); recording adds the GPU sampler.
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
    from max_profile.runner import generate, load_model, make_request
    from max_profile.tinymodel import build_tiny_llama

    def timed_steps(model: object, prompt: str, tokens: int) -> list[float]:
        """One generation; the wall time of each decode step as the app sees it (seconds)."""
        import asyncio

        from max.pipelines.lib.generate import GenerateIterator

        request = make_request(prompt, tokens, use_chat_template=False)
        ctx = asyncio.run(model.tokenizer.new_context(request))  # type: ignore[attr-defined]
        times = []
        pipeline = model.pipeline  # type: ignore[attr-defined]
        iterator = GenerateIterator.from_contexts(pipeline, [ctx], caller="benchmark")  # type: ignore[attr-defined]
        with iterator as batch:
            while not batch.done:
                t0 = time.perf_counter()
                batch.step()
                times.append(time.perf_counter() - t0)
        return times[1:]  # the first step is the prefill

    model_path = args.model_path or str(build_tiny_llama(Path(tempfile.mkdtemp(prefix="mp-embed-")) / "tiny-llama-f32"))
    model = load_model(model_path, devices=args.devices)
    generate(model, ["warm up"], 16)
    prompt = "I believe the meaning of life is"
    arms = ("none", "off", "hook-only", "recording")
    steps: dict[str, list[float]] = {a: [] for a in arms}
    idle = Profiler(model.pipeline)  # the "off" arm: exists, never started
    for i in range(args.repeats):
        for arm in arms[i % len(arms) :] + arms[: i % len(arms)]:
            # hook-only: recording without the GPU sampler (on a CPU its child process competes for the cores)
            profiler = {
                "recording": lambda: Profiler(model.pipeline),
                "hook-only": lambda: Profiler(model.pipeline, gpu_sampling=False),
                "off": lambda: idle,
                "none": lambda: None,
            }[arm]()
            if arm in ("recording", "hook-only"):
                assert profiler is not None
                profiler.start()
            times = timed_steps(model, prompt, args.tokens)
            if arm in ("recording", "hook-only"):
                assert profiler is not None
                profiler.stop()
            steps[arm] += times
        print(
            f"repeat {i}: "
            + ", ".join(f"{a} {1e3 * statistics.median(steps[a][-len(times) :]):.3f} ms/step" for a in arms),
            flush=True,
        )
    med = {a: statistics.median(v) for a, v in steps.items()}
    quart = {a: statistics.quantiles(v, n=4) for a, v in steps.items()}
    print(
        "median decode step: "
        + ", ".join(
            f"{a} {1e3 * med[a]:.3f} ms (IQR {1e3 * quart[a][0]:.3f}-{1e3 * quart[a][2]:.3f}, n={len(steps[a])})"
            for a in arms
        )
    )
    print(
        f"ratio of median step time: off/none {med['off'] / med['none']:.4f}, hook-only/none "
        f"{med['hook-only'] / med['none']:.4f}, "
        f"recording/none {med['recording'] / med['none']:.4f} "
        f"({args.devices}, {args.tokens} tokens per generation, {args.repeats} repeats)"
    )
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
