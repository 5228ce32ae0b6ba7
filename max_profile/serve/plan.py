"""What a ``max serve`` capture is asked to do (:class:`ServePlan`), and the same plan resolved once on this machine
(:class:`ResolvedServe`): MAX's profiling mode, the server's environment and commands, the profiler binary, the model's
files. Every step of the lifecycle reads the resolved plan; none works any of it out again."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from max_profile.defaults import DEFAULT_KERNEL_SHARE
from max_profile.render.terminal import fit_to_terminal

if TYPE_CHECKING:  # annotations only: the serve mode registry loads light (the CLI's parser reads it)
    from max_profile.collect.server.serve_recorders import ServeRecorder
    from max_profile.collect.server.worker_protocol import WindowRecording
    from max_profile.model import Environment, ModelWeights

DEFAULT_PROMPT = "I believe the meaning of life is"


def local_path(path: str) -> str:
    """``path`` made absolute where it names something on this machine; as given otherwise (a Hugging Face repo id)."""
    return os.path.abspath(path) if path and os.path.exists(path) else path


def local_arch_spec(spec: str) -> str:
    """A ``--custom-architectures`` spec (a package folder, or ``IMPORT_PATH:MODULE``) with its folder made absolute
    where it exists here (MAX appends the folder to ``sys.path`` as given, in the server's working folder)."""
    from max_profile.preflight import import_path_form

    colon = import_path_form(spec)
    return local_path(spec) if colon is None else f"{local_path(colon[0])}:{colon[1]}"


@dataclass
class ServePlan:
    """What the user asked for (the ``serve`` flags, or the API's arguments)."""

    model_path: str
    devices: str
    mode: str
    duration_s: float
    port: int
    metrics_port: int
    custom_architectures: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    warm: bool = True
    prompt: str = DEFAULT_PROMPT
    max_tokens: int = 64
    concurrency: list[int] = field(default_factory=lambda: [1])
    """Concurrency levels, one window each (``--concurrency 1,4,16``): a load sweep on one server."""
    slo_ms: dict[str, float] = field(default_factory=dict)
    """Service-level objectives for goodput (``ttft``, ``itl`` in ms)."""
    vendor: str = "none"
    """The GPU vendor here: on NVIDIA the kernel modes keep MAX's device graphs (CUPTI and nsys record each kernel
    inside them); elsewhere they are turned off, as MAX's op ranges and rocprof's trace would hide graph replays."""
    reference: bool = True
    """Kernels mode: one untraced window first, at the first concurrency level and as long as the others, so the report
    says what the recorder cost this server (tokens/s and the server's own decode step, recorded against not)."""
    record_share: float = DEFAULT_KERNEL_SHARE
    """Kernels mode with CUPTI in the worker: the share of each window recorded, in slices of ``record_slice_s`` with
    the recorder paused in between (1: all of it); the in-process default's share. A recorded stretch slows ``max
    serve``'s decode (every kernel of its device graphs, or every eager launch, recorded): a quarter of the window cost
    0.3 % with device graphs and 7.6 % without them; ~10 s of steady decode repeat the same steps, so the slices show
    the same kernel mix."""
    record_slice_s: float = 0.5
    spans: bool | None = None
    """MAX's own OTLP spans (``max.batch`` per forward pass, ``max.request`` and its phases) sent to a receiver of ours
    on 127.0.0.1: the per-pass timeline on every vendor. It turns MAX's telemetry on for this server (its one start-up
    log goes to Modular; its metrics to our receiver) and costs the server a span per pass and request. None (the
    default): on where the mode has no pass timeline of its own, off where the worker hook stamps every pass (kernels,
    ops: the spans would say it twice, at a cost); ``--spans`` / ``--no-spans`` choose."""
    profiling_mode: str = "auto"
    """MODULAR_ENABLE_PROFILING in the kernel modes: ``on`` carries MAX's scheduler ranges (it shares the compile
    cache with ``max-profile run --kernels nvtx-log``); ``detailed`` adds Python spans (another compile); ``off`` has
    no ranges. ``auto``: ``off`` where CUPTI records the model worker (the worker hook's steps give the phases, and
    the server runs the compiled graphs and speed of a plain ``max serve``), ``on`` where MAX's op ranges are the
    kernels (no GPU tracer) and MAX can use them, else ``off``."""

    def __post_init__(self) -> None:
        # The server runs in a folder of its own (its TMPDIR and log): a model folder or custom-architecture package
        # named relative to here would not be found there (MAX: "No module named ...").
        self.model_path = local_path(self.model_path)
        self.custom_architectures = [local_arch_spec(s) for s in self.custom_architectures]


@dataclass(frozen=True)
class ModeContext:
    """What a mode's recorder factory gets besides the resolved plan: the machine, the server's TMPDIR, the /health
    timeout, progress lines, where artifacts go, and (for measurements of the recorder) what the worker records in
    given windows and how long the load runs under recording before a window opens."""

    env: Environment
    tmp: Path
    ready_timeout_s: float
    progress: Callable[[str], None]
    artifacts_dir: str | None
    window_recordings: Mapping[int, WindowRecording] = field(default_factory=dict)
    settle_s: float = 0.5


@dataclass(frozen=True)
class ServeMode:
    """One ``serve --mode``: what it records, what it needs, how it changes the server, its recorder and its plan lines.
    The lifecycle asks these; no code outside ``SERVE_MODES`` branches on a mode's name."""

    name: str
    summary: str
    records_kernels: bool
    """Wants every kernel: MAX's ranges on, device graphs off where the tracer cannot see into them (not NVIDIA)."""
    sweeps: bool
    """Several windows on one server: a load sweep (``--concurrency 1,4,16``)."""
    reference: bool
    """An untraced reference window first measures the recorder on the same server; windows say whether they were
    traced."""
    load_ahead: bool
    """The load starts before the window opens (rocprofv3's collection period opens by the clock instead)."""
    tool: tuple[str, str, str] | None
    """(binary, vendor, vendor's label) the mode needs, checked before anything starts."""
    make_recorder: Callable[[ResolvedServe, ModeContext], tuple[ServeRecorder, str | None]]
    plan_lines: Callable[[ResolvedServe], list[str]]
    """What the printed plan says of the mode's recording and server command."""
    worker_steps: bool = False
    """The mode's recorder stamps every forward pass in the model worker (the worker hook): MAX's spans are not
    needed for the pass timeline (``ServePlan.spans`` defaults to off)."""
    op_ranges: bool = False
    """Needs MAX's op ranges (MODULAR_ENABLE_PROFILING=on, checked before anything starts) with every op launched
    eagerly: device graphs off on every vendor (a graph replay runs its ops without their ranges)."""


@dataclass(frozen=True)
class ResolvedServe:
    """A :class:`ServePlan` resolved once, before anything starts (``resolve_plan``): what every later step reads."""

    plan: ServePlan
    mode: ServeMode
    profiling: str
    """MODULAR_ENABLE_PROFILING of every server process of the plan (``auto`` resolved here, once)."""
    server_env: Mapping[str, str]
    """The server's environment, less its TMPDIR and what the mode's recorder adds."""
    serve_command: tuple[str, ...]
    warm_command: tuple[str, ...]
    device_graphs: bool | None
    """Device graph capture as the server's flags set it (True / False), or None: MAX decides (on for supported
    architectures on a GPU). The report then says what ran, from the trace."""
    tool: str | None
    """The mode's profiler binary (checked), or None."""
    spans: bool
    """Whether the server sends MAX's OTLP spans to a receiver of ours (the plan's choice, or its mode's default)."""
    model_config: dict[str, object] | None
    model_weights: ModelWeights | None

    @property
    def records_kernels(self) -> bool:
        return self.mode.records_kernels

    @property
    def reference_window(self) -> bool:
        """Whether an untraced reference window runs before the recorded ones (a mode that can measure its recorder,
        unless ``--no-reference``)."""
        return self.plan.reference and self.mode.reference

    def env_for(self, tmp: Path, extra: Mapping[str, str]) -> dict[str, str]:
        """The environment of one server process: the plan's, its TMPDIR, and what the recorder adds."""
        return {**self.server_env, "TMPDIR": str(tmp), **extra}

    def describe(self, width: int | None = None) -> str:
        """The plan, one ``label  value`` line per part, wrapped at the terminal's width (or ``width``)."""
        p = self.plan
        lines = [
            f"model        {p.model_path} on {p.devices}",
            f"capture      {p.mode}, {p.duration_s:g} s window, concurrency-1 load on /v1/completions (stream, "
            f"{p.max_tokens} tokens/request)",
            f"ports        API {p.port}, metrics {p.metrics_port}",
        ]
        if p.warm:
            lines.append("warm pass    " + " ".join(self.warm_command))
        lines += self.mode.plan_lines(self)
        if self.spans:
            lines.append(
                "spans        MAX's OTLP spans (a max.batch per forward pass, max.request) to a receiver on 127.0.0.1: "
                "MAX's telemetry on for this server (its start-up log to Modular; --no-spans keeps it off)"
            )
        lines.append(
            "cost         a cold compile takes minutes (about 2 min per shape on 2 CPU cores, 3.5 min on an H200); "
            f"warm: ~10 s to /health, then {p.duration_s:g} s of capture"
        )
        return fit_to_terminal("\n".join(lines), width, indent=" " * 13)
