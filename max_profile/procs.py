"""Ending only what max_profile started: its children run in their own process group (session)."""

from __future__ import annotations

import os
import signal
import subprocess


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, to the process group of ``proc`` (started with ``start_new_session=True``).

    Never signals anything outside that group: no ``pkill``, no name matching.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
