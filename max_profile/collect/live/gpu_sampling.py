"""GPU utilization, memory, clocks and throttle reasons, sampled in the background.

Source: ``max.profiler.gpu.BackgroundRecorder`` (NVML on NVIDIA, ROCm SMI on AMD), which
samples in a child process so the profiled process pays nothing per sample. Its samples carry
no timestamps: they are spread evenly between the recorder's start and stop, which is what
the recorder's fixed-interval loop does (the interpolation is said in the report). On AMD,
amdsmi is used instead when installed (throttle status, partitions); on a MAX build without the
recorder, pynvml or amdsmi are read from a thread with real timestamps (:mod:`gpu_backends`).

On Hopper and newer NVIDIA GPUs, NVML GPM (via ``pynvml``) adds *SM activity* over the whole
window: NVML "utilization" only says some kernel was running, SM activity says how much of
the GPU's SMs had work. Equivalent CLI: ``nvidia-smi dmon -s u`` / ``dcgmi dmon -e 1002``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec

from max_profile.collect.live.gpu_backends import (
    MAX_GPU_UPGRADE,
    AmdSmiReader,
    GpuReader,
    NvmlReader,
    max_gpu_module,
    open_direct_reader,
)
from max_profile.model import Unavailable, UtilizationSample
from max_profile.util.procs import child_python_env

DEFAULT_INTERVAL_S = 0.1


MAX_RECORDER_SOURCE = "{module}.BackgroundRecorder (sample times interpolated)"


@contextlib.contextmanager
def _child_ignores_ctrl_c() -> Iterator[None]:
    """Children started inside inherit SIGINT ignored: Ctrl-C to the terminal's process group reaches only this process,
    which stops the recorder itself (MAX's recorder child otherwise prints a KeyboardInterrupt traceback)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


class GpuSampler:
    """GPU readings over a window, from the best source this machine has (see :mod:`gpu_backends`).

    Order: amdsmi on AMD (throttle status and partitions, which ROCm SMI through MAX lacks), then MAX's
    ``BackgroundRecorder`` (a child process: nothing per sample in this process), then pynvml / amdsmi
    sampled from a thread here when the MAX build has no recorder. Plus a GPM SM-activity window on
    NVIDIA Hopper+.
    """

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, clock: Any = time.perf_counter_ns) -> None:
        if not interval_s > 0:
            raise ValueError(
                f"sampling interval must be > 0 seconds (got {interval_s}); 0 makes the recorder busy-loop"
            )
        self.interval_s = interval_s
        self._clock = clock
        self._recorder: Any = None
        self._module_name = ""
        self._thread: _ThreadSampling | None = None
        self._t0 = 0
        self._t1 = 0
        self._gpm: _GpmWindow | None = None
        self.unavailable: Unavailable | None = None
        self.samples: list[UtilizationSample] = []
        self.source = "none"

    @property
    def running(self) -> bool:
        return self._recorder is not None or self._thread is not None

    def start(self) -> None:
        amd = _open_amdsmi()
        if amd is not None:
            self._start_thread(amd)
            return
        module, detail = max_gpu_module()
        if module is not None:
            self._module_name = detail
            self.source = MAX_RECORDER_SOURCE.format(module=detail)
            self._recorder = module.BackgroundRecorder(interval=self.interval_s)
            with child_python_env(), _child_ignores_ctrl_c():
                self._recorder.__enter__()
            self._t0 = self._clock()
            self._gpm = _GpmWindow.start()
            return
        reader, problems = open_direct_reader(prefer_amd=False)
        if reader is None:
            self.unavailable = Unavailable(
                f"no GPU sampler: this MAX build has no max.profiler.gpu ({detail}; {MAX_GPU_UPGRADE} adds it) "
                f"and {'; '.join(problems)}"
            )
            return
        self._start_thread(reader)

    def _start_thread(self, reader: GpuReader) -> None:
        self.source = reader.source
        self._t0 = self._clock()
        self._gpm = _GpmWindow.start() if isinstance(reader, NvmlReader) else None
        self._thread = _ThreadSampling(reader, self.interval_s, self._clock)
        self._thread.start()

    def stop(self, failed: bool = False) -> None:
        if self._thread is not None:
            thread, self._thread = self._thread, None
            self._t1 = self._clock()
            gpm = self._gpm.stop() if self._gpm else {}
            samples = thread.stop()
            if failed:
                self.unavailable = Unavailable("the profiled block raised before sampling finished")
                return
            self.samples = [
                msgspec.structs.replace(s, sm_activity_pct=gpm.get(s.gpu)) if s.gpu in gpm else s for s in samples
            ]
            if not self.samples:
                self.unavailable = Unavailable(thread.problem or f"{self.source}: no reading in the window")
            return
        if self._recorder is None:
            return
        self._t1 = self._clock()
        gpm = self._gpm.stop() if self._gpm else {}
        recorder, self._recorder = self._recorder, None
        if failed:
            recorder.__exit__(RuntimeError, RuntimeError("profiled block failed"), None)
            self.unavailable = Unavailable("the profiled block raised before sampling finished")
            return
        recorder.__exit__(None, None, None)
        self.samples = samples_from_stats(recorder.stats, self._t0, self._t1, gpm)
        if not self.samples:
            self.unavailable = Unavailable(no_gpu_reason())


def _open_amdsmi() -> GpuReader | None:
    try:
        return AmdSmiReader.open()
    except Exception:  # noqa: BLE001 - not an AMD machine, or amdsmi not installed
        return None


class _ThreadSampling:
    """Reads a :class:`GpuReader` every interval on a daemon thread; real timestamps per reading."""

    def __init__(self, reader: GpuReader, interval_s: float, clock: Any) -> None:
        self._reader = reader
        self._interval_s = interval_s
        self._clock = clock
        self._stop = threading.Event()
        self._samples: list[UtilizationSample] = []
        self.problem: str | None = None
        self._thread = threading.Thread(target=self._run, name="max_profile-gpu-sampler", daemon=True)

    def start(self) -> None:
        self._take()  # one reading at the start, as the window opens
        self._thread.start()

    def _take(self) -> None:
        try:
            self._samples.extend(self._reader.read(self._clock()))
        except Exception as exc:  # noqa: BLE001 - a reading that fails is skipped, and said
            self.problem = f"{self._reader.source}: reading failed ({type(exc).__name__}: {exc})"

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._take()

    def stop(self) -> list[UtilizationSample]:
        self._stop.set()
        self._thread.join(timeout=10 * self._interval_s + 5)
        self._take()  # and one as it closes
        self._reader.close()
        return self._samples


def samples_from_stats(
    stats: list[dict[str, Any]], t0_ns: int, t1_ns: int, sm_activity: dict[str, float] | None = None
) -> list[UtilizationSample]:
    """Turn ``BackgroundRecorder.stats`` (a list of ``{gpu: GPUStats}``) into samples.

    Times are interpolated evenly over [t0, t1]. An empty dict in every snapshot means no GPU.
    """
    n = len(stats)
    out: list[UtilizationSample] = []
    for i, snapshot in enumerate(stats):
        t = t0_ns + ((t1_ns - t0_ns) * i // (n - 1) if n > 1 else 0)
        for gpu, st in sorted(snapshot.items()):
            clocks = getattr(st, "clocks", None)
            mem = st.memory
            out.append(
                UtilizationSample(
                    t_ns=t,
                    gpu=gpu,
                    utilization_pct=float(st.utilization.gpu_usage_percent),
                    memory_used_bytes=int(mem.used_bytes),
                    memory_total_bytes=int(mem.total_bytes),
                    sm_clock_mhz=int(clocks.core_mhz) if clocks else None,
                    max_sm_clock_mhz=int(clocks.core_max_mhz) if clocks else None,
                    memory_clock_mhz=int(clocks.mem_mhz) if clocks and clocks.mem_mhz is not None else None,
                    throttle_reasons=list(getattr(clocks, "throttle_reasons", None) or []) if clocks else [],
                    sm_activity_pct=(sm_activity or {}).get(gpu),
                )
            )
    return out


def no_gpu_reason() -> str:
    """Why ``max.profiler.gpu`` sees no GPU, from its own load errors when it keeps them."""
    try:
        module, _ = max_gpu_module()
        if module is None:
            return "no GPU: MAX's GPU diagnostics module is missing"
        with module.GPUDiagContext() as ctx:
            if ctx.get_stats():
                return "the GPU recorder returned no samples"
            errors = getattr(ctx, "_errors", [])
    except Exception as exc:  # noqa: BLE001
        return f"no GPU: max.profiler.gpu failed ({exc})"
    detail = "; ".join(f"{vendor}: {err}" for vendor, err in errors) if errors else "no NVIDIA or AMD GPU found"
    return f"no GPU visible to NVML / ROCm SMI ({detail})"


class _GpmWindow:
    """NVML GPM SM-activity over a window: one GPM sample at start, one at stop."""

    def __init__(self, nvml: Any, handles: dict[str, Any], first: dict[str, Any]) -> None:
        self._nvml = nvml
        self._handles = handles
        self._first = first

    @classmethod
    def start(cls) -> _GpmWindow | None:
        try:
            import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]

            pynvml.nvmlInit()
            handles: dict[str, Any] = {}
            first: dict[str, Any] = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                if not pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                    continue
                sample = pynvml.nvmlGpmSampleAlloc()
                pynvml.nvmlGpmSampleGet(h, sample)
                handles[f"nv{i}"] = h
                first[f"nv{i}"] = sample
            return cls(pynvml, handles, first) if handles else None
        except Exception:  # noqa: BLE001 - pynvml missing, no NVIDIA GPU, or GPM unsupported
            return None

    def stop(self) -> dict[str, float]:
        nvml = self._nvml
        result: dict[str, float] = {}
        for key, h in self._handles.items():
            try:
                second = nvml.nvmlGpmSampleAlloc()
                nvml.nvmlGpmSampleGet(h, second)
                req = nvml.c_nvmlGpmMetricsGet_t()
                req.version = nvml.NVML_GPM_METRICS_GET_VERSION
                req.numMetrics = 1
                req.sample1 = self._first[key]
                req.sample2 = second
                req.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
                nvml.nvmlGpmMetricsGet(req)
                result[key] = float(req.metrics[0].value)
                nvml.nvmlGpmSampleFree(second)
                nvml.nvmlGpmSampleFree(self._first[key])
            except Exception:  # noqa: BLE001
                continue
        return result
