"""The kernel mix: fused attention and norms present, MoE routing against the experts, low-bit quantization prep
against the matmuls, collectives across GPUs. Judged by which kernels ran and their shares, not by their time against a
roofline."""

from __future__ import annotations

from max_profile.analyze.commands import kernel_command
from max_profile.analyze.families import slow_path
from max_profile.analyze.op_roofline import ATTENTION as OP_ATTENTION
from max_profile.analyze.ops import attention_stand_ins, op_label
from max_profile.analyze.rules.base import (
    attention_presence,
    attention_unfused,
    fam_ms,
    gpu_kernels,
    kern,
    ledger_phase,
    phase_lever,
    phase_of,
    worst_lever_pct,
)
from max_profile.analyze.rules.levers import op_groups, op_top_kernel
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Command, Finding, Lever, OpBreakdown, Report


def _top_kernel_command(report: Report, families: tuple[str, ...]) -> Command | None:
    """A deep dive of the top decode kernel (or top kernel) of these families, its launches in decode."""
    k = kern(report)
    if not k:
        return None
    d = phase_of(k, "decode")
    rows = d.top_kernels if d else k.top_kernels
    top = next((r for r in rows if r.family in families), None)
    return kernel_command(report, top.name, "decode" if d else None) if top else None


def rule_unfused(report: Report, th: Thresholds) -> list[Finding]:
    """A decoder whose kernels show no fused attention / norm: a wiring problem at bring-up.

    Attention is judged by presence (attention kernels per decode step), never by its share of time: a slow
    matmul elsewhere (an FP8 fallback) makes a fused attention's share ~0 without anything being unfused.
    """
    k = kern(report)
    if not k or k.unreliable or not k.kernels:
        return []
    rows = k.families
    if not any(r.family in ("gemm", "gemv", "grouped_matmul") for r in rows):
        return []
    out = []
    lever: Lever | None = None
    command: Command | None = None
    if attention_unfused(report, th):
        per_step, scope, count = attention_presence(k)
        assert per_step is not None
        total = sum(r.total_ms for r in rows) or 1.0
        ev: dict[str, float | int | str | None] = {
            "attention_kernels": count,
            "attention_kernels_per_decode_step" if scope == "decode" else "attention_kernels_in_capture": round(
                per_step, 2
            ),
            "attention_share_pct": round(100.0 * fam_ms(rows, "attention") / total, 3),
            "matmul_ms": round(fam_ms(rows, "gemm") + fam_ms(rows, "gemv"), 3),
            "elementwise_ms": round(fam_ms(rows, "elementwise") + fam_ms(rows, "activation"), 3),
            "top_families": ",".join(r.family for r in rows[:5]),
            "source": k.source,
            "threshold_per_step": th.min_attention_kernels_per_step,
        }
        title = "No fused attention kernel: attention runs as generic matmul / softmax / elementwise ops"
        if isinstance(report.ops, OpBreakdown):
            phase, parts = attention_stand_ins(report.ops)
            if parts:
                steps = next((c.steps for c in report.ops.coverage if c.phase == phase), 0) or 1
                share = sum(r.share_pct for r in parts)
                ev["attention_ops"] = "; ".join(f"{op_label(r.op)} {r.share_pct:.1f} %" for r in parts)
                ev["attention_ops_share_pct"] = round(share, 1)
                ev["attention_ops_ms_per_step"] = round(sum(r.gpu_ms for r in parts) / steps, 4)
                title = (
                    "No fused attention kernel: attention runs as separate MAX ops ("
                    + ", ".join(op_label(r.op) for r in parts)
                    + f"): {share:.1f} % of {phase} kernel time"
                )
            lever, command = _attention_ops_lever(report, ev)
        out.append(
            Finding(
                id="unfused-attention",
                severity="warning",
                title=title,
                evidence=ev,
                confidence=0.75 if scope == "decode" else round(0.75 * th.no_phase_confidence_scale, 2),
                next_step="Wire the architecture's attention to MAX's fused attention (e.g. the KV-cache-aware "
                "attention layers in max.nn that launch *_mha_* kernels) and compare this breakdown again"
                + (": the top kernel the attention ops launch, in this phase:" if command is not None else "."),
                lever=lever,
                command=command,
            )
        )
    # RoPE is fused into other kernels by MAX on GPUs (no kernel carries its name on the H200),
    # so only the norm is checked by name.
    for family, what in (("norm", "RMS norm"),):
        if fam_ms(rows, family) <= 0 and k.kernels > th.unfused_norm_min_kernels:
            out.append(
                Finding(
                    id=f"unfused-{family}",
                    severity="info",
                    title=f"No fused {what} kernel in the trace",
                    evidence={
                        "family": family,
                        "kernels": k.kernels,
                        "top_families": ",".join(r.family for r in rows[:5]),
                    },
                    confidence=0.5,
                    next_step=f"If the architecture uses {what}, check it is built from MAX's fused op rather than "
                    "elementwise pieces.",
                )
            )
    return out


def rule_moe(report: Report, th: Thresholds) -> list[Finding]:
    k = kern(report)
    if not k or not gpu_kernels(k):
        return []
    scope = phase_of(k, "decode")
    rows = scope.families if scope else k.families
    grouped = fam_ms(rows, "grouped_matmul")
    routing = fam_ms(rows, "moe_routing") + fam_ms(rows, "gather_scatter")
    if grouped <= 0 or fam_ms(rows, "moe_routing") <= 0:
        return []
    ratio = routing / grouped
    ev: dict[str, float | int | str | None] = {
        "grouped_matmul_ms": round(grouped, 3),
        "routing_and_gather_ms": round(routing, 3),
        "ratio": round(ratio, 2),
        "threshold": th.routing_vs_matmul_ratio,
    }
    if ratio >= th.routing_vs_matmul_ratio:
        return [
            Finding(
                id="moe-routing-heavy",
                severity="warning",
                title="MoE routing and gather/scatter rival the expert matmuls",
                evidence=ev,
                confidence=0.7,
                next_step="Look at the top routing/gather kernels in the table; a single-kernel deep dive shows "
                "whether they are latency-bound.",
                command=_top_kernel_command(report, ("moe_routing", "gather_scatter")),
            )
        ]
    dl = ledger_phase(report, "decode")
    if dl is not None and worst_lever_pct(dl) >= th.lever_warning_pct:
        return []  # a lever at warning size remains in decode: not healthy (the lever's finding says which)
    return [
        Finding(
            id="healthy-moe",
            severity="info",
            title="Healthy MoE: grouped expert matmuls dominate; routing cost is expected",
            evidence=ev,
            confidence=0.7,
        )
    ]


def rule_quant_prep(report: Report, th: Thresholds) -> list[Finding]:
    k = kern(report)
    if not k or not gpu_kernels(k):
        return []
    rows = k.families
    quant = fam_ms(rows, "quantize")
    matmul = fam_ms(rows, "grouped_matmul") + fam_ms(rows, "gemm") + fam_ms(rows, "gemv")
    if quant <= 0 or matmul <= 0:
        return []
    ratio = quant / matmul
    ev: dict[str, float | int | str | None] = {
        "quantize_ms": round(quant, 3),
        "matmul_ms": round(matmul, 3),
        "ratio": round(ratio, 4),
    }
    if ratio > th.quant_vs_matmul_ratio:
        return [
            Finding(
                id="quant-prep-heavy",
                severity="warning",
                title="Low-bit quantization prep takes longer than the matmuls it feeds",
                evidence=ev,
                confidence=0.7,
                next_step="Deep-dive the top quantize kernel and check the scale layout matches the matmul's.",
                command=_top_kernel_command(report, ("quantize",)),
            )
        ]
    return [
        Finding(
            id="low-bit-normal",
            severity="info",
            title="Low-bit weights: activation quantization and scale layout present at normal cost",
            evidence=ev,
            confidence=0.6,
        )
    ]


def rule_slow_path_kernels(report: Report, th: Thresholds) -> list[Finding]:
    """Kernels that name themselves a slow path (a naive / fallback / reference kernel: :data:`~max_profile.analyze.
    families.SLOW_PATHS`) holding at least ``slow_path_share_pct`` of the kernel time (decode's, else the capture's):
    judged by their names alone, in every source, with steps and a model config or without. Where the step ledger
    prices the same matmuls, its matmul-slow-path says it with the lever instead."""
    k = kern(report)
    if not k or not gpu_kernels(k):
        return []
    d = phase_of(k, "decode")
    rows = d.top_kernels if d is not None else k.top_kernels
    slow = [(r, named) for r in rows if (named := slow_path(r.name)) is not None]
    share = sum(r.share_pct for r, _ in slow)
    if not slow or share < th.slow_path_share_pct:
        return []
    top, (what, advice) = max(slow, key=lambda x: x[0].share_pct)
    scope = "decode kernel time" if d is not None else "the capture's kernel time (no phase ranges)"
    return [
        Finding(
            id="kernel-slow-path",
            severity="warning",
            confidence=0.8,
            title=f"{what} ran {share:.0f} % of {scope}: a slow path, not the tuned kernel",
            evidence={
                "slow_path_share_pct": round(share, 1),
                "scope": "decode" if d is not None else "capture",
                "top_slow_kernel": top.name[:100],
                "top_slow_kernel_ms": round(top.total_ms, 3),
                "kernels": ",".join(r.name[:60] for r, _ in slow[:3]),
                "threshold_pct": th.slow_path_share_pct,
            },
            next_step=advice + ". Deep-dive the kernel to see what it runs at:",
            command=kernel_command(report, top.name, "decode" if d is not None else None),
        )
    ]


def rule_communication(report: Report, th: Thresholds) -> list[Finding]:
    """Multi-GPU decode where collectives (allreduce, EP dispatch/combine) take a large share of kernel time."""
    k = kern(report)
    if not k or len(k.per_device) < 2:
        return []
    shares = [d.collective_share_of_decode_pct for d in k.per_device if d.collective_share_of_decode_pct is not None]
    if not shares:
        return []
    worst = max(k.per_device, key=lambda d: d.collective_share_of_decode_pct or 0.0)
    ev: dict[str, float | int | str | None] = {
        "devices": len(k.per_device),
        "max_collective_share_of_decode_pct": round(worst.collective_share_of_decode_pct or 0.0, 1),
        "device": worst.device,
        "collective_ms_per_decode_step": round(worst.collective_ms_per_decode_step or 0.0, 4),
        "threshold_pct": th.communication_share_pct,
    }
    if (worst.collective_share_of_decode_pct or 0.0) >= th.communication_share_pct:
        return [
            Finding(
                id="communication-dominates",
                severity="warning",
                confidence=0.7,
                evidence=ev,
                title="Collectives take a large share of each decode step: communication, not compute, limits "
                "tensor/expert parallelism",
                next_step="Try fewer GPUs per replica (or data parallelism), check NVLink/P2P is used (nvidia-smi topo "
                "-m), and compare allreduce time per step against its size.",
            )
        ]
    return [
        Finding(
            id="communication-share",
            severity="info",
            confidence=0.6,
            evidence=ev,
            title="Collective share of decode kernel time per GPU is moderate",
        )
    ]


def _attention_ops_lever(
    report: Report, ev: dict[str, float | int | str | None]
) -> tuple[Lever | None, Command | None]:
    """The priced group of the ops doing attention's work (an ops capture with a model description): what it takes over
    its roofline is the unfused attention's lever (op-below-roofline leaves that group to this finding), with a deep
    dive of its top kernel."""
    for g in (g for p in ("decode", "prefill", "mixed") for g in op_groups(report, p, (OP_ATTENTION,))):
        lp = ledger_phase(report, g.phase)
        if lp is None:
            continue
        ev["attention_ops_ideal_ms_per_step"] = round(g.ideal_ms_per_step, 4)
        ev["attention_ops_recoverable_ms_per_step"] = round(g.recoverable_ms_per_step, 4)
        ev["attention_ops_pct_of_roofline"] = g.pct_of_roofline
        top = op_top_kernel(report, g)
        command = kernel_command(report, top, g.phase) if top else None
        return phase_lever(lp, f"ops: {g.ops_text}", g.recoverable_ms_per_step), command
    return None, None
