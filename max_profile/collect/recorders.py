"""Live collectors of an in-process capture behind one :class:`Recorder` interface: started before the first step, stopped
after the last, then asked to put what they recorded into the :class:`~max_profile.model.RawCapture`.

* :class:`GpuSamplerRecorder` — GPU utilization, memory, clocks (:mod:`gpu_sampling`);
* :class:`HostLoadRecorder` — the host's CPU load over the window (:mod:`host_load`);
* :class:`CuptiRecorder` — every kernel through CUPTI (the C recorder, else cupti-python; :mod:`cupti_native`);
* :class:`NvtxLogRecorder` — MAX's op ranges and the phase ranges from the NVTX injection library's log (:mod:`nvtx_log`).

``profile()`` / :class:`~max_profile.session.Profiler` run a list of them; the serve lifecycle has its own per-mode
recorders (:mod:`serve_recorders`) and shares the fills below (:func:`fill_samples`, :func:`ops_in_window`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from max_profile.collect.gpu_sampling import GpuSampler
from max_profile.collect.host_load import HostLoadProbe
from max_profile.collect.nvtx_log import (
    LOG_CAP_ENV,
    dropped_in_process,
    gated_in_process,
    set_recording_in_process,
    truncate_in_process,
)
from max_profile.errors import MaxProfileError
from max_profile.model import HostLoad, KernelTable, PhaseRange, RawCapture, Unavailable, ranges_within

CUPTI_WITHOUT_GRAPHS_NOTE = (
    "CUPTI instruments every kernel launch: without device graphs decode ran 2-12 % slower under it on an H200 (24-layer "
    "bf16 Llama, interleaved with untraced runs), with them under 2 %; for step times as untraced, record with "
    "--device-graph-capture (MAX serve's default) or compare against `--kernels off`"
)
"""Said with every CUPTI recording made with device graphs off (benchmarks/tracer_overhead.py, tests/data/h200/README.md)."""


class Recorder(Protocol):
    """A live collector (see the module docstring)."""

    name: str

    def start(self) -> None: ...

    def stop(self, failed: bool) -> None: ...

    def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        """Put what was recorded into ``raw`` (``window``: the steps' span on the host clock, None without steps)."""


def fill_samples(raw: RawCapture, sampler: GpuSampler, label: str = "") -> None:
    """A sampler's readings (or why there are none) into a raw capture."""
    if sampler.unavailable is not None:
        raw.utilization_unavailable = sampler.unavailable
        return
    raw.samples = [*raw.samples, *sampler.samples]
    raw.sample_interval_s = sampler.interval_s
    raw.sample_source = sampler.source + (f" ({label})" if label else "")


def ops_in_window(logs: Iterable[str], window: tuple[int, int] | None) -> tuple[KernelTable, list[PhaseRange], list[str]]:
    """MAX's op ranges and the phase ranges of NVTX logs, clipped to ``window``; the logs that could not be read, said why."""
    from max_profile.collect.nvtx_log import read_nvtx_log

    tables: list[KernelTable] = []
    ranges: list[PhaseRange] = []
    problems: list[str] = []
    for path in logs:
        try:
            log = read_nvtx_log(path)
        except (OSError, ValueError) as exc:
            problems.append(f"NVTX log {str(path)!r} could not be read: {exc}")
            continue
        tables.append(log.op_table().within(window))
        ranges += ranges_within(log.phase_ranges(), window)
    return KernelTable.concat(tables), ranges, problems


class GpuSamplerRecorder:
    name = "gpu-sampler"

    def __init__(self, interval_s: float) -> None:
        self.sampler = GpuSampler(interval_s)

    def start(self) -> None:
        self.sampler.start()

    def stop(self, failed: bool) -> None:
        if self.sampler.running:
            self.sampler.stop(failed=failed)

    def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        fill_samples(raw, self.sampler)


class HostLoadRecorder:
    name = "host-load"

    def __init__(self) -> None:
        self.probe = HostLoadProbe()
        self.load: HostLoad | None = None

    def start(self) -> None:
        self.probe.start()

    def stop(self, failed: bool) -> None:
        self.load = self.probe.stop()

    def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        raw.capture.host_load = self.load


class CuptiRecorder:
    """Every kernel of this process through CUPTI; ``before_stop`` waits for the GPU (the overlap pipeline leaves a step
    running when a generation returns: stopped before it ends, its kernels come out without an end time)."""

    name = "cupti"

    def __init__(self, notes: list[str], before_stop: Callable[[], object] | None = None) -> None:
        self.notes = notes
        self.before_stop = before_stop
        self.collector: Any = None
        self.kernels = KernelTable.empty()
        self.problem: str | None = None

    def start(self) -> None:
        from max_profile.collect.cupti_native import make_cupti_collector

        try:
            self.collector = make_cupti_collector(self.notes)
            self.collector.start()
        except MaxProfileError as exc:
            self.collector = None
            self.problem = str(exc)

    def stop(self, failed: bool) -> None:
        if self.collector is None:
            return
        if self.before_stop is not None and not failed:
            try:
                self.before_stop()
            except Exception as err:  # noqa: BLE001 - the flush still runs; kernels without an end time are counted
                self.notes.append(f"waiting for the GPU before stopping CUPTI failed ({err}): kernels still running were cut")
        try:
            self.kernels = self.collector.stop()
        except Exception as err:  # noqa: BLE001 - reported as the reason kernels are missing
            self.problem = f"CUPTI flush failed: {err}"

    def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        c = self.collector
        if self.problem:
            raw.kernels_unavailable = Unavailable(self.problem)
            return
        raw.kernels = self.kernels
        raw.kernel_source = "cupti" if getattr(c, "native", False) else "cupti (cupti-python)"
        if c is not None:
            raw.tracer_callback_s = c.callback_s_before_stop
            raw.graph_launches = int(c.graph_launches)
            if c.dropped:
                raw.notes.append(f"CUPTI: {c.dropped} kernel records dropped")
            if getattr(c, "unfinished", 0):
                raw.notes.append(f"CUPTI: {c.unfinished} kernel(s) had no start or end time: still running when recording stopped")
            raw.notes.append(
                f"CUPTI cost: {c.callback_s:.3f} s in buffer callbacks, {c.api_records} API records ({c.api_filter})"
                + (f", {c.stop_s:.3f} s to stop and decode" if hasattr(c, "stop_s") else "")
            )
            if raw.capture.device_graph_capture is False and len(self.kernels):
                raw.notes.append(CUPTI_WITHOUT_GRAPHS_NOTE)
        if not len(self.kernels):
            raw.kernels_unavailable = Unavailable("the kernel tracer recorded no kernel launches in the profiled block")


class NvtxLogRecorder:
    """MAX's op ranges (host clock) and the phase ranges from this process's NVTX log (written as the process runs)."""

    name = "nvtx-log"

    def __init__(self, log_path: str | None) -> None:
        self.log_path = log_path
        self.gated = bool(log_path) and gated_in_process()

    def start(self) -> None:
        if self.gated:
            set_recording_in_process(True)

    def stop(self, failed: bool) -> None:
        if self.gated:
            set_recording_in_process(False)

    def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        try:
            self._fill(raw, window)
        finally:
            dropped = dropped_in_process() if self.log_path else 0
            if self.gated:  # read: the log keeps nothing of this block (a long-running app's log stays bounded)
                truncate_in_process()
            if dropped:
                raw.notes.append(f"the op-range log reached its size cap ({LOG_CAP_ENV}): {dropped} later NVTX events were "
                                 "not recorded, so the op breakdown covers the start of the block only")

    def _fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        if not self.log_path:
            raw.kernels_unavailable = Unavailable(
                "kernels='nvtx-log' needs the process started with NVTX_INJECTION64_PATH=<libmax_profile_nvtx.so> "
                "and MAX_PROFILE_NVTX_LOG=<file> (see max_profile.collect.nvtx_log)"
            )
            return
        table, ranges, problems = ops_in_window([self.log_path], window)
        if problems:
            raw.kernels_unavailable = Unavailable(problems[0])
            return
        raw.kernels, raw.ranges = table, ranges
        raw.kernel_source = "nvtx-log (MAX op ranges, host time)"
        if not len(table):
            raw.kernels_unavailable = Unavailable(
                "the NVTX log has no MAX op ranges in the profiled window: MAX emits them only with "
                "MODULAR_ENABLE_PROFILING=on (or detailed) set before the model is loaded"
            )
