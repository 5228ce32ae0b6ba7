"""max_profile worker hook: the model worker's steps and (NVIDIA) its kernels, recorded inside `max serve`.

Python imports this ``sitecustomize`` at start-up in every process that has this folder on
PYTHONPATH. It does nothing unless MAX_PROFILE_WORKER_CUPTI_DIR is set; then a daemon thread
follows files that max_profile creates in that folder:

- ``prepare`` (after /health answers): a process that holds a MAX text-generation pipeline hooks its
  ``execute`` (each batch stamped prefill / decode / mixed, with its size and tokens, while a window records);
  a process with the CUDA driver loaded imports CUPTI too (unless MAX_PROFILE_WORKER_KERNELS=0), so the import
  is done before the window. A process with neither writes ``skipped-<pid>.txt`` and ends the hook; the others
  write ``ready-<pid>`` (JSON: what they record), or ``unavailable-<pid>.txt`` with the reason;
- ``start-N`` / ``stop-N`` (N = 1, 2, ...: one server, several windows): kernels are recorded in between;
  ``start-N`` may hold JSON: ``{"share": 0.25, "slice_s": 0.5}`` records slices of ``slice_s`` seconds, a ``share`` of
  the time (recording paused in between), ``"options"`` the recorder's (``cupti_native.RECORDING_OPTIONS``),
  ``"kernels": false`` only the steps (CUPTI left off: what the step hook alone costs, benchmarks/serve_ab.py);
  ``started-<pid>-N`` (the seconds CUPTI's enable took) says recording runs, so the window opens after it;
  then written as ``kernels-<pid>-N.json`` (a KernelTable as JSON, host perf_counter clock) with
  ``coverage-<pid>-N.json`` (when the recording really ran, records CUPTI dropped, its callback time), and
  ``steps-<pid>-N.json`` (the pipeline's steps in the window, the same clock) where a pipeline was hooked;
- ``quit``: the hook ends (a process that never saw ``prepare`` too).

The controller side is :mod:`max_profile.collect.server.worker_protocol`.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from max_profile.model import KernelTable  # lazy: runs in every server process


def _cuda_driver_loaded() -> bool:
    """Whether this process has mapped libcuda (the model worker has, after /health)."""
    try:
        with open("/proc/self/maps") as fh:
            return any("libcuda.so" in line for line in fh)
    except OSError:
        return True  # cannot tell: try CUPTI


def _wait_for(path: str, give_up: str | None, poll_s: float) -> bool:
    while not os.path.exists(path):
        if give_up is not None and os.path.exists(give_up):
            return False
        time.sleep(poll_s)
    return True


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _window_plan(path: str) -> dict:  # type: ignore[type-arg]
    """What ``start-N`` asks for (empty: record the whole window, the default recording)."""
    import json

    try:
        with open(path) as fh:
            text = fh.read().strip()
        plan = json.loads(text) if text else {}
    except (OSError, ValueError):
        return {}
    return plan if isinstance(plan, dict) else {}


def _record_until_stop(
    collector: object, stop: str, share: float, slice_s: float, on_at: int, lead_s: float = 0.0
) -> list[list[int]]:
    """Record until ``stop`` exists: all the time, or (``share`` < 1, a collector that can pause) slices of ``slice_s``
    seconds with the recording paused for ``slice_s * (1 - share) / share`` between them, the first ``lead_s`` longer
    (the controller's settle before its window opens: every window then starts with a whole recorded slice, however
    short it is). ``on_at``: when the recording started (perf_counter ns, stamped before the controller was told: a
    thread held up after it must not shorten the first slice). Returns the recorded slices (perf_counter ns)."""
    pause, resume = getattr(collector, "pause", None), getattr(collector, "resume", None)
    if not (0 < share < 1) or pause is None or resume is None:
        _wait_for(stop, None, 0.02)
        return [[on_at, time.perf_counter_ns()]]
    off_s = slice_s * (1 - share) / share
    slices: list[list[int]] = []
    lead_ns = int(lead_s * 1e9)
    while True:
        if _wait_until(stop, on_at + lead_ns + int(slice_s * 1e9)):
            return [*slices, [on_at, time.perf_counter_ns()]]
        pause()
        off_at = time.perf_counter_ns()
        slices.append([on_at, off_at])
        if _wait_until(stop, off_at + int(off_s * 1e9)):
            return slices
        resume()
        on_at, lead_ns = time.perf_counter_ns(), 0


def _drop_pause_spanning(kernels: KernelTable, slices: list[list[int]], stopped: int) -> tuple[KernelTable, int]:
    """Kernels of a sampled recording without those stamped across a pause, the one before the stop included
    (:meth:`KernelTable.across_pauses`)."""
    spanning = kernels.across_pauses([(a, b) for a, b in slices], stopped)
    return (kernels.select(~spanning), int(spanning.sum())) if spanning.any() else (kernels, 0)


def _spans_recorded(slices: list[list[int]], enabled_at: int, stopped: int, stop_at: int) -> list[tuple[int, int]]:
    """When CUPTI really recorded: the slices, the first from when its enable began (``enabled_at``: launches during
    the enable are recorded) and a last one that ran to the stop until the recorder stopped (``stop_at``: the steps are
    written first)."""
    spans = [(int(a), int(b)) for a, b in slices]
    if spans:
        spans[0] = (min(spans[0][0], enabled_at), spans[0][1])
        if spans[-1][1] >= stopped - 1_000_000:
            spans[-1] = (spans[-1][0], max(spans[-1][1], stop_at))
    return spans


def _wait_until(path: str, deadline_ns: int) -> bool:
    """Whether ``path`` appeared before the deadline (perf_counter ns)."""
    while time.perf_counter_ns() < deadline_ns:
        if os.path.exists(path):
            return True
        time.sleep(min(0.01, max(deadline_ns - time.perf_counter_ns(), 0) / 1e9))
    return os.path.exists(path)


def _nvtx_log(on: bool) -> None:
    """A gated NVTX log (``MAX_PROFILE_NVTX_GATED=1``, MAX's op ranges in a profiling server): written only while a
    window records, flushed when it stops (so the controller reads it whole); nothing where this process has none."""
    if os.environ.get("MAX_PROFILE_NVTX_GATED") != "1" or not os.environ.get("MAX_PROFILE_NVTX_LOG"):
        return
    from max_profile.collect.live.nvtx_log import (  # lazy: runs in every server process
        flush_in_process,
        set_recording_in_process,
    )

    set_recording_in_process(on)
    if not on:
        flush_in_process()


def _pipeline_classes() -> list[type]:
    """The text-generation pipeline classes this process has loaded (the model worker's among them); none without
    MAX."""
    import sys

    if "max.pipelines.lib.pipeline_variants.text_generation" not in sys.modules:
        return []
    from max_profile.collect.live.pipeline_hook import pipeline_classes  # lazy: runs in every server process

    return pipeline_classes()


class _NoKernels:
    """Stands in for the CUPTI collector where kernels are not recorded (no CUDA driver here, or steps only)."""

    kernels: object = None

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None


def _steps_only_window(
    folder: str, pid: int, window: int, collector: Any, steps: Any, notes: list[str], t0: int
) -> None:
    """A window the controller asked to leave unrecorded: its steps stamped, no kernel recorded (CUPTI stays off)."""
    _write(os.path.join(folder, f"started-{pid}-{window}"), "0\n")
    _wait_for(os.path.join(folder, f"stop-{window}"), None, 0.02)
    now = time.perf_counter_ns()
    if steps is not None:
        steps.dump(folder, pid, window)
    note = "kernels not recorded in this window: steps only (CUPTI off)"
    _dump(folder, pid, window, type(collector.kernels).empty(), collector, t0, t0, now, [*notes, note], [], 1.0)


def _refused_window(
    folder: str,
    pid: int,
    window: int,
    collector: Any,
    steps: Any,
    notes: list[str],
    t0: int,
    options: list[str],
    exc: Exception,
) -> None:
    """A window whose recording options this CUPTI refused: nothing recorded, the reason in its notes."""
    _write(os.path.join(folder, f"started-{pid}-{window}"), "0\n")
    _wait_for(os.path.join(folder, f"stop-{window}"), None, 0.02)
    now = time.perf_counter_ns()
    said = f"recording option(s) {options} failed: {type(exc).__name__}: {exc}"
    _dump(folder, pid, window, type(collector.kernels).empty(), collector, t0, now, now, [*notes, said], [], 1.0)
    if steps is not None:
        steps.dump(folder, pid, window)


def _finish_window(
    folder: str,
    pid: int,
    window: int,
    collector: Any,
    notes: list[str],
    slices: list[list[int]],
    plan: dict[str, Any],
    t0: int,
    started: int,
    stopped: int,
) -> None:
    """Stop the recorder after a window, drop the records no recorded slice holds (each said in the window's notes),
    and write the window's kernels for the controller."""
    stop_at = time.perf_counter_ns()
    kernels = collector.stop()
    window_notes = list(notes)
    kernels, spanning = _drop_pause_spanning(kernels, slices, stopped)
    if spanning:
        window_notes.append(
            f"CUPTI: {spanning} kernel record(s) reached across a pause of the sampled recording (their end stamped "
            "only when recording resumed or stopped): left out"
        )
    if getattr(collector, "rejected_launches", 0):
        from max_profile.collect.live.cupti_decode import impossible_joins_note

        window_notes.append(impossible_joins_note(collector.rejected_launches))
    if getattr(collector, "resume_problem", None):
        window_notes.append(str(collector.resume_problem))
    if getattr(collector, "unfinished", 0):
        window_notes.append(
            f"CUPTI: {collector.unfinished} kernel(s) were still running when the window closed (no end time): left out"
        )
    spans = _spans_recorded(slices, t0, stopped, stop_at)
    counts, outside = kernels.per_slice(spans)
    by_start, _ = kernels.per_slice(spans, by_start=True)  # beside the launch-time counts: a wrong join shows
    if outside.any():
        kernels = kernels.select(~outside)
        window_notes.append(
            f"CUPTI: {int(outside.sum())} kernel record(s) carried a time outside every recorded slice (asked for "
            "over 10 ms before one began or 250 ms after it ended, where CUPTI records nothing): left out"
        )
    share = float(plan.get("share", 1.0))
    if share < 1 and getattr(collector, "pause", None) is None:
        window_notes.append(
            "this recorder cannot pause (cupti-python): the whole window was recorded, not a share of it"
        )
        share = 1.0
    _dump(
        folder,
        pid,
        window,
        kernels,
        collector,
        t0,
        started,
        stopped,
        window_notes,
        slices,
        share,
        {
            "per_slice": counts,
            "per_slice_by_start": by_start,
            "outside_slices": int(outside.sum()),
            "spanning_pauses": spanning,
        },
    )


def _watch(folder: str) -> None:
    import json

    pid = os.getpid()
    prepare, quit_ = os.path.join(folder, "prepare"), os.path.join(folder, "quit")
    if not _wait_for(prepare, quit_, 0.05):
        return
    pipelines = _pipeline_classes()
    cuda = _cuda_driver_loaded() and os.environ.get("MAX_PROFILE_WORKER_KERNELS", "1") == "1"
    if not cuda and not pipelines:
        _write(os.path.join(folder, f"skipped-{pid}.txt"), "no libcuda and no MAX pipeline in this process\n")
        return
    notes: list[str] = []
    collector: Any = _NoKernels()
    if cuda:
        try:
            from max_profile.collect.live.cupti_native import make_cupti_collector  # lazy: runs in every server process

            # launch records only where phase ranges will need them (MAX_PROFILE_WORKER_CUPTI_LAUNCHES=1)
            collector = make_cupti_collector(
                notes, launches=os.environ.get("MAX_PROFILE_WORKER_CUPTI_LAUNCHES", "1") == "1"
            )
        except Exception as exc:  # noqa: BLE001 - no CUPTI in this process: say so once
            if not pipelines:
                _write(os.path.join(folder, f"unavailable-{pid}.txt"), f"{type(exc).__name__}: {exc}\n")
                return
            notes.append(f"CUPTI unavailable in the model worker ({type(exc).__name__}: {exc}): steps only")
            cuda = False
    reserve = getattr(collector, "reserve", None)
    if (
        reserve is not None
    ):  # fault in the recorder's memory now, not inside the first window (see NativeCuptiCollector.reserve)
        reserve()
    steps = _StepStamps(pipelines) if pipelines else None
    _write(os.path.join(folder, f"ready-{pid}"), json.dumps({"kernels": cuda, "steps": steps is not None}))
    window = 0
    while True:
        window += 1
        start_file = os.path.join(folder, f"start-{window}")
        if not _wait_for(start_file, quit_, 0.01):
            if steps is not None:
                steps.close()
            return
        plan = _window_plan(start_file)
        if steps is not None:
            steps.open()
        t0 = time.perf_counter_ns()
        if plan.get("kernels") is False and not isinstance(collector, _NoKernels):  # steps only: CUPTI stays off
            _steps_only_window(folder, pid, window, collector, steps, notes, t0)
            continue
        if plan.get("kernels") is not False:
            _nvtx_log(True)
        try:
            if hasattr(collector, "options"):
                collector.options = tuple(str(o) for o in plan.get("options", ()))
            collector.start()
        except Exception as exc:  # noqa: BLE001 - e.g. another CUPTI client holds this process: say why, record nothing
            _nvtx_log(False)
            if plan.get("options"):  # a variant this CUPTI refuses (serve_ab): nothing recorded, the next ones go on
                _refused_window(folder, pid, window, collector, steps, notes, t0, plan["options"], exc)
                continue
            _write(os.path.join(folder, f"unavailable-{pid}.txt"), f"{type(exc).__name__}: {exc}\n")
            if steps is not None:
                steps.close()
            return
        started = time.perf_counter_ns()
        # the controller opens its window only after this file: CUPTI's enable (subscribe, activity on) stays outside it
        _write(os.path.join(folder, f"started-{pid}-{window}"), f"{(started - t0) / 1e9:.6f}\n")
        slices = _record_until_stop(
            collector,
            os.path.join(folder, f"stop-{window}"),
            float(plan.get("share", 1.0)),
            float(plan.get("slice_s", 0.5)),
            started,
            float(plan.get("lead_s", 0.0)),
        )
        stopped = time.perf_counter_ns()
        _nvtx_log(False)  # flushed before the steps are written: the controller reads the log once they are
        if steps is not None:
            steps.dump(
                folder, pid, window
            )  # first: a step running now is waited for by the next window's open, not here
        if isinstance(collector, _NoKernels):
            continue
        _finish_window(folder, pid, window, collector, notes, slices, plan, t0, started, stopped)


class _StepStamps:
    """The pipelines' ``execute`` hooked for the windows
    (:class:`~max_profile.collect.live.pipeline_hook.ClassStepHook`): each batch a :class:`~max_profile.model.Step`
    with its kind, size and tokens; written per window (an empty list where none ran: the controller waits for every
    process that records steps), nothing kept in between."""

    def __init__(self, classes: list[type]) -> None:
        from max_profile.collect.live.pipeline_hook import ClassStepHook  # lazy: runs in every server process

        self.hook = ClassStepHook(classes)
        self.installed = False

    def open(self) -> None:
        self.hook.steps.clear()
        if not self.installed:
            self.hook.install()
            self.installed = True

    def dump(self, folder: str, pid: int, window: int) -> None:
        import msgspec

        self.close()
        self.hook.wait_idle(timeout_s=5.0)  # a batch that started inside the window ends in it
        steps, self.hook.steps = list(self.hook.steps), []
        name = f"steps-{pid}-{window}.json"
        tmp = os.path.join(folder, "." + name)
        with open(tmp, "wb") as fh:
            fh.write(msgspec.json.encode(steps))
        os.replace(tmp, os.path.join(folder, name))

    def close(self) -> None:
        if self.installed:
            self.hook.uninstall()
            self.installed = False


def _dump(
    folder: str,
    pid: int,
    window: int,
    kernels: object,
    collector: object,
    enable_ns: int,
    started: int,
    stopped: int,
    notes: list[str],
    slices: list[list[int]],
    share: float,
    counts: dict[str, object] | None = None,
) -> None:
    """``coverage-<pid>-<window>.json`` then ``kernels-<pid>-<window>.json`` (a KernelTable), each written whole or not
    at all; ``counts``: the kernels per recorded slice and those left out (outside every slice, across a pause)."""
    import json

    coverage = {
        "started_ns": started,
        "stopped_ns": stopped,
        "dropped": getattr(collector, "dropped", 0),
        "callback_s": getattr(collector, "callback_s_before_stop", None),
        "api_records": getattr(collector, "api_records", 0),
        "start_s": (started - enable_ns) / 1e9,
        "api_filter": getattr(collector, "api_filter", ""),
        "notes": notes,
        "stop_s": getattr(collector, "stop_s", None),
        "collector": type(collector).__name__,
        "kernels": len(kernels),  # type: ignore[arg-type]
        "slices": slices,
        "share": share,
        "options": list(getattr(collector, "options", ())),
        "kernels_recorded": bool(slices),
        **(counts or {}),
    }
    # coverage first: the kernels file appearing is what the controller waits for
    for name, data in (
        (f"coverage-{pid}-{window}.json", json.dumps(coverage).encode()),
        (f"kernels-{pid}-{window}.json", kernels.to_json()),  # type: ignore[attr-defined]
    ):
        tmp = os.path.join(folder, "." + name)
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, os.path.join(folder, name))


def _watch_or_say(folder: str) -> None:
    """:func:`_watch`, and a hook that fails says why in ``unavailable-<pid>.txt`` (a thread that dies says nothing)."""
    try:
        _watch(folder)
    except Exception as exc:  # noqa: BLE001 - the server must not notice; the controller reads the reason
        import traceback

        _write(
            os.path.join(folder, f"unavailable-{os.getpid()}.txt"),
            f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}",
        )


_folder = os.environ.get("MAX_PROFILE_WORKER_CUPTI_DIR")
if _folder and os.path.isdir(_folder):
    threading.Thread(target=_watch_or_say, args=(_folder,), daemon=True, name="max-profile-cupti").start()
