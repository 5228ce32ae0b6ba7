"""The serve worker's tracer cost, A/B on one server: windows with the CUPTI recorder in the model worker and without
it, alternating, same server, same load (``max-profile serve --mode kernels``'s recorder, MAX's defaults: device graphs
on).

    python benchmarks/serve_ab.py --model-path DIR [--devices gpu] [--pairs 3] [--duration 10] [--settle S]
                                  [--variants default,full,zeroed] [--order bracketed|rotating] [--json out.json]
                                  [-- MAX_SERVE_FLAGS...]

A round gives each recording variant one window, each between two untraced windows (``--order bracketed``, the
default: U A U B U, the variants' order rotating every round) or one untraced window and one per variant back to back
(``rotating``: U A B, then A B U...). Each recorded window is compared with the untraced level at its place, linear
between the nearest untraced windows before and after it (bracketed: their mean), so a server whose speed drifts
steadily reads the same ratio throughout; the ratio of streamed tokens/s recorded / untraced is reported per variant
and round, with every window, the median and the spread, and the host's load per window. The resolution is printed
beside them: how far neighbouring untraced windows differ (drift the interpolation cannot remove) and each window's
own noise from its tokens per second (``analyze.load.counts_noise``, as ``serve --mode kernels`` gives beside its own
measured cost; an H100 server once moved 26.6 % between successive untraced windows, each window's own noise
2.7 %: its 0.91 / 1.30 / 0.90 said nothing about a 1 % cost).

Variants (``+`` combines): ``default`` what ``serve --mode kernels`` records (``ServePlan.record_share`` of each
window, in slices), ``full`` every kernel of the whole window, ``share=F`` a share F
in slices of ``--slice`` s, ``zeroed`` CUPTI handed zeroed buffers (``cupti_native.RECORDING_OPTIONS``), ``steps`` the
worker's step hook alone with CUPTI left off (what stamping each batch costs), ``release`` the subscription given up at
each pause (``release-while-paused``). ``share=0.001`` records only the slice
before the window opens: CUPTI subscribed and paused through the whole window (what the paused state costs).
Per window also: the inter-token gaps inside it (p50 / p99 / max: a stall shows as a few long gaps, a slower decode step
as a higher median) and the tokens of each second (a start-up cost shows in the first ones). A recorded window opens
once the worker's recording runs plus ``--settle`` seconds (the recorder's own ``settle_s`` by default; 0 measures
CUPTI's first launches after its enable inside the window).
Comparing two servers instead (one per mode) adds the spread between server starts (one earlier pair: 0.914, the other
1.05).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from max_profile.analyze.load import counts_noise, token_arrivals, window_tokens  # noqa: E402
from max_profile.collect.server.worker_protocol import WindowRecording  # noqa: E402
from max_profile.serve.plan import ModeContext  # noqa: E402


def token_gaps(requests: list[Any], window_ns: tuple[int, int]) -> dict[str, float]:
    """Inter-token gaps (ms) of tokens that arrived inside the window: p50, p99, max and how many exceed 3x the median
    (a stall in the window shows as a few long gaps, a slower step as a higher median)."""
    import numpy as np

    gaps = [gap for t, gap in token_arrivals(requests) if gap is not None and window_ns[0] <= t < window_ns[1]]
    if not gaps:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan"), "over_3x_median": 0, "count": 0}
    a = np.asarray(gaps)
    p50 = float(np.median(a))
    return {
        "p50": p50,
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
        "over_3x_median": int((a > 3 * p50).sum()),
        "count": len(gaps),
    }


def tokens_per_second(requests: list[Any], window_ns: tuple[int, int]) -> list[int]:
    """Tokens that arrived in each whole second of the window (a start-up cost shows in the first bins)."""
    seconds = int((window_ns[1] - window_ns[0]) // 1_000_000_000)
    counts = [0] * seconds
    for t, _ in token_arrivals(requests):
        k = (t - window_ns[0]) // 1_000_000_000
        if 0 <= k < seconds:
            counts[k] += 1
    return counts


def variant_plan(spec: str, default_share: float, slice_s: float) -> WindowRecording:
    """What the worker records in a window of variant ``spec`` (see the module docstring)."""
    plan = WindowRecording(share=1.0, slice_s=slice_s)
    for part in spec.split("+"):
        if part == "default":  # as serve --mode kernels records: its first slice runs on through the settle
            plan = dataclasses.replace(plan, share=default_share, lead_s=ModeContext.settle_s)
        elif part == "full":
            plan = dataclasses.replace(plan, share=1.0)
        elif part.startswith("share="):
            plan = dataclasses.replace(plan, share=float(part.removeprefix("share=")))
        elif part == "zeroed":
            plan = dataclasses.replace(plan, options=(*plan.options, "zeroed-buffers"))
        elif part == "steps":
            plan = dataclasses.replace(plan, kernels=False)
        elif part == "release":
            plan = dataclasses.replace(plan, options=(*plan.options, "release-while-paused"))
        else:
            raise SystemExit(
                f"unknown variant part {part!r} (default, full, share=F, zeroed, steps, release; + combines)"
            )
    return plan


def rounds_of(variants: list[str], rounds: int, order: str = "bracketed") -> list[str | None]:
    """The windows in order (None: untraced). ``bracketed``: every variant's window between two untraced ones, the
    variants rotated by one every round (U A U B U, then U B U A U...: untraced windows shared by neighbours);
    ``rotating``: per round the untraced one and each variant, all rotated by one every round."""
    if order == "bracketed":
        out: list[str | None] = []
        for r in range(rounds):
            k = r % len(variants)
            for v in variants[k:] + variants[:k]:
                out += [None, v]
        return [*out, None] if out else out
    if order != "rotating":
        raise SystemExit(f"unknown --order {order!r}: bracketed or rotating")
    arms: list[str | None] = [None, *variants]
    out = []
    for r in range(rounds):
        k = r % len(arms)
        out += arms[k:] + arms[:k]
    return out


def untraced_level(tok_s: list[float], order: list[str | None], i: int) -> float:
    """The untraced tokens/s at window ``i`` (0-based): linear between the nearest untraced windows before and after it
    (by position: windows are of equal length and back to back), the nearest one where only one side has any."""
    before = next((j for j in range(i - 1, -1, -1) if order[j] is None), None)
    after = next((j for j in range(i + 1, len(order)) if order[j] is None), None)
    if before is None and after is None:
        raise ValueError("no untraced window to compare with")
    if before is None or after is None:
        return tok_s[before if before is not None else after]  # type: ignore[index]
    return tok_s[before] + (tok_s[after] - tok_s[before]) * (i - before) / (after - before)


def ratios_by_round(tok_s: list[float], order: list[str | None], variant: str) -> list[float]:
    """The variant's recorded / untraced tokens/s, one per window of it in order (one per round): each against the
    untraced level at its place (:func:`untraced_level`)."""
    return [
        tok_s[i] / level if (level := untraced_level(tok_s, order, i)) else float("nan")
        for i, v in enumerate(order)
        if v == variant
    ]


def resolution(tok_s: list[float], order: list[str | None], per_second: list[list[int]]) -> dict[str, float]:
    """What the ratios can resolve: ``untraced_step_pct``, the largest change between successive untraced windows (%
    of their mean: drift within a bracket that the interpolation cannot remove), and ``window_noise_pct``, the median
    over windows of the standard error of a window's mean rate from its per-second token counts (%: the window's own
    noise)."""
    untraced = [t for t, v in zip(tok_s, order, strict=True) if v is None]
    steps = [abs(b - a) / ((a + b) / 2) for a, b in zip(untraced, untraced[1:], strict=False) if a + b]
    noise = [n for c in per_second if (n := counts_noise(c)) is not None]
    return {
        "untraced_step_pct": 100 * max(steps) if steps else float("nan"),
        "window_noise_pct": 100 * statistics.median(noise) if noise else float("nan"),
    }


def self_check() -> None:
    """The window order and the estimate, checked before any server starts: every recorded window between two untraced
    ones, each read against the untraced level at its place (a server whose speed drifts steadily reads the true cost,
    where pairing by round keeps the drift in), the level at the ends from the one neighbour, and the resolution the
    windows give."""
    order = rounds_of(["default", "steps"], 3)
    assert all(order[i - 1] is None and order[i + 1] is None for i, v in enumerate(order) if v is not None), order
    assert [order.count(v) for v in ("default", "steps")] == [3, 3] and order[0] is None and order[-1] is None
    assert rounds_of(["default", "steps"], 3, "rotating")[:5] == [None, "default", "steps", "default", "steps"]
    for kind in ("bracketed", "rotating"):
        order = rounds_of(["default", "steps"], 3, kind)
        level = [400.0 * (1 - 0.04 * i) for i in range(len(order))]
        true = {"default": 0.97, "steps": 1.0}
        tok_s = [lv if v is None else true[v] * lv for lv, v in zip(level, order, strict=True)]
        for variant, ratio in true.items():
            at = [i for i, v in enumerate(order) if v == variant]
            got = ratios_by_round(tok_s, order, variant)
            interior = [r for r, i in zip(got, at, strict=True) if None in order[:i] and None in order[i + 1 :]]
            assert interior and all(abs(r - ratio) < 1e-12 for r in interior), (kind, variant, got)
    ends: list[str | None] = ["default", None, "default", None]
    assert untraced_level([90.0, 100.0, 95.0, 110.0], ends, 0) == 100.0
    assert untraced_level([90.0, 100.0, 95.0, 110.0], ends, 2) == 105.0
    five: list[str | None] = [None, "default", None, "default", None]
    res = resolution([300.0, 297.0, 310.0, 300.0, 279.0], five, [[300] * 10] * 5)
    assert res["window_noise_pct"] == 0.0 and abs(res["untraced_step_pct"] - 100 * 31 / 294.5) < 1e-9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--devices", default="gpu")
    ap.add_argument("--pairs", type=int, default=3, help="rounds: one untraced window and one per variant each")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--variants", default="default", help="comma-separated recording variants (module docstring)")
    ap.add_argument(
        "--slice",
        type=float,
        default=None,
        help="seconds per recorded slice of a sampled variant (default: ServePlan's)",
    )
    ap.add_argument(
        "--order",
        default="bracketed",
        choices=("bracketed", "rotating"),
        help="bracketed: each recorded window between two untraced ones (U A U B U); rotating: U A B, A B U, ...",
    )
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--raw", help="save the capture (every window's kernels and steps: RawCapture, .json.gz) here")
    ap.add_argument("--no-warm", action="store_true")
    ap.add_argument(
        "--settle",
        type=float,
        default=None,
        help="seconds of recording before a traced window opens (default: the recorder's own, "
        "WorkerKernelRecorder.settle_s)",
    )
    ap.add_argument(
        "server_args",
        nargs="*",
        help="after --: flags for `max serve` itself (e.g. -- --no-device-graph-capture: an eager server)",
    )
    ap.add_argument("--self-check", action="store_true", help="check the window order and the estimate, and stop")
    args = ap.parse_args()
    self_check()
    if args.self_check:
        print("serve_ab: self-check passed")
        return 0

    from max_profile.collect.probes.environment import detect_environment
    from max_profile.serve import (
        ModeContext,
        ServePlan,
        free_port,
        new_serve_raw,
        resolve_plan,
        serve_windows,
        server_tmpdir,
        warm_pass,
    )

    env = detect_environment(check_tools=False)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    order = rounds_of(variants, args.pairs, args.order)
    plan = ServePlan(
        model_path=args.model_path,
        devices=args.devices,
        mode="kernels",
        duration_s=args.duration,
        port=free_port(),
        metrics_port=free_port(),
        max_tokens=args.max_tokens,
        vendor=env.vendor,
        concurrency=[1] * len(order),
        warm=not args.no_warm,
        reference=False,
        extra_args=list(args.server_args),
    )  # the untraced windows are this benchmark's own reference
    resolved = resolve_plan(plan, env.vendor)
    slice_s = args.slice if args.slice is not None else plan.record_slice_s
    plans = {v: variant_plan(v, plan.record_share, slice_s) for v in variants}
    traced_windows = {i for i, v in enumerate(order, 1) if v is not None}

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    print("windows: " + ", ".join(v or "untraced" for v in order), flush=True)
    settle_s = args.settle if args.settle is not None else ModeContext.settle_s
    with server_tmpdir() as tmp:
        if plan.warm:
            warm_pass(resolved, tmp, 900, progress)
        recordings = {i: plans[v] for i, v in enumerate(order, 1) if v is not None}
        context = ModeContext(env, tmp, 900, progress, None, window_recordings=recordings, settle_s=settle_s)
        recorder, dest = resolved.mode.make_recorder(resolved, context)
        raw = serve_windows(
            resolved,
            recorder,
            new_serve_raw(resolved, env, []),
            tmp,
            900,
            progress,
            dest,
            record=lambda w: w in traced_windows,
        )
    from max_profile.analyze.breakdown import gpu_waits
    from max_profile.analyze.load import server_metrics

    # the seconds CUPTI's thread spent in the worker recorder's buffer callbacks, per traced window
    coverage = getattr(recorder, "coverage", {})
    callback_s = {i: c.callback_s for i, c in coverage.items() if c.callback_s is not None}

    windows: list[dict[str, Any]] = []
    for i, w in enumerate(raw.load_windows, 1):
        variant = order[i - 1]
        secs = (w.window_ns[1] - w.window_ns[0]) / 1e9
        tokens = window_tokens(w.requests, w.window_ns)
        # the server's own decode step (TG batch execution time from its /metrics) and the kernels recorded in the
        # window:
        # a slower step with the GPU timeline unchanged points at the host, a slower timeline at the GPU
        srv = server_metrics(w.metrics_before, w.metrics_after, secs)
        tg_ms = srv.batch_execution_ms_mean.get("TG") if srv is not None else None
        inside = (
            int(((raw.kernels.start_ns >= w.window_ns[0]) & (raw.kernels.start_ns < w.window_ns[1])).sum())
            if len(raw.kernels)
            else 0
        )
        cov = coverage.get(i)
        # recorded windows: how often the GPU waited 0.1-5 ms before a device graph (the host launching it late)
        waits = (
            gpu_waits(
                raw.kernels,
                w.window_ns,
                100_000,
                5_000_000,
                recorded=cov.slices if cov is not None and cov.sampled else (),
            )
            if inside
            else None
        )
        gaps = token_gaps(w.requests, w.window_ns)
        per_second = tokens_per_second(w.requests, w.window_ns)
        start_s = cov.start_s if cov is not None else None
        windows.append(
            {
                "window": i,
                "variant": variant,
                "traced": variant is not None,
                "tok_s": tokens / secs,
                "server_tg_ms": tg_ms,
                "kernels": inside,
                "recorded_s": cov.covered_s if cov is not None else None,
                "callback_s": callback_s.get(i),
                "enable_s": start_s,
                "itl_ms": gaps,
                "tokens_per_second": per_second,
                "gpu_waits_before_graphs": waits.before_graph_gaps if waits else None,
                "gpu_waits_before_graphs_pct": round(waits.before_graph_pct, 2) if waits else None,
                # the worker's whole recording (its first slice runs before the window opens): kernels kept, by slice,
                # and those left out for a time outside every slice
                "worker_kernels": cov.recorded_kernels if cov is not None else None,
                "worker_per_slice": list(cov.per_slice) if cov is not None else None,
                "worker_per_slice_by_start": list(cov.per_slice_by_start) if cov is not None else None,
                "worker_outside_slices": cov.outside_slices if cov is not None else None,
                "worker_dropped": cov.dropped if cov is not None else None,
                "worker_notes": list(cov.notes) if cov is not None else None,
            }
        )
        print(
            f"window {i}: {variant or 'untraced':<18} {tokens / secs:8.1f} tok/s, server decode step "
            f"{'-' if tg_ms is None else f'{tg_ms:.3f}'} ms, {inside} kernels recorded"
            + (f" in {cov.covered_s:.1f} s" if cov is not None else "")
            + (f", {callback_s[i]:.3f} s in CUPTI buffer callbacks" if i in callback_s else "")
            + (f", CUPTI enable {1000 * start_s:.0f} ms before it" if start_s is not None else "")
            + (
                f", GPU waited before {waits.before_graph_gaps} graph launches ({waits.before_graph_pct:.1f} % of the "
                "recorded time)"
                if waits
                else ""
            )
            + (
                f"; the worker kept {cov.recorded_kernels} kernels, by slice {list(cov.per_slice)} "
                f"(by their own start {list(cov.per_slice_by_start)}), "
                f"{cov.outside_slices} left out outside every slice"
                if cov is not None and cov.recorded_kernels is not None
                else ""
            )
            + f"; ITL p50 {gaps['p50']:.3f} / p99 {gaps['p99']:.3f} / max {gaps['max']:.1f} ms; tokens per second "
            f"{per_second}",
            flush=True,
        )
    if args.raw:
        raw.save(args.raw)
    tok_s = [w["tok_s"] for w in windows]
    summary: dict[str, Any] = {
        "order": order,
        "order_kind": args.order,
        "plans": {v: dataclasses.asdict(p) for v, p in plans.items()},
        "rounds": args.pairs,
        "variants": {},
        "windows": windows,
        "notes": raw.notes,
        "kernels": len(raw.kernels),
        "graph_kernels": int((raw.kernels.graph_id > 0).sum()) if raw.kernels.graph_id is not None else 0,
        "settle_s": settle_s,
    }
    untraced = [w["tok_s"] for w in windows if not w["traced"]]
    for v in variants:
        ratios = ratios_by_round(tok_s, order, v)
        tok = [w["tok_s"] for w in windows if w["variant"] == v]
        summary["variants"][v] = {
            "ratios": ratios,
            "median_ratio": statistics.median(ratios),
            "min_ratio": min(ratios),
            "max_ratio": max(ratios),
            "median_tok_s": statistics.median(tok),
            "spread_pct": 100 * (max(tok) - min(tok)) / statistics.median(tok),
        }
        print(
            f"{v}: recorded / untraced per round {', '.join(f'{x:.4f}' for x in ratios)}; median "
            f"{statistics.median(ratios):.4f} "
            f"({statistics.median(tok):.1f} tok/s, spread {summary['variants'][v]['spread_pct']:.1f} %)",
            flush=True,
        )
    summary["untraced_median_tok_s"] = statistics.median(untraced)
    summary["untraced_spread_pct"] = 100 * (max(untraced) - min(untraced)) / statistics.median(untraced)
    summary["resolution"] = resolution(tok_s, order, [w["tokens_per_second"] for w in windows])
    print(
        f"untraced: {statistics.median(untraced):.1f} tok/s (spread {summary['untraced_spread_pct']:.1f} %); "
        f"{summary['kernels']} kernels, {summary['graph_kernels']} inside graphs",
        flush=True,
    )
    print(
        f"resolution: successive untraced windows differ by up to {summary['resolution']['untraced_step_pct']:.1f} %, "
        f"a window's own noise {summary['resolution']['window_noise_pct']:.1f} % (median standard error of its rate "
        "from its tokens per second): ratios nearer 1 than these say nothing",
        flush=True,
    )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
