"""The serve worker's tracer cost, A/B on one server: windows with the CUPTI recorder in the model worker and without it,
alternating, same server, same load (``max-profile serve --mode kernels``'s recorder, MAX's defaults: device graphs on).

    python benchmarks/serve_ab.py --model-path DIR [--devices gpu] [--pairs 3] [--duration 10] [--settle S] [--json out.json]

A pair is one traced and one untraced window back to back (the order flips every pair); the ratio of streamed tokens/s
traced / untraced is reported per pair, with every window, the median and the spread, and the host's load per window.
Per window also: the inter-token gaps inside it (p50 / p99 / max: a stall shows as a few long gaps, a slower decode step
as a higher median) and the tokens of each second (a start-up cost shows in the first ones). A traced window opens once
the worker's recording runs plus ``--settle`` seconds (the recorder's own ``settle_s`` by default; 0 measures CUPTI's
first launches after its enable inside the window).
Comparing two servers instead (one per mode) adds the spread between server starts (one earlier pair: 0.914, the other 1.05).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def token_arrivals(requests: list[Any]) -> list[tuple[int, float | None]]:
    """Each streamed token's host arrival time (ns) and its gap to the token before (ms; None for a request's first),
    from each request's TTFT and inter-token gaps."""
    out: list[tuple[int, float | None]] = []
    for r in requests:
        if r.ttft_ms is None:
            continue
        t = r.started_ns + r.ttft_ms * 1e6
        out.append((int(t), None))
        for gap in r.itl_ms:
            t += gap * 1e6
            out.append((int(t), gap))
    return out


def token_gaps(requests: list[Any], window_ns: tuple[int, int]) -> dict[str, float]:
    """Inter-token gaps (ms) of tokens that arrived inside the window: p50, p99, max and how many exceed 3x the median
    (a stall in the window shows as a few long gaps, a slower step as a higher median)."""
    import numpy as np

    gaps = [gap for t, gap in token_arrivals(requests) if gap is not None and window_ns[0] <= t < window_ns[1]]
    if not gaps:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan"), "over_3x_median": 0, "count": 0}
    a = np.asarray(gaps)
    p50 = float(np.median(a))
    return {"p50": p50, "p99": float(np.percentile(a, 99)), "max": float(a.max()), "over_3x_median": int((a > 3 * p50).sum()), "count": len(gaps)}


def tokens_per_second(requests: list[Any], window_ns: tuple[int, int]) -> list[int]:
    """Tokens that arrived in each whole second of the window (a start-up cost shows in the first bins)."""
    seconds = int((window_ns[1] - window_ns[0]) // 1_000_000_000)
    counts = [0] * seconds
    for t, _ in token_arrivals(requests):
        k = (t - window_ns[0]) // 1_000_000_000
        if 0 <= k < seconds:
            counts[k] += 1
    return counts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--devices", default="gpu")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--no-warm", action="store_true")
    ap.add_argument("--settle", type=float, default=None,
                    help="seconds of recording before a traced window opens (default: the recorder's own, WorkerKernelRecorder.settle_s)")
    args = ap.parse_args()

    from max_profile.collect.environment import detect_environment
    from max_profile.serve import ServePlan, _new_raw, _own_tmpdir, _recorder_for, _warm_pass, free_port, serve_windows

    env = detect_environment(check_tools=False)
    plan = ServePlan(model_path=args.model_path, devices=args.devices, mode="kernels", duration_s=args.duration, port=free_port(), metrics_port=free_port(),
                     max_tokens=args.max_tokens, vendor=env.vendor, concurrency=[1] * (2 * args.pairs), warm=not args.no_warm,
                     reference=False)  # the pairs are this benchmark's own reference
    traced_windows = {2 * k + (1 if k % 2 == 0 else 2) for k in range(args.pairs)}  # pair k: traced first when k is even

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with _own_tmpdir() as tmp:
        if plan.warm:
            _warm_pass(plan, tmp, 900, progress)
        recorder, dest = _recorder_for(plan, env, tmp, None, 900, progress, None)
        if args.settle is not None:
            recorder.settle_s = args.settle  # type: ignore[attr-defined]
        raw = serve_windows(plan, recorder, _new_raw(plan, env, []), tmp, 900, progress, dest, record=lambda w: w in traced_windows)
    from max_profile.analyze.breakdown import gpu_waits
    from max_profile.analyze.load import server_metrics

    # the seconds CUPTI's thread spent in the worker recorder's buffer callbacks, per traced window
    coverage = getattr(recorder, "coverage", {})
    callback_s = {i: c.callback_s for i, c in coverage.items() if c.callback_s is not None}

    windows: list[dict[str, Any]] = []
    for i, w in enumerate(raw.load_windows, 1):
        secs = (w.window_ns[1] - w.window_ns[0]) / 1e9
        tokens = 0.0
        for r in w.requests:
            if r.ok:
                span = max(r.ended_ns - r.started_ns, 1)
                tokens += r.tokens * max(min(r.ended_ns, w.window_ns[1]) - max(r.started_ns, w.window_ns[0]), 0) / span
        # the server's own decode step (TG batch execution time from its /metrics) and the kernels recorded in the window:
        # a slower step with the GPU timeline unchanged points at the host, a slower timeline at the GPU
        srv = server_metrics(w.metrics_before, w.metrics_after, secs)
        tg_ms = srv.batch_execution_ms_mean.get("TG") if srv is not None else None
        inside = int(((raw.kernels.start_ns >= w.window_ns[0]) & (raw.kernels.start_ns < w.window_ns[1])).sum()) if len(raw.kernels) else 0
        # traced windows: how often the GPU waited 0.1-5 ms before a device graph (the host launching it late)
        waits = gpu_waits(raw.kernels, w.window_ns, 100_000, 5_000_000) if inside else None
        gaps = token_gaps(w.requests, w.window_ns)
        per_second = tokens_per_second(w.requests, w.window_ns)
        start_s = coverage[i].start_s if i in coverage else None
        windows.append({"window": i, "traced": i in traced_windows, "tok_s": tokens / secs, "server_tg_ms": tg_ms, "kernels": inside,
                        "callback_s": callback_s.get(i), "enable_s": start_s, "itl_ms": gaps, "tokens_per_second": per_second,
                        "gpu_waits_before_graphs": waits.before_graph_gaps if waits else None,
                        "gpu_waits_before_graphs_pct": round(waits.before_graph_pct, 2) if waits else None})
        print(f"window {i}: {'traced  ' if i in traced_windows else 'untraced'} {tokens / secs:8.1f} tok/s, server decode step "
              f"{'-' if tg_ms is None else f'{tg_ms:.3f}'} ms, {inside} kernels recorded"
              + (f", {callback_s[i]:.3f} s in CUPTI buffer callbacks" if i in callback_s else "")
              + (f", CUPTI enable {1000 * start_s:.0f} ms before it" if start_s is not None else "")
              + (f", GPU waited before {waits.before_graph_gaps} graph launches ({waits.before_graph_pct:.1f} %)" if waits else "")
              + f"; ITL p50 {gaps['p50']:.3f} / p99 {gaps['p99']:.3f} / max {gaps['max']:.1f} ms; tokens per second {per_second}", flush=True)
    ratios = []
    for k in range(args.pairs):
        a, b = windows[2 * k], windows[2 * k + 1]
        traced, untraced = (a, b) if a["traced"] else (b, a)
        ratios.append(traced["tok_s"] / untraced["tok_s"] if untraced["tok_s"] else float("nan"))
        print(f"pair {k + 1}: traced / untraced = {ratios[-1]:.4f}", flush=True)
    t = [w["tok_s"] for w in windows if w["traced"]]
    u = [w["tok_s"] for w in windows if not w["traced"]]
    summary = {"pairs": ratios, "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
               "traced_median_tok_s": statistics.median(t), "untraced_median_tok_s": statistics.median(u),
               "traced_spread_pct": 100 * (max(t) - min(t)) / statistics.median(t), "untraced_spread_pct": 100 * (max(u) - min(u)) / statistics.median(u),
               "kernels": len(raw.kernels), "graph_kernels": int((raw.kernels.graph_id > 0).sum()) if raw.kernels.graph_id is not None else 0,
               "tracer_callback_s": raw.tracer_callback_s, "settle_s": getattr(recorder, "settle_s", None), "windows": windows, "notes": raw.notes}
    print(f"median traced / untraced: {summary['median_ratio']:.4f} (pairs {', '.join(f'{r:.4f}' for r in ratios)}); "
          f"traced {summary['traced_median_tok_s']:.1f} (spread {summary['traced_spread_pct']:.1f} %), untraced {summary['untraced_median_tok_s']:.1f} "
          f"(spread {summary['untraced_spread_pct']:.1f} %); {summary['kernels']} kernels, {summary['graph_kernels']} inside graphs", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
