"""In-process profiling: :class:`Profiler` (start / stop / capture on a live pipeline, any thread) and
``profile(pipeline)``, the ``with`` form over it.

    with profile(model.pipeline, kernels="cupti") as prof:
        ...generate...
    print(prof.report)

    profiler = Profiler(model.pipeline)      # in a long-running app: costs nothing until started
    raw = profiler.capture(steps=64)          # from an admin thread, while the app generates

While active it hooks the pipeline's per-step ``execute`` (phase ranges + step records, and the
token count of the model's own inputs), samples the GPU in the background, and optionally records
kernels (CUPTI on NVIDIA, or the NVTX op ranges MAX emits on any device when an NVTX log is
attached). On exit it restores the pipeline, returns what it recorded as a :class:`RawCapture`
and builds the :class:`Report` from it with :func:`~max_profile.analyze.report.build_report`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from max_profile.analyze.report import build_report
from max_profile.collect.live.gpu_sampling import DEFAULT_INTERVAL_S
from max_profile.collect.live.markers import make_marker
from max_profile.collect.live.nvtx_log import log_path_for, restart_with_nvtx_log
from max_profile.collect.live.pipeline_hook import PipelineHook, resolve_pipeline, synchronize_accelerators
from max_profile.collect.live.recorders import (
    DEFAULT_SLICE_STEPS,
    CuptiRecorder,
    GpuSamplerRecorder,
    HostLoadRecorder,
    NvtxLogRecorder,
    Recorder,
    check_kernel_sampling,
)
from max_profile.collect.probes.environment import detect_environment
from max_profile.collect.probes.model_files import read_model_config, read_model_weights
from max_profile.defaults import DEFAULT_KERNEL_SHARE
from max_profile.errors import CaptureError, InputError
from max_profile.model import Capture, Environment, RawCapture, Report, Unavailable
from max_profile.model.kernel_modes import KernelMode, kernel_mode, place_of, resolve_kernel_mode
from max_profile.model.tags import Collector
from max_profile.util.files import cache_dir
from max_profile.version import __version__


def attached_nvtx_log() -> str | None:
    """The NVTX log this process writes, when it was started with the max_profile injection library."""
    template = os.environ.get("MAX_PROFILE_NVTX_LOG")
    if not template or "libmax_profile_nvtx" not in os.environ.get("NVTX_INJECTION64_PATH", ""):
        return None

    return log_path_for(template)


CAPTURE_TIMEOUT_S = 300.0
"""How long ``Profiler.capture(steps=N)`` waits for its steps by default before it stops (a capture that saw no step
raises: the app generated nothing through the pipeline)."""


class _Recording:
    """One start-to-stop recording: the pipeline hook, and the recorders it runs (GPU sampler, host load, kernels)."""

    def __init__(self, owner: Profiler) -> None:
        self.owner = owner
        marker, note = make_marker(owner.environment.vendor, owner.phase_markers)
        self.notes: list[str] = [note] if note else []
        self.hook = PipelineHook(owner.pipeline, marker, on_step=owner._step_done)
        self.recorders: list[Recorder] = [HostLoadRecorder()]
        self.cupti: CuptiRecorder | None = None
        mode = owner.kernel_mode
        if mode.cupti:
            self.cupti = CuptiRecorder(
                self.notes,
                before_stop=lambda: synchronize_accelerators(owner.pipeline),
                share=owner.kernel_share if mode.sampled else 1.0,  # ops: every op's kernels
                slice_steps=owner.kernel_slice_steps,
            )
            self.recorders.append(self.cupti)
        if mode.op_ranges:  # beside CUPTI's kernels (ops), the op ranges are joined to them; alone they are the work
            self.recorders.append(NvtxLogRecorder(owner.nvtx_log, beside_kernels=mode.cupti))
        if (
            owner.gpu_sampling and owner.environment.vendor != "none"
        ):  # no GPU: no sampler process competing for the CPU
            self.recorders.append(GpuSamplerRecorder(owner.sample_interval_s))
        self.recorders += owner.extra_recorders
        self.started = 0.0
        self._started: list[Recorder] = []

    def start(self) -> None:
        """Recorders first, the step hook last: the first step recorded already has every collector running."""
        self.hook.check_free()  # a busy pipeline fails before anything starts
        try:
            self.started = time.time()
            for recorder in self.recorders:
                recorder.start()
                self._started.append(recorder)
            self.hook.install()  # raises on nested / concurrent use of one pipeline
        except BaseException:
            for recorder in reversed(self._started):
                try:
                    recorder.stop(failed=True)
                except Exception:  # noqa: BLE001 - already failing; the original error matters
                    pass
            raise

    def stop(self, failed: bool) -> None:
        """Uninstall first (no new step starts), let a step in flight finish, then stop the recorders."""
        try:
            self.hook.uninstall()
            if not self.hook.wait_idle(timeout_s=STEP_DRAIN_TIMEOUT_S):
                self.notes.append(f"a step was still running {STEP_DRAIN_TIMEOUT_S:g} s after stop(): it is left out")
            for recorder in self.recorders:
                recorder.stop(failed=failed)
        finally:
            self.hook.uninstall()

    def raw(self) -> RawCapture:
        owner = self.owner
        steps = list(self.hook.steps)
        sampler = next((r for r in self.recorders if isinstance(r, GpuSamplerRecorder)), None)
        path = owner.model_path or pipeline_model_path(owner.pipeline)
        capture = Capture(
            started_unix_s=self.started,
            ended_unix_s=time.time(),
            target=type(owner.pipeline).__name__,
            model_path=path,
            devices=owner.devices or pipeline_devices(owner.pipeline),
            device_graph_capture=_device_graph_capture(owner.pipeline),
            profiling_mode=os.environ.get("MODULAR_ENABLE_PROFILING", "off"),
            collectors=[Collector.PIPELINE_HOOK]
            + ([sampler.sampler.source] if sampler is not None else [])
            + ([owner.kernel_mode.collector] if owner.kernel_mode.collector else []),
            phase_markers=self.hook.marker.kind,
            model_config=read_model_config(path) if path else None,
            model_weights=read_model_weights(path) if path else None,
            interface="python",
            unix_minus_perf_counter_ns=UNIX_MINUS_PERF_COUNTER_NS,
        )
        raw = RawCapture(
            environment=owner.environment,
            capture=capture,
            steps=steps,
            sample_interval_s=owner.sample_interval_s,
            notes=list(self.notes),
        )
        if sampler is None:
            raw.utilization_unavailable = Unavailable(
                "GPU sampling was turned off (gpu_sampling=False)"
                if not owner.gpu_sampling
                else f"not sampled: {owner.environment.vendor_reason}"
            )
        # every call of execute, the overlap pipeline's empty drain call included: its range is one of ours
        window = (min(s.start_ns for s in steps), max(s.end_ns for s in steps)) if steps else None
        for recorder in self.recorders:
            recorder.fill(raw, window)
        return raw


STEP_DRAIN_TIMEOUT_S = 60.0
"""How long stop() waits for a step that is running on another thread to finish."""

UNIX_MINUS_PERF_COUNTER_NS = time.time_ns() - time.perf_counter_ns()
"""Wall clock minus the step clock, taken once per process: turns step times into Unix times (spans)."""


class Profiler:
    """Profiling switched on and off on a live pipeline while the application keeps generating.

        profiler = Profiler(pipeline, kernels="auto")      # nothing installed yet: no cost
        raw = profiler.capture(steps=64)                    # from an admin thread / endpoint
        print(build_report(raw))

    ``start()`` installs the step hook, the GPU sampler and the kernel tracer; ``stop()`` removes them
    and returns what was recorded as a :class:`RawCapture`. ``capture(steps=N)`` / ``capture(seconds=S)``
    do both around a wait and may be called from any thread; ``capture_in_background`` returns a
    :class:`~concurrent.futures.Future` (for signal handlers and request handlers that must not block).
    While stopped, the pipeline is exactly the original object: no hook, no flag check.
    A profiler records one capture at a time; it can be started again after each stop.
    """

    def __init__(
        self,
        target: Any,
        *,
        kernels: str | bool = "off",
        sample_interval_s: float = DEFAULT_INTERVAL_S,
        gpu_sampling: bool = True,
        phase_markers: bool = True,
        model_path: str | None = None,
        devices: str | None = None,
        environment: Environment | None = None,
        nvtx_log: str | None = None,
        on_step: Callable[[Any], None] | None = None,
        kernel_share: float = DEFAULT_KERNEL_SHARE,
        kernel_slice_steps: int = DEFAULT_SLICE_STEPS,
        recorders: Sequence[Recorder] = (),
    ) -> None:
        self.pipeline = resolve_pipeline(target)
        self.extra_recorders = list(recorders)
        """Recorders of the caller's own, run with the built-in ones (started before the first step, stopped after the
        last, each filling the raw capture): e.g. ``CudaProfilerRangeRecorder`` for an external profiler's range."""
        check_kernel_sampling(kernel_share, kernel_slice_steps)  # here, not when the first recording starts
        self.kernel_share, self.kernel_slice_steps = kernel_share, kernel_slice_steps
        if not sample_interval_s > 0:
            raise InputError(
                f"sample_interval_s must be > 0 (got {sample_interval_s}); 0 makes the GPU recorder busy-loop"
            )
        self.environment = environment or detect_environment(check_tools=False)
        self.nvtx_log = nvtx_log or attached_nvtx_log()
        self.kernel_mode: KernelMode = resolve_kernel_mode(
            kernel_mode(kernels), place_of(self.environment.vendor, devices or "gpu"), self.nvtx_log is not None
        )
        self.sample_interval_s = sample_interval_s
        self.gpu_sampling = gpu_sampling
        self.phase_markers = phase_markers
        self.model_path = model_path
        self.devices = devices
        self._on_step = on_step
        self._lock = threading.Lock()
        self._recording: _Recording | None = None
        self._last: _Recording | None = None
        self._work_steps = 0
        self._step_budget: int | None = None
        self._steps_changed = threading.Condition()
        self._cancel = threading.Event()

    @property
    def active(self) -> bool:
        """Whether a capture is being recorded now."""
        return self._recording is not None

    def start(self) -> None:
        """Start recording (any thread). Raises :class:`InputError` when already recording."""
        self._start(step_budget=None)

    def _start(self, step_budget: int | None) -> None:
        with self._lock:
            if self._recording is not None:
                raise InputError("this Profiler is already recording: stop() it first (one capture at a time)")
            recording = _Recording(self)
            with self._steps_changed:
                self._work_steps = 0
                self._step_budget = step_budget
            self._cancel.clear()
            self._recording = recording  # before the hook goes in: a step may end at once
            try:
                recording.start()
            except BaseException:
                self._recording = None
                raise

    def stop(self, *, failed: bool = False) -> RawCapture:
        """Stop recording (any thread) and return what was recorded."""
        with self._lock:
            recording, self._recording = self._recording, None
            if recording is None:
                raise InputError("this Profiler is not recording: start() it first")
            self._step_budget = None
            self._cancel.set()
            recording.stop(failed=failed)
            self._last = recording
            return recording.raw()

    def capture(
        self, *, steps: int | None = None, seconds: float | None = None, timeout_s: float | None = CAPTURE_TIMEOUT_S
    ) -> RawCapture:
        """Record ``steps`` pipeline steps (prefill or decode batches) or ``seconds`` of running, then stop.

        With ``steps``, ``timeout_s`` (default :data:`CAPTURE_TIMEOUT_S`; None: no bound) bounds the wait when the app
        generates too little: the capture then holds the steps seen so far and says so in its notes, and a capture that
        saw none raises :class:`CaptureError` (nothing ran the pipeline). Blocks the calling thread only: call it from
        an admin thread, never from the thread that runs the pipeline.
        """
        if (steps is None) == (seconds is None):
            raise InputError("capture() needs exactly one of steps=N or seconds=S")
        if steps is not None and steps < 1:
            raise InputError(f"capture(steps={steps}): needs at least one step")
        if seconds is not None and not seconds > 0:
            raise InputError(f"capture(seconds={seconds}): needs a positive duration")
        if self._is_pipeline_thread():
            raise InputError(
                "capture() was called from the thread that runs the pipeline: it would wait forever; "
                "call it from another thread, or use start() / stop() around the generation"
            )
        self._start(step_budget=steps)
        mine = self._recording
        note = None
        try:
            if seconds is not None:
                self._cancel.wait(seconds)
            else:
                assert steps is not None
                deadline = None if timeout_s is None else time.monotonic() + timeout_s
                with self._steps_changed:
                    while self._work_steps < steps and not self._cancel.is_set():
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            note = (
                                f"capture(steps={steps}) timed out after {timeout_s:g} s with {self._work_steps} "
                                "step(s)"
                            )
                            break
                        self._steps_changed.wait(left if left is not None else 1.0)
        except BaseException:
            if self._recording is mine:
                self.stop(failed=True)
            raise
        if self._recording is not mine:
            raise InputError("this capture was ended by another thread's stop(), which received its RawCapture")
        raw = self.stop()
        if note and not any(s.batch_size > 0 for s in raw.steps):
            raise CaptureError(
                f"capture(steps={steps}): no pipeline step ran in {timeout_s:g} s (nothing generated through this "
                "pipeline): generate while it records, or pass timeout_s=None to wait without a bound"
            )
        if note:
            raw.notes.append(note)
        return raw

    def capture_in_background(
        self, *, steps: int | None = None, seconds: float | None = None, timeout_s: float | None = CAPTURE_TIMEOUT_S
    ) -> Future[RawCapture]:
        """:meth:`capture` on a new daemon thread; the returned future holds the :class:`RawCapture`."""
        future: Future[RawCapture] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(self.capture(steps=steps, seconds=seconds, timeout_s=timeout_s))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                future.set_exception(exc)

        threading.Thread(target=run, name="max_profile-capture", daemon=True).start()
        return future

    def _is_pipeline_thread(self) -> bool:
        last = self._last.hook if self._last is not None else None
        return last is not None and last.thread == threading.get_ident()

    def _step_done(self, step: Any) -> None:
        if getattr(step, "batch_size", 0) > 0:
            recording = self._recording
            if recording is not None and recording.cupti is not None:
                recording.cupti.step_done()
            with self._steps_changed:
                self._work_steps += 1
                if (
                    self._step_budget is not None
                    and self._work_steps >= self._step_budget
                    and self._recording is not None
                ):
                    self._recording.hook.pause()  # exactly N steps, however late the capturing thread wakes
                self._steps_changed.notify_all()
        if self._on_step is not None:
            self._on_step(step)


class ProfileSession(Profiler):
    """``with profile(pipeline) as prof:`` — a :class:`Profiler` started on entry and stopped on exit;
    ``report`` and ``raw_capture`` are ready after the block."""

    def __init__(self, target: Any, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self._entered = False
        self._report: Report | None = None
        self._raw: RawCapture | None = None

    def __enter__(self) -> ProfileSession:
        if self._entered:
            raise InputError("a profile() session can be entered once; create a new one for another run")
        self._entered = True
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        failed = exc is not None
        raw = self.stop(failed=failed)
        if not failed:
            self._raw = raw
            self._report = build_report(raw, tool_version=__version__)

    @property
    def steps(self) -> list[Any]:
        recording = self._recording or self._last
        return list(recording.hook.steps) if recording is not None else []

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

    def raw(self) -> RawCapture:
        """What this session recorded, before analysis (save it with ``.save(path)``; rebuild with ``build_report``)."""
        return self.raw_capture


def pipeline_model_path(pipeline: Any) -> str | None:
    """The local model folder the pipeline was loaded from (its config's ``model.model_path``), when it is one."""
    cfg = getattr(pipeline, "_pipeline_config", None) or getattr(pipeline, "pipeline_config", None)
    path = getattr(getattr(cfg, "model", None), "model_path", None)
    return path if isinstance(path, str) and os.path.isdir(path) else None


def pipeline_devices(pipeline: Any) -> str | None:
    """The pipeline's devices said as the CLI's ``--devices`` says them (``cpu``, ``gpu``, ``gpu:0,1``): a capture from
    Python and one from the CLI of the same setup compare (``max-profile diff``)."""
    devices = getattr(pipeline, "_devices", None) or getattr(
        getattr(pipeline, "_pipeline_model", None), "devices", None
    )
    if not isinstance(devices, (list, tuple)) or not devices:
        return None
    accelerators = [d for d in devices if not getattr(d, "is_host", str(getattr(d, "label", "cpu")) == "cpu")]
    if not accelerators:
        return "cpu"
    ids = [int(getattr(d, "id", 0)) for d in accelerators]
    return "gpu" if ids == [0] else "gpu:" + ",".join(map(str, ids))


def _device_graph_capture(pipeline: Any) -> bool | None:
    cfg = getattr(pipeline, "_pipeline_config", None) or getattr(pipeline, "pipeline_config", None)
    runtime = getattr(cfg, "runtime", None)
    value = getattr(runtime, "device_graph_capture", None)
    return bool(value) if value is not None else None


def restart_with_op_ranges(devices: str = "cpu") -> None:
    """The one call that makes ``profile(pipeline, kernels="nvtx-log")`` record MAX's op ranges from a script: first
    thing in the script (before MAX loads a model), it re-runs the script once with max_profile's NVTX log library
    injected and
    ``MODULAR_ENABLE_PROFILING=on`` (the first run of a model shape that way compiles it again); in the re-run it
    returns at once. The log lives in max_profile's cache folder: it is written only inside ``profile()`` blocks,
    emptied once each block is read (a long-running app keeps at most one block's ranges) and removed when the script
    ends.

    Equivalent from the shell: ``max-profile run --kernels nvtx-log`` (the same re-execution)."""
    import atexit
    import sys

    restart_with_nvtx_log([sys.executable, *sys.argv], devices, gated=True)
    log = attached_nvtx_log()
    if log:
        atexit.register(_remove_quietly, log)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def profile(target: Any, **kwargs: Any) -> ProfileSession:
    """Profile a MAX text-generation pipeline in-process.

    Args:
        target: ``TextGenerationPipeline`` / ``OverlapTextGenerationPipeline``, or an ``AutoModel`` /
            ``AutoPipeline`` (its ``.pipeline`` is used).
        kernels: ``"off"`` (default), ``"cupti"`` (NVIDIA, needs cupti-python), ``"nvtx-log"`` (MAX's op
            ranges through the max_profile NVTX injection library), ``"ops"`` (both on NVIDIA, joined: which op
            launched each kernel; every step recorded; load the model with device graphs off, whose replays carry no
            op range), ``"auto"``, or True for CUPTI. nvtx-log and ops need :func:`restart_with_op_ranges` first.
        sample_interval_s: GPU sampling interval (> 0).
        gpu_sampling / phase_markers: turn the GPU recorder / NVTX-roctx phase ranges off.
        model_path / devices: recorded in the report (model_path also enables bandwidth estimates).
        kernel_share / kernel_slice_steps: CUPTI records slices of ``kernel_slice_steps`` steps (8), the first from the
            start, paused in between so that ``kernel_share`` of the steps are recorded (default 0.0625: on an H200
            each recorded step of a 2 ms decode cost 13-14 % of its throughput, so a sixteenth costs under 1 %); 1
            records every step. The report says which steps were recorded.
        recorders: live recorders of your own (the ``Recorder`` protocol: ``name``, ``start()``, ``stop(failed)``,
            ``fill(raw, window)``), started before the first step and stopped after the last with the built-in ones;
            ``CudaProfilerRangeRecorder()`` opens the capture range of ``nsys profile --capture-range=cudaProfilerApi``.
    """
    return ProfileSession(target, **kwargs)


def capture(
    target: Any,
    *,
    steps: int | None = None,
    seconds: float | None = None,
    timeout_s: float | None = CAPTURE_TIMEOUT_S,
    **kwargs: Any,
) -> RawCapture:
    """``Profiler(target, **kwargs).capture(...)``: one capture of a pipeline another thread is running."""
    return Profiler(target, **kwargs).capture(steps=steps, seconds=seconds, timeout_s=timeout_s)


def remove_own_nvtx_log() -> None:
    """The NVTX log the re-exec for ``--kernels nvtx-log`` wrote in max_profile's cache folder: read into the report
    (and the raw capture) by now, so removed, not left to pile up. A log the user pointed elsewhere is theirs."""
    path = attached_nvtx_log()
    if path and os.path.dirname(os.path.realpath(path)) == os.path.realpath(cache_dir()):
        with contextlib.suppress(OSError):
            os.remove(path)
