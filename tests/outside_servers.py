"""`max serve` started the way a user starts it (not by max_profile), for the tests of `attach`: its own process
group, a free API and metrics port, its log in a file; healthy or a failed assertion with the log's tail; stopped by
process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from max_profile.util.procs import clean_child_env

from .ports import free_port


class OutsideServer:
    def __init__(
        self, proc: subprocess.Popen[bytes], port: int, metrics_port: int, log: Path, detached_pid: int | None = None
    ) -> None:
        self.proc, self.port, self.metrics_port, self.log = proc, port, metrics_port, log
        self.detached_pid = detached_pid
        """A server started the way ``setsid max serve ... &`` leaves it: its launcher gone, its parent the machine's
        init (PID 1, or the nearest subreaper); ``proc`` is then the launcher, whose process group it keeps."""

    @property
    def pid(self) -> int:
        return self.detached_pid if self.detached_pid is not None else self.proc.pid

    def running(self) -> bool:
        if self.detached_pid is None:
            return self.proc.poll() is None
        try:
            os.kill(self.detached_pid, 0)
        except ProcessLookupError:
            return False
        return Path(f"/proc/{self.detached_pid}/stat").read_text().split(") ")[-1][:1] != "Z"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                return resp.status == 200
        except OSError:
            return False

    def wait_healthy(self, timeout_s: float = 900) -> None:
        """Until /health answers 200 (a cold compile cache compiles the tiny model first)."""
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            assert self.running(), f"max serve exited: {self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "max serve did not become healthy"
            time.sleep(1)

    def stop(self) -> None:
        if self.detached_pid is not None:  # its process group is the launcher's (setsid made it the group's leader)
            if self.running():
                os.killpg(self.proc.pid, signal.SIGTERM)
                deadline = time.monotonic() + 30
                while self.running() and time.monotonic() < deadline:
                    time.sleep(0.2)
                if self.running():
                    os.killpg(self.proc.pid, signal.SIGKILL)
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_outside_server(model: Path, log: Path, env: Mapping[str, str] = {}, detached: bool = False) -> OutsideServer:
    """`max serve --model-path MODEL --devices cpu` on free ports, with ``env`` added to a clean environment.
    ``detached``: as `setsid max serve ... &` leaves it, its launcher gone (its parent the machine's init)."""
    port, metrics_port = free_port(), free_port()
    child_env = clean_child_env({"MAX_SERVE_METRICS_ENDPOINT_PORT": str(metrics_port), "HF_HUB_OFFLINE": "1", **env})
    cmd = [str(Path(sys.executable).parent / "max"), "serve", "--model-path", str(model), "--devices", "cpu"]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    pid_file = log.with_suffix(".pid")
    if detached:  # a shell that starts the server in the background, writes its pid and exits
        cmd = ["sh", "-c", '"$@" & echo $! > "$0"', str(pid_file), *cmd]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env, start_new_session=True
        )
    if not detached:
        return OutsideServer(proc, port, metrics_port, log)
    proc.wait(timeout=30)
    return OutsideServer(proc, port, metrics_port, log, detached_pid=int(pid_file.read_text()))
