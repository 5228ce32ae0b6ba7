"""MAX's ops joined to the kernels they launched: generated tables with a known answer.

The H200 captures of ``--kernels ops`` are tested in tests/test_gpu_ops_mode.py; here every case of the join is built by
hand: a kernel whose launch call lies in an op's range, one launched between ops, one from a thread without ops, an op
that launched nothing, two op threads and the two thread-naming schemes (Linux tids in the NVTX log, pthread ids in
CUPTI).
"""

from __future__ import annotations

import numpy as np

from max_profile.analyze.ops import UNATTRIBUTED, op_breakdown, op_of_kernels
from max_profile.analyze.report import build_report
from max_profile.model import (
    Capture,
    Environment,
    KernelRecord,
    KernelTable,
    OpBreakdown,
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
