"""Escalation planning: the next, costlier measurement — or none, when the question is answered.

1. A correctness bug (a broken KV cache), a start-up or kernel-level capture: nothing further here.
2. The in-process tracer distorted the timing (tracer-overhead): utilization again without it.
3. Host-bound: stop — a kernel trace adds nothing until the GPU is busy (the finding names the host profile to take).
4. No kernel breakdown yet: the breakdown (CUPTI in-process / nsys / rocprofv3; MAX's op ranges on a CPU).
5. The top-ranked finding that names a measurement (the biggest lever's deep dive, reproducing the capture).
6. A healthy breakdown with nothing at warning size: stop. A dominant suspicious kernel: one Nsight Compute run.
"""

from __future__ import annotations

from max_profile.analyze.commands import for_model, kernel_command, say, shell
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Command, KernelBreakdown, Report

_HEALTHY_IDS = {"healthy-dense-decode", "healthy-moe", "healthy-batched-decode"}


def next_measurement(report: Report, th: Thresholds | None = None) -> str | None:
    """The next measurement in the report's interface (a ``max-profile`` command line, or the Python call)."""
    cmd = next_command(report, th)
    return say(cmd, report.capture.interface) if cmd is not None else None


def no_next_reason(report: Report) -> str:
    """Why no next measurement is proposed: the question answered, or what was asked for and not measured (never "answered"
    for a section the capture could not fill)."""
    from max_profile.model import Unavailable

    missing = [f"{what}: {value.reason}" for what, value in (("kernels", report.kernels), ("utilization", report.utilization))
               if isinstance(value, Unavailable) and value.reason]
    ids = {f.id for f in report.findings}
    if "kv-cache-broken" in ids:
        return "none until the KV-cache bug is fixed (a correctness bug: speed figures wait for it)"
    if "host-bound" in ids:
        return "none: the GPU is not the bottleneck, a kernel trace adds nothing until it is busy (see the host profile above)"
    if missing:
        return "none here, but not everything asked for was measured: " + "; ".join(missing)
    return "none — the question is answered at this level"


def next_command(report: Report, th: Thresholds | None = None) -> Command | None:
    """The next, costlier measurement as a :class:`Command` (None when the question is answered)."""
    suspicious_pct = (th or Thresholds()).plan_suspicious_share_pct
    ids = {f.id for f in report.findings}
    if report.kernel_analyses or report.capture.target == "startup" or "kv-cache-broken" in ids:
        return None
    if "tracer-overhead" in ids:
        # the timing figures were distorted by the in-process tracer: measure utilization without it first
        if report.serve is not None:
            return for_model(report, "serve", mode="utilization", comment="then --mode nsys for kernels with timing kept")
        return for_model(report, "run", kernels="off")
    if "lightly-loaded" in ids:
        return next((f.command for f in report.findings if f.id == "lightly-loaded" and f.command is not None), None)
    if "host-bound" in ids:
        return None
    if report.environment.vendor == "none":
        if report.kernels is None:
            return for_model(report, "run", kernels="nvtx-log", comment="MAX's op ranges on the CPU")
        named = next((f.command for f in report.findings if f.command is not None and f.command.verb == "shell"), None)
        return named
    if not isinstance(report.kernels, KernelBreakdown):
        if report.serve is not None:
            mode = "nsys" if report.environment.vendor == "nvidia" else "rocprof" if report.environment.vendor == "amd" else "kernels"
            return for_model(report, "serve", mode=mode, comment="the kernels of the served model (--mode kernels: in-process recorder)")
        if report.environment.vendor == "amd":
            from max_profile.analyze.commands import cli

            return shell(f"rocprofv3 --kernel-trace --marker-trace --output-format csv -d rocprof-out -- {cli(for_model(report, 'run', kernels='off'))}"
                         "  &&  max-profile kernels --import rocprof-out/<host>/<pid>_kernel_trace.csv")
        return for_model(report, "kernels", backend="cupti")
    k = report.kernels
    if k.unreliable:
        return for_model(report, "kernels", backend="cupti", comment="the recorder records each kernel inside device graphs; or re-run with --no-device-graph-capture")
    warned = [f for f in report.findings if f.severity != "info" and f.command is not None]
    if warned:
        return warned[0].command  # the biggest lever's (findings are ranked)
    if ids & _HEALTHY_IDS:
        return None
    if report.environment.vendor != "nvidia":
        return None  # Nsight Compute is NVIDIA-only
    decode = next((p for p in k.phases if p.phase == "decode"), None)
    rows = decode.top_kernels if decode else k.top_kernels
    for row in rows[:3]:
        if row.share_pct >= suspicious_pct and row.family not in ("gemv", "gemm"):
            return kernel_command(report, row.name, "decode" if decode else None)
    return None
