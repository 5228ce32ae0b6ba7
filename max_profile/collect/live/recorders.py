"""Live collectors of an in-process capture behind one :class:`Recorder` interface: started before the first step,
stopped after the last, then asked to put what they recorded into the :class:`~max_profile.model.RawCapture`.

* :class:`GpuSamplerRecorder` — GPU utilization, memory, clocks (:mod:`gpu_sampling`);
* :class:`HostLoadRecorder` — the host's CPU load over the window (:mod:`host_load`);
* :class:`CuptiRecorder` — every kernel through CUPTI (the C recorder, else cupti-python; :mod:`cupti_native`);
* :class:`NvtxLogRecorder` — MAX's op ranges and the phase ranges from the NVTX injection library's log
(:mod:`nvtx_log`).

* :class:`CudaProfilerRangeRecorder` — the capture range of a profiler wrapped around the process (``nsys profile``).

``profile()`` / :class:`~max_profile.session.Profiler` run a list of them (and the caller's own: ``recorders=``); a
serve mode's window recorder (:mod:`serve_recorders`) is one too, run by the server window beside the GPU sampler and
the host load. A profiler that wraps the launched process is a :class:`ProcessTool` (``nsys profile`` here, a serve
mode's server side), whose output is read back after the process ends.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np

from max_profile.collect.live.cupti_decode import impossible_joins_note
from max_profile.collect.live.cupti_native import KernelCollector, make_cupti_collector
from max_profile.collect.live.gpu_sampling import GpuSampler
from max_profile.collect.live.host_load import HostLoadProbe
from max_profile.collect.live.nvtx_log import (
    LOG_CAP_ENV,
    dropped_in_process,
    gated_in_process,
    read_nvtx_log,
    set_recording_in_process,
    truncate_in_process,
)
from max_profile.errors import InputError, MaxProfileError
from max_profile.model import HostLoad, KernelTable, PhaseRange, RawCapture, Unavailable, ranges_within
from max_profile.model.tags import KernelOrigin

CUPTI_WITHOUT_GRAPHS_NOTE = (
    "CUPTI instruments every kernel launch: without device graphs decode ran 2-12 % slower under it on an H200 "
    "(24-layer bf16 Llama, interleaved with untraced runs), with them under 2 %; for step times as untraced, record "
    "with --device-graph-capture (MAX serve's default) or compare against `--kernels off`"
)
"""Said with every CUPTI recording made with device graphs off (benchmarks/tracer_overhead.py,
tests/data/gpu/h200_llama5b_cupti_recorder)."""


class Recorder(Protocol):
    """A live collector (see the module docstring)."""

    name: str

    def start(self) -> None: ...

    def stop(self, failed: bool) -> None: ...

    def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        """Put what was recorded into ``raw`` (``window``: the steps' span on the host clock, None without steps)."""


class ProcessTool(Protocol):
    """A profiler that wraps a process we launch (``nsys profile``, ``nsys launch``, ``rocprofv3 --``): the command the
    process runs under, the environment it adds, what it wrote read back into the raw capture once the process or the
    tool's session ended, its files. Its part inside a recording window, where it has one, is a :class:`Recorder`
    (``CudaProfilerRangeRecorder`` in the profiled process; a serve mode's ``window()``)."""

    def command(self, cmd: list[str]) -> list[str]: ...
    def env(self) -> dict[str, str]: ...
    def read_after_teardown(self, raw: RawCapture, span: tuple[int, int]) -> None:
        """What the tool wrote, into ``raw`` (``span``: the recorded steps' or window's span on the host clock)."""

    def close(self) -> None: ...
    def artifacts(self) -> list[str]: ...


class CudaProfilerRangeRecorder:
    """``cuProfilerStart`` / ``cuProfilerStop`` around the recording (MAX's own bracket, which pushes the context MAX
    opened): the capture range of ``nsys profile --capture-range=cudaProfilerApi`` (or ``ncu --profile-from-start off``)
    covers exactly the recorded steps. Records nothing itself; the tool around the process does."""

    name = "cuda-profiler-range"

    def __init__(self) -> None:
        self._range = contextlib.ExitStack()

    def start(self) -> None:
        from max.profiler.oneshot._cuda import cuda_profiler_region  # MAX: imported only where a range is asked for

        self._range.enter_context(cuda_profiler_region())

    def stop(self, failed: bool) -> None:
        self._range.close()

    def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        raw.capture.collectors = [*raw.capture.collectors, self.name]


def fill_samples(raw: RawCapture, sampler: GpuSampler, label: str = "") -> None:
    """A sampler's readings (or why there are none) into a raw capture."""
    if sampler.unavailable is not None:
        raw.utilization_unavailable = sampler.unavailable
        return
    raw.samples = [*raw.samples, *sampler.samples]
    raw.sample_interval_s = sampler.interval_s
    raw.sample_source = sampler.source + (f" ({label})" if label else "")


def ops_in_window(
    logs: Iterable[str], window: tuple[int, int] | None
) -> tuple[KernelTable, list[PhaseRange], list[str]]:
    """MAX's op ranges and the phase ranges of NVTX logs, clipped to ``window``; the logs that could not be read, said
    why."""

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
    """GPU samples (utilization, memory, clocks, throttling) every ``interval_s``; ``label`` says where (a serve
    window)."""

    name = "gpu-sampler"

    def __init__(self, interval_s: float, label: str = "") -> None:
        self.sampler = GpuSampler(interval_s)
        self.label = label

    def start(self) -> None:
        self.sampler.start()

    def stop(self, failed: bool) -> None:
        if self.sampler.running:
            self.sampler.stop(failed=failed)

    def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        fill_samples(raw, self.sampler, self.label)


class HostLoadRecorder:
    """This machine's CPU load while recording: our process's cores and the other processes' (a noisy neighbour)."""

    name = "host-load"

    def __init__(self, observed: frozenset[int] = frozenset()) -> None:
        """``observed``: the process tree being observed (an attached server's), counted apart from other load."""
        self.probe = HostLoadProbe(observed=observed)
        self.load: HostLoad | None = None

    def start(self) -> None:
        self.probe.start()

    def stop(self, failed: bool) -> None:
        self.load = self.probe.stop()

    def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        raw.capture.host_load = self.load


DEFAULT_SLICE_STEPS = 8
"""Steps recorded in one slice of a sampled in-process CUPTI recording (``kernel_share`` < 1)."""


def check_kernel_sampling(
    share: float, slice_steps: int = DEFAULT_SLICE_STEPS, share_name: str = "kernel_share"
) -> None:
    """Refuse a share of steps outside (0, 1] or slices under one step (``share_name``: how the caller spells the
    share)."""
    if not 0 < share <= 1:
        raise InputError(
            f"{share_name} must be above 0 and at most 1 (the share of steps CUPTI records), not {share:g}"
        )
    if slice_steps < 1:
        raise InputError(f"kernel_slice_steps must be at least 1, not {slice_steps}")


class StepSlices:
    """Which steps a sampled kernel recording records: the first ``slice_steps`` work steps, then a pause of as many
    steps as makes ``share`` of them recorded, then the next slice... The pause call comes one step late: the GPU runs
    up to a step behind the host, and CUPTI stamps a kernel still running at a pause with the time recording resumes,
    so the slice's last step must have finished on the GPU first (the extra step's kernels are dropped, it counts as
    paused).
    ``spans`` (host perf_counter ns, from the resume to the end of the slice's last step) are the launch times kept; the
    time the pause / resume calls took is kept too."""

    def __init__(self, share: float, slice_steps: int) -> None:
        self.share, self.slice_steps = share, slice_steps
        self.pause_steps = 0 if share >= 1 else max(1, round(slice_steps / share) - slice_steps)
        self.spans: list[tuple[int, int]] = []
        self.toggle_ns = 0
        self.toggles = 0
        self.steps_recorded = 0
        self.steps_paused = 0
        self._open: int | None = None
        self._slice_end: int | None = None
        self._count = 0
        self.closed_ns: int | None = None

    @property
    def sampled(self) -> bool:
        return self.toggles > 0

    def opened(self, now_ns: int) -> None:
        self._open, self._count = now_ns, 0

    def step_done(self, now_ns: int) -> str | None:
        """Count one work step that ended at ``now_ns``; ``"pause"`` / ``"resume"`` when the recording switches after
        it."""
        self._count += 1
        if self._open is None:
            self.steps_paused += 1
            return "resume" if self._count >= self.pause_steps else None
        if not self.pause_steps or self._count <= self.slice_steps:
            self.steps_recorded += 1
            if self._count == self.slice_steps:
                self._slice_end = now_ns
            return None
        self.steps_paused += 1  # the step after the slice: recorded while its predecessor finished, then dropped
        return "pause"

    def toggled(self, what: str, t0_ns: int, t1_ns: int) -> None:
        self.toggles += 1
        self.toggle_ns += t1_ns - t0_ns
        if what == "pause" and self._open is not None:
            self.spans.append((self._open, self._slice_end if self._slice_end is not None else t0_ns))
            self._open, self._slice_end, self._count = None, None, 1  # the step after the slice is the pause's first
        elif what == "resume":
            self._open, self._count = t1_ns, 0

    def closed(self, now_ns: int) -> None:
        self.closed_ns = now_ns
        if self._open is not None:
            self.spans.append((self._open, now_ns))
            self._open = None

    def describe(self) -> str:
        total = self.steps_recorded + self.steps_paused
        return (
            f"CUPTI recorded {self.steps_recorded} of {total} steps ({100 * self.steps_recorded / max(total, 1):.0f} "
            f"%: slices of {self.slice_steps} steps, kernel_share={self.share:g}, to keep tracing cost low; "
            f"kernel_share=1 records every step); {self.toggles} pause / resume calls took {self.toggle_ns / 1e6:.2f} "
            "ms"
        )


def launched_within(table: KernelTable, spans: list[tuple[int, int]]) -> KernelTable:
    """The kernels launched inside the spans (a sampled recording keeps the steps of its slices only)."""
    launched = table.attribution_time()
    keep = np.zeros(len(table), dtype=bool)
    for a, b in spans:
        keep |= (launched >= a) & (launched <= b)
    return table.select(keep)


def spans_of_recorded_work(
    table: KernelTable, host_spans: list[tuple[int, int]], until: int | None
) -> list[tuple[int, int]]:
    """The recorded slices as the analysis reads them: each from the first kernel launched in it (the first slice: from
    the recording's start) to the last end of those kernels (the GPU runs up to a step behind the host: a slice's last
    steps end after the pause call), never into the next slice. Kernels CUPTI stamped across a pause
    (:meth:`KernelTable.across_pauses`) do not stretch a slice. Without this, a sampled ledger lost 7 % of its decode
    matmul time at the slices' ends and counted the previous step's kernels, unrecorded, as idle at their starts (the
    H200 3B-shape batch-64 run)."""
    if len(host_spans) < 2 or not len(table):
        return host_spans
    launched = table.attribution_time()
    valid = ~table.across_pauses(host_spans, until)
    out = []
    for i, (a, b) in enumerate(host_spans):
        mine = valid & (launched >= a) & (launched <= b)
        if not mine.any():
            out.append((a, b))
            continue
        start = a if i == 0 else max(a, int(table.start_ns[mine].min()))
        end = max(b, int(table.end_ns[mine].max()))
        if i + 1 < len(host_spans):
            end = min(end, host_spans[i + 1][0])
        out.append((start, end))
    return out


class CuptiRecorder:
    """Every kernel of this process through CUPTI; ``before_stop`` waits for the GPU (the overlap pipeline leaves a step
    running when a generation returns: stopped before it ends, its kernels come out without an end time)."""

    name = "cupti"

    def __init__(
        self,
        notes: list[str],
        before_stop: Callable[[], object] | None = None,
        share: float = 1.0,
        slice_steps: int = DEFAULT_SLICE_STEPS,
    ) -> None:
        check_kernel_sampling(share, slice_steps)
        self.notes = notes
        self.before_stop = before_stop
        self.collector: KernelCollector | None = None
        self.kernels = KernelTable.empty()
        self.problem: str | None = None
        self.slices = StepSlices(share, slice_steps)

    def start(self) -> None:
        try:
            self.collector = make_cupti_collector(self.notes)
            self.collector.start()
            self.slices.opened(time.perf_counter_ns())
        except MaxProfileError as exc:
            self.collector = None
            self.problem = str(exc)

    def step_done(self) -> None:
        """After each work step (the pipeline's thread): pause after a slice of steps, resume after the pause."""
        if self.collector is None or not self.collector.native:  # cupti-python cannot pause: every step
            return
        t0 = time.perf_counter_ns()
        toggle = self.slices.step_done(t0)
        if toggle is None:
            return
        if toggle == "pause":
            self.collector.pause()
        else:
            self.collector.resume()
        self.slices.toggled(toggle, t0, time.perf_counter_ns())

    def stop(self, failed: bool) -> None:
        if self.collector is None:
            return
        self.slices.closed(time.perf_counter_ns())
        if self.before_stop is not None and not failed:
            try:
                self.before_stop()
            except Exception as err:  # noqa: BLE001 - the flush still runs; kernels without an end time are counted
                self.notes.append(
                    f"waiting for the GPU before stopping CUPTI failed ({err}): kernels still running were cut"
                )
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
        raw.kernel_source = KernelOrigin.CUPTI.describe("" if c is None or c.native else "cupti-python")
        if self.slices.sampled:
            spans = list(self.slices.spans)
            raw.kernels = launched_within(self.kernels, spans)
            raw.recorded_spans = spans_of_recorded_work(raw.kernels, spans, self.slices.closed_ns)
            raw.notes.append(self.slices.describe())
        if c is not None:
            raw.tracer_callback_s = c.callback_s_before_stop
            raw.graph_launches = int(c.graph_launches)
            if c.dropped:
                raw.notes.append(f"CUPTI: {c.dropped} kernel records dropped")
            if c.unfinished:
                raw.notes.append(
                    f"CUPTI: {c.unfinished} kernel(s) had no start or end time: still running when recording stopped"
                )
            if c.rejected_launches:
                raw.notes.append(impossible_joins_note(c.rejected_launches))
            if c.resume_problem:
                raw.notes.append(c.resume_problem)
            raw.notes.append(
                f"CUPTI cost: {c.callback_s:.3f} s in buffer callbacks, {c.api_records} API records ({c.api_filter})"
                + (f", {c.stop_s:.3f} s to stop and decode" if c.stop_s else "")
            )
            if raw.capture.device_graph_capture is False and len(self.kernels):
                raw.notes.append(CUPTI_WITHOUT_GRAPHS_NOTE)
        if not len(self.kernels):
            raw.kernels_unavailable = Unavailable("the kernel tracer recorded no kernel launches in the profiled block")


OPS_MODE_NOTE = (
    "--kernels ops changes what it measures: MODULAR_ENABLE_PROFILING=on is a compile key of its own (the first run "
    "recompiles), device graphs are off (every op launched eagerly, with its NVTX range) and CUPTI records every step: "
    "step times are those of this mode, not of MAX's default run (compare with --kernels auto for those)"
)
"""Said in every ``--kernels ops`` capture: the mode's own cost."""
NO_OPS_IN_WINDOW = (
    "the NVTX log has no MAX op ranges in the profiled window: MAX emits them only with MODULAR_ENABLE_PROFILING=on "
    "set before the model is loaded"
)
SERVE_OPS_MODE_NOTE = (
    "serve --mode ops changes what it measures: MODULAR_ENABLE_PROFILING=on is a compile key of its own, device graphs "
    "are off (every op launched eagerly, with its NVTX range) and CUPTI records the whole window: the server's step "
    "times and tokens/s are this mode's (--mode kernels measures the server as MAX runs it)"
)


class NvtxLogRecorder:
    """MAX's op ranges (host clock) and the phase ranges from this process's NVTX log (written as the process runs)."""

    name = "nvtx-log"

    def __init__(self, log_path: str | None, beside_kernels: bool = False) -> None:
        self.log_path = log_path
        self.gated = bool(log_path) and gated_in_process()
        self.beside_kernels = beside_kernels  # --kernels ops: into raw.op_ranges, beside CUPTI's kernels

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
                raw.notes.append(
                    f"the op-range log reached its size cap ({LOG_CAP_ENV}): {dropped} later NVTX events were "
                    "not recorded, so the op breakdown covers the start of the block only"
                )

    def _fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        if not self.log_path:
            raw.kernels_unavailable = Unavailable(
                "kernels='nvtx-log' needs the process started with NVTX_INJECTION64_PATH=<libmax_profile_nvtx.so> "
                "and MAX_PROFILE_NVTX_LOG=<file> (see max_profile.collect.live.nvtx_log)"
            )
            return
        table, ranges, problems = ops_in_window([self.log_path], window)
        if problems:
            raw.kernels_unavailable = Unavailable(problems[0])
            return
        if self.beside_kernels:  # steps come from the pipeline hook, kernels from CUPTI: only the ops are added
            raw.op_ranges = table
            raw.notes.append(OPS_MODE_NOTE)
            if not len(table):
                raw.notes.append(NO_OPS_IN_WINDOW)
            return
        raw.kernels, raw.ranges = table, ranges
        raw.kernel_source = KernelOrigin.OP_RANGES.describe("MAX op ranges, host time")
        if not len(table):
            raw.kernels_unavailable = Unavailable(
                "the NVTX log has no MAX op ranges in the profiled window: MAX emits them only with "
                "MODULAR_ENABLE_PROFILING=on (or detailed) set before the model is loaded"
            )
