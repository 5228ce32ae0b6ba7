"""The trace itself: device graphs that hid kernels, a tracer that slowed the profiled process, phase ranges missing."""

from __future__ import annotations

from max_profile.analyze.commands import for_model
from max_profile.analyze.rules.base import kern, util
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Finding, Report


def rule_graphs_hid_kernels(report: Report, th: Thresholds) -> list[Finding]:
    k = kern(report)
    if not k or not k.unreliable:
        return []
    return [
        Finding(
            id="device-graphs",
            severity="warning",
            title="Device graphs replayed the kernels: per-kernel and per-step numbers are unreliable",
            evidence={
                "kernels": k.kernels,
                "source": k.source,
                "device_graph_capture": str(report.capture.device_graph_capture),
            },
            confidence=0.8,
            next_step="Record with a tracer that opens graphs (max_profile's CUPTI recorder, or `nsys profile "
            "--cuda-graph-trace=node`), or re-run with device graphs off to see each kernel.",
            command=for_model(report, "kernels", backend="cupti"),
            detail=k.unreliable,
        )
    ]


def _measured_tracer_cost(report: Report, th: Thresholds) -> list[Finding]:
    """The recorder's cost as measured against the untraced reference window of the same server."""
    c = report.tracer_cost
    assert c is not None and c.throughput_ratio is not None
    slowdown = 100.0 * (1.0 - c.throughput_ratio)
    if slowdown < th.tracer_slowdown_pct or not c.resolved:  # a drop within the windows' own noise is no measured cost
        return []
    step = c.decode_step_change_pct
    evidence: dict[str, float | int | str | None] = {
        "recorded_tok_s": round(c.traced_tok_s, 1),
        "untraced_tok_s": round(c.reference_tok_s, 1),
        "throughput_ratio": c.throughput_ratio,
        "throughput_ratio_noise": c.throughput_ratio_noise,
        "recorded_decode_step_ms": c.traced_decode_step_ms,
        "untraced_decode_step_ms": c.reference_decode_step_ms,
        "decode_step_change_pct": round(step, 1) if step is not None else None,
        "concurrency": c.concurrency,
        "threshold_pct": th.tracer_slowdown_pct,
    }
    k = kern(report)
    if k and k.tracer_overhead_pct is not None:
        evidence["tracer_callbacks_pct_of_window"] = round(k.tracer_overhead_pct, 2)
    if k and k.gpu_waits is not None:  # where the recorded window's time went: the GPU waiting before device graphs
        evidence["gpu_waits_before_graphs"] = k.gpu_waits.before_graph_gaps
        evidence["gpu_waits_before_graphs_pct"] = round(k.gpu_waits.before_graph_pct, 2)
    step_text = (
        f"; the server's decode step {c.reference_decode_step_ms:.2f} → {c.traced_decode_step_ms:.2f} ms"
        if c.reference_decode_step_ms and c.traced_decode_step_ms
        else ""
    )
    return [
        Finding(
            id="tracer-overhead",
            severity="warning",
            title=f"Kernel recording slowed this server by {slowdown:.1f} % ({c.traced_tok_s:.0f} vs "
            f"{c.reference_tok_s:.0f} tok/s untraced"
            f"{step_text}): throughput, latency and step times of the recorded windows are the recorded ones",
            evidence=evidence,
            confidence=0.9,
            next_step="Kernel families, their shares and the per-kernel durations hold. Take throughput and latency "
            "from the untraced "
            "reference window (in this report's evidence) or `serve --mode utilization`; for kernels with less cost "
            "per kernel, `--mode nsys`.",
            detail="Measured on this server: an untraced window first, then the recorded one at the same concurrency. "
            "A slower decode step with little time in the recorder's callbacks is CUPTI's own tracing cost on the "
            "host: on the H200 (5.2B bf16 Llama, ~230 kernels per step, ~217 of them in device graphs) the kernels ran "
            "as fast as untraced and the step's graph was launched late in a tail of steps (decode step 2.85-2.90 ms "
            "untraced, 3.01-3.24 ms recorded; 0.04 s of callbacks per 10 s window).",
        )
    ]


def rule_tracer_overhead(report: Report, th: Thresholds) -> list[Finding]:
    if report.tracer_cost is not None and report.tracer_cost.throughput_ratio is not None:
        return _measured_tracer_cost(report, th)  # measured beats inferred
    k = kern(report)
    if not k or k.tracer_overhead_pct is None or k.tracer_overhead_pct < th.tracer_overhead_pct:
        return []
    evidence: dict[str, float | int | str | None] = {
        "tracer_callbacks_pct_of_window": round(k.tracer_overhead_pct, 1),
        "source": k.source,
        "threshold_pct": th.tracer_overhead_pct,
    }
    u = util(report)
    if u and u.gpus:
        evidence["mean_utilization_pct_while_tracing"] = round(max(g.mean_utilization_pct or 0 for g in u.gpus), 1)
    return [
        Finding(
            id="tracer-overhead",
            severity="warning",
            title="The in-process kernel tracer slowed the profiled process: utilization and host-time figures are "
            "distorted",
            evidence=evidence,
            confidence=0.8,
            next_step="Kernel families and per-kernel durations still hold. For utilization and host-bound questions "
            "re-run without the tracer (`serve --mode utilization`, `run --kernels off`); for kernels with the timing "
            "kept, `--mode nsys` (collection in C).",
            detail="The in-process tracer's buffer callbacks held the profiled process: cupti-python (the fallback "
            "when max_profile's C recorder cannot be built) turns each record into a Python object under the GIL. On "
            "the H200 a served 1.75B model streamed 896 tokens in 10 s that way, 4,736-5,120 with the C recorder and "
            "4,863-5,184 untraced.",
        )
    ]


def rule_phase_markers_missing(report: Report, th: Thresholds) -> list[Finding]:
    k = kern(report)
    if not k or k.attribution not in ("none", "totals only") or not k.kernels:
        return []
    return [
        Finding(
            id="phases-missing",
            severity="warning",
            title="The trace has no phase ranges: kernels cannot be split into prefill and decode",
            evidence={
                "kernels": k.kernels,
                "source": k.source,
                "gpu_busy_pct": round(k.gpu_busy_pct, 1) if k.gpu_busy_pct is not None else None,
            },
            confidence=0.9,
            next_step=_phase_next_step(report),
            command=for_model(report, "run", kernels="cupti")
            if report.serve is not None and report.environment.max_profiling_problem
            else None,
        )
    ]


def _phase_next_step(report: Report) -> str:
    """How to get phase ranges, consistent with what the report knows of this machine (MAX's own ranges may not work
    here)."""
    problem = report.environment.max_profiling_problem
    if problem and report.serve is not None:
        return (
            "MAX's scheduler ranges need MODULAR_ENABLE_PROFILING=on, which cannot work on this GPU image ("
            + problem
            + "). For a prefill / decode split, profile the model in-process, where max_profile marks the phases "
            "itself. Busy time and family verdicts below cover the whole capture."
        )
    if problem:
        return (
            "Capture with max-profile (it marks prefill/decode in the `max_profile` NVTX domain; "
            "MODULAR_ENABLE_PROFILING=on cannot work on this GPU image: "
            + problem
            + "). Busy time and family verdicts below cover the whole capture."
        )
    return (
        "Capture with max-profile (it marks prefill/decode in the `max_profile` NVTX domain), or set "
        "MODULAR_ENABLE_PROFILING=on so MAX's scheduler ranges (_schedule(... batch_type=CE|TG)) appear; "
        "check with `nsys stats --report nvtx_sum REPORT`. Busy time and family verdicts below cover the whole capture."
    )
