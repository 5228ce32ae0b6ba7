"""The op-roofline verdict and the ops mode's idle verdicts at their edges, on the H200's ``--kernels ops`` captures
with one priced group, phase or kernel name changed at a time (the rules read only the report)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from max_profile.analyze.families import distinctive_regex
from max_profile.analyze.op_roofline import ATTENTION, LAYERS
from max_profile.analyze.rules import evaluate
from max_profile.analyze.rules.levers import rule_matmul, rule_op_roofline
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import KernelBreakdown, OpBreakdown, OpRoofline, Report, StepLedger

from ...builders import built_report, serve_summary

H200 = Path(__file__).parents[2] / "data" / "gpu"
OPS_A = H200 / "h200_llama_custom_ops_vs_default" / "ops_a_raw.json.gz"
OPS_B = H200 / "h200_llama_custom_ops_mode" / "ops_b_raw.json.gz"
report = built_report


def ops_of(r: Report) -> OpBreakdown:
    assert isinstance(r.ops, OpBreakdown)
    return r.ops


def priced(r: Report, change: dict[tuple[str, str], dict[str, object]]) -> Report:
    """The report with some priced groups' fields replaced ((phase, part) -> fields; {"drop": True} removes it)."""
    groups: list[OpRoofline] = []
    for g in ops_of(r).priced:
        fields = change.get((g.phase, g.part))
        if fields is None:
            groups.append(g)
        elif not fields.get("drop"):
            groups.append(msgspec.structs.replace(g, **fields))
    return msgspec.structs.replace(r, ops=msgspec.structs.replace(ops_of(r), priced=groups))


def step_ms(r: Report, phase: str) -> float:
    assert isinstance(r.ledger, StepLedger)
    return next(p.step_ms for p in r.ledger.phases if p.phase == phase)


def slow(r: Report, phase: str, part: str, share_of_step: float) -> dict[tuple[str, str], dict[str, object]]:
    rec = share_of_step * step_ms(r, phase)
    return {(phase, part): {"recoverable_ms_per_step": rec, "ms_per_step": rec + 0.01, "pct_of_roofline": 10.0}}


def test_attention_written_as_ops_is_one_verdict_with_its_lever() -> None:
    """An attention written as MAX ops (a naive batched matmul, a softmax...) is one warning: unfused-attention,
    carrying
    the attention ops' lever and a deep dive of their top kernel. The op group and the naive matmul kernel it launched
    make no verdict of their own: the same time is never two levers, and the phase's levers never pass its step."""
    r = report(OPS_B)
    slowed = priced(r, slow(r, "decode", ATTENTION, 0.3))
    assert [f for f in rule_op_roofline(slowed, Thresholds()) if f.evidence["priced_as"] == ATTENTION] == []
    judged = msgspec.structs.replace(slowed, findings=evaluate(slowed))
    ids = [f.id for f in judged.findings]
    assert "unfused-attention" in ids
    assert not [f for f in judged.findings if f.id == "op-below-roofline" and f.evidence["priced_as"] == ATTENTION]
    assert "matmul-slow-path" not in ids  # its naive kernel ran inside the attention ops only
    (unfused,) = [f for f in judged.findings if f.id == "unfused-attention"]
    g = next(x for x in ops_of(slowed).priced if x.phase == "decode" and x.part == ATTENTION)
    assert unfused.lever is not None and unfused.lever.phase == "decode"
    assert unfused.lever.ms_per_step == round(g.recoverable_ms_per_step, 4)
    assert unfused.command is not None and unfused.command.verb == "kernel"
    assert unfused.next_step is not None and unfused.next_step.startswith("Wire the architecture's")
    decode = step_ms(slowed, "decode")
    levers = [f.lever.ms_per_step for f in judged.findings if f.lever is not None and f.lever.phase == "decode"]
    assert sum(levers) <= decode


def test_a_fused_attention_op_keeps_its_op_verdict() -> None:
    a = report(OPS_A)
    (fused,) = [
        f
        for f in rule_op_roofline(priced(a, slow(a, "decode", ATTENTION, 0.3)), Thresholds())
        if f.evidence["priced_as"] == ATTENTION and f.evidence["phase"] == "decode"
    ]
    assert fused.next_step.startswith("Deep-dive the top kernel this op launches")  # type: ignore[union-attr]
    (layers,) = [f for f in rule_op_roofline(a, Thresholds()) if f.evidence["priced_as"] == LAYERS]
    assert layers.next_step.startswith("Deep-dive the top kernel this op launches")  # type: ignore[union-attr]


def test_a_fallback_matmul_kernel_keeps_its_own_verdict() -> None:
    a = report(OPS_A)
    rows = [
        msgspec.structs.replace(x, top_kernels=["naive_gemm_kernel"]) if x.op == "matmulmo.matmul" else x
        for x in ops_of(a).rows
    ]
    named = msgspec.structs.replace(a, ops=msgspec.structs.replace(ops_of(a), rows=rows))
    assert [f for f in rule_op_roofline(named, Thresholds()) if f.evidence["priced_as"] == LAYERS] == []


def test_every_group_of_a_phase_is_judged() -> None:
    a = report(OPS_A)
    # the layers at their ideal (no lever), the attention slow: the attention's verdict still comes
    quiet = priced(a, {("prefill", LAYERS): {"recoverable_ms_per_step": 0.0}, **slow(a, "prefill", ATTENTION, 0.3)})
    assert [f.evidence["priced_as"] for f in rule_op_roofline(quiet, Thresholds())] == [ATTENTION]
    # a lever just under 5 % of the step is no verdict
    under = priced(a, {("prefill", LAYERS): {"recoverable_ms_per_step": 0.0499 * step_ms(a, "prefill")}})
    assert rule_op_roofline(under, Thresholds()) == []


def test_no_verdict_without_a_kernel_ledger_or_a_step() -> None:
    a = report(OPS_A)
    assert isinstance(a.ledger, StepLedger)
    server = msgspec.structs.replace(a, ledger=msgspec.structs.replace(a.ledger, source="server metrics"))
    assert rule_op_roofline(server, Thresholds()) == []
    zero = msgspec.structs.replace(
        a,
        ledger=msgspec.structs.replace(
            a.ledger, phases=[msgspec.structs.replace(p, step_ms=0.0) for p in a.ledger.phases]
        ),
    )
    assert rule_op_roofline(zero, Thresholds()) == []
    assert rule_op_roofline(zero, Thresholds(lever_info_pct=0.5, lever_warning_pct=0.75)) == []  # not 1 % or more


def test_the_deep_dive_names_the_kernel_as_the_trace_does() -> None:
    a = report(OPS_A)
    k = a.kernels
    assert isinstance(k, KernelBreakdown)
    (base,) = [f for f in rule_op_roofline(a, Thresholds()) if f.evidence["priced_as"] == LAYERS]
    plain = base.evidence["top_kernel"]
    hashed = f"{plain}_0123456789abcdef0123"  # a name the op table shortens to its base
    renamed = msgspec.structs.replace(
        k,
        phases=[
            msgspec.structs.replace(
                p,
                top_kernels=[msgspec.structs.replace(x, name=hashed) if x.name == plain else x for x in p.top_kernels],
            )
            for p in k.phases
        ],
    )
    (f,) = [
        x
        for x in rule_op_roofline(msgspec.structs.replace(a, kernels=renamed), Thresholds())
        if x.evidence["priced_as"] == LAYERS
    ]
    assert f.evidence["top_kernel"] == hashed and f.command is not None
    assert f.command.positional == [distinctive_regex(hashed)]
    phaseless = msgspec.structs.replace(k, phases=[p for p in k.phases if p.phase != "prefill"])
    (g,) = [
        x
        for x in rule_op_roofline(msgspec.structs.replace(a, kernels=phaseless), Thresholds())
        if x.evidence["priced_as"] == LAYERS
    ]
    assert g.evidence["top_kernel"] == plain  # no prefill phase in the table: the op table's name
    assert [
        x.evidence["top_kernel"] for x in rule_op_roofline(msgspec.structs.replace(a, kernels=None), Thresholds())
    ] == [plain]
    long = "k" * 150
    rows = [msgspec.structs.replace(x, top_kernels=[long]) if x.op == "matmulmo.matmul" else x for x in ops_of(a).rows]
    (h,) = rule_op_roofline(msgspec.structs.replace(a, ops=msgspec.structs.replace(ops_of(a), rows=rows)), Thresholds())
    assert h.evidence["top_kernel"] == "k" * 100
    nameless = priced(a, {("prefill", LAYERS): {"ops": ["no such op"]}})
    (n,) = rule_op_roofline(nameless, Thresholds())
    assert n.evidence["top_kernel"] is None and n.command is None


def test_the_family_verdict_of_a_phase_without_op_groups() -> None:
    a = report(OPS_A)
    th = Thresholds(lever_info_pct=0.5)  # decode's matmuls: about 1 % of the step to gain
    decode_unpriced = priced(
        a, {("decode", LAYERS): {"drop": True}, ("decode", "weights: output projection"): {"drop": True}}
    )
    phases = [f.evidence["phase"] for f in rule_matmul(decode_unpriced, th)]
    assert phases == ["decode"]  # prefill's matmuls are its op groups'; decode's have none: the family verdict


def test_the_ops_modes_idle_verdicts() -> None:
    a = report(OPS_A)
    th = Thresholds(host_bound_busy_pct=1.0)  # 8 % busy counts as busy: the GPU-idle verdict, not host-bound
    idle = [f for f in evaluate(a, th) if f.id in ("gpu-idle", "graph-launch-late")]
    assert idle and all(f.confidence == 0.5 and f.lever is None for f in idle)
    assert (
        idle[0].next_step
        == "These steps are the ops mode's; MAX's default run of this workload judges the host's time per step:"
    )
    cov = [msgspec.structs.replace(c, calls=c.calls + 26) if c.phase == "decode" else c for c in ops_of(a).coverage]
    odd = msgspec.structs.replace(a, ops=msgspec.structs.replace(ops_of(a), coverage=cov))
    host = next(f for f in evaluate(odd) if f.id == "host-bound" and f.evidence["phase"] == "decode")
    assert host.evidence["ops_mode_calls_per_step"] == round(5530 / 64, 1) == 86.4
    served = msgspec.structs.replace(a, serve=serve_summary("ops"))
    cmd = next(f for f in evaluate(served) if f.id == "host-bound").command
    assert cmd is not None and cmd.comment == "the server as MAX runs it: its steps judge host time"


def test_the_attention_family_verdict_yields_to_the_op_groups() -> None:
    a = report(OPS_A)
    th = Thresholds(lever_info_pct=0.1)  # prefill's attention: 0.03 of 8.18 ms to gain, a lever at this size
    from max_profile.analyze.rules.levers import rule_attention

    assert rule_attention(a, th) == []  # its op group says it (op-below-roofline)
    bare = msgspec.structs.replace(a, ops=msgspec.structs.replace(ops_of(a), priced=[]))
    assert [f.evidence["phase"] for f in rule_attention(bare, th)] == ["prefill", "decode"]
