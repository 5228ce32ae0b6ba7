"""``build_report(raw)``: the one place a :class:`RawCapture` becomes a :class:`Report`.

Every source goes through it (in-process, nsys run and import, rocprofv3 / rocpd, Kineto JSON, nsys
CSVs, ``max serve`` in every mode, Nsight Compute): steps are chosen once
(:mod:`~max_profile.analyze.timeline`), kernels attributed once
(:mod:`~max_profile.analyze.breakdown`), rules evaluated once (:mod:`~max_profile.analyze.rules`)
and the next measurement planned once (:mod:`~max_profile.analyze.plan`). Pure: no I/O.
"""

from __future__ import annotations

import msgspec

from max_profile.analyze.breakdown import breakdown_from_totals, build_breakdown
from max_profile.analyze.ncu import analyze_launch, kernel_findings
from max_profile.analyze.plan import next_measurement
from max_profile.analyze.rules import Thresholds, evaluate
from max_profile.analyze.serve import summarize_serve
from max_profile.analyze.steps import summarize_steps
from max_profile.analyze.timeline import step_timeline
from max_profile.analyze.utilization import summarize_gpus, window_samples
from max_profile.model import KernelBreakdown, RawCapture, Report, Unavailable, UtilizationSection


def tracer_overhead_pct(callback_s: float | None, window: tuple[int, int] | None) -> float | None:
    """Share of the capture window an in-process tracer spent in its buffer callbacks (%)."""
    if callback_s is None or window is None or window[1] <= window[0]:
        return None
    return 100.0 * callback_s / ((window[1] - window[0]) / 1e9)


def build_report(raw: RawCapture, *, tool_version: str = "", thresholds: Thresholds | None = None) -> Report:
    notes = list(raw.notes)
    host_steps = [s for s in raw.steps if 0 <= s.start_ns <= s.end_ns]
    if len(host_steps) < len(raw.steps):
        notes.append(f"{len(raw.steps) - len(host_steps)} host step(s) with invalid timestamps (negative, or ending before they start) were left out")
    timeline = step_timeline(host_steps, raw.ranges, host_clock=raw.kernel_clock == "host")
    notes += timeline.notes
    report = Report(environment=raw.environment, capture=raw.capture, preflight=list(raw.preflight), artifacts=list(raw.artifacts),
                    tool_version=tool_version)

    host_work = [s for s in host_steps if s.batch_size > 0]
    if host_work:
        report.steps = host_steps
        report.step_summary = summarize_steps(host_steps)
    elif timeline.steps:
        report.steps = list(timeline.steps)
        report.step_summary = summarize_steps(timeline.steps, source=timeline.source)
    elif host_steps:
        report.steps = host_steps
        report.step_summary = Unavailable("no pipeline step ran inside the profiled block")
    host_window = raw.window_ns or ((min(s.start_ns for s in host_work), max(s.end_ns for s in host_work)) if host_work else None)

    if raw.utilization_unavailable is not None:
        report.utilization = Unavailable(raw.utilization_unavailable)
    elif raw.samples:
        inside = window_samples(raw.samples, host_window, int(raw.sample_interval_s * 1e9))
        report.utilization = UtilizationSection(source=raw.sample_source, interval_s=raw.sample_interval_s, gpus=summarize_gpus(inside),
                                                samples=list(raw.samples), window_ns=host_window)

    kernels: KernelBreakdown | Unavailable | None = None
    if raw.kernels_unavailable is not None:
        kernels = Unavailable(raw.kernels_unavailable)
    elif len(raw.kernels):
        source = raw.kernel_source or "kernels"
        kernels = build_breakdown(raw.kernels, source=source, steps=timeline.steps, step_source=timeline.source,
                                  window=host_window if raw.kernel_clock == "host" else raw.trace_window_ns,
                                  device_graph_capture=raw.capture.device_graph_capture, graph_launches=raw.graph_launches)
        overhead = tracer_overhead_pct(raw.tracer_callback_s, host_window)
        if overhead is not None:
            kernels = msgspec.structs.replace(kernels, tracer_overhead_pct=overhead)
        if kernels.graph_kernels:
            notes.append(f"{kernels.graph_kernels} of {kernels.kernels} kernels ran inside device graphs: each recorded, "
                         "tied to the step that launched its graph")
        if kernels.invalid_kernels:
            notes.append(f"{kernels.invalid_kernels} of {kernels.invalid_kernels + kernels.kernels} kernel records had invalid "
                         "timestamps (negative, or ending before they start) and were dropped")
    elif raw.kernel_totals:
        kernels = breakdown_from_totals(raw.kernel_totals, source=raw.kernel_source or "kernel totals")

    if raw.serve is not None:
        report.serve = summarize_serve(raw.serve, raw.requests, raw.window_ns)
        if report.serve.requests and report.serve.requests == report.serve.failed_requests and kernels is None:
            kernels = Unavailable(f"no request completed in the window: {report.serve.first_error or 'no request completed'}")
    report.kernels = kernels
    report.kernel_analyses = [analyze_launch(launch) for launch in raw.ncu_launches]
    report.notes = notes
    report.findings = evaluate(report, thresholds) + [f for a in report.kernel_analyses for f in kernel_findings(a)]
    report.next_measurement = next_measurement(report)
    return report
