"""Ending only what max_profile started: its children run in their own process group (session)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from max_profile.errors import Terminated


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


PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` after which the child gets SIGTERM when this process dies, even killed outright (SIGKILL, an OOM
    kill, a CI timeout): a server or profiler we started is never orphaned (Linux ``prctl(PR_SET_PDEATHSIG)``; None, no
    effect, elsewhere). Resolved here, in the parent: the child only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the call: nobody would signal us
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def run_bounded(
    cmd: Sequence[str], env: dict[str, str] | None = None, timeout_s: float = 300.0, stdout: IO[bytes] | None = None
) -> tuple[int, str]:
    """Run one tool call (argument list, never a shell string) in its own process group; (exit code, output).

    124 on timeout; the group is ended on timeout, error or Ctrl-C. With ``stdout`` (an open file) the
    tool's standard output goes there and the text returned is its standard error.
    """
    out_to = subprocess.PIPE if stdout is None else stdout
    err_to = subprocess.STDOUT if stdout is None else subprocess.PIPE
    proc = subprocess.Popen(
        list(cmd),
        stdout=out_to,
        stderr=err_to,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )
    try:
        raise_pending_signal()
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return 124, f"timed out after {timeout_s:.0f} s"
    except BaseException:
        kill_group(proc)
        raise
    return proc.returncode, (out if stdout is None else err).decode(errors="replace")


@contextlib.contextmanager
def child_python_env() -> Iterator[None]:
    """Make child Pythons run this interpreter while spawning one.

    After a model load, MAX 26.7's native code sets ``PYTHONEXECUTABLE`` (to the ``python3`` found
    on PATH) and ``PYTHONPATH=:`` in the C environment; ``BackgroundRecorder`` then starts a
    Python without MAX and dies with "Recorder process died with no message". The C values are
    put back afterwards.
    """
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    keys = ("PYTHONEXECUTABLE", "PYTHONPATH")
    saved_c: dict[str, bytes | None] = {key: libc.getenv(key.encode()) for key in keys}
    saved_py: dict[str, str | None] = {key: os.environ.get(key) for key in keys}
    os.environ["PYTHONEXECUTABLE"] = sys.executable
    if saved_c["PYTHONPATH"] is not None and saved_c["PYTHONPATH"].strip(b":") == b"":
        os.environ.pop("PYTHONPATH", None)
        os.unsetenv("PYTHONPATH")
    try:
        yield
    finally:
        for key in keys:
            # os.environ gets its own earlier value back (MAX's C-level values must not leak into it: every
            # later subprocess.run(env={**os.environ}) would start the wrong Python); the C environment gets MAX's
            before = saved_py[key]
            if before is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = before
            value = saved_c[key]
            if value is None:
                os.unsetenv(key)
            else:
                os.putenv(key, value.decode())


def clean_child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for Python children that start this interpreter (see :func:`child_python_env`)."""
    env = dict(os.environ)
    env["PYTHONEXECUTABLE"] = sys.executable
    if env.get("PYTHONPATH", "x").strip(":") == "":
        env.pop("PYTHONPATH", None)
    env.update(extra or {})
    return env


_PENDING: list[str] = []
"""Signals the CLI's handlers saw (``SIGINT``, ``SIGTERM``): kept because the exception a handler raises can be lost.
A signal that lands while Python runs a fork hook (``logging``'s, inside ``subprocess.Popen``) raises there, and the
interpreter prints "Exception ignored" and goes on: a Ctrl-C at that moment let a serve capture run to its end."""


def raise_on_signals() -> tuple[Any, Any] | None:
    """In the main thread: SIGINT raises KeyboardInterrupt and SIGTERM :class:`Terminated` (the cleanup of Ctrl-C runs
    for both), and each is remembered for :func:`raise_pending_signal`. Returns the old handlers (None elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    _PENDING.clear()

    def on_int(signum: int, frame: object) -> None:
        _PENDING.append("SIGINT")
        raise KeyboardInterrupt

    def on_term(signum: int, frame: object) -> None:
        _PENDING.append("SIGTERM")
        raise Terminated()

    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # started to ignore Ctrl-C (a background job): kept
    return (signal.SIG_IGN if ignored else signal.signal(signal.SIGINT, on_int)), signal.signal(signal.SIGTERM, on_term)


def restore_signals(previous: tuple[Any, Any] | None) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def raise_pending_signal() -> None:
    """Raise again a Ctrl-C or SIGTERM whose exception was lost (see ``_PENDING``); called after starting a process and
    in the waits of a capture."""
    if _PENDING:
        if _PENDING[-1] == "SIGTERM":
            raise Terminated()
        raise KeyboardInterrupt


def max_command() -> list[str]:
    """How to run the ``max`` CLI of this interpreter's MAX: the script beside the interpreter (a venv's, not
    activated, is not on PATH), else the one on PATH, else the interpreter running MAX's entry point."""
    exe = Path(sys.executable).with_name("max")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("max")
    if found:
        return [found]
    return [
        sys.executable,
        "-c",
        "import sys; from max._entrypoints.pipelines import main; sys.argv[0] = 'max'; main()",
    ]
