"""`serve --mode ops` on an H100, MAX 26.7, CUDA 13 (tests/data/gpu/h100_llama_custom_serve_ops_mode): the 8-layer
custom-architecture Llama served with MAX's op ranges from the model worker joined to its CUPTI kernels over a 10 s
window (2,203 decode steps, 192,374 kernels, 194,608 op ranges). The join is checked here by brute force on a sample of
the kernels: each launch against every op range of the op thread that holds most launches, no sorted search."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from max_profile.analyze.ops import UNATTRIBUTED
from max_profile.collect.live.recorders import SERVE_OPS_MODE_NOTE
from max_profile.model import OpBreakdown, RawCapture, Report, StepLedger

from ..builders import built_report
from ..gpu.test_ops_mode import brute_force_decode_join

S19 = Path(__file__).parents[1] / "data" / "gpu" / "h100_llama_custom_serve_ops_mode"
RAW = S19 / "serve_ops_custom_raw.json.gz"
STRIDE = 11
"""Every 11th decode kernel is joined by brute force (~12,000 of them)."""


@cache
def _raw() -> RawCapture:
    return RawCapture.load(str(RAW))


def _report() -> tuple[RawCapture, Report]:
    return _raw(), built_report(RAW)


def test_decode_kernel_time_of_a_served_model_is_attributed_to_named_ops() -> None:
    """At least 95 % of decode kernel time inside named MAX ops on a server: the report says 100 %, and
    every sampled decode kernel launched inside a range of the op thread; each op's share of the sample's time is
    the report's within the sample's error."""
    raw, report = _report()
    ops = report.ops
    assert isinstance(ops, OpBreakdown)
    decode = next(c for c in ops.coverage if c.phase == "decode")
    assert decode.steps == 2203 and decode.attributed_pct >= 95.0
    _, per_op, n, inside = brute_force_decode_join(raw, STRIDE)
    assert n > 10_000 and inside == n and decode.attributed_pct == 100.0
    assert "1 of 1 launching thread(s) matched" in ops.join
    rows = {r.op: r for r in ops.rows if r.phase == "decode"}
    assert UNATTRIBUTED not in rows
    total = sum(per_op.values())
    for op, ns in per_op.items():
        if ns / total > 0.05:  # the ops of more than 5 % of the sample: its share within 1.5 points
            assert rows[op].share_pct == pytest.approx(100 * ns / total, abs=1.5), op
    assert max(rows.values(), key=lambda r: r.gpu_ms).op == "matmulmo.matmul"


def test_the_served_ops_mode_says_what_it_changed_and_judges_host_time_by_the_default_run() -> None:
    """Device graphs off, profiling on, CUPTI over the whole window: the report says so; host-bound stays at info (the
    mode's own eager launches) and points to the server as MAX runs it; the host-only ops are marked."""
    raw, report = _report()
    assert raw.capture.device_graph_capture is False and SERVE_OPS_MODE_NOTE in report.notes
    ops = report.ops
    assert isinstance(ops, OpBreakdown)
    assert ops.ops_without_kernels == ["record_request_end", "tokenizer.decode_chunk(1 toks)"]
    host = [f for f in report.findings if f.id == "host-bound"]
    assert [f.evidence["phase"] for f in host] == ["prefill", "decode"]
    for f in host:
        assert f.severity == "info" and f.lever is None and f.command is not None
        assert (f.command.verb, f.command.args) == (  # the run's server and package, MAX's default capture
            "serve",
            {
                "model_path": "/tmp/mops_custom",
                "devices": "gpu",
                "custom_architectures": ["/tmp/acc_repo/custom_archs/llama_custom"],
                "mode": "kernels",
            },
        )
        assert float(f.evidence["ops_mode_calls_per_step"]) > 50  # type: ignore[arg-type]


def test_the_layers_matmul_op_of_prefill_against_its_roofline() -> None:
    """Prefill's layers matmul op (matmulmo.matmul) is the one op group with time to gain: its figures are the priced
    group's, its recoverable time the op's time less its ideal; decode's same op runs at 91 % of its roofline."""
    _, report = _report()
    ops, lg = report.ops, report.ledger
    assert isinstance(ops, OpBreakdown) and isinstance(lg, StepLedger)
    [f] = [f for f in report.findings if f.id == "op-below-roofline"]
    [g] = [g for g in ops.priced if g.phase == "prefill" and g.ops == ["matmulmo.matmul"]]
    step = next(p for p in lg.phases if p.phase == "prefill")
    assert f.evidence["ops"] == "matmulmo.matmul" and f.evidence["priced_as"] == "weights: layers"
    assert f.evidence["recoverable_ms_per_step"] == pytest.approx(g.ms_per_step - g.ideal_ms_per_step, abs=1e-3)
    assert f.lever is not None and f.lever.pct_of_step == round(100 * g.recoverable_ms_per_step / step.step_ms, 1)
    decode = next(g for g in ops.priced if g.phase == "decode" and g.ops == ["matmulmo.matmul"])
    assert 85 <= decode.pct_of_roofline <= 95


def test_the_op_table_says_what_its_unknown_phase_holds() -> None:
    """The server's batch-0 calls between requests (35 here, one per request) carry no phase: the text and HTML op
    tables name what they hold instead of printing ``unknown``."""
    from max_profile.render.html import render_html
    from max_profile.render.text import render_text

    _, report = _report()
    ops = report.ops
    assert isinstance(ops, OpBreakdown)
    other = next(c for c in ops.coverage if c.phase == "unknown")
    assert other.steps == 35
    heading = "outside prefill and decode (calls that fed no request, ops between steps): 35 steps"
    text = " ".join(render_text(report, width=400).split())
    assert heading in text and "decode: 2203 steps, 100.0 % of" in text and "unknown: 35" not in text
    html = render_html(report)
    assert f"<h3>{heading}, " in html and "<h3>decode: 2203 steps, " in html
