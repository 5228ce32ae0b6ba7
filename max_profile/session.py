"""``profile(pipeline)``: the in-process profiler.

    with profile(model.pipeline, kernels="cupti") as prof:
        ...generate...
    print(prof.report)

While active it hooks the pipeline's per-step ``execute`` (phase ranges + step records, and the
token count of the model's own inputs), samples the GPU in the background, and optionally records
kernels (CUPTI on NVIDIA, or the NVTX op ranges MAX emits on any device when an NVTX log is
attached). On exit it restores the pipeline, returns what it recorded as a :class:`RawCapture`
and builds the :class:`Report` from it with :func:`~max_profile.analyze.report.build_report`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

from max_profile import __version__
from max_profile.analyze.report import build_report
from max_profile.collect.cupti_native import make_cupti_collector
from max_profile.collect.environment import detect_environment
from max_profile.collect.gpu_sampling import DEFAULT_INTERVAL_S, GpuSampler
from max_profile.collect.markers import make_marker
from max_profile.collect.pipeline_hook import PipelineHook, resolve_pipeline
from max_profile.errors import InputError, MaxProfileError
from max_profile.model import Capture, Environment, KernelTable, RawCapture, Report, ranges_within

KernelMode = Literal["off", "cupti", "nvtx-log", "auto"]
KERNEL_MODES: tuple[str, ...] = ("off", "cupti", "nvtx-log", "auto")

_active_lock = threading.Lock()


def resolve_kernel_mode(mode: KernelMode | bool, vendor: str, nvtx_log_attached: bool) -> KernelMode:
    """``auto``: CUPTI on NVIDIA, MAX's op ranges when an NVTX log is attached, else off. True means CUPTI."""
    if mode is True:
        return "cupti"
    if mode is False:
        return "off"
    if mode not in KERNEL_MODES:
        raise InputError(f"kernels={mode!r}: use one of {', '.join(KERNEL_MODES)}")
    if mode == "auto":
        return "cupti" if vendor == "nvidia" else "nvtx-log" if nvtx_log_attached else "off"
    return mode


def attached_nvtx_log() -> str | None:
    """The NVTX log this process writes, when it was started with the max_profile injection library."""
    template = os.environ.get("MAX_PROFILE_NVTX_LOG")
    if not template or "libmax_profile_nvtx" not in os.environ.get("NVTX_INJECTION64_PATH", ""):
        return None
    from max_profile.collect.nvtx_log import log_path_for

    return log_path_for(template)


class ProfileSession:
    """The object ``profile()`` returns; ``report`` and ``raw_capture`` are ready after the ``with`` block."""

    def __init__(
        self,
        target: Any,
        *,
        kernels: KernelMode | bool = "off",
        sample_interval_s: float = DEFAULT_INTERVAL_S,
        gpu_sampling: bool = True,
        phase_markers: bool = True,
        model_path: str | None = None,
        devices: str | None = None,
        environment: Environment | None = None,
        nvtx_log: str | None = None,
        on_step: Callable[[Any], None] | None = None,
    ) -> None:
        self.pipeline = resolve_pipeline(target)
        if not sample_interval_s > 0:
            raise InputError(f"sample_interval_s must be > 0 (got {sample_interval_s}); 0 makes the GPU recorder busy-loop")
        self.environment = environment or detect_environment(check_tools=False)
        self.nvtx_log = nvtx_log or attached_nvtx_log()
        self.kernel_mode: KernelMode = resolve_kernel_mode(kernels, self.environment.vendor, self.nvtx_log is not None)
        self.sample_interval_s = sample_interval_s
        self.gpu_sampling = gpu_sampling
        self.model_path = model_path
        self.devices = devices
        marker, note = make_marker(self.environment.vendor, phase_markers)
        self.notes: list[str] = [note] if note else []
        self.hook = PipelineHook(self.pipeline, marker, on_step=on_step)
        self._sampler: GpuSampler | None = None
        self._cupti: Any = None
        self._started = 0.0
        self._entered = False
        self.kernels: KernelTable = KernelTable.empty()
        self.kernel_problem: str | None = None
        self._report: Report | None = None
        self._raw: RawCapture | None = None

    # ------------------------------------------------------------------------------------------
    def __enter__(self) -> ProfileSession:
        if self._entered:
            raise InputError("a profile() session can be entered once; create a new one for another run")
        self._entered = True
        self.hook.install()  # raises on nested / concurrent use of one pipeline
        try:
            self._started = time.time()
            if self.kernel_mode == "cupti":
                try:
                    self._cupti = make_cupti_collector(self.notes)
                    self._cupti.start()
                except MaxProfileError as exc:
                    self._cupti = None
                    self.kernel_problem = str(exc)
            elif self.kernel_mode == "nvtx-log" and not self.nvtx_log:
                self.kernel_problem = (
                    "kernels='nvtx-log' needs the process started with NVTX_INJECTION64_PATH=<libmax_profile_nvtx.so> "
                    "and MAX_PROFILE_NVTX_LOG=<file> (see max_profile.collect.nvtx_log)"
                )
            if self.gpu_sampling:
                self._sampler = GpuSampler(self.sample_interval_s)
                self._sampler.start()
        except BaseException:
            self._stop_cupti_quietly()
            self.hook.uninstall()
            raise
        return self

    def _stop_cupti_quietly(self) -> None:
        if self._cupti is not None:
            try:
                self._cupti.stop()
            except Exception:  # noqa: BLE001 - already failing; the original error matters
                pass
            self._cupti = None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        failed = exc is not None
        try:
            if self._cupti is not None:
                try:
                    self.kernels = self._cupti.stop()
                except Exception as err:  # noqa: BLE001 - reported as the reason kernels are missing
                    self.kernel_problem = f"CUPTI flush failed: {err}"
            if self._sampler is not None:
                self._sampler.stop(failed=failed)
        finally:
            self.hook.uninstall()
        if not failed:
            self._raw = self.raw()
            self._report = build_report(self._raw, tool_version=__version__)

    # ------------------------------------------------------------------------------------------
    @property
    def steps(self) -> list[Any]:
        return list(self.hook.steps)

    @property
    def raw_capture(self) -> RawCapture:
        if self._raw is None:
            raise InputError("the raw capture exists when the `with profile(...)` block ends without an error")
        return self._raw

    @property
    def report(self) -> Report:
        if self._report is None:
            raise InputError("the report is built when the `with profile(...)` block ends without an error")
        return self._report

    def _model_config(self) -> dict[str, object] | None:
        if not self.model_path:
            return None
        from max_profile.analyze.bandwidth import read_model_config

        return read_model_config(self.model_path)

    def raw(self) -> RawCapture:
        """What this session recorded, before analysis (save it with ``.save(path)``; rebuild with ``build_report``)."""
        steps = self.steps
        capture = Capture(
            started_unix_s=self._started,
            ended_unix_s=time.time(),
            target=type(self.pipeline).__name__,
            model_path=self.model_path,
            devices=self.devices,
            device_graph_capture=_device_graph_capture(self.pipeline),
            profiling_mode=os.environ.get("MODULAR_ENABLE_PROFILING", "off"),
            collectors=["pipeline-hook"]
            + (["max.profiler.gpu"] if self.gpu_sampling else [])
            + ([f"kernels:{self.kernel_mode}"] if self.kernel_mode != "off" else []),
            phase_markers=self.hook.marker.kind,
            model_config=self._model_config(),
        )
        raw = RawCapture(environment=self.environment, capture=capture, steps=steps, sample_interval_s=self.sample_interval_s, notes=list(self.notes))
        # every call of execute, the overlap pipeline's empty drain call included: its range is one of ours
        window = (min(s.start_ns for s in steps), max(s.end_ns for s in steps)) if steps else None
        sampler = self._sampler
        if sampler is None:
            raw.utilization_unavailable = "GPU sampling was turned off (gpu_sampling=False)"
        elif sampler.unavailable is not None:
            raw.utilization_unavailable = sampler.unavailable.reason
        else:
            raw.samples = sampler.samples
        self._fill_kernels(raw, window)
        return raw

    def _fill_kernels(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        if self.kernel_mode == "off":
            return
        if self.kernel_problem:
            raw.kernels_unavailable = self.kernel_problem
            return
        if self.kernel_mode == "nvtx-log":
            from max_profile.collect.nvtx_log import read_nvtx_log

            assert self.nvtx_log is not None
            try:
                log = read_nvtx_log(self.nvtx_log)
            except (OSError, ValueError) as exc:
                raw.kernels_unavailable = f"NVTX log {self.nvtx_log!r} could not be read: {exc}"
                return
            raw.kernels = log.op_table().within(window)
            raw.ranges = ranges_within(log.phase_ranges(), window)
            raw.kernel_source = "nvtx-log (MAX op ranges, host time)"
            if not len(raw.kernels):
                raw.kernels_unavailable = (
                    "the NVTX log has no MAX op ranges in the profiled window: MAX emits them only with "
                    "MODULAR_ENABLE_PROFILING=on (or detailed) set before the model is loaded"
                )
            return
        cupti = self._cupti
        raw.kernels = self.kernels
        raw.kernel_source = "cupti" if type(cupti).__name__ == "NativeCuptiCollector" else "cupti (cupti-python)"
        if cupti is not None:
            raw.tracer_callback_s = cupti.callback_s_before_stop
            raw.graph_launches = int(cupti.graph_launches)
            if cupti.dropped:
                raw.notes.append(f"CUPTI: {cupti.dropped} kernel records dropped")
            raw.notes.append(f"CUPTI cost: {cupti.callback_s:.3f} s in buffer callbacks, {cupti.api_records} API records ({cupti.api_filter})"
                             + (f", {cupti.stop_s:.3f} s to stop and decode" if hasattr(cupti, "stop_s") else ""))
        if not len(self.kernels):
            raw.kernels_unavailable = "the kernel tracer recorded no kernel launches in the profiled block"


def _device_graph_capture(pipeline: Any) -> bool | None:
    cfg = getattr(pipeline, "_pipeline_config", None) or getattr(pipeline, "pipeline_config", None)
    runtime = getattr(cfg, "runtime", None)
    value = getattr(runtime, "device_graph_capture", None)
    return bool(value) if value is not None else None


def profile(target: Any, **kwargs: Any) -> ProfileSession:
    """Profile a MAX text-generation pipeline in-process.

    Args:
        target: ``TextGenerationPipeline`` / ``OverlapTextGenerationPipeline``, or an ``AutoModel`` /
            ``AutoPipeline`` (its ``.pipeline`` is used).
        kernels: ``"off"`` (default), ``"cupti"`` (NVIDIA, needs cupti-python), ``"nvtx-log"`` (MAX's op
            ranges through the max_profile NVTX injection library), ``"auto"``, or True for CUPTI.
        sample_interval_s: GPU sampling interval (> 0).
        gpu_sampling / phase_markers: turn the GPU recorder / NVTX-roctx phase ranges off.
        model_path / devices: recorded in the report (model_path also enables bandwidth estimates).
    """
    return ProfileSession(target, **kwargs)
