"""max_profile: a profiler for models run with Modular's MAX.

    from max_profile import profile
    with profile(model.pipeline, kernels="auto") as prof:
        ...generate...
    print(prof.report)

Questions, cheapest first: is the GPU used (utilization), where does the time go (kernels by
family and phase), why is one kernel slow (Nsight Compute). See ``max-profile --help``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from max_profile.model import (  # noqa: E402
    SCHEMA_VERSION,
    Capture,
    Environment,
    Finding,
    KernelAnalysis,
    KernelBreakdown,
    KernelRecord,
    Report,
    Step,
    Unavailable,
    UtilizationSample,
)


def __getattr__(name: str) -> object:
    # Heavy imports (MAX, numpy analysis) only when the API is used.
    if name in ("profile", "ProfileSession"):
        from max_profile import session

        return getattr(session, name)
    if name == "check_architecture":
        from max_profile.preflight import check_architecture

        return check_architecture
    raise AttributeError(name)


__all__ = [
    "SCHEMA_VERSION",
    "Capture",
    "Environment",
    "Finding",
    "KernelAnalysis",
    "KernelBreakdown",
    "KernelRecord",
    "ProfileSession",
    "Report",
    "Step",
    "Unavailable",
    "UtilizationSample",
    "check_architecture",
    "profile",
]
