"""The raw capture: everything a capture recorded, before analysis, with its loading of older versions."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from max_profile.errors import TraceFormatError
from max_profile.model.capture import (
    Capture,
    Environment,
    LoadWindow,
    NcuLaunch,
    PassAgreement,
    PhaseRange,
    PreflightResult,
    RequestRecord,
    ServerRequest,
    ServeRun,
    StartupProfile,
    Step,
    Unavailable,
    UtilizationSample,
)
from max_profile.model.kernels import KernelRecord, KernelTable, KernelTotal
from max_profile.model.serialization import READABLE_RAW_VERSIONS, SCHEMA_VERSION, _decode_doc, _encode, _validated
from max_profile.util.files import read_input, write_output


class RawCapture(msgspec.Struct):
    """Everything a capture recorded, before analysis: what every collector returns and reports are rebuilt from."""

    environment: Environment
    capture: Capture
    steps: list[Step] = []
    """Host steps from the pipeline hook (host clock)."""
    kernels: KernelTable = msgspec.field(default_factory=KernelTable.empty)
    kernel_clock: Literal["host", "trace"] = "host"
    """``host``: kernel times are host ``perf_counter_ns`` (in-process CUPTI, NVTX log, the serve worker),
    comparable with steps, samples and the window. ``trace``: the trace's own clock (nsys, rocprofv3,
    Kineto imports); only its ranges share it."""
    op_ranges: KernelTable = msgspec.field(default_factory=KernelTable.empty)
    """MAX's op ranges recorded beside the kernels (``--kernels ops``): innermost ranges, host clock, ``launch_tid`` the
    host thread (Linux tid); joined to the kernels they launched by the analysis."""
    kernel_totals: list[KernelTotal] = []
    """Summary-only sources (no timeline): totals per kernel name."""
    ranges: list[PhaseRange] = []
    """Phase ranges of ours and MAX's scheduler ranges, on the kernels' clock."""
    range_names: dict[str, int] = {}
    """Every range name the trace holds, counted (evidence when no phase range is among them)."""
    samples: list[UtilizationSample] = []
    sample_interval_s: float = 0.1
    sample_source: str = "max.profiler.gpu.BackgroundRecorder (sample times interpolated)"
    window_ns: tuple[int, int] | None = None
    """The capture window on the host clock (serve: the load window); None: the steps' span."""
    trace_window_ns: tuple[int, int] | None = None
    """The capture window on the trace's clock when kernels are on it (a Kineto trace: all its events);
    None: from the first launch to the last kernel end."""
    recorded_spans: list[tuple[int, int]] = []
    """Where kernels were recorded only in slices of the window (``serve --mode kernels`` samples, paused in between):
    those slices on the host clock. Empty: the whole window was recorded."""
    utilization_unavailable: Unavailable | None = None
    """Why no GPU utilization was sampled (None: sampled, or not asked for)."""
    kernels_unavailable: Unavailable | None = None
    """Why no kernel was recorded although kernels were asked for."""
    kernel_source: str | None = None
    graph_launches: int = 0
    tracer_callback_s: float | None = None
    """Seconds the in-process kernel tracer spent in its buffer callbacks while recording."""
    requests: list[RequestRecord] = []
    server_requests: list[ServerRequest] = []
    """The requests as the server's own spans tell them (OTLP: ``attach --otlp``, ``serve``, an imported span file)."""
    pass_agreement: PassAgreement | None = None
    """Where the worker hook and MAX's spans both timed the passes (``serve`` in a kernel mode): how they agree."""
    serve: ServeRun | None = None
    startup: StartupProfile | None = None
    """How the capture's process (or the served model) started: phases to the first token, compile-cache state."""
    load_windows: list[LoadWindow] = []
    """The load windows of a serve / attach capture (one, or one per concurrency level of a sweep)."""
    slo_ms: dict[str, float] = {}
    """Service-level objectives for goodput: ``ttft`` and / or ``itl`` in ms."""
    ncu_launches: list[NcuLaunch] = []
    preflight: list[PreflightResult] = []
    artifacts: list[str] = []
    notes: list[str] = []
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if isinstance(self.kernels, list):  # convenience: a list of KernelRecord
            self.kernels = KernelTable.from_records(self.kernels)

    def to_json(self) -> bytes:
        return _encode(self)

    def save(self, path: str) -> None:
        """JSON (gzip when the name ends in .gz); written whole or not at all."""
        write_output(path, self.to_json())

    @classmethod
    def from_json(cls, data: bytes, path: str = "<raw capture>", doc: dict[str, Any] | None = None) -> RawCapture:
        """``doc``: the same bytes already decoded to a dict (checked once, not again)."""
        doc = _decode_doc(data, path) if doc is None else doc
        version = doc.get("schema_version")
        if version not in READABLE_RAW_VERSIONS:
            raise TraceFormatError(
                f"{path}: raw capture schema version {version!r} is not supported "
                f"(this max_profile reads {', '.join(map(str, READABLE_RAW_VERSIONS))})"
            )
        if "capture" not in doc or "environment" not in doc:
            raise TraceFormatError(f"{path}: not a max_profile raw capture (no capture / environment)")
        if "findings" in doc:
            raise TraceFormatError(f"{path}: this is an analysed report, not a raw capture: load it with Report.load")
        if version == 1:
            return _validated(data, _RawCaptureV1, path).upgrade()  # type: ignore[no-any-return]
        if version == 2:
            return _upgrade_v2(data, doc, path)
        return _validated(data, cls, path)  # type: ignore[no-any-return]

    @classmethod
    def load(cls, path: str) -> RawCapture:
        """Read a saved raw capture (``.json`` or ``.json.gz``), checking its schema version."""
        return cls.from_json(read_input(path), path)


_UNAVAILABLE_FIELDS = ("utilization_unavailable", "kernels_unavailable")


def _upgrade_v2(data: bytes, doc: dict[str, Any], path: str) -> RawCapture:
    """Schema version 2 held what was not measured as a plain string: as :class:`Unavailable` now."""
    said = {k: doc[k] for k in _UNAVAILABLE_FIELDS if isinstance(doc.get(k), str)}
    if said:
        data = msgspec.json.encode({**doc, **{k: {"type": "unavailable", "reason": v} for k, v in said.items()}})
    raw: RawCapture = _validated(data, RawCapture, path)
    raw.schema_version = SCHEMA_VERSION
    return raw


class _RawCaptureV1(msgspec.Struct):
    """Schema version 1: kernels as a list of array-like records (version 2 keeps them as columns), the tracer's cost as
    a % of the window (version 2 keeps the seconds in its callbacks)."""

    environment: Environment
    capture: Capture
    steps: list[Step] = []
    kernels: list[KernelRecord] = []
    ranges: list[PhaseRange] = []
    samples: list[UtilizationSample] = []
    sample_interval_s: float = 0.1
    utilization_unavailable: str | None = None
    kernels_unavailable: str | None = None
    kernel_source: str | None = None
    graph_launches: int = 0
    notes: list[str] = []
    tracer_overhead_pct: float | None = None
    schema_version: int = 1

    def upgrade(self) -> RawCapture:
        callback_s = None
        work = [s for s in self.steps if s.batch_size > 0] or self.steps
        if self.tracer_overhead_pct is not None and work:
            callback_s = (
                self.tracer_overhead_pct / 100.0 * (max(s.end_ns for s in work) - min(s.start_ns for s in work)) / 1e9
            )
        return RawCapture(
            environment=self.environment,
            capture=self.capture,
            steps=self.steps,
            kernels=KernelTable.from_records(self.kernels),
            ranges=self.ranges,
            samples=self.samples,
            sample_interval_s=self.sample_interval_s,
            utilization_unavailable=Unavailable(self.utilization_unavailable)
            if self.utilization_unavailable is not None
            else None,
            kernels_unavailable=Unavailable(self.kernels_unavailable) if self.kernels_unavailable is not None else None,
            kernel_source=self.kernel_source,
            graph_launches=self.graph_launches,
            notes=list(self.notes),
            tracer_callback_s=callback_s,
        )
