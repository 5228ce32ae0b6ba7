"""What collectors record: the machine, the model, the capture's settings, steps, samples, requests, windows,
preflight."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from max_profile.model.serialization import Phase, Severity, Vendor
from max_profile.model.tags import StartupSource


class Unavailable(msgspec.Struct, frozen=True, tag="unavailable"):
    """A measurement that could not be taken, and why (no GPU, tool missing, graphs hid kernels...)."""

    reason: str


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
    max_profiling_problem: str | None = None
    """Why MAX cannot run with ``MODULAR_ENABLE_PROFILING=on`` on this machine's GPUs (None: it can, or no GPU)."""
    tools: list[ToolStatus] = []
    warnings: list[str] = []
    programs: dict[str, str] = {}
    """How this machine runs the programs a report's commands name where the bare name would not: ``max-profile``,
    ``max``, ``pip`` -> the script beside this interpreter (a virtual environment used without activating it). Empty:
    each name runs as it is."""


class WeightGroup(msgspec.Struct, frozen=True):
    """Stored tensors of one role: bytes on disk (= bytes a full read moves), elements, tensor count."""

    bytes: int
    elements: int
    tensors: int


class ModelWeights(msgspec.Struct, frozen=True):
    """A model's stored weights by role (``embedding``, ``lm_head``, ``layers``, ``experts``, ``shared_experts``) and by
    stored dtype (``BF16``, ``F8_E4M3``, ``F32`` scales ...), read from its safetensors headers: what a decode step
    reads, in the encoding it is stored in (FP8 1 byte + scales, packed FP4, biases)."""

    source: str
    groups: dict[str, WeightGroup]
    dtypes: dict[str, int]
    """Bytes per stored dtype (safetensors names)."""
    tied_embeddings: bool
    """No separate lm_head: the output projection reads the embedding table."""


class BusyProcess(msgspec.Struct, frozen=True):
    """Another process that used the CPU during the capture window."""

    pid: int
    name: str
    cores: float
    """CPU seconds it used over the window's seconds (1.0 = one core busy the whole window)."""


class HostLoad(msgspec.Struct, frozen=True):
    """How busy the host's CPUs were over the capture window, split into the profiled process tree and everything
    else (two snapshots of per-process CPU time; equivalent: ``pidstat 1``)."""

    window_s: float
    cores: int
    cpu_busy_pct: float | None
    """Share of all cores' time not idle over the window."""
    own_cores: float
    """Cores' worth of CPU time the profiled process and its children used."""
    other_cores: float
    """Cores' worth of CPU time every other process used."""
    load_avg_1m: float | None = None
    busiest_others: list[BusyProcess] = []
    observed_cores: float | None = None
    """Cores' worth the observed server's processes used (``attach`` to a server on this machine): the work being
    measured, not other load (None: no server observed)."""


class StartupPhase(msgspec.Struct, frozen=True):
    """One piece of the time from process start to the first token (seconds), with what it moved where known."""

    name: str
    seconds: float
    bytes: int | None = None
    """Bytes the phase moved (weights read, KV cache allocated)."""
    gb_per_s: float | None = None
    cache: str | None = None
    """For a compile phase: ``hit`` (loaded from MAX's compile cache), ``miss`` (compiled), or None when unknown."""
    detail: str | None = None


class StartupProfile(msgspec.Struct, frozen=True, tag=True):
    """Where the time before the first token went: imports, config, custom-architecture import, per-graph build /
    compile / initialize with cache hit or miss, weights, KV-cache allocation, device-graph capture, warm-up, first
    token.

    ``cache``: ``hit`` (every graph came from MAX's compile cache), ``miss`` (every graph compiled), ``partial``, or
    ``unknown``; ``cache_reason`` says why a compile happened (what in the compile key is new). Sources: MAX's own
    ``CompilationTimer`` log lines and engine compile / init timings, MAX's cache log
    (``MODULAR_ENABLE_CACHE_LOGGING``), the cache folder before and after, and max_profile's marks around each step of
    the load."""

    total_s: float
    phases: list[StartupPhase]
    cache: str = "unknown"
    cache_reason: str = ""
    cache_dir: str | None = None
    compile_key: dict[str, str] = {}
    """What max_profile knows to be part of MAX's compile key for this load (MAX version, devices, profiling mode,
    device graphs, batch size, max length, encoding, custom architecture code)."""
    max_logged_compile_s: float | None = None
    """The sum of MAX's own ``Compiling <graph> took X seconds`` lines."""
    engine_compile_s: float | None = None
    """The engine's compile time over the whole load (``collect_compilation_stats``), graphs MAX did not name
    included."""
    warm_cache_command: str | None = None
    """The command that fills the cache for this exact compile key (for an image, before serving)."""
    failure: str | None = None
    """A compile that failed: MAX's failing kernel file:line, its message, the GPU architecture."""
    source: StartupSource = StartupSource.IN_PROCESS


class Workload(msgspec.Struct, frozen=True):
    """What the profiled generation asked of the model: what a next command needs to reproduce the capture.

    Filled by the CLI from its flags, by ``profile(pipeline)`` from the pipeline's config and the steps it saw
    (batch size, prompt and new tokens per request), by ``serve`` from its load; None where it is not known."""

    batch_size: int | None = None
    """Requests per batch (``--batch-size``)."""
    prompt: str | None = None
    """The prompt text, when the capture chose it (``--prompt``)."""
    prompt_tokens: int | None = None
    """Prompt tokens per request, as the tokenizer counted them (the prefill's input tokens / batch)."""
    max_new_tokens: int | None = None
    warmup_tokens: int | None = None
    max_length: int | None = None
    quantization_encoding: str | None = None
    custom_architectures: list[str] = []
    kernels: str | None = None
    """The kernel recorder asked for (``--kernels``: off, cupti, nvtx-log, auto)."""


class Capture(msgspec.Struct):
    """How the data was captured."""

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
    model_weights: ModelWeights | None = None
    """The model's stored weights by role and dtype (safetensors headers), when the folder was readable."""
    host_load: HostLoad | None = None
    """The host's CPU load over the capture window (None: not recorded)."""
    interface: str = ""
    """How the capture was asked for: ``cli`` (max-profile) or ``python`` (profile() / Profiler); next steps are said
    the same way."""
    workload: Workload | None = None
    """What the generation asked for (batch, prompt, new tokens, custom architectures...): next commands reproduce
    it."""
    unix_minus_perf_counter_ns: int | None = None
    """Unix time minus the step clock (``time.perf_counter_ns``) in the profiled process: step times plus
    this are Unix nanoseconds (spans). None for imported traces, whose clock is the trace's own."""


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
    """Tokens the scheduler fed this step (``TextGenerationInputs.input_tokens``)."""
    context_tokens: int | None
    """Tokens already in the KV cache, as the scheduler counts them."""
    start_ns: int
    end_ns: int
    output_tokens: int = 0
    model_input_tokens: int | None = None
    """Tokens in the model's own input tensor this step (the ragged ``tokens`` the pipeline model
    executed), when the hook could read it. Equals ``input_tokens`` unless the architecture feeds
    its model something else (e.g. re-encodes the whole sequence behind the scheduler's back)."""
    cpu_ns: int | None = None
    """CPU time the profiled process (all its threads) used during the step (``time.process_time_ns()``). Not a
    load-independent figure: MAX's CPU runtime spins its worker threads while they wait, and other processes on the
    cores cut that spinning (per token, -57 % to +11 % of a quiet run's beside two busy loops on 2 cores)."""
    replica: str | None = None
    """The server instance that ran this pass, where it came from MAX's spans (``service.instance.id``, else
    ``replica-N``)."""
    batch_id: int | None = None
    """MAX's ``max.batch_id`` of the pass, where it came from MAX's spans."""

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
    partition_activity_pct: list[float] = []
    """AMD partitioned GPUs (amdsmi): graphics activity of each compute partition (XCP), in order."""


class PhaseRange(msgspec.Struct, frozen=True, array_like=True):
    """A marked interval (an NVTX / roctx range of ours, or MAX's scheduler range)."""

    name: str
    start_ns: int
    end_ns: int
    tid: int | None = None
    domain: str | None = None


def ranges_within(ranges: Iterable[PhaseRange], window: tuple[int, int] | None) -> list[PhaseRange]:
    """Ranges that overlap ``window`` (a range pushed a moment before the window opened still counts)."""
    if window is None:
        return list(ranges)
    return [r for r in ranges if r.end_ns >= window[0] and r.start_ns <= window[1]]


class RequestRecord(msgspec.Struct, frozen=True):
    """One streamed request of the serve load, as the client saw it."""

    started_ns: int
    """Host ``perf_counter_ns`` when the request was sent and when its stream ended."""
    ended_ns: int
    ok: bool
    tokens: int = 0
    ttft_ms: float | None = None
    itl_ms: list[float] = []
    error: str | None = None
    truncated: bool = False
    """The client stopped reading before the stream ended (the load stopped mid-request)."""
    request_id: str | None = None
    """The server's id of the request (the stream's chunk ``id``: MAX's ``max.request_id``), which ties it to the
    server's own spans."""
    server: str | None = None
    """The URL of the server it went to, where a load drives several (``attach URL1 URL2``)."""


class ServerRequest(msgspec.Struct, frozen=True):
    """One request as the server's own spans tell it (``max.request`` with its ``max.phase.prefill`` /
    ``max.phase.decode``): times on the capture's clock, durations in nanoseconds."""

    request_id: str
    replica: str
    started_ns: int
    """Arrival at the API server (the ``max.request`` span's start) and the end of its response."""
    ended_ns: int
    ok: bool = True
    input_tokens: int = 0
    output_tokens: int = 0
    queue_ns: int | None = None
    """Arrival to the start of its first forward pass (``max.first_batch_id``)."""
    ttft_ns: int | None = None
    """Arrival to the end of its prefill phase (its first token computed)."""
    prefill_ns: int | None = None
    decode_ns: int | None = None
    first_batch_id: int | None = None
    last_batch_id: int | None = None


class PassAgreement(msgspec.Struct, frozen=True):
    """The same window's forward passes as the worker hook stamped them and as MAX's ``max.batch`` spans tell them."""

    hook_steps: int
    hook_prefill: int
    hook_decode: int
    hook_median_ms: float | None
    span_passes: int
    span_prefill: int
    span_decode: int
    span_median_ms: float | None


class MetricPoint(msgspec.Struct, frozen=True, array_like=True):
    """One sample of a Prometheus exposition (a histogram's buckets, sum and count are samples of their own)."""

    name: str
    labels: dict[str, str]
    value: float


class MetricsScrape(msgspec.Struct, frozen=True):
    """One read of a server's /metrics, on the host clock; ``problem`` when it could not be read."""

    t_ns: int
    url: str
    points: list[MetricPoint] = []
    problem: str | None = None


class LoadWindow(msgspec.Struct, frozen=True):
    """One window of load at a fixed concurrency: the requests that overlapped it and the server's metrics around it."""

    concurrency: int
    window_ns: tuple[int, int]
    requests: list[RequestRecord] = []
    metrics_before: MetricsScrape | None = None
    metrics_after: MetricsScrape | None = None
    traced: bool | None = None
    """Whether the kernel recorder ran in this window (``serve --mode kernels``); None where no recorder takes part."""
    reference: bool = False
    """The untraced window ``serve --mode kernels`` runs first as the recorder's yardstick (not a load level)."""


class ServeRun(msgspec.Struct, frozen=True):
    """How a ``max serve`` capture ran: mode, port, readiness, the commands and the log."""

    mode: str
    port: int
    time_to_ready_s: float | None = None
    commands: list[list[str]] = []
    server_log: str | None = None
    pid: int | None = None
    """``attach``: the attached server's process on this machine (found by its listening port), None when not here."""
    servers: list[str] = []
    """The URLs of every server the capture watched (``attach URL1 URL2``: each a replica the report names, one that
    sent nothing included); empty for one server."""
    otlp: str | None = None
    """``attach --otlp``: where the servers' spans were received (``[HOST:]PORT`` as given)."""


class NcuLaunch(msgspec.Struct, frozen=True):
    """One launch profiled by Nsight Compute, as its CSV pages give it (values in base units)."""

    launch_id: str
    name: str
    grid: str | None = None
    block: str | None = None
    device: str | None = None
    metrics: dict[str, float] = {}
    """Details-page labels (``DRAM Throughput``) and raw-page metric names (``dram__bytes.sum``)."""
    sections: dict[str, float] = {}
    """``Section/Label`` for labels that repeat across sections (``Memory Throughput``)."""
    rules: list[str] = []


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
    """The whole preflight: its child imports MAX (drift scan, built-in names), the tokenizer, then the package."""
    package_import_s: float | None = None
    """The package's own import in that child, with MAX already imported (what its module-level code costs)."""

    @property
    def ok(self) -> bool:
        return not any(c.severity == "error" and not c.ok for c in self.checks)
