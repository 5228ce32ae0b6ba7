"""Out-of-process profilers around ``max serve``: Nsight Systems sessions and rocprofv3's timed window.

nsys (NVIDIA): ``nsys launch --session-new=S`` starts the server with injection but collects
nothing; ``nsys start --session=S -o R`` / ``nsys stop --session=S`` bound the window and write
``R.nsys-rep``; ``nsys shutdown --session=S`` ends the session. A session name that is still alive
makes ``launch`` fail with "Process launch is not allowed in this state", so every run takes a
unique name ``max-profile-<pid>-<random>`` and stale sessions of that prefix whose process is gone
are shut down first (never anybody else's).

rocprofv3 (AMD): ``--attach`` and run-under capture nothing for a server, so the window is a
collection period counted from launch: pass 1 warms the compile cache, pass 2 measures R2 (launch
to /health 200), pass 3 runs ``rocprofv3 --kernel-trace --marker-trace -f csv
--collection-period (R2+10):DURATION:1 -- max serve ...`` under load and stops it after the window.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path

from max_profile.util.files import SQLITE_MAGIC
from max_profile.util.procs import run_bounded

SESSION_PREFIX = "max-profile-"
NSYS_TIMEOUT_S = 300.0
"""nsys CLI calls can hang (a backgrounded ``nsys launch`` did for 10 min on the H200): every call is bounded."""
ROCPROF_WINDOW_DELAY_S = 10.0
"""The rocprofv3 window opens this long after /health first answered in pass 2 (R2 + 10 s)."""


def nsys_session_name(pid: int | None = None) -> str:
    """A session name no other run uses: our prefix, this process id, 8 random hex digits."""
    return f"{SESSION_PREFIX}{pid or os.getpid()}-{secrets.token_hex(4)}"


_SESSION_LINE = re.compile(r"^\s*(\d+)\s+\S+\s+(.+?)\s+(\d+)\s+(\S+)\s*$")


def parse_nsys_sessions(text: str) -> list[tuple[int, str, str]]:
    """``nsys sessions list -p false`` → (id, state, name) per line (columns ID TIME STATE LAUNCH NAME)."""
    out = []
    for line in text.splitlines():
        m = _SESSION_LINE.match(line)
        if m and not line.lstrip().startswith("ID"):
            out.append((int(m.group(1)), m.group(2).strip(), m.group(4)))
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_sessions(sessions: Sequence[tuple[int, str, str]], alive: Callable[[int], bool] = _pid_alive) -> list[str]:
    """Our sessions (``max-profile-<pid>-…``) whose creating max-profile process is gone."""
    stale = []
    for _id, _state, name in sessions:
        m = re.fullmatch(re.escape(SESSION_PREFIX) + r"(\d+)-[0-9a-f]+", name)
        if m and not alive(int(m.group(1))):
            stale.append(name)
    return stale


def nsys_launch_command(nsys: str, session: str, serve_cmd: Sequence[str]) -> list[str]:
    """``nsys launch``: with ``--cuda-graph-trace=node``, as `max serve` replays device graphs by default and nsys's own
    default (``graph``) would record each replay whole, without its kernels (the switch is accepted by ``launch``: nsys
    2025.3.1)."""
    return [nsys, "launch", f"--session-new={session}", "--trace=cuda,nvtx", "--cuda-graph-trace=node", *serve_cmd]


def nsys_start_command(nsys: str, session: str, output: str) -> list[str]:
    return [nsys, "start", f"--session={session}", "-o", output, "--force-overwrite=true"]


def nsys_stop_command(nsys: str, session: str) -> list[str]:
    return [nsys, "stop", f"--session={session}"]


def nsys_shutdown_command(nsys: str, session: str) -> list[str]:
    return [nsys, "shutdown", f"--session={session}"]


def clean_stale_nsys_sessions(nsys: str, env: dict[str, str] | None = None) -> list[str]:
    """Shut down sessions this tool left behind earlier (prefix ours, process gone). Returns their names."""
    rc, out = run_bounded([nsys, "sessions", "list", "-p", "false"], env, timeout_s=60)
    if rc != 0:
        return []
    names = stale_sessions(parse_nsys_sessions(out))
    for name in names:
        run_bounded(nsys_shutdown_command(nsys, name), env, timeout_s=60)
    return names


def rocprof_command(
    rocprof: str, out_dir: str, delay_s: float, duration_s: float, serve_cmd: Sequence[str]
) -> list[str]:
    """rocprofv3 around ``max serve`` with a collection window ``delay_s`` after launch (seconds)."""
    return [
        rocprof,
        "--kernel-trace",
        "--marker-trace",
        "--output-format",
        "csv",
        "-d",
        out_dir,
        "-o",
        "serve",
        "--collection-period",
        f"{delay_s:.1f}:{duration_s:.1f}:1",
        "--collection-period-unit",
        "sec",
        "--",
        *serve_cmd,
    ]


def verify_artifact(path: str | Path, kind: str, min_bytes: int = 1024) -> str | None:
    """Why the artifact is not usable, or None: it exists, is not trivially small, has the format's magic."""
    p = Path(path)
    if not p.is_file():
        return f"{p} was not written"
    size = p.stat().st_size
    if size < min_bytes:
        return f"{p} is only {size} bytes (an empty capture?)"

    with open(p, "rb") as fh:
        head = fh.read(4096)
    if kind == "sqlite" and not head.startswith(SQLITE_MAGIC):
        return f"{p} is not an SQLite database"
    if kind == "rocprof-csv" and b"Kernel_Name" not in head:
        return f"{p} has no rocprofv3 kernel-trace header (Kernel_Name)"
    return None


def find_rocprof_kernel_csv(out_dir: str | Path) -> Path | None:
    """rocprofv3 writes ``<-d>/[<host>/]<-o>_kernel_trace.csv``; the newest match."""
    found = sorted(Path(out_dir).rglob("*kernel_trace.csv"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None
