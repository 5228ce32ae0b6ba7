"""What each ``max-profile serve`` mode records, as a server-side part and one live
:class:`~max_profile.collect.live.recorders.Recorder` per window.

The server lifecycle (``max_profile.serve``) is the same for every mode: plan, confirm, warm, start, fail fast,
/health, windows under load, teardown. A mode's :class:`ServeRecorder` plugs into it on the server's side: it may wrap
the launch command (``nsys launch``, ``rocprofv3 ... --``), add to the server's environment (the worker hook, the NVTX
log library), get ready after /health, read what it recorded after teardown, and clean up. Inside each window it
records through the same :class:`Recorder` protocol as the GPU sampler and the host load (``window()``: start, stop,
fill the raw capture), run by the window (:class:`~max_profile.collect.server.load_window.ServerWindow`) around its
span.

* :class:`UtilizationRecorder` — nothing beyond the GPU samples and host load every window gets.
* :class:`WorkerKernelRecorder` — the model worker's kernels (CUPTI in the worker on NVIDIA, several windows per
  server) and MAX's op / scheduler ranges through the NVTX log (any device): :class:`WorkerKernelWindow`.
* :class:`NsysRecorder` — ``nsys launch`` / ``start`` / ``stop`` / ``shutdown`` with a unique session:
  :class:`NsysWindow`.
* :class:`RocprofRecorder` — rocprofv3's collection period, timed from launch (R2 measured by a probe pass):
  :class:`RocprofWindow`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import msgspec

from max_profile.collect.live.cupti_native import build_cupti_library
from max_profile.collect.live.nvtx_log import GATED_ENV, build_injection_library
from max_profile.collect.live.recorders import (
    NO_OPS_IN_WINDOW,
    SERVE_OPS_MODE_NOTE,
    ProcessTool,
    Recorder,
    ops_in_window,
)
from max_profile.collect.readers.nsys import export_sqlite, merge_trace, read_nsys_sqlite
from max_profile.collect.readers.rocprof import rocprof_csv_capture
from max_profile.collect.server import serve_profilers as sp
from max_profile.collect.server.worker_protocol import WindowCoverage, WindowRecording, WorkerHook
from max_profile.errors import CaptureError, MaxProfileError, ToolMissingError, TraceFormatError
from max_profile.model import KernelTable, RawCapture, Unavailable
from max_profile.model.tags import KernelOrigin
from max_profile.util.procs import run_bounded

Progress = Callable[[str], None]


class ServerHandle(Protocol):
    """The running server as a recorder sees it."""

    def alive(self) -> bool: ...


class ServeRecorder(ProcessTool, Protocol):
    """One mode's server-side part (a :class:`ProcessTool` around the server; see the module docstring); what it
    records in a window is ``window()``'s :class:`Recorder`."""

    mode: str
    """The serve mode this recorder implements (its registry entry: ``max_profile.serve.SERVE_MODES``)."""
    reads_after_teardown: bool
    """Whether what it recorded is read after the server stopped (nsys and rocprofv3 write their files when their
    session / the server's group ends), not by each window's recorder."""
    switched_per_window: bool
    """Whether recording is switched on and off inside the running server per window, so an untraced window of the same
    server measures what it costs (CUPTI in the model worker); not where the tracer wraps or configures the server."""

    def command(self, serve_cmd: list[str]) -> list[str]: ...
    def env(self) -> dict[str, str]: ...
    def launched(self, at_monotonic: float) -> None: ...
    def ready(self, server: ServerHandle, progress: Progress) -> None: ...
    def window(self, index: int, server: ServerHandle, progress: Progress) -> Recorder | None:
        """The recorder of window ``index`` (counting from 1; None: the window's GPU samples and host load are all)."""

    def read_after_teardown(self, raw: RawCapture, span: tuple[int, int]) -> None: ...
    def close(self) -> None: ...
    def artifacts(self) -> list[str]: ...


class UtilizationRecorder:
    """No tracer: the window's GPU samples, client latencies and server metrics are the measurement."""

    mode = "utilization"
    reads_after_teardown = False
    switched_per_window = False

    def command(self, serve_cmd: list[str]) -> list[str]:
        return serve_cmd

    def env(self) -> dict[str, str]:
        return {}

    def launched(self, at_monotonic: float) -> None:
        return None

    def ready(self, server: ServerHandle, progress: Progress) -> None:
        return None

    def window(self, index: int, server: ServerHandle, progress: Progress) -> Recorder | None:
        return None

    def read_after_teardown(self, raw: RawCapture, span: tuple[int, int]) -> None:
        return None

    def close(self) -> None:
        return None

    def artifacts(self) -> list[str]:
        return []


class WorkerKernelRecorder(UtilizationRecorder):
    """The model worker's kernels: CUPTI through the worker hook on NVIDIA (``cupti=True``), and MAX's op and scheduler
    ranges through the NVTX log when MAX's profiling is on (``nvtx_template``)."""

    mode = "kernels"

    def __init__(
        self,
        tmp: Path,
        *,
        cupti: bool,
        profiling: str,
        progress: Progress,
        record_share: float = 1.0,
        slice_s: float = 0.5,
        ops_beside_kernels: bool = False,
        window_recordings: Mapping[int, WindowRecording] | None = None,
        settle_s: float = 0.5,
    ) -> None:
        self.tmp = tmp
        self.mode = "ops" if ops_beside_kernels else "kernels"
        self.ops_beside_kernels = ops_beside_kernels
        """``serve --mode ops``: MAX's op ranges go beside CUPTI's kernels (``raw.op_ranges``, joined by the report)
        instead of standing in for them."""
        self.record_share, self.slice_s = record_share, slice_s
        self.window_recordings = dict(window_recordings or {})
        """Server window -> what the worker records in it, instead of the share above (``benchmarks/serve_ab.py``'s
        variants)."""
        self.settle_s = settle_s
        """Load under recording before the window opens, so CUPTI's enable and its first launches after it stay out
        of the measured window (on the H200 the recorder's cost proved steady, not a start-up transient:
        tests/data/gpu/h200_llama5b_serve_steps_startup)."""
        self.hook_windows = 0
        """Windows the hook recorded so far (the hook numbers only those)."""
        self.coverage: dict[int, WindowCoverage] = {}
        """Server window -> what the worker recorded of it (CUPTI callback seconds among it), as read back."""
        self.nvtx_template: str | None = None
        self.extra: dict[str, str] = {}
        self.hook: WorkerHook | None = None
        if profiling != "off":
            try:
                self.nvtx_template = str(tmp / "nvtx-%p.log")
                self.extra.update(
                    {
                        "NVTX_INJECTION64_PATH": build_injection_library(),
                        "MAX_PROFILE_NVTX_LOG": self.nvtx_template,
                        # written only while a window records (the worker hook switches it): an untraced window and
                        # the time between windows pay MAX's ranges, not a log line for each
                        GATED_ENV: "1",
                    }
                )
            except ToolMissingError as exc:
                self.nvtx_template = None
                progress(f"no NVTX log ({exc})")
        library = None
        if cupti:
            try:  # built here, once, so the worker's prepare step only loads it
                library = build_cupti_library()
            except MaxProfileError as exc:
                progress(
                    f"the C CUPTI recorder is unavailable ({exc}); the worker falls back to cupti-python (slower, said "
                    "in the report)"
                )
        # the hook stamps the model worker's steps (prefill / decode, size, tokens) on every device, and records its
        # kernels with
        # CUPTI on NVIDIA (launch records tie each kernel to the step that launched it)
        self.hook = WorkerHook(tmp / "cupti")
        self.extra.update(self.hook.env(library, launches=True, kernels=cupti))
        self.cupti = cupti
        # CUPTI in the worker, or the gated log of MAX's op ranges, on and off per window: an untraced window of the
        # same server measures what recording costs it
        self.switched_per_window = cupti or self.nvtx_template is not None

    def env(self) -> dict[str, str]:
        return dict(self.extra)

    def ready(self, server: ServerHandle, progress: Progress) -> None:
        if self.hook is not None:
            progress(self.hook.prepare(server.alive))

    def window(self, index: int, server: ServerHandle, progress: Progress) -> Recorder | None:
        return WorkerKernelWindow(self, index, server, progress)

    def close(self) -> None:
        if self.hook is not None:
            self.hook.quit()


class WorkerKernelWindow:
    """One window of the model worker's recording: the hook told to start (and waited for, plus ``settle_s``) and to
    stop; its kernels (or ops), steps and MAX's scheduler ranges read into the raw capture."""

    name = "model-worker"

    def __init__(self, mode: WorkerKernelRecorder, index: int, server: ServerHandle, progress: Progress) -> None:
        self.mode, self.index, self.server, self.progress = mode, index, server, progress
        self.hook_window: int | None = None
        """The hook's window number (the hook counts only windows that were recorded)."""

    def start(self) -> None:
        """Start the worker's recording and return once it runs (plus ``settle_s``), so the window measures it
        steady."""
        m = self.mode
        if m.hook is None:
            return
        self.hook_window = m.hook_windows = m.hook_windows + 1
        recording = m.window_recordings.get(self.index) or WindowRecording(
            share=m.record_share, slice_s=m.slice_s, lead_s=m.settle_s
        )
        m.hook.start(self.hook_window, recording)
        if not m.hook.wait_started(self.hook_window, self.server.alive):
            self.progress(
                "the model worker had not started recording after 10 s; the window opens anyway (its coverage says how "
                "much was recorded)"
            )
        time.sleep(m.settle_s)

    def stop(self, failed: bool) -> None:
        """The hook told to stop; after a failure nothing (``close()`` quits the hook)."""
        if not failed and self.mode.hook is not None and self.hook_window is not None:
            self.mode.hook.stop(self.hook_window)

    def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        """Kernels (or ops) the model worker ran in the window, with MAX's scheduler ranges as phases, into ``raw``."""
        m, span = self.mode, window or (0, 0)
        op_table, ranges, _unreadable = ops_in_window(
            [str(p) for p in m.tmp.glob("nvtx-*.log")], span
        )  # a log cut mid-line is skipped
        raw.ranges = [*raw.ranges, *ranges]
        if m.hook is not None and self.hook_window is not None:
            steps = m.hook.read_steps(self.hook_window, span, self.server.alive)
            if steps:
                first = len(raw.steps)
                raw.steps = [*raw.steps, *(msgspec.structs.replace(st, index=first + i) for i, st in enumerate(steps))]
            if m.cupti:
                kernels, coverage = m.hook.read(self.hook_window, span, self.server.alive)
                if coverage is not None:
                    m.coverage[self.index] = coverage
                if kernels is not None and len(kernels):
                    raw.kernels = KernelTable.concat([raw.kernels, kernels])
                    if m.ops_beside_kernels:
                        raw.op_ranges = KernelTable.concat([raw.op_ranges, op_table])
                        said = [SERVE_OPS_MODE_NOTE] + ([] if len(op_table) else [NO_OPS_IN_WINDOW])
                        raw.notes = [*raw.notes, *(n for n in said if n not in raw.notes)]
                    raw.kernel_source = KernelOrigin.CUPTI.describe(
                        "model worker" + (coverage.describe() if coverage else "")
                    )
                    if coverage is not None:
                        if coverage.sampled:
                            raw.recorded_spans = [*raw.recorded_spans, *coverage.slices]
                        if coverage.callback_s is not None:
                            raw.tracer_callback_s = (raw.tracer_callback_s or 0.0) + coverage.callback_s
                        raw.notes = [*raw.notes, *(n for n in coverage.notes if n not in raw.notes)]
                    return
        if len(op_table):
            raw.kernels = KernelTable.concat([raw.kernels, op_table])
            raw.kernel_source = KernelOrigin.OP_RANGES.describe("model worker ops, host time")
            return
        if m.nvtx_template is None and m.hook is None:
            return
        if not len(raw.kernels):
            raw.kernels_unavailable = Unavailable(
                "CUPTI in the model worker recorded no kernel inside the window (none of its recorded slices fell in "
                "it: a window shorter than the pause between slices, or a recorder that could not start)"
                if m.cupti
                else "the model worker recorded no kernels or op ranges in the window (MODULAR_ENABLE_PROFILING must "
                "reach the worker)"
            )


class NsysRecorder(UtilizationRecorder):
    """``nsys launch --cuda-graph-trace=node`` around the server, ``nsys start`` / ``stop`` around the one window; the
    report is verified and read back."""

    mode = "nsys"
    reads_after_teardown = True

    def __init__(self, nsys: str, dest: Path, tool_env: dict[str, str], progress: Progress) -> None:
        self.nsys, self.dest, self.tool_env = nsys, dest, tool_env
        stale = sp.clean_stale_nsys_sessions(nsys, tool_env)
        if stale:
            progress("shut down stale max-profile nsys sessions: " + ", ".join(stale))
        self.session = sp.nsys_session_name()
        self.rep_base = str(dest / "serve")
        self.collecting = False
        self.launched_any = False

    def command(self, serve_cmd: list[str]) -> list[str]:
        self.launched_any = True
        return sp.nsys_launch_command(self.nsys, self.session, serve_cmd)

    def window(self, index: int, server: ServerHandle, progress: Progress) -> Recorder | None:
        return NsysWindow(self, progress)

    def close(self) -> None:
        if self.collecting:
            run_bounded(sp.nsys_stop_command(self.nsys, self.session), self.tool_env, timeout_s=120)
            self.collecting = False
        if self.launched_any:
            run_bounded(sp.nsys_shutdown_command(self.nsys, self.session), self.tool_env, timeout_s=60)

    def read_after_teardown(self, raw: RawCapture, span: tuple[int, int]) -> None:
        """After close(): the report verified, exported to SQLite and read back."""

        rep = self.rep_base + ".nsys-rep"
        why = sp.verify_artifact(rep, "nsys-rep")
        if why:
            raise CaptureError(f"nsys wrote no usable report: {why}")
        sqlite_path = self.rep_base + ".sqlite"
        why = export_sqlite(self.nsys, rep, sqlite_path, env=self.tool_env) or sp.verify_artifact(sqlite_path, "sqlite")
        if why:
            raw.kernels_unavailable = Unavailable(f"the nsys report could not be read back: {why}")
            return
        try:
            trace = read_nsys_sqlite(sqlite_path)
        except TraceFormatError as exc:
            raw.kernels_unavailable = Unavailable(f"the nsys report could not be read back: {exc}")
            return
        merge_trace(raw, trace, KernelOrigin.NSYS.describe("max serve"), sqlite_path)

    def artifacts(self) -> list[str]:
        rep = self.rep_base + ".nsys-rep"
        return [f"{rep}  (open with: nsys-ui {rep})", self.rep_base + ".sqlite"]


class NsysWindow:
    """``nsys start`` / ``stop`` of the mode's session around the window (read back after teardown)."""

    name = "nsys"

    def __init__(self, mode: NsysRecorder, progress: Progress) -> None:
        self.mode, self.progress = mode, progress

    def start(self) -> None:
        m = self.mode
        rc, out = run_bounded(sp.nsys_start_command(m.nsys, m.session, m.rep_base), m.tool_env, timeout_s=120)
        if rc != 0:
            raise CaptureError(f"`nsys start --session={m.session}` failed (exit {rc}): {out.strip()[-300:]}")
        m.collecting = True

    def stop(self, failed: bool) -> None:
        """``nsys stop`` (writes the report); after a failure nothing (``close()`` stops a session still collecting)."""
        m = self.mode
        if failed:
            return
        self.progress("nsys stop (writes the report; can take a minute)")
        rc, out = run_bounded(sp.nsys_stop_command(m.nsys, m.session), m.tool_env)
        m.collecting = False
        if rc != 0:
            raise CaptureError(f"`nsys stop --session={m.session}` failed (exit {rc}): {out.strip()[-300:]}")

    def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        return None  # the report is written when the session ends: read_after_teardown


class RocprofRecorder(UtilizationRecorder):
    """rocprofv3 with ``--collection-period (R2 + 10):DURATION:1`` counted from launch; R2 (launch to /health 200) is
    measured by a probe pass of the plain server first (``measure_ready``), when the server's command is asked for: the
    recorder itself starts nothing."""

    mode = "rocprof"
    reads_after_teardown = True

    def __init__(
        self, rocprof: str, dest: Path, duration_s: float, measure_ready: Callable[[], float], progress: Progress
    ) -> None:
        self.rocprof, self.dest, self.duration_s = rocprof, dest, duration_s
        self.measure_ready, self.progress = measure_ready, progress
        self.delay = 0.0
        self.out_dir = dest / "rocprof"
        self.t_launch = 0.0

    def command(self, serve_cmd: list[str]) -> list[str]:
        """Pass 2 (the probe server: R2), then pass 3's command: rocprofv3 around the server, its period from R2."""
        r2 = self.measure_ready()
        self.delay = r2 + sp.ROCPROF_WINDOW_DELAY_S
        self.progress(
            f"pass 3: R2 = {r2:.1f} s, window {self.delay:.1f}–{self.delay + self.duration_s:.1f} s after launch"
        )
        return sp.rocprof_command(self.rocprof, str(self.out_dir), self.delay, self.duration_s, serve_cmd)

    def launched(self, at_monotonic: float) -> None:
        self.t_launch = at_monotonic

    def window(self, index: int, server: ServerHandle, progress: Progress) -> Recorder | None:
        return RocprofWindow(self)

    def read_after_teardown(self, raw: RawCapture, span: tuple[int, int]) -> None:
        """After close(): rocprofv3 writes its files when the server's group is stopped."""

        csv_path = sp.find_rocprof_kernel_csv(self.out_dir)
        why = (
            sp.verify_artifact(csv_path, "rocprof-csv", min_bytes=64)
            if csv_path
            else f"no *kernel_trace.csv under {self.out_dir}"
        )
        if why:
            raw.kernels_unavailable = Unavailable(f"rocprofv3 wrote no usable kernel trace: {why}")
            return
        try:
            trace = rocprof_csv_capture(str(csv_path))
        except TraceFormatError as exc:
            raw.kernels_unavailable = Unavailable(f"the rocprofv3 kernel trace could not be read: {exc}")
            return
        raw.kernels, raw.ranges, raw.kernel_clock, raw.kernel_source = (
            trace.kernels,
            trace.ranges,
            "trace",
            "rocprofv3 (max serve)",
        )
        raw.notes = [*raw.notes, *trace.notes]

    def artifacts(self) -> list[str]:
        found = sp.find_rocprof_kernel_csv(self.out_dir)
        return [str(found or self.out_dir)]


class RocprofWindow:
    """rocprofv3's collection period opens and closes by the clock (counted from launch): the window waits for it."""

    name = "rocprof"

    def __init__(self, mode: RocprofRecorder) -> None:
        self.mode = mode

    def start(self) -> None:
        m = self.mode
        time.sleep(max(m.t_launch + m.delay - time.monotonic(), 0.0))  # the collection period opens by the clock

    def stop(self, failed: bool) -> None:
        m = self.mode
        if not failed:
            time.sleep(max(m.t_launch + m.delay + m.duration_s + 1.0 - time.monotonic(), 0.0))  # let the period close

    def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
        return None  # rocprofv3 writes its files when the server's group is stopped: read_after_teardown
