"""Load a local model with MAX the way ``max generate`` does, and drive generations.

This is the workload side of ``max-profile demo`` / ``run``: a pipeline from
``PIPELINE_REGISTRY`` (an ``OverlapTextGenerationPipeline`` on GPUs by default, as in
``max generate``), a context per prompt, ``GenerateIterator`` steps. Greedy sampling with
``ignore_eos`` so a run always makes exactly ``max_new_tokens`` tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from max_profile.collect.probes.compile_key import compile_key, warm_cache_command
from max_profile.collect.probes.model_files import read_model_weights
from max_profile.collect.probes.startup import CACHE_LOG_ENV, StartupRecorder, compile_failure, startup_profile
from max_profile.errors import CaptureError, InputError, ToolMissingError
from max_profile.model import StartupProfile
from max_profile.util.devices import parse_devices
from max_profile.util.models import check_model_folder

os.environ.setdefault("HF_HUB_OFFLINE", "1")

Progress = Callable[[str], None]


@dataclass
class LoadedModel:
    pipeline: Any
    tokenizer: Any
    config: Any
    device_graph_capture: bool
    model_path: str
    devices: str

    def close(self) -> None:
        release = getattr(self.pipeline, "release", None)
        if callable(release):
            try:
                release()
            except Exception:  # noqa: BLE001 - best effort cleanup
                pass


def load_model(
    model_path: str,
    *,
    devices: str = "cpu",
    max_length: int | None = None,
    max_batch_size: int = 1,
    custom_architectures: Sequence[str] = (),
    quantization_encoding: str | None = None,
    device_graph_capture: bool | None = None,
    gpu_profiling: str | None = None,
    extra: dict[str, Any] | None = None,
    startup: StartupRecorder | None = None,
) -> LoadedModel:
    """Compile (or load from the compile cache) and return a ready pipeline.

    ``device_graph_capture``: None leaves it to MAX, as ``max generate`` / ``max serve`` do (on for the
    architectures that support it on a GPU, off on the CPU); True / False force it. ``startup``: marks each step of
    the load (and MAX's compile log, cache log and native stderr) for the startup profile.
    """
    check_model_folder(model_path)
    rec = startup or StartupRecorder()
    capture = rec.capturing() if startup is not None else contextlib.nullcontext(rec)
    with capture:
        return _load(
            model_path,
            devices,
            max_length,
            max_batch_size,
            custom_architectures,
            quantization_encoding,
            device_graph_capture,
            gpu_profiling,
            extra,
            rec,
        )


def _load(
    model_path: str,
    devices: str,
    max_length: int | None,
    max_batch_size: int,
    custom_architectures: Sequence[str],
    quantization_encoding: str | None,
    device_graph_capture: bool | None,
    gpu_profiling: str | None,
    extra: dict[str, Any] | None,
    rec: StartupRecorder,
) -> LoadedModel:
    try:
        with rec.mark("import MAX"):
            from max.pipelines import PIPELINE_REGISTRY
            from max.pipelines.lib import PipelineArgs, PipelineConfig
    except ImportError as exc:
        raise ToolMissingError(
            f"MAX pipelines are not importable ({exc}); install them: pip install 'max[serve]==26.7.*'"
        ) from exc

    kwargs: dict[str, Any] = {
        "model_path": model_path,
        "device_specs": _device_specs(devices),
        "max_batch_size": max_batch_size,
    }
    if device_graph_capture is not None:
        kwargs["device_graph_capture"] = device_graph_capture
    if max_length is not None:
        kwargs["max_length"] = max_length
    if custom_architectures:
        kwargs["custom_architectures"] = list(custom_architectures)
    if quantization_encoding:
        kwargs["quantization_encoding"] = quantization_encoding
    if gpu_profiling:
        kwargs["gpu_profiling"] = gpu_profiling
    kwargs.update(extra or {})
    try:
        with rec.mark("config, tokenizer and architecture lookup (custom architectures imported here)"):
            config = PipelineConfig.from_args(PipelineArgs.from_flat_kwargs(**kwargs))
            retrieved = PIPELINE_REGISTRY.retrieve_factory(config)
        with rec.mark("pipeline"):
            pipeline = retrieved.factory()
    except Exception as exc:  # MAX raises ValueError / RuntimeError / pydantic errors
        failure = compile_failure([*(x.text for x in rec.stderr), *(f"{type(e).__name__}: {e}" for e in _chain(exc))])
        if failure:
            rec.failure_text = failure
            raise CaptureError(
                f"could not load {model_path!r} on {devices}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''} — {failure}"
            ) from exc
        raise InputError(_explain_load_error(exc, model_path, devices, custom_architectures)) from exc
    resolved = getattr(getattr(config, "runtime", None), "device_graph_capture", None)
    graphs = bool(device_graph_capture if resolved is None else resolved)
    warmup = getattr(pipeline, "warmup_graph_capture", None)
    if graphs and callable(warmup):
        # as `max generate` / AutoModel do: without it every step runs eagerly and no graph is replayed
        try:
            with rec.mark("device graph capture"):
                warmup()
        except Exception as exc:  # noqa: BLE001 - MAX's own error, one line
            raise InputError(f"device graph capture warm-up failed on {devices}: {type(exc).__name__}: {exc}") from exc
    return LoadedModel(pipeline, retrieved.tokenizer, config, graphs, model_path, devices)


def _device_specs(devices: str) -> Any:
    from max.driver import DeviceSpec

    choice = parse_devices(devices)
    if choice.kind == "cpu":
        return [DeviceSpec.cpu()]
    if choice.ids is None:
        from max.driver import accelerator_count

        return [DeviceSpec.accelerator(i) for i in range(accelerator_count())]
    return [DeviceSpec.accelerator(i) for i in choice.ids]


def custom_call_site(exc: BaseException, custom_architectures: Sequence[str]) -> str | None:
    """``file:line`` of the deepest traceback frame inside a custom architecture package."""
    import traceback

    roots = [
        os.path.abspath(c.split(":")[0] if ":" in c and not os.path.exists(c) else c).rstrip("/")
        for c in custom_architectures
    ]
    site = None
    for cur in _chain(exc):
        for frame in traceback.extract_tb(cur.__traceback__):
            path = os.path.abspath(frame.filename)
            if any(path.startswith(r) for r in roots):
                site = f"{path}:{frame.lineno} ({frame.line})"
    return site


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _explain_load_error(
    exc: BaseException, model_path: str, devices: str, custom_architectures: Sequence[str] = ()
) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    site = custom_call_site(exc, custom_architectures) if custom_architectures else None
    if site and any(isinstance(e, TypeError) for e in _chain(exc)):
        inner = next(e for e in _chain(exc) if isinstance(e, TypeError))
        return (
            f"signature drift in the custom architecture: {type(inner).__name__}: {inner} at {site} — "
            "the call does not match the installed MAX's API; update it to this MAX version"
        )
    if site:
        first += f" (at {site})"
    if "No architecture found" in text:
        return (
            f"{first} — the model's config.json names an architecture MAX does not know; pass "
            "--custom-architectures DIR"
        )
    if "bfloat16" in text and "cpu" in text.lower():
        return f"{first} — bfloat16 runs only on GPUs in MAX; use float32 weights on the CPU"
    if "accelerator" in text.lower() or "No GPU" in text or "CUDA" in text:
        return f"cannot use devices {devices!r}: {first}"
    return f"could not load {model_path!r} on {devices}: {first}"


def make_request(prompt: str, max_new_tokens: int, *, use_chat_template: bool = True) -> Any:
    from max.pipelines.context import SamplingParams
    from max.pipelines.modeling.types import (
        RequestID,
        TextContentPart,
        TextGenerationRequest,
        TextGenerationRequestMessage,
    )

    params = SamplingParams(top_k=1, max_new_tokens=max_new_tokens, ignore_eos=True)
    if use_chat_template:
        return TextGenerationRequest(
            request_id=RequestID(),
            messages=[TextGenerationRequestMessage(role="user", content=[TextContentPart(text=prompt)])],
            model_name="model",
            sampling_params=params,
        )
    return TextGenerationRequest(request_id=RequestID(), prompt=prompt, model_name="model", sampling_params=params)


def generate(
    model: LoadedModel,
    prompts: Sequence[str],
    max_new_tokens: int,
    on_first_token: Callable[[], None] | None = None,
    on_step: Callable[[], None] | None = None,
) -> list[list[int]]:
    """Run one batch of prompts to ``max_new_tokens`` tokens each; returns the token ids. ``on_first_token``: called
    once, when the first step has returned tokens; ``on_step``: after every step (a benchmark's step clock)."""
    from max.pipelines.lib.generate import GenerateIterator

    has_template = bool(getattr(getattr(model.tokenizer, "delegate", None), "chat_template", None))

    async def contexts() -> list[Any]:
        return [
            await model.tokenizer.new_context(make_request(p, max_new_tokens, use_chat_template=has_template))
            for p in prompts
        ]

    ctxs = asyncio.run(contexts())
    produced: list[list[int]] = [[] for _ in prompts]
    with GenerateIterator.from_contexts(model.pipeline, ctxs, caller="max-profile") as batch:
        while not batch.done:
            for row, tokens in batch.step().items():
                produced[row].extend(tokens)
                if tokens and on_first_token is not None:
                    on_first_token()
                    on_first_token = None
            if on_step is not None:
                on_step()
    return produced


@dataclass
class LoadSettings:
    """What a load needs (and what decides its compile key)."""

    model_path: str
    devices: str = "cpu"
    max_length: int | None = None
    max_batch_size: int = 1
    custom_architectures: list[str] = field(default_factory=list)
    quantization_encoding: str | None = None
    device_graph_capture: bool | None = None
    prompt: str = "I believe the meaning of life is"
    warmup_tokens: int = 4


class LoadFailed(CaptureError):
    """A load that failed (a MAX compile failure, most often), with the startup profile of what ran before it."""

    def __init__(self, message: str, startup: StartupProfile) -> None:
        super().__init__(message)
        self.startup = startup


def _preflight_beside_max_import(preflight: Callable[[], Any], rec: StartupRecorder) -> Any:
    """Run the custom-architecture preflight (its child imports MAX, then the package) while this process imports MAX
    too, instead of one after the other (on the H200 each import is 13-15 s); then wait for its verdict, which still
    comes before the load. Its exception (a package that fails) is raised here."""
    import threading

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = preflight()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="max-profile-preflight", daemon=True)
    with rec.mark("import MAX (the custom-architecture preflight runs beside it)"):
        thread.start()
        os.environ[CACHE_LOG_ENV] = (
            "1"  # as the load's capture sets it, before MAX's runtime is loaded (restored after the load)
        )
        with contextlib.suppress(ImportError):  # the load says what is missing, with the install command
            import max.pipelines  # noqa: F401
    with rec.mark("custom-architecture preflight (a child imports the package)"):
        thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


def load_and_warm_up(
    s: LoadSettings,
    progress: Progress = lambda m: None,
    max_version: str | None = None,
    preflight: Callable[[], Any] | None = None,
) -> tuple[LoadedModel, StartupProfile, Any]:
    """Preflight (``preflight``, timed), load with the startup recorder, warm up to the first token: the model, where
    the time to the first token went, and the preflight's result."""
    rec = StartupRecorder()
    checked = None
    cache_log_before = os.environ.get(CACHE_LOG_ENV)
    try:
        if preflight is not None and s.custom_architectures:
            checked = _preflight_beside_max_import(preflight, rec)
        elif preflight is not None:
            with rec.mark("custom-architecture preflight (a child imports the package)"):
                checked = preflight()
        return _load_and_warm_up(s, rec, checked, progress, max_version)
    finally:  # the early import set MAX's cache logging on for the load (see _preflight_beside_max_import)
        if cache_log_before is None:
            os.environ.pop(CACHE_LOG_ENV, None)
        else:
            os.environ[CACHE_LOG_ENV] = cache_log_before


def _load_and_warm_up(
    s: LoadSettings, rec: StartupRecorder, checked: Any, progress: Progress, max_version: str | None
) -> tuple[LoadedModel, StartupProfile, Any]:
    profiling = os.environ.get("MODULAR_ENABLE_PROFILING", "off")
    weights = read_model_weights(s.model_path)
    weight_bytes = sum(g.bytes for g in weights.groups.values()) if weights and weights.groups else None
    n_devices = len(parse_devices(s.devices).ids or [1]) if not s.devices.startswith("cpu") else 1

    def profile_of(graphs: bool | None, failure: str | None = None) -> StartupProfile:
        common = {
            "model_path": s.model_path,
            "devices": s.devices,
            "profiling": profiling,
            "device_graphs": graphs,
            "max_batch_size": s.max_batch_size,
            "max_length": s.max_length,
            "encoding": s.quantization_encoding,
            "custom_architectures": list(s.custom_architectures),
        }
        return startup_profile(
            rec,
            key=compile_key(**common, max_version=max_version),  # type: ignore[arg-type]
            warm_command=warm_cache_command(**common),  # type: ignore[arg-type]
            weight_bytes=weight_bytes,
            devices=n_devices,
            failure=failure,
        )

    progress(f"loading {s.model_path} on {s.devices} (a first run of a model shape compiles for minutes)")
    try:
        model = load_model(
            s.model_path,
            devices=s.devices,
            max_length=s.max_length,
            max_batch_size=s.max_batch_size,
            custom_architectures=s.custom_architectures,
            quantization_encoding=s.quantization_encoding,
            device_graph_capture=s.device_graph_capture,
            startup=rec,
        )
    except CaptureError as exc:
        raise LoadFailed(str(exc), profile_of(s.device_graph_capture, rec.failure_text or str(exc))) from exc
    try:
        if s.warmup_tokens > 0:
            progress(f"warm-up: {s.warmup_tokens} token(s), not profiled")

            def first() -> None:
                rec.first_token = time.time()

            with rec.mark("warm-up"):
                generate(model, [s.prompt] * s.max_batch_size, s.warmup_tokens, on_first_token=first)
        return model, profile_of(model.device_graph_capture), checked
    except BaseException:
        model.close()
        raise
