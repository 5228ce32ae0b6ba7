"""The kernel-mix rules field by field: collectives across GPUs (dominating or moderate, the worst GPU named), MoE
routing against the experts and low-bit quantization prep against the matmuls, with the deep dive each names (the top
decode kernel of the families, its launches in decode; the top kernel of the capture when there are no phases)."""

from __future__ import annotations

import dataclasses
from functools import cache

import msgspec

from max_profile.analyze.commands import kernel_command
from max_profile.analyze.report import build_report
from max_profile.analyze.rules.kernel_mix import _top_kernel_command, rule_communication, rule_moe, rule_quant_prep
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import DeviceBreakdown, FamilyRow, KernelBreakdown, Report

from ...analyze.rules.test_rules import synthetic

TH = Thresholds()

ROUTE, GROUPED, GATHER = "moe_router_topk_kernel_0123456789abcdef", "grouped_matmul_bf16_abcdef0123456789", "gather_k"
QUANT, GEMM = "dynamic_fp8_quantize_kernel_0123456789abcdef", "gemm_bf16_tn_0123456789abcdef"


@cache
def _moe(route_ms: float, gather_ms: float = 0.0, steps: int = 10) -> Report:
    kernels = [(GROUPED, 1.0), (ROUTE, route_ms)] + ([(GATHER, gather_ms)] if gather_ms else [])
    return build_report(synthetic([3.0] * (steps + 1), [kernels] * (steps + 1)))


def top_name(report: Report, family: str, phase: str | None) -> str:
    """The top kernel row of ``family`` in ``phase`` (None: the capture's rows), named as the breakdown names it."""
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    rows = next(p.top_kernels for p in k.phases if p.phase == phase) if phase else k.top_kernels
    return next(r.name for r in rows if r.family == family)


def device(dev: int, share: float | None, ms: float | None) -> DeviceBreakdown:
    return DeviceBreakdown(
        device=dev,
        kernels=100,
        kernel_ms=10.0,
        gpu_busy_pct=90.0,
        collective_ms_per_decode_step=ms,
        collective_share_of_decode_pct=share,
        families=[FamilyRow(family="collective", kernels=10, total_ms=1.0, share_pct=10.0)],
    )


def with_devices(*devices: DeviceBreakdown) -> Report:
    base = _moe(0.1)
    assert isinstance(base.kernels, KernelBreakdown)
    return msgspec.structs.replace(base, kernels=msgspec.structs.replace(base.kernels, per_device=list(devices)))


def test_communication_dominates_every_field() -> None:
    report = with_devices(device(0, 12.0, 0.1), device(1, 38.46, 0.123456), device(2, None, None))
    (f,) = rule_communication(report, TH)
    assert (f.id, f.severity, f.confidence) == ("communication-dominates", "warning", 0.7)
    assert f.evidence == {
        "devices": 3,
        "max_collective_share_of_decode_pct": 38.5,
        "device": 1,
        "collective_ms_per_decode_step": 0.1235,
        "threshold_pct": TH.communication_share_pct,
    }
    assert f.title == (
        "Collectives take a large share of each decode step: communication, not compute, limits tensor/expert "
        "parallelism"
    )
    assert f.next_step is not None and f.next_step.startswith("Try fewer GPUs per replica")


def test_communication_share_every_field_and_the_threshold() -> None:
    report = with_devices(device(0, 4.04, 0.01), device(1, 2.0, 0.02))
    (f,) = rule_communication(report, TH)
    assert (f.id, f.severity, f.confidence) == ("communication-share", "info", 0.6)
    assert f.title == "Collective share of decode kernel time per GPU is moderate"
    assert f.evidence["max_collective_share_of_decode_pct"] == 4.0 and f.evidence["device"] == 0
    at = with_devices(device(0, TH.communication_share_pct, 0.1), device(1, 1.0, 0.01))
    assert rule_communication(at, TH)[0].id == "communication-dominates"
    under = with_devices(device(0, TH.communication_share_pct - 0.01, 0.1), device(1, 1.0, 0.01))
    assert rule_communication(under, TH)[0].id == "communication-share"


def test_communication_needs_two_gpus_with_a_share() -> None:
    assert rule_communication(with_devices(device(0, 50.0, 1.0)), TH) == []
    assert rule_communication(with_devices(device(0, None, None), device(1, None, None)), TH) == []
    # a GPU without a figure counts as 0 %: below any other's share, tied with a 0 % (the first GPU then)
    some = with_devices(device(0, None, None), device(1, 0.5, 0.01))
    assert rule_communication(some, TH)[0].evidence["device"] == 1
    zero = with_devices(device(0, None, None), device(1, 0.0, 0.0))
    (f,) = rule_communication(zero, TH)
    assert f.evidence["device"] == 0 and f.evidence["max_collective_share_of_decode_pct"] == 0.0
    assert f.evidence["collective_ms_per_decode_step"] == 0.0
    at_zero = dataclasses.replace(TH, communication_share_pct=0.5)
    assert rule_communication(with_devices(device(0, None, None), device(1, 0.0, None)), at_zero)[0].id == (
        "communication-share"
    )


def test_moe_routing_heavy_names_the_top_decode_routing_kernel() -> None:
    report = _moe(0.6, gather_ms=0.2)
    (f,) = rule_moe(report, TH)
    assert f.id == "moe-routing-heavy"
    assert f.evidence == {
        "grouped_matmul_ms": 10.0,
        "routing_and_gather_ms": 8.0,
        "ratio": 0.8,
        "threshold": TH.routing_vs_matmul_ratio,
    }
    assert f.command == kernel_command(report, top_name(report, "moe_routing", "decode"), "decode")
    assert f.command is not None and f.command.args.get("launch_skip") is not None


def test_the_top_kernel_command_without_phases_takes_the_capture_s_top_kernel() -> None:
    report = _moe(0.6)
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    flat = msgspec.structs.replace(report, kernels=msgspec.structs.replace(k, phases=[]))
    assert _top_kernel_command(flat, ("moe_routing",)) == kernel_command(flat, top_name(flat, "moe_routing", None))
    decode = _top_kernel_command(report, ("moe_routing",))
    assert decode == kernel_command(report, top_name(report, "moe_routing", "decode"), "decode")
    assert decode is not None and (decode.comment or "").endswith("decode launches")
    assert decode != kernel_command(report, top_name(report, "moe_routing", "decode"), None)
    assert _top_kernel_command(report, ("quantize",)) is None  # no kernel of the family
    from max_profile.model import Unavailable

    assert _top_kernel_command(msgspec.structs.replace(report, kernels=Unavailable("off")), ("gemv",)) is None


def test_quant_prep_heavy_and_normal_every_field() -> None:
    heavy = build_report(synthetic([3.0] * 11, [[(GEMM, 0.4), (QUANT, 0.5)]] * 11))
    (f,) = rule_quant_prep(heavy, TH)
    assert (f.id, f.severity, f.confidence) == ("quant-prep-heavy", "warning", 0.7)
    assert f.evidence == {"quantize_ms": 5.5, "matmul_ms": 4.4, "ratio": 1.25}
    assert f.command == kernel_command(heavy, top_name(heavy, "quantize", "decode"), "decode")
    normal = build_report(synthetic([3.0] * 11, [[(GEMM, 1.0), (QUANT, 0.123)]] * 11))
    (g,) = rule_quant_prep(normal, TH)
    assert (g.id, g.severity, g.confidence) == ("low-bit-normal", "info", 0.6)
    assert g.evidence == {"quantize_ms": 1.353, "matmul_ms": 11.0, "ratio": 0.123}


PREFILL_ROUTE = "moe_align_block_size_kernel_0123456789abcdef"


def test_the_deep_dive_names_decode_s_top_kernel_not_the_capture_s() -> None:
    """Prefill's routing kernel outweighs decode's over the whole capture: the deep dive still takes decode's."""
    kernels = [[(GROUPED, 5.0), (PREFILL_ROUTE, 9.0)]] + [[(GROUPED, 1.0), (ROUTE, 0.6)]] * 10
    report = build_report(synthetic([20.0] + [3.0] * 10, kernels))
    assert top_name(report, "moe_routing", None) != top_name(report, "moe_routing", "decode")
    cmd = _top_kernel_command(report, ("moe_routing",))
    assert cmd == kernel_command(report, top_name(report, "moe_routing", "decode"), "decode")


def test_moe_routing_heavy_every_field_and_its_threshold() -> None:
    report = _moe(0.6543, gather_ms=0.2109)
    (f,) = rule_moe(report, TH)
    grouped, routing = 11 * 1.0 - 1.0, 10 * (0.6543 + 0.2109)  # decode steps only: 10 of the 11
    assert (f.id, f.severity, f.confidence) == ("moe-routing-heavy", "warning", 0.7)
    assert f.evidence == {
        "grouped_matmul_ms": round(grouped, 3),
        "routing_and_gather_ms": round(routing, 3),
        "ratio": round(routing / grouped, 2),
        "threshold": TH.routing_vs_matmul_ratio,
    }
    assert f.title == "MoE routing and gather/scatter rival the expert matmuls"
    assert f.next_step == (
        "Look at the top routing/gather kernels in the table; a single-kernel deep dive shows whether they are "
        "latency-bound."
    )
    exact = dataclasses.replace(TH, routing_vs_matmul_ratio=routing / grouped)
    assert rule_moe(report, exact)[0].id == "moe-routing-heavy"  # exactly the ratio: heavy
    above = dataclasses.replace(TH, routing_vs_matmul_ratio=routing / grouped + 1e-9)
    assert "moe-routing-heavy" not in [f.id for f in rule_moe(report, above)]  # healthy, or a lever says otherwise


def test_moe_needs_both_expert_matmuls_and_routing() -> None:
    no_experts = build_report(synthetic([3.0] * 11, [[(ROUTE, 0.5), (GEMM, 1.0)]] * 11))
    assert rule_moe(no_experts, TH) == []
    no_routing = build_report(synthetic([3.0] * 11, [[(GROUPED, 1.0), (GATHER, 0.6)]] * 11))
    assert rule_moe(no_routing, TH) == []
    small = build_report(synthetic([3.0] * 11, [[(GROUPED, 0.05), (ROUTE, 0.05)]] * 11))  # experts under 1 ms in all
    assert [f.id for f in rule_moe(small, TH)] == ["moe-routing-heavy"]


def test_unfused_attention_counts_the_capture_s_attention_kernels_without_phases() -> None:
    from max_profile.analyze.rules.base import attention_presence as _attention_presence

    report = build_report(synthetic([3.0] * 11, [[(GEMM, 1.0), ("sm90_mha_depth128", 0.1), (ROUTE, 0.2)]] * 11))
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    flat = msgspec.structs.replace(k, phases=[])
    assert _attention_presence(flat) == (11.0, "capture", 11)


GEMV = "gemv_split_k_bf16_0123456789abcdef"


def test_quant_prep_counts_every_matmul_family_and_its_exact_ratio() -> None:
    kernels = [[(GEMM, 0.1234), (GEMV, 0.2345), (GROUPED, 0.0112), (QUANT, 0.4321)]] * 11
    report = build_report(synthetic([3.0] * 11, kernels))
    (f,) = rule_quant_prep(report, TH)
    quant, matmul = 11 * 0.4321, 11 * (0.1234 + 0.2345 + 0.0112)
    assert f.evidence == {
        "quantize_ms": round(quant, 3),
        "matmul_ms": round(matmul, 3),
        "ratio": round(quant / matmul, 4),
    }
    assert round(quant, 3) != round(quant, 4) and round(matmul, 3) != round(matmul, 4)
    assert round(quant / matmul, 4) != round(quant / matmul, 5)
    assert f.title == "Low-bit quantization prep takes longer than the matmuls it feeds"
    assert f.next_step == "Deep-dive the top quantize kernel and check the scale layout matches the matmul's."
    at = dataclasses.replace(TH, quant_vs_matmul_ratio=quant / matmul)
    (g,) = rule_quant_prep(report, at)  # exactly the ratio: normal
    assert g.id == "low-bit-normal"
    assert g.title == "Low-bit weights: activation quantization and scale layout present at normal cost"
    small = build_report(synthetic([3.0] * 11, [[(GEMV, 0.01), (QUANT, 0.02)]] * 11))  # matmuls under 1 ms in all
    assert [x.id for x in rule_quant_prep(small, TH)] == ["quant-prep-heavy"]
    assert rule_quant_prep(build_report(synthetic([3.0] * 11, [[(QUANT, 0.02)]] * 11)), TH) == []


def test_unfused_attention_guards_and_its_capture_scope_evidence() -> None:
    from max_profile.analyze.rules.kernel_mix import rule_unfused

    plain = [("gemm_bf16_tn_0123456789abcdef", 1.2345), ("elementwise_softmax_k", 0.1111), ("silu_act_k", 0.0222)]
    report = build_report(synthetic([3.0] * 11, [plain] * 11))
    (f,) = [x for x in rule_unfused(report, TH) if x.id == "unfused-attention"]
    kb = report.kernels
    assert isinstance(kb, KernelBreakdown)
    fam = {r.family: r.total_ms for r in kb.families}
    assert fam.get("activation") and fam.get("elementwise")
    assert f.evidence["elementwise_ms"] == round(fam["elementwise"] + fam["activation"], 3)
    assert f.evidence["attention_kernels_per_decode_step"] == 0.0 and f.evidence["attention_share_pct"] == 0.0
    assert f.evidence["matmul_ms"] == round(11 * 1.2345, 3)
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    flat = msgspec.structs.replace(report, kernels=msgspec.structs.replace(k, phases=[]))
    (g,) = [x for x in rule_unfused(flat, TH) if x.id == "unfused-attention"]
    assert g.evidence["attention_kernels_in_capture"] == 0.0 and "attention_kernels_per_decode_step" not in g.evidence
    assert g.confidence == round(0.75 * TH.no_phase_confidence_scale, 2)
    hidden = msgspec.structs.replace(report, kernels=msgspec.structs.replace(k, unreliable="graphs hid them"))
    assert rule_unfused(hidden, TH) == []
    no_kernels = msgspec.structs.replace(report, kernels=msgspec.structs.replace(k, kernels=0))
    assert rule_unfused(no_kernels, TH) == []
    no_matmul = build_report(synthetic([3.0] * 11, [[("elementwise_softmax_k", 0.1)]] * 11))
    assert rule_unfused(no_matmul, TH) == []


def test_unfused_attention_per_step_to_two_decimals() -> None:
    from max_profile.analyze.rules.kernel_mix import rule_unfused

    # one attention kernel in 3 of 11 decode steps: 3/11 = 0.27 per step, under the minimum
    kernels = [[(GEMM, 1.0)] + ([("sm90_mha_d128", 0.1234)] if i % 4 == 1 else []) for i in range(12)]
    report = build_report(synthetic([3.0] * 12, kernels))
    (f,) = [x for x in rule_unfused(report, TH) if x.id == "unfused-attention"]
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    total = sum(r.total_ms for r in k.families)
    attention = sum(r.total_ms for r in k.families if r.family == "attention")
    assert f.evidence == {
        "attention_kernels": 3,
        "attention_kernels_per_decode_step": 0.27,
        "attention_share_pct": round(100.0 * attention / total, 3),
        "matmul_ms": round(12 * 1.0, 3),
        "elementwise_ms": 0.0,
        "top_families": ",".join(r.family for r in k.families[:5]),
        "source": k.source,
        "threshold_per_step": TH.min_attention_kernels_per_step,
    }
    assert round(100.0 * attention / total, 3) != round(100.0 * attention / total, 4)
    assert f.title == "No fused attention kernel: attention runs as generic matmul / softmax / elementwise ops"
    assert (f.severity, f.confidence) == ("warning", 0.75)


def test_unfused_norm_every_field() -> None:
    from max_profile.analyze.rules.kernel_mix import rule_unfused

    names = [f"elementwise_op_{i}" for i in range(2)] + ["sm90_mha_d128", GEMV, GEMM, QUANT, GATHER, ROUTE]
    kernels = [[(n, 0.01) for n in names]] * 8  # 64 kernels of 7 families, no norm among them
    report = build_report(synthetic([3.0] * 8, kernels))
    (f,) = [x for x in rule_unfused(report, TH) if x.id == "unfused-norm"]
    k = report.kernels
    assert isinstance(k, KernelBreakdown) and k.kernels > TH.unfused_norm_min_kernels
    assert (f.severity, f.confidence) == ("info", 0.5)
    assert f.title == "No fused RMS norm kernel in the trace"
    assert f.evidence == {
        "family": "norm",
        "kernels": k.kernels,
        "top_families": ",".join(r.family for r in k.families[:5]),
    }
    assert len(k.families) > 5 and len(str(f.evidence["top_families"]).split(",")) == 5
    assert f.next_step == (
        "If the architecture uses RMS norm, check it is built from MAX's fused op rather than elementwise pieces."
    )


def test_healthy_moe_every_field_and_not_while_a_decode_lever_remains() -> None:
    busy = build_report(synthetic([1.2] * 11, [[(GROUPED, 1.0), (ROUTE, 0.1)]] * 11))  # idle 0.1 of 1.2 ms
    (f,) = rule_moe(busy, TH)
    assert (f.id, f.severity, f.confidence) == ("healthy-moe", "info", 0.7)
    assert f.title == "Healthy MoE: grouped expert matmuls dominate; routing cost is expected"
    assert f.evidence == {
        "grouped_matmul_ms": 10.0,
        "routing_and_gather_ms": 1.0,
        "ratio": 0.1,
        "threshold": TH.routing_vs_matmul_ratio,
    }
    idle = build_report(synthetic([3.0] * 11, [[(GROUPED, 1.0), (ROUTE, 0.1)]] * 11))  # 1.9 ms of 3 idle: a lever
    assert rule_moe(idle, TH) == []


def test_moe_boundaries_exact_in_binary() -> None:
    """Figures exact in binary (0.5 ms + 0.25 ms of routing against 1 ms of experts per step): a ratio exactly at the
    threshold is heavy, and a decode lever exactly at the warning size keeps the healthy verdict away."""
    from max_profile.analyze.rules.base import ledger_phase, worst_lever_pct

    report = build_report(synthetic([3.0] * 11, [[(GROUPED, 1.0), (ROUTE, 0.5), (GATHER, 0.25)]] * 11))
    at = dataclasses.replace(TH, routing_vs_matmul_ratio=0.75)
    assert [f.id for f in rule_moe(report, at)][:1] == ["moe-routing-heavy"]
    above = dataclasses.replace(TH, routing_vs_matmul_ratio=0.75 + 1e-12)
    assert "moe-routing-heavy" not in [f.id for f in rule_moe(report, above)]
    busy = build_report(synthetic([1.2] * 11, [[(GROUPED, 1.0), (ROUTE, 0.1)]] * 11))
    dl = ledger_phase(busy, "decode")
    assert dl is not None
    lever = worst_lever_pct(dl)
    assert [f.id for f in rule_moe(busy, dataclasses.replace(TH, lever_warning_pct=lever + 1e-9))] == ["healthy-moe"]
    assert rule_moe(busy, dataclasses.replace(TH, lever_warning_pct=lever)) == []


def test_moe_evidence_to_three_decimals() -> None:
    report = build_report(synthetic([3.0] * 11, [[(GROUPED, 1.00017), (ROUTE, 0.65432)]] * 11))
    (f,) = rule_moe(report, TH)
    grouped, routing = 10 * 1_000_170 / 1e6, 10 * 654_320 / 1e6  # decode's 10 steps, whole nanoseconds
    assert f.evidence["grouped_matmul_ms"] == round(grouped, 3) == 10.002
    assert f.evidence["routing_and_gather_ms"] == round(routing, 3) == 6.543
    assert f.evidence["ratio"] == round(routing / grouped, 2)


def test_moe_and_quant_prep_read_gpu_kernels_only() -> None:
    """MAX's op ranges on the host (nvtx-log) are not GPU kernels: neither rule reads them."""
    for report in (
        _moe(0.6543, gather_ms=0.2109),
        build_report(synthetic([3.0] * 11, [[(QUANT, 2.0), (GEMM, 1.0)]] * 11)),
    ):
        k = report.kernels
        assert isinstance(k, KernelBreakdown)
        assert rule_moe(report, TH) or rule_quant_prep(report, TH)
        host = msgspec.structs.replace(report, kernels=msgspec.structs.replace(k, source="nvtx-log (MAX op ranges)"))
        assert rule_moe(host, TH) == [] and rule_quant_prep(host, TH) == []
