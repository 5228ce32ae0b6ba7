"""attention-below-roofline field by field on a real H200 capture (batch 64, 3B): its figures from the decode ledger
row, its deep dive of the phase's top attention kernel, and each phase judged whatever the phase before it gave."""

from __future__ import annotations

from functools import cache

import msgspec

from max_profile.analyze.commands import kernel_command
from max_profile.analyze.report import build_report
from max_profile.analyze.rules.base import lever_severity
from max_profile.analyze.rules.levers import rule_attention
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import KernelBreakdown, PhaseLedger, RawCapture, Report, StepLedger

from ...analyze.rules.test_rules import H200

TH = Thresholds()


@cache
def _b64() -> Report:
    return build_report(RawCapture.load(str(H200 / "h200_llama3b_batch64_ledger" / "run_b64_3b_raw.json.gz")))


def with_phases(report: Report, phases: list[PhaseLedger]) -> Report:
    assert isinstance(report.ledger, StepLedger)
    return msgspec.structs.replace(report, ledger=msgspec.structs.replace(report.ledger, phases=phases))


def test_attention_lever_every_field() -> None:
    report = _b64()
    lg = report.ledger
    assert isinstance(lg, StepLedger)
    found = rule_attention(report, TH)
    assert found
    for f in found:
        assert f.lever is not None
        p = next(x for x in lg.phases if x.phase == f.lever.phase)
        row = next(r for r in p.rows if r.part == "attention")
        assert row.recoverable_ms_per_step is not None
        pct = 100 * row.recoverable_ms_per_step / p.step_ms
        assert (f.id, f.severity, f.confidence) == ("attention-below-roofline", lever_severity(pct, p.steps, TH), 0.65)
        assert f.title == (
            f"{p.phase.capitalize()} attention takes {row.ms_per_step:.2f} ms per step where the KV cache's bytes "
            f"allow {row.ideal_ms_per_step or 0:.2f} ms: {row.recoverable_ms_per_step:.2f} ms of each "
            f"{p.step_ms:.2f} ms step ({pct:.0f} %) to gain"
        )
        assert f.lever.pct_of_step == round(pct, 1) and f.lever.ms_per_step == round(row.recoverable_ms_per_step, 4)
        k = report.kernels
        assert isinstance(k, KernelBreakdown)
        top = next(
            r.name for r in next(x for x in k.phases if x.phase == p.phase).top_kernels if r.family == "attention"
        )
        assert f.command == kernel_command(report, top, p.phase)
        assert f.next_step is not None and f.next_step.startswith("Deep-dive the phase's top attention kernel")


def test_each_phase_is_judged_whatever_the_one_before_it_gave() -> None:
    report = _b64()
    lg = report.ledger
    assert isinstance(lg, StepLedger)
    phases_with = {f.lever.phase for f in rule_attention(report, TH) if f.lever}
    assert "decode" in phases_with
    first = lg.phases[0]
    assert first.phase != "decode"
    # the first phase without a priced attention row, then with a lever too small to report: decode still judged
    unpriced = [
        msgspec.structs.replace(r, recoverable_ms_per_step=None) if r.part == "attention" else r for r in first.rows
    ]
    tiny = [msgspec.structs.replace(r, recoverable_ms_per_step=0.0) if r.part == "attention" else r for r in first.rows]
    for rows in (unpriced, tiny):
        changed = with_phases(report, [msgspec.structs.replace(first, rows=rows), *lg.phases[1:]])
        assert {f.lever.phase for f in rule_attention(changed, TH) if f.lever} == {"decode"}


def test_no_deep_dive_without_an_attention_kernel_in_the_phase_s_top_rows() -> None:
    report = _b64()
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    phases = [
        msgspec.structs.replace(p, top_kernels=[r for r in p.top_kernels if r.family != "attention"]) for p in k.phases
    ]
    bare = msgspec.structs.replace(report, kernels=msgspec.structs.replace(k, phases=phases))
    found = rule_attention(bare, TH)
    assert found and all(f.command is None for f in found)


def test_the_severity_turns_at_the_lever_s_exact_share_of_the_step() -> None:
    """The lever's share of the step, to the last bit, is what the thresholds see: a warning threshold at that share
    warns, one 0.5 % above it does not."""
    import dataclasses

    report = _b64()
    lg = report.ledger
    assert isinstance(lg, StepLedger)
    for f in rule_attention(report, TH):
        assert f.lever is not None
        p = next(x for x in lg.phases if x.phase == f.lever.phase)
        row = next(r for r in p.rows if r.part == "attention")
        assert row.recoverable_ms_per_step is not None
        pct = 100 * row.recoverable_ms_per_step / p.step_ms
        th = dataclasses.replace(TH, lever_info_pct=pct / 2, lever_min_steps=1)
        at = [g for g in rule_attention(report, dataclasses.replace(th, lever_warning_pct=pct)) if g.lever == f.lever]
        above = [
            g
            for g in rule_attention(report, dataclasses.replace(th, lever_warning_pct=pct * 1.005))
            if g.lever == f.lever
        ]
        assert [g.severity for g in at] == ["warning"] and [g.severity for g in above] == ["info"]


def test_a_phase_of_no_length_has_no_attention_lever() -> None:
    """Steps of 0 ns (a ledger can hold them): the lever's share of such a step is 0, not a division by zero or 1 %."""
    import dataclasses

    report = _b64()
    lg = report.ledger
    assert isinstance(lg, StepLedger)
    zero = with_phases(report, [msgspec.structs.replace(p, step_ms=0.0) for p in lg.phases])
    low = dataclasses.replace(TH, lever_info_pct=0.5, lever_warning_pct=0.75, lever_min_steps=1)
    assert rule_attention(report, low) and rule_attention(zero, low) == []
