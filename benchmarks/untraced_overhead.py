"""What profiling costs a generation, against the pipeline with no max_profile code installed at all.

    python benchmarks/untraced_overhead.py --model-path DIR --devices gpu [--tokens 128] [--batch 1] [--repeats 11]
        [--max-batch-size N] [--no-device-graph-capture] [--arms none,hook,sampler,cupti,cupti-all] [--residual 5]
        [--json PATH]

One process, one model load (device graphs as MAX decides unless --no-device-graph-capture), a warm-up generation, then
``--repeats`` rounds; each round runs every arm once, in an order that rotates from round to round:

  none               MAX's own generation loop (GenerateIterator) with nothing of max_profile on the pipeline
  hook               ``profile(kernels="off", gpu_sampling=False)``: the step hook and its NVTX phase ranges
  sampler            ``profile(kernels="off")``: + the GPU sampler (a child process reading NVML)
  cupti              ``profile(kernels="cupti")`` as it records by default: + the C CUPTI recorder, launch records on, a
                     sixteenth of the steps in slices of 8 (kernel_share=0.0625)
  cupti-quarter      ``profile(kernels="cupti", kernel_share=0.25)``: a quarter of the steps
  cupti-all          ``profile(kernels="cupti", kernel_share=1)``: every step's kernels
  cupti-eighth       ``profile(kernels="cupti", kernel_share=0.125)``: an eighth of the steps
  cupti-sixteenth    ``profile(kernels="cupti", kernel_share=0.0625)``: a sixteenth of the steps
  cupti-no-launches  the hook and sampler + the C recorder of every step with no launch-call records
  cupti-paused       ``kernel_share=0.001``: the first slice of 8 steps recorded, then CUPTI subscribed and paused to
                     the end (what a paused recording costs the steps between slices)
  cupti-release      ``cupti`` with the recorder's ``release-while-paused`` option: the CUPTI subscription given up at
                     each pause, taken again at resume
  cupti-paused-release  ``cupti-paused`` with ``release-while-paused``
  cupti-flush        ``cupti`` with the recorder's ``flush-at-pause`` option: every CUPTI buffer handed over at each
                     pause, so no partly filled buffer is carried into the next slice
  cupti-sampled-no-launches  ``cupti`` (a sixteenth, in slices) without launch-call records: no DRIVER / RUNTIME
                     kinds switched at a pause or resume, no launch filter re-applied

With ``--residual N`` (5 by default) the none arm also runs N times before CUPTI ever starts in the process and N
times after the last round: what finished recordings leave behind (every arm's ``none`` reference runs in a process
where CUPTI has recorded before).

Every arm is timed the same way: new tokens x batch over the wall time of the whole generation (prefill included),
so the reference arm needs no hook. Prints every round (each arm's tok/s and the host's load around the round; each
arm's median step and the time its stalls took, from the benchmark's own clock after every step), each
arm's median, min, max and spread, and its ratio to ``none``: of the medians and paired per round.
"""

from __future__ import annotations

import argparse
import contextlib
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
ALL_ARMS = (
    *ARMS,
    "cupti-quarter",
    "cupti-eighth",
    "cupti-sixteenth",
    "cupti-no-launches",
    "cupti-paused",
    "cupti-release",
    "cupti-paused-release",
    "cupti-flush",
    "cupti-sampled-no-launches",
)
SHARES = {
    "cupti-all": 1.0,
    "cupti-quarter": 0.25,
    "cupti-eighth": 0.125,
    "cupti-sixteenth": 0.0625,
    "cupti-paused": 0.001,
    "cupti-paused-release": 0.001,
}
RECORDER_OPTIONS = {
    "cupti-release": ("release-while-paused",),
    "cupti-paused-release": ("release-while-paused",),
    "cupti-flush": ("flush-at-pause",),
}
"""The C recorder's options (``cupti_native.RECORDING_OPTIONS``) an arm records with."""
LAST_NOTES: dict[str, list[str]] = {}
"""The notes of each arm's last capture (the recorder's slices and pause / resume time, CUPTI's callback time)."""


LAST_STEPS: list[float] = []
"""The step times (ms, host clock between successive steps' returns) of the last generation."""
LAST_WALL_MS: list[float] = [0.0]
"""The last generation's wall time (ms): what its steps do not cover is the prefill, the first step and the ends."""


def _generate(model: Any, prompts: list[str], tokens: int) -> float:
    """tok/s of one generation by its wall time; its step times land in LAST_STEPS."""
    from max_profile.runner import generate

    stamps: list[float] = []
    t0 = time.perf_counter()
    out = generate(model, prompts, tokens, on_step=lambda: stamps.append(time.perf_counter()))
    wall = time.perf_counter() - t0
    LAST_STEPS[:] = [1e3 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)]
    LAST_WALL_MS[0] = 1e3 * wall
    return sum(len(x) for x in out) / wall


def step_summary(steps: list[float], wall_ms: float = 0.0) -> dict[str, Any]:
    """One generation's decode steps: the median (ms), the time lost to stalls (ms above 3x the median, summed) and
    where they were (``stall_at``: indices into ``steps``, whose entry j is work step j + 1, work step 0 being the
    prefill; a sampled recording's slices start at work steps 0, ``slice / share``, twice that...), and the wall time
    the steps do not cover (``outside_ms``: the prefill, the recording's start, the generation's ends). A slower step
    shows in the median, a stall (a long pause of the host, or a costly resume) in the stall time and its place, a
    costly start in the time outside."""
    if not steps:
        return {"p50_ms": float("nan"), "stall_ms": 0.0, "stall_at": [], "outside_ms": wall_ms, "steps_ms": []}
    ordered = sorted(steps)
    p50 = ordered[len(ordered) // 2]
    return {
        "steps_ms": [round(x, 4) for x in steps],
        "p50_ms": p50,
        "stall_ms": sum(s - p50 for s in steps if s > 3 * p50),
        "stall_at": [i for i, s in enumerate(steps) if s > 3 * p50],
        "outside_ms": wall_ms - sum(steps),
    }


def step_labels(share: float, n: int, slice_steps: int = 8) -> list[str]:
    """What the recorder did during each of ``n`` work steps (0: the prefill) at ``share``: ``recorded`` (launched
    with CUPTI on, the step after a slice included), ``paused, before any resume`` or ``paused, after a resume`` (the
    recorder's own :class:`StepSlices` decides)."""
    from max_profile.collect.live.recorders import StepSlices

    slices = StepSlices(share, slice_steps)
    slices.opened(0)
    labels, state, resumes = [], "recorded", 0
    for i in range(n):
        labels.append(state)
        toggle = slices.step_done(i)
        if toggle is not None:
            slices.toggled(toggle, i, i)
        if toggle == "pause":
            state = "paused, before any resume" if resumes == 0 else "paused, after a resume"
        elif toggle == "resume":
            resumes, state = resumes + 1, "recorded"
    return labels


def arm_share(arm: str) -> float | None:
    """The share of steps a CUPTI arm records (None: no CUPTI, or every step)."""
    from max_profile.defaults import DEFAULT_KERNEL_SHARE

    if not arm.startswith("cupti") or arm == "cupti-no-launches":
        return None
    share = SHARES.get(arm, DEFAULT_KERNEL_SHARE)
    return share if share < 1 else None


def print_segment_summary(steps: dict[str, list[dict[str, Any]]]) -> None:
    """Where a sampled CUPTI arm's cost falls: per run of steps in one recorder state (``recorded 128-136``, ``paused,
    after a resume 137-255``: work steps, 0 the prefill), the median over rounds of the arm's median step there, and
    its ratio to ``none`` over the same steps of the same round (none's over the arm's: below 1 is slower). With
    ``cupti-eighth`` beside the default, a cost that starts at the first resume and one that starts at a context
    length show apart."""
    import statistics

    ref = steps.get("none")
    if ref is None:
        return
    for arm, rows in steps.items():
        share = arm_share(arm)
        if share is None:
            continue
        per_run: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
        for mine, base in zip(rows, ref, strict=True):
            a, b = mine.get("steps_ms", []), base.get("steps_ms", [])
            n = min(len(a), len(b))
            labels = step_labels(share, n + 1)  # steps_ms[j] is work step j + 1 (step 0, the prefill, has none)
            first = 1
            for step in range(2, n + 2):
                if step == n + 1 or labels[step] != labels[first]:
                    idx = range(first - 1, step - 1)
                    per_run.setdefault((labels[first], first, step - 1), []).append(
                        (statistics.median(a[j] for j in idx), statistics.median(b[j] for j in idx))
                    )
                    first = step
        parts = [
            f"{label} {lo}-{hi} ({statistics.median(x for x, _ in pairs):.3f} ms, paired to none "
            f"{statistics.median(y / x for x, y in pairs):.4f})"
            for (label, lo, hi), pairs in per_run.items()
        ]
        print(f"{arm:<16} steps by recorder state: " + "; ".join(parts))


def print_step_summary(steps: dict[str, list[dict[str, Any]]]) -> None:
    """Each arm's median decode step over the rounds, its ratio to ``none`` paired per round (none's step over the
    arm's: below 1 is slower, as for tokens/s), the median time its stalls took per generation and where they fell, and
    the median wall time outside the steps: a slower step shows in the first two, a stalled host in the stalls, a
    costly recording start in the time outside."""
    import statistics
    from collections import Counter

    ref = steps.get("none")
    for arm, rows in steps.items():
        p50 = statistics.median(r["p50_ms"] for r in rows)
        stall = statistics.median(r["stall_ms"] for r in rows)
        paired = ""
        if ref is not None and arm != "none":
            ratio = statistics.median(a["p50_ms"] / b["p50_ms"] for a, b in zip(ref, rows, strict=True))
            paired = f", paired ratio to none {ratio:.4f}"
        outside = statistics.median(r.get("outside_ms", 0.0) for r in rows)
        places = Counter(i for r in rows for i in r.get("stall_at", ()))
        where = ", ".join(f"{i} x{n}" for i, n in sorted(places.items(), key=lambda kv: (-kv[1], kv[0]))[:8])
        print(
            f"{arm:<16} step p50 median {p50:.4f} ms{paired}, stalls median {stall:.1f} ms per generation"
            f" (at step {where or '-'}), outside the steps median {outside:.1f} ms"
        )


def residual_summary(clean: list[float], after: list[float], captures: int) -> dict[str, Any] | None:
    """What finished CUPTI recordings leave behind in the process: the none arm's tok/s before CUPTI ever started in
    it against the same arm after ``captures`` recordings had started and stopped (Kineto found CUPTI slowing a
    process 10-20 % after profiling until ``cuptiFinalize``: pytorch/pytorch#144455). Not interleaved (CUPTI cannot be
    un-started), so drift between the two ends of the run is in the ratio too; every generation is printed."""
    import statistics

    if not clean or not after:
        return None
    before_p50, after_p50 = statistics.median(clean), statistics.median(after)
    ratio = after_p50 / before_p50 if before_p50 else float("nan")
    return {
        "before_tok_s": clean,
        "after_tok_s": after,
        "captures_between": captures,
        "ratio": ratio,
        "said": (
            f"none before any CUPTI in this process: {', '.join(f'{x:.1f}' for x in clean)} tok/s (median "
            f"{before_p50:.1f}); after {captures} CUPTI recordings: {', '.join(f'{x:.1f}' for x in after)} (median "
            f"{after_p50:.1f}); after / before {ratio:.4f} (not interleaved: drift is in it)"
        ),
    }


def run_arm(arm: str, model: Any, prompts: list[str], tokens: int, interval_s: float) -> float:
    """One generation under ``arm``; its tok/s."""
    from max_profile.collect.live.pipeline_hook import synchronize_accelerators
    from max_profile.session import profile

    if arm == "none":
        return _generate(model, prompts, tokens)
    if arm in ("hook", "sampler", "cupti", "cupti-sampled-no-launches", *SHARES, *RECORDER_OPTIONS):
        import functools
        from unittest import mock

        from max_profile.collect.live import recorders
        from max_profile.collect.live.cupti_native import NativeCuptiCollector, make_cupti_collector

        kernels = "cupti" if arm.startswith("cupti") else "off"
        share = {"kernel_share": SHARES[arm]} if arm in SHARES else {}
        NativeCuptiCollector.default_options = RECORDER_OPTIONS.get(arm, ())
        # the sampled recorder as profile() builds it, with its collector made without launch records
        kernels_only = functools.partial(make_cupti_collector, launches=False)
        no_launches = (
            mock.patch.object(recorders, "make_cupti_collector", kernels_only)
            if arm == "cupti-sampled-no-launches"
            else contextlib.nullcontext()
        )
        try:
            with (
                no_launches,
                profile(
                    model.pipeline, kernels=kernels, gpu_sampling=arm != "hook", sample_interval_s=interval_s, **share
                ) as prof,  # type: ignore[arg-type]
            ):
                tps = _generate(model, prompts, tokens)
        finally:
            NativeCuptiCollector.default_options = ()
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


def self_check() -> None:
    """The residual summary, checked before any model loads: the untraced arm before CUPTI ever started against the same
    arm after the rounds' recordings, the medians' ratio, every generation kept, nothing without both ends."""
    got = residual_summary([400.0, 410.0, 405.0], [360.0, 372.0, 368.0], 48)
    assert got is not None and abs(got["ratio"] - 368.0 / 405.0) < 1e-12, got
    assert got["before_tok_s"] == [400.0, 410.0, 405.0] and got["captures_between"] == 48
    assert "after 48 CUPTI recordings: 360.0, 372.0, 368.0 (median 368.0); after / before 0.9086" in got["said"]
    assert residual_summary([], [1.0], 3) is None and residual_summary([1.0], [], 3) is None


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
    ap.add_argument(
        "--residual",
        type=int,
        default=5,
        help="generations of the none arm before CUPTI ever starts in this process and again after the last round "
        "(what a finished recording leaves behind; 0 skips)",
    )
    ap.add_argument("--json", help="write every repeat and the summary here")
    ap.add_argument("--self-check", action="store_true", help="check the summaries' arithmetic, and stop")
    args = ap.parse_args()
    self_check()
    if args.self_check:
        print("untraced_overhead: self-check passed")
        return 0
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
    clean = [_generate(model, prompts, args.tokens) for _ in range(args.residual)]  # no CUPTI in this process yet
    for arm in arms:  # one warm pass of every arm (CUPTI's first enable, the recorder's library, the sampler's start)
        run_arm(arm, model, prompts, 16, args.interval)
    tps: dict[str, list[float]] = {a: [] for a in arms}
    steps: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
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
                steps[arm].append(step_summary(LAST_STEPS, LAST_WALL_MS[0]))
        print(
            f"round {i:2d}: "
            + ", ".join(f"{a} {tps[a][-1]:.1f}" for a in arms)
            + f"   (order {','.join(order)}; {load.describe(i)})",
            flush=True,
        )
        print(
            "          step p50 / stalls / outside the steps ms: "
            + ", ".join(
                f"{a} {steps[a][-1]['p50_ms']:.3f} / {steps[a][-1]['stall_ms']:.1f}"
                + (f" at {','.join(map(str, steps[a][-1]['stall_at'][:4]))}" if steps[a][-1]["stall_at"] else "")
                + f" / {steps[a][-1]['outside_ms']:.1f}"
                for a in arms
            ),
            flush=True,
        )
    after = [_generate(model, prompts, args.tokens) for _ in range(args.residual)]
    summary = report_arms(tps, {a: "none" for a in arms}, load)
    print_step_summary(steps)
    print_segment_summary(steps)
    residual = residual_summary(clean, after, sum(1 for a in arms if a.startswith("cupti")) * (args.repeats + 1))
    if residual:
        print(residual["said"], flush=True)
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
            "residual": residual,
        }
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
