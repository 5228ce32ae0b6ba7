"""MAX's ops joined to the kernels they launched: generated tables with a known answer.

The H200 captures of ``--kernels ops`` are tested in tests/gpu/test_ops_mode.py; here every case of the join is built by
hand: a kernel whose launch call lies in an op's range, one launched between ops, one from a thread without ops, an op
that launched nothing, two op threads and the two thread-naming schemes (Linux tids in the NVTX log, pthread ids in
CUPTI).

The op join (``analyze.ops``) at its edges, every figure exact: launches at 0 ns, one op range on a thread, threads
with no launch matched, missing launch columns one at a time, invalid kernels, a range that starts in one phase and
launches in the next, phases with ops and no kernels (or kernels and no ops), per-op kernel sums, the graph note, op
labels and the attention stand-ins' phase. Mutation testing found these unpinned (benchmarks/mutation_report.md)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from max_profile.analyze.ops import UNATTRIBUTED, attention_stand_ins, op_breakdown, op_label, op_of_kernels
from max_profile.analyze.report import build_report
from max_profile.model import (
    Capture,
    Environment,
    KernelRecord,
    KernelTable,
    OpBreakdown,
    OpCoverage,
    OpRow,
    RawCapture,
    Step,
    Unavailable,
)

OP_TID, OTHER_OP_TID = 1006, 1010  # Linux thread ids (the NVTX log)
CUPTI_TID, CUPTI_OTHER = 3460294336, 419656448  # pthread ids (CUPTI's threadId)


def _op(name: str, start: int, end: int, tid: int = OP_TID) -> KernelRecord:
    return KernelRecord(name=name, start_ns=start, end_ns=end, device=-1, launch_tid=tid, launch_ns=start)


def _kernel(name: str, launch: int, start: int, end: int, tid: int = CUPTI_TID) -> KernelRecord:
    return KernelRecord(name=name, start_ns=start, end_ns=end, device=0, launch_ns=launch, launch_tid=tid)


def _step(i: int, phase: str, start: int, end: int) -> Step:
    return Step(
        index=i,
        phase=phase,  # type: ignore[arg-type]
        batch_size=1,
        input_tokens=8 if phase == "prefill" else 1,
        context_tokens=0,
        start_ns=start,
        end_ns=end,
    )


OPS = [
    _op("matmulmo.matmul", 1_000, 1_100),
    _op("reduce.rms_norm", 1_200, 1_250),  # launches nothing
    _op("flash_attention", 1_300, 1_400),
    _op("matmulmo.matmul", 10_000, 10_100),
    _op("softmax", 10_200, 10_300),
    _op("matmulmo.matmul", 10_000, 10_050, tid=OTHER_OP_TID),  # another op thread, launching nothing of ours
]
KERNELS = [
    _kernel("gemv_split_k_bf16", 1_010, 2_000, 2_600),  # prefill, in matmul
    _kernel("mha_prefill", 1_350, 2_600, 3_000),  # prefill, in flash_attention
    _kernel("elementwise_add", 1_500, 3_000, 3_100),  # prefill, between ops
    _kernel("gemv_split_k_bf16", 10_050, 11_000, 11_400),  # decode, in matmul
    _kernel("softmax_kernel", 10_250, 11_400, 11_500),  # decode, in softmax
    _kernel("memcpy_like", 10_020, 11_500, 11_520, tid=CUPTI_OTHER),  # a thread without ops in its launches' times
]


def _raw() -> RawCapture:
    return RawCapture(
        environment=Environment(vendor="nvidia", vendor_reason="generated"),
        capture=Capture(started_unix_s=0.0, target="test"),
        steps=[_step(0, "prefill", 900, 1_600), _step(1, "decode", 9_900, 10_400)],
        kernels=KernelTable.from_records(KERNELS),
        op_ranges=KernelTable.from_records(OPS),
        kernel_source="cupti",
    )


def test_each_kernel_goes_to_the_op_whose_range_holds_its_launch() -> None:
    raw = _raw()
    idx, how = op_of_kernels(raw.kernels, raw.op_ranges)
    names = [raw.op_ranges.name_of(int(i)) if i >= 0 else None for i in idx]
    # kernels are ordered by start in the table; match by launch time
    by_launch = dict(zip(raw.kernels.launch_ns.tolist(), names, strict=True))  # type: ignore[union-attr]
    assert by_launch == {
        1_010: "matmulmo.matmul",
        1_350: "flash_attention",
        1_500: None,
        10_050: "matmulmo.matmul",
        10_250: "softmax",
        10_020: "matmulmo.matmul",  # its thread is matched to the op thread holding its one launch
    }
    assert "2 of 2 launching thread(s) matched" in how and f"{CUPTI_TID}->{OP_TID}" in how


def test_per_op_table_by_phase_with_coverage_and_silent_ops() -> None:
    ops = op_breakdown(_raw())
    assert isinstance(ops, OpBreakdown)
    cov = {c.phase: c for c in ops.coverage}
    # prefill kernels: 600 + 400 + 100 ns, 1000 of 1100 inside named ops
    assert (cov["prefill"].kernels, cov["prefill"].kernel_ms, cov["prefill"].attributed_ms) == (3, 1.1e-3, 1.0e-3)
    assert round(cov["prefill"].attributed_pct, 3) == round(100 * 1000 / 1100, 3)
    assert (cov["prefill"].calls, cov["prefill"].calls_without_kernels) == (3, 1)  # rms_norm launched nothing
    # decode: 400 + 100 + 20 ns, all inside ops; the other op thread's range launched nothing
    assert (cov["decode"].kernels, cov["decode"].attributed_pct, cov["decode"].calls_without_kernels) == (3, 100.0, 1)
    rows = {(r.phase, r.op): r for r in ops.rows}
    mm = rows[("decode", "matmulmo.matmul")]
    assert (mm.calls, mm.kernels, round(mm.gpu_ms * 1e6), round(mm.share_pct, 3)) == (2, 2, 420, round(42000 / 520, 3))
    assert mm.top_kernels == ["gemv_split_k_bf16", "memcpy_like"] and round(mm.host_ms * 1e6) == 150
    assert rows[("prefill", UNATTRIBUTED)].kernels == 1 and rows[("prefill", "reduce.rms_norm")].kernels == 0
    assert [r.op for r in ops.rows if r.phase == "prefill"][0] == "matmulmo.matmul"  # most GPU time first
    assert ops.ops_without_kernels == ["reduce.rms_norm"]


def test_no_op_ranges_no_section_and_no_launches_said() -> None:
    raw = _raw()
    raw.op_ranges = KernelTable.empty()
    assert op_breakdown(raw) is None
    raw = _raw()
    raw.kernels = KernelTable.from_records([KernelRecord(name="k", start_ns=1, end_ns=2, device=0)])
    assert isinstance(op_breakdown(raw), Unavailable)


def test_the_report_carries_the_op_table_and_survives_a_round_trip() -> None:
    raw = RawCapture.from_json(_raw().to_json())
    assert len(raw.op_ranges) == len(OPS)
    report = build_report(raw)
    assert isinstance(report.ops, OpBreakdown) and report.ops.rows
    from max_profile.model import Report
    from max_profile.render.text import render_text

    again = Report.from_json(report.to_json())
    assert again.ops == report.ops
    text = render_text(report, width=100)
    assert "MAX ops on the GPU" in text and "flash_attention" in text and "launched no kernel" in text
    assert np.isfinite([c.attributed_pct for c in report.ops.coverage]).all()


def _capture(ops: list[KernelRecord], kernels: list[KernelRecord], steps: list[tuple[str, int, int]]) -> RawCapture:
    raw = _raw()
    raw.op_ranges = KernelTable.from_records(ops)
    raw.kernels = KernelTable.from_records(kernels)
    raw.steps = [_step(i, phase, a, b) for i, (phase, a, b) in enumerate(steps)]
    return raw


def test_a_launch_at_0_ns_in_the_only_range_of_its_thread() -> None:
    """Time 0 is a launch time; a thread whose one range holds the launch is matched (its range is index 0)."""
    raw = _capture([_op("matmulmo.matmul", 0, 100)], [_kernel("gemv", 0, 50, 80)], [("decode", 0, 200)])
    idx, how = op_of_kernels(raw.kernels, raw.op_ranges)
    assert idx.tolist() == [0]
    assert how == (
        "each kernel's launch call inside the innermost op range on its thread; 1 of 1 launching thread(s) matched "
        f"to op threads by their launches ({CUPTI_TID}->{OP_TID})"
    )


def test_a_launching_thread_without_a_match_keeps_its_kernels_unattributed() -> None:
    """A second CUPTI thread whose launches fall outside every op range matches no op thread: its kernels stay -1, as
    does a kernel of the matched thread launched between ranges; the join says 1 of 2."""
    raw = _capture(
        [_op("matmulmo.matmul", 0, 100)],
        [
            _kernel("gemv", 10, 50, 80),
            _kernel("add", 300, 400, 420),  # the matched thread, launched between ranges
            _kernel("memcpy", 500, 600, 610, tid=CUPTI_OTHER),
        ],
        [("decode", 0, 1000)],
    )
    idx, how = op_of_kernels(raw.kernels, raw.op_ranges)
    assert idx.tolist() == [0, -1, -1] and "; 1 of 2 launching thread(s) matched" in how


def test_without_any_launch_column_nothing_is_joined() -> None:
    raw = _capture([_op("matmulmo.matmul", 0, 100)], [_kernel("gemv", 10, 50, 80)], [("decode", 0, 200)])
    for field, table in (("launch_tid", "kernels"), ("launch_ns", "kernels"), ("launch_tid", "ops")):
        k = raw.kernels if table == "ops" else msgspec.structs.replace(raw.kernels, **{field: None})
        o = raw.op_ranges if table == "kernels" else msgspec.structs.replace(raw.op_ranges, **{field: None})
        idx, how = op_of_kernels(k, o)
        assert idx.tolist() == [-1] and how == "no launch records or no op ranges: nothing joined"
    idx, _ = op_of_kernels(raw.kernels, KernelTable.empty())
    assert idx.tolist() == [-1]


def test_the_table_without_launch_records_is_unavailable_with_its_reason() -> None:
    raw = _capture([_op("matmulmo.matmul", 0, 100)], [_kernel("gemv", 10, 50, 80)], [("decode", 0, 200)])
    raw.kernels = msgspec.structs.replace(raw.kernels, launch_ns=None)
    got = op_breakdown(raw)
    assert isinstance(got, Unavailable)
    assert got.reason == "op ranges were recorded but no kernels with their launch calls: nothing to join them to"


def _rows(ops: OpBreakdown) -> dict[tuple[str, str], OpRow]:
    return {(r.phase, r.op): r for r in ops.rows}


def test_a_range_that_launches_into_the_next_phase_and_a_phase_of_host_only_ops() -> None:
    """The prefill holds two host-only ops (no kernel in that phase: 0 % attributed of no kernel time, every share 0);
    a matmul range opened at the prefill's end launches its kernel inside the decode step (the kernel's phase is its
    launch's): in decode the op has GPU time but no call and no host time; an invalid kernel (end before start) counts
    nowhere."""
    raw = _capture(
        [_op("reduce.rms_norm", 100, 200), _op("reduce.softmax", 300, 350), _op("matmulmo.matmul", 900, 1300)],
        [_kernel("gemv", 1100, 1200, 1500), _kernel("gemv", 1150, 1600, 1500)],  # the second ends before it starts
        [("prefill", 0, 1000), ("decode", 1000, 2000)],
    )
    ops = op_breakdown(raw)
    assert isinstance(ops, OpBreakdown)
    cov = {c.phase: c for c in ops.coverage}
    assert cov["prefill"] == OpCoverage(
        phase="prefill",
        steps=1,
        kernels=0,
        kernel_ms=0.0,
        attributed_ms=0.0,
        attributed_pct=0.0,
        calls=3,
        calls_without_kernels=2,
    )
    assert cov["decode"] == OpCoverage(
        phase="decode",
        steps=1,
        kernels=1,
        kernel_ms=300 / 1e6,
        attributed_ms=300 / 1e6,
        attributed_pct=100.0,
        calls=0,
        calls_without_kernels=0,
    )
    rows = _rows(ops)
    mm_decode = rows[("decode", "matmulmo.matmul")]
    assert (mm_decode.calls, mm_decode.kernels, mm_decode.gpu_ms, mm_decode.share_pct, mm_decode.host_ms) == (
        0,
        1,
        300 / 1e6,
        100.0,
        0.0,
    )
    norm = rows[("prefill", "reduce.rms_norm")]
    assert (norm.calls, norm.kernels, norm.gpu_ms, norm.share_pct, norm.host_ms) == (1, 0, 0.0, 0.0, 100 / 1e6)
    assert rows[("prefill", "matmulmo.matmul")].host_ms == 400 / 1e6
    assert [r.op for r in ops.rows if r.phase == "prefill"] == ["matmulmo.matmul", "reduce.rms_norm", "reduce.softmax"]
    assert ops.ops_without_kernels == ["reduce.rms_norm", "reduce.softmax"]


def test_a_phase_with_kernels_and_no_op_ranges() -> None:
    """Decode's kernel has no op range: 0 % attributed, its time on the unattributed row. A silent op of the prefill,
    which has kernel time, has no share of it."""
    raw = _capture(
        [_op("matmulmo.matmul", 100, 200), _op("reduce.rms_norm", 250, 300)],
        [_kernel("gemv", 150, 300, 400), _kernel("gemv", 1100, 1200, 1300)],
        [("prefill", 0, 1000), ("decode", 1000, 2000)],
    )
    ops = op_breakdown(raw)
    assert isinstance(ops, OpBreakdown)
    decode = next(c for c in ops.coverage if c.phase == "decode")
    assert (decode.kernels, decode.attributed_pct, decode.calls) == (1, 0.0, 0)
    assert _rows(ops)[("decode", UNATTRIBUTED)].gpu_ms == 100 / 1e6
    assert _rows(ops)[("prefill", "reduce.rms_norm")].share_pct == 0.0


def test_an_ops_kernels_are_summed_by_name_and_ranked_by_time() -> None:
    """Two launches of one kernel outweigh one longer launch of another: the op's kernels by summed time (not by name,
    not by the last launch)."""
    raw = _capture(
        [_op("attention_ops", 0, 1000)],
        [_kernel("zz_gather", 10, 100, 160), _kernel("zz_gather", 20, 200, 260), _kernel("aa_softmax", 30, 300, 400)],
        [("decode", 0, 2000)],
    )
    ops = op_breakdown(raw)
    assert isinstance(ops, OpBreakdown)
    row = _rows(ops)[("decode", "attention_ops")]
    assert row.top_kernels == ["zz_gather", "aa_softmax"] and row.gpu_ms == 220 / 1e6


def test_device_graph_launches_are_said_in_the_join() -> None:
    raw = _capture([_op("matmulmo.matmul", 0, 100)], [_kernel("gemv", 10, 50, 80)], [("decode", 0, 200)])
    raw.graph_launches = 3
    ops = op_breakdown(raw)
    assert isinstance(ops, OpBreakdown)
    assert ops.join.startswith("each kernel's launch call inside the innermost op range on its thread; 1 of 1")
    assert ops.join.endswith(
        "; 3 device-graph launches: the kernels of a graph replay carry no op range (record ops with device graphs off)"
    )


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("Prologue(fused reduce.softmax, x)", "reduce.softmax"),
        ("Epilogue(batched_matmul_2)", "batched_matmul_2"),
        ("elementwise(kv_cache_gather_rows_ragged)", "kv_cache_gather_rows_ragged"),
        ("elementwise(mogg.foreach)", "mogg.foreach"),
        ("batched_matmul", "batched_matmul"),  # an attention part without a composition around it: the name
        ("my_rotary(" + "x" * 80 + ")", ("my_rotary(" + "x" * 80)[:60]),
        ("elementwise(a b)", "elementwise(a b)"),  # not one dotted word inside: the name
    ],
)
def test_op_labels(name: str, label: str) -> None:
    assert op_label(name) == label


def test_attention_stand_ins_without_decode_come_from_the_busiest_phase() -> None:
    def cov(phase: str, ms: float) -> OpCoverage:
        return OpCoverage(
            phase=phase,  # type: ignore[arg-type]
            steps=1,
            kernels=1,
            kernel_ms=ms,
            attributed_ms=ms,
            attributed_pct=100.0,
            calls=1,
            calls_without_kernels=0,
        )

    def row(phase: str, op: str, ms: float) -> OpRow:
        return OpRow(op=op, phase=phase, calls=1, kernels=1, gpu_ms=ms, share_pct=50.0, host_ms=0.0)  # type: ignore[arg-type]

    ops = OpBreakdown(
        source="t",
        join="t",
        coverage=[cov("prefill", 2.0), cov("mixed", 5.0)],
        rows=[row("prefill", "batched_matmul", 1.0), row("mixed", "reduce.softmax", 1.0), row("mixed", "bmm", 3.0)],
    )
    phase, parts = attention_stand_ins(ops)
    assert phase == "mixed" and [r.op for r in parts] == ["bmm", "reduce.softmax"]
    with_decode = msgspec.structs.replace(ops, coverage=[*ops.coverage, cov("decode", 0.1)])
    assert attention_stand_ins(with_decode) == ("decode", [])
