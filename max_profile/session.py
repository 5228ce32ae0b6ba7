"""``profile(pipeline)``: the in-process profiler.

    with profile(model.pipeline, kernels="cupti") as prof:
        ...generate...
    print(prof.report)

While active it hooks the pipeline's per-step ``execute`` (phase ranges + step records),
samples the GPU in the background, and optionally records kernels (CUPTI on NVIDIA, or the
NVTX op ranges MAX emits on any device when an NVTX log is attached). On exit it restores
the pipeline and builds the :class:`Report`.
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
from max_profile.collect.environment import detect_environment
from max_profile.collect.gpu_sampling import DEFAULT_INTERVAL_S, GpuSampler
from max_profile.collect.markers import make_marker
from max_profile.collect.pipeline_hook import PipelineHook, resolve_pipeline
from max_profile.model import Capture, Environment, KernelRecord, RawCapture, Report

KernelMode = Literal["off", "cupti", "nvtx-log", "auto"]

_active_lock = threading.Lock()


class ProfileSession:
    """The object ``profile()`` returns; ``report`` is ready after the ``with`` block."""

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
            raise ValueError(f"sample_interval_s must be > 0 (got {sample_interval_s}); 0 makes the GPU recorder busy-loop")
        self.kernel_mode: KernelMode = "cupti" if kernels is True else "off" if kernels is False else kernels
        self.environment = environment or detect_environment(check_tools=False)
        self.sample_interval_s = sample_interval_s
        self.gpu_sampling = gpu_sampling
        self.model_path = model_path
        self.devices = devices
        if nvtx_log is None and os.environ.get("MAX_PROFILE_NVTX_LOG"):
            from max_profile.collect.nvtx_log import log_path_for

            nvtx_log = log_path_for(os.environ["MAX_PROFILE_NVTX_LOG"])
        self.nvtx_log = nvtx_log
        marker, note = make_marker(self.environment.vendor, phase_markers)
        self.notes: list[str] = [note] if note else []
        self.hook = PipelineHook(self.pipeline, marker, on_step=on_step)
        self._sampler: GpuSampler | None = None
        self._cupti: Any = None
        self._started = 0.0
        self._entered = False
        self.kernels: list[KernelRecord] = []
        self.kernel_problem: str | None = None
        self._report: Report | None = None
        self._raw: RawCapture | None = None

    # ------------------------------------------------------------------------------------------
    def __enter__(self) -> ProfileSession:
        if self._entered:
            raise RuntimeError("a profile() session can be entered once; create a new one for another run")
        self._entered = True
        self.hook.install()  # raises on nested / concurrent use of one pipeline
        try:
            self._started = time.time()
            mode = self.kernel_mode
            if mode == "auto":
                mode = "cupti" if self.environment.vendor == "nvidia" else "nvtx-log" if self.nvtx_log else "off"
                self.kernel_mode = mode
            if mode == "cupti":
                from max_profile.collect.cupti_kernels import CuptiKernelCollector, CuptiUnavailable

                try:
                    self._cupti = CuptiKernelCollector()
                    self._cupti.start()
                except CuptiUnavailable as exc:
                    self._cupti = None
                    self.kernel_problem = str(exc)
            elif mode == "nvtx-log" and not self.nvtx_log:
                self.kernel_problem = (
                    "kernels='nvtx-log' needs the process started with NVTX_INJECTION64_PATH=<libmax_profile_nvtx.so> "
                    "and MAX_PROFILE_NVTX_LOG=<file> (see max_profile.collect.nvtx_log)"
                )
            if self.gpu_sampling:
                self._sampler = GpuSampler(self.sample_interval_s)
                self._sampler.start()
        except BaseException:
            if self._cupti is not None:
                try:
                    self._cupti.stop()
                except Exception:  # noqa: BLE001 - already failing; the original error matters
                    pass
                self._cupti = None
            self.hook.uninstall()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        failed = exc is not None
        try:
            if self._cupti is not None:
                try:
                    self.kernels = self._cupti.stop()
                except Exception as err:  # noqa: BLE001
                    self.kernel_problem = f"CUPTI flush failed: {err}"
            if self._sampler is not None:
                self._sampler.stop(failed=failed)
        finally:
            self.hook.uninstall()
        if not failed:
            self._report = self._build_report()

    # ------------------------------------------------------------------------------------------
    @property
    def steps(self) -> list[Any]:
        return list(self.hook.steps)

    @property
    def raw_capture(self) -> RawCapture:
        if self._raw is None:
            raise RuntimeError("the raw capture exists when the `with profile(...)` block ends without an error")
        return self._raw

    @property
    def report(self) -> Report:
        if self._report is None:
            raise RuntimeError("the report is built when the `with profile(...)` block ends without an error")
        return self._report

    def _model_config(self) -> dict[str, object] | None:
        if not self.model_path:
            return None
        from max_profile.analyze.bandwidth import read_model_config

        return read_model_config(self.model_path)

    def raw(self) -> RawCapture:
        """What this session recorded, before analysis (save it with ``.save(path)``; rebuild with ``build_report``)."""
        steps = self.steps
        graphs = _device_graph_capture(self.pipeline)
        capture = Capture(
            started_unix_s=self._started,
            ended_unix_s=time.time(),
            target=type(self.pipeline).__name__,
            model_path=self.model_path,
            devices=self.devices,
            device_graph_capture=graphs,
            profiling_mode=os.environ.get("MODULAR_ENABLE_PROFILING", "off"),
            collectors=["pipeline-hook"]
            + (["max.profiler.gpu"] if self.gpu_sampling else [])
            + ([f"kernels:{self.kernel_mode}"] if self.kernel_mode != "off" else []),
            phase_markers=self.hook.marker.kind,
            model_config=self._model_config(),
        )
        raw = RawCapture(environment=self.environment, capture=capture, steps=steps, sample_interval_s=self.sample_interval_s, notes=list(self.notes))
        sampler = self._sampler
        if sampler is None:
            raw.utilization_unavailable = "GPU sampling was turned off (gpu_sampling=False)"
        elif sampler.unavailable is not None:
            raw.utilization_unavailable = sampler.unavailable.reason
        else:
            raw.samples = sampler.samples
        self._fill_kernels(raw, steps)
        return raw

    def _fill_kernels(self, raw: RawCapture, steps: list[Any]) -> None:
        if self.kernel_mode == "off":
            return
        if self.kernel_mode == "nvtx-log":
            if not self.nvtx_log:
                raw.kernels_unavailable = self.kernel_problem or "no NVTX log"
                return
            from max_profile.collect.nvtx_log import read_nvtx_log

            try:
                log = read_nvtx_log(self.nvtx_log)
            except (OSError, ValueError) as exc:
                raw.kernels_unavailable = f"NVTX log {self.nvtx_log!r} could not be read: {exc}"
                return
            lo = steps[0].start_ns if steps else 0
            hi = steps[-1].end_ns if steps else 0
            raw.kernels = [k for k in log.op_records() if lo <= k.start_ns <= hi]
            raw.ranges = [r for r in log.phase_ranges() if lo <= r.start_ns <= hi]
            raw.kernel_source = "nvtx-log (MAX op ranges, host time)"
            if not raw.kernels:
                raw.kernels_unavailable = (
                    "the NVTX log has no MAX op ranges in the profiled window: MAX emits them only with "
                    "MODULAR_ENABLE_PROFILING=on (or detailed) set before the model is loaded"
                )
            return
        if self.kernel_problem:
            raw.kernels_unavailable = self.kernel_problem
            return
        raw.kernels = self.kernels
        raw.kernel_source = "cupti"
        if self._cupti is not None and steps:
            window_s = (max(s.end_ns for s in steps) - min(s.start_ns for s in steps)) / 1e9
            raw.tracer_overhead_pct = 100.0 * self._cupti.callback_s_before_stop / max(window_s, 1e-9)
        raw.graph_launches = int(getattr(self._cupti, "graph_launches", 0))
        dropped = int(getattr(self._cupti, "dropped", 0))
        if dropped:
            raw.notes.append(f"CUPTI: {dropped} kernel records dropped beyond the buffer cap")
        if self._cupti is not None:
            raw.notes.append(f"CUPTI cost: {self._cupti.callback_s:.2f} s in buffer callbacks, {self._cupti.api_records} API records "
                             f"({self._cupti.api_filter})")
        if not self.kernels:
            raw.kernels_unavailable = "the kernel tracer recorded no kernel launches in the profiled block"

    def _build_report(self) -> Report:
        self._raw = self.raw()
        return build_report(self._raw, tool_version=__version__)


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
