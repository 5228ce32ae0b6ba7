"""``build_report(raw)``: the one place a :class:`RawCapture` becomes a :class:`Report`.

Every source goes through it (in-process, nsys run and import, rocprofv3 / rocpd, Kineto JSON, nsys
CSVs, ``max serve`` in every mode, Nsight Compute): steps are chosen once
(:mod:`~max_profile.analyze.timeline`), kernels attributed once
(:mod:`~max_profile.analyze.breakdown`), rules evaluated once (:mod:`~max_profile.analyze.rules`)
and the next measurement planned once (:func:`~max_profile.analyze.commands.next_command`). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from max_profile.analyze.account import breakdown_from_ledger, ms_per_step_of
from max_profile.analyze.breakdown import breakdown_from_totals, build_breakdown, slices_without_records
from max_profile.analyze.commands import next_command
from max_profile.analyze.ledger import build_ledger, server_ledger, spans_ledger, with_load
from max_profile.analyze.load import (
    ended_inside,
    load_level,
    measured_windows,
    summarize_serve,
    tracer_cost,
    tracing_cost_statement,
)
from max_profile.analyze.ncu import analyze_launch
from max_profile.analyze.op_roofline import price_ops
from max_profile.analyze.ops import op_breakdown
from max_profile.analyze.replicas import replica_table, servers_named, slowest_replica
from max_profile.analyze.roofline import decode_roofline
from max_profile.analyze.rules import RULES, RuleSpec, evaluate_rules, nvml_window_long_enough
from max_profile.analyze.steps import phase_shape, summarize_steps
from max_profile.analyze.thresholds import Thresholds
from max_profile.analyze.timeline import Timeline, capture_timeline, valid_host_steps
from max_profile.analyze.utilization import summarize_gpus, window_samples
from max_profile.model import (
    DecodeCost,
    KernelBreakdown,
    OpBreakdown,
    RawCapture,
    Report,
    Step,
    StepLedger,
    Unavailable,
    UtilizationSection,
)
from max_profile.model.command_text import say
from max_profile.model.tags import LedgerSource, StepSource, host_ops


def tracer_overhead_pct(callback_s: float | None, window: tuple[int, int] | None) -> float | None:
    """Share of the capture window an in-process tracer spent in its buffer callbacks (%)."""
    if callback_s is None or window is None or window[1] <= window[0]:
        return None
    return 100.0 * callback_s / ((window[1] - window[0]) / 1e9)


def observed_device_graphs(
    raw: RawCapture, kernels: KernelBreakdown | Unavailable | None, min_kernels: int = Thresholds.graphs_off_min_kernels
) -> tuple[bool | None, str]:
    """Whether device graphs ran, from the trace itself: kernels recorded inside graphs or graph launches say on; a
    tracer that records graph membership (its graph-id column) seeing many kernels and none in a graph says off.
    (None, "") when the trace cannot tell (MAX's op ranges, summaries)."""
    if isinstance(kernels, KernelBreakdown) and kernels.graph_kernels:
        return True, f"{kernels.graph_kernels:,} of {kernels.kernels:,} kernels inside graphs"
    if raw.graph_launches:
        return True, f"{raw.graph_launches:,} graph launches"
    if isinstance(kernels, KernelBreakdown) and raw.kernels.graph_id is not None and kernels.kernels >= min_kernels:
        return False, f"{kernels.kernels:,} kernels, none inside a graph"
    return None, ""


def decode_cost_of(report: Report) -> DecodeCost | None:
    """The decode step's bytes-and-FLOPs model from the decode steps (median batch, summed context, p50 time) and the
    decode phase's kernel families; None without decode steps or a model description."""
    cfg = dict(report.capture.model_config or {})
    weights = report.capture.model_weights
    shape = phase_shape(report.steps, "decode")
    if not shape.batch_figure or not (cfg or weights):
        return None
    steps = [s for s in report.steps if s.phase == "decode" and s.batch_size > 0]
    gpu = report.environment.gpus[0].name if report.environment.gpus else None
    per_step: dict[str, float] | None = None
    k = report.kernels
    if isinstance(k, KernelBreakdown) and not host_ops(k.source):
        d = next((p for p in k.phases if p.phase == "decode"), None)
        if d is not None and d.steps and d.kernel_ms:
            per_step = {r.family: ms_per_step_of(d, r.total_ms) or 0.0 for r in d.families}
    return decode_roofline(
        cfg,
        weights,
        gpu,
        batch=shape.batch_figure,
        context_tokens=shape.context_tokens,
        step_ms=float(np.median([s.duration_ns / 1e6 for s in steps])),
        family_ms_per_step=per_step,
    )


def ledger_of(
    raw: RawCapture, report: Report, steps: list[Step], host_window: tuple[int, int] | None, th: Thresholds
) -> StepLedger | Unavailable:
    """The step ledger: from the kernel timeline where kernels and steps share a clock, else from the server's metrics
    (attach), else why there is none."""
    k = report.kernels
    gpu = report.environment.gpus[0].name if report.environment.gpus else None
    if isinstance(k, KernelBreakdown) and len(raw.kernels) and steps and not k.unreliable:
        host = raw.kernel_clock == "host"
        ledger = build_ledger(
            raw.kernels,
            steps,
            window=host_window if host else raw.trace_window_ns,
            recorded=raw.recorded_spans if host else (),
            model_config=raw.capture.model_config,
            weights=raw.capture.model_weights,
            gpu=gpu,
            th=th,
            host_ops=host_ops(k.source),
        )
        if ledger is not None:
            return with_load(ledger, raw.load_windows)
    windows = [w for w in raw.load_windows if not w.reference]
    if raw.steps and raw.steps[0].replica is not None and len({s.replica for s in raw.steps}) == 1:
        # one server's passes from MAX's spans: each pass timed, where the server's metrics give only means
        spans = spans_ledger(
            raw.steps,
            measured_windows(raw) or [(min(s.start_ns for s in raw.steps), max(s.end_ns for s in raw.steps))],
            windows,
        )
        if spans is not None:
            return spans
    if windows and report.server_metrics is not None:
        ledger = server_ledger(report.server_metrics, windows[-1])
        if ledger is not None:
            return ledger
    if isinstance(k, KernelBreakdown) and k.unreliable:
        return Unavailable("device graphs hid the kernels: no per-step account of their time")
    if not steps:
        return Unavailable(
            "no steps: the capture has no pipeline steps, phase ranges or scheduler ranges to account"
            if isinstance(k, KernelBreakdown)
            else "no steps and no kernel timeline"
        )
    return Unavailable(
        "no kernel timeline to account the steps with" + (f" ({k.reason})" if isinstance(k, Unavailable) else "")
    )


def _without_lost_slices(
    raw: RawCapture, steps: Sequence[Step], host_window: tuple[int, int] | None, notes: list[str]
) -> RawCapture:
    """The capture without the recorded slices that lost their kernel records (:func:`slices_without_records`) and the
    kernels asked for in them, said in ``notes``: their busy and idle shares would put the GPU's work on the host."""
    if raw.kernel_clock != "host" or not raw.recorded_spans or not len(raw.kernels):
        return raw
    lost = slices_without_records(raw.kernels, steps, raw.recorded_spans, host_window)
    if not lost.spans:
        return raw
    kept_spans = [(a, b) for a, b in raw.recorded_spans if not any(a < lb and la < b for la, lb in lost.spans)]
    notes.append(
        f"{len(lost.spans)} of {lost.slices} recorded slices held steps but almost no kernel records "
        f"({lost.kernels_per_step:.1f} kernels per step against {lost.typical:.1f} in the median slice): records were "
        f"lost there, so those slices and their {int(lost.kernels.sum())} kernels are left out of the busy, idle and "
        "per-step accounts"
    )
    return msgspec.structs.replace(raw, kernels=raw.kernels.select(~lost.kernels), recorded_spans=kept_spans)


def _steps_into(report: Report, raw: RawCapture, host_steps: list[Step], timeline: Timeline) -> list[Step]:
    """The report's steps and their summary: the host's (or the worker's, or MAX's spans'), else the trace's; the host
    steps that did work."""
    host_work = [s for s in host_steps if s.batch_size > 0]
    if host_work:
        report.steps = host_steps
        report.step_summary = summarize_steps(
            host_steps,
            source=StepSource.SPANS
            if host_steps[0].replica is not None  # MAX's max.batch spans name their replica
            else StepSource.WORKER
            if raw.serve is not None
            else StepSource.HOST,
            traced=raw.recorded_spans if raw.kernel_clock == "host" else (),
        )
    elif timeline.steps:
        report.steps = list(timeline.steps)
        report.step_summary = summarize_steps(timeline.steps, source=timeline.source)
    elif host_steps:
        report.steps = host_steps
        report.step_summary = Unavailable("no pipeline step ran inside the profiled block")
    return host_work


def _utilization_of(
    raw: RawCapture, host_window: tuple[int, int] | None, th: Thresholds, notes: list[str]
) -> UtilizationSection | Unavailable | None:
    """The GPU samples of the window, summarized per GPU (a window too short for NVML's averaging said in ``notes``)."""
    if raw.utilization_unavailable is not None:
        return raw.utilization_unavailable
    elif raw.samples:
        inside = window_samples(raw.samples, host_window, int(raw.sample_interval_s * 1e9))
        utilization = UtilizationSection(
            source=raw.sample_source,
            interval_s=raw.sample_interval_s,
            gpus=summarize_gpus(inside),
            samples=list(raw.samples),
            window_ns=host_window,
        )
        if not nvml_window_long_enough(utilization, th):
            span = (host_window[1] - host_window[0]) / 1e9 if host_window else 0.0
            notes.append(
                f"GPU utilization over a {span:.2f} s window ({len(inside)} samples): NVML averages over up to 1 s, so "
                "its reading says nothing about a window this short (no verdict is drawn from it); generate more "
                "tokens for one"
            )

        return utilization
    return None


def _kernels_of(
    raw: RawCapture, timeline: Timeline, host_window: tuple[int, int] | None, th: Thresholds, notes: list[str]
) -> KernelBreakdown | Unavailable | None:
    """The kernel breakdown by phase and family (what was left out of it said in ``notes``)."""
    kernels: KernelBreakdown | Unavailable | None = None
    if raw.kernels_unavailable is not None:
        kernels = raw.kernels_unavailable
    elif len(raw.kernels):
        source = raw.kernel_source or "kernels"
        kernels = build_breakdown(
            raw.kernels,
            source=source,
            steps=timeline.steps,
            step_source=timeline.source,
            window=host_window if raw.kernel_clock == "host" else raw.trace_window_ns,
            device_graph_capture=raw.capture.device_graph_capture,
            graph_launches=raw.graph_launches,
            wait_gap_ns=(int(th.gpu_wait_min_us * 1e3), int(th.gpu_wait_max_ms * 1e6)),
            recorded=raw.recorded_spans if raw.kernel_clock == "host" else (),
        )
        overhead = tracer_overhead_pct(raw.tracer_callback_s, host_window)
        if overhead is not None:
            kernels = msgspec.structs.replace(kernels, tracer_overhead_pct=overhead)
        if kernels.recorded_ms is not None and kernels.window_ms:
            notes.append(
                f"kernels were recorded in slices: {kernels.recorded_ms / 1e3:.1f} s of the "
                f"{kernels.window_ms / 1e3:.1f} s window ({100 * kernels.recorded_ms / kernels.window_ms:.0f} %; the "
                "recorder paused in between, to keep its cost low): kernel families, durations and per-step figures "
                "come from those slices, busy and wait shares are of their time"
            )
        if kernels.graph_kernels:
            notes.append(
                f"{kernels.graph_kernels} of {kernels.kernels} kernels ran inside device graphs: each recorded, "
                "tied to the step that launched its graph"
            )
        if kernels.paused_kernels:
            notes.append(
                f"{kernels.paused_kernels} kernel record(s) of the sampled recording ended past the middle of the "
                "pause after their slice (CUPTI stamps a kernel still running at a pause with the time recording "
                "resumed): left out"
            )
        if kernels.invalid_kernels:
            notes.append(
                f"{kernels.invalid_kernels} of {kernels.invalid_kernels + kernels.kernels} kernel records had invalid "
                "timestamps (negative, or ending before they start) and were dropped"
            )
    elif raw.kernel_totals:
        kernels = breakdown_from_totals(raw.kernel_totals, source=raw.kernel_source or "kernel totals")

    return kernels


def _serving_into(report: Report, raw: RawCapture, notes: list[str]) -> None:
    """A served or attached capture's load levels, server metrics, tracer cost and replicas."""
    levels_measured = [
        w for w in raw.load_windows if not w.reference
    ]  # the reference window is the tracer's yardstick only
    if levels_measured:
        levels = [load_level(w, raw.slo_ms, raw.samples) for w in levels_measured]
        report.server_metrics = levels[-1].server
        report.window_load = levels[-1]
        report.slo_ms = dict(raw.slo_ms)
        if len(levels) > 1:
            report.load_levels = levels
    report.tracer_cost = tracer_cost(raw.load_windows)
    if raw.pass_agreement is not None:
        a = raw.pass_agreement

        def figure(ms: float | None, fmt: str) -> str:
            return "n/a" if ms is None else format(ms, fmt)

        notes.append(
            f"forward passes of the window, MAX's spans against the worker hook: {a.span_passes} ({a.span_prefill} "
            f"prefill / {a.span_decode} decode, median {figure(a.span_median_ms, '.2f')} ms) against {a.hook_steps} "
            f"({a.hook_prefill} / {a.hook_decode}, median {figure(a.hook_median_ms, '.2f')} ms; a span also holds the "
            "pass's response hand-off)"
        )
    report.replicas = replica_table(
        raw.steps, raw.server_requests, measured_windows(raw) if raw.serve is not None else None, servers_named(raw)
    )
    slowest = slowest_replica(report.replicas)
    if slowest is not None:
        report.slowest_replica = f"{slowest[0].replica}: {slowest[1]}"


def _the_measured_windows(raw: RawCapture, notes: list[str]) -> RawCapture:
    """A served or attached capture with several measured windows (a load sweep), accounted over those windows only: the
    passes that ended inside one of them (those of the pauses between levels, where any were read, are left out and
    counted), and a kernel recording that ran through each window whole taken as recorded in the windows (what the
    ledger and the breakdown divide by: the pauses are no level's time)."""
    windows = measured_windows(raw) if raw.serve is not None else []
    if len(windows) < 2:
        return raw
    kept = [s for s in raw.steps if ended_inside(s.end_ns, windows)]
    if len(kept) < len(raw.steps):
        notes.append(
            f"{len(raw.steps) - len(kept)} pass(es) ran between the sweep's load levels, outside every measured "
            "window: left out of every figure"
        )
    recorded = raw.recorded_spans
    if not recorded and raw.kernel_clock == "host" and len(raw.kernels):
        recorded = windows
    if len(kept) == len(raw.steps) and recorded is raw.recorded_spans:
        return raw
    return msgspec.structs.replace(raw, steps=kept, recorded_spans=list(recorded))


def build_report(
    raw: RawCapture,
    *,
    tool_version: str = "",
    thresholds: Thresholds | None = None,
    rules: tuple[RuleSpec, ...] = RULES,
) -> Report:
    """Everything a report says, from one raw capture (pure): sections, steps, kernel breakdown, decode cost model,
    Nsight Compute analyses, then the ``rules`` judged against ``thresholds`` and the next command to run."""
    th = thresholds or Thresholds()
    notes = list(raw.notes)
    raw = _the_measured_windows(raw, notes)
    host_steps = valid_host_steps(raw)
    if len(host_steps) < len(raw.steps):
        notes.append(
            f"{len(raw.steps) - len(host_steps)} host step(s) with invalid timestamps (negative, or ending before they "
            "start) were left out"
        )
    timeline = capture_timeline(raw)
    notes += timeline.notes
    report = Report(
        environment=raw.environment,
        capture=raw.capture,
        preflight=list(raw.preflight),
        artifacts=list(raw.artifacts),
        tool_version=tool_version,
        startup=raw.startup,
    )

    host_work = _steps_into(report, raw, host_steps, timeline)
    # without a recorded window: the steps' span (a trace's steps too, when they are on the host's clock: an NVTX range
    # opens before the host's step does)
    spanned = host_work + ([s for s in timeline.steps if s.batch_size > 0] if raw.kernel_clock == "host" else [])
    host_window = raw.window_ns or (
        (min(s.start_ns for s in spanned), max(s.end_ns for s in spanned)) if spanned else None
    )

    report.utilization = _utilization_of(raw, host_window, th, notes)
    raw = _without_lost_slices(raw, timeline.steps, host_window, notes)
    kernels = _kernels_of(raw, timeline, host_window, th, notes)
    _serving_into(report, raw, notes)
    if raw.serve is not None:
        report.serve = summarize_serve(raw.serve, raw.requests, measured_windows(raw))
        if report.serve.requests and report.serve.requests == report.serve.failed_requests and kernels is None:
            kernels = Unavailable(
                f"no request completed in the window: {report.serve.first_error or 'no request completed'}"
            )
    report.kernels = kernels
    observed, why = observed_device_graphs(raw, kernels, th.graphs_off_min_kernels)
    if observed is not None and observed != raw.capture.device_graph_capture:
        said = {True: "on", False: "off", None: "left to MAX"}[raw.capture.device_graph_capture]
        notes.append(
            f"device graphs {'on' if observed else 'off'}, from what ran ({why}); the capture's settings said {said}"
        )
        report.capture = msgspec.structs.replace(raw.capture, device_graph_capture=observed)
    report.ledger = ledger_of(raw, report, timeline.steps, host_window, th)
    if isinstance(report.kernels, KernelBreakdown) and isinstance(report.ledger, StepLedger):
        report.kernels = breakdown_from_ledger(report.kernels, report.ledger)
    report.decode_cost = decode_cost_of(report)
    ops = op_breakdown(raw)
    if (
        isinstance(ops, OpBreakdown)
        and isinstance(report.ledger, StepLedger)
        and report.ledger.source != LedgerSource.OP_RANGES
    ):
        gpu = report.environment.gpus[0].name if report.environment.gpus else None
        priced = price_ops(ops, timeline.steps, raw.capture.model_config, raw.capture.model_weights, gpu, th)
        ops = msgspec.structs.replace(ops, priced=priced)
    report.ops = ops
    report.kernel_analyses = [analyze_launch(launch, th) for launch in raw.ncu_launches]
    cost = tracing_cost_statement(report)
    if cost:
        notes.insert(0, cost)
    report.notes = notes
    report.findings, report.rules_skipped = evaluate_rules(report, th, rules)
    report.next_command = next_command(report, th)
    report.next_measurement = (
        say(report.next_command, report.capture.interface) if report.next_command is not None else None
    )
    return report
