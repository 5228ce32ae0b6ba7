"""Reports as fleet telemetry: Prometheus text (read back with prometheus_client's parser) and OpenTelemetry
metrics and spans (the SDK's in-memory reader / exporter, and OTLP over HTTP to a local receiver)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from max_profile.analyze.report import build_report
from max_profile.model import KernelBreakdown, RawCapture, Report, RequestRecord
from max_profile.render.telemetry import export_otel, prometheus_text, report_metrics

from ..conftest import DATA, run_cli

SMALL_RAW = DATA / "gpu" / "h200_llama180m_host_bound" / "small_cupti_raw.json.gz"


@pytest.fixture(scope="module")
def h200() -> tuple[RawCapture, Report]:
    raw = RawCapture.load(str(SMALL_RAW))
    # a capture made in-process knows its clock offset; this fixture predates the field: give it one
    raw.capture = msgspec.structs.replace(
        raw.capture, unix_minus_perf_counter_ns=int(raw.capture.started_unix_s * 1e9) - raw.steps[0].start_ns
    )
    return raw, build_report(raw)


def _decode_steps(report: Report) -> list[Any]:
    return [s for s in report.steps if s.phase == "decode" and s.batch_size]


def test_prometheus_text_parses_and_matches_the_report(h200: tuple[RawCapture, Report]) -> None:
    _, report = h200
    families = {f.name: f for f in text_string_to_metric_families(prometheus_text(report))}
    tpot = families["gen_ai_server_time_per_output_token_seconds"]
    count = next(s.value for s in tpot.samples if s.name.endswith("_count"))
    assert count == len(_decode_steps(report)) > 0
    total = next(s.value for s in tpot.samples if s.name.endswith("_sum"))
    assert total == pytest.approx(sum((s.end_ns - s.start_ns) / 1e9 for s in _decode_steps(report)))
    batch = families["maxserve_batch_execution_time_milliseconds"]  # MAX serve's own name for the same figure
    assert {s.labels["batch_type"] for s in batch.samples} == {"CE", "TG"}
    kernels = report.kernels
    assert isinstance(kernels, KernelBreakdown)
    busy = {s.labels["phase"]: s.value for s in families["maxserve_gpu_busy_percent"].samples}
    assert busy["all"] == pytest.approx(kernels.gpu_busy_pct)
    shares = [s for s in families["maxserve_kernel_family_share_percent"].samples if s.labels["phase"] == "decode"]
    assert sum(s.value for s in shares) == pytest.approx(100.0, abs=0.5)
    findings = {s.labels["finding_id"] for s in families["maxserve_profile_finding"].samples}
    assert findings == {f.id for f in report.findings}
    for family in families.values():
        assert all(s.labels.get("max_profile_source") == "max_profile" for s in family.samples)


def test_histogram_buckets_are_cumulative(h200: tuple[RawCapture, Report]) -> None:
    _, report = h200
    families = {f.name: f for f in text_string_to_metric_families(prometheus_text(report))}
    buckets = [
        s
        for s in families["maxserve_batch_execution_time_milliseconds"].samples
        if s.name.endswith("_bucket") and s.labels["phase"] == "decode"
    ]
    values = [s.value for s in buckets]
    assert values == sorted(values) and buckets[-1].labels["le"] == "+Inf" and values[-1] == len(_decode_steps(report))


def test_otel_metrics_and_spans_in_memory(h200: tuple[RawCapture, Report]) -> None:
    _, report = h200
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    export_otel(report, meter_provider=meters, tracer_provider=tracers, model="llama-3.1-8b")
    metrics = {
        m.name: m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    assert {
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "maxserve.batch_execution_time",
        "maxserve.gpu.busy",
        "maxserve.kernel.family_share",
        "maxserve.profile.finding",
    } <= set(metrics)
    tpot = metrics["gen_ai.server.time_per_output_token"]
    assert tpot.unit == "s"
    point = tpot.data.data_points[0]
    assert point.count == len(_decode_steps(report)) and point.attributes["gen_ai.request.model"] == "llama-3.1-8b"
    assert list(point.explicit_bounds)[:3] == [0.01, 0.025, 0.05]
    finished = spans.get_finished_spans()
    root = next(s for s in finished if s.name == "max_profile.capture")
    steps = [s for s in finished if s.name.startswith("max_profile.step")]
    work = [s for s in report.steps if s.batch_size]
    assert len(steps) == len(work)
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in steps)
    assert all(root.start_time <= s.start_time <= s.end_time <= root.end_time for s in steps)  # type: ignore[operator]
    assert {e.attributes["finding.id"] for e in root.events} == {f.id for f in report.findings}  # type: ignore[index]


def test_step_spans_are_capped(h200: tuple[RawCapture, Report]) -> None:
    _, report = h200
    spans = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    export_otel(report, meter_provider=MeterProvider(), tracer_provider=tracers, max_step_spans=5)
    finished = spans.get_finished_spans()
    root = next(s for s in finished if s.name == "max_profile.capture")
    assert (
        len(finished) == 6
        and root.attributes["max_profile.steps_without_span"] == len([s for s in report.steps if s.batch_size]) - 5
    )


def test_serve_requests_give_per_request_histograms(h200: tuple[RawCapture, Report]) -> None:
    _, report = h200
    requests = [
        RequestRecord(started_ns=0, ended_ns=int(110e6), ok=True, tokens=11, ttft_ms=10.0),
        RequestRecord(started_ns=0, ended_ns=int(60e6), ok=True, tokens=6, ttft_ms=20.0),
        RequestRecord(started_ns=0, ended_ns=int(5e6), ok=False, error="HTTP 500"),
    ]
    series = {s.name: s for s in report_metrics(report, requests=requests)}
    ttft_attrs, ttft = series["gen_ai.server.time_to_first_token"].points[0]
    assert ttft == [0.010, 0.020] and ttft_attrs["max_profile.measured"] == "request"
    _, tpot = series["gen_ai.server.time_per_output_token"].points[0]
    assert tpot == pytest.approx([0.010, 0.008])  # (110 - 10) ms / 10 tokens, (60 - 20) ms / 5 tokens


def test_cli_exports_over_otlp_http(otlp_receiver: tuple[str, dict[str, list[bytes]]], tmp_path: Path) -> None:
    endpoint, received = otlp_receiver
    prom = tmp_path / "m.prom"
    res = run_cli(
        "report",
        str(SMALL_RAW),
        "--otel",
        "--prometheus",
        str(prom),
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "llm-fleet-a"},
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    metrics = ExportMetricsServiceRequest.FromString(received["/v1/metrics"][0])
    resource = {kv.key: kv.value.string_value for kv in metrics.resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "llm-fleet-a"
    names = {m.name for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"gen_ai.server.time_per_output_token", "maxserve.gpu.busy", "maxserve.kernel.family_share"} <= names
    traces = ExportTraceServiceRequest.FromString(received["/v1/traces"][0])
    span_names = {s.name for rs in traces.resource_spans for ss in rs.scope_spans for s in ss.spans}
    assert "max_profile.capture" in span_names
    assert {f.name for f in text_string_to_metric_families(prom.read_text())} >= {"maxserve_gpu_busy_percent"}


def test_cli_otel_without_endpoint_fails_before_work(tmp_path: Path) -> None:
    res = run_cli(
        "report", str(SMALL_RAW), "--otel", "--json", str(tmp_path / "r.json"), env={"OTEL_EXPORTER_OTLP_ENDPOINT": ""}
    )
    assert res.returncode == 2
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in res.stderr and not (tmp_path / "r.json").exists()


def test_cli_otel_unreachable_endpoint_is_one_line_exit_4(tmp_path: Path) -> None:
    res = run_cli(
        "report",
        str(SMALL_RAW),
        "--otel",
        "--json",
        str(tmp_path / "r.json"),
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"},
        timeout=120,
    )
    assert res.returncode == 4
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("max-profile: error:")]
    assert (
        len(errors) == 1
        and "OpenTelemetry export to http://127.0.0.1:9 failed" in errors[0]
        and "Traceback" not in res.stderr
    )
    assert (tmp_path / "r.json").exists()  # the files were written first
