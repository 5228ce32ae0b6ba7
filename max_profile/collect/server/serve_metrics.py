"""``max serve``'s own Prometheus metrics, scraped before and after a window (read-only: one GET each).

MAX 26.7 exports its OpenTelemetry metrics on their own port (``MAX_SERVE_METRICS_ENDPOINT_PORT``, default 8001;
absent when ``MAX_SERVE_DISABLE_TELEMETRY=1`` or ``MAX_SERVE_METRIC_RECORDING_METHOD`` is not ``PROCESS``), as
Prometheus names: ``maxserve.batch_execution_time`` (ms, labelled ``batch_type`` CE / TG) becomes
``maxserve_batch_execution_time_milliseconds_bucket|_sum|_count``. The text is parsed with prometheus_client's own
parser. Equivalent: ``curl -s http://HOST:8001/metrics``.
"""

from __future__ import annotations

import http.client
import time

from max_profile.collect.server.serve_client import split_url
from max_profile.model import MetricPoint, MetricsScrape

MAX_METRICS_BYTES = 32 << 20
"""A /metrics answer longer than this is cut (a real one is tens of kilobytes)."""


def parse_metrics(text: str) -> list[MetricPoint]:
    """Every sample of a Prometheus text exposition (histogram buckets, sums and counts as their own samples)."""
    from prometheus_client.parser import text_string_to_metric_families

    points: list[MetricPoint] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = float(sample.value)
            if value != value:  # NaN
                continue
            points.append(MetricPoint(name=sample.name, labels=dict(sample.labels), value=value))
    return points


def scrape(url: str, timeout_s: float = 5.0) -> MetricsScrape:
    """GET ``url`` (a /metrics endpoint); a scrape that fails says why in ``problem`` (never raises for the server's
    fault)."""
    t = time.perf_counter_ns()
    try:
        host, port, path = split_url(url)
    except ValueError as exc:
        return MetricsScrape(t_ns=t, url=url, problem=str(exc))
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        conn.request("GET", path or "/metrics")
        resp = conn.getresponse()
        body = resp.read(MAX_METRICS_BYTES)
        conn.close()
    except (OSError, http.client.HTTPException) as exc:
        return MetricsScrape(t_ns=t, url=url, problem=f"{type(exc).__name__}: {exc}")
    if resp.status != 200:
        return MetricsScrape(t_ns=t, url=url, problem=f"HTTP {resp.status}")
    try:
        points = parse_metrics(body.decode("utf-8", errors="replace"))
    except (ValueError, TypeError, IndexError) as exc:
        return MetricsScrape(t_ns=t, url=url, problem=f"not Prometheus text ({type(exc).__name__}: {exc})")
    return MetricsScrape(t_ns=t, url=url, points=points)
