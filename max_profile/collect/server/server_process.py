"""``max serve`` as a child process: launched in its own process group and TMPDIR, its log scanned for early errors,
waited on until ``/health`` answers, stopped by its group only; free ports and the ``max`` command of this interpreter.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from max_profile.errors import CaptureError
from max_profile.util.procs import die_with_parent, kill_group, raise_pending_signal

EARLY_ERRORS = re.compile(
    r"(Error: No such option|Error: Invalid value|No such file or directory|does not exist|is not a valid|"
    r"Address already in use|address already in use|out of memory|OutOfMemory|CUDA_ERROR|No architecture found|"
    r"ABORT: |Process launch is not allowed in this state|Failed to import custom model|Traceback \(most recent call "
    r"last\)|Worker crashed|ValueError:|RuntimeError:|ModuleNotFoundError:)"
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


MAX_LOG_LINE = 500


def scan_server_log(text: str, last: int = 5) -> list[str]:
    """The last ``last`` lines of a server log that show an early error (bad flag, missing model, OOM, port in use...).

    Telemetry noise is skipped; each line is cut to MAX_LOG_LINE characters (a log can hold anything).
    """
    lines = [
        ln.strip()[:MAX_LOG_LINE]
        for ln in text.splitlines()
        if len(ln) < 100_000 and not ln.startswith("[modular-cache]") and EARLY_ERRORS.search(ln)
    ]
    return [ln for ln in lines if "telemetry" not in ln.lower()][-last:]


class ServerProcess:
    """``max serve`` in its own process group and TMPDIR, with its log in that folder."""

    def __init__(self, cmd: list[str], env: dict[str, str], workdir: Path) -> None:
        self.cmd = cmd
        self.workdir = workdir
        self.log_path = workdir / "server.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.started_unix = time.time()
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=str(workdir),
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        try:
            raise_pending_signal()  # a Ctrl-C lost inside the fork: the server is stopped, the capture ends
        except BaseException:
            self.stop()
            raise

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def early_errors(self) -> list[str]:
        return scan_server_log(self.log_text())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        kill_group(self.proc, grace_s=10)
        self._log.close()


def wait_ready(server: ServerProcess, port: int, timeout_s: float, progress: Callable[[str], None]) -> float:
    """Seconds to /health 200. Fails at once when the process dies or its log shows an early error."""
    t0 = time.monotonic()
    announced = 0.0
    while True:
        raise_pending_signal()
        if not server.alive():
            lines = server.early_errors() or server.log_text().strip().splitlines()[-5:]
            raise CaptureError(
                f"the server exited (code {server.proc.returncode}) before it was ready: " + " | ".join(lines)
            )
        errors = [ln for ln in server.early_errors() if "Traceback" not in ln or len(server.early_errors()) == 1]
        if errors and time.monotonic() - t0 > 1.0:
            time.sleep(1.0)  # let the traceback's last line reach the log
            raise CaptureError(
                "the server log shows an error before it was ready: " + " | ".join(server.early_errors())
            )
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return time.monotonic() - t0
        except (OSError, http.client.HTTPException):
            pass
        elapsed = time.monotonic() - t0
        if elapsed > timeout_s:
            raise CaptureError(
                f"/health did not answer 200 within {timeout_s:.0f} s (server still starting: a cold compile?)"
            )
        if elapsed - announced > 15:
            announced = elapsed
            progress(f"waiting for /health ({elapsed:.0f} s)")
        time.sleep(0.25)


@contextlib.contextmanager
def server_tmpdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="max-profile-serve-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
