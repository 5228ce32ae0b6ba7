"""The host-bound verdict when there is no step ledger (mutation testing found its figures unpinned).

Without a kernel timeline split into steps, ``rule_gpu_idle`` judges the GPU from NVML's utilization (``--kernels
off``) or from a trace's busy share of the whole window (a trace without phase ranges). The base is a real H200
capture (``--kernels off``, 1,024 decode tokens); its utilization and kernel sections are replaced by
figures chosen at the thresholds, and every number of the finding is recomputed here from those figures.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from max_profile.analyze.report import build_report
from max_profile.analyze.rules.base import step_summary
from max_profile.analyze.rules.idle import rule_gpu_idle
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import GpuUtilization, KernelBreakdown, RawCapture, Report, UtilizationSection

S7 = Path(__file__).parents[2] / "data" / "gpu" / "h200_llama5b_every_verb"
S12 = Path(__file__).parents[2] / "data" / "gpu" / "h200_llama3b_batch64_ledger"
TH = Thresholds()


def _gpu(name: str, mean: float | None, peak: float | None = 61.0, samples: int = 30) -> GpuUtilization:
    return GpuUtilization(
        gpu=name,
        samples=samples,
        peak_utilization_pct=peak,
        mean_utilization_pct=mean,
        peak_memory_bytes=None,
        memory_total_bytes=None,
        peak_memory_pct=None,
        mean_sm_clock_mhz=None,
        max_sm_clock_mhz=None,
        hardware_throttle_reasons=[],
    )


@pytest.fixture(scope="module")
def base() -> Report:
    report = build_report(RawCapture.load(str(S7 / "run_off1024_raw.json.gz")))
    assert report.ledger is None or not isinstance(report.kernels, KernelBreakdown)  # the NVML path, no ledger
    return report


def _with_gpus(base: Report, *gpus: GpuUtilization) -> Report:
    assert isinstance(base.utilization, UtilizationSection)
    return msgspec.structs.replace(base, utilization=msgspec.structs.replace(base.utilization, gpus=list(gpus)))


def _decode(report: Report) -> tuple[float, float]:
    summary = step_summary(report)
    assert summary is not None
    phases = {p.phase: p for p in summary.phases}
    assert phases["prefill"].p50_ms != phases["decode"].p50_ms  # a wrong phase would show
    return phases["decode"].p50_ms, phases["decode"].total_ms


def test_nvml_host_bound_takes_the_busiest_gpu_and_prices_its_idle_share(base: Report) -> None:
    """Three GPUs: the busiest (39.94 %, under the 40 % threshold) speaks; its idle share prices the decode step."""
    report = _with_gpus(base, _gpu("nv1", 12.0), _gpu("nv0", 39.94, peak=61.0, samples=31), _gpu("nv2", None))
    [f] = rule_gpu_idle(report, TH)
    p50, total = _decode(report)
    assert f.id == "host-bound" and f.severity == "warning" and f.confidence == 0.7
    assert f.evidence == {
        "gpu": "nv0",
        "mean_utilization_pct": 39.9,
        "peak_utilization_pct": 61.0,
        "samples": 31,
        "decode_step_p50_ms": round(p50, 3),
        "threshold_pct": 40.0,
    }
    idle = 1 - 39.9 / 100
    assert f.lever is not None and f.lever.phase == "decode" and f.lever.part == "GPU idle (estimated from NVML)"
    assert (f.lever.ms_per_step, f.lever.pct_of_step, f.lever.total_ms) == (
        round(idle * p50, 4),
        round(100 * idle, 1),
        round(idle * total, 3),
    )
    assert f.title.startswith("Host-bound: the GPU idles while steps run")


def test_nvml_at_the_threshold_is_not_host_bound(base: Report) -> None:
    assert rule_gpu_idle(_with_gpus(base, _gpu("nv0", 40.0)), TH) == []
    assert rule_gpu_idle(_with_gpus(base, _gpu("nv0", 39.99)), TH)[0].evidence["mean_utilization_pct"] == 40.0
    # too few samples to judge (NVML averages over up to 1 s): no verdict
    assert rule_gpu_idle(_with_gpus(base, _gpu("nv0", 5.0, samples=TH.nvml_min_samples - 1)), TH) == []


@pytest.fixture(scope="module")
def traced() -> Report:
    """A real in-process CUPTI capture (batch 64), its kernel section kept and its ledger dropped: a trace
    whose kernels carry no phase ranges."""
    report = build_report(RawCapture.load(str(S12 / "run_b64_3b_raw.json.gz")))
    assert isinstance(report.kernels, KernelBreakdown)
    kernels = msgspec.structs.replace(report.kernels, phases=[], unreliable=False, recorded_ms=None)
    return msgspec.structs.replace(report, ledger=None, kernels=kernels)


def _busy(report: Report, busy: float, **kw: object) -> Report:
    assert isinstance(report.kernels, KernelBreakdown)
    return msgspec.structs.replace(
        report, kernels=msgspec.structs.replace(report.kernels, gpu_busy_pct=busy, **kw), utilization=None
    )


def test_trace_without_phases_host_bound_from_its_busy_share(traced: Report) -> None:
    report = _busy(traced, 37.26, window_ms=1234.56789)
    [f] = rule_gpu_idle(report, TH)
    p50, total = _decode(report)
    assert isinstance(report.kernels, KernelBreakdown)
    assert f.evidence == {
        "gpu_busy_pct": 37.3,
        "kernels": report.kernels.kernels,
        "window_ms": 1234.568,
        "busy_scope": "whole capture window (no phase ranges)",
        "decode_step_p50_ms": round(p50, 3),
        "threshold_pct": 40.0,
    }
    assert f.confidence == round(0.7 * TH.no_phase_confidence_scale, 2)
    assert f.title == "Host-bound: the GPU ran kernels 37% of the capture window (no phase ranges: whole capture)"
    idle = 1 - 37.26 / 100
    assert f.lever is not None and f.lever.part == "GPU idle (estimated from the kernel timeline)"
    assert (f.lever.ms_per_step, f.lever.pct_of_step, f.lever.total_ms) == (
        round(idle * p50, 4),
        round(100 * idle, 1),
        round(idle * total, 3),
    )


def test_trace_without_phases_edges(traced: Report, base: Report) -> None:
    """At the threshold: no verdict; a sampled recording says so; no window length reads 0; an unreliable trace or one
    with phases is not judged here; a low NVML reading beside it raises the confidence."""
    assert "host-bound" not in {f.id for f in rule_gpu_idle(_busy(traced, 40.0), TH)}
    sliced = rule_gpu_idle(_busy(traced, 30.0, recorded_ms=250.0, window_ms=None), TH)[0]
    assert sliced.evidence["busy_scope"] == "the recorded slices of the capture window (250.0 ms; no phase ranges)"
    assert sliced.evidence["window_ms"] == 0.0
    assert "host-bound" not in {f.id for f in rule_gpu_idle(_busy(traced, 30.0, unreliable=True), TH)}
    phased = build_report(RawCapture.load(str(S12 / "run_b64_3b_raw.json.gz"))).kernels
    assert isinstance(phased, KernelBreakdown) and phased.phases
    assert "host-bound" not in {f.id for f in rule_gpu_idle(_busy(traced, 30.0, phases=phased.phases), TH)}
    assert isinstance(traced.kernels, KernelBreakdown)
    both = msgspec.structs.replace(_busy(traced, 30.0), utilization=_with_gpus(base, _gpu("nv0", 20.0)).utilization)
    [f] = rule_gpu_idle(both, TH)
    assert f.confidence == round(0.9 * TH.no_phase_confidence_scale, 2) and f.evidence["mean_utilization_pct"] == 20.0
    assert f.lever is not None and f.lever.pct_of_step == 70.0  # the trace's busy share prices it, not NVML's


def test_nvml_edges_a_gpu_never_sampled_an_idle_gpu_and_no_decode_phase(base: Report) -> None:
    """A GPU with no utilization reading does not outrank one at 0.5 %; a GPU at 0 % prices all of the decode step as
    idle; a capture without decode steps still gets the verdict, with no lever to price."""
    [f] = rule_gpu_idle(_with_gpus(base, _gpu("never", None), _gpu("nv1", 0.5)), TH)
    assert f.evidence["gpu"] == "nv1" and f.evidence["mean_utilization_pct"] == 0.5
    assert (f.next_step or "").startswith("Stop here: a kernel trace adds nothing until the GPU is busy")
    [idle] = rule_gpu_idle(_with_gpus(base, _gpu("nv0", 0.0)), TH)
    p50, total = _decode(base)
    assert idle.lever is not None and (idle.lever.ms_per_step, idle.lever.pct_of_step, idle.lever.total_ms) == (
        round(p50, 4),
        100.0,
        round(total, 3),
    )
    summary = step_summary(base)
    assert summary is not None
    prefill_only = msgspec.structs.replace(
        _with_gpus(base, _gpu("nv0", 10.0)),
        step_summary=msgspec.structs.replace(summary, phases=[p for p in summary.phases if p.phase != "decode"]),
    )
    [no_decode] = rule_gpu_idle(prefill_only, TH)
    assert no_decode.lever is None and "decode_step_p50_ms" not in no_decode.evidence


def test_the_recordings_share_of_a_served_step_is_the_traced_servers_own() -> None:
    """`serve --mode kernels` measured its recorder against an untraced window of the same server: the decode step's
    share that is the recording's own is the server's recorded step less its untraced one (its /metrics), whatever the
    kernel ledger's step is; another phase loses its step times the throughput lost."""
    from max_profile.analyze.rules.idle import recording_share_ms
    from max_profile.model import StepLedger, TracerCost

    cost = TracerCost(
        concurrency=1,
        reference_tok_s=147.0,
        traced_tok_s=122.6,
        throughput_ratio=122.6 / 147.0,
        reference_decode_step_ms=6.80,
        traced_decode_step_ms=8.21,
    )
    ledgered = build_report(RawCapture.load(str(S12 / "run_b64_3b_raw.json.gz")))
    served = msgspec.structs.replace(ledgered, tracer_cost=cost)
    lg = ledgered.ledger
    assert isinstance(lg, StepLedger)
    decode = next(p for p in lg.phases if p.phase == "decode")
    assert abs(decode.step_ms - (8.21 - 6.80)) > 0.1  # the ledger's step is another figure
    assert recording_share_ms(served, decode) == pytest.approx(8.21 - 6.80)
    prefill = next(p for p in lg.phases if p.phase == "prefill")
    assert recording_share_ms(served, prefill) == pytest.approx(prefill.step_ms * (1 - 122.6 / 147.0))
    assert recording_share_ms(ledgered, decode) is None  # nothing measured against an untraced window
