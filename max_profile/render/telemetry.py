"""A report as fleet telemetry: OpenTelemetry metrics and spans, and Prometheus exposition text.

:func:`report_metrics` (pure) lists the series; :func:`prometheus_text` writes them with
``prometheus_client`` (for a node_exporter textfile collector or a Pushgateway); :func:`export_otel`
records them with the OpenTelemetry SDK (MAX serve ships both), plus one span per capture with a
child span per step and an event per finding. :func:`otlp_providers_from_env` builds OTLP exporters
from the standard ``OTEL_*`` variables.

Names: the OpenTelemetry GenAI conventions where they exist (``gen_ai.server.time_to_first_token``,
``gen_ai.server.time_per_output_token``, seconds), MAX serve's own where it already measures the
same thing (``maxserve.batch_execution_time`` in ms with ``batch_type`` CE / TG), and the
``maxserve.`` prefix for what only a profiler sees (GPU busy %, kernel-family shares, findings).
Every series carries ``max_profile.source`` (``max_profile``) so it never mixes with the server's own.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from max_profile.errors import CaptureError, InputError
from max_profile.model import KernelBreakdown, Report, RequestRecord, StepSummary, UtilizationSection

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""Bucket boundaries the OTel GenAI conventions give for ``gen_ai.server.time_to_first_token``."""
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
"""... and for ``gen_ai.server.time_per_output_token``."""
LATENCY_BUCKETS_MS = (
    0.0,
    1.0,
    1.49,
    2.22,
    3.31,
    4.94,
    7.37,
    11.0,
    16.4,
    24.4,
    36.4,
    54.3,
    80.9,
    121.0,
    180.0,
    268.0,
    400.0,
    596.0,
    889.0,
    1330.0,
    1980.0,
    2950.0,
    4400.0,
    6550.0,
    9770.0,
    14600.0,
    21700.0,
    32400.0,
    48300.0,
    72000.0,
)
"""MAX serve's latency buckets (``max.support._telemetry.LATENCY_BUCKETS_MS``, first 30), so the histograms line up."""
PROM_UNIT_SUFFIX = {
    "s": "seconds",
    "ms": "milliseconds",
    "%": "percent",
    "By": "bytes",
    "{token}/s": "tokens_per_second",
}
SOURCE_ATTRIBUTE = {"max_profile.source": "max_profile"}
MAX_STEP_SPANS = 2000
"""Steps beyond this many get no span of their own (the capture span says how many were left out)."""


@dataclass
class MetricSeries:
    """One metric: a histogram (observations per attribute set) or a gauge (one value per attribute set)."""

    name: str
    kind: Literal["histogram", "gauge"]
    unit: str
    description: str
    buckets: tuple[float, ...] = ()
    points: list[tuple[dict[str, str], list[float]]] = field(default_factory=list)

    @property
    def prometheus_name(self) -> str:
        base = self.name.replace(".", "_").replace("-", "_")
        suffix = PROM_UNIT_SUFFIX.get(self.unit, "")
        return f"{base}_{suffix}" if suffix and not base.endswith(suffix) else base

    def add(self, attributes: dict[str, str], values: Iterable[float]) -> None:
        values = [float(v) for v in values]
        if values:
            self.points.append(({**SOURCE_ATTRIBUTE, **attributes}, values))


def _batch_type(phase: str) -> str:
    return "TG" if phase == "decode" else "CE"


def report_metrics(
    report: Report, *, requests: Sequence[RequestRecord] = (), model: str | None = None
) -> list[MetricSeries]:
    """Every series a report yields (empty series are left out). ``model`` becomes ``gen_ai.request.model``.

    ``requests``: a serve capture's per-request records (``RawCapture.requests``), for exact TTFT / TPOT
    histograms; without them a serve report gives its p50 / p90 as gauges.
    """
    model = model or (os.path.basename(report.capture.model_path.rstrip("/")) if report.capture.model_path else None)
    common = {"gen_ai.request.model": model} if model else {}
    ttft = MetricSeries(
        "gen_ai.server.time_to_first_token", "histogram", "s", "Time to generate the first token", TTFT_BUCKETS_S
    )
    tpot = MetricSeries(
        "gen_ai.server.time_per_output_token", "histogram", "s", "Time per output token after the first", TPOT_BUCKETS_S
    )
    batch = MetricSeries(
        "maxserve.batch_execution_time",
        "histogram",
        "ms",
        "Pipeline step (batch) execution time, per phase",
        LATENCY_BUCKETS_MS,
    )

    ok = [r for r in requests if r.ok]
    series: list[MetricSeries] = []
    if report.serve is not None and not ok:
        quantiles = MetricSeries(
            "maxserve.client.latency",
            "gauge",
            "ms",
            "Client-side TTFT and inter-token latency quantiles of a serve capture",
        )
        for what, p50, p90 in (
            ("time_to_first_token", report.serve.ttft_ms_p50, report.serve.ttft_ms_p90),
            ("inter_token_latency", report.serve.itl_ms_p50, report.serve.itl_ms_p90),
        ):
            for q, v in (("0.5", p50), ("0.9", p90)):
                if v is not None:
                    quantiles.add({**common, "latency": what, "quantile": q}, [v])
        series.append(quantiles)
    if ok:  # served requests: client-side per-request figures
        ttft.add({**common, "max_profile.measured": "request"}, [r.ttft_ms / 1e3 for r in ok if r.ttft_ms is not None])
        per_token = [
            ((r.ended_ns - r.started_ns) / 1e6 - r.ttft_ms) / (r.tokens - 1) / 1e3
            for r in ok
            if r.ttft_ms is not None and r.tokens > 1
        ]
        tpot.add({**common, "max_profile.measured": "request"}, [max(v, 0.0) for v in per_token])
    else:  # in-process: a prefill step is the model's share of TTFT, a decode step one token per sequence
        ttft.add(
            {**common, "max_profile.measured": "prefill step"},
            [(s.end_ns - s.start_ns) / 1e9 for s in report.steps if s.phase == "prefill" and s.batch_size],
        )
        tpot.add(
            {**common, "max_profile.measured": "decode step"},
            [(s.end_ns - s.start_ns) / 1e9 for s in report.steps if s.phase == "decode" and s.batch_size],
        )
    for phase in ("prefill", "decode", "mixed"):
        batch.add(
            {**common, "batch_type": _batch_type(phase), "phase": phase},
            [(s.end_ns - s.start_ns) / 1e6 for s in report.steps if s.phase == phase and s.batch_size],
        )
    series += [ttft, tpot, batch]

    if isinstance(report.step_summary, StepSummary) and report.step_summary.decode_tokens_per_s is not None:
        rate = MetricSeries(
            "maxserve.decode.tokens_per_second", "gauge", "{token}/s", "Decode tokens per second over the capture"
        )
        rate.add(common, [report.step_summary.decode_tokens_per_s])
        series.append(rate)
    if isinstance(report.kernels, KernelBreakdown):
        series += _kernel_series(report.kernels, common)
    if isinstance(report.utilization, UtilizationSection):
        series += _gpu_series(report.utilization, common)
    findings = MetricSeries(
        "maxserve.profile.finding", "gauge", "1", "A finding of the profile (value: its confidence, 0-1)"
    )
    for f in report.findings:
        findings.add({**common, "finding.id": f.id, "finding.severity": f.severity}, [f.confidence])
    series.append(findings)
    return [s for s in series if s.points]


def _kernel_series(k: KernelBreakdown, common: dict[str, str]) -> list[MetricSeries]:
    busy = MetricSeries(
        "maxserve.gpu.busy", "gauge", "%", "Share of the window some kernel ran (union of kernel intervals)"
    )
    share = MetricSeries("maxserve.kernel.family_share", "gauge", "%", "Share of kernel time per kernel family")
    per_step = MetricSeries("maxserve.kernel.time_per_step", "gauge", "ms", "Kernel time per step")
    if k.gpu_busy_pct is not None:
        busy.add({**common, "phase": "all"}, [k.gpu_busy_pct])
    for row in k.families:
        share.add({**common, "phase": "all", "family": row.family}, [row.share_pct])
    for p in k.phases:
        if p.gpu_busy_pct is not None:
            busy.add({**common, "phase": p.phase}, [p.gpu_busy_pct])
        if p.kernel_ms_per_step is not None:
            per_step.add({**common, "phase": p.phase}, [p.kernel_ms_per_step])
        for row in p.families:
            share.add({**common, "phase": p.phase, "family": row.family}, [row.share_pct])
    return [busy, share, per_step]


def _gpu_series(u: UtilizationSection, common: dict[str, str]) -> list[MetricSeries]:
    util = MetricSeries("maxserve.gpu.utilization", "gauge", "%", "Mean NVML / SMI utilization (time some kernel ran)")
    memory = MetricSeries("maxserve.gpu.memory.peak", "gauge", "By", "Peak GPU memory used")
    throttle = MetricSeries(
        "maxserve.gpu.throttled", "gauge", "1", "1 for each hardware throttle reason seen in the window"
    )
    for g in u.gpus:
        if g.mean_utilization_pct is not None:
            util.add({**common, "gpu": g.gpu}, [g.mean_utilization_pct])
        if g.peak_memory_bytes is not None:
            memory.add({**common, "gpu": g.gpu}, [g.peak_memory_bytes])
        for reason in g.hardware_throttle_reasons:
            throttle.add({**common, "gpu": g.gpu, "reason": reason}, [1.0])
    return [util, memory, throttle]


# --- Prometheus -----------------------------------------------------------------------------
def prometheus_text(report: Report, *, requests: Sequence[RequestRecord] = (), model: str | None = None) -> str:
    """The report's series in the Prometheus text exposition format (``prometheus_client``)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
    from prometheus_client.registry import Collector

    series = report_metrics(report, requests=requests, model=model)

    class _ReportCollector(Collector):
        def collect(self) -> Iterable[Any]:
            for s in series:
                labels = sorted({k.replace(".", "_") for attrs, _ in s.points for k in attrs})
                if s.kind == "gauge":
                    family: Any = GaugeMetricFamily(s.prometheus_name, s.description, labels=labels)
                    for attrs, values in s.points:
                        family.add_metric(_label_values(attrs, labels), values[-1])
                else:
                    family = HistogramMetricFamily(s.prometheus_name, s.description, labels=labels)
                    for attrs, values in s.points:
                        family.add_metric(_label_values(attrs, labels), _cumulative(values, s.buckets), sum(values))
                yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ReportCollector())
    return str(generate_latest(registry).decode())


def _label_values(attrs: dict[str, str], labels: Sequence[str]) -> list[str]:
    flat = {k.replace(".", "_"): v for k, v in attrs.items()}
    return [str(flat.get(label, "")) for label in labels]


def _cumulative(values: Sequence[float], bounds: Sequence[float]) -> list[tuple[str, float]]:
    out = [(_bound(b), float(sum(1 for v in values if v <= b))) for b in bounds]
    return [*out, ("+Inf", float(len(values)))]


def _bound(b: float) -> str:
    return repr(float(b))


# --- OpenTelemetry --------------------------------------------------------------------------
def export_otel(
    report: Report,
    *,
    meter_provider: Any,
    tracer_provider: Any | None = None,
    requests: Sequence[RequestRecord] = (),
    model: str | None = None,
    max_step_spans: int = MAX_STEP_SPANS,
) -> None:
    """Record the report's series on ``meter_provider`` and (when given) its spans on ``tracer_provider``.

    Providers are OpenTelemetry SDK ``MeterProvider`` / ``TracerProvider`` objects (from
    :func:`otlp_providers_from_env`, or the application's own); flushing them is the caller's.
    """
    version = report.tool_version or None
    meter = meter_provider.get_meter("max_profile", version)
    for s in report_metrics(report, requests=requests, model=model):
        if s.kind == "histogram":
            instrument = meter.create_histogram(
                s.name, unit=s.unit, description=s.description, explicit_bucket_boundaries_advisory=list(s.buckets)
            )
            for attrs, values in s.points:
                for v in values:
                    instrument.record(v, attributes=attrs)
        else:
            gauge = meter.create_gauge(s.name, unit=s.unit, description=s.description)
            for attrs, values in s.points:
                gauge.set(values[-1], attributes=attrs)
    if tracer_provider is not None:
        _export_spans(report, tracer_provider.get_tracer("max_profile", version), model, max_step_spans)


def _export_spans(report: Report, tracer: Any, model: str | None, max_step_spans: int) -> None:
    c = report.capture
    start_ns = int(c.started_unix_s * 1e9)
    end_ns = int((c.ended_unix_s or c.started_unix_s) * 1e9)
    offset = c.unix_minus_perf_counter_ns
    steps = [s for s in report.steps if s.batch_size] if offset is not None else []
    if steps:  # the span covers its steps, whatever the capture's own bounds were
        start_ns = min(start_ns, steps[0].start_ns + offset)  # type: ignore[operator]
        end_ns = max(end_ns, steps[-1].end_ns + offset)  # type: ignore[operator]
    attrs: dict[str, Any] = {
        **SOURCE_ATTRIBUTE,
        "max_profile.target": c.target,
        "max_profile.collectors": ",".join(c.collectors),
    }
    if model or c.model_path:
        attrs["gen_ai.request.model"] = model or os.path.basename((c.model_path or "").rstrip("/"))
    if isinstance(report.kernels, KernelBreakdown) and report.kernels.gpu_busy_pct is not None:
        attrs["max_profile.gpu_busy_pct"] = report.kernels.gpu_busy_pct
    if len(steps) > max_step_spans:
        attrs["max_profile.steps_without_span"] = len(steps) - max_step_spans
    root = tracer.start_span("max_profile.capture", start_time=start_ns, attributes=attrs)
    for f in report.findings:
        root.add_event(
            f"finding {f.id}",
            attributes={
                "finding.id": f.id,
                "finding.severity": f.severity,
                "finding.title": f.title,
                "finding.confidence": f.confidence,
            },
            timestamp=end_ns,
        )
    from opentelemetry import trace

    parent = trace.set_span_in_context(root)
    for step in steps[:max_step_spans]:
        span = tracer.start_span(
            f"max_profile.step {step.phase}",
            context=parent,
            start_time=step.start_ns + offset,  # type: ignore[operator]
            attributes={
                "max_profile.step.index": step.index,
                "max_profile.step.phase": step.phase,
                "batch_type": _batch_type(step.phase),
                "max_profile.step.batch_size": step.batch_size,
                "max_profile.step.input_tokens": step.input_tokens,
                **(
                    {"max_profile.step.model_input_tokens": step.model_input_tokens}
                    if step.model_input_tokens is not None
                    else {}
                ),
            },
        )
        span.end(end_time=step.end_ns + offset)  # type: ignore[operator]
    root.end(end_time=end_ns)


class _CheckedExporter:
    """Delegates to an OTLP exporter and keeps the first failure (the SDK would only log it, with a traceback)."""

    def __init__(self, inner: Any, failure: Any) -> None:
        self._inner = inner
        self._failure = failure
        self.problem: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def export(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = self._inner.export(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - connection refused, TLS, timeouts: reported once by finish()
            self.problem = self.problem or f"{type(exc).__name__}: {str(exc)[:200]}"
            return self._failure
        if getattr(result, "name", "SUCCESS") != "SUCCESS":
            self.problem = self.problem or f"the endpoint answered {result.name}"
        return result


@dataclass
class OtlpExport:
    """SDK providers wired to OTLP exporters; :meth:`finish` flushes, shuts down and reports failures."""

    meter_provider: Any
    tracer_provider: Any
    endpoint: str
    exporters: list[_CheckedExporter]

    def finish(self) -> None:
        import logging

        quiet = logging.getLogger("opentelemetry")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)  # the failure is said once below, not as SDK tracebacks
        try:
            self.meter_provider.shutdown()  # collects and exports the metrics once
            self.tracer_provider.shutdown()
        finally:
            quiet.setLevel(level)
        problems = [e.problem for e in self.exporters if e.problem]
        if problems:
            raise CaptureError(
                f"OpenTelemetry export to {self.endpoint} failed ({problems[0]}); the other outputs were written"
            )


def otlp_settings() -> tuple[str, str]:
    """(endpoint, protocol) from the ``OTEL_*`` variables, or an :class:`InputError` saying what to set.

    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the per-signal ``..._METRICS_ENDPOINT``) is required;
    ``OTEL_EXPORTER_OTLP_PROTOCOL`` is ``http/protobuf`` (the default) or ``grpc``.
    """
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        raise InputError(
            "--otel needs an OTLP endpoint: set OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://localhost:4318 for an "
            "OpenTelemetry Collector; OTEL_EXPORTER_OTLP_PROTOCOL=grpc for port 4317)"
        )
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        raise InputError(
            "--otel was given but OTEL_SDK_DISABLED=true turns the OpenTelemetry SDK off; unset it to export"
        )
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if protocol not in ("grpc", "http/protobuf", "http"):
        raise InputError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: max_profile exports with http/protobuf or grpc")
    return endpoint, protocol


def otlp_providers_from_env() -> OtlpExport:
    """Providers exporting over OTLP as the ``OTEL_*`` variables say (endpoint, protocol, headers, service name)."""
    endpoint, protocol = otlp_settings()
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # the exporters of the protocol asked for: proto.grpc or proto.http (the same classes by name)
    package = "opentelemetry.exporter.otlp.proto." + ("grpc" if protocol == "grpc" else "http")
    metric_exporter = importlib.import_module(package + ".metric_exporter")
    trace_exporter = importlib.import_module(package + ".trace_exporter")
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "max_profile"})
    from opentelemetry.sdk.metrics.export import MetricExportResult
    from opentelemetry.sdk.trace.export import SpanExportResult

    metrics_out = _CheckedExporter(metric_exporter.OTLPMetricExporter(), MetricExportResult.FAILURE)
    spans_out = _CheckedExporter(trace_exporter.OTLPSpanExporter(), SpanExportResult.FAILURE)
    reader = PeriodicExportingMetricReader(metrics_out, export_interval_millis=3_600_000)  # type: ignore[arg-type]
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(spans_out))  # type: ignore[arg-type]
    return OtlpExport(meter_provider, tracer_provider, endpoint, [metrics_out, spans_out])
