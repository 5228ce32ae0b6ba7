"""The model: plain, versioned, serializable records shared by every part of max_profile.

Two top-level records:

* :class:`RawCapture` — everything a capture recorded, before analysis. Every collector and
  importer returns one (in-process profiling, nsys, rocprofv3, Kineto JSON, nsys CSVs, ``max
  serve`` in every mode, Nsight Compute). Saved with ``.save(path)``; ``max-profile report FILE``
  re-analyses it.
* :class:`Report` — what ``max_profile.analyze.report.build_report(raw)`` makes of it: summaries,
  the kernel breakdown, findings and the next measurement. Renderers print it.

The package is split by what changes together: ``serialization`` (versions, JSON, load checks), ``capture`` (what
collectors record), ``kernels`` (the kernel table), ``report`` (what analyses make) and ``raw`` (the raw capture and its
older versions); every public name is importable from ``max_profile.model``.

Nothing here knows how a number was measured or analysed. A number that could not be measured
is never 0: it is ``None`` beside a reason, or a whole section is :class:`Unavailable`.
"""

from __future__ import annotations

from max_profile.model.capture import (
    BusyProcess,
    Capture,
    Environment,
    GpuInfo,
    HostLoad,
    LoadWindow,
    MetricPoint,
    MetricsScrape,
    ModelWeights,
    NcuLaunch,
    PhaseRange,
    PreflightCheck,
    PreflightResult,
    RequestRecord,
    ServeRun,
    StartupPhase,
    StartupProfile,
    Step,
    ToolStatus,
    Unavailable,
    UtilizationSample,
    WeightGroup,
    Workload,
    ranges_within,
)
from max_profile.model.kernels import KernelRecord, KernelTable, KernelTotal, merged_spans
from max_profile.model.raw import RawCapture, load_saved
from max_profile.model.report import (
    BatchStats,
    Command,
    DecodeCost,
    DeviceBreakdown,
    FamilyRoofline,
    FamilyRow,
    Finding,
    GpuUtilization,
    GpuWaits,
    Histogram,
    KernelAnalysis,
    KernelBreakdown,
    KernelRow,
    LatencyStats,
    LedgerRow,
    Lever,
    LoadLevel,
    PhaseBreakdown,
    PhaseLedger,
    PhaseStats,
    Report,
    ServerMetrics,
    ServeSummary,
    SkippedRule,
    StallReason,
    StepKernels,
    StepLedger,
    StepSummary,
    TracerCost,
    UtilizationSection,
    set_text_renderer,
)
from max_profile.model.serialization import (
    NON_NEGATIVE_SUFFIXES,
    READABLE_RAW_VERSIONS,
    READABLE_REPORT_VERSIONS,
    SCHEMA_VERSION,
    SIGNED_KEYS,
    Phase,
    Severity,
    Vendor,
    find_impossible_number,
)

__all__ = ['BatchStats', 'BusyProcess', 'Capture', 'Command', 'DecodeCost', 'DeviceBreakdown', 'Environment', 'FamilyRoofline', 'FamilyRow', 'Finding', 'GpuInfo', 'GpuUtilization', 'GpuWaits', 'Histogram', 'HostLoad', 'KernelAnalysis', 'KernelBreakdown', 'KernelRecord', 'KernelRow', 'KernelTable', 'KernelTotal', 'LatencyStats', 'LedgerRow', 'Lever', 'LoadLevel', 'LoadWindow', 'MetricPoint', 'MetricsScrape', 'ModelWeights', 'NON_NEGATIVE_SUFFIXES', 'NcuLaunch', 'Phase', 'PhaseBreakdown', 'PhaseLedger', 'PhaseRange', 'PhaseStats', 'PreflightCheck', 'PreflightResult', 'READABLE_RAW_VERSIONS', 'READABLE_REPORT_VERSIONS', 'RawCapture', 'Report', 'RequestRecord', 'SCHEMA_VERSION', 'SIGNED_KEYS', 'ServeRun', 'ServeSummary', 'ServerMetrics', 'Severity', 'SkippedRule', 'StallReason', 'StartupPhase', 'StartupProfile', 'Step', 'StepKernels', 'StepLedger', 'StepSummary', 'ToolStatus', 'TracerCost', 'Unavailable', 'UtilizationSample', 'UtilizationSection', 'Vendor', 'WeightGroup', 'Workload', 'find_impossible_number', 'load_saved', 'merged_spans', 'ranges_within', 'set_text_renderer']
