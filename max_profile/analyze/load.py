"""Load windows of ``max serve`` (one window, or one per concurrency level of a sweep): client latency percentiles,
goodput against SLOs, and what the server's own metrics say over each window; the client's view of the whole capture
(requests, TTFT and inter-token latency histograms); what tracing cost. Pure functions of the raw capture.

Goodput (requests/s that met every SLO) follows AIPerf / ``vllm bench serve --goodput``: a request counts when it
completed inside the window, its TTFT is within the TTFT objective and its p90 inter-token gap within the ITL one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from max_profile.analyze.ops import OPS_MODE_DECODE_STEP_MS, ops_calls_per_step
from max_profile.model import (
    Histogram,
    KernelBreakdown,
    LatencyStats,
    LoadLevel,
    LoadWindow,
    MetricPoint,
    MetricsScrape,
    OpBreakdown,
    RawCapture,
    Report,
    RequestRecord,
    ServerMetrics,
    ServeRun,
    ServeSummary,
    StepLedger,
    TracerCost,
    UtilizationSample,
    merged_spans,
)
from max_profile.model.tags import Collector, KernelOrigin, LedgerSource, host_ops, serve_mode_of, traced_inside

METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "requests": ("maxserve_request_count",),
    "output_tokens": ("maxserve_num_output_tokens",),
    "batch_execution": ("maxserve_batch_execution_time",),
    "batch_size": ("maxserve_batch_size",),
    "ttft": ("maxserve_time_to_first_token",),
    "itl": ("maxserve_itl",),
    "queued": ("maxserve_num_requests_queued",),
    "running": ("maxserve_num_requests_running",),
    "kv_used_blocks": ("maxserve_cache_num_used_blocks",),
    "kv_total_blocks": ("maxserve_cache_num_total_blocks",),
    "kv_used_pct": ("maxserve_cache_used_kv_pct",),
    "preemptions": ("maxserve_cache_preemption_count",),
}
"""What each figure is called in MAX 26.7's exposition (OpenTelemetry names with dots as underscores; the exporter
appends the unit, ``_total`` to counters and ``_bucket`` / ``_sum`` / ``_count`` to histograms: matched by prefix)."""


def latency(values: Sequence[float]) -> LatencyStats:
    if not len(values):
        return LatencyStats(p50=None, p90=None, p99=None, samples=0)
    a = np.asarray(values, dtype=float)
    return LatencyStats(
        p50=round(float(np.percentile(a, 50)), 4),
        p90=round(float(np.percentile(a, 90)), 4),
        p99=round(float(np.percentile(a, 99)), 4),
        samples=int(a.size),
    )


def _matching(points: Sequence[MetricPoint], prefixes: tuple[str, ...], suffix: str = "") -> list[MetricPoint]:
    """Samples whose name starts with one of ``prefixes`` and ends with ``suffix`` (``_sum``, ``_count``, or a plain
    value)."""
    out = []
    for p in points:
        if not p.name.startswith(prefixes):
            continue
        if suffix:
            if p.name.endswith(suffix):
                out.append(p)
        elif not p.name.endswith(("_bucket", "_sum", "_count", "_created")):
            out.append(p)
    return out


def _series(p: MetricPoint) -> tuple[str, tuple[tuple[str, str], ...]]:
    return p.name, tuple(sorted(p.labels.items()))


def _delta(
    before: MetricsScrape, after: MetricsScrape, prefixes: tuple[str, ...], suffix: str, key: str | None = None
) -> dict[str, float] | None:
    """Per value of the ``key`` label (all together for None): how much the matching samples grew between the scrapes,
    series by series (a counter that went down, a restarted server's, counts 0 and takes nothing off the others)."""
    points = _matching(after.points, prefixes, suffix)
    if not points:
        return None
    base = {_series(p): p.value for p in _matching(before.points, prefixes, suffix)}
    out: dict[str, float] = {}
    for p in points:
        label = p.labels.get(key, "") if key else ""
        out[label] = out.get(label, 0.0) + max(p.value - base.get(_series(p), 0.0), 0.0)
    return out


def _mean_of_histogram(
    before: MetricsScrape, after: MetricsScrape, prefixes: tuple[str, ...], key: str | None = None
) -> dict[str, float] | None:
    sums, counts = _delta(before, after, prefixes, "_sum", key), _delta(before, after, prefixes, "_count", key)
    if sums is None or counts is None:
        return None
    return {label: sums[label] / counts[label] for label in sums if counts.get(label)}


def _gauge(scrape: MetricsScrape, prefixes: tuple[str, ...]) -> float | None:
    points = _matching(scrape.points, prefixes)
    return float(sum(p.value for p in points)) if points else None


def server_metrics(before: MetricsScrape | None, after: MetricsScrape | None, window_s: float) -> ServerMetrics | None:
    """Counter and histogram deltas between two scrapes, gauges at the second; None when no scrape was taken. Its
    window is the time between the two scrapes (they bracket the load window, each a little outside it)."""
    if before is None and after is None:
        return None
    if before is not None and after is not None and after.t_ns > before.t_ns:
        window_s = (after.t_ns - before.t_ns) / 1e9
    url = (after or before).url  # type: ignore[union-attr]
    for scrape in (before, after):
        if scrape is None or scrape.problem:
            why = scrape.problem if scrape is not None else "not read"
            return ServerMetrics(url=url, window_s=window_s, unavailable=f"{url}: {why}")
    assert before is not None and after is not None
    if not after.points:
        return ServerMetrics(url=url, window_s=window_s, unavailable=f"{url}: the endpoint answered with no metrics")
    missing: list[str] = []

    def total(name: str, suffix: str) -> float | None:
        d = _delta(before, after, METRIC_NAMES[name], suffix)
        if d is None:
            missing.append(name)
            return None
        return round(sum(d.values()), 3)

    def mean(name: str, key: str | None = None) -> dict[str, float] | None:
        m = _mean_of_histogram(before, after, METRIC_NAMES[name], key)
        if m is None:
            missing.append(name)
        return m

    def gauge(name: str) -> float | None:
        v = _gauge(after, METRIC_NAMES[name])
        if v is None:
            missing.append(name)
        return v

    counts = _delta(before, after, METRIC_NAMES["batch_execution"], "_count", "batch_type") or {}
    exec_ms = mean("batch_execution", "batch_type") or {}
    size = mean("batch_size")
    ttft, itl = mean("ttft"), mean("itl")
    used, total_blocks = gauge("kv_used_blocks"), gauge("kv_total_blocks")
    kv_hist = _mean_of_histogram(
        before, after, METRIC_NAMES["kv_used_pct"]
    )  # MAX 26.7 records it per batch (a histogram)
    pct = next(iter(kv_hist.values())) if kv_hist else _gauge(after, METRIC_NAMES["kv_used_pct"])
    if pct is None and used is not None and total_blocks:
        pct = 100.0 * used / total_blocks
    return ServerMetrics(
        url=url,
        window_s=window_s,
        requests=total("requests", ""),
        output_tokens=total("output_tokens", ""),
        batches={k or "all": round(v, 1) for k, v in counts.items()},
        batch_execution_ms_mean={k or "all": round(v, 4) for k, v in exec_ms.items()},
        batch_size_mean=round(next(iter(size.values())), 3) if size else None,
        ttft_ms_mean=round(next(iter(ttft.values())), 4) if ttft else None,
        itl_ms_mean=round(next(iter(itl.values())), 4) if itl else None,
        requests_queued=gauge("queued"),
        requests_running=gauge("running"),
        kv_cache_used_pct=round(pct, 2) if pct is not None else None,
        kv_blocks_used=used,
        kv_blocks_total=total_blocks,
        preemptions=total("preemptions", ""),
        missing=sorted(set(missing)),
    )


def _inside(records: Sequence[RequestRecord], window: tuple[int, int]) -> list[RequestRecord]:
    return [r for r in records if r.ended_ns >= window[0] and r.started_ns <= window[1]]


def _meets(r: RequestRecord, slo: dict[str, float]) -> bool:
    if "ttft" in slo and (r.ttft_ms is None or r.ttft_ms > slo["ttft"]):
        return False
    if "itl" in slo and r.itl_ms and float(np.percentile(r.itl_ms, 90)) > slo["itl"]:
        return False
    return True


def in_flight(requests: Sequence[RequestRecord], window: tuple[int, int]) -> tuple[float, float]:
    """(share of the window with at least one request in flight, in %; completed requests per second)."""
    w0, w1 = window
    span = max(w1 - w0, 1)
    inside = [(max(r.started_ns, w0), min(r.ended_ns, w1)) for r in requests if r.ended_ns >= w0 and r.started_ns <= w1]
    covered = sum(b - a for a, b in merged_spans(inside) if b > a)
    done = sum(1 for r in requests if r.ok and w0 <= r.ended_ns <= w1)
    return round(100 * covered / span, 2), round(done / (span / 1e9), 4)


def load_level(window: LoadWindow, slo: dict[str, float], samples: Sequence[UtilizationSample] = ()) -> LoadLevel:
    """One load window summarized: throughput over the window, latency percentiles, goodput, the server's metrics."""
    w0, w1 = window.window_ns
    secs = max((w1 - w0) / 1e9, 1e-9)
    records = _inside(window.requests, window.window_ns)
    good = [r for r in records if r.ok]
    completed = [r for r in good if not r.truncated and ended_inside(r.ended_ns, [window.window_ns])]
    tokens = window_tokens(good, window.window_ns)
    goodput = slo_pct = None
    if slo:
        met = [r for r in completed if _meets(r, slo)]
        goodput = round(len(met) / secs, 4)
        slo_pct = round(100.0 * len(met) / len(completed), 1) if completed else None
    inside = [s.utilization_pct for s in samples if w0 <= s.t_ns <= w1 and s.utilization_pct is not None]
    return LoadLevel(
        concurrency=window.concurrency,
        window_s=round(secs, 3),
        requests=len(records),
        completed=len(completed),
        failed=len(records) - len(good),
        output_tokens=int(round(tokens)),
        output_tok_per_s=round(tokens / secs, 2),
        request_rate_rps=round(len(completed) / secs, 4),
        ttft_ms=latency([r.ttft_ms for r in good if r.ttft_ms is not None]),
        itl_ms=latency([g for r in good for g in r.itl_ms]),
        goodput_rps=goodput,
        slo_met_pct=slo_pct,
        gpu_utilization_pct=round(float(np.mean(inside)), 1) if inside else None,
        server=server_metrics(window.metrics_before, window.metrics_after, secs),
        in_flight_pct=in_flight(window.requests, window.window_ns)[0] if window.requests else None,
    )


def window_tokens(requests: Sequence[RequestRecord], window_ns: tuple[int, int]) -> float:
    """Tokens the successful requests streamed inside a window, unrounded: a request that straddles an edge counts
    its share by time (its tokens times the part of its span inside the window)."""
    w0, w1 = window_ns
    tokens = 0.0
    for r in requests:
        if r.ok:
            span = max(r.ended_ns - r.started_ns, 1)
            tokens += r.tokens * max(min(r.ended_ns, w1) - max(r.started_ns, w0), 0) / span
    return tokens


def token_arrivals(requests: Sequence[RequestRecord]) -> list[tuple[int, float | None]]:
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


def rate_noise(window: LoadWindow) -> float | None:
    """The window's own noise: the relative standard error of its token rate, from the tokens that arrived in each
    of 4-30 equal parts of it (about a second each): how far its tokens/s could move on the same server by chance.
    None with too few tokens to say."""
    w0, w1 = window.window_ns
    secs = (w1 - w0) / 1e9
    parts = int(min(max(round(secs), 4), 30))
    arrived = np.array([t for t, _ in token_arrivals(window.requests) if w0 <= t < w1], dtype=np.int64)
    if len(arrived) < 4 * parts:
        return None
    counts = np.bincount(((arrived - w0) * parts // (w1 - w0)).astype(np.int64), minlength=parts)[:parts]
    return counts_noise(counts.tolist())


def counts_noise(counts: Sequence[int]) -> float | None:
    """The relative standard error of a mean rate from its counts in equal parts of a window (sd / sqrt(n) / mean);
    None for fewer than two parts or no counts."""
    if len(counts) < 2 or not sum(counts):
        return None
    a = np.asarray(counts, dtype=float)
    return float(np.std(a, ddof=1) / np.sqrt(len(a)) / np.mean(a))


def tracer_cost(windows: Sequence[LoadWindow]) -> TracerCost | None:
    """The recorder's cost on one server: its untraced reference window against the first recorded window at the same
    concurrency (client tokens/s, the server's mean decode step, the median inter-token gap); None without both. The
    ratio's own noise (``throughput_ratio_noise``) is the two windows' :func:`rate_noise` combined: a ratio within
    twice it of 1 is no measured cost."""
    reference = next((w for w in windows if w.reference), None)
    if reference is None:
        return None
    traced = next((w for w in windows if w.traced and not w.reference and w.concurrency == reference.concurrency), None)
    if traced is None:
        return None
    ref, rec = load_level(reference, {}), load_level(traced, {})

    def decode_step(level: LoadLevel) -> float | None:
        return level.server.batch_execution_ms_mean.get("TG") if level.server is not None else None

    ratio = rec.output_tok_per_s / ref.output_tok_per_s if ref.output_tok_per_s else None
    ref_noise, rec_noise = rate_noise(reference), rate_noise(traced)
    noise = (
        round(ratio * float(np.hypot(ref_noise, rec_noise)), 4)
        if ratio is not None and ref_noise is not None and rec_noise is not None
        else None
    )
    return TracerCost(
        concurrency=reference.concurrency,
        reference_tok_s=ref.output_tok_per_s,
        traced_tok_s=rec.output_tok_per_s,
        throughput_ratio=round(ratio, 4) if ratio is not None else None,
        throughput_ratio_noise=noise,
        reference_decode_step_ms=decode_step(ref),
        traced_decode_step_ms=decode_step(rec),
        reference_itl_p50_ms=ref.itl_ms.p50,
        traced_itl_p50_ms=rec.itl_ms.p50,
    )


class MeasuredCost(NamedTuple):
    """The slowdown (1 - tokens/s ratio to untraced, both the ratio of medians and the median of the per-round ratios)
    one way of recording was measured at, the card and the decode step (ms) it was measured with."""

    low: float
    high: float
    gpu: str
    step_ms: float


MEASURED_TRACING_COST: dict[tuple[str, bool], MeasuredCost] = {
    # (what recorded, device graphs on) -> the measured range, by `benchmarks/untraced_overhead.py`, interleaved rounds
    # against the pipeline with no max_profile code, batch 1, a Llama-3.2-3B-shaped bf16 model (docs/measurements.md).
    # H200, 128-256 tokens, 2.0-2.1 ms decode steps with graphs (3.3-3.5 ms without), 11-15 rounds per run; every step
    # recorded: 0.856-0.874 of untraced with graphs, 0.869 without.
    ("cupti, a quarter of the steps", True): MeasuredCost(0.022, 0.032, "H200", 2.05),
    ("cupti, every step", True): MeasuredCost(0.035, 0.19, "H200", 2.05),
    ("cupti, a quarter of the steps", False): MeasuredCost(0.06, 0.105, "H200", 3.4),
    ("cupti, every step", False): MeasuredCost(0.045, 0.135, "H200", 3.4),
    ("step hook and GPU sampler", True): MeasuredCost(0.0, 0.04, "H200", 2.05),
    ("step hook and GPU sampler", False): MeasuredCost(0.0, 0.07, "H200", 3.4),
    # A sixteenth of the steps (the default), H100s, 256 tokens, 11-31 rounds per run. Graphs on, 2.47 ms steps: the
    # runs read 0.9894 to 1.0286 (ratio of medians), a steady machine 0.9955 / 0.9954 (tests/data/gpu/
    # h100_llama3b_tracing_cost_in_process) and the 5.2B model at 3.91 ms steps 0.9982. Eager, 2.8-3.6 ms steps: 0.9307
    # to 0.987 on machines whose untraced rate spread 18-43 % between rounds, a steady machine 0.9918 / 0.9936: the
    # range is as wide as the noisier machines measured.
    ("cupti, a sixteenth of the steps", True): MeasuredCost(0.0, 0.012, "H100", 2.47),
    ("cupti, a sixteenth of the steps", False): MeasuredCost(0.0, 0.069, "H100", 2.8),
}
"""What tracing cost in-process where the capture itself did not measure it. Equivalent measurement:
``python benchmarks/untraced_overhead.py --model-path M`` (every arm against the pipeline with no max_profile code).
The cost per step is about fixed, so a longer decode step than the row's pays a smaller share."""


def cupti_cost_row(recorded_share: float | None) -> str:
    """The row of MEASURED_TRACING_COST nearest a CUPTI recording's share of the window (older captures recorded a
    quarter by default, current ones a sixteenth; a short run records more than its share: the first slice holds
    prefill and the first decode steps)."""
    if recorded_share is None or recorded_share >= 0.5:
        return "cupti, every step"
    return "cupti, a quarter of the steps" if recorded_share >= 0.125 else "cupti, a sixteenth of the steps"


def tracing_cost_statement(report: Report) -> str | None:
    """What tracing cost this capture, and how that is known: measured on the same server (serve's untraced reference
    window), or expected from the H200 measurements for this way of recording, scaled to this decode step; ``None`` for
    a capture with nothing traced in it (start-up only)."""
    c = report.tracer_cost
    if c is not None and c.throughput_ratio is not None:
        return (
            f"tracing cost, measured on this server: the recorded window ran at {c.throughput_ratio:.3f}"
            f"{c.ratio_noise_text} of the untraced one "
            f"({c.traced_tok_s:.1f} vs {c.reference_tok_s:.1f} tok/s, concurrency {c.concurrency}){c.unresolved_text}"
        )
    collectors = report.capture.collectors
    if Collector.PIPELINE_HOOK not in collectors:
        tool = next((x for x in collectors if x != Collector.STARTUP), None)
        if tool is None:
            return None
        if not traced_inside(tool):
            return "tracing cost: none inside the server (its /metrics and the GPU's counters are read from outside)"
        if serve_mode_of(tool) is not None:
            return f"tracing cost: not measured ({tool} ran without an untraced reference window)"
        return f"tracing cost: set by the tool that recorded this trace ({tool}); not measured here"
    if isinstance(report.ops, OpBreakdown):
        calls = ops_calls_per_step(report.ops, "decode")
        ops_step, default_step = OPS_MODE_DECODE_STEP_MS
        return (
            "tracing cost, expected (not measured in this capture): --kernels ops (MAX's profiling mode, device graphs "
            "off, CUPTI on every step) leaves the kernels as they are and lengthens the host's step: on an H200 an "
            f"8-layer model's decode step took {ops_step:.3f} ms in this mode against {default_step:.3f} ms in MAX's "
            f"default run ({ops_step / default_step:.1f}x)"
            + (f"; this capture launched {calls:.0f} op calls per decode step" if calls is not None else "")
            + "; compare its step times with --kernels auto"
        )
    k = report.kernels if isinstance(report.kernels, KernelBreakdown) else None
    source = k.source if k is not None else ""
    recorded_share = (
        k.recorded_ms / k.window_ms if k is not None and k.recorded_ms is not None and k.window_ms else None
    )
    if host_ops(source):
        return (
            "tracing cost, not measured: MAX's profiling mode (MODULAR_ENABLE_PROFILING=on) compiles the model again "
            "and emits a range per op on the host; compare step times with a run without it (--kernels off)"
        )
    graphs = report.capture.device_graph_capture is not False
    if report.environment.vendor == "none":  # the measured rows are of GPUs: none of them speaks for this host
        return (
            "tracing cost, not measured on this CPU: the step hook wraps each execute (no kernel tracer here); "
            "benchmarks/untraced_overhead.py --devices cpu measures it on this model"
        )
    what = (
        cupti_cost_row(recorded_share) if KernelOrigin.of(source) is KernelOrigin.CUPTI else "step hook and GPU sampler"
    )
    row = MEASURED_TRACING_COST[(what, graphs)]
    step_ms = _decode_step_ms(report)
    scale = min(1.0, row.step_ms / step_ms) if step_ms else 1.0
    shown = (
        ""
        if scale >= 0.999
        else f"; this {step_ms:.2f} ms decode step: about {100 * row.low * scale:.1f}-{100 * row.high * scale:.1f} %"
    )
    share = (
        f" ({100 * recorded_share:.0f} % of the window recorded)"
        if recorded_share is not None and recorded_share < 1
        else ""
    )
    return (
        f"tracing cost, expected (not measured in this capture): {what}{share}, device graphs "
        f"{'on' if graphs else 'off'}: "
        f"{100 * row.low:.1f}-{100 * row.high:.1f} % slower than untraced on an {row.gpu} at a {row.step_ms:g} ms "
        f"decode step{shown} (benchmarks/untraced_overhead.py measures it on this model)"
    )


def _decode_step_ms(report: Report) -> float | None:
    """The median host decode step (ms), from the report's steps."""
    steps = [
        s.duration_ns / 1e6 for s in report.steps if s.phase == "decode" and s.batch_size > 0 and s.duration_ns > 0
    ]
    return float(np.median(steps)) if steps else None


# The client's view of a `max serve` capture: requests, TTFT and inter-token latency over the window.

HISTOGRAM_BINS = 40


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if len(values) else None


def histogram(values: Sequence[float], bins: int = HISTOGRAM_BINS) -> Histogram | None:
    """Counts over ``bins`` equal bins from the smallest to the 99.5th-percentile value (the last bin holds the
    tail)."""
    if not len(values):
        return None
    data = np.asarray(values, dtype=float)
    lo, hi = float(data.min()), float(np.percentile(data, 99.5))
    if hi <= lo:
        hi = lo + 1e-3
    counts, edges = np.histogram(np.clip(data, lo, hi), bins=bins, range=(lo, hi))
    return Histogram(edges=[round(float(e), 4) for e in edges], counts=[int(c) for c in counts])


def measured_windows(raw: RawCapture) -> list[tuple[int, int]]:
    """The spans a served or attached capture measured, in time order: each load level's window (a sweep's pauses
    between levels, and the tracer's untraced reference window, are no part of them), else the capture's one window;
    empty without either."""
    spans = sorted(w.window_ns for w in raw.load_windows if not w.reference and w.window_ns[1] > w.window_ns[0])
    if spans:
        return spans
    return [raw.window_ns] if raw.window_ns is not None else []


def ended_inside(ended_ns: int, windows: Sequence[tuple[int, int]]) -> bool:
    """Whether a request (or pass) that ended at ``ended_ns`` belongs to the windows: it ended inside one of them. Each
    request belongs to one window, so counts over a sweep's levels add up."""
    return any(w0 <= ended_ns <= w1 for w0, w1 in windows)


def requests_in_windows(records: Sequence[RequestRecord], windows: Sequence[tuple[int, int]]) -> list[RequestRecord]:
    """The requests that ended inside the windows (no window: every request)."""
    if not windows:
        return list(records)
    return [r for r in records if ended_inside(r.ended_ns, windows)]


def summarize_serve(
    run: ServeRun, records: Sequence[RequestRecord], windows: Sequence[tuple[int, int]]
) -> ServeSummary:
    """Request counts, streamed tokens, TTFT and inter-token latency percentiles (client side, ms) over the measured
    ``windows``: the requests that ended inside them (what the load sweep counts per level, summed), the tokens streamed
    inside them (:func:`window_tokens`, as each level counts its own)."""
    every = [r for r in records if r.ok]
    records = requests_in_windows(records, windows)
    good = [r for r in records if r.ok]
    ttft = [r.ttft_ms for r in good if r.ttft_ms is not None]
    itl = [g for r in good for g in r.itl_ms]
    itl_p50 = _pct(itl, 50)
    seconds = sum(b - a for a, b in windows) / 1e9
    # tokens as each level counts them: every request's share inside each window (one that straddles an edge too)
    tokens = sum(window_tokens(every, w) for w in windows) if windows else float(sum(r.tokens for r in good))
    return ServeSummary(
        mode=run.mode,
        port=run.port,
        window_s=seconds,
        requests=len(records),
        failed_requests=len(records) - len(good),
        output_tokens=int(round(tokens)),
        ttft_ms_p50=_pct(ttft, 50),
        ttft_ms_p90=_pct(ttft, 90),
        itl_ms_p50=itl_p50,
        itl_ms_p90=_pct(itl, 90),
        tokens_per_s=(1e3 / itl_p50) if itl_p50 else None,
        time_to_ready_s=run.time_to_ready_s,
        commands=list(run.commands),
        output_tok_per_s=round(tokens / seconds, 2) if seconds > 0 else None,
        server_log=run.server_log,
        first_error=next((r.error for r in records if r.error), None),
        ttft_histogram=histogram(ttft),
        itl_histogram=histogram(itl),
        pid=run.pid,
        servers=list(run.servers),
        otlp=run.otlp,
    )


def server_batch_share(report: Report) -> float | None:
    """The share of the window the server spent executing batches, from its own metrics (batches x their mean
    execution time over the window, in %): 0 for a window in which it executed none and finished no request; None
    when its metrics were not read or do not say."""
    m = report.window_load.server if report.window_load is not None else None
    if m is None or m.unavailable or m.window_s <= 0:
        return None
    if any(m.batches.values()):
        busy_ms = sum(n * m.batch_execution_ms_mean.get(kind, 0.0) for kind, n in m.batches.items())
        return min(100.0, 100.0 * busy_ms / (m.window_s * 1e3))
    if (m.batches or m.requests == 0) and not m.requests and not m.requests_running:
        return 0.0
    return None


def load_share(report: Report) -> tuple[float | None, str]:
    """How loaded the window was, in % (None: not known), and what it measures: requests in flight (serve, attach),
    else the share of the window inside steps (run), else the server's batches over the window (its metrics)."""
    lg = report.ledger if isinstance(report.ledger, StepLedger) else None
    if lg is not None and lg.requests_in_flight_pct is not None:
        return lg.requests_in_flight_pct, "requests in flight"
    if report.window_load is not None and report.window_load.in_flight_pct is not None:
        return report.window_load.in_flight_pct, "requests in flight"
    if lg is not None:
        return (
            100.0 - lg.outside_steps_pct,
            "batches executing" if lg.source in (LedgerSource.SERVER_METRICS, LedgerSource.SPANS) else "steps running",
        )
    share = server_batch_share(report)
    if share is not None:
        return share, "batches executing (server metrics)"
    return None, ""
