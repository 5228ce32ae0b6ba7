"""`max-profile serve` against real `max serve` on the CPU (tiny model): end to end, and fault injection.

Every case checks that nothing is left behind: no process of the server's (found by its port in
/proc), no temp folder, and a foreign process with "max" in its name still running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from max_profile.collect.gpu_sampling import clean_child_env
from max_profile.model import KernelBreakdown, Unavailable
from max_profile.serve import ServeError, ServePlan, free_port, run_serve_capture

from .conftest import REPO

pytestmark = pytest.mark.slow


def procs_with(text: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and "-m pytest" not in cmd:
            out.append(int(pid))
    return out


def serve_tmpdirs() -> set[str]:
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).glob("max-profile-serve-*")}


@pytest.fixture()
def foreign_max_process() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["bash", "-c", "exec -a max-serve-foreign-process sleep 600"], start_new_session=True)
    yield proc
    assert proc.poll() is None, "a foreign process with 'max' in its name was killed"
    proc.kill()
    proc.wait()


def _plan(model: Path, **kw: object) -> ServePlan:
    base = {"model_path": str(model), "devices": "cpu", "mode": "utilization", "duration_s": 3.0, "port": free_port(), "metrics_port": free_port(), "max_tokens": 8}
    base.update(kw)
    return ServePlan(**base)  # type: ignore[arg-type]


def _assert_clean(port: int, before_tmp: set[str]) -> None:
    deadline = time.monotonic() + 10
    while procs_with(f"--port {port}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not procs_with(f"--port {port}"), "server processes left running"
    assert serve_tmpdirs() <= before_tmp, "temp folder left behind"


def test_utilization_mode_end_to_end(tiny_model_dir: Path, foreign_max_process: subprocess.Popen[bytes], tmp_path: Path) -> None:
    before = serve_tmpdirs()
    plan = _plan(tiny_model_dir)
    report = run_serve_capture(plan, confirm=True, artifacts_dir=str(tmp_path / "art"))
    s = report.serve
    assert s is not None and s.requests >= 2 and s.failed_requests == 0
    assert s.ttft_ms_p50 is not None and s.itl_ms_p50 is not None and s.time_to_ready_s is not None
    assert isinstance(report.utilization, Unavailable) and "no GPU" in report.utilization.reason
    assert (tmp_path / "art" / "server.log").read_text().strip()
    _assert_clean(plan.port, before)


def test_kernels_mode_uses_scheduler_ranges(tiny_model_dir: Path) -> None:
    plan = _plan(tiny_model_dir, mode="kernels", warm=False, duration_s=4.0)
    report = run_serve_capture(plan, confirm=True)
    k = report.kernels
    assert isinstance(k, KernelBreakdown), k
    phases = {p.phase: p for p in k.phases}
    assert phases["decode"].steps > 5 and "attention" in {f.family for f in k.families}
    assert "--no-device-graph-capture" in report.serve.commands[0]  # type: ignore[union-attr]


def test_not_confirmed_starts_nothing(tiny_model_dir: Path) -> None:
    plan = _plan(tiny_model_dir)
    with pytest.raises(ServeError, match="not confirmed"):
        run_serve_capture(plan, confirm=lambda p: False)
    assert not procs_with(f"--port {plan.port}")


def test_missing_model_path() -> None:
    t = time.monotonic()
    with pytest.raises(ServeError, match="does not exist"):
        run_serve_capture(_plan(Path("/nonexistent/model")), confirm=True)
    assert time.monotonic() - t < 5


def test_port_already_taken(tiny_model_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t = time.monotonic()
        with pytest.raises(ServeError, match=f"port {port} is already in use"):
            run_serve_capture(_plan(tiny_model_dir, port=port), confirm=True)
        assert time.monotonic() - t < 5


def test_bad_flag_fails_fast_with_log_line(tiny_model_dir: Path) -> None:
    before = serve_tmpdirs()
    plan = _plan(tiny_model_dir, warm=False, extra_args=["--no-such-flag"])
    with pytest.raises(ServeError) as err:
        run_serve_capture(plan, confirm=True, ready_timeout_s=300)
    assert "No such option" in str(err.value) and "--no-such-flag" in str(err.value)
    _assert_clean(plan.port, before)


def test_server_killed_during_window(tiny_model_dir: Path) -> None:
    before = serve_tmpdirs()
    plan = _plan(tiny_model_dir, warm=False, duration_s=60.0)
    killed: list[float] = []

    def on_progress(msg: str) -> None:
        if msg.startswith("/health 200"):
            def kill() -> None:
                time.sleep(3)
                for pid in procs_with(f"--port {plan.port}"):
                    try:
                        os.killpg(os.getpgid(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                killed.append(time.monotonic())

            threading.Thread(target=kill, daemon=True).start()

    with pytest.raises(ServeError, match="died during the capture window"):
        run_serve_capture(plan, confirm=True, progress=on_progress)
    assert killed and time.monotonic() - killed[0] < 5
    _assert_clean(plan.port, before)


@pytest.mark.parametrize("stage", ["warm pass", "/health 200"])
def test_ctrl_c(tiny_model_dir: Path, stage: str, foreign_max_process: subprocess.Popen[bytes]) -> None:
    before = serve_tmpdirs()
    port = free_port()
    cmd = [sys.executable, "-m", "max_profile", "serve", "--model-path", str(tiny_model_dir), "--port", str(port), "--duration", "60", "--yes", "--max-tokens", "8"]
    if stage != "warm pass":
        cmd.append("--no-warm")
    # clean_child_env: an in-process MAX load earlier in this pytest process set PYTHONEXECUTABLE in the C environment
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO), env=clean_child_env())
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if stage in line:
            break
    time.sleep(1.5)
    t = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=30)
    assert time.monotonic() - t < 5
    assert rc == 130, "".join(lines) + proc.stderr.read()
    assert "interrupted" in proc.stderr.read()
    _assert_clean(port, before)
