"""Import a trace another profiler wrote and read the findings in Python.

    python examples/import_trace.py [TRACE]

TRACE is an nsys export (``nsys export --type sqlite``, .sqlite or .sqlite.gz) or an .nsys-rep (nsys is
then run to export it), ``nsys stats`` CSVs, a rocprofv3 kernel-trace CSV or rocpd database, a
Kineto / Chrome JSON trace (PyTorch profiler, ``max generate --profile``), an ncu CSV, or a saved
max_profile raw capture. Every one becomes the same RawCapture, analysed by the same
``build_report``. Without TRACE, the bundled nsys export of a MAX 26.7 run on an H200 is used.
"""

from __future__ import annotations

import sys
from pathlib import Path

import max_profile
from max_profile.model import KernelBreakdown, RawCapture, Report
from max_profile.render.terminal import fit_to_terminal

default = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "data"
    / "gpu"
    / "h200_llama180m_host_bound"
    / "small_nsys.sqlite.gz"
)
path = sys.argv[1] if len(sys.argv) > 1 else str(default)

try:
    loaded = max_profile.load(path)  # detects the format from the content, not the name
except max_profile.MaxProfileError as exc:  # damaged, truncated or unknown files: one clear reason
    sys.exit(f"cannot read {path}: {exc}")


report = loaded if isinstance(loaded, Report) else max_profile.build_report(loaded)
if isinstance(loaded, RawCapture) and len(loaded.kernels):
    print(
        fit_to_terminal(
            f"{path}: {len(loaded.kernels):,} kernels from {loaded.kernel_source}, {len(loaded.ranges)} ranges"
        )
    )

kernels = report.kernels
if isinstance(kernels, KernelBreakdown):
    print(
        fit_to_terminal(
            f"GPU busy {kernels.gpu_busy_pct:.1f} % of the window; steps from {kernels.step_source}; attribution by "
            f"{kernels.attribution}"
        )
    )
    for phase in kernels.phases:
        top = ", ".join(f"{r.family} {r.share_pct:.0f}%" for r in phase.families[:4])
        print(
            fit_to_terminal(
                f"  {phase.phase:8s} {phase.steps:4d} steps, {phase.kernels_per_step or 0:.0f} kernels/step, "
                f"{phase.kernel_ms_per_step or 0:.3f} ms/step: {top}"
            )
        )
for finding in report.findings:
    evidence = ", ".join(f"{k}={v}" for k, v in list(finding.evidence.items())[:3])
    print(
        fit_to_terminal(f"[{finding.severity}] {finding.id} ({finding.confidence:.0%}): {finding.title}  [{evidence}]")
    )
if report.next_measurement:
    print(fit_to_terminal(f"next: {report.next_measurement}"))
