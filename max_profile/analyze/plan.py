"""Escalation planning: the next, costlier measurement — or none, when the question is answered.

1. Utilization first: host-bound → stop (a kernel trace adds nothing until the GPU is busy); when an
   in-process tracer distorted the timing (tracer-overhead), utilization again without it.
2. GPU busy, no kernel breakdown yet → the breakdown (CUPTI in-process / nsys / rocprofv3).
3. Breakdown healthy → stop. A dominant suspicious kernel → one targeted Nsight Compute run.
"""

from __future__ import annotations

import shlex

from max_profile.analyze.families import distinctive_regex
from max_profile.model import KernelBreakdown, Report

SUSPICIOUS_SHARE_PCT = 25.0
"""A non-matmul kernel above this share of decode kernel time is worth one ncu deep dive."""

_HEALTHY_IDS = {"healthy-dense-decode", "healthy-moe"}


def _model_args(report: Report) -> str:
    c = report.capture
    parts = ["--model-path", c.model_path or "MODEL_PATH"]
    if c.devices:
        parts += ["--devices", c.devices]
    return " ".join(shlex.quote(p) for p in parts)


def next_measurement(report: Report) -> str | None:
    ids = {f.id for f in report.findings}
    if report.kernel_analyses:
        return None  # the deepest level: the kernel's own counters are in hand
    if "kv-cache-broken" in ids:
        return None  # a correctness bug: fix it before measuring speed
    if "tracer-overhead" in ids:
        # the timing figures were distorted by the in-process tracer: measure utilization without it first
        if report.serve is not None:
            return f"max-profile serve {_model_args(report)} --mode utilization   # then --mode nsys for kernels with timing kept"
        return f"max-profile run {_model_args(report)} --kernels off"
    if "host-bound" in ids:
        return None
    if report.environment.vendor == "none":
        if report.kernels is None:
            return f"max-profile run {_model_args(report)} --kernels nvtx-log   # MAX's op ranges on the CPU"
        return None
    if not isinstance(report.kernels, KernelBreakdown):
        if report.serve is not None:
            mode = "nsys" if report.environment.vendor == "nvidia" else "rocprof" if report.environment.vendor == "amd" else "kernels"
            return f"max-profile serve {_model_args(report)} --mode {mode}   # the kernels of the served model (--mode kernels: in-process recorder)"
        if report.environment.vendor == "amd":
            return (f"rocprofv3 --kernel-trace --marker-trace --output-format csv -d rocprof-out -- max-profile run {_model_args(report)} --kernels off"
                    "  &&  max-profile kernels --import rocprof-out/<host>/<pid>_kernel_trace.csv")
        return f"max-profile kernels {_model_args(report)} --backend cupti"
    k = report.kernels
    if k.unreliable:
        return (f"max-profile kernels {_model_args(report)} --backend cupti   "
                "# the recorder records each kernel inside device graphs; or re-run with --no-device-graph-capture")
    if ids & _HEALTHY_IDS and not any(f.severity != "info" for f in report.findings):
        return None
    if report.environment.vendor != "nvidia":
        return None  # Nsight Compute is NVIDIA-only
    decode = next((p for p in k.phases if p.phase == "decode"), None)
    rows = decode.top_kernels if decode else k.top_kernels
    for row in rows[:3]:
        if row.share_pct >= SUSPICIOUS_SHARE_PCT and (row.family not in ("gemv", "gemm") or "decode-bandwidth-low" in ids):
            return f"max-profile kernel {shlex.quote(distinctive_regex(row.name))} {_model_args(report)} --launches 3 --set full"
    return None
