"""Diagnosis rules: pure functions of a :class:`Report` that return :class:`Finding` lists.

Each rule is a plain function registered in :data:`RULES`; its thresholds live in
:class:`Thresholds` (named, documented, overridable: ``evaluate(report, Thresholds(host_bound_util_pct=30))``).
Every finding carries the numbers it rests on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from max_profile.analyze.commands import cli, for_model, kernel_command, shell
from max_profile.analyze.families import slow_path
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import (
    Command,
    DecodeCost,
    FamilyRoofline,
    Finding,
    GpuUtilization,
    KernelBreakdown,
    KernelRow,
    PhaseBreakdown,
    Report,
    Step,
    StepSummary,
    UtilizationSection,
)

Rule = Callable[[Report, Thresholds], list[Finding]]


def _util(report: Report) -> UtilizationSection | None:
    return report.utilization if isinstance(report.utilization, UtilizationSection) else None


def _kern(report: Report) -> KernelBreakdown | None:
    return report.kernels if isinstance(report.kernels, KernelBreakdown) else None


def _steps(report: Report) -> StepSummary | None:
    return report.step_summary if isinstance(report.step_summary, StepSummary) else None


def _phase(k: KernelBreakdown, name: str) -> PhaseBreakdown | None:
    return next((p for p in k.phases if p.phase == name), None)


def _fam_ms(rows: list, family: str) -> float:  # type: ignore[type-arg]
    return sum(r.total_ms for r in rows if r.family == family)


def _gpu_kernels(k: KernelBreakdown) -> bool:
    return not k.source.startswith("nvtx-log")


# ---------------------------------------------------------------------------------------------
def _busy_scope(k: KernelBreakdown) -> tuple[float | None, str]:
    """GPU busy in decode when phases are known, else over the whole capture window (and which)."""
    d = _phase(k, "decode")
    if d is not None and d.gpu_busy_pct is not None:
        return d.gpu_busy_pct, "decode"
    if not k.phases and k.gpu_busy_pct is not None:
        return k.gpu_busy_pct, "capture"
    return None, ""


def _top_kernel_command(report: Report, families: tuple[str, ...]) -> Command | None:
    """A deep dive of the top decode kernel (or top kernel) of these families."""
    k = _kern(report)
    if not k:
        return None
    d = _phase(k, "decode")
    rows = d.top_kernels if d else k.top_kernels
    top = next((r for r in rows if r.family in families), None)
    return kernel_command(report, top.name) if top else None


def nvml_window_long_enough(u: UtilizationSection, th: Thresholds) -> bool:
    """Whether NVML's utilization can speak for the window: NVML averages "some kernel ran" over its own sample period
    (1/6 s to 1 s, by GPU), so a window shorter than a few of those reads the idle time before the work (an H200 read 0 %
    for a 0.19 s GPU-bound decode that ran at 77 % of peak bandwidth, and 90 % once the same decode ran 3 s)."""
    if u.window_ns is None:
        return max((g.samples for g in u.gpus), default=0) >= th.nvml_min_samples
    return (u.window_ns[1] - u.window_ns[0]) / 1e9 >= th.nvml_min_window_s and max((g.samples for g in u.gpus), default=0) >= th.nvml_min_samples


def rule_host_bound(report: Report, th: Thresholds) -> list[Finding]:
    """The GPU idles while the workload runs: NVML utilization low, or the kernel timeline mostly empty.

    The kernel timeline is exact and wins over NVML samples (0.1 s, they can miss a short run). Without
    phase ranges the busy figure covers the whole capture window, and the verdict says so with lower confidence.
    """
    u, k = _util(report), _kern(report)
    evidence: dict[str, float | int | str | None] = {}
    low_util = False
    if u and u.gpus and nvml_window_long_enough(u, th):
        g: GpuUtilization = max(u.gpus, key=lambda g: g.mean_utilization_pct or 0)
        if g.mean_utilization_pct is not None and g.mean_utilization_pct < th.host_bound_util_pct:
            low_util = True
            evidence.update({"gpu": g.gpu, "mean_utilization_pct": round(g.mean_utilization_pct, 1), "peak_utilization_pct": g.peak_utilization_pct, "samples": g.samples})
    # a trace that missed the kernels inside device graphs understates busy time: only NVML's reading counts then
    busy, scope = _busy_scope(k) if k and _gpu_kernels(k) and not k.unreliable else (None, "")
    if busy is not None and busy >= th.host_bound_busy_pct:
        return []
    busy_low = busy is not None
    if busy is not None and k is not None:
        if scope == "decode":
            d = _phase(k, "decode")
            evidence.update({"decode_gpu_busy_pct": round(busy, 1), "decode_kernel_ms_per_step": round((d.kernel_ms_per_step if d else None) or 0, 4)})
        else:
            evidence.update({"gpu_busy_pct": round(busy, 1), "kernels": k.kernels, "window_ms": round(k.window_ms or 0, 3),
                             "busy_scope": "whole capture window (no phase ranges)" if k.recorded_ms is None
                             else f"the recorded slices of the capture window ({k.recorded_ms:.1f} ms; no phase ranges)"})
    if not (low_util or busy_low):
        return []
    s = _steps(report)
    if s:
        dec = next((p for p in s.phases if p.phase == "decode"), None)
        if dec:
            evidence["decode_step_p50_ms"] = round(dec.p50_ms, 3)
    evidence["threshold_pct"] = th.host_bound_util_pct
    confidence = 0.9 if (low_util and busy_low) else 0.7
    if scope == "capture":
        confidence *= th.no_phase_confidence_scale
    return [
        Finding(
            id="host-bound",
            severity="warning",
            title="Host-bound: the GPU idles while steps run (launch/sync overhead, Python, or a batch too small)"
            if scope != "capture" else f"Host-bound: the GPU ran kernels {busy:.0f}% of the capture window (no phase ranges: whole capture)",
            evidence=evidence,
            confidence=round(confidence, 2),
            next_step="Stop here: a kernel trace adds nothing until the GPU is busy. Raise the batch size / concurrency, "
            "or profile the host (py-spy record --native, or `max generate --profile` for its cProfile table).",
        )
    ]


def rule_host_time_between_ops(report: Report, th: Thresholds) -> list[Finding]:
    """MAX's own op ranges (host clock) cover little of the decode window: the rest is host work between ops.

    The op ranges time MAX's ops on the host (on a CPU: the ops' compute); the remainder of each step is Python,
    scheduling, sampling and token handling. When ops cover less than the host-bound threshold, the framework's
    per-step cost, not the model's math, sets the speed.
    """
    k = _kern(report)
    if not k or _gpu_kernels(k) or report.environment.vendor != "none":
        return []
    busy, scope = _busy_scope(k)
    if busy is None or busy >= th.host_bound_busy_pct:
        return []
    s = _steps(report)
    dec = next((p for p in s.phases if p.phase == "decode"), None) if s else None
    return [Finding(
        id="host-time-between-ops", severity="info", confidence=0.7 if scope == "decode" else 0.5,
        title=f"MAX's ops ran {busy:.0f}% of the {'decode steps' if scope == 'decode' else 'capture window'}: the other {100 - busy:.0f}% is host work "
        "between ops (Python, scheduling, sampling)",
        evidence={"ops_cover_pct": round(busy, 1), "scope": scope, "source": k.source, "decode_step_p50_ms": round(dec.p50_ms, 3) if dec else None,
                  "threshold_pct": th.host_bound_busy_pct},
        next_step="At this model size the framework's per-step cost sets the speed, not the model's math: see where the host time goes "
        "with py-spy, or profile a larger model.",
        command=shell("pip install py-spy && py-spy record --native -o host.svg -- " + cli(for_model(report, "run", kernels="off"))),
    )]


def rule_gpu_bound(report: Report, th: Thresholds) -> list[Finding]:
    """The GPU is busy nearly all the time: the kernels below are where the time goes."""
    k = _kern(report)
    if not k or not _gpu_kernels(k) or k.unreliable:
        return []
    busy, scope = _busy_scope(k)
    if busy is None or busy < th.gpu_bound_busy_pct:
        return []
    where = "decode steps" if scope == "decode" else "capture window (no phase ranges: whole capture)"
    return [
        Finding(
            id="gpu-bound",
            severity="info",
            title=f"GPU-bound: kernels ran {busy:.0f}% of the {where}; the kernel mix is where the time goes",
            evidence={"gpu_busy_pct": round(busy, 1), "scope": scope, "top_family": k.families[0].family if k.families else None,
                      "threshold_pct": th.gpu_bound_busy_pct},
            confidence=round(0.8 * (th.no_phase_confidence_scale if scope == "capture" else 1.0), 2),
            next_step=None,
        )
    ]


def rule_throttled(report: Report, th: Thresholds) -> list[Finding]:
    """Hardware / power throttle reasons while steps ran; a warning only when the SM clock actually dropped.

    NVML reports ``sw_power_cap`` on an H200 running at 99.7 % of its max SM clock; that is no
    reason to distrust the numbers, so it stays an info finding.
    """
    u = _util(report)
    out = []
    for g in u.gpus if u else []:
        if not g.hardware_throttle_reasons:
            continue
        clock_pct = 100.0 * g.mean_sm_clock_mhz / g.max_sm_clock_mhz if g.mean_sm_clock_mhz and g.max_sm_clock_mhz else None
        slowed = clock_pct is None or clock_pct < th.throttle_clock_pct
        out.append(
            Finding(
                id="throttled",
                severity="warning" if slowed else "info",
                title=f"{g.gpu} was clock-throttled: the numbers are not representative" if slowed
                else f"{g.gpu} reported throttle reasons but ran at {clock_pct:.1f} % of its max SM clock",
                evidence={"gpu": g.gpu, "reasons": ",".join(g.hardware_throttle_reasons), "mean_sm_clock_mhz": g.mean_sm_clock_mhz,
                          "max_sm_clock_mhz": g.max_sm_clock_mhz, "clock_pct_of_max": round(clock_pct, 1) if clock_pct is not None else None},
                confidence=0.9 if slowed else 0.5,
                next_step="Check cooling / power limits (nvidia-smi -q -d PERFORMANCE) and re-run when the GPU is not throttled." if slowed
                else "None needed: the clock held; watch it if later runs slow down.",
            )
        )
    return out


def rule_near_oom(report: Report, th: Thresholds) -> list[Finding]:
    u = _util(report)
    out = []
    for g in u.gpus if u else []:
        if g.peak_memory_pct is not None and g.peak_memory_pct >= th.near_oom_pct:
            out.append(
                Finding(
                    id="near-oom",
                    severity="warning",
                    title=f"{g.gpu} memory is nearly full ({g.peak_memory_pct:.1f}% of total)",
                    evidence={"gpu": g.gpu, "peak_memory_bytes": g.peak_memory_bytes, "memory_total_bytes": g.memory_total_bytes, "threshold_pct": th.near_oom_pct},
                    confidence=0.8,
                    next_step="The KV cache or batch size may be the constraint: lower --max-batch-size / --max-length, or "
                    "--device-memory-utilization, and watch for OOM under load.",
                )
            )
    return out


def rule_graphs_hid_kernels(report: Report, th: Thresholds) -> list[Finding]:
    k = _kern(report)
    if not k or not k.unreliable:
        return []
    return [
        Finding(
            id="device-graphs",
            severity="warning",
            title="Device graphs replayed the kernels: per-kernel and per-step numbers are unreliable",
            evidence={"kernels": k.kernels, "source": k.source, "device_graph_capture": str(report.capture.device_graph_capture)},
            confidence=0.8,
            next_step="Record with a tracer that opens graphs (max_profile's CUPTI recorder, or `nsys profile --cuda-graph-trace=node`), "
            "or re-run with device graphs off to see each kernel.",
            command=for_model(report, "kernels", backend="cupti"),
            detail=k.unreliable,
        )
    ]


def _measured_tracer_cost(report: Report, th: Thresholds) -> list[Finding]:
    """The recorder's cost as measured against the untraced reference window of the same server."""
    c = report.tracer_cost
    assert c is not None and c.throughput_ratio is not None
    slowdown = 100.0 * (1.0 - c.throughput_ratio)
    if slowdown < th.tracer_slowdown_pct:
        return []
    step = c.decode_step_change_pct
    evidence: dict[str, float | int | str | None] = {
        "recorded_tok_s": round(c.traced_tok_s, 1), "untraced_tok_s": round(c.reference_tok_s, 1), "throughput_ratio": c.throughput_ratio,
        "recorded_decode_step_ms": c.traced_decode_step_ms, "untraced_decode_step_ms": c.reference_decode_step_ms,
        "decode_step_change_pct": round(step, 1) if step is not None else None, "concurrency": c.concurrency,
        "threshold_pct": th.tracer_slowdown_pct}
    k = _kern(report)
    if k and k.tracer_overhead_pct is not None:
        evidence["tracer_callbacks_pct_of_window"] = round(k.tracer_overhead_pct, 2)
    if k and k.gpu_waits is not None:  # where the recorded window's time went: the GPU waiting before device graphs
        evidence["gpu_waits_before_graphs"] = k.gpu_waits.before_graph_gaps
        evidence["gpu_waits_before_graphs_pct"] = round(k.gpu_waits.before_graph_pct, 2)
    step_text = (f"; the server's decode step {c.reference_decode_step_ms:.2f} → {c.traced_decode_step_ms:.2f} ms"
                 if c.reference_decode_step_ms and c.traced_decode_step_ms else "")
    return [
        Finding(
            id="tracer-overhead",
            severity="warning",
            title=f"Kernel recording slowed this server by {slowdown:.1f} % ({c.traced_tok_s:.0f} vs {c.reference_tok_s:.0f} tok/s untraced"
            f"{step_text}): throughput, latency and step times of the recorded windows are the recorded ones",
            evidence=evidence,
            confidence=0.9,
            next_step="Kernel families, their shares and the per-kernel durations hold. Take throughput and latency from the untraced "
            "reference window (in this report's evidence) or `serve --mode utilization`; for kernels with less cost per kernel, "
            "`--mode nsys`.",
            detail="Measured on this server: an untraced window first, then the recorded one at the same concurrency. A slower decode "
            "step with little time in the recorder's callbacks is CUPTI's own tracing cost on the host: on the H200 (5.2B bf16 Llama, "
            "~230 kernels per step, ~217 of them in device graphs) the kernels ran as fast as untraced and the step's graph was "
            "launched late in a tail of steps (decode step 2.85-2.90 ms untraced, 3.01-3.24 ms recorded; 0.04 s of callbacks per "
            "10 s window).",
        )
    ]


def rule_graph_launch_late(report: Report, th: Thresholds) -> list[Finding]:
    """The GPU sat idle before device-graph kernels: the host launched those graphs late (the kernels are not slower)."""
    k = _kern(report)
    w = k.gpu_waits if k and _gpu_kernels(k) else None
    if w is None or w.before_graph_pct < th.graph_launch_late_pct or w.before_graph_gaps < th.graph_launch_late_min_gaps:
        return []
    median = f", median {w.gap_p50_us / 1e3:.2f} ms" if w.gap_p50_us is not None else ""
    return [Finding(
        id="graph-launch-late", severity="info", confidence=0.7,
        title=f"The GPU waited for the host before {w.before_graph_gaps} device-graph launches: {w.before_graph_pct:.1f} % of the window "
        f"in gaps of {w.min_gap_us / 1e3:g}-{w.max_gap_ms:g} ms{median}",
        evidence={"before_graph_gaps": w.before_graph_gaps, "before_graph_ms": round(w.before_graph_ms, 1), "before_graph_pct": round(w.before_graph_pct, 2),
                  "all_waits": w.gaps, "all_waits_pct": round(w.waited_pct, 2), "gap_p50_us": round(w.gap_p50_us, 1) if w.gap_p50_us is not None else None,
                  "longer_gaps": w.longer_gaps, "threshold_pct": th.graph_launch_late_pct, "min_gaps": th.graph_launch_late_min_gaps},
        next_step="The kernels ran at their speed; the thread that launches the step's graph came late. Check the host load line of "
        "this report (other processes on the cores), then where the host's time goes per step: py-spy on the process "
        "(`py-spy record --native --pid PID`). Under an in-process tracer, compare with an untraced run first.",
        detail="Counted: gaps between one kernel's end and the next kernel's start (overlaps merged, the busiest device) at least "
        f"{w.min_gap_us:g} µs and under {w.max_gap_ms:g} ms that end at a kernel inside a device graph; longer gaps "
        f"({w.longer_gaps} here, {w.longer_ms:.0f} ms) are waits for requests or pauses between steps.",
    )]


def rule_tracer_overhead(report: Report, th: Thresholds) -> list[Finding]:
    if report.tracer_cost is not None and report.tracer_cost.throughput_ratio is not None:
        return _measured_tracer_cost(report, th)  # measured beats inferred
    k = _kern(report)
    if not k or k.tracer_overhead_pct is None or k.tracer_overhead_pct < th.tracer_overhead_pct:
        return []
    evidence: dict[str, float | int | str | None] = {"tracer_callbacks_pct_of_window": round(k.tracer_overhead_pct, 1), "source": k.source,
                                                     "threshold_pct": th.tracer_overhead_pct}
    u = _util(report)
    if u and u.gpus:
        evidence["mean_utilization_pct_while_tracing"] = round(max(g.mean_utilization_pct or 0 for g in u.gpus), 1)
    return [
        Finding(
            id="tracer-overhead",
            severity="warning",
            title="The in-process kernel tracer slowed the profiled process: utilization and host-time figures are distorted",
            evidence=evidence,
            confidence=0.8,
            next_step="Kernel families and per-kernel durations still hold. For utilization and host-bound questions re-run without "
            "the tracer (`serve --mode utilization`, `run --kernels off`); for kernels with the timing kept, `--mode nsys` "
            "(collection in C).",
            detail="The in-process tracer's buffer callbacks held the profiled process: cupti-python (the fallback when max_profile's "
            "C recorder cannot be built) turns each record into a Python object under the GIL. On the H200 a served 1.75B model "
            "streamed 896 tokens in 10 s that way, 4,736-5,120 with the C recorder and 4,863-5,184 untraced.",
        )
    ]


def _host_contended(report: Report, th: Thresholds) -> bool:
    """Whether other processes held enough of the host's cores during the capture that its timing figures are not reliable."""
    load = report.capture.host_load
    return load is not None and load.other_cores >= th.host_load_other_cores and (load.own_cores + load.other_cores) >= th.host_load_busy_fraction * load.cores


def rule_host_contention(report: Report, th: Thresholds) -> list[Finding]:
    """Other processes kept the host's CPUs busy while the capture ran: step times, tokens/s and tracer cost are not reliable.

    MAX's host side (the Python scheduler, the runtime's launch thread) needs its cores; with the machine full, steps
    wait for a CPU and every timing figure says more about the neighbours than about the model.
    """
    load = report.capture.host_load
    if load is None or not _host_contended(report, th):
        return []
    busiest = ", ".join(f"{p.name} (pid {p.pid}) {p.cores:.2f}" for p in load.busiest_others[:3])
    return [Finding(
        id="host-contention", severity="warning", confidence=0.7,
        title=f"Other processes used {load.other_cores:.1f} of {load.cores} CPU cores during the capture: its timing figures are not reliable",
        evidence={"cores": load.cores, "profiled_process_cores": load.own_cores, "other_processes_cores": load.other_cores,
                  "cpu_busy_pct": load.cpu_busy_pct, "load_avg_1m": load.load_avg_1m, "busiest_others_cores": busiest,
                  "window_s": load.window_s},
        next_step="Re-run on a quiet machine (or give the profiled process its own cores: taskset / numactl --cpunodebind); "
        "kernel families and per-kernel durations still hold, step times and tokens/s do not.",
    )]


def rule_latency_knee(report: Report, th: Thresholds) -> list[Finding]:
    """The concurrency where a load sweep stops scaling (throughput flat) or latency bends, and why.

    Causes, in order of evidence: KV-cache pressure (use near 100 %, preemptions), the batch limit (batch size stops
    growing while requests queue), prefill interference (ITL spikes with context-encoding batches in the window), a
    saturated GPU (its capacity: healthy), host-bound (GPU idle while requests queue).
    """
    levels = sorted(report.load_levels, key=lambda lv: lv.concurrency)
    if len(levels) < 2:
        return []
    knee = None
    for prev, cur in zip(levels, levels[1:], strict=False):
        gain = cur.output_tok_per_s / prev.output_tok_per_s - 1.0 if prev.output_tok_per_s > 0 else 0.0
        itl_growth = (cur.itl_ms.p50 / prev.itl_ms.p50) if cur.itl_ms.p50 and prev.itl_ms.p50 else 1.0
        ttft_growth = (cur.ttft_ms.p90 / prev.ttft_ms.p90) if cur.ttft_ms.p90 and prev.ttft_ms.p90 else 1.0
        efficiency = (1.0 + gain) / (cur.concurrency / prev.concurrency)
        # flat throughput, or throughput lagging far behind the added concurrency while latency climbs
        if gain < th.knee_min_gain or (efficiency < th.knee_min_efficiency and max(itl_growth, ttft_growth) >= th.knee_itl_growth):
            knee = (prev, cur, gain, itl_growth)
            break
    best = max(levels, key=lambda lv: lv.output_tok_per_s)
    if knee is None:
        return [Finding(id="load-scales", severity="info", confidence=0.6,
                        title=f"Throughput scaled over the whole sweep: {levels[0].output_tok_per_s:.0f} -> {levels[-1].output_tok_per_s:.0f} output tok/s "
                        f"from concurrency {levels[0].concurrency} to {levels[-1].concurrency}; try higher concurrency to find the knee",
                        evidence={"levels": ",".join(str(lv.concurrency) for lv in levels), "best_output_tok_per_s": best.output_tok_per_s})]
    prev, cur, gain, itl_growth = knee
    srv = cur.server
    ev: dict[str, float | int | str | None] = {
        "knee_concurrency": cur.concurrency, "previous_concurrency": prev.concurrency,
        "output_tok_per_s_before": prev.output_tok_per_s, "output_tok_per_s_at_knee": cur.output_tok_per_s, "throughput_gain_pct": round(100 * gain, 1),
        "itl_p50_ms_before": prev.itl_ms.p50, "itl_p50_ms_at_knee": cur.itl_ms.p50, "itl_p99_ms_at_knee": cur.itl_ms.p99,
        "ttft_p90_ms_at_knee": cur.ttft_ms.p90, "gpu_utilization_pct_at_knee": cur.gpu_utilization_pct,
    }
    cause, why, advice = "unknown", "the server's metrics do not say why", "Read the server's metrics at this concurrency (KV-cache use, batch size, queue)."
    prev_batch = prev.server.batch_size_mean if prev.server else None
    if srv is not None and not srv.unavailable:
        ev.update({"batch_size_mean": srv.batch_size_mean, "batch_size_mean_before": prev_batch, "requests_queued": srv.requests_queued,
                   "kv_cache_used_pct": srv.kv_cache_used_pct, "preemptions": srv.preemptions,
                   "ce_batches": srv.batches.get("CE"), "ce_batch_ms_mean": srv.batch_execution_ms_mean.get("CE"),
                   "tg_batch_ms_mean": srv.batch_execution_ms_mean.get("TG")})
    spike = (cur.itl_ms.p99 / cur.itl_ms.p50) if cur.itl_ms.p99 and cur.itl_ms.p50 else None
    if srv is not None and ((srv.kv_cache_used_pct or 0) >= th.knee_kv_pressure_pct or (srv.preemptions or 0) > 0):
        cause, why = "kv-cache-pressure", f"KV cache {srv.kv_cache_used_pct or 0:.0f}% used, {srv.preemptions or 0:.0f} preemptions in the window"
        advice = "More KV-cache memory (--device-memory-utilization), shorter --max-length, or fewer concurrent requests per replica."
    elif srv is not None and srv.batch_size_mean and prev_batch and srv.batch_size_mean < th.knee_batch_growth * prev_batch:
        cause = "batch-limit"
        why = (f"the batch stayed at {srv.batch_size_mean:.1f} requests (was {prev_batch:.1f}) while concurrency went "
               f"{prev.concurrency} -> {cur.concurrency}: requests wait for a batch slot (TTFT p90 {prev.ttft_ms.p90 or 0:.0f} -> {cur.ttft_ms.p90 or 0:.0f} ms)")
        advice = "Raise --max-batch-size (if memory allows) or add replicas."
    elif spike is not None and spike >= th.knee_itl_spike_ratio and srv is not None and (srv.batches.get("CE") or 0) > 0:
        cause = "prefill-interference"
        why = f"ITL p99 is {spike:.1f}x its p50 with {srv.batches.get('CE', 0):.0f} prefill (CE) batches of {srv.batch_execution_ms_mean.get('CE', 0):.1f} ms mean in the window"
        advice = "Chunked prefill / a smaller prefill token budget (--max-batch-input-tokens), or disaggregated prefill."
    elif cur.gpu_utilization_pct is not None and cur.gpu_utilization_pct >= th.knee_gpu_saturated_pct:
        cause, why = "gpu-saturated", f"the GPU was busy {cur.gpu_utilization_pct:.0f}% of the time: this is its capacity for this model"
        advice = "Healthy: for more throughput, a larger batch per step (if latency allows), quantized weights, or more GPUs."
    elif cur.gpu_utilization_pct is not None and cur.gpu_utilization_pct < th.host_bound_util_pct:
        cause, why = "host-bound", f"the GPU was busy only {cur.gpu_utilization_pct:.0f}% of the time while requests waited"
        advice = "The host side (tokenization, scheduling, streaming) limits: profile the server's processes (py-spy) or add API workers."
    ev["cause"] = cause
    return [Finding(
        id="latency-knee", severity="info" if cause == "gpu-saturated" else "warning", confidence=0.7 if cause != "unknown" else 0.5, evidence=ev,
        title=f"Latency bends at concurrency {cur.concurrency} (throughput +{100 * gain:.0f}% over {prev.concurrency}, ITL p50 x{itl_growth:.2f}): {why}",
        next_step=advice,
    )]


def rule_startup(report: Report, th: Thresholds) -> list[Finding]:
    """Where start-up went: a failed compile, compile-dominated (and the warm-cache command), slow weights, a KV-cache
    allocation that dominates, a slow custom-architecture import."""
    st = report.startup
    if st is None:
        return []
    out: list[Finding] = []
    if st.failure:
        out.append(Finding(id="compile-failed", severity="error", confidence=0.9, title="MAX failed to compile the model: " + st.failure.split(";")[0],
                           evidence={"failure": st.failure[:400], "after_s": st.total_s, "cache": st.cache},
                           next_step=st.failure.split("; ")[-1] if "; " in st.failure else None))
    if st.total_s < th.startup_min_s:
        return out
    compile_s = sum(p.seconds for p in st.phases if "compile" in p.name)
    ev: dict[str, float | int | str | None] = {"startup_s": st.total_s, "compile_s": round(compile_s, 2), "cache": st.cache, "cache_reason": st.cache_reason[:300],
                                               "max_logged_compile_s": st.max_logged_compile_s}
    if st.cache in ("miss", "partial") and compile_s >= th.startup_compile_share_pct / 100 * st.total_s:
        out.append(Finding(
            id="startup-compile", severity="warning", confidence=0.85, evidence=ev,
            title=f"Start-up is compile-dominated: {compile_s:.0f} of {st.total_s:.0f} s compiling (cache {st.cache})",
            next_step="Fill the compile cache in the image or before serving, with the same compile key (the command below); "
            "MODULAR_ENABLE_PROFILING, device graph capture, batch size, max length and the MAX version are all part of the key.",
            command=shell(st.warm_cache_command) if st.warm_cache_command else None))
    weights = next((p for p in st.phases if "weights" in p.name and p.bytes and p.gb_per_s is not None), None)
    if weights is not None and weights.bytes and weights.bytes >= th.weights_min_bytes and weights.gb_per_s is not None and weights.gb_per_s < th.weights_slow_gbps:
        out.append(Finding(
            id="startup-weights-slow", severity="warning", confidence=0.6,
            title=f"Weights moved at {weights.gb_per_s:.2f} GB/s ({weights.bytes / 1e9:.1f} GB in {weights.seconds:.0f} s, {weights.name}): far below a local SSD",
            evidence={"phase": weights.name, "weights_bytes": weights.bytes, "seconds": weights.seconds, "gb_per_s": weights.gb_per_s,
                      "threshold_gbps": th.weights_slow_gbps},
            next_step="The weights are read from their files while they are copied to the device: check where they live (a network file "
            "system, a cold object-store mount) and copy them to local disk."))
    kv = next((p for p in st.phases if p.name.startswith("KV cache allocation")), None)
    if kv is not None and kv.seconds >= th.kv_alloc_share_pct / 100 * st.total_s:
        out.append(Finding(id="startup-kv-alloc", severity="warning", confidence=0.6, evidence={"seconds": kv.seconds, "bytes": kv.bytes, "startup_s": st.total_s},
                           title=f"KV-cache allocation takes {kv.seconds:.0f} of {st.total_s:.0f} s of start-up",
                           next_step="Allocate less up front: --device-memory-utilization or a smaller --max-batch-size / --max-length."))
    # the package's own import: the preflight child's import of it after MAX (its phase is mostly MAX's own import, the
    # H200: 19.4 s of which 13-15 s MAX), and the load's architecture lookup, where MAX imports it again
    own = [(f"{r.spec}: its import in the preflight child, MAX already imported", r.package_import_s) for r in report.preflight
           if r.package_import_s is not None]
    own += [(p.name, p.seconds) for p in st.phases if "custom architectures imported" in p.name and report.preflight]
    slow = next(((name, s) for name, s in own if s >= th.custom_import_slow_s), None)
    if slow is not None:
        preflight_phase = next((p for p in st.phases if "custom-architecture preflight" in p.name), None)
        out.append(Finding(id="startup-custom-import-slow", severity="warning", confidence=0.6,
                           evidence={"where": slow[0], "seconds": round(slow[1], 2), "preflight_child_s": preflight_phase.seconds if preflight_phase else None},
                           title=f"The custom architecture's own import takes {slow[1]:.0f} s (MAX's import not counted)",
                           next_step="Keep import time free of work: no weight loading, graph building or network calls at module level."))
    return out


def rule_phase_markers_missing(report: Report, th: Thresholds) -> list[Finding]:
    k = _kern(report)
    if not k or k.attribution not in ("none", "totals only") or not k.kernels:
        return []
    return [
        Finding(
            id="phases-missing",
            severity="warning",
            title="The trace has no phase ranges: kernels cannot be split into prefill and decode",
            evidence={"kernels": k.kernels, "source": k.source, "gpu_busy_pct": round(k.gpu_busy_pct, 1) if k.gpu_busy_pct is not None else None},
            confidence=0.9,
            next_step=_phase_next_step(report),
            command=for_model(report, "run", kernels="cupti") if report.serve is not None and report.environment.max_profiling_problem else None,
        )
    ]


def _phase_next_step(report: Report) -> str:
    """How to get phase ranges, consistent with what the report knows of this machine (MAX's own ranges may not work here)."""
    problem = report.environment.max_profiling_problem
    if problem and report.serve is not None:
        return ("MAX's scheduler ranges need MODULAR_ENABLE_PROFILING=on, which cannot work on this GPU image (" + problem + "). "
                "For a prefill / decode split, profile the model in-process, where max_profile marks the phases itself. "
                "Busy time and family verdicts below cover the whole capture.")
    if problem:
        return ("Capture with max-profile (it marks prefill/decode in the `max_profile` NVTX domain; MODULAR_ENABLE_PROFILING=on "
                "cannot work on this GPU image: " + problem + "). Busy time and family verdicts below cover the whole capture.")
    return ("Capture with max-profile (it marks prefill/decode in the `max_profile` NVTX domain), or set "
            "MODULAR_ENABLE_PROFILING=on so MAX's scheduler ranges (_schedule(... batch_type=CE|TG)) appear; "
            "check with `nsys stats --report nvtx_sum REPORT`. Busy time and family verdicts below cover the whole capture.")


def rule_dense_decode(report: Report, th: Thresholds) -> list[Finding]:
    """Decode dominated by matrix-vector products: healthy, memory-bound dense decode.

    Without phase ranges the whole capture's mix is read (a matvec-dominated capture is a decode),
    with lower confidence.
    """
    k = _kern(report)
    if not k or k.unreliable or not _gpu_kernels(k):
        return []
    d = _phase(k, "decode")
    if d is None and k.phases:
        return []
    families = d.families if d else k.families
    if not families:
        return []
    top = families[0]
    gemv = next((r for r in families if r.family == "gemv"), None)
    if top.family != "gemv" or gemv is None or gemv.share_pct < th.healthy_gemv_share_pct:
        return []
    names = [r.family for r in families[:4]]
    evidence: dict[str, float | int | str | None] = {"gemv_share_pct": round(gemv.share_pct, 1), "top_families": ",".join(names)}
    if d is not None:
        evidence["decode_kernel_us_per_token"] = round(d.kernel_us_per_token or 0, 2)
        title = "Healthy dense decode: matrix-vector products dominate (memory-bound), then " + ", ".join(names[1:3])
        confidence = 0.8
    else:
        evidence["scope"] = "whole capture (no phase ranges)"
        title = "Matrix-vector products dominate the capture: a memory-bound dense decode (no phase ranges: whole capture), then " + ", ".join(names[1:3])
        confidence = 0.8 * th.no_phase_confidence_scale
    return [Finding(id="healthy-dense-decode", severity="info", title=title, evidence=evidence, confidence=round(confidence, 2), next_step=None)]


def rule_moe(report: Report, th: Thresholds) -> list[Finding]:
    k = _kern(report)
    if not k or not _gpu_kernels(k):
        return []
    scope = _phase(k, "decode")
    rows = scope.families if scope else k.families
    grouped = _fam_ms(rows, "grouped_matmul")
    routing = _fam_ms(rows, "moe_routing") + _fam_ms(rows, "gather_scatter")
    if grouped <= 0 or _fam_ms(rows, "moe_routing") <= 0:
        return []
    ratio = routing / grouped
    ev: dict[str, float | int | str | None] = {"grouped_matmul_ms": round(grouped, 3), "routing_and_gather_ms": round(routing, 3), "ratio": round(ratio, 2), "threshold": th.routing_vs_matmul_ratio}
    if ratio >= th.routing_vs_matmul_ratio:
        return [Finding(id="moe-routing-heavy", severity="warning", title="MoE routing and gather/scatter rival the expert matmuls", evidence=ev, confidence=0.7,
                        next_step="Look at the top routing/gather kernels in the table; a single-kernel deep dive shows whether they are latency-bound.",
                        command=_top_kernel_command(report, ("moe_routing", "gather_scatter")))]
    return [Finding(id="healthy-moe", severity="info", title="Healthy MoE: grouped expert matmuls dominate; routing cost is expected", evidence=ev, confidence=0.7)]


def rule_quant_prep(report: Report, th: Thresholds) -> list[Finding]:
    k = _kern(report)
    if not k or not _gpu_kernels(k):
        return []
    rows = k.families
    quant = _fam_ms(rows, "quantize")
    matmul = _fam_ms(rows, "grouped_matmul") + _fam_ms(rows, "gemm") + _fam_ms(rows, "gemv")
    if quant <= 0 or matmul <= 0:
        return []
    ratio = quant / matmul
    ev: dict[str, float | int | str | None] = {"quantize_ms": round(quant, 3), "matmul_ms": round(matmul, 3), "ratio": round(ratio, 4)}
    if ratio > th.quant_vs_matmul_ratio:
        return [Finding(id="quant-prep-heavy", severity="warning", title="Low-bit quantization prep takes longer than the matmuls it feeds", evidence=ev, confidence=0.7,
                        next_step="Deep-dive the top quantize kernel and check the scale layout matches the matmul's.",
                        command=_top_kernel_command(report, ("quantize",)))]
    return [Finding(id="low-bit-normal", severity="info", title="Low-bit weights: activation quantization and scale layout present at normal cost", evidence=ev, confidence=0.6)]


def _attention_presence(k: KernelBreakdown) -> tuple[float | None, str, int]:
    """(attention kernels per decode step, or per capture when no phases; the scope; attention kernels counted)."""
    d = _phase(k, "decode")
    if d is not None and d.steps:
        n = sum(r.kernels for r in d.families if r.family == "attention")
        return n / d.steps, "decode", n
    if k.phases:
        return None, "", 0
    n = sum(r.kernels for r in k.families if r.family == "attention")
    return float(n), "capture", n


def rule_unfused(report: Report, th: Thresholds) -> list[Finding]:
    """A decoder whose kernels show no fused attention / norm: a wiring problem at bring-up.

    Attention is judged by presence (attention kernels per decode step), never by its share of time: a slow
    matmul elsewhere (an FP8 fallback) makes a fused attention's share ~0 without anything being unfused.
    """
    k = _kern(report)
    if not k or k.unreliable or not k.kernels:
        return []
    rows = k.families
    has_matmul = any(r.family in ("gemm", "gemv", "grouped_matmul") for r in rows)
    if not has_matmul:
        return []
    out = []
    per_step, scope, count = _attention_presence(k)
    if per_step is not None and per_step < th.min_attention_kernels_per_step:
        total = sum(r.total_ms for r in rows) or 1.0
        ev: dict[str, float | int | str | None] = {
            "attention_kernels": count,
            "attention_kernels_per_decode_step" if scope == "decode" else "attention_kernels_in_capture": round(per_step, 2),
            "attention_share_pct": round(100.0 * _fam_ms(rows, "attention") / total, 3),
            "matmul_ms": round(_fam_ms(rows, "gemm") + _fam_ms(rows, "gemv"), 3),
            "elementwise_ms": round(_fam_ms(rows, "elementwise") + _fam_ms(rows, "activation"), 3),
            "top_families": ",".join(r.family for r in rows[:5]),
            "source": k.source,
            "threshold_per_step": th.min_attention_kernels_per_step,
        }
        out.append(
            Finding(
                id="unfused-attention",
                severity="warning",
                title="No fused attention kernel: attention runs as generic matmul / softmax / elementwise ops",
                evidence=ev,
                confidence=0.75 if scope == "decode" else round(0.75 * th.no_phase_confidence_scale, 2),
                next_step="Wire the architecture's attention to MAX's fused attention (e.g. the KV-cache-aware attention "
                "layers in max.nn that launch *_mha_* kernels) and compare this breakdown again.",
            )
        )
    # RoPE is fused into other kernels by MAX on GPUs (no kernel carries its name on the H200),
    # so only the norm is checked by name.
    for family, what in (("norm", "RMS norm"),):
        if _fam_ms(rows, family) <= 0 and k.kernels > th.unfused_norm_min_kernels:
            out.append(
                Finding(
                    id=f"unfused-{family}",
                    severity="info",
                    title=f"No fused {what} kernel in the trace",
                    evidence={"family": family, "kernels": k.kernels, "top_families": ",".join(r.family for r in rows[:5])},
                    confidence=0.5,
                    next_step=f"If the architecture uses {what}, check it is built from MAX's fused op rather than elementwise pieces.",
                )
            )
    return out


def rule_kv_cache(report: Report, th: Thresholds) -> list[Finding]:
    """Decode work growing ~linearly with the sequence: the KV cache is missing or not used.

    Signals, any of which fires:

    * step time grows with the sequence length (and correlates with it);
    * kernel time per decode step grows the same way (what the GPU computes, not the host);
    * the scheduler feeds the whole sequence again (input tokens per request > 1 and growing;
      speculative decoding feeds a constant 1 + draft tokens);
    * the model computes more tokens than the scheduler fed: tokens in the model's own input
      tensor per request grow with the sequence while the scheduler feeds 1 (an architecture that
      re-encodes behind the scheduler's back).

    A prefill-like kernel mix in decode is reported as evidence.
    """
    steps = sorted((s for s in report.steps if s.phase == "decode" and s.batch_size > 0 and s.sequence_tokens is not None), key=lambda s: s.start_ns)
    s = _steps(report)
    if len(steps) < th.kv_min_decode_steps or not s:
        return []
    import numpy as np

    seq = np.array([st.sequence_tokens for st in steps], dtype=float)
    # on a CPU device the step's own CPU time, not its wall time: another process taking cores mid-run slows the later
    # steps' wall time (a trend with the sequence) but not the work they do; on a GPU the step's wall time is the measure
    on_cpu = report.environment.vendor == "none" and all(st.cpu_ns is not None for st in steps)
    ms = np.array([(st.cpu_ns if on_cpu else st.duration_ns) / 1e6 for st in steps])  # type: ignore[operator]
    fed = np.array([st.input_tokens / st.batch_size for st in steps])
    if seq.max() - seq.min() < th.kv_min_context_growth:
        return []
    third = max(len(ms) // 3, 1)
    first, last = float(np.median(ms[:third])), float(np.median(ms[-third:]))
    ratio = last / first if first > 0 else 0.0
    corr = _corr(seq, ms)
    fed_first, fed_last = float(np.median(fed[:third])), float(np.median(fed[-third:]))
    evidence: dict[str, float | int | str | None] = {
        "decode_steps": len(steps),
        "step_time": "process CPU time per step (load-independent)" if on_cpu else "wall time per step",
        "sequence_from": int(seq.min()),
        "sequence_to": int(seq.max()),
        "first_third_median_ms": round(first, 3),
        "last_third_median_ms": round(last, 3),
        "growth_ratio": round(ratio, 2),
        "time_vs_sequence_correlation": round(corr, 3),
        "growth_ms_per_100_tokens": round(s.decode_step_growth_ms_per_100_ctx or 0.0, 4),
        "decode_input_tokens_per_request_first": round(fed_first, 1),
        "decode_input_tokens_per_request_last": round(fed_last, 1),
    }
    kernel_growth, kernel_corr = _per_step_kernel_growth(report, steps, th.kv_min_kernel_steps)
    if kernel_growth is not None:
        evidence["decode_kernel_ms_growth_ratio"] = round(kernel_growth, 2)
        evidence["kernel_time_vs_sequence_correlation"] = round(kernel_corr, 3)
    model_fed = [st.model_input_tokens / st.batch_size for st in steps if st.model_input_tokens is not None]
    model_refeeds = False
    if len(model_fed) == len(steps):
        mf = np.array(model_fed)
        mf_first, mf_last = float(np.median(mf[:third])), float(np.median(mf[-third:]))
        evidence["model_input_tokens_per_request_first"] = round(mf_first, 1)
        evidence["model_input_tokens_per_request_last"] = round(mf_last, 1)
        model_refeeds = bool((mf >= 2).mean() >= 0.9) and mf_last >= mf_first + th.kv_min_context_growth / 2 and _corr(seq, mf) >= th.kv_model_refeed_corr
    evidence.update(_decode_vs_prefill_mix(report))
    time_grows = ratio >= th.kv_growth_ratio and corr >= th.kv_trend_corr
    if time_grows:
        halves = _half_slopes(seq, ms)
        whole = (last - first) / max(float(np.median(seq[-third:])) - float(np.median(seq[:third])), 1.0)
        evidence["growth_ms_per_token_first_half"] = round(halves[0], 5)
        evidence["growth_ms_per_token_second_half"] = round(halves[1], 5)
        if min(halves) < th.kv_gradual_share * whole:
            # one level shift (another process taking cores partway, a clock change), not growth at every step
            time_grows = False
            evidence["step_time_not_judged"] = ("the step time rose in one jump, not step by step with the sequence "
                                                f"(robust slope per half {halves[0]:.4f} / {halves[1]:.4f} ms per token against {whole:.4f} overall)")
    # MAX's op ranges on a CPU are host wall time (load-dependent): evidence there, a trigger only for GPU kernels
    kernels_grow = (kernel_growth is not None and kernel_growth >= th.kv_growth_ratio and kernel_corr >= th.kv_trend_corr
                    and not (on_cpu and not _gpu_kernels_of(report)))
    refeeds = bool((fed >= 2).mean() >= 0.9) and fed_last >= fed_first + th.kv_min_context_growth / 2
    if time_grows and _host_contended(report, th):
        # other processes held the cores: a step time rising through the run says more about them than about the cache
        # (host-contention says so); token counts and GPU kernel times still judge
        time_grows = False
        evidence["step_time_not_judged"] = "other processes held the host's cores during the capture"
    if not (time_grows or kernels_grow or refeeds or model_refeeds):
        return []
    signals = [name for name, on in (("step time", time_grows), ("kernel time", kernels_grow), ("re-fed tokens", refeeds),
                                     ("model re-encodes the sequence", model_refeeds)) if on]
    evidence["signals"] = ", ".join(signals)
    confidence = 0.95 if refeeds or model_refeeds else 0.85 if kernels_grow or kernel_growth is not None else 0.7
    title = "Decode work grows with the sequence at every step: the KV cache is missing or not used (O(n²) re-prefill)"
    if model_refeeds and not refeeds:
        title = ("The model re-encodes the whole sequence at every decode step while the scheduler feeds one token: "
                 "the KV cache is not used (O(n²) re-prefill)")
    return [
        Finding(
            id="kv-cache-broken",
            severity="error",
            title=title,
            evidence=evidence,
            confidence=confidence,
            next_step="A correctness bug, not only slowness: check the architecture writes K/V into MAX's KV cache and "
            "attends over it in decode (paged attention), instead of re-encoding the whole sequence.",
        )
    ]


def _half_slopes(seq: object, ms: object) -> tuple[float, float]:
    """Theil-Sen slope (ms per token) of step time against the sequence in each half of the decode: the median of the
    pairwise slopes, which one jump in level (a step function) leaves near 0 where steady growth keeps it."""
    import numpy as np
    from scipy.stats import theilslopes

    x, y = np.asarray(seq, dtype=float), np.asarray(ms, dtype=float)
    mid = x.size // 2
    out = []
    for a, b in ((x[:mid], y[:mid]), (x[mid:], y[mid:])):
        if a.size > 1500:  # every pair of 1,500 steps is ~1.1 M slopes: enough, and bounded
            pick = np.linspace(0, a.size - 1, 1500).astype(int)
            a, b = a[pick], b[pick]
        out.append(float(theilslopes(b, a)[0]) if a.size >= 2 and np.ptp(a) > 0 else 0.0)
    return out[0], out[1]


def _gpu_kernels_of(report: Report) -> bool:
    k = _kern(report)
    return bool(k and _gpu_kernels(k))


def _corr(x: object, y: object) -> float:
    """How steadily y rises with x: Spearman's rank correlation of x and y after a running median of 5 over y.

    x and y are per-step series in time order. Steps the OS delayed (a busy 2-core VM, a noisy
    neighbour) wreck Pearson's r (four 40 ms stalls in 64 doubling decode steps: r = -0.18); the
    running median drops isolated stalls and ranks ignore how large the rest are, so one noisy step
    neither makes nor breaks a verdict. 0.0 when either series is constant.
    """
    import numpy as np
    from scipy.stats import rankdata  # ties share their mean rank

    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.size >= 5:
        b = np.median(np.lib.stride_tricks.sliding_window_view(np.pad(b, 2, mode="edge"), 5), axis=1)
    if a.size < 2:
        return 0.0
    ra, rb = rankdata(a), rankdata(b)
    if ra.std() == 0 or rb.std() == 0:  # ranks of equal values are exactly equal (a float std of them need not be 0)
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def _decode_vs_prefill_mix(report: Report) -> dict[str, float | int | str | None]:
    """How much decode's kernel mix looks like prefill's (cosine similarity of family time shares).

    Healthy decode on a GPU is matrix-vector work (gemv) while prefill is matrix-matrix (gemm);
    a decode that re-encodes the sequence runs the prefill mix again. On a CPU both phases run
    the same ops, so this is evidence, not a trigger.
    """
    k = _kern(report)
    if not k:
        return {}
    pre, dec = _phase(k, "prefill"), _phase(k, "decode")
    if not pre or not dec or not pre.families or not dec.families:
        return {}
    import numpy as np

    fams = sorted({r.family for r in pre.families} | {r.family for r in dec.families})
    a = np.array([_fam_ms(pre.families, f) for f in fams])
    b = np.array([_fam_ms(dec.families, f) for f in fams])
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    out: dict[str, float | int | str | None] = {"decode_top_family": dec.families[0].family}
    if norm > 0:
        out["decode_vs_prefill_mix_similarity"] = round(float(a @ b) / norm, 3)
    total = float(b.sum())
    if total > 0:
        out["decode_gemm_share_pct"] = round(100.0 * _fam_ms(dec.families, "gemm") / total, 1)
    return out


def _per_step_kernel_growth(report: Report, decode_steps: list[Step], min_steps: int) -> tuple[float | None, float]:
    """Decode kernel time per step: last-third / first-third median, and its correlation with the sequence length.

    The breakdown's per-step entries are paired with the decode steps in time order (same count).
    """
    k = _kern(report)
    if not k:
        return None, 0.0
    per = [p.kernel_ms for p in k.per_step if p.phase == "decode"]
    if len(per) < min_steps:
        return None, 0.0
    import numpy as np

    third = max(len(per) // 3, 1)
    a, b = float(np.median(per[:third])), float(np.median(per[-third:]))
    corr = _corr([st.sequence_tokens for st in decode_steps], per) if len(per) == len(decode_steps) else 0.0
    return (b / a if a > 0 else None), corr


def _cost_evidence(c: DecodeCost) -> dict[str, float | int | str | None]:
    ev: dict[str, float | int | str | None] = {
        "batch": c.batch,
        "context_tokens": c.context_tokens,
        "weight_bytes_per_step": round(c.weight_bytes),
        "kv_bytes_per_step": round(c.kv_bytes),
        "bytes_per_step": round(c.weight_bytes + c.kv_bytes + c.embedding_bytes),
        "decode_step_p50_ms": c.step.ms_per_step,
        "achieved_GBps": c.step.achieved_GBps,
        "peak_GBps": c.peak_bandwidth_GBps,
        "pct_of_peak": c.step.pct_of_peak_bandwidth,
        "gpu": c.gpu,
        "weights": c.weights_basis,
    }
    if c.kernels is not None:
        ev["pct_of_peak_kernel_time"] = c.kernels.pct_of_peak_bandwidth
    return ev


def _matmul_row(c: DecodeCost) -> FamilyRoofline | None:
    return next((r for r in c.families if r.family.startswith("matmul")), None)


def rule_decode_bandwidth(report: Report, th: Thresholds) -> list[Finding]:
    """Decode's bytes (weights once + the KV cache of every request) over the step time, against peak bandwidth."""
    c = report.decode_cost
    if c is None or report.environment.vendor == "none" or c.step.pct_of_peak_bandwidth is None:
        return []
    pct = c.step.pct_of_peak_bandwidth
    ev = _cost_evidence(c)
    k = _kern(report)
    d = _phase(k, "decode") if k else None
    busy = d.gpu_busy_pct if d else None
    if pct < th.decode_bw_low_pct and (busy is None or busy >= th.host_bound_busy_pct):
        return [Finding(id="decode-bandwidth-low", severity="warning", title=f"Decode reads memory at {pct:.0f}% of the GPU's peak bandwidth", evidence=ev, confidence=0.6,
                        next_step="Find the decode kernel furthest from bandwidth peak: deep-dive the top decode kernel.",
                        command=_top_kernel_command(report, ("gemv", "gemm", "grouped_matmul", "attention")))]
    return [Finding(id="decode-bandwidth", severity="info", title=f"Decode reads memory at {pct:.0f}% of the GPU's peak bandwidth (weights + KV cache per step)",
                    evidence=ev, confidence=0.6)]


def _decode_matmul_kernels(k: KernelBreakdown) -> list[KernelRow]:
    d = _phase(k, "decode")
    rows = d.top_kernels if d else k.top_kernels
    return [r for r in rows if r.family in ("gemv", "gemm", "grouped_matmul")]


def rule_matmul_roofline(report: Report, th: Thresholds) -> list[Finding]:
    """Decode matmuls that dominate the step while running far below both roofs (bandwidth and compute).

    The weights a step must read over the matmul kernels' time says how far they are from the memory roof; the FLOPs
    over the same time, from the compute roof. A matmul family far below both that still takes most of the step is a
    slow kernel path (MAX's naive FP8 fallback is named when its kernels ran). Host-bound runs are left to that verdict.
    """
    c, k = report.decode_cost, _kern(report)
    if c is None or not k or k.unreliable or not _gpu_kernels(k):
        return []
    m = _matmul_row(c)
    d = _phase(k, "decode")
    if m is None or d is None or not d.kernel_ms or m.ms_per_step is None:
        return []
    share = 100.0 * m.ms_per_step * d.steps / d.kernel_ms
    bw, fl = m.pct_of_peak_bandwidth, m.pct_of_peak_compute
    if share < th.slow_matmul_share_pct or bw is None or bw >= th.slow_matmul_roofline_pct or (fl is not None and fl >= th.slow_matmul_roofline_pct):
        return []
    if d.gpu_busy_pct is not None and d.gpu_busy_pct < th.host_bound_busy_pct:
        return []
    kernels = _decode_matmul_kernels(k)
    slow = [(r, slow_path(r.name)) for r in kernels]
    named = [(r, sp) for r, sp in slow if sp is not None]
    ev: dict[str, float | int | str | None] = {
        "matmul_share_of_decode_kernel_pct": round(share, 1),
        "matmul_ms_per_step": m.ms_per_step,
        "weight_bytes_per_step": round(c.weight_bytes),
        "matmul_achieved_GBps": m.achieved_GBps,
        "pct_of_peak_bandwidth": bw,
        "matmul_achieved_TFLOPs": m.achieved_TFLOPs,
        "pct_of_peak_compute": fl,
        "operand": c.operand,
        "top_matmul_kernels": ", ".join(r.name[:80] for r in kernels[:3]),
        "weights": c.weights_basis,
        "threshold_pct": th.slow_matmul_roofline_pct,
    }
    if named:
        what, advice = named[0][1]
        share_named = sum(r.share_pct for r, _ in named)
        ev["slow_path_share_of_decode_pct"] = round(share_named, 1)
        return [Finding(
            id="matmul-slow-path", severity="warning", confidence=0.85, evidence=ev,
            title=f"Decode matmuls run through {what}: {share_named:.0f}% of decode kernel time at {bw:.0f}% of peak bandwidth",
            next_step=advice + ". A deep dive of the fallback kernel shows why it is slow:",
            command=kernel_command(report, named[0][0].name),
        )]
    return [Finding(
        id="matmul-below-roofline", severity="warning", confidence=0.7, evidence=ev,
        title=f"Decode matmuls take {share:.0f}% of decode kernel time at {bw:.0f}% of peak bandwidth"
        + (f" and {fl:.0f}% of peak compute" if fl is not None else "") + ": far below the roofline",
        next_step="Deep-dive the top matmul kernel; try another quantization encoding or batch size, and report the shape to Modular if it persists.",
        command=kernel_command(report, kernels[0].name) if kernels else None,
    )]


def rule_batched_decode(report: Report, th: Thresholds) -> list[Finding]:
    """Decode at batch > 1 is GEMM-shaped; near either roof (weights over matmul time, or FLOP/s) it is healthy."""
    c, k = report.decode_cost, _kern(report)
    if c is None or c.batch < th.batched_decode_min_batch or not k or k.unreliable or not _gpu_kernels(k):
        return []
    m = _matmul_row(c)
    d = _phase(k, "decode")
    if m is None or d is None or not d.families:
        return []
    top = d.families[0]
    best = max(v for v in (m.pct_of_peak_bandwidth, m.pct_of_peak_compute, 0.0) if v is not None)
    if top.family not in ("gemm", "gemv", "grouped_matmul") or best < th.batched_healthy_roofline_pct:
        return []
    ev: dict[str, float | int | str | None] = {
        "batch": c.batch, "top_family": top.family, "top_family_share_pct": round(top.share_pct, 1),
        "matmul_pct_of_peak_bandwidth": m.pct_of_peak_bandwidth, "matmul_pct_of_peak_compute": m.pct_of_peak_compute,
        "step_pct_of_peak_bandwidth": c.step.pct_of_peak_bandwidth, "threshold_pct": th.batched_healthy_roofline_pct,
    }
    return [Finding(id="healthy-batched-decode", severity="info", confidence=0.75, evidence=ev,
                    title=f"Healthy batched decode: {c.batch} requests per step, matrix products ({top.family}) dominate and read the weights "
                    f"at {m.pct_of_peak_bandwidth or 0:.0f}% of peak bandwidth")]


def rule_communication(report: Report, th: Thresholds) -> list[Finding]:
    """Multi-GPU decode where collectives (allreduce, EP dispatch/combine) take a large share of kernel time."""
    k = _kern(report)
    if not k or len(k.per_device) < 2:
        return []
    shares = [d.collective_share_of_decode_pct for d in k.per_device if d.collective_share_of_decode_pct is not None]
    if not shares:
        return []
    worst = max(k.per_device, key=lambda d: d.collective_share_of_decode_pct or 0.0)
    ev: dict[str, float | int | str | None] = {
        "devices": len(k.per_device),
        "max_collective_share_of_decode_pct": round(worst.collective_share_of_decode_pct or 0.0, 1),
        "device": worst.device,
        "collective_ms_per_decode_step": round(worst.collective_ms_per_decode_step or 0.0, 4),
        "threshold_pct": th.communication_share_pct,
    }
    if (worst.collective_share_of_decode_pct or 0.0) >= th.communication_share_pct:
        return [Finding(id="communication-dominates", severity="warning", confidence=0.7, evidence=ev,
                        title="Collectives take a large share of each decode step: communication, not compute, limits tensor/expert parallelism",
                        next_step="Try fewer GPUs per replica (or data parallelism), check NVLink/P2P is used (nvidia-smi topo -m), and compare allreduce time per step against its size.")]
    return [Finding(id="communication-share", severity="info", confidence=0.6, evidence=ev, title="Collective share of decode kernel time per GPU is moderate")]


@dataclass(frozen=True)
class RuleSpec:
    """One diagnosis rule: what it is called, the finding ids it may emit, the report sections it reads, and the
    :class:`Thresholds` fields it uses (every number it decides by)."""

    name: str
    fn: Rule
    emits: tuple[str, ...]
    needs: tuple[str, ...]
    thresholds: tuple[str, ...] = ()


def rule_kernel_analyses(report: Report, th: Thresholds) -> list[Finding]:
    """Each Nsight Compute analysis's verdicts (bound, on-chip, occupancy), in the same sort and supersession as the rest."""
    from max_profile.analyze.ncu import kernel_findings

    return [f for a in report.kernel_analyses for f in kernel_findings(a, th)]


RULES: tuple[RuleSpec, ...] = (
    RuleSpec(
        "kv-cache",
        rule_kv_cache,
        ("kv-cache-broken",),
        ("steps", "step_summary", "kernels"),
        ("kv_growth_ratio", "kv_min_decode_steps", "kv_min_context_growth", "kv_model_refeed_corr", "kv_trend_corr", "kv_gradual_share", "kv_min_kernel_steps",
         "host_load_other_cores", "host_load_busy_fraction"),
    ),
    RuleSpec(
        "host-bound",
        rule_host_bound,
        ("host-bound",),
        ("utilization", "kernels", "step_summary"),
        ("host_bound_util_pct", "host_bound_busy_pct", "nvml_min_window_s", "nvml_min_samples", "no_phase_confidence_scale"),
    ),
    RuleSpec("gpu-bound", rule_gpu_bound, ("gpu-bound",), ("kernels",), ("gpu_bound_busy_pct", "no_phase_confidence_scale")),
    RuleSpec(
        "host-time-between-ops",
        rule_host_time_between_ops,
        ("host-time-between-ops",),
        ("kernels", "step_summary"),
        ("host_bound_busy_pct",),
    ),
    RuleSpec("throttled", rule_throttled, ("throttled",), ("utilization",), ("throttle_clock_pct",)),
    RuleSpec("near-oom", rule_near_oom, ("near-oom",), ("utilization",), ("near_oom_pct",)),
    RuleSpec("device-graphs", rule_graphs_hid_kernels, ("device-graphs",), ("kernels",)),
    RuleSpec("graph-launch-late", rule_graph_launch_late, ("graph-launch-late",), ("kernels",),
             ("gpu_wait_min_us", "gpu_wait_max_ms", "graph_launch_late_pct", "graph_launch_late_min_gaps")),
    RuleSpec("tracer-overhead", rule_tracer_overhead, ("tracer-overhead",), ("kernels", "utilization", "tracer_cost"),
             ("tracer_overhead_pct", "tracer_slowdown_pct")),
    RuleSpec(
        "host-contention", rule_host_contention, ("host-contention",), ("capture",), ("host_load_other_cores", "host_load_busy_fraction")
    ),
    RuleSpec("phases-missing", rule_phase_markers_missing, ("phases-missing",), ("kernels", "environment")),
    RuleSpec(
        "unfused",
        rule_unfused,
        ("unfused-attention", "unfused-norm"),
        ("kernels",),
        ("min_attention_kernels_per_step", "no_phase_confidence_scale", "unfused_norm_min_kernels"),
    ),
    RuleSpec(
        "dense-decode", rule_dense_decode, ("healthy-dense-decode",), ("kernels",), ("healthy_gemv_share_pct", "no_phase_confidence_scale")
    ),
    RuleSpec("moe", rule_moe, ("moe-routing-heavy", "healthy-moe"), ("kernels",), ("routing_vs_matmul_ratio",)),
    RuleSpec("quant", rule_quant_prep, ("quant-prep-heavy", "low-bit-normal"), ("kernels",), ("quant_vs_matmul_ratio",)),
    RuleSpec(
        "decode-bandwidth",
        rule_decode_bandwidth,
        ("decode-bandwidth", "decode-bandwidth-low"),
        ("decode_cost", "kernels"),
        ("decode_bw_low_pct", "host_bound_busy_pct"),
    ),
    RuleSpec(
        "matmul-roofline",
        rule_matmul_roofline,
        ("matmul-slow-path", "matmul-below-roofline"),
        ("decode_cost", "kernels"),
        ("slow_matmul_share_pct", "slow_matmul_roofline_pct", "host_bound_busy_pct"),
    ),
    RuleSpec(
        "batched-decode",
        rule_batched_decode,
        ("healthy-batched-decode",),
        ("decode_cost", "kernels"),
        ("batched_decode_min_batch", "batched_healthy_roofline_pct"),
    ),
    RuleSpec(
        "communication", rule_communication, ("communication-dominates", "communication-share"), ("kernels",), ("communication_share_pct",)
    ),
    RuleSpec(
        "latency-knee",
        rule_latency_knee,
        ("latency-knee", "load-scales"),
        ("load_levels",),
        (
            "knee_min_gain",
            "knee_min_efficiency",
            "knee_itl_growth",
            "knee_batch_growth",
            "knee_kv_pressure_pct",
            "knee_itl_spike_ratio",
            "knee_gpu_saturated_pct",
            "host_bound_util_pct",
        ),
    ),
    RuleSpec(
        "startup",
        rule_startup,
        ("compile-failed", "startup-compile", "startup-weights-slow", "startup-kv-alloc", "startup-custom-import-slow"),
        ("startup", "preflight"),
        (
            "startup_min_s",
            "startup_compile_share_pct",
            "weights_slow_gbps",
            "weights_min_bytes",
            "kv_alloc_share_pct",
            "custom_import_slow_s",
        ),
    ),
    RuleSpec(
        "kernel-analyses",
        rule_kernel_analyses,
        (
            "kernel-memory-bound-near-peak",
            "kernel-on-chip-bound",
            "kernel-memory-bound",
            "kernel-compute-far-from-peak",
            "kernel-latency-bound",
            "kernel-low-occupancy",
            "kernel-occupancy-limited",
        ),
        ("kernel_analyses",),
        ("ncu_near_peak_dram_pct", "ncu_on_chip_busy_pct", "ncu_on_chip_dram_idle_pct"),
    ),
)
"""Every rule, in the order they run (the findings are then sorted by severity)."""


_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


SUPERSEDED_BY: dict[str, frozenset[str]] = {
    # a decode that re-encodes the sequence, or runs attention as generic ops, is not a healthy decode,
    # and its bytes-per-step model (weights + KV cache once) does not apply
    "healthy-dense-decode": frozenset({"kv-cache-broken", "unfused-attention", "matmul-slow-path", "matmul-below-roofline", "healthy-batched-decode"}),
    "decode-bandwidth": frozenset({"kv-cache-broken"}),
    # a host-bound decode explains its low bandwidth; a named slow matmul path says more than the number alone
    "decode-bandwidth-low": frozenset({"kv-cache-broken", "host-bound", "matmul-slow-path", "matmul-below-roofline"}),
    # utilization and GPU-busy figures measured while the tracer stalled the process say nothing about the host
    "host-bound": frozenset({"tracer-overhead"}),
    # graphs launched late under a tracer whose cost was measured: the tracer's finding carries the waits as evidence;
    # a host-bound run waits before its graphs by definition (the late launches are its tail only where the GPU is busy)
    "graph-launch-late": frozenset({"tracer-overhead", "host-bound"}),
    # "quantization at normal cost" next to a matmul path far below its roofline reads as "all is well": the slow path is the news
    "low-bit-normal": frozenset({"matmul-slow-path", "matmul-below-roofline"}),
    # a named healthy mix already says where the busy GPU's time goes
    "gpu-bound": frozenset({"healthy-dense-decode", "healthy-moe", "moe-routing-heavy", "kv-cache-broken", "tracer-overhead", "healthy-batched-decode",
                            "matmul-slow-path", "matmul-below-roofline"}),
}
"""Findings dropped when a finding that explains the same numbers better fired."""


def evaluate(report: Report, thresholds: Thresholds | None = None, rules: tuple[RuleSpec, ...] = RULES) -> list[Finding]:
    """Run every rule; drop findings a better explanation superseded; order by severity (errors first), stable within one."""
    th = thresholds or Thresholds()
    found: list[Finding] = []
    for rule in rules:
        emitted = rule.fn(report, th)
        stray = {f.id for f in emitted} - set(rule.emits)
        if stray:
            raise AssertionError(f"rule {rule.name} emitted {sorted(stray)}, not among its declared ids {rule.emits}")
        found.extend(emitted)
    fired = {f.id for f in found}
    found = [f for f in found if not (SUPERSEDED_BY.get(f.id, frozenset()) & fired)]
    found.sort(key=lambda f: _SEVERITY_ORDER[f.severity])
    return found
