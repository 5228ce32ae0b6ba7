"""Nsight Compute analysis: one profiled launch -> :class:`KernelAnalysis` and its verdicts (pure).

Reads the Speed Of Light section (compute vs memory throughput), DRAM throughput, occupancy and
its limiter (block limits), warp stall reasons per issued instruction (long scoreboard = memory
latency) and achieved FLOP/s for a roofline point. Equivalent: ``ncu --import R.ncu-rep --page details``.
"""

from __future__ import annotations

import re

from max_profile.analyze.thresholds import Thresholds
from max_profile.model import KernelAnalysis, NcuLaunch, StallReason

STALL_MEANINGS: dict[str, str] = {
    "long_scoreboard": "waiting on global/local memory (L1TEX) results: memory latency",
    "short_scoreboard": "waiting on shared memory or special-function results",
    "math_pipe_throttle": "math pipe busy: compute-bound on that pipe",
    "mio_throttle": "memory I/O queue full (shared memory / special instructions)",
    "lg_throttle": "local/global memory queue full: too many outstanding memory ops",
    "barrier": "waiting at __syncthreads / barriers",
    "membar": "waiting on a memory barrier",
    "not_selected": "eligible but another warp was picked (enough parallelism)",
    "selected": "issuing (not a stall)",
    "wait": "fixed-latency dependency",
    "no_instruction": "instruction cache miss / no instruction fetched",
    "branch_resolving": "waiting on branch target computation",
    "dispatch_stall": "dispatch stall (pipeline conflict)",
    "drain": "waiting for memory stores to drain at exit",
    "imc_miss": "immediate constant cache miss",
    "tex_throttle": "texture queue full",
    "sleeping": "warp sleeping (nanosleep / yield)",
    "gmma": "waiting on warpgroup MMA (wgmma) completion",
    "misc": "miscellaneous",
}


def _first(m: dict[str, float], *keys: str) -> float | None:
    for k in keys:
        if k in m:
            return m[k]
    return None


def analyze_launch(launch: NcuLaunch, th: Thresholds | None = None) -> KernelAnalysis:
    """One profiled launch (details-page labels, raw-page metric names, or both) -> :class:`KernelAnalysis`."""
    m = launch.metrics
    sections = launch.sections
    compute = _first(m, "Compute (SM) Throughput", "sm__throughput.avg.pct_of_peak_sustained_elapsed")
    memory = sections.get(
        "GPU Speed Of Light Throughput/Memory Throughput",
        _first(m, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
    )
    dram_pct = _first(
        m,
        "DRAM Throughput",
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    )
    dram_bps = sections.get("Memory Workload Analysis/Memory Throughput", _first(m, "dram__bytes.sum.per_second"))
    limits = {
        "registers": _first(m, "Block Limit Registers", "launch__occupancy_limit_registers"),
        "shared memory": _first(m, "Block Limit Shared Mem", "launch__occupancy_limit_shared_mem"),
        "warps": _first(m, "Block Limit Warps", "launch__occupancy_limit_warps"),
        "blocks per SM": _first(m, "Block Limit SM", "launch__occupancy_limit_blocks"),
        "barriers": _first(m, "Block Limit Barriers", "launch__occupancy_limit_barriers"),
    }
    known = {k: v for k, v in limits.items() if v is not None}
    limiter = min(known, key=lambda k: known[k]) if known else None
    stalls = []
    for name, value in m.items():
        mm = re.fullmatch(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio", name)
        if mm and mm.group(1) != "selected" and value > 0:
            stalls.append(
                StallReason(
                    reason=mm.group(1), cycles_per_instruction=value, meaning=STALL_MEANINGS.get(mm.group(1), "")
                )
            )
    stalls.sort(key=lambda s: -s.cycles_per_instruction)
    flops = achieved_flops(m)
    return KernelAnalysis(
        kernel_name=launch.name,
        launch_id=int(launch.launch_id) if launch.launch_id.isdigit() and len(launch.launch_id) < 10 else 0,
        duration_ns=_first(m, "Duration", "gpu__time_duration.sum"),
        compute_throughput_pct=compute,
        memory_throughput_pct=memory,
        dram_throughput_pct=dram_pct,
        dram_bytes_per_s=dram_bps,
        achieved_occupancy_pct=_first(m, "Achieved Occupancy", "sm__warps_active.avg.pct_of_peak_sustained_active"),
        theoretical_occupancy_pct=_first(m, "Theoretical Occupancy", "sm__maximum_warps_per_active_cycle_pct"),
        occupancy_limiter=limiter,
        registers_per_thread=_first(m, "Registers Per Thread", "launch__registers_per_thread"),
        block_size=launch.block,
        grid_size=launch.grid,
        stalls=stalls[:6],
        achieved_flop_per_s=flops,
        arithmetic_intensity=flops / dram_bps if flops is not None and dram_bps else None,
        bound=bound_of(
            compute,
            memory,
            (th or Thresholds()).ncu_latency_bound_pct,
            (th or Thresholds()).ncu_balanced_gap_pct,
            (th or Thresholds()).ncu_balanced_min_pct,
        ),
        ncu_rules=list(launch.rules)[:12],
        metrics={k: v for k, v in m.items() if " " in k or k.startswith(("gpu__", "dram__", "sm__"))},
        device=launch.device,
    )


def achieved_flops(m: dict[str, float]) -> float | None:
    """FLOP/s from the SASS instruction counters (FMA = 2) plus the tensor-core path metrics.

    Tensor work is counted once: the aggregate path metrics (``sm__ops_path_tensor_src_<in>_dst_<out>``)
    only; the per-instruction ones (``sm__ops_path_tensor_op_hgmma_...``) count the same work again.
    """
    rate = m.get("smsp__cycles_elapsed.avg.per_second")
    if rate is None:
        return None
    per_cycle = 0.0
    found = False
    for prefix, mult in (("f", 1.0), ("d", 1.0), ("h", 2.0)):
        add = m.get(f"smsp__sass_thread_inst_executed_op_{prefix}add_pred_on.sum.per_cycle_elapsed")
        mul = m.get(f"smsp__sass_thread_inst_executed_op_{prefix}mul_pred_on.sum.per_cycle_elapsed")
        fma = m.get(f"smsp__sass_thread_inst_executed_op_{prefix}fma_pred_on.sum.per_cycle_elapsed")
        if add is not None or mul is not None or fma is not None:
            found = True
            per_cycle += mult * ((add or 0.0) + (mul or 0.0) + 2.0 * (fma or 0.0))
    flops = per_cycle * rate
    for name, v in m.items():
        if re.fullmatch(r"sm__ops_path_tensor_src_[a-z0-9_]+\.sum\.per_second", name):
            found = True
            flops += v
    return flops if found else None


def bound_of(
    compute: float | None,
    memory: float | None,
    latency_bound_pct: float = Thresholds.ncu_latency_bound_pct,
    balanced_gap_pct: float = Thresholds.ncu_balanced_gap_pct,
    balanced_min_pct: float = Thresholds.ncu_balanced_min_pct,
) -> str | None:
    """``latency`` / ``balanced`` / ``memory`` / ``compute`` from the Speed Of Light percentages
    (``Thresholds.ncu_*``)."""
    if compute is None and memory is None:
        return None
    c, mem = compute or 0.0, memory or 0.0
    if max(c, mem) < latency_bound_pct:
        return "latency"
    if abs(c - mem) < balanced_gap_pct and min(c, mem) >= balanced_min_pct:
        return "balanced"
    return "memory" if mem >= c else "compute"
