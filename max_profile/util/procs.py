"""Ending only what max_profile started: its children run in their own process group (session)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from typing import IO


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


def run_bounded(cmd: Sequence[str], env: dict[str, str] | None = None, timeout_s: float = 300.0, stdout: IO[bytes] | None = None) -> tuple[int, str]:
    """Run one tool call (argument list, never a shell string) in its own process group; (exit code, output).

    124 on timeout; the group is ended on timeout, error or Ctrl-C. With ``stdout`` (an open file) the
    tool's standard output goes there and the text returned is its standard error.
    """
    out_to = subprocess.PIPE if stdout is None else stdout
    err_to = subprocess.STDOUT if stdout is None else subprocess.PIPE
    proc = subprocess.Popen(list(cmd), stdout=out_to, stderr=err_to, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return 124, f"timed out after {timeout_s:.0f} s"
    except BaseException:
        kill_group(proc)
        raise
    return proc.returncode, (out if stdout is None else err).decode(errors="replace")
