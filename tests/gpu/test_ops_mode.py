"""``--kernels ops`` on an H200 (tests/data/gpu/h200_llama_custom_ops_mode): MAX's op ranges joined to the CUPTI kernels
they launched, on a custom-architecture Llama (a) and on the architecture with attention written as separate ops (b).
The join is recomputed here by brute force (each launch against every op range of the op thread that holds most
launches, no sorted search) and compared with the report's. In (b) MAX runs host-only ops on a second thread at the same
time: a join by time alone would give six kernels to those."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from max_profile.analyze.ops import UNATTRIBUTED
from max_profile.analyze.report import build_report
from max_profile.collect.live.recorders import OPS_MODE_NOTE
from max_profile.model import OpBreakdown, RawCapture, Report

OPS = Path(__file__).parents[1] / "data" / "gpu" / "h200_llama_custom_ops_mode"


def _load(name: str) -> tuple[RawCapture, Report]:
    raw = RawCapture.load(str(OPS / f"{name}_raw.json.gz"))
    return raw, build_report(raw)


def brute_force_decode_join(raw: RawCapture, stride: int = 1) -> tuple[float, dict[str, float], int, int]:
    """Of every ``stride``-th kernel launched inside a decode step: the share of their GPU time launched inside some op
    range of the op thread that holds most launches (the shortest range holding the launch), GPU ns per op name, how
    many kernels were looked at and how many of them lay inside a range; from the raw records alone, each launch
    against every range of that thread (no sorted search)."""
    k, o = raw.kernels, raw.op_ranges
    assert k.launch_ns is not None
    decode = [(s.start_ns, s.end_ns) for s in raw.steps if s.phase == "decode"]
    launch = k.launch_ns
    in_decode = np.zeros(len(k), dtype=bool)
    for a, b in decode:
        in_decode |= (launch >= a) & (launch <= b)
    sample = np.flatnonzero(in_decode)[::stride]
    dur = (k.end_ns - k.start_ns).astype(np.float64)
    assert o.launch_tid is not None
    hits = {
        int(t): sum(
            bool(((o.launch_tid == t) & (o.start_ns <= x) & (o.end_ns >= x)).any()) for x in launch[:: 7 * stride]
        )
        for t in np.unique(o.launch_tid)
    }
    on_thread = o.launch_tid == max(hits, key=hits.__getitem__)  # the op thread that launches kernels
    st, en = o.start_ns[on_thread], o.end_ns[on_thread]
    names = [o.names[i] for i in o.name_idx[on_thread]]
    length = en - st
    per_op: dict[str, float] = {}
    attributed, inside = 0.0, 0
    for i in sample:
        holds = np.flatnonzero((st <= launch[i]) & (en >= launch[i]))
        if holds.size:
            j = holds[np.argmin(length[holds])]
            attributed += dur[i]
            inside += 1
            per_op[names[j]] = per_op.get(names[j], 0.0) + dur[i]
    return 100.0 * attributed / dur[sample].sum(), per_op, len(sample), inside


@pytest.mark.parametrize("name", ["ops_a", "ops_b"])
def test_decode_kernel_time_is_attributed_to_named_ops(name: str) -> None:
    """At least 95 % of decode kernel time inside named MAX ops (both runs: 100 %)."""
    raw, report = _load(name)
    ops = report.ops
    assert isinstance(ops, OpBreakdown)
    decode = next(c for c in ops.coverage if c.phase == "decode")
    truth, per_op, _, _ = brute_force_decode_join(raw)
    assert decode.attributed_pct >= 95.0 and decode.attributed_pct == pytest.approx(truth, rel=1e-9)
    assert decode.steps == 64 and "1 of 1 launching thread(s) matched" in ops.join
    rows = {r.op: r for r in ops.rows if r.phase == "decode"}
    assert UNATTRIBUTED not in rows
    for op, ns in per_op.items():
        assert rows[op].gpu_ms == pytest.approx(ns / 1e6, rel=1e-9)
    assert OPS_MODE_NOTE in report.notes and raw.capture.device_graph_capture is False


def test_the_fused_llama_shows_its_attention_op_and_no_unfused_finding() -> None:
    _, report = _load("ops_a")
    assert isinstance(report.ops, OpBreakdown)
    rows = {r.op: r for r in report.ops.rows if r.phase == "decode"}
    assert rows["flash_attention"].kernels == 512 and rows["flash_attention"].top_kernels[0].startswith("mha_")
    assert rows["matmulmo.matmul"].top_kernels == ["gemv_split_k_bfloat16_bfloat16_bfloat16_128"]
    assert "unfused-attention" not in {f.id for f in report.findings}


def test_unfused_attention_is_named_by_its_ops_and_their_share() -> None:
    """(b) writes attention as batched matmuls, a softmax and KV rows gathered out of the cache: the finding names those
    ops with the shares of the op table (MAX runs the batched matmuls as naive fp32 kernels)."""
    _, report = _load("ops_b")
    assert isinstance(report.ops, OpBreakdown)
    [f] = [f for f in report.findings if f.id == "unfused-attention"]
    rows = {r.op: r for r in report.ops.rows if r.phase == "decode"}
    bmm = rows["batched_matmul"]
    gather = rows["elementwise(kv_cache_gather_rows_ragged)"]
    softmax = next(r for op, r in rows.items() if "reduce.softmax" in op)
    assert f.evidence["attention_ops"] == (
        f"batched_matmul {bmm.share_pct:.1f} %; kv_cache_gather_rows_ragged {gather.share_pct:.1f} %; "
        f"reduce.softmax {softmax.share_pct:.1f} %"
    )
    share = bmm.share_pct + gather.share_pct + softmax.share_pct
    assert f.evidence["attention_ops_share_pct"] == round(share, 1) and 15 < share < 30
    assert f.evidence["attention_ops_ms_per_step"] == round((bmm.gpu_ms + gather.gpu_ms + softmax.gpu_ms) / 64, 4)
    assert "batched_matmul, kv_cache_gather_rows_ragged, reduce.softmax" in f.title
    assert all("naive_batched_matmul_kernel_float32" in k for k in bmm.top_kernels)
    # host-only ops (MAX names one of them "range)"), on the second op thread
    assert report.ops.ops_without_kernels == ["elementwise(mo.range)", "range)"]


def test_op_lanes_in_perfetto_and_the_op_table_in_html() -> None:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    from max_profile.render.html import render_html
    from max_profile.render.perfetto import OP_TRACK_BASE, build_perfetto

    raw, report = _load("ops_a")
    trace = pb.Trace()
    trace.ParseFromString(build_perfetto(raw))
    lanes = [p.track_descriptor.name for p in trace.packet if p.HasField("track_descriptor")]
    assert [n for n in lanes if n.startswith("MAX ops")] == ["MAX ops, thread 1353 (host: each op's launch)"]
    op_events = [p for p in trace.packet if p.HasField("track_event") and p.track_event.track_uuid >= OP_TRACK_BASE]
    assert len(op_events) == 2 * len(raw.op_ranges)  # a begin and an end per op range
    page = render_html(report)
    assert 'data-section="ops"' in page and "flash_attention" in page and "100.0 % of" in page


def test_unfused_attention_per_step_over_one_step_where_the_phase_counts_no_steps() -> None:
    """The op table's coverage counts no steps for the phase: the attention ops' time is given per one step, not
    halved; the top families are the breakdown's first five."""
    import msgspec

    from max_profile.analyze.rules.kernel_mix import rule_unfused
    from max_profile.analyze.thresholds import Thresholds
    from max_profile.model import KernelBreakdown

    _, report = _load("ops_b")
    assert isinstance(report.ops, OpBreakdown) and isinstance(report.kernels, KernelBreakdown)
    assert len(report.kernels.families) > 5
    parts = [
        r
        for r in report.ops.rows
        if r.phase == "decode"
        and (r.op == "batched_matmul" or "kv_cache_gather_rows_ragged" in r.op or "reduce.softmax" in r.op)
    ]
    assert len(parts) == 3
    coverage = [msgspec.structs.replace(c, steps=0) for c in report.ops.coverage]
    bare = msgspec.structs.replace(report, ops=msgspec.structs.replace(report.ops, coverage=coverage))
    [f] = [f for f in rule_unfused(bare, Thresholds()) if f.id == "unfused-attention"]
    assert f.evidence["attention_ops_ms_per_step"] == round(sum(r.gpu_ms for r in parts), 4)
    top = str(f.evidence["top_families"]).split(",")
    assert len(top) == 5 and top == [r.family for r in report.kernels.families][:5]
