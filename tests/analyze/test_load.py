"""Load windows, the server's metrics and what tracing cost, figure by figure.

The server's figures are recomputed here from the raw Prometheus samples of a real ``max serve`` sweep on this CPU
(tests/data/cpu/serve_sweep_c1_c2_raw.json.gz) with plain Python: counter deltas per label set, histogram means as
sum delta / count delta, gauges at the second scrape. The client's figures come from hand-drawn requests whose
percentiles, shares and goodput are worked out in the test.

Load windows at their edges: requests that end exactly at a window's start or start exactly at its end, windows of
zero and one nanosecond, latency objectives met exactly, figures whose rounding shows (odd decimals, rates of a
hundred thousand per second), and the server's metrics when a histogram lost its sum.

The load verdict field by field: a lightly loaded window (its share, what measured it, the request rate from the
ledger before the window's own, the busiest GPU's mean utilization), and the time outside the steps when the ledger
has no window or no steps."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import msgspec
import numpy as np
import pytest

from max_profile.analyze.load import (
    MEASURED_TRACING_COST,
    histogram,
    in_flight,
    latency,
    load_level,
    rate_noise,
    requests_in_windows,
    server_metrics,
    summarize_serve,
    tracer_cost,
    tracing_cost_statement,
)
from max_profile.analyze.report import build_report
from max_profile.analyze.rules.levers import rule_outside_steps
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import (
    KernelBreakdown,
    LatencyStats,
    LoadLevel,
    LoadWindow,
    MetricPoint,
    MetricsScrape,
    RawCapture,
    Report,
    RequestRecord,
    ServerMetrics,
    ServeRun,
    Step,
    StepLedger,
    UtilizationSample,
    UtilizationSection,
)

from ..analyze.rules.test_state import _base, gpu

DATA = Path(__file__).parents[1] / "data"
SWEEP = DATA / "cpu" / "serve_sweep_c1_c2_raw.json.gz"
S = 1_000_000_000  # ns per second


def _points(scrape: MetricsScrape, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out: dict[tuple[tuple[str, str], ...], float] = defaultdict(float)
    for p in scrape.points:
        if p.name == name:
            out[tuple(sorted(p.labels.items()))] += p.value
    return out


def _delta_by(before: MetricsScrape, after: MetricsScrape, name: str, label: str | None) -> dict[str, float]:
    """Per value of ``label`` (all together for None): the after-minus-before growth of each series (name and label
    set), never negative, summed."""
    b, a = _points(before, name), _points(after, name)
    out: dict[str, float] = defaultdict(float)
    for key, value in a.items():
        out[dict(key).get(label, "") if label else ""] += max(value - b.get(key, 0.0), 0.0)
    return dict(out)


def test_the_server_metrics_of_a_real_sweep_from_the_raw_samples() -> None:
    raw = RawCapture.load(str(SWEEP))
    for w in raw.load_windows:
        before, after = w.metrics_before, w.metrics_after
        assert before is not None and after is not None
        secs = (w.window_ns[1] - w.window_ns[0]) / S
        got = server_metrics(before, after, secs)
        # the deltas cover the time between the two scrapes, which bracket the load window
        assert got is not None and got.unavailable is None and got.window_s == (after.t_ns - before.t_ns) / S
        assert got.window_s >= secs
        assert got.url == after.url
        assert got.requests == round(sum(_delta_by(before, after, "maxserve_request_count_total", None).values()), 3)
        assert got.output_tokens == round(
            sum(_delta_by(before, after, "maxserve_num_output_tokens_total", None).values()), 3
        )
        ex = "maxserve_batch_execution_time_milliseconds"
        counts = _delta_by(before, after, ex + "_count", "batch_type")
        sums = _delta_by(before, after, ex + "_sum", "batch_type")
        assert got.batches == {k or "all": round(v, 1) for k, v in counts.items()}
        assert got.batch_execution_ms_mean == {k or "all": round(sums[k] / v, 4) for k, v in counts.items() if v}
        assert set(got.batches) >= {"CE", "TG"}

        def mean(prefix: str, before: MetricsScrape = before, after: MetricsScrape = after) -> float:
            s = sum(_delta_by(before, after, prefix + "_sum", None).values())
            return s / sum(_delta_by(before, after, prefix + "_count", None).values())

        assert got.batch_size_mean == round(mean("maxserve_batch_size"), 3)
        assert got.ttft_ms_mean == round(mean("maxserve_time_to_first_token_milliseconds"), 4)
        assert got.itl_ms_mean == round(mean("maxserve_itl_milliseconds"), 4)
        assert got.kv_cache_used_pct == round(mean("maxserve_cache_used_kv_pct_percent"), 2)
        assert got.requests_queued == sum(_points(after, "maxserve_num_requests_queued").values())
        assert got.requests_running == sum(_points(after, "maxserve_num_requests_running").values())
        assert got.kv_blocks_used == sum(_points(after, "maxserve_cache_num_used_blocks").values())
        assert got.kv_blocks_total == sum(_points(after, "maxserve_cache_num_total_blocks").values())
        assert got.preemptions is None and got.missing == ["preemptions"]  # MAX 26.7 on this CPU exports none


def _scrape(t: int, *points: tuple[str, dict[str, str], float], problem: str | None = None) -> MetricsScrape:
    return MetricsScrape(
        t_ns=t,
        url="http://127.0.0.1:8001/metrics",
        points=[MetricPoint(n, lab, v) for n, lab, v in points],
        problem=problem,
    )


def test_server_metrics_edges() -> None:
    ok = _scrape(0, ("maxserve_num_requests_queued", {}, 1.0))
    assert server_metrics(None, None, 1.0) is None
    broken = server_metrics(_scrape(0, problem="connection refused"), ok, 2.0)
    assert broken is not None and broken.unavailable == "http://127.0.0.1:8001/metrics: connection refused"
    unread = server_metrics(ok, None, 2.0)
    assert unread is not None and unread.unavailable == "http://127.0.0.1:8001/metrics: not read"
    assert server_metrics(None, ok, 2.0).unavailable.endswith(": not read")  # type: ignore[union-attr]
    empty = server_metrics(ok, _scrape(1), 2.0)
    assert empty is not None and empty.unavailable.endswith("the endpoint answered with no metrics")  # type: ignore[union-attr]
    # a counter that went down (a restarted server) counts as 0, not as a negative delta; a label new in the second
    # scrape counts whole; histogram buckets and _created samples are no counter's value
    before = _scrape(
        0,
        ("maxserve_request_count_total", {"code": "200"}, 10.0),
        ("maxserve_request_count_total", {"code": "500"}, 7.0),
        ("maxserve_num_output_tokens_total", {}, 100.0),
        ("maxserve_num_output_tokens_created", {}, 5.0),
        ("maxserve_cache_num_used_blocks", {}, 3.0),
        ("maxserve_cache_num_total_blocks", {}, 40.0),
    )
    after = _scrape(
        1,
        ("maxserve_request_count_total", {"code": "200"}, 14.0),
        ("maxserve_request_count_total", {"code": "500"}, 2.0),
        ("maxserve_request_count_total", {"code": "404"}, 1.0),
        ("maxserve_num_output_tokens_total", {}, 160.5),
        ("maxserve_num_output_tokens_created", {}, 99.0),
        ("maxserve_num_output_tokens_bucket", {"le": "1"}, 1e6),
        ("maxserve_cache_num_used_blocks", {}, 10.0),
        ("maxserve_cache_num_total_blocks", {}, 40.0),
        ("maxserve_batch_execution_time_milliseconds_count", {"batch_type": "TG"}, 4.0),
        ("maxserve_batch_execution_time_milliseconds_sum", {"batch_type": "TG"}, 10.0),
        ("maxserve_batch_execution_time_milliseconds_count", {"batch_type": "CE"}, 0.0),
        ("maxserve_batch_execution_time_milliseconds_sum", {"batch_type": "CE"}, 0.0),
        ("maxserve_num_requests_queued", {"model": "a"}, 2.0),
        ("maxserve_num_requests_queued", {"model": "b"}, 3.0),
    )
    got = server_metrics(before, after, 4.0)
    assert got is not None
    assert got.requests == 4 + 0 + 1
    assert got.output_tokens == 60.5
    assert got.batches == {"TG": 4.0, "CE": 0.0}
    assert got.batch_execution_ms_mean == {"TG": 2.5}  # no CE batch ran: no mean
    assert got.requests_queued == 5.0  # a gauge summed over its label sets
    assert got.kv_cache_used_pct == 25.0  # no kv histogram or gauge: used / total blocks at the second scrape
    assert got.kv_blocks_used == 10.0 and got.kv_blocks_total == 40.0
    assert got.missing == ["batch_size", "itl", "preemptions", "running", "ttft"]
    gauge_pct = server_metrics(
        before,
        msgspec.structs.replace(
            after, points=[*after.points, MetricPoint("maxserve_cache_used_kv_pct_percent", {}, 61.234)]
        ),
        4.0,
    )
    assert gauge_pct is not None and gauge_pct.kv_cache_used_pct == 61.23  # the gauge, where MAX exports one
    no_total = msgspec.structs.replace(
        after, points=[p for p in after.points if p.name != "maxserve_cache_num_total_blocks"]
    )
    assert server_metrics(before, no_total, 4.0).kv_cache_used_pct is None  # type: ignore[union-attr]


def _req(
    start_s: float,
    end_s: float,
    ok: bool = True,
    tokens: int = 10,
    ttft: float | None = 50.0,
    itl: tuple[float, ...] = (10.0, 12.0, 30.0),
    truncated: bool = False,
    error: str | None = None,
) -> RequestRecord:
    return RequestRecord(
        started_ns=int(start_s * S),
        ended_ns=int(end_s * S),
        ok=ok,
        tokens=tokens,
        ttft_ms=ttft,
        itl_ms=list(itl),
        error=error,
        truncated=truncated,
    )


REQUESTS = [
    _req(-1.0, 1.0, tokens=20),  # straddles the start: half its time (and tokens) inside
    _req(1.0, 3.0, ttft=80.0),  # completed inside, misses a 60 ms TTFT objective
    _req(2.0, 4.0, itl=(10.0, 10.0, 10.0, 10.0, 100.0)),  # p90 gap 64 ms: misses a 50 ms ITL objective
    _req(3.0, 9.0, tokens=30),  # straddles the end: 3 of 6 s inside
    _req(4.0, 5.0, ok=False, tokens=0, ttft=None, itl=(), error="HTTP 500"),
    _req(5.0, 6.0, truncated=True),  # cut by the window's stop: not completed
    _req(4.5, 5.5, ttft=20.0, itl=(5.0,)),  # completed, meets both objectives
    _req(20.0, 21.0),  # after the window
]
WINDOW = LoadWindow(concurrency=4, window_ns=(0, 6 * S), requests=REQUESTS)


def test_a_load_level_from_hand_drawn_requests() -> None:
    samples = [
        UtilizationSample(t_ns=t * S, gpu="0", utilization_pct=u, memory_used_bytes=None, memory_total_bytes=None)
        for t, u in ((-1, 99.0), (0, 40.0), (3, 60.0), (6, 80.0), (7, 5.0))
    ]
    level = load_level(WINDOW, {"ttft": 60.0, "itl": 50.0}, samples)
    inside = REQUESTS[:7]
    assert level.concurrency == 4 and level.window_s == 6.0
    assert level.requests == 7 and level.failed == 1
    # ended inside and not cut: the -1-1 s, 1-3 s, 2-4 s and 4.5-5.5 s requests (the 5-6 s one is truncated)
    assert level.completed == 4
    tokens = 20 * 1 / 2 + 10 + 10 + 30 * 3 / 6 + 10 + 10  # straddling requests count their share by time
    assert level.output_tokens == round(tokens) and level.output_tok_per_s == round(tokens / 6, 2)
    assert level.request_rate_rps == round(4 / 6, 4)
    # the 1-3 s request misses the TTFT objective, the 2-4 s one the ITL one (p90 gap 64 ms); two of four meet both
    assert level.goodput_rps == round(2 / 6, 4) and level.slo_met_pct == 50.0
    ok = [r for r in inside if r.ok]
    assert level.ttft_ms.p50 == round(float(np.percentile([r.ttft_ms for r in ok], 50)), 4)
    assert level.ttft_ms.samples == len(ok)
    gaps = [g for r in ok for g in r.itl_ms]
    assert level.itl_ms.p90 == round(float(np.percentile(gaps, 90)), 4) and level.itl_ms.samples == len(gaps)
    assert level.gpu_utilization_pct == round((40 + 60 + 80) / 3, 1)  # samples at the edges count, outside do not
    assert level.server is None
    assert level.in_flight_pct == 100.0
    bare = load_level(WINDOW, {})
    assert bare.goodput_rps is None and bare.slo_met_pct is None and bare.gpu_utilization_pct is None
    only_ttft = load_level(WINDOW, {"ttft": 60.0})
    assert only_ttft.goodput_rps == round(3 / 6, 4) and only_ttft.slo_met_pct == 75.0
    none_done = load_level(LoadWindow(concurrency=1, window_ns=(0, S), requests=[_req(0.5, 3.0)]), {"ttft": 1.0})
    assert none_done.completed == 0 and none_done.slo_met_pct is None and none_done.goodput_rps == 0.0
    assert none_done.in_flight_pct == 50.0


def test_in_flight_share_and_rate() -> None:
    reqs = [_req(1.0, 2.0), _req(1.5, 3.0), _req(5.0, 12.0), _req(6.0, 7.0, ok=False), _req(-3.0, -1.0)]
    share, rate = in_flight(reqs, (0, 10 * S))
    assert share == round(100 * (2.0 + 5.0) / 10, 2)  # 1-3 s and 5-10 s
    assert rate == round(2 / 10, 4)  # ok and ended inside: 1-2 s and 1.5-3 s
    assert in_flight([], (0, 10 * S)) == (0.0, 0.0)
    assert in_flight([_req(0.0, 1.0)], (5, 5))[0] == 0.0  # an empty window: no division by zero


def _traced(concurrency: int, tok: int, reference: bool = False, traced: bool | None = True) -> LoadWindow:
    tg = (
        ("maxserve_batch_execution_time_milliseconds_sum", {"batch_type": "TG"}, 12.0 if reference else 15.0),
        ("maxserve_batch_execution_time_milliseconds_count", {"batch_type": "TG"}, 4.0),
    )
    return LoadWindow(
        concurrency=concurrency,
        window_ns=(0, 2 * S),
        requests=[_req(0.0, 2.0, tokens=tok, itl=(4.0, 5.0, 6.0) if reference else (5.0, 6.0, 7.0))],
        metrics_before=_scrape(0, ("maxserve_num_requests_queued", {}, 0.0)),
        metrics_after=_scrape(1, *tg),
        traced=traced,
        reference=reference,
    )


def test_the_recorder_cost_against_the_untraced_window() -> None:
    cost = tracer_cost([_traced(1, 100, reference=True, traced=False), _traced(4, 50), _traced(1, 90)])
    assert cost is not None
    assert cost.concurrency == 1
    assert (cost.reference_tok_s, cost.traced_tok_s) == (50.0, 45.0)
    assert cost.throughput_ratio == 0.9
    assert (cost.reference_decode_step_ms, cost.traced_decode_step_ms) == (3.0, 3.75)
    assert (cost.reference_itl_p50_ms, cost.traced_itl_p50_ms) == (5.0, 6.0)
    assert tracer_cost([_traced(1, 90)]) is None  # no reference window
    assert tracer_cost([_traced(1, 100, reference=True), _traced(4, 90)]) is None  # none at its concurrency
    assert tracer_cost([_traced(1, 100, reference=True), _traced(1, 90, traced=False)]) is None  # not recorded
    zero = tracer_cost([_traced(1, 0, reference=True), _traced(1, 90)])
    assert zero is not None and zero.throughput_ratio is None


def _stream(gaps_ms: list[float], concurrency: int = 1, reference: bool = False) -> LoadWindow:
    """A 10 s window of one request streaming a token after each gap (the first 1 ms in), traced unless reference."""
    return LoadWindow(
        concurrency=concurrency,
        window_ns=(0, 10 * S),
        requests=[
            RequestRecord(
                started_ns=0, ended_ns=10 * S, ok=True, tokens=len(gaps_ms) + 1, ttft_ms=1.0, itl_ms=list(gaps_ms)
            )
        ],
        traced=not reference,
        reference=reference,
    )


def test_a_windows_own_noise_from_its_tokens_part_by_part() -> None:
    """Tokens every 4 ms: the same count in each second, no noise. Seconds alternating 200 and 300 tokens: sd 52.7
    over 10 parts around 250, a relative standard error of 52.7 / sqrt(10) / 250 = 6.7 %. Too few tokens: unknown."""
    assert rate_noise(_stream([4.0] * 2499)) == 0.0
    uneven = ([5.0] * 200 + [1000 / 300] * 300) * 5
    noise = rate_noise(_stream(uneven[:-1]))
    counts = np.array([200, 300] * 5)
    assert noise == pytest.approx(np.std(counts, ddof=1) / np.sqrt(10) / 250, rel=0.02)
    assert rate_noise(_stream([500.0] * 19)) is None  # 20 tokens over 10 parts


def test_a_drop_within_the_windows_noise_is_no_measured_cost() -> None:
    """0.95 of the untraced rate on steady windows is a cost; the same 0.95 on windows that swing 200 / 300 tokens
    a second (each window's rate uncertain by 6.7 %) is within twice the ratio's noise of 1: said, not claimed."""
    steady = tracer_cost([_stream([4.0] * 2499, reference=True), _stream([4.0 / 0.95] * 2374)])
    assert steady is not None and steady.throughput_ratio == pytest.approx(0.95, abs=1e-3)
    assert steady.throughput_ratio_noise is not None and steady.throughput_ratio_noise < 0.001 and steady.resolved
    swing = ([5.0] * 200 + [1000 / 300] * 300) * 5
    noisy = tracer_cost([_stream(swing[:-1], reference=True), _stream([g / 0.95 for g in swing[:-1]][:2374])])
    assert noisy is not None and noisy.throughput_ratio == pytest.approx(0.95, abs=2e-3)
    assert noisy.throughput_ratio_noise is not None and 0.06 < noisy.throughput_ratio_noise < 0.1
    assert not noisy.resolved
    r = _report(B1)
    said = tracing_cost_statement(msgspec.structs.replace(r, tracer_cost=noisy)) or ""
    assert f" ± {noisy.throughput_ratio_noise:.4f} of the untraced one" in said and "no cost resolved" in said
    said = tracing_cost_statement(msgspec.structs.replace(r, tracer_cost=steady)) or ""
    assert f" ± {steady.throughput_ratio_noise:.4f} of the untraced one" in said and "resolved" not in said


@pytest.mark.parametrize(
    ("capture", "ratio", "noise"),
    [
        ("h200_llama5b_serve_recording_cost/serve_kernels_raw.json.gz", 0.9951, 0.0033),
        ("h200_llama3b_batch64_ledger/serve_kernels_3b_raw.json.gz", 0.9972, 0.0039),
    ],
)
def test_the_noise_of_real_served_windows(capture: str, ratio: float, noise: float) -> None:
    """The H200's served reference and recorded windows (10 s each): each window's rate uncertain by 0.15-0.33 %, so
    a ratio resolves about 0.7 %; both captures' 0.995-0.997 are within it: no cost resolved."""
    from max_profile.render.text import render_text

    raw = RawCapture.load(str(DATA / "gpu" / capture))
    cost = tracer_cost(raw.load_windows)
    assert cost is not None and (cost.throughput_ratio, cost.throughput_ratio_noise) == (ratio, noise)
    assert not cost.resolved
    report = build_report(raw)
    assert report.tracer_cost == cost and "tracer-overhead" not in {f.id for f in report.findings}
    text = " ".join(render_text(report, width=400).split())
    assert f"({ratio:.3f} ± {noise:.4f}); server decode step" in text
    assert "within twice the windows' own noise of 1: no cost resolved" in text


def test_latency_and_histograms() -> None:
    assert latency([]).samples == 0 and latency([]).p50 is None
    v = [1.0, 2.0, 3.0, 4.0, 100.0]
    got = latency(v)
    assert (got.p50, got.p90, got.p99, got.samples) == (3.0, round(4 + 0.6 * 96, 4), round(4 + 0.96 * 96, 4), 5)
    assert histogram([]) is None
    values = list(range(1, 201))  # 1..200: the tail above the 99.5th percentile lands in the last bin
    h = histogram([float(x) for x in values], bins=4)
    assert h is not None
    hi = float(np.percentile(values, 99.5))
    step = (hi - 1) / 4
    assert h.edges == [round(1 + i * step, 4) for i in range(5)]
    assert sum(h.counts) == 200 and h.counts[-1] == sum(1 for x in values if x >= 1 + 3 * step)
    flat = histogram([5.0, 5.0, 5.0], bins=2)
    assert flat is not None and flat.edges == [5.0, 5.0005, 5.001] and flat.counts == [3, 0]
    assert len(histogram([1.0, 2.0]).counts) == 40  # type: ignore[union-attr]


def test_the_client_summary_of_a_serve_window() -> None:
    run = ServeRun(mode="kernels", port=8000, time_to_ready_s=12.5, commands=[["max", "serve"]], server_log="log")
    got = summarize_serve(run, REQUESTS, [(0, 6 * S)])
    # a request belongs to the window it ended in: the one straddling the start, the four ending inside and the one
    # the stop cut at 6 s; not the one that ended at 9 s (its tokens inside still count) or the one after
    ended = [r for r in REQUESTS if 0 <= r.ended_ns <= 6 * S]
    assert len(ended) == 6
    ok = [r for r in ended if r.ok]
    gaps = [g for r in ok for g in r.itl_ms]
    # tokens as the level counts them: each successful request's share of its span inside the window
    tokens = 20 * 1 / 2 + 10 + 10 + 30 * 3 / 6 + 10 + 10
    assert (got.mode, got.port, got.window_s, got.time_to_ready_s) == ("kernels", 8000, 6.0, 12.5)
    assert got.requests == 6 and got.failed_requests == 1
    assert got.output_tokens == round(tokens) == load_level(WINDOW, {}).output_tokens
    assert got.output_tok_per_s == round(tokens / 6, 2) == load_level(WINDOW, {}).output_tok_per_s
    assert got.ttft_ms_p50 == float(np.percentile([r.ttft_ms for r in ok], 50))
    assert got.ttft_ms_p90 == float(np.percentile([r.ttft_ms for r in ok], 90))
    assert got.itl_ms_p50 == float(np.percentile(gaps, 50)) and got.itl_ms_p90 == float(np.percentile(gaps, 90))
    assert got.tokens_per_s == 1e3 / float(np.percentile(gaps, 50))
    assert got.first_error == "HTTP 500" and got.commands == [["max", "serve"]] and got.server_log == "log"
    assert got.ttft_histogram is not None and sum(got.ttft_histogram.counts) == len(ok)
    # no window: every request, no rate
    assert requests_in_windows(REQUESTS, []) == REQUESTS
    assert requests_in_windows(REQUESTS, [(100 * S, 101 * S)]) == []
    assert requests_in_windows(REQUESTS, [(20 * S, 21 * S)]) == [REQUESTS[-1]]
    whole = summarize_serve(run, REQUESTS, [])
    assert whole.window_s == 0.0 and whole.output_tok_per_s is None and whole.requests == len(REQUESTS)
    failed = summarize_serve(run, [_req(0.0, 1.0, ok=False, itl=(), ttft=None)], [(0, S)])
    assert failed.itl_ms_p50 is None and failed.tokens_per_s is None and failed.ttft_histogram is None


def test_a_sweeps_summary_is_its_levels_added_up_and_the_pause_is_nobodys() -> None:
    """Two levels with a pause between them: the summary counts each level's requests once (the ones that ended inside
    it), never those that ended in the pause, and its tokens/s is over the levels' own seconds."""
    run = ServeRun(mode="attach", port=1)
    first, second = (0, 4 * S), (10 * S, 14 * S)
    records = [
        _req(0.5, 1.5),
        _req(1.5, 3.5),
        _req(3.5, 5.0, tokens=15),  # straddles the first level's end, ends in the pause: nobody's request
        _req(9.0, 10.5),  # began in the pause, ends in the second level
        _req(11.0, 12.0),
        _req(12.0, 13.0, ok=False, tokens=0, ttft=None, itl=()),
    ]
    levels = [
        load_level(LoadWindow(concurrency=c, window_ns=w, requests=records), {}) for c, w in ((1, first), (4, second))
    ]
    got = summarize_serve(run, records, [first, second])
    in_a_level = [r for r in records if first[0] <= r.ended_ns <= first[1] or second[0] <= r.ended_ns <= second[1]]
    assert got.requests == len(in_a_level) == 5 and got.failed_requests == 1
    assert got.requests - got.failed_requests == sum(lv.completed for lv in levels)
    assert got.window_s == 8.0  # the levels' seconds, not the 14 s from the first's start to the last's end
    tokens = 10 + 10 + 15 * 0.5 / 1.5 + 10 * 0.5 / 1.5 + 10
    assert got.output_tokens == round(tokens) and got.output_tok_per_s == round(tokens / 8, 2)


# --- what tracing cost --------------------------------------------------------------------------------------------

B1 = DATA / "gpu" / "h200_llama5b_every_verb" / "run_b1_raw.json.gz"


def _report(path: Path) -> Report:
    return build_report(RawCapture.load(str(path)))


def _with_capture(r: Report, **fields: object) -> Report:
    return msgspec.structs.replace(r, capture=msgspec.structs.replace(r.capture, **fields))


def test_tracing_cost_measured_on_the_server_first() -> None:
    r = _report(B1)
    cost = tracer_cost([_traced(1, 100, reference=True, traced=False), _traced(1, 90)])
    said = tracing_cost_statement(msgspec.structs.replace(r, tracer_cost=cost))
    assert said == (
        "tracing cost, measured on this server: the recorded window ran at 0.900 of the untraced one "
        "(45.0 vs 50.0 tok/s, concurrency 1)"
    )
    ratio_unknown = msgspec.structs.replace(cost, throughput_ratio=None)
    assert "measured" not in (tracing_cost_statement(msgspec.structs.replace(r, tracer_cost=ratio_unknown)) or "")[:30]


@pytest.mark.parametrize(
    ("collectors", "said"),
    [
        (["startup"], None),
        ([], None),
        (
            ["attach"],
            "tracing cost: none inside the server (its /metrics and the GPU's counters are read from outside)",
        ),
        (["startup", "serve:utilization"], "tracing cost: none inside the server"),
        (["serve:kernels"], "tracing cost: not measured (serve:kernels ran without an untraced reference window)"),
        (["nsys"], "tracing cost: set by the tool that recorded this trace (nsys); not measured here"),
    ],
)
def test_tracing_cost_of_captures_without_the_pipeline_hook(collectors: list[str], said: str | None) -> None:
    got = tracing_cost_statement(_with_capture(_report(B1), collectors=collectors))
    assert got == said if said is None else got is not None and got.startswith(said)


def _steps_of(ms: float, n: int = 9) -> list[Step]:
    return [
        Step(
            index=i,
            phase="decode",
            start_ns=i * 10**7,
            end_ns=i * 10**7 + round(ms * 1e6),
            batch_size=1,
            input_tokens=1,
            context_tokens=10 + i,
        )
        for i in range(n)
    ]


def test_tracing_cost_expected_for_in_process_recording() -> None:
    r = _report(B1)
    k = r.kernels
    assert isinstance(k, KernelBreakdown) and "pipeline-hook" in r.capture.collectors
    cupti = msgspec.structs.replace(k, source="cupti (activity API)", recorded_ms=None)
    for graphs, ref in ((True, 2.05), (None, 2.05), (False, 3.4)):
        base = _with_capture(
            msgspec.structs.replace(r, kernels=cupti, steps=_steps_of(ref / 2)), device_graph_capture=graphs
        )
        low, high, gpu, step = MEASURED_TRACING_COST[("cupti, every step", graphs is not False)]
        assert (gpu, step) == ("H200", ref)
        said = tracing_cost_statement(base)
        assert said == (
            f"tracing cost, expected (not measured in this capture): cupti, every step, device graphs "
            f"{'off' if graphs is False else 'on'}: {100 * low:.1f}-{100 * high:.1f} % slower than untraced on an H200 "
            f"at a {ref:g} ms decode step (benchmarks/untraced_overhead.py measures it on this model)"
        )  # a step shorter than the reference's: the reference's share, unscaled
    # a quarter of the window recorded, a 8.2 ms step: the share scaled by 2.05 / 8.2
    sampled = msgspec.structs.replace(cupti, recorded_ms=250.0, window_ms=1000.0)
    long_steps = msgspec.structs.replace(r, kernels=sampled, steps=_steps_of(8.2))
    low, high, _, _ = MEASURED_TRACING_COST[("cupti, a quarter of the steps", True)]
    said = tracing_cost_statement(_with_capture(long_steps, device_graph_capture=True))
    scale = 2.05 / 8.2
    assert said is not None
    assert "cupti, a quarter of the steps (25 % of the window recorded), device graphs on" in said
    assert f"; this 8.20 ms decode step: about {100 * low * scale:.1f}-{100 * high * scale:.1f} %" in said
    half = msgspec.structs.replace(cupti, recorded_ms=500.0, window_ms=1000.0)
    said = tracing_cost_statement(msgspec.structs.replace(r, kernels=half))
    assert said is not None and "cupti, every step (50 % of the window recorded)" in said  # half is not "a quarter"
    # an eighth is a quarter's row; under it a sixteenth's, measured on H100s: its own card
    # and step in the statement, scaled only for a longer step than its own
    eighth = msgspec.structs.replace(cupti, recorded_ms=125.0, window_ms=1000.0)
    said = tracing_cost_statement(msgspec.structs.replace(r, kernels=eighth))
    assert said is not None and "cupti, a quarter of the steps (12 % of the window recorded)" in said
    sixteenth = msgspec.structs.replace(cupti, recorded_ms=62.5, window_ms=1000.0)
    for graphs, step, measured, at_twice in (
        (True, 2.47, "0.0-1.2 %", "0.0-0.6 %"),
        (False, 2.8, "0.0-6.9 %", "0.0-3.5 %"),
    ):
        on_off = "on" if graphs else "off"
        for ms in (step, 2 * step):
            steps = _steps_of(ms)
            said = tracing_cost_statement(
                _with_capture(msgspec.structs.replace(r, kernels=sixteenth, steps=steps), device_graph_capture=graphs)
            )
            assert said is not None
            assert (
                f"cupti, a sixteenth of the steps (6 % of the window recorded), device graphs {on_off}: {measured} "
                f"slower than untraced on an H100 at a {step:g} ms decode step"
            ) in said
            if ms == step:  # its own step: nothing scaled
                assert "decode step:" not in said
            else:  # twice as long: half the share
                assert f"; this {ms:.2f} ms decode step: about {at_twice}" in said
    whole = msgspec.structs.replace(cupti, recorded_ms=1000.0, window_ms=1000.0)
    assert "recorded)" not in (tracing_cost_statement(msgspec.structs.replace(r, kernels=whole)) or "x")
    hook = tracing_cost_statement(msgspec.structs.replace(r, kernels=None, steps=_steps_of(1.0)))
    assert hook is not None and "step hook and GPU sampler, device graphs on: 0.0-4.0 %" in hook
    nvtx = msgspec.structs.replace(k, source="nvtx-log (MAX op ranges, host time)")
    assert (tracing_cost_statement(msgspec.structs.replace(r, kernels=nvtx)) or "").startswith(
        "tracing cost, not measured: MAX's profiling mode (MODULAR_ENABLE_PROFILING=on) compiles the model again"
    )
    no_steps = tracing_cost_statement(msgspec.structs.replace(r, kernels=cupti, steps=[]))
    assert no_steps is not None and "decode step:" not in no_steps


def test_the_recorders_cost_with_its_decimals_and_the_decode_step_it_is_scaled_by() -> None:
    cost = tracer_cost([_traced(1, 90, reference=True, traced=False), _traced(1, 30)])
    assert cost is not None and cost.throughput_ratio == 0.3333  # 15 / 45 tok/s, four decimals
    r = _report(B1)
    k = r.kernels
    assert isinstance(k, KernelBreakdown)
    cupti = msgspec.structs.replace(k, source="cupti (activity API)", recorded_ms=None)
    base_steps = _steps_of(8.2)
    low, high, _, _ = MEASURED_TRACING_COST[("cupti, every step", True)]

    def said(extra: list[Step]) -> str:
        return tracing_cost_statement(msgspec.structs.replace(r, kernels=cupti, steps=[*base_steps, *extra])) or ""

    expected = f"this 8.20 ms decode step: about {100 * low * 2.05 / 8.2:.1f}-{100 * high * 2.05 / 8.2:.1f} %"
    assert expected in said([])
    noise = [
        msgspec.structs.replace(s, phase="prefill", end_ns=s.start_ns + 90_000_000) for s in _steps_of(1.0, n=20)
    ]  # long prefill steps
    idle = [msgspec.structs.replace(s, batch_size=0, end_ns=s.start_ns + 90_000_000) for s in _steps_of(1.0, n=20)]
    empty = [msgspec.structs.replace(s, end_ns=s.start_ns) for s in _steps_of(1.0, n=20)]  # 0 ns
    tick = [msgspec.structs.replace(s, end_ns=s.start_ns + 1) for s in _steps_of(1.0, n=4)]  # 1 ns
    for extra in (noise, idle, empty):
        assert expected in said(extra)  # only working decode steps of some length set the step
    with_ticks = said(tick)  # 1 ns steps are steps: 9 of 8.2 ms and 4 of 1 ns, median 8.2 ms still
    assert expected in with_ticks
    more_ticks = [msgspec.structs.replace(s, end_ns=s.start_ns + 1) for s in _steps_of(1.0, n=10)]
    assert "this 0.00 ms decode step" not in said(more_ticks) and "decode step: about" not in said(more_ticks)


def test_tracing_cost_of_a_capture_without_a_kernel_table_or_decode_ops() -> None:
    from max_profile.model import Unavailable

    r = _report(B1)
    said = tracing_cost_statement(msgspec.structs.replace(r, kernels=Unavailable("no CUPTI")))
    assert said is not None and "step hook and GPU sampler" in said
    ops = build_report(RawCapture.load(str(DATA / "gpu" / "h200_llama_custom_ops_vs_default" / "ops_a_raw.json.gz")))
    from max_profile.model import OpBreakdown

    assert isinstance(ops.ops, OpBreakdown)
    prefill_only = msgspec.structs.replace(ops.ops, coverage=[c for c in ops.ops.coverage if c.phase != "decode"])
    note = tracing_cost_statement(msgspec.structs.replace(ops, ops=prefill_only))
    assert note is not None and note.startswith("tracing cost, expected") and "op calls per decode step" not in note


URL = "http://127.0.0.1:9/metrics"


def req(
    start: int,
    end: int,
    ok: bool = True,
    tokens: int = 10,
    ttft: float | None = 50.0,
    itl: tuple[float, ...] = (10.0,),
    truncated: bool = False,
) -> RequestRecord:
    return RequestRecord(
        started_ns=start, ended_ns=end, ok=ok, tokens=tokens, ttft_ms=ttft, itl_ms=list(itl), truncated=truncated
    )


def scrape(*points: tuple[str, dict[str, str], float], problem: str | None = None) -> MetricsScrape:
    return MetricsScrape(t_ns=0, url=URL, points=[MetricPoint(n, lab, v) for n, lab, v in points], problem=problem)


def test_unavailable_metrics_keep_their_url_and_window() -> None:
    ok = scrape(("maxserve_num_requests_queued", {}, 1.0))
    assert server_metrics(scrape(problem="refused"), ok, 2.5) == ServerMetrics(
        url=URL, window_s=2.5, unavailable=f"{URL}: refused"
    )
    assert server_metrics(ok, scrape(), 2.5) == ServerMetrics(
        url=URL, window_s=2.5, unavailable=f"{URL}: the endpoint answered with no metrics"
    )


def test_rounding_shows_on_odd_figures() -> None:
    before = scrape(
        ("maxserve_num_output_tokens_total", {}, 100.0),
        ("maxserve_batch_execution_time_milliseconds_count", {"batch_type": "TG"}, 1.0),
        ("maxserve_batch_size_count", {}, 1.0),
        ("maxserve_batch_size_sum", {}, 1.0),
    )
    after = scrape(
        ("maxserve_num_output_tokens_total", {}, 160.123456),
        ("maxserve_batch_execution_time_milliseconds_count", {"batch_type": "TG"}, 5.26),
        ("maxserve_batch_execution_time_milliseconds_sum", {"batch_type": "TG"}, 10.0),
        ("maxserve_batch_size_count", {}, 4.0),
        ("maxserve_batch_size_sum", {}, 7.370370),
    )
    got = server_metrics(before, after, 1.0)
    assert got is not None
    assert got.output_tokens == 60.123  # 3 decimals
    assert got.batches == {"TG": 4.3}  # 1 decimal of 4.26
    assert got.batch_execution_ms_mean == {"TG": round(10.0 / 4.26, 4)}
    assert got.batch_size_mean == round((7.370370 - 1.0) / 3.0, 3) == 2.123


def test_a_histogram_without_its_sum_has_no_mean() -> None:
    after = scrape(("maxserve_itl_milliseconds_count", {}, 5.0), ("maxserve_num_requests_queued", {}, 0.0))
    got = server_metrics(scrape(("maxserve_num_requests_queued", {}, 0.0)), after, 1.0)
    assert got is not None and got.itl_ms_mean is None and "itl" in got.missing


def test_requests_at_the_window_edges() -> None:
    w0, w1 = 10 * S, 20 * S
    at_start = req(9 * S, w0)  # ends exactly when the window opens
    at_end = req(w1, 21 * S)  # starts exactly when it closes
    window = LoadWindow(concurrency=1, window_ns=(w0, w1), requests=[at_start, at_end])
    level = load_level(window, {})
    assert level.requests == 2  # both touch the window
    assert level.completed == 1  # the one that ended at its opening (the other ended after it)
    share, rate = in_flight([at_start, at_end, req(w0 + S, w1)], (w0, w1))
    assert share == 90.0 and rate == round(2 / 10, 4)  # ended at w0 and at w1 both count as done inside
    assert requests_in_windows([at_start], [(w0, w1)]) == [at_start]  # ended at the opening: in
    inside = req(w0 + 1, w1 - 1)
    assert requests_in_windows([at_start, inside, at_end], [(w0, w1)]) == [at_start, inside]
    assert requests_in_windows([req(0, w0 - 1), req(w0 - 5, w1)], [(w0, w1)]) == [req(w0 - 5, w1)]


def test_windows_of_zero_and_one_nanosecond() -> None:
    empty = load_level(LoadWindow(concurrency=1, window_ns=(S, S), requests=[req(0, S)]), {})
    assert empty.window_s == 0.0  # 1 ns floor, shown as 0.000 s
    assert empty.request_rate_rps == 1e9  # one request ended inside a window of (at least) 1 ns
    tick = in_flight([req(0, 2 * S)], (S, S + 1))
    assert tick == (100.0, 0.0)
    # a 1 ns request inside a window counts its tokens whole; one that ends as the window opens counts none
    level = load_level(
        LoadWindow(concurrency=1, window_ns=(S, 2 * S), requests=[req(S + 5, S + 6), req(S - 1, S, tokens=1000)]), {}
    )
    assert level.output_tokens == 10
    none = load_level(LoadWindow(concurrency=1, window_ns=(0, S), requests=[]), {})
    assert none.in_flight_pct is None and none.requests == 0


def test_rates_and_shares_with_their_decimals() -> None:
    w0 = 1_000_000
    ms = 1_000_000  # a window of 1 ms with 100 completed requests: 100,000 per second
    many = [req(w0, w0 + 10) for _ in range(100)]
    level = load_level(LoadWindow(concurrency=64, window_ns=(w0, w0 + ms), requests=many), {})
    assert level.request_rate_rps == 100_000.0 and level.window_s == 0.001
    assert in_flight(many, (w0, w0 + ms))[1] == 100_000.0
    thirds = [req(0, S), req(0, 2 * S), req(0, 2 * S, ttft=99.0)]
    odd = LoadWindow(concurrency=1, window_ns=(0, 3 * S + 370_000), requests=thirds)
    got = load_level(odd, {"ttft": 60.0})
    assert got.window_s == 3.0  # 3.00037 s at 3 decimals
    assert got.slo_met_pct == 66.7  # 2 of 3, one decimal
    assert got.goodput_rps == round(2 / 3.00037, 4)
    assert in_flight(thirds, (0, 3 * S))[1] == 1.0 and in_flight(thirds[:2], (0, 3 * S))[1] == 0.6667
    from max_profile.model import UtilizationSample

    samples = [
        UtilizationSample(t_ns=t, gpu="0", utilization_pct=u, memory_used_bytes=None, memory_total_bytes=None)
        for t, u in ((0, 40.123), (S, 60.456), (2 * S, 80.789))
    ]
    assert load_level(odd, {}, samples).gpu_utilization_pct == round((40.123 + 60.456 + 80.789) / 3, 1) == 60.5
    metrics = msgspec.structs.replace(
        odd,
        metrics_before=scrape(("maxserve_num_requests_queued", {}, 0.0)),
        metrics_after=scrape(("maxserve_num_requests_queued", {}, 2.0)),
    )
    server = load_level(metrics, {}).server
    assert server is not None and server.window_s == 3.00037


def test_objectives_met_exactly_count_as_met() -> None:
    exactly = req(0, S, ttft=60.0, itl=tuple(float(i) for i in range(11)))  # gaps 0..10 ms: p90 exactly 9 ms
    w = LoadWindow(concurrency=1, window_ns=(0, S), requests=[exactly])
    assert load_level(w, {"ttft": 60.0, "itl": 9.0}).slo_met_pct == 100.0
    assert load_level(w, {"ttft": 59.99}).slo_met_pct == 0.0
    assert load_level(w, {"itl": 8.99}).slo_met_pct == 0.0
    assert load_level(w, {"itl": 9.05}).slo_met_pct == 100.0  # the 90th percentile, not the 91st (9.1 ms)


def test_the_client_summary_of_a_window_that_does_not_start_at_zero() -> None:
    run = ServeRun(mode="utilization", port=1)
    ttft = [10.0, 20.0, 30.0, 40.0, 1000.0]
    itl = tuple(float(x) for x in range(1, 21))
    records = [req(S + i, 2 * S, ttft=t, itl=itl) for i, t in enumerate(ttft)]
    got = summarize_serve(run, records, [(S, 4 * S + 7_000)])
    assert got.window_s == (3 * S + 7_000) / 1e9
    assert got.ttft_ms_p50 == 30.0 and got.ttft_ms_p90 == float(np.percentile(ttft, 90))
    gaps = list(itl) * 5
    assert got.itl_ms_p90 == float(np.percentile(gaps, 90)) and got.itl_ms_p90 != float(np.percentile(gaps, 91))
    assert got.output_tok_per_s == round(50 / ((3 * S + 7_000) / 1e9), 2) == 16.67
    assert got.itl_histogram is not None and sum(got.itl_histogram.counts) == len(gaps)
    fast = summarize_serve(run, [req(0, 1_000, tokens=10)], [(0, 1_000)])  # 10 tokens in 1 µs: 1e7 tokens/s
    assert fast.output_tok_per_s == 10_000_000.0
    assert summarize_serve(run, records, [(S, S)]).output_tok_per_s is None  # a zero-length window: no rate


TH = Thresholds()


def light(
    outside_pct: float = 83.25, rate: float | None = 1.23456, means: tuple[float | None, ...] = (None, 33.333)
) -> Report:
    base = _base()
    lg = base.ledger
    assert isinstance(lg, StepLedger)
    ledger = msgspec.structs.replace(
        lg, outside_steps_pct=outside_pct, requests_in_flight_pct=None, request_rate_rps=rate
    )
    u = UtilizationSection(
        source="test",
        interval_s=0.1,
        gpus=[gpu(f"nv{i}", mean_utilization_pct=m) for i, m in enumerate(means)],
        samples=[],
    )
    return msgspec.structs.replace(base, ledger=ledger, utilization=u)


def level(rate: float) -> LoadLevel:
    stats = LatencyStats(p50=20.0, p90=25.0, p99=30.0, samples=10)
    return LoadLevel(
        concurrency=1,
        window_s=10.0,
        requests=10,
        completed=10,
        failed=0,
        output_tokens=640,
        output_tok_per_s=64.0,
        request_rate_rps=rate,
        ttft_ms=stats,
        itl_ms=stats,
    )


def test_lightly_loaded_every_field() -> None:
    (f,) = rule_outside_steps(light(), TH)
    assert (f.id, f.severity, f.confidence) == ("lightly-loaded", "info", 0.8)
    assert f.evidence == {
        "loaded_pct": 16.8,
        "measured_as": "steps running",
        "threshold_pct": TH.light_load_pct,
        "requests_per_s": 1.23456,
        "outside_steps_pct": 83.25,
        "mean_gpu_utilization_pct": 33.3,
    }
    assert f.title.startswith("Lightly loaded: steps running only 17 % of the window, 1.23 requests/s: ")
    assert f.command is None  # not an attach capture


def test_lightly_loaded_takes_the_window_s_rate_when_the_ledger_has_none() -> None:
    report = msgspec.structs.replace(light(rate=None), window_load=level(0.75))
    (f,) = rule_outside_steps(report, TH)
    assert f.evidence["requests_per_s"] == 0.75 and f.evidence["output_tok_per_s"] == 64.0
    both = msgspec.structs.replace(light(rate=2.5), window_load=level(0.75))
    assert rule_outside_steps(both, TH)[0].evidence["requests_per_s"] == 2.5
    (g,) = rule_outside_steps(light(rate=None), TH)
    assert "requests_per_s" not in g.evidence
    assert g.title.startswith("Lightly loaded: steps running only 17 % of the window: GPU utilization")
    (h,) = rule_outside_steps(light(means=(None,)), TH)
    assert h.evidence["mean_gpu_utilization_pct"] == 0.0


def test_outside_steps_needs_steps_and_a_window() -> None:
    base = light(outside_pct=40.0)  # 60 % loaded: not light
    lg = base.ledger
    assert isinstance(lg, StepLedger)
    no_window = msgspec.structs.replace(base, ledger=msgspec.structs.replace(lg, window_ms=0.0))
    assert rule_outside_steps(no_window, TH) == []
    found = rule_outside_steps(base, TH)
    assert found and found[0].id == "time-outside-steps"


def test_a_cpu_report_quotes_no_gpus_tracing_cost() -> None:
    """A capture of a CPU (no GPU, no kernel tracer) says its tracing cost was not measured here and how to measure it;
    it never quotes a figure measured on a GPU."""
    raw = RawCapture.load(str(DATA / "cpu" / "demo_ops_quiet_raw.json.gz"))
    plain = msgspec.structs.replace(raw, kernels=type(raw.kernels).empty(), kernel_source=None)
    said = [n for n in build_report(plain).notes if n.startswith("tracing cost")]
    assert said and "not measured on this CPU" in said[0] and "--devices cpu" in said[0]
    assert not any(card in said[0] for card in ("H100", "H200", "GPU sampler"))
