"""max_profile worker hook: CUPTI kernel recording inside `max serve`'s model worker (NVIDIA).

Python imports this ``sitecustomize`` at start-up in every process that has this folder on
PYTHONPATH. It does nothing unless MAX_PROFILE_WORKER_CUPTI_DIR is set; then a daemon thread waits
for the file ``start`` in that folder, records kernels with CUPTI until ``stop`` appears, and writes
``kernels-<pid>.json`` (msgspec KernelRecord list, host perf_counter clock) when it recorded any.
"""

from __future__ import annotations

import os
import threading
import time


def _watch(folder: str) -> None:
    start, stop = os.path.join(folder, "start"), os.path.join(folder, "stop")
    try:
        # Import before the window opens: importing cupti + max_profile inside the window (while the
        # worker holds the GIL) cost seconds of the first H200 capture.
        from max_profile.collect.cupti_kernels import CuptiKernelCollector

        collector = CuptiKernelCollector()
    except Exception as exc:  # noqa: BLE001 - no CUPTI in this process: say so once
        with open(os.path.join(folder, f"unavailable-{os.getpid()}.txt"), "w") as fh:
            fh.write(f"{type(exc).__name__}: {exc}\n")
        return
    while not os.path.exists(start):
        if os.path.exists(stop):
            return
        time.sleep(0.02)
    collector.start()
    started = time.perf_counter_ns()
    while not os.path.exists(stop):
        time.sleep(0.02)
    stopped = time.perf_counter_ns()
    kernels = collector.stop()
    if kernels:
        import json

        import msgspec

        tmp = os.path.join(folder, f".kernels-{os.getpid()}.json")
        with open(tmp, "wb") as fh:
            fh.write(msgspec.json.encode(kernels))
        with open(os.path.join(folder, f"coverage-{os.getpid()}.json"), "w") as fh:
            json.dump({"started_ns": started, "stopped_ns": stopped, "dropped": collector.dropped}, fh)
        os.replace(tmp, os.path.join(folder, f"kernels-{os.getpid()}.json"))


_folder = os.environ.get("MAX_PROFILE_WORKER_CUPTI_DIR")
if _folder and os.path.isdir(_folder):
    threading.Thread(target=_watch, args=(_folder,), daemon=True, name="max-profile-cupti").start()
