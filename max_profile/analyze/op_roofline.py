"""MAX's ops priced by the step's bytes-and-FLOPs model (``--kernels ops`` on a GPU): which ops move the weights and
which do attention's work, and how far each group runs from its roofline.

MAX's op ranges carry an op's name, not its operands' shapes; the shapes come from the model's description, the same
model the step ledger prices its parts with (:func:`~max_profile.analyze.ledger.phase_step_cost`):

- **weights**: the ops whose kernels are matmuls (gemv / gemm / grouped). The output projection runs once per step and
  the layers' matmuls a multiple of the layer count per step, so where the call counts tell them apart, the op(s) of
  the layers get the layers' weights and the other matmul op(s) the output projection's; otherwise they are priced
  together.
- **attention**: a fused attention op (its kernels are attention kernels), or the generic ops that stand in for one
  (batched matmuls, softmax, KV rows gathered out of the paged cache: :data:`~max_profile.analyze.ops.ATTENTION_PARTS`),
  priced together at the KV cache read once and attention's FLOPs. Ops standing in for attention are priced here, not
  as weights, even where their kernels are matmuls.

An op group's ideal is the roofline's time at the attainable share of the peaks, never below its kernels' floor (the
ledger's rule); ``pct_of_roofline`` = ideal / actual. Ops the model does not price (norms, elementwise, sampling) get
no figure. Equivalent by hand: the op's kernels under ``ncu --metrics dram__bytes.sum`` against its shapes' bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from max_profile.analyze.families import classify_kernel
from max_profile.analyze.ledger import Roofs, ideal_ms, phase_step_cost, roofs_for
from max_profile.analyze.ops import ATTENTION_PARTS, UNATTRIBUTED, op_label
from max_profile.analyze.roofline import MATMUL_FAMILIES, weight_operand
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import ModelWeights, OpBreakdown, OpRoofline, OpRow, Step

WEIGHTS, LAYERS, OUTPUT, ATTENTION = "weights", "weights: layers", "weights: output projection", "attention"


def op_role(row: OpRow) -> str | None:
    """``attention`` for an op doing attention's work (a fused attention kernel, or a generic op standing in for one),
    ``weights`` for a matmul op, None for ops the step's model does not price."""
    if not row.kernels or row.op == UNATTRIBUTED:
        return None
    if ATTENTION_PARTS.search(row.op):
        return ATTENTION
    family = classify_kernel(row.top_kernels[0]) if row.top_kernels else None
    if family == "attention":
        return ATTENTION
    return WEIGHTS if family in MATMUL_FAMILIES else None


def split_weight_ops(rows: Sequence[OpRow], steps: int, layers: int) -> list[tuple[str, list[OpRow]]]:
    """The matmul ops of a phase as priced groups: the layers' ops (calls per step a whole multiple of ``layers``) apart
    from the output projection's (the others) where both exist; else one group of all of them."""
    if len(rows) > 1 and layers > 0 and steps > 0:
        per_layer = [r for r in rows if r.calls % (steps * layers) == 0]
        rest = [r for r in rows if r not in per_layer]
        if per_layer and rest:
            return [(LAYERS, per_layer), (OUTPUT, rest)]
    return [(WEIGHTS, list(rows))] if rows else []


def _group(
    phase: Any, part: str, rows: Sequence[OpRow], steps: int, bytes_: float, flops: float, roofs: Roofs, th: Thresholds
) -> OpRoofline:
    ms = sum(r.gpu_ms for r in rows) / steps
    kernels = sum(r.kernels for r in rows) / steps
    roof, floor = ideal_ms(bytes_, flops, roofs), kernels * th.kernel_floor_us / 1e3
    ideal = max(roof, floor)
    how = {
        WEIGHTS: "all the matmul weights a step reads",
        LAYERS: "the layers' weights (calls per step a multiple of the layer count)",
        OUTPUT: "the output projection's weights (the matmul op(s) not called per layer)",
        ATTENTION: "the KV cache read once and attention's FLOPs",
    }[part]
    basis = (
        f"{how}: {bytes_ / 1e9:.3g} GB, {flops / 1e12:.3g} TFLOP at {roofs.basis}"
        if roof >= floor
        else f"{how}; {kernels:.0f} kernels at {th.kernel_floor_us:g} µs each (the roofline's {roof * 1e3:.1f} µs is "
        "below that floor)"
    )
    return OpRoofline(
        phase=phase,
        part=part,
        ops=[r.op for r in rows],
        labels=[op_label(r.op) for r in rows],
        ms_per_step=round(ms, 6),
        kernels_per_step=round(kernels, 2),
        bytes_per_step=float(round(bytes_)),
        flops_per_step=float(round(flops)),
        ideal_ms_per_step=round(ideal, 6),
        recoverable_ms_per_step=round(max(ms - ideal, 0.0), 6),
        pct_of_roofline=round(100 * ideal / ms, 1) if ms > 0 else 100.0,
        basis=basis,
    )


def price_ops(
    ops: OpBreakdown,
    steps: Sequence[Step],
    model_config: dict[str, Any] | None,
    weights: ModelWeights | None,
    gpu: str | None,
    th: Thresholds,
) -> list[OpRoofline]:
    """The priced op groups of every phase with steps (see the module docstring); none without a model description or
    the GPU's peaks."""
    cfg = dict(model_config or {})
    roofs = roofs_for(gpu, weight_operand(cfg, weights), th) if cfg or weights else None
    if roofs is None:
        return []
    layers = int(cfg.get("num_hidden_layers") or 0)
    out: list[OpRoofline] = []
    for cov in ops.coverage:
        cost = phase_step_cost(steps, cov.phase, cfg, weights)[2]
        if cost is None or cov.steps <= 0:
            continue
        rows = [r for r in ops.rows if r.phase == cov.phase]
        matmuls = [r for r in rows if op_role(r) == WEIGHTS]
        for part, group in split_weight_ops(matmuls, cov.steps, layers):
            out_b, out_f = cost["output_bytes"], cost["output_flops"]
            b, f = {
                WEIGHTS: (cost["weight_bytes"], cost["matmul_flops"]),
                LAYERS: (cost["weight_bytes"] - out_b, cost["matmul_flops"] - out_f),
                OUTPUT: (out_b, out_f),
            }[part]
            out.append(_group(cov.phase, part, group, cov.steps, b, f, roofs, th))
        attention = [r for r in rows if op_role(r) == ATTENTION]
        if attention and cost["kv_bytes"]:  # None: the steps carry no context lengths, not priced
            out.append(
                _group(cov.phase, ATTENTION, attention, cov.steps, cost["kv_bytes"], cost["attention_flops"], roofs, th)
            )
    return out
