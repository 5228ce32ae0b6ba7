"""One profiled generation, as the ``run``, ``demo``, ``startup`` and ``kernels --backend cupti|nvtx-log`` verbs plan
it.

    plan = RunPlan(model_path="M", devices="gpu", kernels="auto", batch_size=64, max_new_tokens=128)
    check_plan(plan)                              # bad numbers fail here, before anything loads (exit 2)
    prepared = prepare_run(plan, progress)        # the machine, the devices, auto resolved once (may re-exec for op
    ranges) raw = profile_generation(plan, prepared, progress)   # preflight, load (start-up recorded), warm-up, one
    profiled generation

The CLI only parses flags into a :class:`RunPlan` and prints what comes back. Equivalent from Python: ``with
profile(pipeline, kernels=...)`` around ``generate`` (this module does that after loading the model itself).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from max_profile.collect.live.nvtx_log import restart_with_nvtx_log
from max_profile.collect.live.recorders import check_kernel_sampling
from max_profile.collect.probes.environment import detect_environment
from max_profile.errors import CaptureError, InputError, ToolMissingError
from max_profile.model import Capture, Environment, RawCapture, Workload
from max_profile.model.kernel_modes import KERNEL_MODES, KernelMode, kernel_mode, place_of, resolve_kernel_mode
from max_profile.model.tags import Collector, TargetKind
from max_profile.preflight import preflight_gate
from max_profile.runner import LoadFailed, LoadSettings, generate, load_and_warm_up
from max_profile.session import attached_nvtx_log, profile
from max_profile.tinymodel import ModelShape, build_tiny_llama
from max_profile.util.devices import resolve_devices
from max_profile.util.files import cache_dir

Progress = Callable[[str], None]


@dataclass
class RunPlan:
    """What one profiled generation asks for (the generation flags of ``run``; ``demo`` and ``startup`` share them)."""

    model_path: str
    devices: str | None = None
    """As asked (``gpu``, ``cpu``, ``gpu:1``...); None: a GPU when one is visible."""
    kernels: str = "auto"
    """As asked: off, cupti, nvtx-log, auto (resolved by :func:`prepare_run`)."""
    batch_size: int = 1
    prompt: str = "I believe the meaning of life is"
    max_new_tokens: int = 64
    warmup: int = 4
    interval_s: float = 0.1
    max_length: int | None = None
    quantization_encoding: str | None = None
    device_graph_capture: bool | None = None
    custom_architectures: list[str] = field(default_factory=list)
    kernel_share: float | None = None
    """The share of steps CUPTI records (None: the session's default)."""
    argv: list[str] = field(default_factory=lambda: sys.argv[1:])
    """The command line to re-run with (MAX's op ranges need the NVTX library loaded at process start)."""


@dataclass(frozen=True)
class PreparedRun:
    """The plan resolved on this machine: its environment, the devices, the kernel recorder and device graphs."""

    env: Environment
    devices: str
    kernels: str
    device_graph_capture: bool | None


def check_plan(plan: RunPlan) -> None:
    """Everything that can be said wrong about the numbers before anything starts (exit 2)."""
    if plan.max_new_tokens < 1:
        raise InputError("--max-new-tokens must be >= 1")
    if not plan.interval_s > 0:
        raise InputError("--interval must be > 0 seconds (0 makes the GPU recorder busy-loop)")
    if plan.kernel_share is not None:
        check_kernel_sampling(plan.kernel_share, share_name="--kernel-share")
    if plan.batch_size < 1:
        raise InputError("--batch-size must be >= 1")
    if plan.warmup < 0:
        raise InputError("--warmup must be >= 0")


def ensure_op_range_log(plan: RunPlan, devices: str, progress: Progress) -> None:
    """MAX's op ranges need the NVTX log library loaded at process start: re-run this command once with it."""
    if attached_nvtx_log():
        return
    progress("restarting with the NVTX log library (MODULAR_ENABLE_PROFILING=on: first run of a shape recompiles)")
    restart_with_nvtx_log([sys.executable, "-m", "max_profile", *plan.argv], devices)


def prepare_run(plan: RunPlan, progress: Progress, op_ranges_on_cpu: bool = True) -> PreparedRun:
    """The checks every generation verb shares: numbers, environment, devices, the kernel mode (auto resolved once).

    ``op_ranges_on_cpu``: with ``--kernels auto`` and no GPU, record MAX's op ranges (the NVTX log) when this machine
    can build the injection library; else go on without a breakdown and say why.
    """
    check_plan(plan)
    env = detect_environment(check_tools=True)
    devices = resolve_devices(plan.devices, env.vendor)
    mode = kernel_mode(plan.kernels)
    place = place_of(env.vendor, devices)
    choices = mode.choices.get(place, ())
    op_ranges = attached_nvtx_log() is not None
    # a mode that needs MAX's op ranges, or auto on the CPU (its first choice there), restarts with the NVTX library
    first_needs_ranges = bool(choices) and KERNEL_MODES[choices[0]].op_ranges
    if not op_ranges and first_needs_ranges and (len(choices) == 1 or (op_ranges_on_cpu and place == "cpu")):
        try:  # re-runs this command with the NVTX log library (returns only when it is already loaded)
            ensure_op_range_log(plan, devices, progress)
            op_ranges = True
        except ToolMissingError as exc:
            if len(choices) == 1:
                raise
            progress(f"no op breakdown on the CPU ({exc}); profiling steps and utilization only")
    try:
        resolved = resolve_kernel_mode(mode, place, op_ranges)
    except InputError as exc:
        raise InputError(f"{exc} ({env.vendor_reason}): nothing could be recorded") from None
    if resolved is not mode and mode.records_kernels:
        progress(f"--kernels {mode.name}: {resolved.name} records on {devices} ({resolved.records})")
    graphs = device_graphs_for(resolved, devices, plan.device_graph_capture)
    if graphs is False and plan.device_graph_capture is None:
        progress("device graphs off: MAX's op ranges (--kernels nvtx-log) are not emitted for graph replays")
    return PreparedRun(env=env, devices=devices, kernels=resolved.name, device_graph_capture=graphs)


def device_graphs_for(mode: KernelMode, devices: str, requested: bool | None) -> bool | None:
    """Device graph capture for a run: the user's choice, else MAX's (None), except with MAX's op ranges on a GPU
    (--kernels nvtx-log): they are host-side ranges around each op's launch, and a graph replay has none."""
    if requested is not None:
        return requested
    return False if mode.graphs_off_on_gpu and devices != "cpu" else None


def load_settings(plan: RunPlan, prepared: PreparedRun, model_path: str | None = None) -> LoadSettings:
    return LoadSettings(
        model_path=model_path or plan.model_path,
        devices=prepared.devices,
        max_length=plan.max_length,
        max_batch_size=plan.batch_size,
        custom_architectures=list(plan.custom_architectures),
        quantization_encoding=plan.quantization_encoding,
        device_graph_capture=prepared.device_graph_capture,
        prompt=plan.prompt,
        warmup_tokens=plan.warmup,
    )


def profile_generation(
    plan: RunPlan, prepared: PreparedRun, progress: Progress, model_path: str | None = None
) -> RawCapture:
    """Preflight, load (recording where the start-up time goes), warm up, profile one generation: the raw capture."""
    settings = load_settings(plan, prepared, model_path)
    path = settings.model_path
    t = time.perf_counter()
    model, startup, preflight = load_and_warm_up(
        settings,
        progress,
        prepared.env.max_version,
        preflight=lambda: preflight_gate(settings.custom_architectures, path, progress=progress),
    )
    progress(
        f"loaded and warmed up in {time.perf_counter() - t:.1f} s ({type(model.pipeline).__name__}; compile cache "
        f"{startup.cache})"
    )
    try:
        progress(f"profiling a generation of {plan.max_new_tokens} tokens (kernels: {prepared.kernels})")
        share = {} if plan.kernel_share is None else {"kernel_share": plan.kernel_share}
        with profile(
            model.pipeline,
            kernels=prepared.kernels,
            sample_interval_s=plan.interval_s,
            model_path=path,  # type: ignore[arg-type]
            devices=prepared.devices,
            environment=prepared.env,
            **share,
        ) as prof:
            generate(model, [plan.prompt] * plan.batch_size, plan.max_new_tokens)
        raw = prof.raw_capture
        raw.preflight = preflight or []
        raw.startup = startup
        raw.capture.workload = workload(plan, raw)
        return raw
    finally:
        model.close()


def workload(plan: RunPlan, raw: RawCapture, kernels: str | None = None) -> Workload:
    """What the generation asked for, as the capture records it (next commands reproduce it)."""
    prefill = [s for s in raw.steps if s.phase in ("prefill", "mixed") and s.batch_size > 0]
    prompt_tokens = (
        round(sum(s.input_tokens for s in prefill) / max(sum(s.batch_size for s in prefill), 1)) if prefill else None
    )
    return Workload(
        batch_size=plan.batch_size,
        prompt=plan.prompt,
        prompt_tokens=prompt_tokens,
        max_new_tokens=plan.max_new_tokens,
        warmup_tokens=plan.warmup,
        max_length=plan.max_length,
        quantization_encoding=plan.quantization_encoding,
        custom_architectures=list(plan.custom_architectures),
        kernels=kernels or plan.kernels,
    )


def kernels_outcome(raw: RawCapture, plan: RunPlan, prepared: PreparedRun) -> CaptureError | None:
    """A kernel recorder asked for by name that recorded nothing fails the command (after the report: the returned
    error); with ``--kernels auto`` the report says what was left out."""
    asked = kernel_mode(plan.kernels)
    if not raw.kernels_unavailable:
        return None
    if asked.records_kernels:
        return CaptureError(f"--kernels {plan.kernels} recorded no kernels: {raw.kernels_unavailable.reason}")
    if asked.name != prepared.kernels:  # a mode chosen for the user (auto) that recorded nothing: said, not failed
        raw.notes.append(
            f"--kernels {asked.name} chose {prepared.kernels}, which recorded nothing "
            f"({raw.kernels_unavailable.reason}): steps and utilization only"
        )
    return None


def startup_capture(plan: RunPlan, progress: Progress) -> tuple[RawCapture, LoadFailed | None]:
    """Process start to the first token: the load recorded, nothing profiled (no profiling compile); the failure, if the
    load failed, comes back beside the capture (the report is written first)."""
    plan.warmup = max(plan.warmup, 1)
    prepared = prepare_run(plan, progress, op_ranges_on_cpu=False)
    settings = load_settings(plan, prepared)
    raw = RawCapture(
        environment=prepared.env,
        capture=Capture(
            started_unix_s=time.time(),
            target=TargetKind.STARTUP,
            model_path=plan.model_path,
            devices=prepared.devices,
            collectors=[Collector.STARTUP],
            profiling_mode=os.environ.get("MODULAR_ENABLE_PROFILING", "off"),
        ),
    )
    failure: LoadFailed | None = None
    try:
        model, raw.startup, preflight = load_and_warm_up(
            settings,
            progress,
            prepared.env.max_version,
            preflight=lambda: preflight_gate(settings.custom_architectures, plan.model_path, progress=progress),
        )
        raw.preflight = preflight or []
        raw.capture.device_graph_capture = model.device_graph_capture
        model.close()
    except LoadFailed as exc:
        raw.startup, failure = exc.startup, exc
    raw.capture.ended_unix_s = time.time()
    return raw, failure


def demo_model(devices: str, hidden: int | None, layers: int | None, progress: Progress) -> Path:
    """The embedded default model, built once in the cache folder: a 2048-wide bf16 Llama on a GPU, a 64-wide float32
    one on the CPU."""
    on_gpu = devices.startswith("gpu")
    dtype: Literal["float32", "bfloat16"] = "bfloat16" if on_gpu else "float32"
    if on_gpu:
        width = hidden or 2048
        heads = max(width // 128, 1)
        shape = ModelShape(
            hidden=width, layers=layers or 4, heads=heads, kv_heads=max(heads // 4, 1), intermediate=int(width * 2.75)
        )
    else:
        shape = ModelShape(hidden=hidden or 64, layers=layers or 2)
    folder = cache_dir("models") / f"demo-llama-{dtype}-h{shape.hidden}-l{shape.layers}"
    if not (folder / "model.safetensors").exists():
        progress(f"building the demo model ({dtype}, hidden {shape.hidden}, {shape.layers} layers) in {folder}")
        build_tiny_llama(folder, dtype=dtype, shape=shape)
    return folder
