"""The serve modes as a registry (:data:`SERVE_MODES`: each mode's recorder, plan lines and needs), and the plan
resolved against it once, before anything starts (:func:`resolve_plan`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from max_profile.errors import InputError, ToolMissingError
from max_profile.serve.plan import ModeContext, ResolvedServe, ServeMode, ServePlan

if TYPE_CHECKING:
    from max_profile.collect.server.serve_recorders import ServeRecorder
from max_profile.util.procs import clean_child_env, max_command


def _utilization_recorder(r: ResolvedServe, ctx: ModeContext) -> tuple[ServeRecorder, str | None]:
    from max_profile.collect.server.serve_recorders import UtilizationRecorder

    return UtilizationRecorder(), ctx.artifacts_dir


def _kernels_recorder(r: ResolvedServe, ctx: ModeContext) -> tuple[ServeRecorder, str | None]:
    from max_profile.collect.server.serve_recorders import WorkerKernelRecorder

    return WorkerKernelRecorder(
        ctx.tmp,
        cupti=ctx.env.vendor == "nvidia",
        profiling=r.profiling,
        progress=ctx.progress,
        record_share=r.plan.record_share,
        slice_s=r.plan.record_slice_s,
        window_recordings=ctx.window_recordings,
        settle_s=ctx.settle_s,
    ), ctx.artifacts_dir


def _ops_recorder(r: ResolvedServe, ctx: ModeContext) -> tuple[ServeRecorder, str | None]:
    """The kernels mode's worker recording with MAX's op ranges kept beside CUPTI's kernels (the whole window: an op
    table of slices would miss the ops between them); without CUPTI the ops are the work (as --kernels nvtx-log)."""
    from max_profile.collect.server.serve_recorders import WorkerKernelRecorder

    return WorkerKernelRecorder(
        ctx.tmp,
        cupti=ctx.env.vendor == "nvidia",
        profiling=r.profiling,
        progress=ctx.progress,
        ops_beside_kernels=True,
        settle_s=ctx.settle_s,
    ), ctx.artifacts_dir


def _artifacts_folder(artifacts_dir: str | None, name: str) -> Path:
    dest = Path(artifacts_dir) if artifacts_dir else Path.cwd() / name
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def _nsys_recorder(r: ResolvedServe, ctx: ModeContext) -> tuple[ServeRecorder, str | None]:
    """nsys keeps its report: in a folder of its own when none is given."""
    from max_profile.collect.server.serve_profilers import nsys_session_name
    from max_profile.collect.server.serve_recorders import NsysRecorder

    assert r.tool is not None
    dest = _artifacts_folder(ctx.artifacts_dir, nsys_session_name())
    return NsysRecorder(r.tool, dest, r.env_for(ctx.tmp, {}), ctx.progress), str(dest)


def _rocprof_recorder(r: ResolvedServe, ctx: ModeContext) -> tuple[ServeRecorder, str | None]:
    """rocprofv3's collection period opens by the clock: a probe pass first measures launch → /health (R2)."""
    from max_profile.collect.server.serve_recorders import RocprofRecorder
    from max_profile.collect.server.server_process import ServerProcess, wait_ready

    assert r.tool is not None
    dest = _artifacts_folder(ctx.artifacts_dir, f"max-profile-rocprof-{os.getpid()}-{int(time.time())}")

    def measure_ready() -> float:

        ctx.progress("pass 2: measuring launch → /health (R2): " + " ".join(r.serve_command))
        probe = ServerProcess(list(r.serve_command), r.env_for(ctx.tmp, {}), ctx.tmp)
        try:
            return wait_ready(probe, r.plan.port, ctx.ready_timeout_s, ctx.progress)
        finally:
            probe.stop()

    return RocprofRecorder(r.tool, dest, r.plan.duration_s, measure_ready, ctx.progress), str(dest)


def _server_line(r: ResolvedServe) -> list[str]:
    return ["server       " + " ".join(r.serve_command)]


def _kernels_lines(r: ResolvedServe) -> list[str]:
    p = r.plan
    lines = []
    if p.vendor == "nvidia":  # CUPTI in the worker: recorded in slices, switched per window
        lines.append(
            f"phases       the worker hook's passes (prefill / decode, batch, tokens); MODULAR_ENABLE_PROFILING="
            f"{r.profiling}" + (" (the server compiles and runs as a plain max serve)" if r.profiling == "off" else "")
        )
        lines.append(
            "recording    CUPTI in the model worker, every kernel (device graphs' included): "
            + (
                f"slices of {p.record_slice_s:g} s, {100 * p.record_share:.0f} % of each window (--record-share "
                "1: all of it)"
                if p.record_share < 1
                else "the whole window"
            )
        )
    elif r.profiling != "off":  # MAX's op ranges, logged only while a window records
        lines.append(
            f"recording    MAX's op ranges (MODULAR_ENABLE_PROFILING={r.profiling}) in the model worker, logged while "
            "a window records, and its passes"
        )
    if r.reference_window and (p.vendor == "nvidia" or r.profiling != "off"):
        lines.append(
            f"reference    one {p.duration_s:g} s window without the recorder first: its cost on this server "
            "(--no-reference skips it)"
        )
    return lines + _server_line(r)


def _ops_lines(r: ResolvedServe) -> list[str]:
    joined = (
        "joined to the kernels CUPTI records in the model worker (the whole window)"
        if r.plan.vendor == "nvidia"
        else "the ops are the work here (no GPU kernel tracer)"
    )
    return [
        f"recording    MAX's op ranges (MODULAR_ENABLE_PROFILING={r.profiling}, device graphs off: every op launched "
        f"eagerly), {joined}",
        "mode cost    a compile key of its own, and a longer host step (2.6x on an H200); --mode kernels measures the "
        "server's own speed",
        *_server_line(r),
    ]


def _nsys_lines(r: ResolvedServe) -> list[str]:
    return [
        "server       nsys launch --session-new=max-profile-<pid>-<random> --trace=cuda,nvtx --cuda-graph-trace=node "
        + " ".join(r.serve_command),
        "window       nsys start --session=… -o <artifacts>/serve  …  nsys stop; nsys export --type sqlite; nsys "
        "shutdown",
    ]


def _rocprof_lines(r: ResolvedServe) -> list[str]:
    return [
        "pass 2       " + " ".join(r.serve_command) + "   (measures R2 = launch → /health 200, then stops)",
        "pass 3       rocprofv3 --kernel-trace --marker-trace -f csv --collection-period (R2+10):"
        f"{r.plan.duration_s:g}:1 -- " + " ".join(r.serve_command),
    ]


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
            "the model worker's passes and kernels (CUPTI on NVIDIA; MAX's op ranges elsewhere), split by phase",
            records_kernels=True,
            sweeps=True,
            reference=True,
            load_ahead=True,
            tool=None,
            make_recorder=_kernels_recorder,
            plan_lines=_kernels_lines,
            worker_steps=True,
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
            worker_steps=True,
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


def serve_mode(name: str) -> ServeMode:
    """The registry entry of ``--mode name`` (an :class:`InputError` naming the modes for another name)."""
    try:
        return SERVE_MODES[name]
    except KeyError:
        raise InputError(f"unknown --mode {name!r}: use {' or '.join(SERVE_MODES)}") from None


def cupti_in_worker(plan: ServePlan, mode: ServeMode) -> bool:
    """Whether the mode's recorder records the model worker's kernels with CUPTI (the worker hook on NVIDIA)."""
    return mode.worker_steps and plan.vendor == "nvidia"


def profiling_of(plan: ServePlan, mode: ServeMode) -> str:
    """MODULAR_ENABLE_PROFILING of the plan's servers: the plan's choice in a kernel mode, else the user's own
    environment's. ``auto``: ``off`` where CUPTI records the worker's kernels and the mode needs no op ranges (the
    worker hook's steps split them by phase; MAX's ranges would cost every launch a range and the server a compile of
    its own), ``on`` where the op ranges are needed and MAX can use them."""
    from max_profile.collect.live.nvtx_log import max_profiling_usable

    if not mode.records_kernels:
        return os.environ.get("MODULAR_ENABLE_PROFILING", "off")
    if plan.profiling_mode != "auto":
        return plan.profiling_mode
    if cupti_in_worker(plan, mode) and not mode.op_ranges:
        return "off"
    return "on" if max_profiling_usable(plan.devices) else "off"


def spans_of(plan: ServePlan, mode: ServeMode) -> bool:
    """Whether the server sends MAX's spans to us: the plan's choice, else on unless the mode's worker hook stamps
    every pass itself."""
    return plan.spans if plan.spans is not None else not mode.worker_steps


def _check(plan: ServePlan, mode: ServeMode, profiling: str) -> None:
    """Everything that can be said wrong about a plan before anything starts (exit 2)."""
    from max_profile.collect.live.nvtx_log import MAX_GPU_NVTX_PROBLEM, NVTX_V2_FIX
    from max_profile.collect.server.server_process import port_in_use
    from max_profile.util.models import check_model_folder

    check_model_folder(plan.model_path)
    if not plan.duration_s > 0:
        raise InputError("--duration must be > 0 seconds")
    if mode.op_ranges and profiling == "off":
        if plan.profiling_mode == "off":
            raise InputError(f"--mode {mode.name} records MAX's op ranges: leave --profiling-mode auto (or on)")
        raise ToolMissingError(f"--mode {mode.name} on {plan.devices}: {MAX_GPU_NVTX_PROBLEM}; fix: {NVTX_V2_FIX}")
    if not plan.concurrency or any(c < 1 for c in plan.concurrency):
        raise InputError("--concurrency needs levels >= 1 (e.g. 1,4,16)")
    if len(plan.concurrency) > 1 and not mode.sweeps:
        sweeping = " or ".join(name for name, m in SERVE_MODES.items() if m.sweeps)
        raise InputError(
            f"--mode {mode.name} records one window per server: sweep with --mode {sweeping}, or give one --concurrency"
        )
    for port in (plan.port, plan.metrics_port):
        if port_in_use(port):
            raise InputError(
                f"port {port} is already in use on 127.0.0.1: pick another --port (or leave it out for a free one)"
            )


def check_plan(plan: ServePlan) -> None:
    """The plan's checks alone (exit 2 for a bad plan), as :func:`resolve_plan` makes them."""
    mode = serve_mode(plan.mode)
    _check(plan, mode, profiling_of(plan, mode))


def profiler_for(mode: ServeMode, vendor: str) -> str | None:
    """The profiler binary a mode needs, checked before anything starts (wrong vendor, missing tool)."""
    from max_profile.collect.probes.environment import require_tool

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


def serve_command(plan: ServePlan, mode: ServeMode) -> list[str]:
    """``max serve`` of the plan: its model and devices made absolute, on 127.0.0.1, device graphs off where the mode's
    tracer cannot see into them (unless the user's own flags say), the user's extra flags last."""
    cmd = [*max_command(), "serve", "--model-path", plan.model_path, "--devices", plan.devices]
    cmd += ["--host", "127.0.0.1", "--port", str(plan.port)]
    for c in plan.custom_architectures:
        cmd += ["--custom-architectures", c]
    chosen = {"--device-graph-capture", "--no-device-graph-capture"} & set(plan.extra_args)
    if (mode.op_ranges or (mode.records_kernels and plan.vendor != "nvidia")) and not chosen:
        cmd.append("--no-device-graph-capture")
    return cmd + list(plan.extra_args)


def warm_command(plan: ServePlan) -> list[str]:
    """``max warm-cache`` of the plan's model: fills the compile cache the server then reads."""
    cmd = [*max_command(), "warm-cache", "--model-path", plan.model_path, "--devices", plan.devices]
    for c in plan.custom_architectures:
        cmd += ["--custom-architectures", c]
    return cmd


def _server_env(plan: ServePlan, profiling: str) -> dict[str, str]:
    from max_profile.collect.live.nvtx_log import profiling_library_env

    env = clean_child_env(
        {
            "MAX_SERVE_METRICS_ENDPOINT_PORT": str(plan.metrics_port),
            # /metrics on its port (MAX's remote telemetry off: OTEL_SDK_DISABLED stops egress, not the local pull
            # surface)
            "MAX_SERVE_DISABLE_TELEMETRY": "0",
            "OTEL_SDK_DISABLED": "true",
            "HF_HUB_OFFLINE": "1",
            # MAX's compile-cache log into the server log: the start-up profile reads each graph's cache hit or miss
            "MODULAR_ENABLE_CACHE_LOGGING": "1",
            "MODULAR_ENABLE_PROFILING": profiling,
        }
    )
    if profiling != "off":  # on a CUDA 13 GPU: CUDA 12's NVTX v2 library from its wheel
        env.update(profiling_library_env(plan.devices))
    return env


def resolve_plan(plan: ServePlan, vendor: str, *, check_tool: bool = True) -> ResolvedServe:
    """The plan checked and resolved once on this machine (GPU ``vendor``): MAX's profiling mode, the server's
    environment and commands, the profiler binary (``check_tool``: found, else :class:`ToolMissingError`), the model's
    config and weights. Bad plans raise :class:`InputError` before anything starts."""
    from max_profile.collect.probes.model_files import read_model_config, read_model_weights

    mode = serve_mode(plan.mode)
    profiling = profiling_of(plan, mode)
    _check(plan, mode, profiling)
    cmd = serve_command(plan, mode)
    graphs = False if "--no-device-graph-capture" in cmd else True if "--device-graph-capture" in cmd else None
    return ResolvedServe(
        plan=plan,
        mode=mode,
        profiling=profiling,
        server_env=_server_env(plan, profiling),
        serve_command=tuple(cmd),
        warm_command=tuple(warm_command(plan)),
        device_graphs=graphs,
        tool=profiler_for(mode, vendor) if check_tool else None,
        spans=spans_of(plan, mode),
        model_config=read_model_config(plan.model_path),
        model_weights=read_model_weights(plan.model_path),
    )
