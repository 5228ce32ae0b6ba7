"""Verdicts about the GPU waiting, read off the step ledger: idle inside a phase's steps (host-bound, launch-bound),
the host's own time between MAX's ops (a CPU, the ops mode), NVML's utilization where no ledger exists, and the waits
before device-graph kernels. Each says what fixing it buys and carries the command that measures the host's side."""

from __future__ import annotations

from max_profile.analyze.ledger import IDLE_BEFORE_GRAPH
from max_profile.analyze.ops import OPS_MODE_DECODE_STEP_MS, ops_calls_per_step
from max_profile.analyze.rules.base import (
    gpu_kernels,
    kern,
    ledger,
    lever_severity,
    lightly_loaded,
    nvml_window_long_enough,
    phase_lever,
    phase_of,
    step_summary,
    timeline_ledger,
    util,
)
from max_profile.analyze.rules.levers import _default_run_command, _host_command
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Finding, GpuUtilization, Lever, PhaseLedger, Report
from max_profile.model.tags import LedgerSource

OPS_MODE_ADVICE = "These steps are the ops mode's; MAX's default run of this workload judges the host's time per step:"
HOST_BOUND_ADVICE = (
    "The GPU is not the bottleneck: a kernel deep dive adds nothing until it is busy. Raise the batch size / "
    "concurrency (more work per launch), or find where the host's time goes per step:"
)


def recording_share_ms(report: Report, p: PhaseLedger) -> float | None:
    """Of the phase's step, the ms the kernel recording itself added, as measured against the untraced reference
    window of the same server (``serve --mode kernels``): the server's own decode step, recorded minus untraced; for
    another phase its step times the throughput lost. None when no untraced reference was measured."""
    c = report.tracer_cost
    if c is None or c.throughput_ratio is None:
        return None
    if p.phase == "decode" and c.reference_decode_step_ms and c.traced_decode_step_ms is not None:
        return max(c.traced_decode_step_ms - c.reference_decode_step_ms, 0.0)
    return max(p.step_ms * (1.0 - c.throughput_ratio), 0.0)


def _idle_finding(report: Report, p: PhaseLedger, th: Thresholds) -> Finding | None:
    idle_rows = [r for r in p.rows if r.kind == "idle"]
    idle_seen = sum(r.ms_per_step for r in idle_rows)
    kernel_ms = p.step_ms - idle_seen
    recording = recording_share_ms(report, p)
    # the idle the untraced server has too: the recording's own share of the step comes off (it is not a lever)
    idle = max(idle_seen - recording, 0.0) if recording is not None else idle_seen
    ops_calls = ops_calls_per_step(report.ops, p.phase)
    pct = 100 * idle / p.step_ms if p.step_ms else 0.0
    busy_pct = p.busy_pct if recording is None else 100 * kernel_ms / (kernel_ms + idle) if kernel_ms + idle else 0.0
    severity = lever_severity(pct, p.steps, th)
    if severity is None:
        return None
    if ops_calls is not None:  # the ops mode's own eager launches lengthen the step: not a lever of the default run
        severity = "info"
    before = sum(r.ms_per_step for r in idle_rows if r.part == IDLE_BEFORE_GRAPH)
    ev: dict[str, float | int | str | None] = {
        "phase": p.phase,
        "steps": p.steps,
        "step_ms": round(p.step_ms, 4),
        "kernel_ms_per_step": round(kernel_ms, 4),
        "idle_ms_per_step": round(idle, 4),
        "idle_pct_of_step": round(pct, 1),
        "idle_before_graph_launch_ms_per_step": round(before, 4),
        "gpu_busy_pct": round(busy_pct, 2),
        "host_step_p50_ms": round(p.host_step_p50_ms, 4) if p.host_step_p50_ms is not None else None,
        "batch": p.batch,
        "threshold_busy_pct": th.host_bound_busy_pct,
    }
    recorded_note = ""
    if recording is not None:
        ev["recorded_idle_ms_per_step"] = round(idle_seen, 4)
        ev["idle_from_recording_ms_per_step"] = round(min(recording, idle_seen), 4)
        ev["recorded_step_ms"] = round(p.step_ms, 4)
        recorded_note = (
            f" (the recorded step idled {idle_seen:.2f} ms; {min(recording, idle_seen):.2f} ms of that was the "
            "recording's own, measured against the untraced window, and is left out)"
        )
    mode_note = ""
    if ops_calls is not None:
        ops_step, default_step = OPS_MODE_DECODE_STEP_MS
        ev["ops_mode_calls_per_step"] = round(ops_calls, 1)
        mode_note = (
            f", in --kernels ops: {ops_calls:.0f} op calls per step launched eagerly, each in its range (on an H200 "
            f"this mode's decode step was {ops_step / default_step:.1f}x MAX's default run's, the kernels the same); "
            "judge host time in the default run"
        )
    # a lever prices what fixing it buys in MAX's default run: the ops mode's idle does not say that
    lever = phase_lever(p, "GPU idle inside the step", idle) if ops_calls is None else None
    command = _host_command(report) if ops_calls is None else _default_run_command(report)
    where = f"each {p.phase} step" if p.steps > 1 else f"the {p.phase} step"
    if busy_pct < th.host_bound_busy_pct:
        return Finding(
            id="host-bound",
            severity=severity,
            confidence=0.5 if ops_calls is not None else 0.9,
            evidence=ev,
            lever=lever,  # type: ignore[arg-type]
            title=f"Host-bound: the GPU idles {idle:.2f} of {p.step_ms:.2f} ms of {where} ({pct:.0f} %; its kernels "
            f"take {kernel_ms:.2f} ms){mode_note}{recorded_note}",
            next_step=HOST_BOUND_ADVICE if ops_calls is None else OPS_MODE_ADVICE,
            command=command,
        )
    graphs = before >= th.graph_launch_late_share * idle
    if graphs:
        title = (
            f"The GPU waits {idle:.2f} ms of {where} ({pct:.0f} % of {p.step_ms:.2f} ms) for the host, "
            f"{before:.2f} ms of it before the step's device graph is launched{recorded_note}"
        )
        advice = (
            "The kernels run at their speed; the host launches the step's graph late (Python, scheduling, sampling "
            "between steps). Check the host-load line of this report, then where the host's time goes per step:"
        )
    else:
        title = (
            f"The GPU waits for the host {idle:.2f} ms of {where} ({pct:.0f} % of {p.step_ms:.2f} ms) between "
            f"kernel launches{mode_note}{recorded_note}"
        )
        advice = (
            "Between eager launches the GPU runs dry: device graphs (on by default on GPUs) launch a step at once; "
            "otherwise see where the host's time goes per step:"
        )
    if ops_calls is not None:
        advice = OPS_MODE_ADVICE
    return Finding(
        id="graph-launch-late" if graphs else "gpu-idle",
        severity=severity,
        confidence=0.5 if ops_calls is not None else 0.8,
        evidence=ev,
        lever=lever,  # type: ignore[arg-type]
        title=title,
        next_step=advice,
        command=command,
    )


def _host_ops_finding(report: Report, p: PhaseLedger, th: Thresholds) -> Finding:
    """On a CPU the "kernels" are MAX's op ranges on the host: the rest of each step is host work between ops. Every
    phase gets one of two verdicts, split at ``host_bound_busy_pct``: the host work between ops sets the speed
    (host-time-between-ops), or the ops do (ops-bound)."""
    between = sum(r.ms_per_step for r in p.rows if r.kind == "idle")
    pct = 100 * between / p.step_ms if p.step_ms else 0.0
    if 100 - pct >= th.host_bound_busy_pct:
        return _ops_bound_finding(report, p, 100 - pct, th)
    return Finding(
        id="host-time-between-ops",
        severity="info",
        confidence=0.7,
        lever=phase_lever(p, "host time between ops", between),
        title=f"MAX's ops ran {100 - pct:.0f} % of each {p.phase} step: the other {pct:.0f} % ({between:.2f} of "
        f"{p.step_ms:.2f} ms) is host "
        "work between ops (Python, scheduling, sampling)",
        evidence={
            "phase": p.phase,
            "ops_cover_pct": round(100 - pct, 1),
            "between_ops_ms_per_step": round(between, 4),
            "step_ms": round(p.step_ms, 4),
            "threshold_pct": th.host_bound_busy_pct,
        },
        next_step="At this model size the framework's per-step cost sets the speed, not the model's math: see where "
        "the host time goes "
        "with py-spy, or profile a larger model.",
        command=_host_command(report),
    )


def _ops_bound_finding(report: Report, p: PhaseLedger, cover_pct: float, th: Thresholds) -> Finding:
    """MAX's ops ran most of the phase's steps on the host: their math sets the speed; the largest part and op lead."""
    top = max((r for r in p.rows if r.kind == "kernels"), key=lambda r: r.ms_per_step, default=None)
    k = kern(report)
    phase_ops = phase_of(k, p.phase) if k is not None else None
    top_op = phase_ops.top_kernels[0].name if phase_ops is not None and phase_ops.top_kernels else None
    where = f"each {p.phase} step" if p.steps > 1 else f"the {p.phase} step"
    lead = f", {top.part} first ({top.share_pct:.0f} % of the step)" if top is not None else ""
    return Finding(
        id="ops-bound",
        severity="info",
        confidence=0.7,
        title=f"MAX's ops ran {cover_pct:.0f} % of {where} ({p.step_ms:.2f} ms): the ops' own work sets the speed"
        + lead,
        evidence={
            "phase": p.phase,
            "steps": p.steps,
            "ops_cover_pct": round(cover_pct, 1),
            "step_ms": round(p.step_ms, 4),
            "top_part": top.part if top is not None else None,
            "top_part_ms_per_step": round(top.ms_per_step, 4) if top is not None else None,
            "top_op": top_op,
            "threshold_pct": th.host_bound_busy_pct,
        },
        next_step="The op table says which ops take the time; on a CPU their speed is the host's cores and MAX's CPU "
        "kernels (other processes on the same cores slow them first: see the host-load line).",
    )


def _nvml_host_bound(report: Report, th: Thresholds) -> list[Finding]:
    """No kernel timeline: NVML's utilization over a window long enough to judge, or the whole capture's busy figure."""
    u, k = util(report), kern(report)
    evidence: dict[str, float | int | str | None] = {}
    low_util = False
    if u and u.gpus and nvml_window_long_enough(u, th):
        g: GpuUtilization = max(u.gpus, key=lambda g: g.mean_utilization_pct or 0)
        if g.mean_utilization_pct is not None and g.mean_utilization_pct < th.host_bound_util_pct:
            low_util = True
            evidence.update(
                {
                    "gpu": g.gpu,
                    "mean_utilization_pct": round(g.mean_utilization_pct, 1),
                    "peak_utilization_pct": g.peak_utilization_pct,
                    "samples": g.samples,
                }
            )
    busy = None
    if k is not None and gpu_kernels(k) and not k.unreliable and not k.phases and k.gpu_busy_pct is not None:
        busy = k.gpu_busy_pct  # a trace without phases: the whole capture window
        if busy >= th.host_bound_busy_pct:
            return []
        evidence.update(
            {
                "gpu_busy_pct": round(busy, 1),
                "kernels": k.kernels,
                "window_ms": round(k.window_ms or 0, 3),
                "busy_scope": "whole capture window (no phase ranges)"
                if k.recorded_ms is None
                else f"the recorded slices of the capture window ({k.recorded_ms:.1f} ms; no phase ranges)",
            }
        )
    if not (low_util or busy is not None):
        return []
    s = step_summary(report)
    dec = next((p for p in s.phases if p.phase == "decode"), None) if s else None
    lever = None
    if dec is not None:
        evidence["decode_step_p50_ms"] = round(dec.p50_ms, 3)
        used = busy if busy is not None else float(evidence.get("mean_utilization_pct") or 0)  # type: ignore[arg-type]
        idle_share = 1 - used / 100
        lever = Lever(
            phase="decode",
            part="GPU idle (estimated from " + ("the kernel timeline" if busy is not None else "NVML") + ")",
            ms_per_step=round(idle_share * dec.p50_ms, 4),
            pct_of_step=round(100 * idle_share, 1),
            total_ms=round(idle_share * dec.total_ms, 3),
        )
    evidence["threshold_pct"] = th.host_bound_util_pct
    confidence = (0.9 if (low_util and busy is not None) else 0.7) * (
        th.no_phase_confidence_scale if busy is not None else 1.0
    )
    title = (
        "Host-bound: the GPU idles while steps run (launch/sync overhead, Python, or a batch too small)"
        if busy is None
        else f"Host-bound: the GPU ran kernels {busy:.0f}% of the capture window (no phase ranges: whole capture)"
    )
    return [
        Finding(
            id="host-bound",
            severity="warning",
            title=title,
            evidence=evidence,
            confidence=round(confidence, 2),
            lever=lever,
            next_step="Stop here: a kernel trace adds nothing until the GPU is busy. Raise the batch size / "
            "concurrency, or profile the host (py-spy record, or `max generate --profile` for its cProfile table).",
        )
    ]


def _capture_graph_waits(report: Report, th: Thresholds) -> list[Finding]:
    """No steps to account: the capture's waits before device-graph kernels (a serve window without phase ranges)."""
    k = kern(report)
    w = k.gpu_waits if k and gpu_kernels(k) else None
    if (
        w is None
        or w.before_graph_pct < th.graph_launch_late_pct
        or w.before_graph_gaps < th.graph_launch_late_min_gaps
    ):
        return []
    median = f", median {w.gap_p50_us / 1e3:.2f} ms" if w.gap_p50_us is not None else ""
    return [
        Finding(
            id="graph-launch-late",
            severity="info",
            confidence=0.7,
            title=f"The GPU waited for the host before {w.before_graph_gaps} device-graph launches: "
            f"{w.before_graph_pct:.1f} % of the window "
            f"in gaps of {w.min_gap_us / 1e3:g}-{w.max_gap_ms:g} ms{median}",
            evidence={
                "before_graph_gaps": w.before_graph_gaps,
                "before_graph_ms": round(w.before_graph_ms, 1),
                "before_graph_pct": round(w.before_graph_pct, 2),
                "all_waits": w.gaps,
                "all_waits_pct": round(w.waited_pct, 2),
                "gap_p50_us": round(w.gap_p50_us, 1) if w.gap_p50_us is not None else None,
                "longer_gaps": w.longer_gaps,
                "threshold_pct": th.graph_launch_late_pct,
                "min_gaps": th.graph_launch_late_min_gaps,
            },
            next_step="The kernels ran at their speed; the thread that launches the step's graph came late. Check the "
            "host load line of "
            "this report (other processes on the cores), then where the host's time goes per step: py-spy on the "
            "process (`py-spy record --pid PID --duration 10`). Under an in-process tracer, compare with an untraced "
            "run first.",
            detail="Counted: gaps between one kernel's end and the next kernel's start (overlaps merged, the busiest "
            f"device) at least {w.min_gap_us:g} µs and under {w.max_gap_ms:g} ms that end at a kernel inside a device "
            f"graph; longer gaps ({w.longer_gaps} here, {w.longer_ms:.0f} ms) are waits for requests or pauses between "
            "steps.",
        )
    ]


def rule_gpu_idle(report: Report, th: Thresholds) -> list[Finding]:
    """The GPU idle inside each phase's steps, from the ledger: host-bound (busy under ``host_bound_busy_pct``), the
    step's device graph launched late (most of the idle before graph kernels), or idle between launches. No ledger:
    NVML's utilization or the whole capture's busy share, and the capture's waits before device graphs. On a CPU
    (MAX's op ranges as the kernels) one verdict per phase: host time between ops, or ops-bound. Needs load: a
    lightly loaded window says so instead (lightly-loaded)."""
    if lightly_loaded(report, th):
        return []
    lg = ledger(report)
    if lg is not None and lg.source == LedgerSource.OP_RANGES:
        return [_host_ops_finding(report, p, th) for p in lg.phases]
    tl = timeline_ledger(report)
    if tl is not None:
        return [f for p in tl.phases if (f := _idle_finding(report, p, th)) is not None]
    if report.environment.vendor == "none":
        return []
    return _nvml_host_bound(report, th) or _capture_graph_waits(report, th)


# ---------------------------------------------------------------------------------------------
# Matmuls and attention against their roofline
