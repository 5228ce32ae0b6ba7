"""The GPU's and the host's state over the capture: clock throttling, memory near full, other processes on the cores."""

from __future__ import annotations

from max_profile.analyze.rules.base import host_contended, util
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Finding, Report


def rule_throttled(report: Report, th: Thresholds) -> list[Finding]:
    """Hardware / power throttle reasons while steps ran; a warning only when the SM clock actually dropped.

    NVML reports ``sw_power_cap`` on an H200 running at 99.7 % of its max SM clock; that is no
    reason to distrust the numbers, so it stays an info finding.
    """
    u = util(report)
    out = []
    for g in u.gpus if u else []:
        if not g.hardware_throttle_reasons:
            continue
        clock_pct = (
            100.0 * g.mean_sm_clock_mhz / g.max_sm_clock_mhz if g.mean_sm_clock_mhz and g.max_sm_clock_mhz else None
        )
        slowed = clock_pct is None or clock_pct < th.throttle_clock_pct
        out.append(
            Finding(
                id="throttled",
                severity="warning" if slowed else "info",
                title=f"{g.gpu} was clock-throttled: the numbers are not representative"
                if slowed
                else f"{g.gpu} reported throttle reasons but ran at {clock_pct:.1f} % of its max SM clock",
                evidence={
                    "gpu": g.gpu,
                    "reasons": ",".join(g.hardware_throttle_reasons),
                    "mean_sm_clock_mhz": g.mean_sm_clock_mhz,
                    "max_sm_clock_mhz": g.max_sm_clock_mhz,
                    "clock_pct_of_max": round(clock_pct, 1) if clock_pct is not None else None,
                },
                confidence=0.9 if slowed else 0.5,
                next_step="Check cooling / power limits (nvidia-smi -q -d PERFORMANCE) and re-run when the GPU is not "
                "throttled."
                if slowed
                else "None needed: the clock held; watch it if later runs slow down.",
            )
        )
    return out


def rule_near_oom(report: Report, th: Thresholds) -> list[Finding]:
    u = util(report)
    out = []
    for g in u.gpus if u else []:
        if g.peak_memory_pct is not None and g.peak_memory_pct >= th.near_oom_pct:
            out.append(
                Finding(
                    id="near-oom",
                    severity="warning",
                    title=f"{g.gpu} memory is nearly full ({g.peak_memory_pct:.1f}% of total)",
                    evidence={
                        "gpu": g.gpu,
                        "peak_memory_bytes": g.peak_memory_bytes,
                        "memory_total_bytes": g.memory_total_bytes,
                        "threshold_pct": th.near_oom_pct,
                    },
                    confidence=0.8,
                    next_step="The KV cache or batch size may be the constraint: lower --max-batch-size / "
                    "--max-length, or --device-memory-utilization, and watch for OOM under load.",
                )
            )
    return out


def rule_host_contention(report: Report, th: Thresholds) -> list[Finding]:
    """Other processes kept the host's CPUs busy while the capture ran: step times, tokens/s and tracer cost are not
    reliable.

    MAX's host side (the Python scheduler, the runtime's launch thread) needs its cores; with the machine full, steps
    wait for a CPU and every timing figure says more about the neighbours than about the model.
    """
    load = report.capture.host_load
    if load is None or not host_contended(report, th):
        return []
    busiest = ", ".join(f"{p.name} (pid {p.pid}) {p.cores:.2f}" for p in load.busiest_others[:3])
    return [
        Finding(
            id="host-contention",
            severity="warning",
            confidence=0.7,
            title=f"Other processes used {load.other_cores:.1f} of {load.cores} CPU cores during the capture: its "
            "timing figures are not reliable",
            evidence={
                "cores": load.cores,
                "profiled_process_cores": load.own_cores,
                "other_processes_cores": load.other_cores,
                "cpu_busy_pct": load.cpu_busy_pct,
                "load_avg_1m": load.load_avg_1m,
                "busiest_others_cores": busiest,
                "window_s": load.window_s,
            },
            next_step="Re-run on a quiet machine (or give the profiled process its own cores: taskset / numactl "
            "--cpunodebind); kernel families and per-kernel durations still hold, step times and tokens/s do not.",
        )
    ]
