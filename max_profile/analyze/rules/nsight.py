"""Nsight Compute verdicts: each profiled launch's bound (memory near its peak, on chip, latency...) and occupancy."""

from __future__ import annotations

from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Finding, KernelAnalysis, Report


def kernel_findings(a: KernelAnalysis, th: Thresholds | None = None) -> list[Finding]:
    """Verdicts for one analyzed kernel."""
    th = th or Thresholds()
    out: list[Finding] = []
    ev: dict[str, float | int | str | None] = {
        "kernel": a.kernel_name[:80],
        "compute_pct": a.compute_throughput_pct,
        "memory_pct": a.memory_throughput_pct,
        "dram_pct": a.dram_throughput_pct,
        "achieved_occupancy_pct": a.achieved_occupancy_pct,
        "theoretical_occupancy_pct": a.theoretical_occupancy_pct,
    }
    top = a.stalls[0] if a.stalls else None
    if top:
        ev["top_stall"] = f"{top.reason} ({top.cycles_per_instruction:.2f} cycles/instr)"
    if a.bound == "memory" and (a.dram_throughput_pct or 0) >= th.ncu_near_peak_dram_pct:
        out.append(
            Finding(
                id="kernel-memory-bound-near-peak",
                severity="info",
                confidence=0.8,
                evidence=ev,
                title=f"Memory-bound at {a.dram_throughput_pct:.0f}% of peak DRAM bandwidth: near its roofline "
                "(healthy for a decode GEMV)",
            )
        )
    elif (
        a.bound == "memory"
        and (l1 := a.metrics.get("L1/TEX Cache Throughput")) is not None
        and l1 >= th.ncu_on_chip_busy_pct
        and (a.dram_throughput_pct or 0) < th.ncu_on_chip_dram_idle_pct
    ):
        out.append(
            Finding(
                id="kernel-on-chip-bound",
                severity="warning",
                confidence=0.75,
                evidence={**ev, "l1tex_throughput_pct": l1},
                title=f"Bound by the L1/TEX cache ({l1:.0f}% of its throughput) while DRAM idles "
                f"({a.dram_throughput_pct or 0:.1f}%): "
                "it re-reads its inputs on chip instead of reusing them",
                next_step="A kernel without tiling (staging tiles in shared memory, tensor-core MMA) does this; for "
                "MAX's own kernels it marks a fallback path: another weight encoding or GPU may reach a tuned kernel.",
            )
        )
    elif a.bound == "memory":
        out.append(
            Finding(
                id="kernel-memory-bound",
                severity="warning",
                confidence=0.7,
                evidence=ev,
                title="Memory-bound but well below peak DRAM bandwidth",
                next_step="Look at the memory access pattern rules below (coalescing, L2 hit rate) and at occupancy.",
            )
        )
    elif a.bound == "compute" and (a.compute_throughput_pct or 0) < th.ncu_compute_far_pct:
        out.append(
            Finding(
                id="kernel-compute-far-from-peak",
                severity="warning",
                confidence=0.6,
                evidence=ev,
                title="Compute-bound but far from peak compute throughput",
                next_step="Check tensor-core use (sm__inst_executed_pipe_tensor_op_*) and tile shapes.",
            )
        )
    elif a.bound == "latency":
        title = "Latency-bound: neither compute nor memory is busy"
        if top and top.reason == "long_scoreboard":
            title += " — warps mostly wait on memory (long scoreboard)"
        out.append(
            Finding(
                id="kernel-latency-bound",
                severity="warning",
                confidence=0.7,
                evidence=ev,
                title=title,
                next_step="More parallelism per SM (larger grid / more warps) or fewer dependent memory loads.",
            )
        )
    if (
        a.achieved_occupancy_pct is not None
        and a.theoretical_occupancy_pct is not None
        and a.achieved_occupancy_pct < th.ncu_low_occupancy_ratio * a.theoretical_occupancy_pct
    ):
        out.append(
            Finding(
                id="kernel-low-occupancy",
                severity="info",
                confidence=0.6,
                evidence={**ev, "limiter": a.occupancy_limiter},
                title=f"Achieved occupancy {a.achieved_occupancy_pct:.0f}% is under half the theoretical "
                f"{a.theoretical_occupancy_pct:.0f}% (limiter: {a.occupancy_limiter})",
            )
        )
    elif (
        a.theoretical_occupancy_pct is not None
        and a.theoretical_occupancy_pct < th.ncu_occupancy_limited_pct
        and a.occupancy_limiter
    ):
        out.append(
            Finding(
                id="kernel-occupancy-limited",
                severity="info",
                confidence=0.6,
                evidence={**ev, "limiter": a.occupancy_limiter},
                title=f"Theoretical occupancy {a.theoretical_occupancy_pct:.0f}% is limited by {a.occupancy_limiter}",
            )
        )
    return out


def rule_kernel_analyses(report: Report, th: Thresholds) -> list[Finding]:
    """Each Nsight Compute analysis's verdicts (bound, on-chip, occupancy), in the same sort and supersession as the
    rest."""
    return [f for a in report.kernel_analyses for f in kernel_findings(a, th)]
