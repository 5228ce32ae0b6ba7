"""Verdicts about where the time goes, read off the step ledger (:mod:`~max_profile.analyze.ledger`).

Each lever is one part of a phase's step that is not at its ideal: the GPU idle inside the step, the matmuls or the
attention below their roofline, the time outside every step. Its finding says what fixing it buys (ms per step, % of
the step, ms over the capture: what the engine ranks by) and carries a next command that reproduces the capture. Its
severity follows its size (``Thresholds.lever_warning_pct`` / ``lever_info_pct``). A "healthy" verdict is given only
where no lever at warning size remains in the phase; a load verdict (host-bound, GPU idle) only where there was load.
"""

from __future__ import annotations

import msgspec

from max_profile.analyze.commands import attach_command, cli, for_model, kernel_command, program, shell
from max_profile.analyze.families import base_name, slow_path
from max_profile.analyze.ledger import ATTENTION_PART, IDLE_BEFORE_GRAPH, MATMUL_PART
from max_profile.analyze.op_roofline import ATTENTION as OP_ATTENTION
from max_profile.analyze.op_roofline import LAYERS, OUTPUT, WEIGHTS, ops_text
from max_profile.analyze.ops import ATTENTION_PARTS, OPS_MODE_DECODE_STEP_MS, ops_calls_per_step
from max_profile.analyze.rules.base import (
    attention_unfused,
    gpu_kernels,
    kern,
    ledger,
    lever_severity,
    lightly_loaded,
    load_share,
    nvml_window_long_enough,
    phase_lever,
    phase_of,
    step_summary,
    timeline_ledger,
    util,
    worst_lever_pct,
)
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import (
    Command,
    Finding,
    GpuUtilization,
    KernelBreakdown,
    LedgerRow,
    Lever,
    OpBreakdown,
    OpRoofline,
    PhaseLedger,
    Report,
)
from max_profile.model.tags import LedgerSource

WEIGHTS_PARTS = (WEIGHTS, LAYERS, OUTPUT)


def _top_kernel(k: KernelBreakdown | None, phase: str, families: list[str]) -> str | None:
    """The phase's (else the capture's) top kernel of these families."""
    if k is None:
        return None
    p = phase_of(k, phase)
    rows = p.top_kernels if p is not None else k.top_kernels
    return next((r.name for r in rows if r.family in families), None)


def _launch_shape(k: KernelBreakdown | None, phase: str, name: str | None) -> str | None:
    p = phase_of(k, phase) if k is not None else None
    row = next((r for r in p.top_kernels if r.name == name), None) if p is not None and name else None
    return row.launch_shape if row is not None else None


def _host_command(report: Report) -> Command:
    """py-spy on the capture's own run (a server: the same serve capture, its worker followed) with the kernel tracer
    off: where the host's time goes per step. Without ``--native``: its native stacks did not get past a model's load in
    5 minutes where the Python stacks took 11 s."""
    pip, spy = program(report, "pip"), program(report, "py-spy")
    if report.serve is not None:
        line = f"{pip} install py-spy && {spy} record --subprocesses -o host.svg -- " + cli(
            for_model(report, "serve", mode="utilization", yes=True)
        )
        return shell(line, comment="where the server's host time goes per step")
    return shell(
        f"{pip} install py-spy && {spy} record -o host.svg -- " + cli(for_model(report, "run", kernels="off")),
        comment="where the host's time goes per step",
    )


def _default_run_command(report: Report) -> Command:
    """The capture's workload as MAX runs it by default (device graphs as MAX decides, kernels recorded as ``auto``
    records them): the run that judges host time after a ``--kernels ops`` capture, whose graphs the mode turned off (a
    server: ``serve --mode kernels``)."""
    if report.serve is not None:  # serve --mode ops: the same server in the kernels mode (device graphs as MAX runs)
        return for_model(
            report, "serve", mode="kernels", comment="the server as MAX runs it: its steps judge host time"
        )
    run = for_model(report, "run", comment="MAX's default run of this workload: its steps judge the host's time")
    return msgspec.structs.replace(run, args={k: v for k, v in run.args.items() if k != "device_graph_capture"})


# ---------------------------------------------------------------------------------------------
# GPU idle inside the steps

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
            "between "
            "steps). Check the host-load line of this report, then where the host's time goes per step:"
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
            "concurrency, "
            "or profile the host (py-spy record, or `max generate --profile` for its cProfile table).",
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
            "device) at least "
            f"{w.min_gap_us:g} µs and under {w.max_gap_ms:g} ms that end at a kernel inside a device graph; longer "
            "gaps "
            f"({w.longer_gaps} here, {w.longer_ms:.0f} ms) are waits for requests or pauses between steps.",
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


def _kernel_ms(p: PhaseLedger) -> float:
    return sum(r.ms_per_step for r in p.rows if r.kind == "kernels")


def _part(p: PhaseLedger, part: str) -> LedgerRow | None:
    return next((r for r in p.rows if r.kind == "kernels" and (r.part == part or r.part.startswith(part + ":"))), None)


def _roof_evidence(p: PhaseLedger, row: LedgerRow) -> dict[str, float | int | str | None]:
    return {
        "phase": p.phase,
        "steps": p.steps,
        "batch": p.batch,
        "step_ms": round(p.step_ms, 4),
        "part_ms_per_step": round(row.ms_per_step, 4),
        "ideal_ms_per_step": round(row.ideal_ms_per_step, 4) if row.ideal_ms_per_step is not None else None,
        "recoverable_ms_per_step": round(row.recoverable_ms_per_step, 4)
        if row.recoverable_ms_per_step is not None
        else None,
        "share_of_kernel_time_pct": round(100 * row.ms_per_step / _kernel_ms(p), 1) if _kernel_ms(p) else None,
        "pct_of_attainable_roofline": round(100 * row.ideal_ms_per_step / row.ms_per_step, 1)
        if row.ideal_ms_per_step and row.ms_per_step
        else None,
        "kernels_per_step": row.kernels_per_step,
        "priced": row.basis,
    }


def _matmul_finding(report: Report, p: PhaseLedger, row: LedgerRow, th: Thresholds) -> Finding | None:
    k = kern(report)
    top = _top_kernel(k, p.phase, row.families)
    kernel_ms = _kernel_ms(p)
    share = 100 * row.ms_per_step / kernel_ms if kernel_ms else 0.0
    named = slow_path(top) if top else None
    ev = _roof_evidence(p, row)
    ev["top_matmul_kernel"] = top[:100] if top else None
    shape = _launch_shape(k, p.phase, top)
    if shape:
        ev["top_matmul_launch_shape"] = shape
    if row.ideal_ms_per_step is None:
        # not priced (no model config): a dominant matmul path whose kernel names itself a fallback is named by that
        # evidence
        if named is None or share < th.slow_matmul_share_pct:
            return None
        recoverable, basis = (
            row.ms_per_step,
            "the slow path's own time (not priced: no model config or weights; an upper bound)",
        )
        ev["lever_basis"] = basis
    else:
        recoverable = row.recoverable_ms_per_step or 0.0
    pct = 100 * recoverable / p.step_ms if p.step_ms else 0.0
    severity = lever_severity(pct, p.steps, th)
    if severity is None:
        return None
    roof_pct = 100 * row.ideal_ms_per_step / row.ms_per_step if row.ideal_ms_per_step and row.ms_per_step else None
    slow = share >= th.slow_matmul_share_pct and (roof_pct is None or roof_pct < th.slow_matmul_roofline_pct)
    lever = phase_lever(p, row.part, recoverable)
    command = kernel_command(report, top, p.phase) if top else None
    if slow and (named is not None or roof_pct is not None):
        what, advice = (
            named
            if named is not None
            else (
                "a matmul path far below its roofline",
                "Another weight encoding or batch size may reach a tuned kernel; report the shape and GPU to Modular",
            )
        )
        if named is not None:
            ev["kernel_names_it"] = what
        at = (
            f" at {roof_pct:.0f} % of its attainable roofline"
            if roof_pct is not None
            else " (not priced: no model config)"
        )
        return Finding(
            id="matmul-slow-path",
            severity=severity,
            confidence=0.85 if named else 0.7,
            evidence=ev,
            lever=lever,  # type: ignore[arg-type]
            title=f"{p.phase.capitalize()} matmuls run through {what}: {share:.0f} % of its kernel time{at}; fixing it "
            "buys "
            f"{recoverable:.2f} ms of each {p.step_ms:.2f} ms step ({pct:.0f} %)",
            next_step=advice + ". A deep dive of the slow kernel in this phase shows why:",
            command=command,
        )
    return Finding(
        id="matmul-below-roofline",
        severity=severity,
        confidence=0.75,
        evidence=ev,
        lever=lever,  # type: ignore[arg-type]
        title=f"{p.phase.capitalize()} matmuls ({row.part.removeprefix('matmul: ')}) take {row.ms_per_step:.2f} ms per "
        "step where the roofline "
        f"allows {row.ideal_ms_per_step or 0:.2f} ms: {recoverable:.2f} ms of each {p.step_ms:.2f} ms step ({pct:.0f} "
        "%) to gain",
        next_step="Deep-dive the phase's top matmul kernel (the command keeps this run's batch and lengths and skips "
        "into the "
        "phase's launches); other batch sizes or weight encodings may reach tuned kernels.",
        command=command,
    )


def _launched_only_by_attention_ops(report: Report, phase: str, kernel: str) -> bool:
    """In an ops capture: whether every op that launched ``kernel`` in the phase does attention's work (its batched
    matmuls, softmax...), none the weights' matmuls."""
    ops = report.ops
    if not isinstance(ops, OpBreakdown):
        return False
    name = base_name(kernel)
    launching = [r for r in ops.rows if r.phase == phase and name in r.top_kernels]
    return bool(launching) and all(ATTENTION_PARTS.search(r.op) for r in launching)


def rule_matmul(report: Report, th: Thresholds) -> list[Finding]:
    """Each phase's matmuls against their roofline (the weights once, 2 FLOPs per weight per token): what they take over
    the ideal. Far below it while dominating the phase (``slow_matmul_*``): a slow kernel path, named by its kernel when
    the name says so (MAX's naive FP8 fallback); not priced (no config): named only by that evidence. In an ops capture
    the weights' ops are priced apart (op-below-roofline), and a slow kernel that only attention's ops launched is
    attention's verdict (unfused-attention carries its lever): the same time is never two levers."""
    lg = timeline_ledger(report)
    out = []
    for p in lg.phases if lg else []:
        row = _part(p, MATMUL_PART)
        if row is None or (f := _matmul_finding(report, p, row, th)) is None:
            continue
        if "kernel_names_it" not in f.evidence and op_groups(report, p.phase, WEIGHTS_PARTS):
            continue  # the ops moving the weights are priced apart from attention's ops (op-below-roofline)
        top = f.evidence.get("top_matmul_kernel")
        if isinstance(top, str) and _launched_only_by_attention_ops(report, p.phase, top):
            continue
        out.append(f)
    return out


def rule_attention(report: Report, th: Thresholds) -> list[Finding]:
    """Each phase's attention kernels against their roofline (the KV cache once, 4 FLOPs per head dim per cached
    token)."""
    lg = timeline_ledger(report)
    out = []
    for p in lg.phases if lg else []:
        row = _part(p, ATTENTION_PART)
        if row is None or row.recoverable_ms_per_step is None or op_groups(report, p.phase, (OP_ATTENTION,)):
            continue
        pct = 100 * row.recoverable_ms_per_step / p.step_ms if p.step_ms else 0.0
        severity = lever_severity(pct, p.steps, th)
        if severity is None:
            continue
        top = _top_kernel(kern(report), p.phase, ["attention"])
        out.append(
            Finding(
                id="attention-below-roofline",
                severity=severity,
                confidence=0.65,
                evidence=_roof_evidence(p, row),  # type: ignore[arg-type]
                lever=phase_lever(p, "attention", row.recoverable_ms_per_step),
                title=f"{p.phase.capitalize()} attention takes {row.ms_per_step:.2f} ms per step where the KV cache's "
                "bytes allow "
                f"{row.ideal_ms_per_step or 0:.2f} ms: {row.recoverable_ms_per_step:.2f} ms of each {p.step_ms:.2f} ms "
                f"step ({pct:.0f} %) to gain",
                next_step="Deep-dive the phase's top attention kernel (occupancy and stalls at this batch and "
                "context):",
                command=kernel_command(report, top, p.phase) if top else None,
            )
        )
    return out


def op_groups(report: Report, phase: str, parts: tuple[str, ...]) -> list[OpRoofline]:
    """The priced op groups of a phase (``--kernels ops`` captures with a model description and known peaks)."""
    ops = report.ops
    if not isinstance(ops, OpBreakdown):
        return []
    return [g for g in ops.priced if g.phase == phase and g.part in parts]


def op_top_kernel(report: Report, group: OpRoofline) -> str | None:
    """The top kernel the group's busiest op launched, by its name in the kernel table (for a deep dive)."""
    ops = report.ops
    rows = [r for r in ops.rows if r.phase == group.phase and r.op in group.ops] if isinstance(ops, OpBreakdown) else []
    top = max(rows, key=lambda r: r.gpu_ms).top_kernels[:1] if rows else []
    if not top:
        return None
    p = phase_of(k, group.phase) if (k := kern(report)) is not None else None
    named = next((r.name for r in p.top_kernels if base_name(r.name) == top[0]), None) if p is not None else None
    return named or top[0]


def rule_op_roofline(report: Report, th: Thresholds) -> list[Finding]:
    """Each priced group of MAX ops (``--kernels ops``: the layers' matmul ops, the output projection's, the ops doing
    attention's work) against its roofline: what the group takes over its ideal, a lever named by the ops. It replaces
    the phase's matmul / attention roofline verdicts, whose families mix the weights' matmuls with the batched matmuls
    of an attention written as ops; a matmul path whose kernel names itself a fallback keeps its own verdict
    (matmul-slow-path). An attention written as ops is unfused-attention's verdict, with this group's lever."""
    lg = timeline_ledger(report)
    ops = report.ops
    if lg is None or not isinstance(ops, OpBreakdown):
        return []
    out = []
    unfused = attention_unfused(report, th)
    for p in lg.phases:
        for g in op_groups(report, p.phase, WEIGHTS_PARTS if unfused else (*WEIGHTS_PARTS, OP_ATTENTION)):
            pct = 100 * g.recoverable_ms_per_step / p.step_ms if p.step_ms else 0.0
            severity = lever_severity(pct, p.steps, th)
            top = op_top_kernel(report, g)
            if severity is None or (g.part != OP_ATTENTION and top is not None and slow_path(top) is not None):
                continue
            far = g.pct_of_roofline < th.slow_matmul_roofline_pct
            names = ops_text(g)
            out.append(
                Finding(
                    id="op-below-roofline",
                    severity=severity,
                    confidence=0.7,
                    evidence={
                        "phase": p.phase,
                        "steps": p.steps,
                        "batch": p.batch,
                        "step_ms": round(p.step_ms, 4),
                        "ops": names,
                        "priced_as": g.part,
                        "ops_ms_per_step": round(g.ms_per_step, 4),
                        "ideal_ms_per_step": round(g.ideal_ms_per_step, 4),
                        "recoverable_ms_per_step": round(g.recoverable_ms_per_step, 4),
                        "pct_of_attainable_roofline": g.pct_of_roofline,
                        "kernels_per_step": g.kernels_per_step,
                        "top_kernel": top[:100] if top else None,
                        "priced": g.basis,
                    },
                    lever=phase_lever(p, f"ops: {names}", g.recoverable_ms_per_step),
                    title=f"{p.phase.capitalize()} op{'s' if len(g.ops) > 1 else ''} {names} ({g.part}) "
                    f"{'run' if len(g.ops) > 1 else 'runs'}{' far' if far else ''} below the roofline: "
                    f"{g.ms_per_step:.3f} ms per step where it allows {g.ideal_ms_per_step:.3f} ms "
                    f"({g.pct_of_roofline:.0f} %): {g.recoverable_ms_per_step:.3f} ms of each {p.step_ms:.2f} ms step "
                    f"({pct:.0f} %) to gain",
                    next_step=(
                        "Wire the architecture's attention to MAX's fused attention, or deep-dive the top kernel these "
                        "ops launch (the command keeps this run's batch and lengths):"
                        if g.part == OP_ATTENTION and len(g.ops) > 1
                        else "Deep-dive the top kernel this op launches (the command keeps this run's batch and "
                        "lengths and skips into the phase's launches):"
                    ),
                    command=kernel_command(report, top, p.phase) if top else None,
                )
            )
    return out


# ---------------------------------------------------------------------------------------------
# Time outside the steps, and load


def rule_outside_steps(report: Report, th: Thresholds) -> list[Finding]:
    """The window's load first: requests in flight (serve, attach) or steps running (run) under ``light_load_pct`` →
    lightly loaded, and no host-bound / idle verdict is drawn. Otherwise the time outside every step is a lever of its
    own."""
    share, what = load_share(report)
    lg = ledger(report)
    if share is not None and share < th.light_load_pct:
        ev: dict[str, float | int | str | None] = {
            "loaded_pct": round(share, 1),
            "measured_as": what,
            "threshold_pct": th.light_load_pct,
        }
        rate = (
            lg.request_rate_rps
            if lg is not None and lg.request_rate_rps is not None
            else report.window_load.request_rate_rps
            if report.window_load
            else None
        )
        if rate is not None:
            ev["requests_per_s"] = rate
        if report.window_load is not None:
            ev["output_tok_per_s"] = report.window_load.output_tok_per_s
        if lg is not None:
            ev["outside_steps_pct"] = lg.outside_steps_pct
        u = util(report)
        if u and u.gpus:
            ev["mean_gpu_utilization_pct"] = round(max(g.mean_utilization_pct or 0.0 for g in u.gpus), 1)
        rate_text = f", {rate:.2f} requests/s" if rate is not None else ""
        return [
            Finding(
                id="lightly-loaded",
                severity="info",
                confidence=0.8,
                evidence=ev,
                title=f"Lightly loaded: {what} only {share:.0f} % of the window{rate_text}: GPU utilization and idle "
                "time here say "
                "nothing about the model (no host-bound verdict without load)",
                next_step="Measure under load: a sweep of our own (`--concurrency 1,4,16`) on the server, or, for a "
                "generation, profile it while it runs (more steps, less in between):",
                command=attach_command(report, concurrency="1,4,16")
                or (for_model(report, "serve", concurrency="1,4,16", yes=True) if report.serve is not None else None),
            )
        ]
    if lg is None or lg.source == LedgerSource.SERVER_METRICS:
        return []
    steps = sum(p.steps for p in lg.phases)
    if not steps or not lg.window_ms:
        return []
    pct = lg.outside_steps_pct
    per_step = lg.outside_steps_ms / steps
    severity = lever_severity(pct, steps, th)
    if severity is None:
        return []
    return [
        Finding(
            id="time-outside-steps",
            severity=severity,
            confidence=0.7,  # type: ignore[arg-type]
            lever=Lever(
                phase="outside steps",
                part="time between steps",
                ms_per_step=round(per_step, 4),
                pct_of_step=round(pct, 1),
                total_ms=round(lg.outside_steps_ms, 3),
            ),
            evidence={
                "outside_steps_ms": lg.outside_steps_ms,
                "outside_steps_pct": pct,
                "kernels_launched_outside_ms": lg.outside_kernels_ms,
                "steps": steps,
                "window_ms": lg.window_ms,
            },
            title=f"{pct:.0f} % of the window ({lg.outside_steps_ms:.1f} ms, {per_step:.2f} ms per step) passed "
            "between steps, where no step ran",
            next_step="Between two executes the host runs the generation loop (scheduling, detokenization, streaming) "
            "or waits for work: "
            "see where with py-spy:",
            command=_host_command(report),
        )
    ]


# ---------------------------------------------------------------------------------------------
# Healthy verdicts and summaries


def rule_healthy_decode(report: Report, th: Thresholds) -> list[Finding]:
    """A decode dominated by matrix products with no lever at warning size left in its ledger: matrix-vector products at
    batch 1 (healthy dense decode, memory-bound), matrix products at batch >= ``batched_decode_min_batch``. Without a
    ledger (a trace without steps) the capture's kernel mix is read, with lower confidence."""
    k = kern(report)
    if not k or k.unreliable or not gpu_kernels(k):
        return []
    d = phase_of(k, "decode")
    if d is None and k.phases:
        return []
    families = d.families if d else k.families
    if not families:
        return []
    top = families[0]
    lg = timeline_ledger(report)
    dl = next((p for p in lg.phases if p.phase == "decode"), None) if lg else None
    ev: dict[str, float | int | str | None] = {
        "top_family": top.family,
        "top_family_share_pct": round(top.share_pct, 1),
        "top_families": ",".join(r.family for r in families[:4]),
    }
    if dl is not None:
        worst = worst_lever_pct(dl)
        if worst >= th.lever_warning_pct:
            return []
        ev.update(
            {
                "largest_lever_pct_of_step": round(worst, 1),
                "decode_step_ms": round(dl.step_ms, 4),
                "recoverable_ms_per_step": round(dl.recoverable_ms_per_step, 4),
                "batch": dl.batch,
            }
        )
        if dl.ideal_ms_per_step:
            ev["pct_of_ideal_step"] = round(100 * dl.ideal_ms_per_step / dl.step_ms, 1)
    batch = dl.batch if dl is not None else (report.decode_cost.batch if report.decode_cost else 1)
    if batch is not None and batch >= th.batched_decode_min_batch:
        if dl is None or top.family not in ("gemm", "gemv", "grouped_matmul"):
            return []
        return [
            Finding(
                id="healthy-batched-decode",
                severity="info",
                confidence=0.75,
                evidence=ev,
                title=f"Healthy batched decode: {batch} requests per step, matrix products ({top.family}) dominate and "
                "every part is "
                f"within {th.lever_warning_pct:g} % of the step of its roofline",
            )
        ]
    gemv = next((r for r in families if r.family == "gemv"), None)
    if top.family != "gemv" or gemv is None or gemv.share_pct < th.healthy_gemv_share_pct:
        return []
    then = ", ".join(r.family for r in families[1:3])  # the next two families
    ev["gemv_share_pct"] = round(gemv.share_pct, 1)
    if d is not None:
        ev["decode_kernel_us_per_token"] = round(d.kernel_us_per_token or 0, 2)
        title = "Healthy dense decode: matrix-vector products dominate (memory-bound), then " + then
        confidence = 0.8
    else:
        ev["scope"] = "whole capture (no phase ranges)"
        title = (
            "Matrix-vector products dominate the capture: a memory-bound dense decode (no phase ranges: whole "
            "capture), then " + then
        )
        confidence = 0.8 * th.no_phase_confidence_scale
    return [
        Finding(id="healthy-dense-decode", severity="info", title=title, evidence=ev, confidence=round(confidence, 2))
    ]


def rule_gpu_bound(report: Report, th: Thresholds) -> list[Finding]:
    """The GPU is busy nearly all the time: the kernels below are where the time goes."""
    k = kern(report)
    if not k or not gpu_kernels(k) or k.unreliable:
        return []
    lg = timeline_ledger(report)
    dl = next((p for p in lg.phases if p.phase == "decode"), None) if lg else None
    busy: float | None
    if dl is not None:
        busy, scope = dl.busy_pct, "decode"
    else:
        d = phase_of(k, "decode")
        busy, scope = (
            (d.gpu_busy_pct, "decode") if d is not None else (k.gpu_busy_pct if not k.phases else None, "capture")
        )
    if busy is None or busy < th.gpu_bound_busy_pct:
        return []
    where = "decode steps" if scope == "decode" else "capture window (no phase ranges: whole capture)"
    return [
        Finding(
            id="gpu-bound",
            severity="info",
            title=f"GPU-bound: kernels ran {busy:.0f}% of the {where}; the kernel mix is where the time goes",
            evidence={
                "gpu_busy_pct": round(busy, 1),
                "scope": scope,
                "top_family": k.families[0].family if k.families else None,
                "threshold_pct": th.gpu_bound_busy_pct,
            },
            confidence=round(0.8 * (th.no_phase_confidence_scale if scope == "capture" else 1.0), 2),
        )
    ]


def rule_decode_bandwidth(report: Report, th: Thresholds) -> list[Finding]:
    """Decode's bytes (weights once + the KV cache of every request) over the step time, against peak bandwidth: the
    summary number (the ledger's levers say where the rest of the step goes)."""
    c = report.decode_cost  # its RuleSpec needs decode_cost and a GPU: the engine runs it only with both
    if c is None or c.step.pct_of_peak_bandwidth is None:
        return []
    ev: dict[str, float | int | str | None] = {
        "batch": c.batch,
        "context_tokens": c.context_tokens,
        "weight_bytes_per_step": round(c.weight_bytes),
        "kv_bytes_per_step": round(c.kv_bytes),
        "bytes_per_step": round(c.weight_bytes + c.kv_bytes + c.embedding_bytes),
        "decode_step_p50_ms": c.step.ms_per_step,
        "achieved_GBps": c.step.achieved_GBps,
        "peak_GBps": c.peak_bandwidth_GBps,
        "pct_of_peak": c.step.pct_of_peak_bandwidth,
        "gpu": c.gpu,
        "weights": c.weights_basis,
    }
    if c.kernels is not None:
        ev["pct_of_peak_kernel_time"] = c.kernels.pct_of_peak_bandwidth
    return [
        Finding(
            id="decode-bandwidth",
            severity="info",
            evidence=ev,
            confidence=0.6,
            title=f"Decode reads memory at {c.step.pct_of_peak_bandwidth:.0f}% of the GPU's peak bandwidth (weights + "
            "KV cache per step)",
        )
    ]
