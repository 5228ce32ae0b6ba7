"""Build a :class:`Report` from a :class:`RawCapture`: the one pure path from data to verdicts."""

from __future__ import annotations

import msgspec

from max_profile.analyze.breakdown import build_breakdown
from max_profile.analyze.plan import next_measurement
from max_profile.analyze.rules import Thresholds, evaluate
from max_profile.analyze.steps import summarize_steps
from max_profile.analyze.utilization import summarize_gpus, window_samples
from max_profile.model import KernelBreakdown, RawCapture, Report, Unavailable, UtilizationSection


def build_report(raw: RawCapture, *, tool_version: str = "", thresholds: Thresholds | None = None) -> Report:
    steps = raw.steps
    report = Report(environment=raw.environment, capture=raw.capture, steps=list(steps), tool_version=tool_version)
    try:
        report.step_summary = summarize_steps(steps)
    except ValueError as exc:
        report.step_summary = Unavailable(str(exc))
    window = (min(s.start_ns for s in steps), max(s.end_ns for s in steps)) if steps else None
    if raw.utilization_unavailable is not None:
        report.utilization = Unavailable(raw.utilization_unavailable)
    else:
        inside = window_samples(raw.samples, window, int(raw.sample_interval_s * 1e9))
        report.utilization = UtilizationSection(
            source="max.profiler.gpu.BackgroundRecorder (sample times interpolated)",
            interval_s=raw.sample_interval_s,
            gpus=summarize_gpus(inside),
            samples=list(raw.samples),
            window_ns=window,
        )
    kernels: KernelBreakdown | Unavailable | None = None
    if raw.kernels_unavailable is not None:
        kernels = Unavailable(raw.kernels_unavailable)
    elif raw.kernels:
        kernels = build_breakdown(
            raw.kernels,
            source=raw.kernel_source or "kernels",
            steps=steps,
            ranges=raw.ranges,
            device_graph_capture=raw.capture.device_graph_capture,
            graph_launches=raw.graph_launches,
        )
        if raw.tracer_overhead_pct is not None:
            kernels = msgspec.structs.replace(kernels, tracer_overhead_pct=raw.tracer_overhead_pct)
    report.kernels = kernels
    report.findings = evaluate(report, thresholds)
    report.next_measurement = next_measurement(report)
    return report
