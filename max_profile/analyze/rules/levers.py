"""Verdicts about where the time goes, read off the step ledger (:mod:`~max_profile.analyze.ledger`).

Each lever is one part of a phase's step that is not at its ideal: the GPU idle inside the step, the matmuls or the
attention below their roofline, the time outside every step. Its finding says what fixing it buys (ms per step, % of
the step, ms over the capture: what the engine ranks by) and carries a next command that reproduces the capture. Its
severity follows its size (``Thresholds.lever_warning_pct`` / ``lever_info_pct``). A "healthy" verdict is given only
where no lever at warning size remains in the phase; a load verdict (host-bound, GPU idle) only where there was load.
"""

from __future__ import annotations

import msgspec

from max_profile.analyze.commands import attach_command, for_model, kernel_command, program, shell
from max_profile.analyze.families import base_name, slow_path
from max_profile.analyze.ledger import ATTENTION_PART, MATMUL_PART
from max_profile.analyze.op_roofline import ATTENTION as OP_ATTENTION
from max_profile.analyze.op_roofline import LAYERS, OUTPUT, WEIGHTS
from max_profile.analyze.ops import ATTENTION_PARTS
from max_profile.analyze.rules.base import (
    attention_unfused,
    gpu_kernels,
    kern,
    ledger,
    lever_severity,
    load_share,
    phase_lever,
    phase_of,
    timeline_ledger,
    util,
    worst_lever_pct,
)
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import (
    Command,
    Finding,
    KernelBreakdown,
    LedgerRow,
    Lever,
    OpBreakdown,
    OpRoofline,
    PhaseLedger,
    Report,
    StepLedger,
)
from max_profile.model.command_text import cli
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


def _host_command(report: Report) -> Command | None:
    """py-spy on the capture's own run (a server: the same serve capture, its worker followed) with the kernel tracer
    off: where the host's time goes per step. Without ``--native``: its native stacks did not get past a model's load in
    5 minutes where the Python stacks took 11 s."""
    pip, spy = program(report, "pip"), program(report, "py-spy")
    attached = report.serve is not None and report.serve.mode == "attach"
    if attached:  # the server that was attached, not a new one: its process here, found by its port
        pid = report.serve.pid if report.serve is not None else None
        if pid is None:
            return None
        seconds = max(int(round((report.ledger.window_ms if isinstance(report.ledger, StepLedger) else 10e3) / 1e3)), 1)
        return shell(
            f"{pip} install py-spy && {spy} record --pid {pid} --subprocesses --duration {seconds} -o host.svg",
            comment="where the attached server's host time goes (its processes, found by its port)",
        )
    served = report.serve is not None
    inner = (
        for_model(report, "serve", mode="utilization", yes=True) if served else for_model(report, "run", kernels="off")
    )
    line = f"{pip} install py-spy && {spy} record {'--subprocesses ' if served else ''}-o host.svg -- " + cli(
        msgspec.structs.replace(inner, comment=None)
    )
    why = "where the server's host time goes per step" if served else "where the host's time goes per step"
    return shell(line, comment=f"{inner.comment}; {why}" if inner.comment else why)


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
            f"buys {recoverable:.2f} ms of each {p.step_ms:.2f} ms step ({pct:.0f} %)",
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
        "into the phase's launches); other batch sizes or weight encodings may reach tuned kernels.",
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
                f"bytes allow {row.ideal_ms_per_step or 0:.2f} ms: {row.recoverable_ms_per_step:.2f} ms of each "
                f"{p.step_ms:.2f} ms step ({pct:.0f} %) to gain",
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
            names = g.ops_text
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
    host = _host_command(report)
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
            "or waits for work: see where with py-spy"
            + (":" if host is not None else " on the server's own machine (py-spy record --pid of its process)."),
            command=host,
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
        "kv_bytes_per_step": round(c.kv_bytes) if c.kv_bytes is not None else None,
        "bytes_per_step": round(c.weight_bytes + (c.kv_bytes or 0.0) + c.embedding_bytes),
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
