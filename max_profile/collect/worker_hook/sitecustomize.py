"""max_profile worker hook: CUPTI kernel recording inside `max serve`'s model worker (NVIDIA).

Python imports this ``sitecustomize`` at start-up in every process that has this folder on
PYTHONPATH. It does nothing unless MAX_PROFILE_WORKER_CUPTI_DIR is set; then a daemon thread
follows files that max_profile creates in that folder:

- ``prepare`` (after /health answers): a process without the CUDA driver loaded writes
  ``skipped-<pid>.txt`` and ends the hook; the others import CUPTI and write ``ready-<pid>``
  (or ``unavailable-<pid>.txt`` with the reason), so the import is done before the window;
- ``start`` / ``stop``: kernels are recorded in between, then written as ``kernels-<pid>.json``
  (a KernelTable as JSON, host perf_counter clock) with ``coverage-<pid>.json`` (when the
  recording really ran, and records CUPTI dropped).
"""

from __future__ import annotations

import os
import threading
import time


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


def _watch(folder: str) -> None:
    pid = os.getpid()
    prepare, start, stop = (os.path.join(folder, name) for name in ("prepare", "start", "stop"))
    if not _wait_for(prepare, stop, 0.05):
        return
    if not _cuda_driver_loaded():
        _write(os.path.join(folder, f"skipped-{pid}.txt"), "no libcuda in this process\n")
        return
    notes: list[str] = []
    try:
        from max_profile.collect.cupti_native import make_cupti_collector

        # launch records only where phase ranges will need them (MAX_PROFILE_WORKER_CUPTI_LAUNCHES=1)
        collector = make_cupti_collector(notes, launches=os.environ.get("MAX_PROFILE_WORKER_CUPTI_LAUNCHES", "1") == "1")
    except Exception as exc:  # noqa: BLE001 - no CUPTI in this process: say so once
        _write(os.path.join(folder, f"unavailable-{pid}.txt"), f"{type(exc).__name__}: {exc}\n")
        return
    _write(os.path.join(folder, f"ready-{pid}"), "")
    if not _wait_for(start, stop, 0.01):
        return
    try:
        collector.start()
    except Exception as exc:  # noqa: BLE001 - e.g. another CUPTI client holds this process: say why, record nothing
        _write(os.path.join(folder, f"unavailable-{pid}.txt"), f"{type(exc).__name__}: {exc}\n")
        return
    started = time.perf_counter_ns()
    _wait_for(stop, None, 0.02)
    stopped = time.perf_counter_ns()
    kernels = collector.stop()
    if getattr(collector, "unfinished", 0):
        notes.append(f"CUPTI: {collector.unfinished} kernel(s) were still running when the window closed (no end time): left out")
    if len(kernels):
        import json

        tmp = os.path.join(folder, f".kernels-{pid}.json")
        with open(tmp, "wb") as fh:
            fh.write(kernels.to_json())
        _write(os.path.join(folder, f"coverage-{pid}.json"), json.dumps({"started_ns": started, "stopped_ns": stopped, "dropped": collector.dropped,
                                                                             "callback_s": collector.callback_s_before_stop, "api_records": collector.api_records,
                                                                             "api_filter": collector.api_filter, "notes": notes,
                                                                             "stop_s": getattr(collector, "stop_s", None),
                                                                             "collector": type(collector).__name__}))
        os.replace(tmp, os.path.join(folder, f"kernels-{pid}.json"))


_folder = os.environ.get("MAX_PROFILE_WORKER_CUPTI_DIR")
if _folder and os.path.isdir(_folder):
    threading.Thread(target=_watch, args=(_folder,), daemon=True, name="max-profile-cupti").start()
