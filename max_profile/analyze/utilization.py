"""Summaries of GPU samples over the steps' window: peak/mean utilization, memory, clocks, throttling."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

HARDWARE_THROTTLE_REASONS: frozenset[str] = frozenset(
    {
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
)
"""Same set as ``max.profiler.gpu.HARDWARE_THROTTLE_REASONS`` (kept here so analysis needs no MAX; a test holds them
equal)."""

from max_profile.model import GpuUtilization, UtilizationSample  # noqa: E402


def window_samples(
    samples: Sequence[UtilizationSample], window: tuple[int, int] | None, interval_ns: int = 0
) -> list[UtilizationSample]:
    """Samples inside [start - interval, end + interval] (all of them without a window).

    One interval of slack keeps the sample that covers the window's edges; a window shorter
    than one interval keeps the nearest sample so a short run still has a reading.
    """
    if window is None:
        return list(samples)
    lo, hi = window[0] - interval_ns, window[1] + interval_ns
    inside = [s for s in samples if lo <= s.t_ns <= hi]
    if inside or not samples:
        return inside
    mid = (window[0] + window[1]) // 2
    by_gpu: dict[str, UtilizationSample] = {}
    for s in samples:
        best = by_gpu.get(s.gpu)
        if best is None or abs(s.t_ns - mid) < abs(best.t_ns - mid):
            by_gpu[s.gpu] = s
    return list(by_gpu.values())


def summarize_gpus(samples: Sequence[UtilizationSample]) -> list[GpuUtilization]:
    """Per-GPU summary. Throttle reasons are intersected with the hardware set (``gpu_idle`` is normal)."""
    out: list[GpuUtilization] = []
    for gpu in sorted({s.gpu for s in samples}):
        sel = [s for s in samples if s.gpu == gpu]
        util = np.array([s.utilization_pct for s in sel if s.utilization_pct is not None], dtype=float)
        mem = [s.memory_used_bytes for s in sel if s.memory_used_bytes is not None]
        total = next((s.memory_total_bytes for s in sel if s.memory_total_bytes), None)
        clocks = np.array([s.sm_clock_mhz for s in sel if s.sm_clock_mhz is not None], dtype=float)
        max_clock = max((s.max_sm_clock_mhz for s in sel if s.max_sm_clock_mhz), default=None)
        reasons = sorted({r for s in sel for r in s.throttle_reasons} & HARDWARE_THROTTLE_REASONS)
        sm_act = [s.sm_activity_pct for s in sel if s.sm_activity_pct is not None]
        peak_mem = max(mem) if mem else None
        out.append(
            GpuUtilization(
                gpu=gpu,
                samples=len(sel),
                peak_utilization_pct=float(util.max()) if util.size else None,
                mean_utilization_pct=float(util.mean()) if util.size else None,
                peak_memory_bytes=peak_mem,
                memory_total_bytes=total,
                peak_memory_pct=(100.0 * peak_mem / total) if peak_mem is not None and total else None,
                mean_sm_clock_mhz=float(clocks.mean()) if clocks.size else None,
                max_sm_clock_mhz=max_clock,
                hardware_throttle_reasons=reasons,
                mean_sm_activity_pct=float(np.mean(sm_act)) if sm_act else None,
                mean_partition_activity_pct=_mean_per_partition([s.partition_activity_pct for s in sel]),
            )
        )
    return out


def _mean_per_partition(rows: Sequence[list[float]]) -> list[float]:
    """Column means of per-partition readings (samples with fewer partitions count for the ones they have)."""
    width = max((len(r) for r in rows), default=0)
    out = []
    for i in range(width):
        column = [r[i] for r in rows if len(r) > i]
        out.append(float(np.mean(column)))
    return out
