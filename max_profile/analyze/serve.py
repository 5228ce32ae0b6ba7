"""The client's view of a ``max serve`` capture: requests, TTFT and inter-token latency over the window."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from max_profile.model import Histogram, RequestRecord, ServeRun, ServeSummary

HISTOGRAM_BINS = 40


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if len(values) else None


def histogram(values: Sequence[float], bins: int = HISTOGRAM_BINS) -> Histogram | None:
    """Counts over ``bins`` equal bins from the smallest to the 99.5th-percentile value (the last bin holds the tail)."""
    if not len(values):
        return None
    data = np.asarray(values, dtype=float)
    lo, hi = float(data.min()), float(np.percentile(data, 99.5))
    if hi <= lo:
        hi = lo + 1e-3
    counts, edges = np.histogram(np.clip(data, lo, hi), bins=bins, range=(lo, hi))
    return Histogram(edges=[round(float(e), 4) for e in edges], counts=[int(c) for c in counts])


def requests_in_window(records: Sequence[RequestRecord], window: tuple[int, int] | None) -> list[RequestRecord]:
    """Requests that overlapped the window (the load runs longer than it: warm-up, profiler start / stop)."""
    if window is None:
        return list(records)
    inside = [r for r in records if r.ended_ns >= window[0] and r.started_ns <= window[1]]
    return inside or list(records)


def summarize_serve(run: ServeRun, records: Sequence[RequestRecord], window: tuple[int, int] | None) -> ServeSummary:
    """Request counts, streamed tokens, TTFT and inter-token latency percentiles (client side, ms)."""
    records = requests_in_window(records, window)
    good = [r for r in records if r.ok]
    ttft = [r.ttft_ms for r in good if r.ttft_ms is not None]
    itl = [g for r in good for g in r.itl_ms]
    itl_p50 = _pct(itl, 50)
    return ServeSummary(
        mode=run.mode, port=run.port, window_s=(window[1] - window[0]) / 1e9 if window else 0.0, requests=len(records),
        failed_requests=len(records) - len(good), output_tokens=sum(r.tokens for r in good),
        ttft_ms_p50=_pct(ttft, 50), ttft_ms_p90=_pct(ttft, 90), itl_ms_p50=itl_p50, itl_ms_p90=_pct(itl, 90),
        tokens_per_s=(1e3 / itl_p50) if itl_p50 else None, time_to_ready_s=run.time_to_ready_s, commands=list(run.commands),
        output_tok_per_s=round(sum(r.tokens for r in good) / ((window[1] - window[0]) / 1e9), 2) if window and window[1] > window[0] else None,
        server_log=run.server_log, first_error=next((r.error for r in records if r.error), None),
        ttft_histogram=histogram(ttft), itl_histogram=histogram(itl),
    )
