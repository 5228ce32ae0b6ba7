"""Nsight Compute verdicts field by field, each threshold at its exact value from both sides, and the report rule
passing its own thresholds to every analysis."""

from __future__ import annotations

import dataclasses

import msgspec

from max_profile.analyze.rules.nsight import kernel_findings, rule_kernel_analyses
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import KernelAnalysis, StallReason

from ...analyze.rules.test_state import _base

TH = Thresholds()
LONG_NAME = "gemv_split_k_bfloat16_bfloat16_bfloat16_128_" + "x" * 60


def analysis(**kw: object) -> KernelAnalysis:
    fields: dict[str, object] = {
        "kernel_name": LONG_NAME,
        "launch_id": 7,
        "compute_throughput_pct": 30.5,
        "memory_throughput_pct": 85.25,
        "dram_throughput_pct": 84.75,
        "achieved_occupancy_pct": 45.0,
        "theoretical_occupancy_pct": 50.0,
        "bound": "memory",
    }
    fields.update(kw)
    return KernelAnalysis(**fields)  # type: ignore[arg-type]


def ids(a: KernelAnalysis, th: Thresholds = TH) -> list[str]:
    return [f.id for f in kernel_findings(a, th)]


EV = {
    "kernel": LONG_NAME[:80],
    "compute_pct": 30.5,
    "memory_pct": 85.25,
    "dram_pct": 84.75,
    "achieved_occupancy_pct": 45.0,
    "theoretical_occupancy_pct": 50.0,
}


def test_memory_bound_near_peak_every_field() -> None:
    stall = StallReason(reason="long_scoreboard", cycles_per_instruction=3.14159, meaning="m")
    (f,) = kernel_findings(analysis(stalls=[stall]), TH)
    assert len(LONG_NAME) > 80
    assert (f.id, f.severity, f.confidence) == ("kernel-memory-bound-near-peak", "info", 0.8)
    assert f.evidence == {**EV, "top_stall": "long_scoreboard (3.14 cycles/instr)"}
    assert f.title == "Memory-bound at 85% of peak DRAM bandwidth: near its roofline (healthy for a decode GEMV)"
    assert ids(analysis(dram_throughput_pct=TH.ncu_near_peak_dram_pct)) == ["kernel-memory-bound-near-peak"]
    assert ids(analysis(dram_throughput_pct=TH.ncu_near_peak_dram_pct - 0.01)) == ["kernel-memory-bound"]
    # no DRAM figure is 0 %, not near peak, even with the threshold at 0.5 %
    low = dataclasses.replace(TH, ncu_near_peak_dram_pct=0.5, ncu_on_chip_dram_idle_pct=0.5)
    assert ids(analysis(dram_throughput_pct=None), low) == ["kernel-memory-bound"]


def test_on_chip_bound_every_field_and_edges() -> None:
    a = analysis(dram_throughput_pct=3.25, metrics={"L1/TEX Cache Throughput": 91.5})
    (f,) = kernel_findings(a, TH)
    assert (f.id, f.severity, f.confidence) == ("kernel-on-chip-bound", "warning", 0.75)
    assert f.evidence == {**EV, "dram_pct": 3.25, "l1tex_throughput_pct": 91.5}
    assert f.title == (
        "Bound by the L1/TEX cache (92% of its throughput) while DRAM idles (3.2%): it re-reads its inputs on chip "
        "instead of reusing them"
    )
    assert f.next_step is not None and f.next_step.startswith("A kernel without tiling")
    at_busy = analysis(dram_throughput_pct=3.0, metrics={"L1/TEX Cache Throughput": TH.ncu_on_chip_busy_pct})
    assert ids(at_busy) == ["kernel-on-chip-bound"]
    under = analysis(dram_throughput_pct=3.0, metrics={"L1/TEX Cache Throughput": TH.ncu_on_chip_busy_pct - 0.01})
    assert ids(under) == ["kernel-memory-bound"]
    at_idle = analysis(dram_throughput_pct=TH.ncu_on_chip_dram_idle_pct, metrics={"L1/TEX Cache Throughput": 95.0})
    assert ids(at_idle) == ["kernel-memory-bound"]  # DRAM at exactly the idle line is not idle
    no_dram = analysis(dram_throughput_pct=None, metrics={"L1/TEX Cache Throughput": 95.0})
    idle_at_half = dataclasses.replace(TH, ncu_on_chip_dram_idle_pct=0.5)
    assert ids(no_dram, idle_at_half) == ["kernel-on-chip-bound"]  # no figure reads 0 %: idle
    assert "(0.0%)" in kernel_findings(no_dram, idle_at_half)[0].title


def test_memory_bound_below_peak_every_field() -> None:
    (f,) = kernel_findings(analysis(dram_throughput_pct=40.0), TH)
    assert (f.id, f.severity, f.confidence) == ("kernel-memory-bound", "warning", 0.7)
    assert f.evidence == {**EV, "dram_pct": 40.0}
    assert f.title == "Memory-bound but well below peak DRAM bandwidth"
    assert f.next_step == ("Look at the memory access pattern rules below (coalescing, L2 hit rate) and at occupancy.")


def test_compute_far_from_peak_every_field_and_edges() -> None:
    (f,) = kernel_findings(analysis(bound="compute"), TH)
    assert (f.id, f.severity, f.confidence) == ("kernel-compute-far-from-peak", "warning", 0.6)
    assert f.evidence == EV
    assert f.title == "Compute-bound but far from peak compute throughput"
    assert f.next_step == "Check tensor-core use (sm__inst_executed_pipe_tensor_op_*) and tile shapes."
    assert ids(analysis(bound="compute", compute_throughput_pct=TH.ncu_compute_far_pct)) == []
    assert ids(analysis(bound="compute", compute_throughput_pct=TH.ncu_compute_far_pct - 0.01)) == [
        "kernel-compute-far-from-peak"
    ]
    # no compute figure is 0 %: far from peak, even with the line at 0.5 %
    low = dataclasses.replace(TH, ncu_compute_far_pct=0.5)
    assert ids(analysis(bound="compute", compute_throughput_pct=None), low) == ["kernel-compute-far-from-peak"]


def test_latency_bound_every_field() -> None:
    (f,) = kernel_findings(analysis(bound="latency"), TH)
    assert (f.id, f.severity, f.confidence) == ("kernel-latency-bound", "warning", 0.7)
    assert f.title == "Latency-bound: neither compute nor memory is busy"
    assert f.next_step == "More parallelism per SM (larger grid / more warps) or fewer dependent memory loads."
    stall = StallReason(reason="long_scoreboard", cycles_per_instruction=9.0, meaning="m")
    (g,) = kernel_findings(analysis(bound="latency", stalls=[stall]), TH)
    assert g.title.endswith(" — warps mostly wait on memory (long scoreboard)")
    other = StallReason(reason="math_pipe_throttle", cycles_per_instruction=9.0, meaning="m")
    assert kernel_findings(analysis(bound="latency", stalls=[other]), TH)[0].title == f.title


def test_occupancy_findings_every_field_and_edges() -> None:
    low = analysis(bound=None, achieved_occupancy_pct=20.4, theoretical_occupancy_pct=62.5, occupancy_limiter="regs")
    (f,) = kernel_findings(low, TH)
    assert (f.id, f.severity, f.confidence) == ("kernel-low-occupancy", "info", 0.6)
    assert f.evidence == {**EV, "achieved_occupancy_pct": 20.4, "theoretical_occupancy_pct": 62.5, "limiter": "regs"}
    assert f.title == "Achieved occupancy 20% is under half the theoretical 62% (limiter: regs)"
    half = analysis(bound=None, achieved_occupancy_pct=31.25, theoretical_occupancy_pct=62.5, occupancy_limiter="regs")
    assert ids(half) == []  # exactly half: not under it
    limited = analysis(
        bound=None, achieved_occupancy_pct=40.0, theoretical_occupancy_pct=43.75, occupancy_limiter="smem"
    )
    (g,) = kernel_findings(limited, TH)
    assert (g.id, g.severity, g.confidence) == ("kernel-occupancy-limited", "info", 0.6)
    assert g.title == "Theoretical occupancy 44% is limited by smem"
    assert g.evidence["limiter"] == "smem"
    at = analysis(
        bound=None,
        achieved_occupancy_pct=45.0,
        theoretical_occupancy_pct=TH.ncu_occupancy_limited_pct,
        occupancy_limiter="smem",
    )
    assert ids(at) == []  # exactly the line: not limited
    assert ids(msgspec.structs.replace(limited, occupancy_limiter=None)) == []


def test_the_report_rule_uses_its_own_thresholds() -> None:
    a = analysis(dram_throughput_pct=60.0)
    report = msgspec.structs.replace(_base(), kernel_analyses=[a, analysis(bound="compute")])
    found = rule_kernel_analyses(report, dataclasses.replace(TH, ncu_near_peak_dram_pct=55.0))
    assert [f.id for f in found] == ["kernel-memory-bound-near-peak", "kernel-compute-far-from-peak"]
    assert [f.id for f in rule_kernel_analyses(report, TH)] == ["kernel-memory-bound", "kernel-compute-far-from-peak"]
