"""MAX's ops against the roofline (``--kernels ops`` on the H200): which ops carry the weights and attention, their
bytes and FLOPs from the model's own description, and the verdict that names an op far from its ideal.

Truth is computed here from first principles: the stored weights' byte counts (safetensors headers, recorded in the
capture), 2 FLOPs per weight element per token, the H200's datasheet peaks at the attainable shares, the 2 µs kernel
floor; the op rows' GPU time is the joined table's (tested in test_ops_join / test_ops_edges)."""

from __future__ import annotations

import statistics
from pathlib import Path

import msgspec
import pytest

from max_profile.analyze.op_roofline import ATTENTION, LAYERS, OUTPUT, WEIGHTS, op_role, price_ops, split_weight_ops
from max_profile.analyze.ops import UNATTRIBUTED, op_label
from max_profile.analyze.rules import evaluate
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import OpBreakdown, OpRoofline, OpRow, RawCapture, Report

from ..builders import built_report, serve_summary

H200 = Path(__file__).parents[1] / "data" / "gpu"
OPS_A = (
    H200 / "h200_llama_custom_ops_vs_default" / "ops_a_raw.json.gz"
)  # the fused Llama, custom architecture, --kernels ops
OPS_B = (
    H200 / "h200_llama_custom_ops_mode" / "ops_b_raw.json.gz"
)  # the same Llama with attention written as generic ops
DEFAULT_A = (
    H200 / "h200_llama_custom_ops_vs_default" / "default_a_raw.json.gz"
)  # ops_a's model in MAX's default run (no op ranges)
BANDWIDTH = 0.85 * 4.8e12  # H200: 85 % of 4.8 TB/s
COMPUTE = 0.80 * 989e12  # 80 % of 989 bf16 TFLOP/s
FLOOR_MS = 2.0e-3  # 2 µs per kernel

report = built_report


def groups(r: Report, phase: str) -> dict[str, OpRoofline]:
    assert isinstance(r.ops, OpBreakdown)
    return {g.part: g for g in r.ops.priced if g.phase == phase}


def rows(r: Report, phase: str) -> dict[str, OpRow]:
    assert isinstance(r.ops, OpBreakdown)
    return {row.op: row for row in r.ops.rows if row.phase == phase}


def exact(v: float) -> object:
    return pytest.approx(v, rel=1e-9, abs=1e-9)


def test_the_layers_and_the_output_projection_get_their_own_weights() -> None:
    raw = RawCapture.load(str(OPS_A))
    w = raw.capture.model_weights
    assert w is not None and not w.tied_embeddings
    layers_b, layers_e = w.groups["layers"].bytes, w.groups["layers"].elements
    head_b, head_e = w.groups["lm_head"].bytes, w.groups["lm_head"].elements
    r = report(OPS_A)
    for phase, tokens in (("prefill", None), ("decode", 1)):
        g = groups(r, phase)
        assert set(g) == {LAYERS, OUTPUT, ATTENTION}
        ops = rows(r, phase)
        steps = 1 if phase == "prefill" else 64
        layer_ops = ops["matmulmo.matmul"]
        assert layer_ops.calls == 32 * steps  # 4 matmuls per layer, 8 layers
        assert g[LAYERS].ops == ["matmulmo.matmul"]
        assert g[OUTPUT].ops == ["matmulEpilogue(mo.matmul, mo.cast, operandIndices=[0])"]
        assert g[LAYERS].bytes_per_step == layers_b
        assert g[OUTPUT].bytes_per_step == head_b
        n = tokens or r.ledger.phases[0].tokens_per_step  # type: ignore[union-attr]
        assert g[LAYERS].flops_per_step == exact(2.0 * n * layers_e)
        assert g[OUTPUT].flops_per_step == exact(2.0 * 1 * head_e)  # the last token's logits only
        ms = layer_ops.gpu_ms / steps
        assert g[LAYERS].ms_per_step == exact(round(ms, 6))
        assert g[LAYERS].kernels_per_step == 32.0
        ideal = max(1e3 * layers_b / BANDWIDTH, 1e3 * 2.0 * n * layers_e / COMPUTE, 32 * FLOOR_MS)
        assert g[LAYERS].ideal_ms_per_step == exact(round(ideal, 6))
        assert g[LAYERS].recoverable_ms_per_step == exact(round(ms - ideal, 6))
        assert g[LAYERS].pct_of_roofline == round(100 * ideal / ms, 1)
        assert g[LAYERS].basis.startswith("the layers' weights")
        assert "85 % of 4.80 TB/s" in g[LAYERS].basis
    # one token at batch 1: the output projection's 1.3 MB take 0.3 µs at the roofline, under one kernel's floor
    out = groups(r, "decode")[OUTPUT]
    assert out.ideal_ms_per_step == FLOOR_MS and "below that floor" in out.basis


def test_attention_is_priced_at_the_kv_cache_fused_or_written_as_ops() -> None:
    fused, unfused = groups(report(OPS_A), "decode")[ATTENTION], groups(report(OPS_B), "decode")[ATTENTION]
    assert fused.ops == ["flash_attention"]
    # attention as generic ops: the batched matmuls (matmul kernels: priced as attention, not as weights), the KV rows
    # gathered out of the paged cache, the softmax
    assert sorted(unfused.ops) == sorted(
        op for op in rows(report(OPS_B), "decode") if op_role(rows(report(OPS_B), "decode")[op]) == ATTENTION
    )
    assert "batched_matmul" in unfused.ops and len(unfused.ops) == 3
    assert all(op not in groups(report(OPS_B), "decode")[LAYERS].ops for op in unfused.ops)
    # same model, workload and context: the same bytes (the KV cache of 8 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes
    # per cached token), whatever the ops
    assert fused.bytes_per_step == unfused.bytes_per_step
    context = statistics.median(s.context_tokens or 0 for s in report(OPS_A).steps if s.phase == "decode")
    assert fused.bytes_per_step == exact(round(8 * 8 * 128 * 2 * 2 * context))
    assert unfused.kernels_per_step == 40.0 and unfused.ideal_ms_per_step == exact(40 * FLOOR_MS)


def test_roles_and_the_split_of_matmul_ops() -> None:
    def row(op: str, kernel: str, calls: int, kernels: int = 1) -> OpRow:
        return OpRow(
            op=op,
            phase="decode",
            calls=calls,
            kernels=kernels,
            gpu_ms=1.0,
            share_pct=1.0,
            host_ms=0.1,
            top_kernels=[kernel],
        )

    gemv = "gemv_split_k_bfloat16_bfloat16_bfloat16_128"
    assert op_role(row("matmulmo.matmul", gemv, 32)) == WEIGHTS
    assert op_role(row("batched_matmul", "naive_batched_matmul_kernel_float32", 16)) == ATTENTION
    assert op_role(row("flash_attention", "mha_depth128_bfloat16_bfloat16_nqh16_nkvh8", 8)) == ATTENTION
    assert op_role(row("rms_norm_fused_residual", "rms_norm_fused_residual_gpu_block_bfloat16_False", 15)) is None
    assert op_role(row(UNATTRIBUTED, gemv, 0)) is None  # kernels outside every op range are no op's
    assert op_role(row("matmulmo.matmul", gemv, 32, kernels=0)) is None  # launched nothing: nothing to price
    layers, head = row("matmulmo.matmul", gemv, 2 * 32), row("matmulEpilogue", gemv, 2)
    assert split_weight_ops([layers, head], steps=2, layers=8) == [(LAYERS, [layers]), (OUTPUT, [head])]
    assert split_weight_ops([layers], steps=2, layers=8) == [(WEIGHTS, [layers])]  # one op: all the weights
    # the CPU's Llama calls its output projection through the same op: 9 calls a step for 2 layers, one group
    assert split_weight_ops([row("matmulmo.matmul", gemv, 9)], steps=1, layers=2)[0][0] == WEIGHTS
    odd = row("matmul", gemv, 3)
    assert split_weight_ops([odd, head], steps=2, layers=8) == [(WEIGHTS, [odd, head])]  # no op called per layer
    assert split_weight_ops([layers, row("other", gemv, 4 * 8)], steps=2, layers=8)[0][0] == WEIGHTS  # both per layer
    assert split_weight_ops([layers, head], steps=2, layers=1)[0][0] == WEIGHTS  # every count is a multiple of 1
    assert split_weight_ops([layers, head], steps=2, layers=0)[0][0] == WEIGHTS  # the layer count is not known
    assert split_weight_ops([], steps=2, layers=8) == []


def test_nothing_is_priced_without_peaks_or_a_model() -> None:
    r = report(OPS_A)
    assert isinstance(r.ops, OpBreakdown)
    raw = RawCapture.load(str(OPS_A))
    th = Thresholds()
    cfg, w = raw.capture.model_config, raw.capture.model_weights
    assert price_ops(r.ops, r.steps, cfg, w, "NVIDIA H200", th)
    assert price_ops(r.ops, r.steps, cfg, w, "Some Unknown GPU", th) == []
    assert price_ops(r.ops, r.steps, None, None, "NVIDIA H200", th) == []
    # the same capture on an H100 SXM: its own peaks (3.35 TB/s)
    h100 = {g.part: g for g in price_ops(r.ops, r.steps, cfg, w, "NVIDIA H100 80GB HBM3", th) if g.phase == "decode"}
    assert h100[LAYERS].ideal_ms_per_step == exact(round(1e3 * h100[LAYERS].bytes_per_step / (0.85 * 3.35e12), 6))


def test_the_verdict_names_the_op_and_replaces_the_mixed_family_verdict() -> None:
    r = report(OPS_B)
    ids = [f.id for f in r.findings]
    # before ops were priced, this capture's prefill got "a matmul path far below its roofline: 62 % of its kernel time
    # at 24 %": the weights' matmuls and attention's batched matmuls in one family, priced as weights
    assert "matmul-slow-path" not in ids and "matmul-below-roofline" not in ids
    (f,) = [f for f in r.findings if f.id == "op-below-roofline"]
    g = groups(r, "prefill")[LAYERS]
    step = r.ledger.phases[0].step_ms  # type: ignore[union-attr]
    assert f.evidence["ops"] == "matmulmo.matmul" and f.evidence["priced_as"] == LAYERS
    assert f.lever is not None and f.lever.ms_per_step == round(g.recoverable_ms_per_step, 4)
    assert f.lever.pct_of_step == round(100 * g.recoverable_ms_per_step / step, 1)
    assert f.severity == "info"  # 6.5 % of one prefill step: one step is not a pattern
    assert f.title.startswith("Prefill op matmulmo.matmul (weights: layers) runs below the roofline: 0.810 ms")
    assert " far " not in f.title  # 30 % of the roofline: under 25 % is "far"
    assert f.command is not None and f.command.verb == "kernel"
    assert f.command.positional == ["matmul_bfloat16_bfloat16_bfloat16_True"]
    assert f.command.args["launch_skip"] == 0  # the first launches are the prefill's
    # the unfused attention keeps its own verdict, naming the same ops the pricing groups
    (unfused,) = [f for f in r.findings if f.id == "unfused-attention"]
    attention = groups(r, "decode")[ATTENTION]
    assert all(attention.ops_text.count(part) for part in ("batched_matmul", "softmax"))
    assert "batched_matmul" in unfused.title
    # the short labels are kept beside the ops, one each; a report saved before they were kept prints the full names
    assert attention.labels == [op_label(op) for op in attention.ops] and attention.labels != attention.ops
    older = msgspec.structs.replace(attention, labels=[])
    assert older.ops_text == ", ".join(attention.ops)


def test_the_family_verdicts_stay_where_ops_are_not_priced() -> None:
    default = report(DEFAULT_A)
    assert default.ops is None
    ops_a = report(OPS_A)
    # MAX's default run of the same model: its matmul family verdict stands (no ops to name)
    assert [f.id for f in ops_a.findings].count("op-below-roofline") == 1
    assert "matmul-below-roofline" not in [f.id for f in ops_a.findings]
    # the ops capture with its op groups removed: the family verdict is back
    assert isinstance(ops_a.ops, OpBreakdown)
    bare = msgspec.structs.replace(ops_a, ops=msgspec.structs.replace(ops_a.ops, priced=[]))
    assert [f.id for f in evaluate(bare)].count("matmul-below-roofline") == 1


def test_far_below_and_the_warning_size() -> None:
    r = report(OPS_A)
    assert isinstance(r.ops, OpBreakdown)
    ideal = {g.phase + g.part: g.ideal_ms_per_step for g in r.ops.priced}[f"decode{LAYERS}"]
    slow = [
        msgspec.structs.replace(g, ms_per_step=ideal * 5, recoverable_ms_per_step=ideal * 4, pct_of_roofline=20.0)
        if g.phase == "decode" and g.part == LAYERS
        else g
        for g in r.ops.priced
    ]
    slowed = msgspec.structs.replace(r, ops=msgspec.structs.replace(r.ops, priced=slow))
    found = evaluate(slowed)
    decode = [f for f in found if f.id == "op-below-roofline" and f.evidence["phase"] == "decode"]
    assert len(decode) == 1
    (f,) = decode
    assert " far below the roofline" in f.title and "(20 %)" in f.title
    assert f.severity == "warning"  # 0.99 of a 5.05 ms step over 64 steps
    just_under = Thresholds(slow_matmul_roofline_pct=20.0)  # 20 % is not under 20 %
    again = [f for f in evaluate(slowed, just_under) if f.id == "op-below-roofline" and f.evidence["phase"] == "decode"]
    assert " far " not in again[0].title


def test_a_servers_ops_capture_points_to_the_server_as_max_runs_it() -> None:
    """``serve --mode ops``: the mode's idle verdicts send to ``serve --mode kernels`` (device graphs as MAX runs them),
    not to a generation."""

    r = report(OPS_A)
    served = msgspec.structs.replace(r, serve=serve_summary("ops", requests=5, output_tokens=320))
    idle = [f for f in evaluate(served) if f.id == "host-bound"]
    assert idle and all(f.command is not None and f.command.verb == "serve" for f in idle)
    assert idle[0].command is not None and idle[0].command.args["mode"] == "kernels"
    plain = [f for f in r.findings if f.id == "host-bound"]
    assert plain[0].command is not None and plain[0].command.verb == "run"


def test_group_figures_at_their_edges() -> None:
    from max_profile.analyze.ledger import Roofs
    from max_profile.analyze.op_roofline import _group

    def row(gpu_ms: float, kernels: int) -> OpRow:
        return OpRow(
            op="matmulmo.matmul",
            phase="decode",
            calls=kernels,
            kernels=kernels,
            gpu_ms=gpu_ms,
            share_pct=1.0,
            host_ms=0.0,
            top_kernels=["gemv"],
        )

    roofs = Roofs(bandwidth=1e12, compute=None, basis="test roofs")
    g = _group("decode", WEIGHTS, [row(1.0, 10)], 3, 1e6, 0.0, roofs, Thresholds())
    assert g.ms_per_step == 0.333333 and g.kernels_per_step == 3.33  # 6 and 2 decimals
    assert g.ideal_ms_per_step == round(max(1e3 * 1e6 / 1e12, 10 / 3 * 2e-3), 6)
    idle = _group("decode", WEIGHTS, [row(0.0, 0)], 3, 1e6, 0.0, roofs, Thresholds())
    assert idle.pct_of_roofline == 100.0 and idle.recoverable_ms_per_step == 0.0  # no time: nothing to gain
    assert op_role(msgspec.structs.replace(row(1.0, 1), top_kernels=[])) is None  # kernels without names: no role
    layer1, odd = row(1.0, 4), msgspec.structs.replace(row(1.0, 3), op="lm_head")
    assert split_weight_ops([layer1, odd], steps=2, layers=1) == [(LAYERS, [layer1]), (OUTPUT, [odd])]
    assert split_weight_ops([layer1, odd], steps=0, layers=8) == [(WEIGHTS, [layer1, odd])]  # no steps: no split
    r = report(OPS_A)
    assert isinstance(r.ops, OpBreakdown)
    raw = RawCapture.load(str(OPS_A))
    by_config = price_ops(r.ops, r.steps, raw.capture.model_config, None, "NVIDIA H200", Thresholds())
    assert {g.part for g in by_config} == {LAYERS, OUTPUT, ATTENTION}  # config.json alone prices them too


def test_pricing_at_its_edges() -> None:
    r = report(OPS_A)
    raw = RawCapture.load(str(OPS_A))
    assert isinstance(r.ops, OpBreakdown)
    cfg, w, th = raw.capture.model_config, raw.capture.model_weights, Thresholds()
    assert w is not None
    fp8 = msgspec.structs.replace(w, dtypes={"F8_E4M3": sum(w.dtypes.values())})
    layers = next(g for g in price_ops(r.ops, r.steps, cfg, fp8, "NVIDIA H200", th) if g.part == LAYERS)
    assert "1979 fp8 TFLOP/s" in layers.basis  # the stored weights' operand
    assert price_ops(r.ops, [], cfg, w, "NVIDIA H200", th) == []  # no steps: no step to price
    decode_only = [s for s in r.steps if s.phase == "decode"]
    assert {g.phase for g in price_ops(r.ops, decode_only, cfg, w, "NVIDIA H200", th)} == {"decode"}
    stepless = msgspec.structs.replace(
        r.ops, coverage=[msgspec.structs.replace(c, steps=0) if c.phase == "prefill" else c for c in r.ops.coverage]
    )
    assert {g.phase for g in price_ops(stepless, r.steps, cfg, w, "NVIDIA H200", th)} == {"decode"}
    no_attention = msgspec.structs.replace(r.ops, rows=[x for x in r.ops.rows if op_role(x) != ATTENTION])
    assert ATTENTION not in {g.part for g in price_ops(no_attention, r.steps, cfg, w, "NVIDIA H200", th)}
    cold = [msgspec.structs.replace(s, context_tokens=0) if s.phase == "decode" else s for s in r.steps]
    decode_parts = {g.part for g in price_ops(r.ops, cold, cfg, w, "NVIDIA H200", th) if g.phase == "decode"}
    assert ATTENTION not in decode_parts  # no cached token: no KV cache to price
    # no layer count in the config: the matmul ops priced together, even where call counts differ
    odd = msgspec.structs.replace(
        r.ops,
        rows=[
            msgspec.structs.replace(x, calls=x.calls + 1) if x.op.startswith("matmulEpilogue") else x
            for x in r.ops.rows
        ],
    )
    nolayers = {k: v for k, v in (cfg or {}).items() if k != "num_hidden_layers"}
    parts = {g.part for g in price_ops(odd, r.steps, nolayers, w, "NVIDIA H200", th) if g.phase == "decode"}
    assert WEIGHTS in parts and LAYERS not in parts
