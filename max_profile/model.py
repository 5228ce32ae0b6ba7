"""The report model: plain, versioned, serializable records shared by every part of max_profile.

Collectors produce these records, analysis functions read them and return new ones, renderers
print them. Nothing here knows how a number was measured; each record says where it came from.

A number that could not be measured is never 0: it is ``None`` beside a ``*_unavailable``
reason, or a whole section is replaced by :class:`Unavailable` with the reason.
"""

from __future__ import annotations

from typing import Literal

import msgspec

SCHEMA_VERSION = 1
"""Bumped whenever a field changes meaning or is removed (adding optional fields keeps it)."""

Phase = Literal["prefill", "decode", "mixed", "unknown"]
Severity = Literal["info", "warning", "error"]
Vendor = Literal["nvidia", "amd", "none"]


def _enc_hook(obj: object) -> object:
    """numpy scalars (from analysis) encode as plain numbers."""
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


class Unavailable(msgspec.Struct, frozen=True, tag="unavailable"):
    """A measurement that could not be taken, and why (no GPU, tool missing, graphs hid kernels...)."""

    reason: str


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------


class ToolStatus(msgspec.Struct, frozen=True):
    """One external profiler (nsys, ncu, rocprofv3): where it is, its version, what is wrong."""

    name: str
    path: str | None = None
    version: str | None = None
    problem: str | None = None
    install_hint: str | None = None

    @property
    def usable(self) -> bool:
        return self.path is not None and self.problem is None


class GpuInfo(msgspec.Struct, frozen=True):
    """A GPU as the management library (NVML / amdsmi) reports it."""

    key: str
    """MAX's key for the GPU: ``nv0``, ``nv1``, ``amd0`` ..."""
    name: str | None = None
    memory_total_bytes: int | None = None
    max_sm_clock_mhz: int | None = None


class Environment(msgspec.Struct, frozen=True):
    """What the profiler found before choosing a tool (the algorithm's step 1)."""

    vendor: Vendor
    vendor_reason: str
    gpus: list[GpuInfo] = []
    driver_version: str | None = None
    max_version: str | None = None
    python_version: str = ""
    platform: str = ""
    modular_enable_profiling: str | None = None
    tools: list[ToolStatus] = []
    warnings: list[str] = []


# --------------------------------------------------------------------------------------------
# Capture metadata and host steps
# --------------------------------------------------------------------------------------------


class Capture(msgspec.Struct):
    """How the data in a report was captured."""

    started_unix_s: float
    ended_unix_s: float | None = None
    target: str = ""
    """What was profiled: the pipeline class, a command line, or an imported file."""
    model_path: str | None = None
    devices: str | None = None
    device_graph_capture: bool | None = None
    profiling_mode: str | None = None
    """``MODULAR_ENABLE_PROFILING`` (off / on / detailed) in force for the capture."""
    collectors: list[str] = []
    phase_markers: str | None = None
    """How phases were marked: ``nvtx:<domain>``, ``roctx``, ``host-only`` or None."""
    model_config: dict[str, object] | None = None
    """Selected fields of the model's config.json (hidden size, layers, heads, dtype...)."""


class Step(msgspec.Struct, frozen=True):
    """One call of the pipeline's ``execute``: a prefill, decode or mixed batch.

    Times are host ``time.perf_counter_ns()`` values; ``duration_ns`` is wall time of the call.
    For MAX's overlap pipeline (the GPU default) a step returns the tokens of the step
    before it, so host time of step N overlaps device work of step N+1.
    """

    index: int
    phase: Phase
    batch_size: int
    input_tokens: int
    context_tokens: int | None
    start_ns: int
    end_ns: int
    output_tokens: int = 0

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def sequence_tokens(self) -> int | None:
        """Tokens of the batch's sequences after this step: cached context plus the tokens fed.

        Equal to ``context_tokens + 1`` per request in a healthy decode; an architecture that
        re-feeds the whole sequence shows ``context_tokens`` 0 and large ``input_tokens``.
        """
        return None if self.context_tokens is None else self.context_tokens + self.input_tokens


class PhaseStats(msgspec.Struct, frozen=True):
    """Step-time statistics of one phase (milliseconds)."""

    phase: Phase
    steps: int
    total_ms: float
    p50_ms: float
    p90_ms: float
    max_ms: float
    tokens: int
    """Input tokens for prefill, output tokens for decode."""


class StepSummary(msgspec.Struct, frozen=True, tag=True):
    """What the host saw: time to first token, per-phase step times, decode throughput."""

    steps: int
    ttft_ms: float | None
    phases: list[PhaseStats]
    decode_tokens_per_s: float | None
    decode_step_growth_ms_per_100_ctx: float | None = None
    """Slope of decode step time against sequence length (ms per 100 tokens of context)."""


# --------------------------------------------------------------------------------------------
# GPU utilization
# --------------------------------------------------------------------------------------------


class UtilizationSample(msgspec.Struct, frozen=True):
    """One reading of one GPU (``max.profiler.gpu`` / NVML / ROCm SMI)."""

    t_ns: int
    """Host ``perf_counter_ns()`` at (or interpolated to) the reading."""
    gpu: str
    utilization_pct: float | None
    """NVML "GPU utilization": % of time *some* kernel ran (not how much of the GPU it used)."""
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    throttle_reasons: list[str] = []
    sm_activity_pct: float | None = None
    """NVML GPM SM activity (Hopper+): share of SM cycles with a warp resident."""


class GpuUtilization(msgspec.Struct, frozen=True):
    """Summary of one GPU's samples over the steps' window."""

    gpu: str
    samples: int
    peak_utilization_pct: float | None
    mean_utilization_pct: float | None
    peak_memory_bytes: int | None
    memory_total_bytes: int | None
    peak_memory_pct: float | None
    mean_sm_clock_mhz: float | None
    max_sm_clock_mhz: int | None
    hardware_throttle_reasons: list[str]
    """Throttle reasons seen in the window that are hardware limits (power, thermal...)."""
    mean_sm_activity_pct: float | None = None


class UtilizationSection(msgspec.Struct, frozen=True, tag=True):
    source: str
    interval_s: float
    gpus: list[GpuUtilization]
    samples: list[UtilizationSample]
    window_ns: tuple[int, int] | None = None


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


class KernelRecord(msgspec.Struct, frozen=True, array_like=True):
    """One kernel execution on a GPU, as any tracer reports it (CUPTI, nsys, rocprofv3...)."""

    name: str
    start_ns: int
    end_ns: int
    device: int = 0
    stream: int = 0
    correlation_id: int = 0
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    registers: int | None = None
    graph_id: int | None = None
    launch_tid: int | None = None
    launch_ns: int | None = None
    """Start of the launching API call (same clock as start_ns), when known."""


class PhaseRange(msgspec.Struct, frozen=True, array_like=True):
    """A marked interval (an NVTX / roctx range of ours, or MAX's scheduler range)."""

    name: str
    start_ns: int
    end_ns: int
    tid: int | None = None
    domain: str | None = None


class FamilyRow(msgspec.Struct, frozen=True):
    family: str
    kernels: int
    total_ms: float
    share_pct: float
    """Share of kernel time in the same scope (overall or the phase)."""


class KernelRow(msgspec.Struct, frozen=True):
    name: str
    family: str
    count: int
    total_ms: float
    mean_us: float
    share_pct: float


class PhaseBreakdown(msgspec.Struct, frozen=True):
    phase: Phase
    steps: int
    kernels: int
    kernel_ms: float
    wall_ms: float | None
    gpu_busy_pct: float | None
    """Union of kernel intervals over the phase's wall time."""
    kernels_per_step: float | None
    kernel_ms_per_step: float | None
    kernel_us_per_token: float | None
    families: list[FamilyRow]
    top_kernels: list[KernelRow]


class DeviceBreakdown(msgspec.Struct, frozen=True):
    """One GPU's share of the kernels (multi-GPU runs: tensor / expert parallel)."""

    device: int
    kernels: int
    kernel_ms: float
    gpu_busy_pct: float | None
    """Union of this device's kernel intervals over the profiled steps' wall time."""
    collective_ms_per_decode_step: float | None
    collective_share_of_decode_pct: float | None
    families: list[FamilyRow]


class KernelBreakdown(msgspec.Struct, frozen=True, tag=True):
    """Where the GPU time went: families and kernels, overall and per phase."""

    source: str
    kernels: int
    kernel_ms: float
    attribution: str
    """How kernels were tied to phases: ``launch-thread``, ``time-overlap``, ``host-steps`` or ``none``."""
    families: list[FamilyRow]
    top_kernels: list[KernelRow]
    phases: list[PhaseBreakdown]
    unknown_kernel_names: list[str] = []
    devices: list[int] = []
    unreliable: str | None = None
    """Why per-kernel numbers cannot be trusted (device graphs hid kernels...), else None."""
    per_step_families: list[dict[str, float]] = []
    """Decode steps in order: family -> ms, for spotting a prefill-like mix repeated every step."""
    per_device: list[DeviceBreakdown] = []
    """Filled when kernels ran on more than one device."""
    tracer_overhead_pct: float | None = None
    """Share of the capture window the in-process kernel tracer spent in its buffer callbacks (CUPTI
    records turned into Python objects, holding the profiled process's GIL); None when the trace was
    collected outside the process (nsys, rocprofv3, imports)."""


class StallReason(msgspec.Struct, frozen=True):
    reason: str
    cycles_per_instruction: float
    meaning: str


class KernelAnalysis(msgspec.Struct, frozen=True):
    """Nsight Compute metrics of one profiled launch (``ncu --set basic|full``)."""

    kernel_name: str
    launch_id: int
    duration_ns: float | None = None
    compute_throughput_pct: float | None = None
    memory_throughput_pct: float | None = None
    dram_throughput_pct: float | None = None
    dram_bytes_per_s: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    occupancy_limiter: str | None = None
    registers_per_thread: float | None = None
    block_size: str | None = None
    grid_size: str | None = None
    stalls: list[StallReason] = []
    achieved_flop_per_s: float | None = None
    arithmetic_intensity: float | None = None
    bound: str | None = None
    """``memory``, ``compute``, ``latency`` or ``balanced``, from the Speed Of Light section."""
    ncu_rules: list[str] = []
    metrics: dict[str, float] = {}
    device: str | None = None


# --------------------------------------------------------------------------------------------
# Findings and the report
# --------------------------------------------------------------------------------------------


class Finding(msgspec.Struct, frozen=True):
    """A verdict with the evidence it rests on and what to do next."""

    id: str
    severity: Severity
    title: str
    evidence: dict[str, float | int | str | None]
    confidence: float
    next_step: str | None = None
    detail: str | None = None


class PreflightCheck(msgspec.Struct, frozen=True):
    id: str
    ok: bool
    severity: Severity
    message: str
    fix: str | None = None
    where: str | None = None


class PreflightResult(msgspec.Struct, frozen=True):
    spec: str
    max_version: str | None
    checks: list[PreflightCheck]
    architectures: list[str] = []
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(c.severity == "error" and not c.ok for c in self.checks)


class ServeSummary(msgspec.Struct, frozen=True):
    """What a `max-profile serve` capture measured from the client side, and how the server ran."""

    mode: str
    port: int
    window_s: float
    requests: int
    failed_requests: int
    output_tokens: int
    ttft_ms_p50: float | None
    ttft_ms_p90: float | None
    itl_ms_p50: float | None
    itl_ms_p90: float | None
    tokens_per_s: float | None
    time_to_ready_s: float | None
    commands: list[list[str]] = []
    server_log: str | None = None


class Report(msgspec.Struct):
    """Everything one profiling run produced. ``schema_version`` guards readers."""

    environment: Environment
    capture: Capture
    steps: list[Step] = []
    step_summary: StepSummary | Unavailable | None = None
    utilization: UtilizationSection | Unavailable | None = None
    kernels: KernelBreakdown | Unavailable | None = None
    kernel_analyses: list[KernelAnalysis] = []
    findings: list[Finding] = []
    preflight: list[PreflightResult] = []
    serve: ServeSummary | None = None
    next_measurement: str | None = None
    """The next, costlier measurement the escalation plan proposes (exact command), if any."""
    artifacts: list[str] = []
    schema_version: int = SCHEMA_VERSION
    tool_version: str = ""

    def to_json(self) -> bytes:
        return msgspec.json.encode(self, enc_hook=_enc_hook)

    @classmethod
    def from_json(cls, data: bytes | str) -> Report:
        raw = msgspec.json.decode(data)
        version = raw.get("schema_version") if isinstance(raw, dict) else None
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"report schema version {version!r} is not supported (this max_profile reads {SCHEMA_VERSION})"
            )
        return msgspec.json.decode(data, type=cls)

    def save(self, path: str) -> None:
        with open(path, "wb") as fh:
            fh.write(msgspec.json.format(self.to_json(), indent=2))

    @classmethod
    def load(cls, path: str) -> Report:
        with open(path, "rb") as fh:
            return cls.from_json(fh.read())

    def __str__(self) -> str:
        from max_profile.render.text import render_text

        return render_text(self)


class RawCapture(msgspec.Struct):
    """Everything a capture recorded, before analysis: what fixtures store and reports are rebuilt from."""

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
    """CUPTI buffer-callback time while recording, as % of the steps' wall time (in-process tracer)."""
    schema_version: int = SCHEMA_VERSION

    def save(self, path: str) -> None:
        data = msgspec.json.encode(self, enc_hook=_enc_hook)
        if path.endswith(".gz"):
            import gzip

            with gzip.open(path, "wb", compresslevel=9) as fh:
                fh.write(data)
        else:
            with open(path, "wb") as fh:
                fh.write(data)

    @classmethod
    def load(cls, path: str) -> RawCapture:
        if path.endswith(".gz"):
            import gzip

            with gzip.open(path, "rb") as fh:
                data = fh.read()
        else:
            with open(path, "rb") as fh:
                data = fh.read()
        return msgspec.json.decode(data, type=cls)
