"""The ops mode against MAX's default run of the same model on an H200
(tests/data/gpu/h200_llama_custom_ops_vs_default).

The ops mode (`--kernels ops`) launches every op eagerly inside its NVTX range: its kernels take what the default run's
take, its host step is 2.6x longer. Its idle verdicts are the mode's: said as such, at info, unpriced, with MAX's
default run of the workload as the next command. (A per-op-call rate drawn from this pair, 34 us, does not carry over:
the unfused-attention architecture makes 203 op calls in a 5.1 ms decode step.)"""

from __future__ import annotations

from pathlib import Path
from statistics import median

import msgspec
import pytest

from max_profile.analyze.load import tracing_cost_statement
from max_profile.analyze.ops import OPS_MODE_DECODE_STEP_MS, ops_calls_per_step
from max_profile.analyze.report import build_report
from max_profile.analyze.rules.idle import _idle_finding
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Finding, OpBreakdown, RawCapture, Report
from max_profile.model.command_text import cli

OPS = Path(__file__).parents[1] / "data" / "gpu" / "h200_llama_custom_ops_vs_default"


def _report(name: str) -> Report:
    return build_report(RawCapture.load(str(OPS / f"{name}_raw.json.gz")))


@pytest.fixture(scope="module")
def ops_a() -> Report:
    return _report("ops_a")


@pytest.fixture(scope="module")
def default_a() -> Report:
    return _report("default_a")


def _host_p50_ms(report: Report, phase: str) -> float:
    return float(median(s.duration_ns / 1e6 for s in report.steps if s.phase == phase))


def _idle(report: Report, phase: str) -> Finding:
    return next(f for f in report.findings if f.id in ("host-bound", "gpu-idle") and f.evidence["phase"] == phase)


def test_the_ops_mode_keeps_the_kernels_and_lengthens_the_host_step(ops_a: Report, default_a: Report) -> None:
    """The reference the reports quote, recomputed from the two captures: the decode host step p50 of each, the kernels
    per step the same within 3 %."""
    assert isinstance(ops_a.ops, OpBreakdown) and default_a.ops is None
    assert ops_calls_per_step(ops_a.ops, "decode") == 86.0
    assert (round(_host_p50_ms(ops_a, "decode"), 3), round(_host_p50_ms(default_a, "decode"), 3)) == (
        OPS_MODE_DECODE_STEP_MS
    )
    ops_kernels = _idle(ops_a, "decode").evidence["kernel_ms_per_step"]
    default_kernels = _idle(default_a, "decode").evidence["kernel_ms_per_step"]
    assert isinstance(ops_kernels, float) and isinstance(default_kernels, float)
    assert ops_kernels == pytest.approx(default_kernels, rel=0.03)


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_ops_mode_idle_is_said_as_the_modes(ops_a: Report, default_a: Report, phase: str) -> None:
    """The same verdict as the default run's (host-bound), on the mode's own figures, but at info, confidence 0.5, no
    lever (what it buys is the default run's to say), the mode's op calls in the evidence and the title, MAX's default
    run of the workload as the next step and command. The default run's verdict is a priced warning as before."""
    ops, default = _idle(ops_a, phase), _idle(default_a, phase)
    assert ops.id == default.id == "host-bound"
    assert ops.severity == "info" and ops.confidence == 0.5 and ops.lever is None
    assert default.confidence == 0.9 and default.lever is not None
    assert (default.severity == "warning") is (phase == "decode")  # one prefill step: never more than info
    calls = ops_calls_per_step(ops_a.ops, phase)
    assert calls is not None and ops.evidence["ops_mode_calls_per_step"] == round(calls, 1)
    assert "ops_mode_calls_per_step" not in default.evidence
    assert f"in --kernels ops: {calls:.0f} op calls per step launched eagerly" in ops.title
    assert "decode step was 2.6x MAX's default run's" in ops.title and ops.title.endswith("in the default run")
    assert ops.next_step is not None and ops.next_step.startswith("These steps are the ops mode's")
    p = next(p for p in ops_a.ledger.phases if p.phase == phase)  # type: ignore[union-attr]
    idle = sum(r.ms_per_step for r in p.rows if r.kind == "idle")
    assert ops.evidence["idle_ms_per_step"] == round(idle, 4) and ops.evidence["step_ms"] == round(p.step_ms, 4)


def test_ops_mode_next_command_is_the_default_run(ops_a: Report, default_a: Report) -> None:
    """The run that judges host time: the workload as captured, device graphs as MAX decides (the ops capture's were
    the mode's), kernels as auto records them. The default run's own host command keeps its graph state."""
    line = cli(_idle(ops_a, "decode").command)  # type: ignore[arg-type]
    assert line.startswith("max-profile run --model-path /tmp/mops_a --devices gpu")
    assert "graph-capture" not in line and "--kernels" not in line and "py-spy" not in line
    assert "--custom-architectures custom_archs/llama_custom" in line and "--max-new-tokens 64" in line
    default_line = cli(_idle(default_a, "decode").command)  # type: ignore[arg-type]
    assert "py-spy" in default_line and "--device-graph-capture" in default_line and "--kernels off" in default_line


def test_ops_mode_tracing_cost_says_what_the_mode_does(ops_a: Report) -> None:
    text = tracing_cost_statement(ops_a)
    assert text is not None and text.startswith("tracing cost, expected (not measured in this capture): --kernels ops")
    assert "4.749 ms in this mode against 1.845 ms in MAX's default run (2.6x)" in text
    assert text.endswith(
        "this capture launched 86 op calls per decode step; compare its step times with --kernels auto"
    )


def test_ops_calls_per_step_edges(ops_a: Report) -> None:
    assert ops_calls_per_step(None, "decode") is None
    assert ops_calls_per_step(ops_a.ops, "unknown") is None
    assert isinstance(ops_a.ops, OpBreakdown)
    no_steps = msgspec.structs.replace(
        ops_a.ops, coverage=[msgspec.structs.replace(c, steps=0) for c in ops_a.ops.coverage]
    )
    assert ops_calls_per_step(no_steps, "decode") is None
    assert ops_calls_per_step(ops_a.ops, "prefill") == 82.0


def test_ops_mode_idle_below_the_lever_size_gives_no_verdict(ops_a: Report) -> None:
    """The mode caps the severity at info; it does not make a verdict of idle below ``lever_info_pct``."""
    p = next(p for p in ops_a.ledger.phases if p.phase == "decode")  # type: ignore[union-attr]
    idle = sum(r.ms_per_step for r in p.rows if r.kind == "idle")
    pct = 100 * idle / p.step_ms
    assert _idle_finding(ops_a, p, Thresholds(lever_info_pct=pct + 0.1, lever_warning_pct=pct + 0.2)) is None
    f = _idle_finding(ops_a, p, Thresholds(lever_info_pct=pct - 0.1, lever_warning_pct=pct - 0.05))
    assert f is not None and f.severity == "info"
