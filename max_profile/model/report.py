"""What an analysis makes of a capture: summaries, the kernel breakdown, the step ledger, findings, the report
itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

from max_profile.errors import TraceFormatError
from max_profile.model.capture import (
    Capture,
    Environment,
    PreflightResult,
    StartupProfile,
    Step,
    Unavailable,
    UtilizationSample,
)
from max_profile.model.serialization import (
    READABLE_REPORT_VERSIONS,
    SCHEMA_VERSION,
    Phase,
    Severity,
    _decode_doc,
    _encode,
    _validated,
)
from max_profile.model.tags import LedgerSource, StepSource
from max_profile.util.files import read_input, write_output


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


class BatchStats(msgspec.Struct, frozen=True):
    """Step times of one phase at one batch size (a server runs many batch sizes; a generation one)."""

    phase: Phase
    batch_size: int
    steps: int
    p50_ms: float
    p90_ms: float
    tokens_per_step: float
    """Input tokens per step (prefill, mixed) or requests per step (decode)."""


class StepSummary(msgspec.Struct, frozen=True, tag=True):
    """What the host saw: time to first token, per-phase step times, decode throughput."""

    steps: int
    ttft_ms: float | None
    phases: list[PhaseStats]
    decode_tokens_per_s: float | None
    decode_step_growth_ms_per_100_ctx: float | None = None
    """Slope of decode step time against sequence length (ms per 100 tokens of context)."""
    source: StepSource = StepSource.HOST
    """Where the step times come from: ``host steps`` (the pipeline hook) or the trace's ranges."""
    by_batch: list[BatchStats] = []
    """Step times by phase and batch size (one row per size seen)."""


class GpuUtilization(msgspec.Struct, frozen=True):
    """Summary of one GPU's samples over the capture window."""

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
    mean_partition_activity_pct: list[float] = []
    """Per compute partition (AMD XCP, amdsmi): mean graphics activity over the window."""


class UtilizationSection(msgspec.Struct, frozen=True, tag=True):
    source: str
    interval_s: float
    gpus: list[GpuUtilization]
    samples: list[UtilizationSample]
    window_ns: tuple[int, int] | None = None


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
    launches_before: int | None = None
    """In a phase's table: launches the row's name filter (``ncu -k regex:``) matched, in the capture's launch order,
    before this phase's first launch of it: a deep dive's ``--launch-skip`` that lands in the phase."""
    launch_shape: str | None = None
    """In a phase's table: the most common launch shape of its launches there, ``grid XxYxZ block XxYxZ`` (when
    recorded)."""


class PhaseBreakdown(msgspec.Struct, frozen=True):
    """One phase's kernels. Every per-step figure is over the phase's recorded steps (a sampled recording records a
    share of them: ``steps`` of ``steps_in_capture``); where the capture has a step ledger, the step count, time, busy
    share and per-step figures are the ledger's own (:func:`~max_profile.analyze.account.breakdown_from_ledger`)."""

    phase: Phase
    steps: int
    """Recorded steps of the phase (a sampled recording: the share of each step inside its slices, summed)."""
    kernels: int
    kernel_ms: float
    wall_ms: float | None
    """The recorded steps' time: the ledger's (kernel busy time plus GPU idle inside the steps), else their host wall
    time inside the recorded slices."""
    gpu_busy_pct: float | None
    """Kernel (busy) time over ``wall_ms``: the ledger's busy share of the step where there is one."""
    kernels_per_step: float | None
    kernel_ms_per_step: float | None
    kernel_us_per_token: float | None
    families: list[FamilyRow]
    top_kernels: list[KernelRow]
    steps_in_capture: int | None = None
    """Steps of the phase in the capture, recorded or not (None: reports made before this was kept)."""
    tokens_per_step: float | None = None
    """Mean tokens per recorded step: input tokens (prefill, mixed) or requests (decode)."""


class StepKernels(msgspec.Struct, frozen=True):
    """The kernels one step asked for: count, time, and time by family (ms)."""

    index: int
    """Index into the report's steps."""
    phase: Phase
    kernels: int
    kernel_ms: float
    families: dict[str, float]
    observed: float = 1.0
    """The share of the step inside the recorded slices (1: the whole step recorded; a sampled recording lists only
    the steps it recorded, some of them in part at a slice's edge)."""


class DeviceBreakdown(msgspec.Struct, frozen=True):
    """One GPU's share of the kernels (multi-GPU runs: tensor / expert parallel)."""

    device: int
    kernels: int
    kernel_ms: float
    gpu_busy_pct: float | None
    """Union of this device's kernel intervals over the capture window."""
    collective_ms_per_decode_step: float | None
    collective_share_of_decode_pct: float | None
    families: list[FamilyRow]


class GpuWaits(msgspec.Struct, frozen=True):
    """Where the GPU waited for work inside the capture window: gaps between one kernel's end and the next one's start
    (overlaps merged, the busiest device) of at least ``min_gap_us`` and under ``max_gap_ms``; longer ones (a server
    waiting for requests, a pause between steps) are counted apart. A gap that ends at a kernel inside a device graph is
    the host launching that graph late: the kernels themselves are not slower. Equivalent: the idle stretches between
    kernels in ``nsys``'s CUDA GPU trace row."""

    min_gap_us: float
    max_gap_ms: float
    gaps: int
    waited_ms: float
    waited_pct: float
    """Of the capture window (of its recorded slices when the recording was sampled)."""
    before_graph_gaps: int
    before_graph_ms: float
    before_graph_pct: float
    gap_p50_us: float | None
    longer_gaps: int
    longer_ms: float


class KernelBreakdown(msgspec.Struct, frozen=True, tag=True):
    """Where the GPU time went: families and kernels, overall, per phase and per step."""

    source: str
    kernels: int
    kernel_ms: float
    attribution: str
    """How kernels were tied to steps: ``launch time`` (any thread), ``start time`` (no launch
    records), ``launch time, else start time``, ``none`` (no steps), ``totals only``."""
    families: list[FamilyRow]
    top_kernels: list[KernelRow]
    phases: list[PhaseBreakdown]
    step_source: StepSource = StepSource.NONE
    """Which intervals were the steps: ``max_profile ranges``, ``max_profile ranges + host steps``,
    ``MAX scheduler ranges``, ``host steps`` or ``none``."""
    window_ms: float | None = None
    """The capture window the busy figure is measured over."""
    recorded_ms: float | None = None
    """Where kernels were recorded in slices of the window (a sampled recording): the time inside them. The busy and
    wait shares are then of this time, not of the window. None: the whole window was recorded."""
    gpu_busy_pct: float | None = None
    """Union of all kernel intervals over the capture window (phases or not); over the recorded slices when sampled."""
    unattributed_kernels: int = 0
    """Valid kernels asked for outside every step (between steps, or no steps at all)."""
    invalid_kernels: int = 0
    """Records dropped for invalid timestamps (negative, or end before start)."""
    paused_kernels: int = 0
    """Records of a sampled recording dropped for an end stamped across a pause (:meth:`KernelTable.across_pauses`)."""
    unknown_kernel_names: list[str] = []
    devices: list[int] = []
    unreliable: str | None = None
    """Why per-kernel numbers cannot be trusted (device graphs hid kernels...), else None."""
    graph_kernels: int = 0
    """Kernels recorded inside device graphs (each one seen, tied to the step that launched its graph)."""
    per_step: list[StepKernels] = []
    """Steps in time order (at most PER_STEP_LIMIT): what each asked of the GPU."""
    per_device: list[DeviceBreakdown] = []
    """Filled when kernels ran on more than one device."""
    tracer_overhead_pct: float | None = None
    """Share of the capture window the in-process kernel tracer spent in its buffer callbacks
    (holding the profiled process's GIL); None when the trace was collected outside the process."""
    gpu_waits: GpuWaits | None = None
    """Gaps where the GPU waited for work (see :class:`GpuWaits`)."""


class FamilyRoofline(msgspec.Struct, frozen=True):
    """One priced part of a decode step against the GPU's two roofs: the bytes and FLOPs the model says it must
    move and do per step, over the time it took (per step), as a share of the datasheet peaks."""

    family: str
    ms_per_step: float | None
    """Kernel time per step (the whole step: its host step time, or its kernel time)."""
    bytes_per_step: float
    flops_per_step: float
    achieved_GBps: float | None
    pct_of_peak_bandwidth: float | None
    achieved_TFLOPs: float | None
    pct_of_peak_compute: float | None


class DecodeCost(msgspec.Struct, frozen=True, tag=True):
    """The bytes-and-FLOPs model of one decode step (median batch and context of the decode steps).

    ``weight_bytes``: every weight a token passes through, read once (dense layers, shared experts, the output
    projection, the routed experts the batch selects), in its stored encoding. ``kv_bytes``: the KV cache of every
    request (``context_tokens`` is already summed over the batch). Equivalent: ``ncu --metrics dram__bytes.sum``
    summed over a step's kernels."""

    batch: int
    context_tokens: float | None
    """Cached tokens summed over the batch; None where the steps do not say (MAX's spans): the KV bytes are unknown."""
    weight_bytes: float
    kv_bytes: float | None
    """None: not known (no context lengths), never zero; the step's bytes then count the weights alone."""
    embedding_bytes: float
    flops: float
    weights_basis: str
    """How the weights were counted: the safetensors headers (stored dtypes) or a config.json estimate."""
    operand: str
    """``bf16`` or ``fp8``: which compute peak applies to the matmuls."""
    gpu: str | None
    peak_bandwidth_GBps: float | None
    peak_TFLOPs: float | None
    step: FamilyRoofline
    """The whole step over its host step time (p50)."""
    kernels: FamilyRoofline | None = None
    """The whole step over its kernel time (when kernels were recorded)."""
    families: list[FamilyRoofline] = []
    """Matmul families against the weights, attention against the KV cache."""


class LedgerRow(msgspec.Struct, frozen=True):
    """One part of a phase's step time: kernels of one family (or the matmuls together), the GPU idle inside the step
    (waiting for a device-graph launch, or between launches), per step, against its roofline ideal.

    ``ideal_ms_per_step``: the bytes-and-FLOPs model's time for the part at the attainable share of the GPU's peaks
    (None: the model does not price this part); ``recoverable_ms_per_step`` = actual - ideal (idle time: all of it)."""

    part: str
    kind: Literal["kernels", "idle"]
    ms_per_step: float
    share_pct: float
    """Of the phase's step time (the sum of its rows)."""
    families: list[str] = []
    """Kernel families in the part (``kernels`` rows)."""
    kernels_per_step: float | None = None
    ideal_ms_per_step: float | None = None
    recoverable_ms_per_step: float | None = None
    basis: str | None = None
    """How the ideal was priced (bytes and FLOPs, the roofs used), or why it was not."""


class PhaseLedger(msgspec.Struct, frozen=True):
    """One phase's step, accounted: its kernels' time on the GPU (launch-time attribution) plus the GPU's idle time
    inside its steps; the rows sum to ``step_ms``. Equivalent: the CUDA GPU trace row of ``nsys`` over the phase's NVTX
    ranges."""

    phase: Phase
    steps: int
    step_ms: float
    """Ledger time per step: the phase's kernel (busy) time plus the GPU idle inside its steps, per step."""
    host_step_p50_ms: float | None
    """The host's step time (execute's wall time), median: the overlap pipeline shifts GPU work against it."""
    batch: int | None
    """Median requests per step."""
    tokens_per_step: float | None
    """Median input tokens per step (prefill, mixed) or requests per step (decode)."""
    rows: list[LedgerRow]
    busy_pct: float
    """Kernel (busy) time as a share of the step."""
    ideal_ms_per_step: float | None = None
    """Sum of the priced rows' ideals plus the unpriced rows' actual time (None: nothing priced)."""
    recoverable_ms_per_step: float = 0.0
    steps_in_capture: int | None = None
    """The phase's working steps in the capture, recorded or not (``steps`` of them were recorded when the recording
    was sampled; None: not known)."""
    kernels_per_step: float | None = None
    """Kernels per recorded step on the accounted device (None: a ledger without kernels, from server metrics)."""


class OpRow(msgspec.Struct, frozen=True):
    """One MAX op in one phase: its calls (host ranges), the kernels launched inside them and their GPU time."""

    op: str
    phase: Phase
    calls: int
    """Op ranges of this name in the phase (each a host-side range around the op's launch)."""
    kernels: int
    gpu_ms: float
    """GPU time of the kernels launched inside its ranges (the op's share of the GPU)."""
    share_pct: float
    """Of the phase's kernel time."""
    host_ms: float
    """Host time inside its ranges (launching, not running)."""
    top_kernels: list[str] = []
    """Base names of the kernels it launched, most GPU time first (three at most)."""


class OpCoverage(msgspec.Struct, frozen=True):
    """How much of a phase's kernel time was launched inside a named op's range."""

    phase: Phase
    steps: int
    kernels: int
    kernel_ms: float
    attributed_ms: float
    attributed_pct: float
    calls: int
    calls_without_kernels: int
    """Op ranges that launched no kernel (host-only ops, or kernels not recorded)."""


class OpRoofline(msgspec.Struct, frozen=True):
    """A group of MAX ops priced by the step's bytes-and-FLOPs model (the step ledger's): the ops that multiply the
    weights (the layers' and the output projection's apart where their call counts tell them apart) or that do
    attention's work (a fused attention op, or the generic ops standing in for one), per step of a phase, against the
    roofline. Equivalent by hand: the op's kernels' ``ncu --metrics dram__bytes.sum,sm__inst_executed_pipe_tensor``
    against the bytes and FLOPs its shapes imply."""

    phase: Phase
    part: str
    """What the model prices the group for: ``weights: layers``, ``weights: output projection``, ``weights`` (both)
    or ``attention``."""
    ops: list[str]
    ms_per_step: float
    """GPU time of the kernels the group's ops launched, per step."""
    kernels_per_step: float
    bytes_per_step: float
    flops_per_step: float
    ideal_ms_per_step: float
    """The roofline's time for those bytes and FLOPs at the attainable share of the peaks, never below the kernels'
    floor (kernels per step x ``kernel_floor_us``)."""
    recoverable_ms_per_step: float
    pct_of_roofline: float
    """ideal / actual x 100: how close the ops run to their roofline."""
    basis: str
    """How the bytes were tied to the ops (and the roofs used)."""
    labels: list[str] = []
    """The ops' short names, in the order of ``ops`` (the attention part inside a fused composition, the op inside
    ``elementwise(...)``); empty in reports saved before they were kept."""

    @property
    def ops_text(self) -> str:
        """The group's ops by their short labels, as reports and levers print them."""
        return ", ".join(self.labels or self.ops)


class OpBreakdown(msgspec.Struct, frozen=True, tag=True):
    """MAX's graph ops joined to the GPU kernels they launched (``--kernels ops``): per op and phase, the kernels and
    their GPU time. Equivalent tool: ``nsys stats --report nvtx_kern_sum`` on a capture with MODULAR_ENABLE_PROFILING=on
    and device graphs off."""

    source: str
    join: str
    """How kernels were tied to ops (the launch call inside the op's range on the launching thread)."""
    coverage: list[OpCoverage]
    rows: list[OpRow]
    ops_without_kernels: list[str] = []
    """Op names whose every call launched no kernel."""
    priced: list[OpRoofline] = []
    """The ops the step's bytes-and-FLOPs model prices, grouped by what they move, against the roofline (a GPU with
    known peaks and a model description only)."""


class StepLedger(msgspec.Struct, frozen=True, tag=True):
    """One account of the capture's time: each phase's step split into kernel families and GPU idle, the time outside
    steps apart, each part against its roofline. Every verdict about where time goes reads it."""

    source: LedgerSource
    """``kernel timeline`` (kernels on the GPU, or MAX's op ranges on the host), or ``server metrics`` (batch times
    only)."""
    window_ms: float
    """The observed time (the capture window; the recorded slices of a sampled recording)."""
    phases: list[PhaseLedger]
    outside_steps_ms: float
    """Time in the window outside every step (no step ran): GPU idle there plus kernels launched between steps."""
    outside_steps_pct: float
    outside_kernels_ms: float = 0.0
    """Of ``outside_steps_ms``: kernels launched outside every step."""
    device: int | None = None
    """The GPU whose timeline was accounted (the busiest, when several ran)."""
    attainable_bandwidth_pct: float | None = None
    attainable_compute_pct: float | None = None
    """The share of the datasheet peaks an ideal assumes (measured bests on the H200, :class:`Thresholds`)."""
    requests_in_flight_pct: float | None = None
    """Share of the window with at least one request in flight (serve / attach; None: not known)."""
    request_rate_rps: float | None = None
    notes: list[str] = []


class Lever(msgspec.Struct, frozen=True):
    """What fixing a finding buys, from the ledger: the part, ms per step, share of the step, and over the capture."""

    phase: str
    """A phase, or ``outside steps``."""
    part: str
    ms_per_step: float
    pct_of_step: float
    total_ms: float
    """``ms_per_step`` x the phase's steps: what the findings are ranked by."""


class SkippedRule(msgspec.Struct, frozen=True):
    """A rule the engine did not run, and why (what it needs that the capture lacks)."""

    rule: str
    reason: str


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


class Command(msgspec.Struct, frozen=True):
    """A measurement to run next, as data: shown as a ``max-profile`` command line to CLI users and as the equivalent
    Python call to those who profiled from Python (``verb`` ``shell``: another tool's command, the same for both).
    A list value is a repeated flag (``--custom-architectures A --custom-architectures B``)."""

    verb: str
    args: dict[str, str | int | float | bool | list[str]] = {}
    positional: list[str] = []
    comment: str | None = None
    program: str | None = None
    """How to run ``max-profile`` where the bare name would not (its path in a virtual environment not activated);
    None: ``max-profile``."""


class Finding(msgspec.Struct, frozen=True):
    """A verdict with the evidence it rests on and what to do next."""

    id: str
    severity: Severity
    title: str
    evidence: dict[str, float | int | str | None]
    confidence: float
    next_step: str | None = None
    detail: str | None = None
    command: Command | None = None
    """The measurement the next step names (rendered for the report's interface: CLI or Python)."""
    lever: Lever | None = None
    """What fixing it would buy, from the step ledger (None: a finding about state, not about where time goes)."""


class Histogram(msgspec.Struct, frozen=True):
    """Counts per bin (``edges`` has one more entry than ``counts``)."""

    edges: list[float]
    counts: list[int]


class LatencyStats(msgspec.Struct, frozen=True):
    """Percentiles of one latency (ms) over the requests or tokens of a window."""

    p50: float | None
    p90: float | None
    p99: float | None
    samples: int


class ServerMetrics(msgspec.Struct, frozen=True):
    """What the server's own metrics say about a window: counter and histogram deltas, gauges at its end.

    Read from ``max serve``'s Prometheus endpoint before and after the window; a metric the server does not export
    stays None and is listed in ``missing``. Equivalent: two ``curl -s HOST:8001/metrics`` and a subtraction."""

    url: str
    window_s: float
    requests: float | None = None
    output_tokens: float | None = None
    batches: dict[str, float] = {}
    """Batches executed in the window by batch type (CE: context encoding / prefill, TG: token generation / decode)."""
    batch_execution_ms_mean: dict[str, float] = {}
    batch_size_mean: float | None = None
    ttft_ms_mean: float | None = None
    itl_ms_mean: float | None = None
    requests_queued: float | None = None
    requests_running: float | None = None
    kv_cache_used_pct: float | None = None
    kv_blocks_used: float | None = None
    kv_blocks_total: float | None = None
    preemptions: float | None = None
    missing: list[str] = []
    unavailable: str | None = None


class LoadLevel(msgspec.Struct, frozen=True):
    """One concurrency level of a load sweep, client and server side.

    Goodput: completed requests per second that met every SLO (TTFT and the request's p90 inter-token latency)."""

    concurrency: int
    window_s: float
    requests: int
    completed: int
    failed: int
    output_tokens: int
    output_tok_per_s: float
    request_rate_rps: float
    ttft_ms: LatencyStats
    itl_ms: LatencyStats
    goodput_rps: float | None = None
    slo_met_pct: float | None = None
    gpu_utilization_pct: float | None = None
    server: ServerMetrics | None = None
    in_flight_pct: float | None = None
    """Share of the window with at least one request in flight (ours: probes or load)."""


class ReplicaRow(msgspec.Struct):
    """One server instance's share of a window, from MAX's spans (``replica`` "fleet": all of them together). Times in
    ms; ``busy_pct``: the passes' wall time over the window (the fleet's: the replicas' mean)."""

    replica: str
    passes: int
    passes_per_s: float | None
    prefill_passes: int
    decode_passes: int
    prefill_ms: float
    decode_ms: float
    busy_pct: float | None
    decode_batch: int | None
    """Requests per decode pass: the median over its decode passes (the batch figure of the ledger and roofline)."""
    mean_decode_pass_ms: float | None
    requests: int
    failed_requests: int
    output_tokens: int
    queue_ms: float | None
    ttft_ms: float | None
    ttft_p90_ms: float | None
    itl_ms: float | None
    """Mean inter-token latency: each request's decode phase over its tokens after the first."""
    server: str | None = None
    """The URL this replica serves on, where the capture drove or probed it (matched by the requests' ids)."""
    silent: bool = False
    """A server the capture watched from which no span of the window arrived (its row is empty: not idle, unseen)."""


class TracerCost(msgspec.Struct, frozen=True):
    """What the kernel recorder cost a served model, measured on the same server: the untraced reference window that
    ``serve --mode kernels`` runs first against the first recorded window at the same concurrency.

    Tokens/s is what the client streamed; the decode step is the server's own mean TG batch execution time (its
    /metrics). Equivalent: ``serve --mode utilization`` and ``serve --mode kernels`` side by side on one server."""

    concurrency: int
    reference_tok_s: float
    traced_tok_s: float
    throughput_ratio: float | None
    """Recorded / untraced tokens per second (1.0: no cost)."""
    throughput_ratio_noise: float | None = None
    """The ratio's standard error from the two windows' own noise (their tokens per second part by part): a ratio
    within twice it of 1 is no measured cost. Drift of the server between the windows is not in it."""
    reference_decode_step_ms: float | None = None
    traced_decode_step_ms: float | None = None
    reference_itl_p50_ms: float | None = None
    traced_itl_p50_ms: float | None = None

    @property
    def resolved(self) -> bool:
        """Whether the measured ratio stands clear of the windows' own noise (more than twice it from 1); a capture
        without the noise (older reports) counts as resolved."""
        if self.throughput_ratio is None:
            return False
        return self.throughput_ratio_noise is None or abs(1.0 - self.throughput_ratio) > 2 * self.throughput_ratio_noise

    @property
    def ratio_noise_text(self) -> str:
        """`` ± 0.0033`` (the ratio's standard error from the windows' own noise), or nothing where it is unknown."""
        return f" ± {self.throughput_ratio_noise:.4f}" if self.throughput_ratio_noise is not None else ""

    @property
    def unresolved_text(self) -> str:
        """What a measured ratio within twice its noise of 1 adds where it is printed; nothing for a resolved one."""
        return (
            ""
            if self.throughput_ratio is None or self.resolved
            else "; within twice the windows' own noise of 1: no cost resolved"
        )

    @property
    def decode_step_change_pct(self) -> float | None:
        if not self.reference_decode_step_ms or self.traced_decode_step_ms is None:
            return None
        return 100.0 * (self.traced_decode_step_ms / self.reference_decode_step_ms - 1.0)


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
    first_error: str | None = None
    ttft_histogram: Histogram | None = None
    itl_histogram: Histogram | None = None
    output_tok_per_s: float | None = None
    """Tokens streamed to the client over the window's seconds (all requests)."""
    pid: int | None = None
    """``attach``: the attached server's process on this machine (found by its port), None when not here."""
    servers: list[str] = []
    """``attach URL1 URL2``: every server watched (the next command names them all)."""
    otlp: str | None = None
    """``attach --otlp``: where the spans were received."""


class Report(msgspec.Struct):
    """Everything one profiling run produced, analysed. ``schema_version`` guards readers."""

    environment: Environment
    capture: Capture
    steps: list[Step] = []
    step_summary: StepSummary | Unavailable | None = None
    utilization: UtilizationSection | Unavailable | None = None
    kernels: KernelBreakdown | Unavailable | None = None
    decode_cost: DecodeCost | None = None
    """The decode step's bytes-and-FLOPs model against the GPU's peaks (needs the model's config or weights)."""
    ledger: StepLedger | Unavailable | None = None
    """One account of each phase's step: kernel time by family, GPU idle, time outside steps, against the roofline."""
    ops: OpBreakdown | Unavailable | None = None
    """MAX's ops joined to the kernels they launched (``--kernels ops``, a GPU with CUPTI)."""
    rules_skipped: list[SkippedRule] = []
    """Rules not run, each with what it needed."""
    kernel_analyses: list[KernelAnalysis] = []
    startup: StartupProfile | None = None
    """Process start to first token (``run``, ``demo``, ``startup``; ``serve``: launch to /health)."""
    findings: list[Finding] = []
    preflight: list[PreflightResult] = []
    serve: ServeSummary | None = None
    server_metrics: ServerMetrics | None = None
    """The server's own metrics over the (last) window of a serve / attach capture."""
    load_levels: list[LoadLevel] = []
    """A concurrency sweep, one entry per level (``--concurrency 1,4,16``)."""
    window_load: LoadLevel | None = None
    """The (last) load window of a serve / attach capture: requests, throughput, how much of it had requests in
    flight."""
    replicas: list[ReplicaRow] = []
    """Per server instance, from MAX's spans, and the fleet's total when there are several."""
    slowest_replica: str | None = None
    """With several replicas: the slowest (by inter-token latency) and why."""
    tracer_cost: TracerCost | None = None
    """``serve --mode kernels``: the recorder's cost on this server, against its untraced reference window."""
    slo_ms: dict[str, float] = {}
    next_measurement: str | None = None
    """The next, costlier measurement the escalation plan proposes (exact command, in the capture's interface), if
    any."""
    next_command: Command | None = None
    """The same as data."""
    artifacts: list[str] = []
    notes: list[str] = []
    """What the collection and analysis left out or assumed (dropped records, clock alignment...)."""
    schema_version: int = SCHEMA_VERSION
    tool_version: str = ""

    def to_json(self) -> bytes:
        return _encode(self)

    @classmethod
    def from_json(cls, data: bytes | str, path: str = "<report>", doc: dict[str, Any] | None = None) -> Report:
        """``doc``: the same bytes already decoded to a dict (checked once, not again)."""
        raw = data.encode() if isinstance(data, str) else data
        doc = _decode_doc(raw, path) if doc is None else doc
        version = doc.get("schema_version")
        if version not in READABLE_REPORT_VERSIONS:
            raise TraceFormatError(
                f"{path}: report schema version {version!r} is not supported (this max_profile reads "
                f"{', '.join(map(str, READABLE_REPORT_VERSIONS))}); re-analyse its raw capture with `max-profile "
                "report RAW.json.gz`"
            )
        if (
            "findings" not in doc
            and "kernels" in doc
            and isinstance(doc.get("kernels"), dict)
            and "names" in doc["kernels"]
        ):
            raise TraceFormatError(f"{path}: this is a raw capture, not a report: load it with RawCapture.load")
        return _validated(raw, cls, path)  # type: ignore[no-any-return]

    def save(self, path: str) -> None:
        write_output(path, msgspec.json.format(self.to_json(), indent=2))

    @classmethod
    def load(cls, path: str) -> Report:
        return cls.from_json(read_input(path), path)

    def __str__(self) -> str:
        if _TEXT_RENDERER is None:  # the text renderer registers itself when loaded (the model imports no renderer)
            import importlib

            importlib.import_module("max_profile.render.text")
        if _TEXT_RENDERER is None:
            return f"Report({self.capture.target}, {len(self.findings)} findings)"
        return _TEXT_RENDERER(self)


_TEXT_RENDERER: Callable[[Report], str] | None = None


def set_text_renderer(renderer: Callable[[Report], str]) -> None:
    """Called by the text renderer's module when it loads: ``str(report)`` renders with it (the model imports no
    renderer; ``str`` loads that module by name the first time)."""
    global _TEXT_RENDERER
    _TEXT_RENDERER = renderer
