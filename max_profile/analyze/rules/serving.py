"""Load sweeps: where throughput stops scaling or latency bends, and why (server metrics first)."""

from __future__ import annotations

from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Finding, LoadLevel, Report


def _knee_of(levels: list[LoadLevel], th: Thresholds) -> tuple[LoadLevel, LoadLevel, float, float] | None:
    """The first pair of levels where throughput stops scaling or lags the added concurrency while latency climbs:
    (level before, knee level, throughput gain, ITL growth)."""
    knee = None
    for prev, cur in zip(levels, levels[1:], strict=False):
        gain = cur.output_tok_per_s / prev.output_tok_per_s - 1.0 if prev.output_tok_per_s > 0 else 0.0
        itl_growth = (cur.itl_ms.p50 / prev.itl_ms.p50) if cur.itl_ms.p50 and prev.itl_ms.p50 else 1.0
        ttft_growth = (cur.ttft_ms.p90 / prev.ttft_ms.p90) if cur.ttft_ms.p90 and prev.ttft_ms.p90 else 1.0
        efficiency = (1.0 + gain) / (cur.concurrency / prev.concurrency)
        # flat throughput, or throughput lagging far behind the added concurrency while latency climbs
        if gain < th.knee_min_gain or (
            efficiency < th.knee_min_efficiency and max(itl_growth, ttft_growth) >= th.knee_itl_growth
        ):
            knee = (prev, cur, gain, itl_growth)
            break
    return knee


def _knee_cause(prev: LoadLevel, cur: LoadLevel, th: Thresholds) -> tuple[str, str, str]:
    """(cause, why, advice) of a knee, in order of evidence (see :func:`rule_latency_knee`)."""
    srv = cur.server
    prev_batch = prev.server.batch_size_mean if prev.server else None
    cause, why, advice = (
        "unknown",
        "the server's metrics do not say why",
        "Read the server's metrics at this concurrency (KV-cache use, batch size, queue).",
    )
    spike = (cur.itl_ms.p99 / cur.itl_ms.p50) if cur.itl_ms.p99 and cur.itl_ms.p50 else None
    if srv is not None and ((srv.kv_cache_used_pct or 0) >= th.knee_kv_pressure_pct or (srv.preemptions or 0) > 0):
        cause, why = (
            "kv-cache-pressure",
            f"KV cache {srv.kv_cache_used_pct or 0:.0f}% used, {srv.preemptions or 0:.0f} preemptions in the window",
        )
        advice = (
            "More KV-cache memory (--device-memory-utilization), shorter --max-length, or fewer concurrent "
            "requests per replica."
        )
    elif (
        srv is not None
        and srv.batch_size_mean
        and prev_batch
        and srv.batch_size_mean < th.knee_batch_growth * prev_batch
    ):
        cause = "batch-limit"
        why = (
            f"the batch stayed at {srv.batch_size_mean:.1f} requests (was {prev_batch:.1f}) while concurrency went "
            f"{prev.concurrency} -> {cur.concurrency}: requests wait for a batch slot (TTFT p90 "
            f"{prev.ttft_ms.p90 or 0:.0f} -> {cur.ttft_ms.p90 or 0:.0f} ms)"
        )
        advice = "Raise --max-batch-size (if memory allows) or add replicas."
    elif (
        spike is not None and spike >= th.knee_itl_spike_ratio and srv is not None and (srv.batches.get("CE") or 0) > 0
    ):
        cause = "prefill-interference"
        why = (
            f"ITL p99 is {spike:.1f}x its p50 with {srv.batches.get('CE', 0):.0f} prefill (CE) batches of "
            f"{srv.batch_execution_ms_mean.get('CE', 0):.1f} ms mean in the window"
        )
        advice = (
            "Chunked prefill / a smaller prefill token budget (--max-batch-input-tokens), or disaggregated prefill."
        )
    elif cur.gpu_utilization_pct is not None and cur.gpu_utilization_pct >= th.knee_gpu_saturated_pct:
        cause, why = (
            "gpu-saturated",
            f"the GPU was busy {cur.gpu_utilization_pct:.0f}% of the time: this is its capacity for this model",
        )
        advice = (
            "Healthy: for more throughput, a larger batch per step (if latency allows), quantized weights, or "
            "more GPUs."
        )
    elif cur.gpu_utilization_pct is not None and cur.gpu_utilization_pct < th.host_bound_util_pct:
        cause, why = (
            "host-bound",
            f"the GPU was busy only {cur.gpu_utilization_pct:.0f}% of the time while requests waited",
        )
        advice = (
            "The host side (tokenization, scheduling, streaming) limits: profile the server's processes (py-spy) "
            "or add API workers."
        )
    return cause, why, advice


def rule_latency_knee(report: Report, th: Thresholds) -> list[Finding]:
    """The concurrency where a load sweep stops scaling (throughput flat) or latency bends, and why.

    Causes, in order of evidence: KV-cache pressure (use near 100 %, preemptions), the batch limit (batch size stops
    growing while requests queue), prefill interference (ITL spikes with context-encoding batches in the window), a
    saturated GPU (its capacity: healthy), host-bound (GPU idle while requests queue).
    """
    levels = sorted(report.load_levels, key=lambda lv: lv.concurrency)
    if len(levels) < 2:
        return []
    knee = _knee_of(levels, th)
    best = max(levels, key=lambda lv: lv.output_tok_per_s)
    if knee is None:
        return [
            Finding(
                id="load-scales",
                severity="info",
                confidence=0.6,
                title=f"Throughput scaled over the whole sweep: {levels[0].output_tok_per_s:.0f} -> "
                f"{levels[-1].output_tok_per_s:.0f} output tok/s "
                f"from concurrency {levels[0].concurrency} to {levels[-1].concurrency}; try higher concurrency to find "
                "the knee",
                evidence={
                    "levels": ",".join(str(lv.concurrency) for lv in levels),
                    "best_output_tok_per_s": best.output_tok_per_s,
                },
            )
        ]
    prev, cur, gain, itl_growth = knee
    srv = cur.server
    ev: dict[str, float | int | str | None] = {
        "knee_concurrency": cur.concurrency,
        "previous_concurrency": prev.concurrency,
        "output_tok_per_s_before": prev.output_tok_per_s,
        "output_tok_per_s_at_knee": cur.output_tok_per_s,
        "throughput_gain_pct": round(100 * gain, 1),
        "itl_p50_ms_before": prev.itl_ms.p50,
        "itl_p50_ms_at_knee": cur.itl_ms.p50,
        "itl_p99_ms_at_knee": cur.itl_ms.p99,
        "ttft_p90_ms_at_knee": cur.ttft_ms.p90,
        "gpu_utilization_pct_at_knee": cur.gpu_utilization_pct,
    }
    prev_batch = prev.server.batch_size_mean if prev.server else None
    if srv is not None and not srv.unavailable:
        ev.update(
            {
                "batch_size_mean": srv.batch_size_mean,
                "batch_size_mean_before": prev_batch,
                "requests_queued": srv.requests_queued,
                "kv_cache_used_pct": srv.kv_cache_used_pct,
                "preemptions": srv.preemptions,
                "ce_batches": srv.batches.get("CE"),
                "ce_batch_ms_mean": srv.batch_execution_ms_mean.get("CE"),
                "tg_batch_ms_mean": srv.batch_execution_ms_mean.get("TG"),
            }
        )
    cause, why, advice = _knee_cause(prev, cur, th)
    ev["cause"] = cause
    return [
        Finding(
            id="latency-knee",
            severity="info" if cause == "gpu-saturated" else "warning",
            confidence=0.7 if cause != "unknown" else 0.5,
            evidence=ev,
            title=f"Latency bends at concurrency {cur.concurrency} (throughput +{100 * gain:.0f}% over "
            f"{prev.concurrency}, ITL p50 x{itl_growth:.2f}): {why}",
            next_step=advice,
        )
    ]
