"""Profile ``max serve``: planned, confirmed, warmed, bounded, fail-fast, and cleaned up — one lifecycle for every mode.

    max-profile serve --model-path P [--devices D] [--mode utilization|kernels|nsys|rocprof] [--duration 10]
                      [--concurrency 1,4,16] [--slo ttft=MS,itl=MS] [--yes] [-- EXTRA SERVE FLAGS]

1. Plan: the model, flags, commands and expected cost are printed; nothing starts without confirmation (``--yes``,
   a TTY answer, or ``confirm=`` in the API). Custom architectures are preflighted; a warm pass (``max warm-cache``)
   fills the compile cache.
2. The mode's recorder (:mod:`max_profile.collect.server.serve_recorders`) may wrap the launch and add to the
   environment. The server runs in its own process group and TMPDIR, on free ports (API, and metrics on
   ``MAX_SERVE_METRICS_ENDPOINT_PORT``), with ``OTEL_SDK_DISABLED=true`` (no telemetry egress; /metrics kept).
3. Fail fast: while waiting for ``/health`` the process must stay alive and its log show no early error.
4. Windows: for each concurrency level, a closed-loop streaming load, then the window: the mode's window recorder
   started, the server's /metrics read, GPU samples and host load (all one ``Recorder`` protocol, run by the shared
   ``ServerWindow``); ``duration`` seconds; everything stopped and read back.
5. Only the server's own process group is stopped; its TMPDIR is removed; artifacts are checked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from max_profile.collect.live.nvtx_log import (
    MAX_GPU_NVTX_PROBLEM,
    NVTX_V2_FIX,
    max_profiling_usable,
    profiling_library_env,
)
from max_profile.collect.live.recorders import DEFAULT_KERNEL_SHARE
from max_profile.collect.probes.environment import detect_environment, require_tool
from max_profile.collect.probes.model_files import read_model_config, read_model_weights
from max_profile.collect.probes.startup import (
    cache_files,
    compile_key,
    modular_cache_dir,
    serve_startup,
    warm_cache_command,
)
from max_profile.collect.server.load_window import ServerTarget, ServerWindow, window_recorders
from max_profile.collect.server.serve_profilers import nsys_session_name
from max_profile.collect.server.serve_recorders import (
    NsysRecorder,
    RocprofRecorder,
    ServeRecorder,
    UtilizationRecorder,
    WorkerKernelRecorder,
)
from max_profile.collect.server.server_process import (
    EARLY_ERRORS,
    ServerProcess,
    free_port,
    port_in_use,
    scan_server_log,
    server_tmpdir,
    wait_ready,
)
from max_profile.errors import CaptureError, InputError, ToolMissingError
from max_profile.model import (
    Capture,
    Environment,
    PreflightResult,
    RawCapture,
    ServeRun,
    StartupProfile,
    Unavailable,
    Workload,
)
from max_profile.preflight import import_path_form, preflight_gate
from max_profile.render.terminal import fit_to_terminal
from max_profile.util.models import check_model_folder
from max_profile.util.procs import clean_child_env, die_with_parent, kill_group, max_command, raise_pending_signal

__all__ = [
    "READY_TIMEOUT_S",
    "SERVE_MODES",
    "ModeContext",
    "ServeMode",
    "ServePlan",
    "check_plan",
    "free_port",
    "new_serve_raw",
    "run_serve_capture",
    "scan_server_log",
    "serve_mode",
    "serve_windows",
    "server_tmpdir",
    "warm_pass",
]
"""The serve API (``free_port``, ``server_tmpdir`` and ``scan_server_log`` come from
:mod:`max_profile.collect.server.server_process`)."""

READY_TIMEOUT_S = 900.0


def local_path(path: str) -> str:
    """``path`` made absolute where it names something on this machine; as given otherwise (a Hugging Face repo id)."""
    return os.path.abspath(path) if path and os.path.exists(path) else path


def local_arch_spec(spec: str) -> str:
    """A ``--custom-architectures`` spec (a package folder, or ``IMPORT_PATH:MODULE``) with its folder made absolute
    where it exists here (MAX appends the folder to ``sys.path`` as given, in the server's working folder)."""
    colon = import_path_form(spec)
    return local_path(spec) if colon is None else f"{local_path(colon[0])}:{colon[1]}"


@dataclass
class ServePlan:
    model_path: str
    devices: str
    mode: str
    duration_s: float
    port: int
    metrics_port: int
    custom_architectures: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    warm: bool = True
    prompt: str = "I believe the meaning of life is"
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
    profiling_mode: str = "auto"
    """MODULAR_ENABLE_PROFILING in the kernel modes: ``on`` carries MAX's scheduler ranges (the phases; it shares
    the compile cache with ``max-profile run --kernels nvtx-log``); ``detailed`` adds Python spans (another compile);
    ``off`` has no ranges (kernels are not split by phase). ``auto``: ``on`` where MAX can use it, else ``off``."""

    def __post_init__(self) -> None:
        # The server runs in a folder of its own (its TMPDIR and log): a model folder or custom-architecture package
        # named relative to here would not be found there (MAX: "No module named ...").
        self.model_path = local_path(self.model_path)
        self.custom_architectures = [local_arch_spec(s) for s in self.custom_architectures]

    def resolved_profiling_mode(self) -> str:
        if self.profiling_mode != "auto":
            return self.profiling_mode
        return "on" if max_profiling_usable(self.devices) else "off"

    @property
    def spec(self) -> ServeMode:
        """This plan's mode, from the registry (:data:`SERVE_MODES`)."""
        return serve_mode(self.mode)

    def reference_window(self) -> bool:
        """Whether an untraced reference window runs before the recorded ones (a mode that can measure its recorder,
        unless ``--no-reference``)."""
        return self.reference and self.spec.reference

    def serve_command(self) -> list[str]:
        cmd = [
            *max_command(),
            "serve",
            "--model-path",
            self.model_path,
            "--devices",
            self.devices,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        for c in self.custom_architectures:
            cmd += ["--custom-architectures", c]
        chosen = {"--device-graph-capture", "--no-device-graph-capture"} & set(self.extra_args)
        if (self.spec.op_ranges or (self.spec.records_kernels and self.vendor != "nvidia")) and not chosen:
            cmd.append("--no-device-graph-capture")
        return cmd + list(self.extra_args)

    def device_graphs_forced(self) -> bool | None:
        """Device graph capture as the server's flags set it (True / False), or None: MAX decides (on for supported
        architectures on a GPU). The report then says what ran, from the trace."""
        cmd = self.serve_command()
        if "--no-device-graph-capture" in cmd:
            return False
        return True if "--device-graph-capture" in cmd else None

    def warm_command(self) -> list[str]:
        cmd = [*max_command(), "warm-cache", "--model-path", self.model_path, "--devices", self.devices]
        for c in self.custom_architectures:
            cmd += ["--custom-architectures", c]
        return cmd

    def describe(self, width: int | None = None) -> str:
        """The plan, one ``label  value`` line per part, wrapped at the terminal's width (or ``width``)."""
        lines = [
            f"model        {self.model_path} on {self.devices}",
            f"capture      {self.mode}, {self.duration_s:g} s window, concurrency-1 load on /v1/completions (stream, "
            f"{self.max_tokens} tokens/request)",
            f"ports        API {self.port}, metrics {self.metrics_port}",
        ]
        if self.warm:
            lines.append("warm pass    " + " ".join(self.warm_command()))
        lines += self.spec.plan_lines(self)
        lines.append(
            "cost         a cold compile takes minutes (about 2 min per shape on 2 CPU cores, 3.5 min on an H200); "
            "warm: ~10 s to /health, "
            f"then {self.duration_s:g} s of capture"
        )
        return fit_to_terminal("\n".join(lines), width, indent=" " * 13)


def _server_env(plan: ServePlan, tmp: Path, extra: dict[str, str]) -> dict[str, str]:
    env = clean_child_env(
        {
            "TMPDIR": str(tmp),
            "MAX_SERVE_METRICS_ENDPOINT_PORT": str(plan.metrics_port),
            # /metrics on its port (MAX's remote telemetry off: OTEL_SDK_DISABLED stops egress, not the local pull
            # surface)
            "MAX_SERVE_DISABLE_TELEMETRY": "0",
            "OTEL_SDK_DISABLED": "true",
            "HF_HUB_OFFLINE": "1",
            # MAX's compile-cache log into the server log: the start-up profile reads each graph's cache hit or miss
            # there
            "MODULAR_ENABLE_CACHE_LOGGING": "1",
            "MODULAR_ENABLE_PROFILING": plan.resolved_profiling_mode()
            if plan.spec.records_kernels
            else os.environ.get("MODULAR_ENABLE_PROFILING", "off"),
        }
    )
    if env["MODULAR_ENABLE_PROFILING"] != "off":  # on a CUDA 13 GPU: CUDA 12's NVTX v2 library from its wheel
        env.update(profiling_library_env(plan.devices))
    env.update(extra)
    return env


def check_plan(plan: ServePlan) -> None:
    """Everything that can be said wrong about a plan before anything starts (exit 2)."""
    check_model_folder(plan.model_path)
    if plan.mode not in SERVE_MODES:
        raise InputError(f"unknown --mode {plan.mode!r}: use {' or '.join(SERVE_MODES)}")
    if not plan.duration_s > 0:
        raise InputError("--duration must be > 0 seconds")
    if plan.spec.op_ranges and plan.resolved_profiling_mode() == "off":
        if plan.profiling_mode == "off":
            raise InputError(f"--mode {plan.mode} records MAX's op ranges: leave --profiling-mode auto (or on)")
        raise ToolMissingError(f"--mode {plan.mode} on {plan.devices}: {MAX_GPU_NVTX_PROBLEM}; fix: {NVTX_V2_FIX}")
    if not plan.concurrency or any(c < 1 for c in plan.concurrency):
        raise InputError("--concurrency needs levels >= 1 (e.g. 1,4,16)")
    if len(plan.concurrency) > 1 and not plan.spec.sweeps:
        sweeping = " or ".join(name for name, m in SERVE_MODES.items() if m.sweeps)
        raise InputError(
            f"--mode {plan.mode} records one window per server: sweep with --mode {sweeping}, or give one --concurrency"
        )
    for port in (plan.port, plan.metrics_port):
        if port_in_use(port):
            raise InputError(
                f"port {port} is already in use on 127.0.0.1: pick another --port (or leave it out for a free one)"
            )


def run_serve_capture(
    plan: ServePlan,
    *,
    confirm: bool | Callable[[ServePlan], bool],
    progress: Callable[[str], None] = lambda m: None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    artifacts_dir: str | None = None,
) -> RawCapture:
    """Run the plan (see the module docstring) and return what it recorded.

    Bad plans raise :class:`InputError`, a missing profiler :class:`ToolMissingError`, a server or
    profiler that fails :class:`CaptureError`; nothing is left running in any case.
    """

    check_plan(plan)
    env = detect_environment(check_tools=False)
    tool = _profiler_for(plan.spec, env.vendor)
    if plan.spec.records_kernels and plan.profiling_mode == "auto" and plan.resolved_profiling_mode() == "off":
        progress(
            f"MODULAR_ENABLE_PROFILING=off: {MAX_GPU_NVTX_PROBLEM}; kernels are recorded but not split by phase "
            f"({NVTX_V2_FIX})"
        )
    ok = confirm(plan) if callable(confirm) else confirm
    if not ok:
        raise InputError("not confirmed: nothing was started (pass --yes, or confirm=True in the API)")
    preflight = preflight_gate(plan.custom_architectures, plan.model_path, serve=True, progress=progress)
    with server_tmpdir() as tmp:
        if plan.warm:
            warm_pass(plan, tmp, ready_timeout_s, progress)
        recorder, dest = plan.spec.make_recorder(
            plan, ModeContext(env, tmp, tool, ready_timeout_s, progress, artifacts_dir)
        )
        raw = new_serve_raw(plan, env, preflight)
        return serve_windows(plan, recorder, raw, tmp, ready_timeout_s, progress, dest)


@dataclass(frozen=True)
class ModeContext:
    """What a mode's recorder factory gets besides the plan: the machine, the server's TMPDIR, the mode's profiler
    binary (checked), the /health timeout, progress lines and where artifacts go."""

    env: Environment
    tmp: Path
    tool: str | None
    ready_timeout_s: float
    progress: Callable[[str], None]
    artifacts_dir: str | None


def _utilization_recorder(plan: ServePlan, ctx: ModeContext) -> tuple[ServeRecorder, str | None]:
    return UtilizationRecorder(), ctx.artifacts_dir


def _kernels_recorder(plan: ServePlan, ctx: ModeContext) -> tuple[ServeRecorder, str | None]:
    return WorkerKernelRecorder(
        ctx.tmp,
        cupti=ctx.env.vendor == "nvidia",
        profiling=plan.resolved_profiling_mode(),
        progress=ctx.progress,
        record_share=plan.record_share,
        slice_s=plan.record_slice_s,
    ), ctx.artifacts_dir


def _ops_recorder(plan: ServePlan, ctx: ModeContext) -> tuple[ServeRecorder, str | None]:
    """The kernels mode's worker recording with MAX's op ranges kept beside CUPTI's kernels (the whole window: an op
    table of slices would miss the ops between them); without CUPTI the ops are the work (as --kernels nvtx-log)."""
    return WorkerKernelRecorder(
        ctx.tmp,
        cupti=ctx.env.vendor == "nvidia",
        profiling=plan.resolved_profiling_mode(),
        progress=ctx.progress,
        ops_beside_kernels=True,
    ), ctx.artifacts_dir


def _nsys_recorder(plan: ServePlan, ctx: ModeContext) -> tuple[ServeRecorder, str | None]:
    """nsys keeps its report: in a folder of its own when none is given."""

    assert ctx.tool is not None
    dest = _artifacts_folder(ctx.artifacts_dir, nsys_session_name())
    return NsysRecorder(ctx.tool, dest, _server_env(plan, ctx.tmp, {}), ctx.progress), str(dest)


def _rocprof_recorder(plan: ServePlan, ctx: ModeContext) -> tuple[ServeRecorder, str | None]:
    """rocprofv3's collection period opens by the clock: a probe pass first measures launch → /health (R2)."""
    assert ctx.tool is not None
    dest = _artifacts_folder(ctx.artifacts_dir, f"max-profile-rocprof-{os.getpid()}-{int(time.time())}")

    def measure_ready() -> float:
        plain = plan.serve_command()
        ctx.progress("pass 2: measuring launch → /health (R2): " + " ".join(plain))
        probe = ServerProcess(plain, _server_env(plan, ctx.tmp, {}), ctx.tmp)
        try:
            return wait_ready(probe, plan.port, ctx.ready_timeout_s, ctx.progress)
        finally:
            probe.stop()

    return RocprofRecorder(ctx.tool, dest, plan.duration_s, measure_ready, ctx.progress), str(dest)


def _server_line(plan: ServePlan) -> list[str]:
    return ["server       " + " ".join(plan.serve_command())]


def _kernels_lines(plan: ServePlan) -> list[str]:
    lines = []
    if plan.vendor == "nvidia":  # CUPTI in the worker: recorded in slices, switched per window
        lines.append(
            "recording    CUPTI in the model worker, every kernel (device graphs' included): "
            + (
                f"slices of {plan.record_slice_s:g} s, {100 * plan.record_share:.0f} % of each window (--record-share "
                "1: all of it)"
                if plan.record_share < 1
                else "the whole window"
            )
        )
        if plan.reference_window():
            lines.append(
                f"reference    one {plan.duration_s:g} s window without the recorder first: its cost on this server "
                "(--no-reference skips it)"
            )
    return lines + _server_line(plan)


def _ops_lines(plan: ServePlan) -> list[str]:
    joined = (
        "joined to the kernels CUPTI records in the model worker (the whole window)"
        if plan.vendor == "nvidia"
        else "the ops are the work here (no GPU kernel tracer)"
    )
    return [
        f"recording    MAX's op ranges (MODULAR_ENABLE_PROFILING={plan.resolved_profiling_mode()}, device graphs off: "
        f"every op launched eagerly), {joined}",
        "mode cost    a compile key of its own, and a longer host step (2.6x on an H200); --mode kernels measures the "
        "server's own speed",
        *_server_line(plan),
    ]


def _nsys_lines(plan: ServePlan) -> list[str]:
    return [
        "server       nsys launch --session-new=max-profile-<pid>-<random> --trace=cuda,nvtx --cuda-graph-trace=node "
        + " ".join(plan.serve_command()),
        "window       nsys start --session=… -o <artifacts>/serve  …  nsys stop; nsys export --type sqlite; nsys "
        "shutdown",
    ]


def _rocprof_lines(plan: ServePlan) -> list[str]:
    return [
        "pass 2       " + " ".join(plan.serve_command()) + "   (measures R2 = launch → /health 200, then stops)",
        "pass 3       rocprofv3 --kernel-trace --marker-trace -f csv --collection-period (R2+10):"
        f"{plan.duration_s:g}:1 -- " + " ".join(plan.serve_command()),
    ]


@dataclass(frozen=True)
class ServeMode:
    """One ``serve --mode``: what it records, what it needs, how it changes the server, its recorder and its plan lines.
    The lifecycle asks these; no code outside :data:`SERVE_MODES` branches on a mode's name."""

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
    make_recorder: Callable[[ServePlan, ModeContext], tuple[ServeRecorder, str | None]]
    plan_lines: Callable[[ServePlan], list[str]]
    """What the printed plan says of the mode's recording and server command."""
    op_ranges: bool = False
    """Needs MAX's op ranges (MODULAR_ENABLE_PROFILING=on, checked before anything starts) with every op launched
    eagerly: device graphs off on every vendor (a graph replay runs its ops without their ranges)."""


SERVE_MODES: dict[str, ServeMode] = {
    m.name: m
    for m in (
        ServeMode(
            "utilization",
            "GPU samples, client latencies and the server's /metrics (no tracer)",
            records_kernels=False,
            sweeps=True,
            reference=False,
            load_ahead=True,
            tool=None,
            make_recorder=_utilization_recorder,
            plan_lines=_server_line,
        ),
        ServeMode(
            "kernels",
            "the model worker's kernels (CUPTI on NVIDIA) and MAX's op ranges, split by phase",
            records_kernels=True,
            sweeps=True,
            reference=True,
            load_ahead=True,
            tool=None,
            make_recorder=_kernels_recorder,
            plan_lines=_kernels_lines,
        ),
        ServeMode(
            "ops",
            "MAX's ops joined to the kernels they launched (profiling mode, device graphs off)",
            records_kernels=True,
            sweeps=False,
            reference=False,
            load_ahead=True,
            tool=None,
            make_recorder=_ops_recorder,
            plan_lines=_ops_lines,
            op_ranges=True,
        ),
        ServeMode(
            "nsys",
            "the server under Nsight Systems (the timing-faithful kernel capture)",
            records_kernels=True,
            sweeps=False,
            reference=False,
            load_ahead=True,
            tool=("nsys", "nvidia", "NVIDIA"),
            make_recorder=_nsys_recorder,
            plan_lines=_nsys_lines,
        ),
        ServeMode(
            "rocprof",
            "the server under rocprofv3 (AMD)",
            records_kernels=True,
            sweeps=False,
            reference=False,
            load_ahead=False,
            tool=("rocprofv3", "amd", "AMD"),
            make_recorder=_rocprof_recorder,
            plan_lines=_rocprof_lines,
        ),
    )
}
"""The serve modes, by name (``--mode``)."""
MODES = tuple(SERVE_MODES)


def serve_mode(name: str) -> ServeMode:
    """The registry entry of ``--mode name`` (an :class:`InputError` naming the modes for another name)."""
    try:
        return SERVE_MODES[name]
    except KeyError:
        raise InputError(f"unknown --mode {name!r}: use {' or '.join(SERVE_MODES)}") from None


def serve_windows(
    plan: ServePlan,
    recorder: ServeRecorder,
    raw: RawCapture,
    tmp: Path,
    ready_timeout_s: float,
    progress: Callable[[str], None],
    artifacts_dir: str | None,
    record: Callable[[int], bool] = lambda window: True,
) -> RawCapture:
    """The one server lifecycle: start (the recorder's command and environment), fail fast, /health, then one window per
    concurrency level (load, metrics, GPU samples, the recorder), teardown; what was recorded goes into ``raw``.

    ``record(window)`` (windows count from 1): whether the recorder runs in that window; a window it skips measures the
    same server untraced (the tracer's cost, A/B on one server: ``benchmarks/serve_ab.py``)."""
    cmd = recorder.command(plan.serve_command())

    cache_was_empty = not any("/.max_cache/" in p for p in cache_files(modular_cache_dir()))
    progress("starting: " + " ".join(cmd))
    server = ServerProcess(cmd, _server_env(plan, tmp, recorder.env()), tmp)
    recorder.launched(server.started)
    raw.serve = ServeRun(mode=plan.mode, port=plan.port, commands=[cmd])
    metrics_url = f"http://127.0.0.1:{plan.metrics_port}/metrics"
    windows: list[ServerWindow] = []
    target = ServerTarget("127.0.0.1", plan.port, plan.model_path, plan.prompt, plan.max_tokens)
    ready_s: float | None = None
    try:
        ready_s = wait_ready(server, plan.port, ready_timeout_s, progress)
        raw.startup = _serve_startup(
            plan, server, ready_s, raw.environment.max_version, recorder.env(), cache_was_empty
        )
        progress(
            f"/health 200 after {ready_s:.1f} s; load and {plan.duration_s:g} s capture window"
            + (f" per level ({', '.join(map(str, plan.concurrency))})" if len(plan.concurrency) > 1 else "")
        )
        recorder.ready(server, progress)
        # (concurrency, reference): the untraced reference window first, before the recorder ever ran in this server
        reference_first = plan.reference_window() and recorder.switched_per_window
        schedule = ([(plan.concurrency[0], True)] if reference_first else []) + [(c, False) for c in plan.concurrency]
        index = 0
        for concurrency, reference in schedule:
            traced = False if reference else record(index := index + 1)
            window = ServerWindow(
                target,
                concurrency,
                plan.duration_s,
                metrics_url,
                window_recorders(True, "serve window"),
                traced=traced if plan.spec.reference else None,
                reference=reference,
                tracer=recorder.window(index, server, progress) if traced else None,
            )
            windows.append(window)
            window.start_load(ahead=plan.spec.load_ahead)
            window.open()
            _watch_window(server, time.monotonic() + plan.duration_s)
            window.close()
            window.finish()
            window.fill(raw)
            if reference:
                progress(f"reference window, recorder off (concurrency {concurrency}): {window.summary()}")
            elif len(plan.concurrency) > 1:
                progress(
                    f"window {index} (concurrency {concurrency}{', recorded' if traced else ''}): {window.summary()}"
                )
        saved = _keep_artifacts(tmp, artifacts_dir)
    finally:
        for w in windows:
            w.abort()
        try:
            recorder.close()
        finally:
            server.stop()
            if artifacts_dir and recorder.reads_after_teardown:
                _keep_artifacts(tmp, artifacts_dir)
    if recorder.reads_after_teardown:
        recorder.read_after_teardown(raw, windows[-1].span)
        saved = {"server.log": str(Path(artifacts_dir) / "server.log")} if artifacts_dir else {}
    return _finish_raw(raw, plan, windows, ready_s, saved.get("server.log"), [*recorder.artifacts(), *saved.values()])


def _serve_startup(
    plan: ServePlan,
    server: ServerProcess,
    ready_s: float,
    max_version: str | None,
    extra_env: dict[str, str],
    cache_was_empty: bool,
) -> StartupProfile | None:
    """Launch to /health 200 from the server's own log (see
    :func:`max_profile.collect.probes.startup.serve_startup`)."""

    profiling = _server_env(plan, server.workdir, extra_env).get("MODULAR_ENABLE_PROFILING", "off")
    common = {
        "model_path": plan.model_path,
        "devices": plan.devices,
        "profiling": profiling,
        "device_graphs": plan.device_graphs_forced(),
        "max_batch_size": None,
        "max_length": None,
        "encoding": None,
        "custom_architectures": list(plan.custom_architectures),
    }
    weights = read_model_weights(plan.model_path)
    cache = modular_cache_dir()
    return serve_startup(
        server.log_text(),
        launched_unix=server.started_unix,
        ready_unix=server.started_unix + ready_s,
        key=compile_key(**common, max_version=max_version),  # type: ignore[arg-type]
        warm_command=warm_cache_command(**common),  # type: ignore[arg-type]
        weight_bytes=sum(g.bytes for g in weights.groups.values()) if weights and weights.groups else None,
        devices=1,
        cache=cache,
        cache_was_empty=cache_was_empty,
    )


def new_serve_raw(plan: ServePlan, env: Environment, preflight: list[PreflightResult]) -> RawCapture:
    profiling = plan.resolved_profiling_mode() if plan.spec.records_kernels else None
    capture = Capture(
        started_unix_s=time.time(),
        target="max serve",
        model_path=plan.model_path,
        devices=plan.devices,
        device_graph_capture=plan.device_graphs_forced(),
        profiling_mode=profiling,
        collectors=[f"serve:{plan.mode}"],
        model_config=read_model_config(plan.model_path),
        model_weights=read_model_weights(plan.model_path),
        phase_markers="MAX scheduler ranges" if profiling not in (None, "off") else None,
        workload=Workload(
            prompt=plan.prompt, max_new_tokens=plan.max_tokens, custom_architectures=list(plan.custom_architectures)
        ),
    )
    return RawCapture(environment=env, capture=capture, preflight=list(preflight), slo_ms=dict(plan.slo_ms))


def _finish_raw(
    raw: RawCapture,
    plan: ServePlan,
    windows: list[ServerWindow],
    ready_s: float | None,
    log_copy: str | None,
    artifacts: list[str],
) -> RawCapture:
    assert raw.serve is not None
    raw.serve = ServeRun(
        mode=raw.serve.mode,
        port=raw.serve.port,
        time_to_ready_s=ready_s,
        commands=raw.serve.commands,
        server_log=log_copy,
    )
    raw.capture.ended_unix_s = time.time()
    measured = [w for w in windows if not w.reference] or windows  # the reference window is only the tracer's yardstick
    raw.window_ns = (measured[0].span[0], measured[-1].span[1])
    raw.requests = [r for w in measured for r in w.records]
    raw.load_windows = [w.load_window() for w in windows]
    raw.artifacts = [*raw.artifacts, *artifacts]
    if raw.samples:  # each window filled its GPU samples and host load (the last, a measured one, wins) as it ended
        raw.utilization_unavailable = None  # some windows sampled; a window that could not is said by its absence
    elif raw.utilization_unavailable is None:
        raw.utilization_unavailable = Unavailable("GPU sampling did not run")
    return raw


def _artifacts_folder(artifacts_dir: str | None, name: str) -> Path:
    dest = Path(artifacts_dir) if artifacts_dir else Path.cwd() / name
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def _profiler_for(mode: ServeMode, vendor: str) -> str | None:
    """The profiler binary a mode needs, checked before anything starts (wrong vendor, missing tool)."""
    if mode.tool is None:
        return None
    tool, want, label = mode.tool
    if vendor != want:
        others = [f"--mode {m.name}" for m in SERVE_MODES.values() if m.tool is not None and m.tool[1] == vendor]
        raise InputError(
            f"--mode {mode.name} needs an {label} GPU; this machine has {vendor if vendor != 'none' else 'no GPU'} "
            f"(use --mode kernels for MAX's op ranges on any device{', or ' + others[0] if others else ''})"
        )
    return require_tool(tool, f"--mode {mode.name}")


def warm_pass(plan: ServePlan, tmp: Path, timeout_s: float, progress: Callable[[str], None]) -> None:
    progress("warm pass (fills the compile cache): " + " ".join(plan.warm_command()))
    warm = subprocess.Popen(
        plan.warm_command(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=_server_env(plan, tmp, {}),
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )
    try:
        raise_pending_signal()
        _, err = warm.communicate(timeout=timeout_s)
    except BaseException:
        kill_group(warm)
        raise
    if warm.returncode != 0:
        lines = [ln for ln in err.decode(errors="replace").strip().splitlines() if ln.strip()]
        tail = [ln for ln in lines if EARLY_ERRORS.search(ln)][-3:] or lines[-3:]
        raise CaptureError(f"the warm pass failed (exit {warm.returncode}): " + " | ".join(tail))


def _watch_window(server: ServerProcess, until: float) -> None:
    """Sleep until ``until`` (monotonic), failing at once if the server dies."""
    while time.monotonic() < until:
        raise_pending_signal()
        if not server.alive():
            raise CaptureError(
                f"the server died during the capture window (exit {server.proc.returncode}): "
                + " | ".join(server.early_errors() or server.log_text().strip().splitlines()[-3:])
            )
        time.sleep(0.1)


def _keep_artifacts(tmp: Path, artifacts_dir: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    if not artifacts_dir:
        return out
    dest = Path(artifacts_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("server.log",):
        src = tmp / name
        if src.exists() and src.stat().st_size > 0:
            shutil.copy2(src, dest / name)
            out[name] = str(dest / name)
    return out
