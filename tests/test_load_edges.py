"""Load windows at their edges: requests that end exactly at a window's start or start exactly at its end, windows of
zero and one nanosecond, latency objectives met exactly, figures whose rounding shows (odd decimals, rates of a
hundred thousand per second), and the server's metrics when a histogram lost its sum."""

from __future__ import annotations

import msgspec
import numpy as np

from max_profile.analyze.load import in_flight, load_level, requests_in_window, server_metrics, summarize_serve
from max_profile.model import LoadWindow, MetricPoint, MetricsScrape, RequestRecord, ServerMetrics, ServeRun

S = 1_000_000_000
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
    assert requests_in_window([at_start], (w0, w1)) == [at_start]
    inside = req(w0 + 1, w1 - 1)
    assert requests_in_window([at_start, inside, at_end], (w0, w1)) == [at_start, inside, at_end]
    assert requests_in_window([req(0, w0 - 1), at_end], (w0, w1)) == [at_end]


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
    got = summarize_serve(run, records, (S, 4 * S + 7_000))
    assert got.window_s == (3 * S + 7_000) / 1e9
    assert got.ttft_ms_p50 == 30.0 and got.ttft_ms_p90 == float(np.percentile(ttft, 90))
    gaps = list(itl) * 5
    assert got.itl_ms_p90 == float(np.percentile(gaps, 90)) and got.itl_ms_p90 != float(np.percentile(gaps, 91))
    assert got.output_tok_per_s == round(50 / ((3 * S + 7_000) / 1e9), 2) == 16.67
    assert got.itl_histogram is not None and sum(got.itl_histogram.counts) == len(gaps)
    fast = summarize_serve(run, [req(0, 1_000, tokens=10)], (0, 1_000))  # 10 tokens in 1 µs: 1e7 tokens/s
    assert fast.output_tok_per_s == 10_000_000.0
    assert summarize_serve(run, records, (S, S)).output_tok_per_s is None  # a zero-length window: no rate
