"""max_profile: a profiler for models run with Modular's MAX.

    from max_profile import profile
    with profile(model.pipeline, kernels="auto") as prof:
        ...generate...
    print(prof.report)

    profiler = Profiler(model.pipeline)       # a long-running app: nothing installed until used
    raw = profiler.capture(steps=64)           # from another thread while the app generates

Questions, cheapest first: is the GPU used (utilization), where does the time go (kernels by
family and phase), why is one kernel slow (Nsight Compute). See ``max-profile --help``.

Every capture is a :class:`RawCapture`; :func:`build_report` turns one into a :class:`Report`;
:func:`load` reads a saved capture, report, or any supported trace file.
"""

from __future__ import annotations

import time as _time

IMPORTED_AT = _time.time()
"""When this package was first imported (wall clock, taken before anything else loads): the ``max-profile`` command's
own start, give or take the interpreter's few tens of ms before its first import (see
``collect.probes.startup.process_start``)."""

from typing import TYPE_CHECKING

from max_profile.errors import CaptureError, InputError, MaxProfileError, ToolMissingError, TraceFormatError
from max_profile.version import __version__  # noqa: F401

if TYPE_CHECKING:  # the names for type checkers; at run time each loads on first use (PEP 562)
    from max_profile.model import (
        SCHEMA_VERSION,
        Capture,
        Environment,
        Finding,
        KernelAnalysis,
        KernelBreakdown,
        KernelRecord,
        KernelTable,
        RawCapture,
        Report,
        Step,
        Unavailable,
        UtilizationSample,
    )
    from max_profile.render.text import render_text

_MODEL_NAMES = frozenset(
    {
        "SCHEMA_VERSION",
        "Capture",
        "Environment",
        "Finding",
        "KernelAnalysis",
        "KernelBreakdown",
        "KernelRecord",
        "KernelTable",
        "RawCapture",
        "Report",
        "Step",
        "Unavailable",
        "UtilizationSample",
    }
)


def __getattr__(name: str) -> object:
    # Every import but the errors' only when the API is used: `max-profile --help` and `import max_profile` stay light.
    if name in _MODEL_NAMES:
        from max_profile import model

        return getattr(model, name)
    if name == "render_text":
        from max_profile.render.text import render_text

        return render_text
    if name in ("profile", "ProfileSession", "Profiler", "capture", "restart_with_op_ranges"):
        from max_profile import session  # lazy: `import max_profile` stays light

        return getattr(session, name)
    if name == "check_architecture":
        from max_profile.preflight import check_architecture  # lazy: `import max_profile` stays light

        return check_architecture
    if name == "build_report":
        from max_profile.analyze.report import build_report  # lazy: `import max_profile` stays light

        return build_report
    if name == "load":
        from max_profile.collect.readers.sources import load_any  # lazy: `import max_profile` stays light

        return load_any
    raise AttributeError(name)


__all__ = [
    "SCHEMA_VERSION",
    "restart_with_op_ranges",
    "Capture",
    "CaptureError",
    "Environment",
    "Finding",
    "InputError",
    "KernelAnalysis",
    "KernelBreakdown",
    "KernelRecord",
    "KernelTable",
    "MaxProfileError",
    "ProfileSession",
    "Profiler",
    "RawCapture",
    "Report",
    "Step",
    "ToolMissingError",
    "TraceFormatError",
    "Unavailable",
    "UtilizationSample",
    "build_report",
    "capture",
    "check_architecture",
    "load",
    "profile",
    "render_text",
]
