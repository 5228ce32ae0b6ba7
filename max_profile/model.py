"""The model: plain, versioned, serializable records shared by every part of max_profile.

Two top-level records:

* :class:`RawCapture` — everything a capture recorded, before analysis. Every collector and
  importer returns one (in-process profiling, nsys, rocprofv3, Kineto JSON, nsys CSVs, ``max
  serve`` in every mode, Nsight Compute). Saved with ``.save(path)``; ``max-profile report FILE``
  re-analyses it.
* :class:`Report` — what ``max_profile.analyze.report.build_report(raw)`` makes of it: summaries,
  the kernel breakdown, findings and the next measurement. Renderers print it.

Nothing here knows how a number was measured or analysed. A number that could not be measured
is never 0: it is ``None`` beside a reason, or a whole section is :class:`Unavailable`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import msgspec
import numpy as np

from max_profile.errors import TraceFormatError
from max_profile.util.files import read_input, write_output

SCHEMA_VERSION = 3
"""Bumped whenever a field changes meaning or is removed (adding optional fields keeps it).

2: kernels stored as columns (:class:`KernelTable`); serve requests, ncu launches, preflight and
artifacts are part of the raw capture; the breakdown says which step source and attribution it used.
3: a raw capture says what it could not measure as :class:`Unavailable` (as a report does), not a string."""
READABLE_RAW_VERSIONS = (1, 2, 3)
"""Raw captures of these versions load (versions 1 and 2 are converted on load)."""
READABLE_REPORT_VERSIONS = (1, 2, 3)
"""Reports of these versions load as saved (a version-1 report keeps its older analysis; re-analyse its raw capture)."""

Phase = Literal["prefill", "decode", "mixed", "unknown"]
Severity = Literal["info", "warning", "error"]
Vendor = Literal["nvidia", "amd", "none"]


def _enc_hook(obj: object) -> object:
    """numpy arrays and scalars (collection and analysis use them) encode as plain JSON values."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dec_hook(tp: type, obj: object) -> object:
    if tp is np.ndarray:
        try:
            return np.asarray(obj)
        except (ValueError, TypeError) as exc:
            raise msgspec.ValidationError(f"not a numeric array ({exc})") from exc
    if tp is object:
        return obj
    raise NotImplementedError(f"cannot decode {tp}")


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
    max_profiling_problem: str | None = None
    """Why MAX cannot run with ``MODULAR_ENABLE_PROFILING=on`` on this machine's GPUs (None: it can, or no GPU)."""
    tools: list[ToolStatus] = []
    warnings: list[str] = []


# --------------------------------------------------------------------------------------------
# Capture metadata and host steps
# --------------------------------------------------------------------------------------------


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
    compile / initialize with cache hit or miss, weights, KV-cache allocation, device-graph capture, warm-up, first token.

    ``cache``: ``hit`` (every graph came from MAX's compile cache), ``miss`` (every graph compiled), ``partial``, or
    ``unknown``; ``cache_reason`` says why a compile happened (what in the compile key is new). Sources: MAX's own
    ``CompilationTimer`` log lines and engine compile / init timings, MAX's cache log (``MODULAR_ENABLE_CACHE_LOGGING``),
    the cache folder before and after, and max_profile's marks around each step of the load."""

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
    """The engine's compile time over the whole load (``collect_compilation_stats``), graphs MAX did not name included."""
    warm_cache_command: str | None = None
    """The command that fills the cache for this exact compile key (for an image, before serving)."""
    failure: str | None = None
    """A compile that failed: MAX's failing kernel file:line, its message, the GPU architecture."""
    source: str = "in-process load"


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
    """How the capture was asked for: ``cli`` (max-profile) or ``python`` (profile() / Profiler); next steps are said the same way."""
    workload: Workload | None = None
    """What the generation asked for (batch, prompt, new tokens, custom architectures...): next commands reproduce it."""
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
    """CPU time the profiled process (all its threads) used during the step (``time.process_time_ns()``): on a CPU
    device the step's work without the wait for cores other processes held (wall time grows under load, this does not)."""

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
    source: str = "host steps"
    """Where the step times come from: ``host steps`` (the pipeline hook) or the trace's ranges."""
    by_batch: list[BatchStats] = []
    """Step times by phase and batch size (one row per size seen)."""


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
    partition_activity_pct: list[float] = []
    """AMD partitioned GPUs (amdsmi): graphics activity of each compute partition (XCP), in order."""


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


# --------------------------------------------------------------------------------------------
# Kernels (raw)
# --------------------------------------------------------------------------------------------


class KernelRecord(msgspec.Struct, frozen=True, array_like=True):
    """One kernel execution on a GPU, as any tracer reports it: the per-record view of a :class:`KernelTable`."""

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
    graph_node_id: int | None = None


_INT64_COLUMNS = ("start_ns", "end_ns")


def _int_column(value: object, dtype: type, name: str, flat: bool = True) -> np.ndarray:
    """An integer column of a kernel table; anything else (floats, text, out-of-range numbers) is a format error."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise TraceFormatError(f"kernel table column {name} is not a numeric array ({exc})") from exc
    if array.size and array.dtype.kind not in "iub":
        raise TraceFormatError(f"kernel table column {name} holds {array.dtype} values, not integers")
    info = np.iinfo(dtype)  # type: ignore[type-var]
    if array.size and (int(array.min()) < info.min or int(array.max()) > info.max):
        raise TraceFormatError(f"kernel table column {name} holds values beyond {np.dtype(dtype).name}")
    out: np.ndarray = array.astype(dtype)
    return out.reshape(-1) if flat else out


_OPTIONAL_INT64 = ("launch_ns", "launch_tid", "stream", "correlation_id", "graph_id", "graph_node_id")


def merged_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Time spans in order with overlapping or touching ones merged (empty ones dropped)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in spans if b > a):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class KernelTable(msgspec.Struct):
    """Every kernel of a capture as columns, one entry per kernel (a million kernels stay numpy arrays).

    ``names`` holds each distinct name once; ``name_idx`` points into it. Optional columns are
    None when the source does not record them; inside a column ``-1`` means "not known for this
    kernel" (``launch_ns``, ``launch_tid``) and ``0`` means "not in a graph" (``graph_id``).
    Times are nanoseconds on the clock named by :attr:`RawCapture.kernel_clock`.
    """

    names: list[str]
    name_idx: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    device: np.ndarray
    launch_ns: np.ndarray | None = None
    launch_tid: np.ndarray | None = None
    stream: np.ndarray | None = None
    correlation_id: np.ndarray | None = None
    graph_id: np.ndarray | None = None
    graph_node_id: np.ndarray | None = None
    grid: np.ndarray | None = None
    """(n, 3) int32 grid dimensions."""
    block: np.ndarray | None = None
    """(n, 3) int32 block dimensions."""
    registers: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = int(np.asarray(self.start_ns).size)
        self.name_idx = _int_column(self.name_idx, np.int32, "name_idx")
        for col in _INT64_COLUMNS:
            setattr(self, col, _int_column(getattr(self, col), np.int64, col))
        self.device = _int_column(self.device, np.int32, "device")
        for col in _OPTIONAL_INT64:
            value = getattr(self, col)
            if value is not None:
                setattr(self, col, _int_column(value, np.int64, col))
        for col in ("grid", "block"):
            value = getattr(self, col)
            if value is not None:
                column = _int_column(value, np.int32, col, flat=False)
                if column.size % 3:
                    raise TraceFormatError(f"kernel table column {col} is not (x, y, z) triples")
                setattr(self, col, column.reshape(-1, 3))
        if self.registers is not None:
            self.registers = _int_column(self.registers, np.int32, "registers")
        if not all(isinstance(nm, str) for nm in self.names):
            raise TraceFormatError("kernel table names must be text")
        for col in ("name_idx", "end_ns", "device", *_OPTIONAL_INT64, "grid", "block", "registers"):
            value = getattr(self, col)
            if value is not None and len(value) != n:
                raise TraceFormatError(f"kernel table column {col} has {len(value)} entries for {n} kernels")
        if n and (int(self.name_idx.min()) < 0 or int(self.name_idx.max()) >= len(self.names)):
            raise TraceFormatError(f"kernel table name index out of range (0..{len(self.names) - 1})")

    def __len__(self) -> int:
        return int(self.start_ns.size)

    @classmethod
    def empty(cls) -> KernelTable:
        z = np.zeros(0, dtype=np.int64)
        return cls(names=[], name_idx=z, start_ns=z, end_ns=z, device=z)

    @classmethod
    def from_records(cls, kernels: Sequence[KernelRecord]) -> KernelTable:
        index: dict[str, int] = {}
        n = len(kernels)

        def col(get: Callable[[KernelRecord], int | None], missing: int) -> np.ndarray | None:
            values = [get(k) for k in kernels]
            if all(v is None for v in values):
                return None
            return np.fromiter((missing if v is None else v for v in values), dtype=np.int64, count=n)

        grids = [k.grid for k in kernels]
        blocks = [k.block for k in kernels]
        regs = [k.registers for k in kernels]
        name_idx = np.fromiter((index.setdefault(k.name, len(index)) for k in kernels), dtype=np.int32, count=n)
        return cls(
            names=list(index),
            name_idx=name_idx,
            start_ns=np.fromiter((k.start_ns for k in kernels), dtype=np.int64, count=n),
            end_ns=np.fromiter((k.end_ns for k in kernels), dtype=np.int64, count=n),
            device=np.fromiter((k.device for k in kernels), dtype=np.int32, count=n),
            launch_ns=col(lambda k: k.launch_ns, -1),
            launch_tid=col(lambda k: k.launch_tid, -1),
            stream=col(lambda k: k.stream, 0),
            correlation_id=col(lambda k: k.correlation_id, 0),
            graph_id=col(lambda k: k.graph_id, 0),
            graph_node_id=col(lambda k: k.graph_node_id, 0),
            grid=None if all(g is None for g in grids) else np.array([g or (0, 0, 0) for g in grids], dtype=np.int32).reshape(-1, 3),
            block=None if all(b is None for b in blocks) else np.array([b or (0, 0, 0) for b in blocks], dtype=np.int32).reshape(-1, 3),
            registers=None if all(r is None for r in regs) else np.array([r or 0 for r in regs], dtype=np.int32),
        )

    def records(self) -> list[KernelRecord]:
        """Per-kernel records (slow for millions of kernels: analysis works on the columns)."""
        def opt(col: np.ndarray | None, i: int, missing: int = -1) -> int | None:
            if col is None or int(col[i]) == missing:
                return None
            return int(col[i])

        out = []
        for i in range(len(self)):
            out.append(KernelRecord(
                name=self.names[int(self.name_idx[i])], start_ns=int(self.start_ns[i]), end_ns=int(self.end_ns[i]), device=int(self.device[i]),
                stream=int(self.stream[i]) if self.stream is not None else 0,
                correlation_id=int(self.correlation_id[i]) if self.correlation_id is not None else 0,
                grid=tuple(int(x) for x in self.grid[i]) if self.grid is not None else None,  # type: ignore[arg-type]
                block=tuple(int(x) for x in self.block[i]) if self.block is not None else None,  # type: ignore[arg-type]
                registers=int(self.registers[i]) if self.registers is not None else None,
                graph_id=opt(self.graph_id, i, 0), launch_tid=opt(self.launch_tid, i), launch_ns=opt(self.launch_ns, i),
                graph_node_id=opt(self.graph_node_id, i, 0),
            ))
        return out

    def name_of(self, i: int) -> str:
        return self.names[int(self.name_idx[i])]

    def attribution_time(self) -> np.ndarray:
        """When each kernel was asked for: its launch call's start where recorded, else its own start."""
        if self.launch_ns is None:
            return self.start_ns
        return np.where(self.launch_ns >= 0, self.launch_ns, self.start_ns)

    def across_pauses(self, slices: Sequence[tuple[int, int]], until: int | None = None) -> np.ndarray:
        """Mask of the kernels of a sampled recording whose end lies past the middle of the pause after the slice they
        started in; ``until``: when the recording stopped (or the window closed), the end of a pause after the last slice.
        CUPTI stamps a kernel still running when the recording paused with the time it resumed (or stopped): on the H200
        graph kernels launched as the recorder paused came back 1.5 s long, ending ~0.4 ms before the next slice's first
        timestamp, and 0.6 s long after the last slice, ending at the stop (459 of 191,348 in one window). A served
        model's kernel does not outlast half a pause."""
        ordered = merged_spans(slices)  # several recording processes: their slices overlap
        if len(ordered) < 2 or not len(self):
            return np.zeros(len(self), dtype=bool)
        starts = np.array([a for a, _ in ordered], dtype=np.int64)
        ends = np.array([b for _, b in ordered], dtype=np.int64)
        # after the last slice: paused until ``until`` when that is later, else no pause (nothing past it is cut)
        last = until if until is not None and until > ordered[-1][1] else np.iinfo(np.int64).max
        following = np.append(starts[1:], last)
        middle = ends + (following - ends) // 2
        k = np.searchsorted(starts, self.start_ns, side="right") - 1
        inside = k >= 0
        out = np.zeros(len(self), dtype=bool)
        out[inside] = self.end_ns[inside] > middle[k[inside]]
        return out

    def select(self, mask: np.ndarray) -> KernelTable:
        """The kernels where ``mask`` is True (names kept as they are)."""

        def pick(col: np.ndarray | None) -> np.ndarray | None:
            return None if col is None else col[mask]

        return KernelTable(
            names=self.names, name_idx=self.name_idx[mask], start_ns=self.start_ns[mask], end_ns=self.end_ns[mask], device=self.device[mask],
            launch_ns=pick(self.launch_ns), launch_tid=pick(self.launch_tid), stream=pick(self.stream), correlation_id=pick(self.correlation_id),
            graph_id=pick(self.graph_id), graph_node_id=pick(self.graph_node_id), grid=pick(self.grid), block=pick(self.block),
            registers=pick(self.registers),
        )

    def within(self, window: tuple[int, int] | None) -> KernelTable:
        """Kernels asked for inside ``window`` (launch time, else start time; both ends included)."""
        if window is None or not len(self):
            return self
        t = self.attribution_time()
        return self.select((t >= window[0]) & (t <= window[1]))

    def to_json(self) -> bytes:
        return _encode(self)

    @classmethod
    def from_json(cls, data: bytes, path: str = "<kernel table>") -> KernelTable:
        return _validated(data, cls, path)  # type: ignore[no-any-return]

    @classmethod
    def concat(cls, tables: Iterable[KernelTable]) -> KernelTable:
        parts = [t for t in tables if len(t)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        names: dict[str, int] = {}
        idx = []
        for t in parts:
            remap = np.array([names.setdefault(nm, len(names)) for nm in t.names] or [0], dtype=np.int32)
            idx.append(remap[t.name_idx])

        def cat(col: str, missing: int, width: int = 0) -> np.ndarray | None:
            cols = [getattr(t, col) for t in parts]
            if all(c is None for c in cols):
                return None
            filled = [c if c is not None else np.full((len(t), width) if width else len(t), missing) for c, t in zip(cols, parts, strict=True)]
            return np.concatenate(filled)

        return cls(
            names=list(names), name_idx=np.concatenate(idx), start_ns=np.concatenate([t.start_ns for t in parts]),
            end_ns=np.concatenate([t.end_ns for t in parts]), device=np.concatenate([t.device for t in parts]),
            launch_ns=cat("launch_ns", -1), launch_tid=cat("launch_tid", -1), stream=cat("stream", 0), correlation_id=cat("correlation_id", 0),
            graph_id=cat("graph_id", 0), graph_node_id=cat("graph_node_id", 0), grid=cat("grid", 0, 3), block=cat("block", 0, 3),
            registers=cat("registers", 0),
        )


class KernelTotal(msgspec.Struct, frozen=True):
    """A kernel name's totals from a summary-only source (``nsys stats --report cuda_gpu_kern_sum``)."""

    name: str
    count: int
    total_ns: int


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


# --------------------------------------------------------------------------------------------
# Serving and Nsight Compute (raw)
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Analysis results
# --------------------------------------------------------------------------------------------


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
    """In a phase's table: the most common launch shape of its launches there, ``grid XxYxZ block XxYxZ`` (when recorded)."""


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


class StepKernels(msgspec.Struct, frozen=True):
    """The kernels one step asked for: count, time, and time by family (ms)."""

    index: int
    """Index into the report's steps."""
    phase: Phase
    kernels: int
    kernel_ms: float
    families: dict[str, float]


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
    step_source: str = "none"
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
    context_tokens: float
    weight_bytes: float
    kv_bytes: float
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
    """One phase's step, accounted: its kernels' time on the GPU (launch-time attribution) plus the GPU's idle time inside its
    steps; the rows sum to ``step_ms``. Equivalent: the CUDA GPU trace row of ``nsys`` over the phase's NVTX ranges."""

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


class StepLedger(msgspec.Struct, frozen=True, tag=True):
    """One account of the capture's time: each phase's step split into kernel families and GPU idle, the time outside
    steps apart, each part against its roofline. Every verdict about where time goes reads it."""

    source: str
    """``kernel timeline`` (kernels on the GPU, or MAX's op ranges on the host), or ``server metrics`` (batch times only)."""
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
    reference_decode_step_ms: float | None = None
    traced_decode_step_ms: float | None = None
    reference_itl_p50_ms: float | None = None
    traced_itl_p50_ms: float | None = None

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


# --------------------------------------------------------------------------------------------
# Saving and loading
# --------------------------------------------------------------------------------------------


NON_NEGATIVE_SUFFIXES = ("_ms", "_ns", "_us", "_s", "_pct", "bytes", "kernels", "steps", "count", "tokens", "requests", "samples", "_mhz",
                         "batch_size", "index")
"""Numbers under keys ending like these are times, shares or counts: never negative in a valid capture or report."""
SIGNED_KEYS = ("growth", "correlation", "delta", "slope", "change", "gain")
"""Keys that may be negative: trends, and changes between two measurements (a step that got faster, a throughput that fell)."""


def find_impossible_number(doc: object, key: str = "") -> str | None:
    """The first NaN, infinity or negative time / count in a decoded document (``key = value``), or None."""
    if isinstance(doc, dict):
        if "name_idx" in doc and "start_ns" in doc:
            return None  # a kernel table: -1 marks unknown launches, and invalid records are the analysis's to drop and count
        for k, v in doc.items():
            if k == "kernels" and isinstance(v, list) and v and isinstance(v[0], list):
                continue  # a version-1 kernel table (rows as arrays): the same holds as for the columns above
            found = find_impossible_number(v, str(k))
            if found:
                return found
    elif isinstance(doc, list):
        for v in doc:
            found = find_impossible_number(v, key)
            if found:
                return found
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        if isinstance(doc, float) and not math.isfinite(doc):
            return f"{key} = {doc}"
        if doc < 0 and key.endswith(NON_NEGATIVE_SUFFIXES) and not any(s in key for s in SIGNED_KEYS):
            return f"{key} = {doc}"
        if isinstance(doc, int) and abs(doc) >= 1 << 63:
            return f"{key} = {doc} (beyond 64 bits)"
    return None


def _encode(obj: object) -> bytes:
    return msgspec.json.encode(obj, enc_hook=_enc_hook)


def _decode_doc(data: bytes, path: str) -> dict[str, Any]:
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: not valid JSON ({exc}); truncated?") from exc
    except RecursionError as exc:
        raise TraceFormatError(f"{path}: JSON nested too deep; not a max_profile capture or report") from exc
    if not isinstance(doc, dict):
        raise TraceFormatError(f"{path}: a JSON {type(doc).__name__}, not a max_profile capture or report")
    try:
        bad = find_impossible_number(doc)
    except RecursionError as exc:
        raise TraceFormatError(f"{path}: JSON nested too deep; not a max_profile capture or report") from exc
    if bad:
        raise TraceFormatError(f"{path}: impossible value {bad}: damaged or not written by max_profile")
    return doc


def _validated(data: bytes, tp: type, path: str) -> Any:
    try:
        return msgspec.json.decode(data, type=tp, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(f"{path}: not a valid max_profile {tp.__name__}: {exc}") from exc
    except RecursionError as exc:
        raise TraceFormatError(f"{path}: JSON nested too deep; not a max_profile {tp.__name__}") from exc
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from exc


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
    """The (last) load window of a serve / attach capture: requests, throughput, how much of it had requests in flight."""
    tracer_cost: TracerCost | None = None
    """``serve --mode kernels``: the recorder's cost on this server, against its untraced reference window."""
    slo_ms: dict[str, float] = {}
    next_measurement: str | None = None
    """The next, costlier measurement the escalation plan proposes (exact command, in the capture's interface), if any."""
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
                f"{', '.join(map(str, READABLE_REPORT_VERSIONS))}); re-analyse its raw capture with `max-profile report RAW.json.gz`"
            )
        if "findings" not in doc and "kernels" in doc and isinstance(doc.get("kernels"), dict) and "names" in doc["kernels"]:
            raise TraceFormatError(f"{path}: this is a raw capture, not a report: load it with RawCapture.load")
        return _validated(raw, cls, path)  # type: ignore[no-any-return]

    def save(self, path: str) -> None:
        write_output(path, msgspec.json.format(self.to_json(), indent=2))

    @classmethod
    def load(cls, path: str) -> Report:
        return cls.from_json(read_input(path), path)

    def __str__(self) -> str:
        if _TEXT_RENDERER is None:  # only when max_profile.model is used without the package root
            return f"Report({self.capture.target}, {len(self.findings)} findings)"
        return _TEXT_RENDERER(self)


_TEXT_RENDERER: Callable[[Report], str] | None = None


def set_text_renderer(renderer: Callable[[Report], str]) -> None:
    """Called once by the package root: ``str(report)`` renders with it (the model imports no renderer)."""
    global _TEXT_RENDERER
    _TEXT_RENDERER = renderer


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
            raise TraceFormatError(f"{path}: raw capture schema version {version!r} is not supported "
                                   f"(this max_profile reads {', '.join(map(str, READABLE_RAW_VERSIONS))})")
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
    """Schema version 1 (sessions 1-3): kernels as a list of array-like records, tracer cost as a %."""

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
            callback_s = self.tracer_overhead_pct / 100.0 * (max(s.end_ns for s in work) - min(s.start_ns for s in work)) / 1e9
        return RawCapture(
            environment=self.environment, capture=self.capture, steps=self.steps, kernels=KernelTable.from_records(self.kernels),
            ranges=self.ranges, samples=self.samples, sample_interval_s=self.sample_interval_s,
            utilization_unavailable=Unavailable(self.utilization_unavailable) if self.utilization_unavailable is not None else None,
            kernels_unavailable=Unavailable(self.kernels_unavailable) if self.kernels_unavailable is not None else None,
            kernel_source=self.kernel_source, graph_launches=self.graph_launches, notes=list(self.notes), tracer_callback_s=callback_s,
        )


def load_saved(path: str) -> RawCapture | Report:
    """A saved raw capture or report, told apart by content (a report has findings)."""
    data = read_input(path)
    doc = _decode_doc(data, path)
    if "findings" in doc:
        return Report.from_json(data, path, doc)
    return RawCapture.from_json(data, path, doc)
