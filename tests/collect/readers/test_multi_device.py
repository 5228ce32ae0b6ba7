"""Per-device attribution on recorded data split by device id (the multi-GPU run itself needs the
withheld nvidia-h200-x2 kind). The big H200 capture is copied onto two device ids; on each device
an NCCL allreduce kernel is added after every decode step's kernels."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from max_profile.analyze.report import build_report
from max_profile.model import KernelBreakdown, KernelRecord, KernelTable, RawCapture

H200 = Path(__file__).parents[2] / "data" / "gpu"


def split_with_allreduce(allreduce_us: float, second_device_us: float | None = None) -> RawCapture:
    raw = RawCapture.load(str(H200 / "h200_llama7b_gemv_decode/big_cupti_raw.json.gz"))
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
        us = allreduce_us if dev == 0 or second_device_us is None else second_device_us
        kernels += [
            KernelRecord(
                name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                start_ns=end,
                end_ns=end + int(us * 1e3),
                device=dev,
                launch_ns=step.end_ns - 1000,
            )
            for step, end in zip(decode, ends_after, strict=True)
        ]
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
    report = build_report(RawCapture.load(str(H200 / "h200_llama7b_gemv_decode/big_cupti_raw.json.gz")))
    assert isinstance(report.kernels, KernelBreakdown) and report.kernels.per_device == []
    assert not {f.id for f in report.findings} & {"communication-share", "communication-dominates"}


def test_per_device_figures_are_each_devices_own() -> None:
    """Device 0 spends 200 µs per decode step in allreduce, device 1 600 µs: each device's table has its own collective
    time, share and kernel time (the larger on device 1, named as the worst), not the other's."""
    report = build_report(split_with_allreduce(200.0, second_device_us=600.0))
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    d0, d1 = k.per_device
    assert d0.collective_ms_per_decode_step == pytest.approx(
        0.2, abs=1e-6
    ) and d1.collective_ms_per_decode_step == pytest.approx(0.6, abs=1e-6)
    assert d0.collective_share_of_decode_pct == pytest.approx(100 * 0.2 / (3.8141 + 0.2), abs=0.1)
    assert d1.collective_share_of_decode_pct == pytest.approx(100 * 0.6 / (3.8141 + 0.6), abs=0.1)
    assert d1.kernel_ms - d0.kernel_ms == pytest.approx(64 * 0.4, rel=1e-3) and d0.kernels == d1.kernels
    assert d0.families[0].family == "gemv" and {f.family for f in d1.families} >= {"gemv", "collective"}
    f = next(f for f in report.findings if f.id.startswith("communication"))
    assert f.evidence["device"] == 1 and f.evidence["max_collective_share_of_decode_pct"] == pytest.approx(
        13.6, abs=0.1
    )
    assert f.evidence["collective_ms_per_decode_step"] == pytest.approx(0.6, abs=1e-4) and f.evidence["devices"] == 2
