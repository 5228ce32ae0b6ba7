"""Per-device attribution on recorded data split by device id (the multi-GPU run itself needs the
withheld nvidia-h200-x2 kind). The big H200 capture is copied onto two device ids; on each device
an NCCL allreduce kernel is added after every decode step's kernels."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from max_profile.analyze.report import build_report
from max_profile.model import KernelBreakdown, KernelRecord, KernelTable, RawCapture

H200 = Path(__file__).parent / "data" / "h200"


def split_with_allreduce(allreduce_us: float) -> RawCapture:
    raw = RawCapture.load(str(H200 / "big_cupti_raw.json.gz"))
    records = raw.kernels.records()
    t = raw.kernels
    assert t.launch_ns is not None
    ends_after: list[int] = []  # per decode step: the end of the last kernel launched in it
    for step in raw.steps:
        if step.phase == "decode" and step.batch_size:
            inside = (t.launch_ns >= step.start_ns) & (t.launch_ns <= step.end_ns)
            ends_after.append(int(t.end_ns[inside].max()))
    decode = [s for s in raw.steps if s.phase == "decode" and s.batch_size]
    kernels: list[KernelRecord] = []
    for dev in (0, 1):
        kernels += [msgspec.structs.replace(k, device=dev) for k in records]
        kernels += [KernelRecord(name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL", start_ns=end, end_ns=end + int(allreduce_us * 1e3), device=dev,
                                 launch_ns=step.end_ns - 1000) for step, end in zip(decode, ends_after, strict=True)]
    kernels.sort(key=lambda k: k.start_ns)
    return msgspec.structs.replace(raw, kernels=KernelTable.from_records(kernels))


def test_per_device_tables_and_collective_time() -> None:
    report = build_report(split_with_allreduce(200.0))
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    assert k.devices == [0, 1] and [d.device for d in k.per_device] == [0, 1]
    for d in k.per_device:
        assert d.kernels == 19580 + 64  # 46 records per device have invalid timestamps (the capture's own)
        assert d.collective_ms_per_decode_step == pytest.approx(0.2, abs=1e-6)
        assert d.collective_share_of_decode_pct == pytest.approx(100 * 0.2 / (3.8141 + 0.2), abs=0.1)
        assert d.families[0].family == "gemv"
    fam = {f.family for f in k.families}
    assert "collective" in fam
    ids = {f.id for f in report.findings}
    assert "communication-share" in ids and "communication-dominates" not in ids
    assert "Per device" in str(report)


def test_communication_dominates() -> None:
    report = build_report(split_with_allreduce(3000.0))
    f = next(f for f in report.findings if f.id == "communication-dominates")
    assert f.evidence["max_collective_share_of_decode_pct"] > 30


def test_single_device_has_no_per_device_table() -> None:
    report = build_report(RawCapture.load(str(H200 / "big_cupti_raw.json.gz")))
    assert isinstance(report.kernels, KernelBreakdown) and report.kernels.per_device == []
    assert not {f.id for f in report.findings} & {"communication-share", "communication-dominates"}
