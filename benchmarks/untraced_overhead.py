"""What profiling costs a generation, against the pipeline with no max_profile code installed at all.

    python benchmarks/untraced_overhead.py --model-path DIR --devices gpu [--tokens 128] [--batch 1] [--repeats 11]
        [--max-batch-size N] [--no-device-graph-capture] [--arms none,hook,sampler,cupti,cupti-all] [--json PATH]

One process, one model load (device graphs as MAX decides unless --no-device-graph-capture), a warm-up generation, then
``--repeats`` rounds; each round runs every arm once, in an order that rotates from round to round:

  none               MAX's own generation loop (GenerateIterator) with nothing of max_profile on the pipeline
  hook               ``profile(kernels="off", gpu_sampling=False)``: the step hook and its NVTX phase ranges
  sampler            ``profile(kernels="off")``: + the GPU sampler (a child process reading NVML)
  cupti              ``profile(kernels="cupti")`` as it records by default: + the C CUPTI recorder, launch records on, a
                     sixteenth of the steps in slices of 8 (kernel_share=0.0625)
  cupti-quarter      ``profile(kernels="cupti", kernel_share=0.25)``: a quarter of the steps (the default before
                     session 19)
  cupti-all          ``profile(kernels="cupti", kernel_share=1)``: every step's kernels
  cupti-eighth       ``profile(kernels="cupti", kernel_share=0.125)``: an eighth of the steps
  cupti-sixteenth    ``profile(kernels="cupti", kernel_share=0.0625)``: a sixteenth of the steps
  cupti-no-launches  the hook and sampler + the C recorder of every step with no launch-call records

Every arm is timed the same way: new tokens x batch over the wall time of the whole generation (prefill included),
so the reference arm needs no hook. Prints every round (each arm's tok/s and the host's load around the round; each
arm's median step and the time its stalls took, from the benchmark's own clock after every step), each
arm's median, min, max and spread, and its ratio to ``none``: of the medians and paired per round.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from repeats import RepeatLoad, report_arms  # noqa: E402

ARMS = ("none", "hook", "sampler", "cupti", "cupti-all")
ALL_ARMS = (*ARMS, "cupti-quarter", "cupti-eighth", "cupti-sixteenth", "cupti-no-launches")
SHARES = {"cupti-all": 1.0, "cupti-quarter": 0.25, "cupti-eighth": 0.125, "cupti-sixteenth": 0.0625}
LAST_NOTES: dict[str, list[str]] = {}
"""The notes of each arm's last capture (the recorder's slices and pause / resume time, CUPTI's callback time)."""


LAST_STEPS: list[float] = []
"""The step times (ms, host clock between successive steps' returns) of the last generation."""


def _generate(model: Any, prompts: list[str], tokens: int) -> float:
    """tok/s of one generation by its wall time; its step times land in LAST_STEPS."""
    from max_profile.runner import generate

    stamps: list[float] = []
    t0 = time.perf_counter()
    out = generate(model, prompts, tokens, on_step=lambda: stamps.append(time.perf_counter()))
    wall = time.perf_counter() - t0
    LAST_STEPS[:] = [1e3 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)]
    return sum(len(x) for x in out) / wall


def step_summary(steps: list[float]) -> dict[str, float]:
    """One generation's decode steps: the median (ms), and the time lost to stalls (ms above 3x the median, summed): a
    slower step shows in the median, a stall (a long pause of the host) in the stall time."""
    if not steps:
        return {"p50_ms": float("nan"), "stall_ms": 0.0}
    ordered = sorted(steps)
    p50 = ordered[len(ordered) // 2]
    return {"p50_ms": p50, "stall_ms": sum(s - p50 for s in steps if s > 3 * p50)}


def print_step_summary(steps: dict[str, list[dict[str, float]]]) -> None:
    """Each arm's median decode step over the rounds, its ratio to ``none`` paired per round (none's step over the
    arm's: below 1 is slower, as for tokens/s), and the median time its stalls took per generation: a slower step shows
    in the first two, a stalled host in the last."""
    import statistics

    ref = steps.get("none")
    for arm, rows in steps.items():
        p50 = statistics.median(r["p50_ms"] for r in rows)
        stall = statistics.median(r["stall_ms"] for r in rows)
        paired = ""
        if ref is not None and arm != "none":
            ratio = statistics.median(a["p50_ms"] / b["p50_ms"] for a, b in zip(ref, rows, strict=True))
            paired = f", paired ratio to none {ratio:.4f}"
        print(f"{arm:<16} step p50 median {p50:.4f} ms{paired}, stalls median {stall:.1f} ms per generation")


def run_arm(arm: str, model: Any, prompts: list[str], tokens: int, interval_s: float) -> float:
    """One generation under ``arm``; its tok/s."""
    from max_profile.collect.live.pipeline_hook import synchronize_accelerators
    from max_profile.session import profile

    if arm == "none":
        return _generate(model, prompts, tokens)
    if arm in ("hook", "sampler", "cupti", *SHARES):
        kernels = "cupti" if arm.startswith("cupti") else "off"
        share = {"kernel_share": SHARES[arm]} if arm in SHARES else {}
        with profile(
            model.pipeline, kernels=kernels, gpu_sampling=arm != "hook", sample_interval_s=interval_s, **share
        ) as prof:  # type: ignore[arg-type]
            tps = _generate(model, prompts, tokens)
        LAST_NOTES[arm] = [n for n in prof.raw_capture.notes if "CUPTI" in n]
        return tps
    if arm == "cupti-no-launches":
        from max_profile.collect.live.cupti_native import make_cupti_collector

        notes: list[str] = []
        collector = make_cupti_collector(notes, launches=False)
        with profile(model.pipeline, kernels="off", sample_interval_s=interval_s):
            collector.start()
            try:
                tps = _generate(model, prompts, tokens)
            finally:
                synchronize_accelerators(model.pipeline)
                collector.stop()
        return tps
    raise SystemExit(f"unknown arm {arm!r}: use {', '.join(ALL_ARMS)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--devices", default="gpu")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help="the load's max batch size (default: --batch); another compile key",
    )
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--interval", type=float, default=0.1, help="GPU sampling interval (s)")
    ap.add_argument("--device-graph-capture", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--json", help="write every repeat and the summary here")
    args = ap.parse_args()
    arms = args.arms.split(",")
    from max_profile.runner import load_model

    model = load_model(
        args.model_path,
        devices=args.devices,
        max_batch_size=args.max_batch_size or args.batch,
        device_graph_capture=args.device_graph_capture,
    )
    prompts = ["I believe the meaning of life is"] * args.batch
    _generate(model, prompts, 16)  # warm-up: one-time work (graph capture, first launches) out of the rounds
    for arm in arms:  # one warm pass of every arm (CUPTI's first enable, the recorder's library, the sampler's start)
        run_arm(arm, model, prompts, 16, args.interval)
    tps: dict[str, list[float]] = {a: [] for a in arms}
    steps: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    load = RepeatLoad()
    print(
        f"model {args.model_path}, batch {args.batch}, {args.tokens} new tokens, device graphs "
        f"{model.device_graph_capture}, "
        f"{args.repeats} rounds",
        flush=True,
    )
    for i in range(args.repeats):
        order = arms[i % len(arms) :] + arms[: i % len(arms)]
        with load.repeat(i):
            for arm in order:
                tps[arm].append(run_arm(arm, model, prompts, args.tokens, args.interval))
                steps[arm].append(step_summary(LAST_STEPS))
        print(
            f"round {i:2d}: "
            + ", ".join(f"{a} {tps[a][-1]:.1f}" for a in arms)
            + f"   (order {','.join(order)}; {load.describe(i)})",
            flush=True,
        )
        print(
            "          step p50 / stalls ms: "
            + ", ".join(f"{a} {steps[a][-1]['p50_ms']:.3f} / {steps[a][-1]['stall_ms']:.1f}" for a in arms),
            flush=True,
        )
    summary = report_arms(tps, {a: "none" for a in arms}, load)
    print_step_summary(steps)
    for arm, notes in LAST_NOTES.items():
        for note in notes:
            print(f"{arm}: {note}")
    model.close()
    if args.json:
        out = {
            "model_path": args.model_path,
            "batch": args.batch,
            "tokens": args.tokens,
            "repeats": args.repeats,
            "device_graph_capture": model.device_graph_capture,
            "busy_repeats": summary.pop("_busy_repeats"),
            "arms": summary,
            "steps": steps,
            "notes": LAST_NOTES,
        }
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
