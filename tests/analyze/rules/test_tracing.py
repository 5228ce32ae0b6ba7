"""The rules about the trace itself, field by field: device graphs that hid kernels, the in-process tracer's own cost
(inferred from its callbacks, or measured against an untraced window of the same server), phase ranges missing and
the advice that fits what the report knows of the machine. Thresholds at their exact values from both sides."""

from __future__ import annotations

import dataclasses
from functools import cache

import msgspec
import pytest

from max_profile.analyze.commands import for_model
from max_profile.analyze.report import build_report
from max_profile.analyze.rules.tracing import (
    _measured_tracer_cost,
    _phase_next_step,
    rule_graphs_hid_kernels,
    rule_phase_markers_missing,
    rule_tracer_overhead,
)
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import GpuWaits, KernelBreakdown, RawCapture, Report, TracerCost, UtilizationSection

from ...analyze.rules.test_rules import DATA
from ...analyze.rules.test_state import _base, gpu

TH = Thresholds()


@cache
def _served() -> Report:
    return build_report(
        RawCapture.load(str(DATA / "gpu" / "h200_llama5b_cupti_recorder" / "serve_kernels_raw.json.gz"))
    )


def with_kernels(report: Report, **fields: object) -> Report:
    assert isinstance(report.kernels, KernelBreakdown)
    return msgspec.structs.replace(report, kernels=msgspec.structs.replace(report.kernels, **fields))


def test_device_graphs_every_field() -> None:
    report = with_kernels(_base(), unreliable="graphs replayed 217 of 230 kernels unseen")
    (f,) = rule_graphs_hid_kernels(report, TH)
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    assert (f.id, f.severity, f.confidence) == ("device-graphs", "warning", 0.8)
    assert f.title == "Device graphs replayed the kernels: per-kernel and per-step numbers are unreliable"
    assert f.evidence == {
        "kernels": k.kernels,
        "source": k.source,
        "device_graph_capture": str(report.capture.device_graph_capture),
    }
    assert f.detail == "graphs replayed 217 of 230 kernels unseen"
    assert f.command == for_model(report, "kernels", backend="cupti") and f.command is not None
    assert f.command.verb == "kernels" and f.command.args.get("backend") == "cupti"
    assert f.next_step is not None and "--cuda-graph-trace=node" in f.next_step
    on = msgspec.structs.replace(report, capture=msgspec.structs.replace(report.capture, device_graph_capture=True))
    assert rule_graphs_hid_kernels(on, TH)[0].evidence["device_graph_capture"] == "True"
    assert rule_graphs_hid_kernels(_base(), TH) == []


def test_inferred_tracer_overhead_every_field_and_its_threshold() -> None:
    report = with_kernels(_base(), tracer_overhead_pct=12.3456)
    (f,) = rule_tracer_overhead(report, TH)
    assert (f.id, f.severity, f.confidence) == ("tracer-overhead", "warning", 0.8)
    assert f.evidence == {
        "tracer_callbacks_pct_of_window": 12.3,
        "source": "synthetic",
        "threshold_pct": TH.tracer_overhead_pct,
    }
    assert f.title == (
        "The in-process kernel tracer slowed the profiled process: utilization and host-time figures are distorted"
    )
    assert f.next_step is not None and f.next_step.startswith("Kernel families and per-kernel durations still hold")
    assert f.detail is not None and "cupti-python" in f.detail
    at = with_kernels(_base(), tracer_overhead_pct=TH.tracer_overhead_pct)
    assert rule_tracer_overhead(at, TH)
    assert not rule_tracer_overhead(with_kernels(_base(), tracer_overhead_pct=TH.tracer_overhead_pct - 1e-9), TH)
    assert not rule_tracer_overhead(_base(), TH)  # no figure: no verdict


def test_inferred_tracer_overhead_reads_the_busiest_gpu_s_mean_utilization() -> None:
    report = with_kernels(_base(), tracer_overhead_pct=50.0)

    def gpus(*means: float | None) -> Report:
        rows = [gpu(f"nv{i}", samples=3, mean_utilization_pct=m) for i, m in enumerate(means)]
        section = UtilizationSection(source="test", interval_s=0.1, gpus=rows, samples=[])
        return msgspec.structs.replace(report, utilization=section)

    assert rule_tracer_overhead(gpus(None, 55.555, 20.0), TH)[0].evidence["mean_utilization_pct_while_tracing"] == 55.6
    assert rule_tracer_overhead(gpus(None), TH)[0].evidence["mean_utilization_pct_while_tracing"] == 0
    assert "mean_utilization_pct_while_tracing" not in rule_tracer_overhead(gpus(), TH)[0].evidence


def waits(pct: float) -> GpuWaits:
    return GpuWaits(
        min_gap_us=20.0,
        max_gap_ms=50.0,
        gaps=10,
        waited_ms=1.0,
        waited_pct=5.0,
        before_graph_gaps=7,
        before_graph_ms=0.7,
        before_graph_pct=pct,
        gap_p50_us=40.0,
        longer_gaps=0,
        longer_ms=0.0,
    )


def measured(ratio: float, ref_step: float | None = 2.853, traced_step: float | None = 3.1049) -> TracerCost:
    return TracerCost(
        concurrency=4,
        reference_tok_s=5184.456,
        traced_tok_s=5184.456 * ratio,
        throughput_ratio=ratio,
        reference_decode_step_ms=ref_step,
        traced_decode_step_ms=traced_step,
    )


def test_measured_tracer_cost_every_field() -> None:
    report = with_kernels(_base(), tracer_overhead_pct=0.12345, gpu_waits=waits(31.4159))
    report = msgspec.structs.replace(report, tracer_cost=measured(0.9))
    (f,) = rule_tracer_overhead(report, TH)
    c = measured(0.9)
    assert (f.id, f.severity, f.confidence) == ("tracer-overhead", "warning", 0.9)
    assert f.evidence == {
        "recorded_tok_s": round(5184.456 * 0.9, 1),
        "untraced_tok_s": 5184.5,
        "throughput_ratio": 0.9,
        "throughput_ratio_noise": None,
        "recorded_decode_step_ms": 3.1049,
        "untraced_decode_step_ms": 2.853,
        "decode_step_change_pct": round(100 * (3.1049 / 2.853 - 1), 1),
        "concurrency": 4,
        "threshold_pct": TH.tracer_slowdown_pct,
        "tracer_callbacks_pct_of_window": 0.12,
        "gpu_waits_before_graphs": 7,
        "gpu_waits_before_graphs_pct": 31.42,
    }
    assert round(c.traced_tok_s, 1) != round(c.traced_tok_s, 2)
    slowdown = 100.0 * (1.0 - 0.9)
    assert f.title == (
        f"Kernel recording slowed this server by {slowdown:.1f} % ({c.traced_tok_s:.0f} vs 5184 tok/s untraced"
        "; the server's decode step 2.85 → 3.10 ms): throughput, latency and step times of the recorded windows are "
        "the recorded ones"
    )
    assert f.next_step is not None and f.next_step.startswith("Kernel families, their shares")
    assert f.detail is not None and f.detail.startswith("Measured on this server")


def test_measured_tracer_cost_only_where_it_stands_clear_of_the_windows_noise() -> None:
    """0.90 of untraced with the ratio uncertain by 0.04 is a cost (more than twice the noise from 1); with 0.05 the
    same drop is within it: no finding, as on a drifting H100 server, where windows with no CUPTI read
    0.86-1.11 of their untraced neighbours."""
    clear = msgspec.structs.replace(measured(0.9), throughput_ratio_noise=0.04)
    (f,) = rule_tracer_overhead(msgspec.structs.replace(_base(), tracer_cost=clear), TH)
    assert f.evidence["throughput_ratio_noise"] == 0.04
    within = msgspec.structs.replace(measured(0.9), throughput_ratio_noise=0.05)
    assert rule_tracer_overhead(msgspec.structs.replace(_base(), tracer_cost=within), TH) == []


def test_measured_tracer_cost_without_both_decode_steps_and_at_its_threshold() -> None:
    for ref, traced in ((2.853, None), (None, 3.1), (0.0, 3.1)):
        bare = with_kernels(_base(), gpu_waits=None, tracer_overhead_pct=None)
        report = msgspec.structs.replace(bare, tracer_cost=measured(0.8, ref, traced))
        (f,) = rule_tracer_overhead(report, TH)
        assert "decode step" not in f.title and f.title.startswith("Kernel recording slowed this server by 20.0 %")
        assert "tracer_callbacks_pct_of_window" not in f.evidence and "gpu_waits_before_graphs" not in f.evidence
    ratio = 0.93
    exact = dataclasses.replace(TH, tracer_slowdown_pct=100.0 * (1.0 - ratio))
    report = msgspec.structs.replace(_base(), tracer_cost=measured(ratio))
    assert rule_tracer_overhead(report, exact)
    above = dataclasses.replace(exact, tracer_slowdown_pct=exact.tracer_slowdown_pct + 1e-9)
    assert rule_tracer_overhead(report, above) == []
    # a measured cost under the threshold says nothing, even when the inferred one would
    small = with_kernels(msgspec.structs.replace(_base(), tracer_cost=measured(0.999)), tracer_overhead_pct=90.0)
    assert rule_tracer_overhead(small, TH) == []
    with pytest.raises(AssertionError):
        _measured_tracer_cost(msgspec.structs.replace(_base(), tracer_cost=None), TH)


def test_phases_missing_every_field_and_the_advice_for_this_machine() -> None:
    served = _served()
    (f,) = rule_phase_markers_missing(served, TH)
    k = served.kernels
    assert isinstance(k, KernelBreakdown)
    assert (f.id, f.severity, f.confidence) == ("phases-missing", "warning", 0.9)
    assert f.title == "The trace has no phase ranges: kernels cannot be split into prefill and decode"
    assert f.evidence == {
        "kernels": k.kernels,
        "source": k.source,
        "gpu_busy_pct": round(k.gpu_busy_pct, 1) if k.gpu_busy_pct is not None else None,
    }
    problem = "libnvToolsExt.so is missing (CUDA 13)"
    broken = msgspec.structs.replace(
        served, environment=msgspec.structs.replace(served.environment, max_profiling_problem=problem)
    )
    (g,) = rule_phase_markers_missing(broken, TH)
    assert g.command == for_model(broken, "run", kernels="cupti") and g.command is not None
    assert g.command.verb == "run" and g.command.args.get("kernels") == "cupti"
    assert g.next_step == (
        "MAX's scheduler ranges need MODULAR_ENABLE_PROFILING=on, which cannot work on this GPU image ("
        + problem
        + "). For a prefill / decode split, profile the model in-process, where max_profile marks the phases itself. "
        "Busy time and family verdicts below cover the whole capture."
    )
    assert f.command is None  # MAX's own ranges can work here: no command to replace them
    assert f.next_step is not None and f.next_step.startswith("Capture with max-profile (it marks prefill/decode")
    assert "nsys stats --report nvtx_sum" in f.next_step
    in_process = msgspec.structs.replace(broken, serve=None)
    assert _phase_next_step(in_process) == (
        "Capture with max-profile (it marks prefill/decode in the `max_profile` NVTX domain; "
        "MODULAR_ENABLE_PROFILING=on cannot work on this GPU image: "
        + problem
        + "). Busy time and family verdicts below cover the whole capture."
    )
    assert rule_phase_markers_missing(in_process, TH)[0].command is None
    assert rule_phase_markers_missing(_base(), TH) == []  # phases known
