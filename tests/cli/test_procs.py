"""What we start, we end: process groups, bounded tool calls, and children that die with us even when we are killed
outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from max_profile.util.procs import clean_child_env, die_with_parent, kill_group, run_bounded

from ..conftest import REPO

# an intermediate process that starts a long sleep the way max_profile starts servers and profilers, prints its pid,
# waits
STARTER = """
import subprocess, sys
sys.path.insert(0, sys.argv[1])
from max_profile.util.procs import die_with_parent
armed = sys.argv[2] == "armed"
child = subprocess.Popen(["sleep", "120"], start_new_session=True, preexec_fn=die_with_parent() if armed else None)
print(child.pid, flush=True)
child.wait()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for init to reap it counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _grandchild(armed: bool) -> tuple[subprocess.Popen[str], int]:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(REPO), "armed" if armed else "plain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_child_env(),
    )  # an in-process MAX load earlier in this worker changes the C environment
    assert starter.stdout is not None and starter.stderr is not None
    line = starter.stdout.readline()
    assert line.strip(), f"the starter printed no pid: {starter.stderr.read()[-2000:]}"
    return starter, int(line)


def test_a_child_dies_with_its_parent_even_on_sigkill() -> None:
    starter, pid = _grandchild(armed=True)
    assert _alive(pid)
    starter.kill()  # SIGKILL: no handler, no finally, no atexit runs in the parent
    starter.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the child outlived its SIGKILLed parent"


def test_without_it_the_child_is_orphaned() -> None:
    """The control: the same start without die_with_parent leaves the child running (what the test above guards
    against)."""
    starter, pid = _grandchild(armed=False)
    try:
        starter.kill()
        starter.wait()
        time.sleep(0.5)
        assert _alive(pid)
    finally:
        os.killpg(pid, signal.SIGKILL)


def test_kill_group_ends_the_whole_group_and_nothing_else() -> None:
    outsider = subprocess.Popen(["sleep", "60"], start_new_session=True)
    proc = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    time.sleep(0.3)
    kill_group(proc, grace_s=5)  # type: ignore[arg-type]
    assert proc.poll() is not None
    assert outsider.poll() is None, "a process outside the group was signalled"
    outsider.kill()
    outsider.wait()


def test_run_bounded_times_out_with_124() -> None:
    t = time.monotonic()
    rc, _ = run_bounded(["bash", "-c", "sleep 30 & sleep 30"], timeout_s=1.0)
    assert rc == 124 and time.monotonic() - t < 20
    assert die_with_parent() is not None  # Linux: armed


LOST_CTRL_C = """
import os, signal, sys, time
from max_profile.util.procs import raise_on_signals, raise_pending_signal

signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C as in a foreground run, even under a background pytest
raise_on_signals()


class Swallows:  # an exception raised in __del__ is printed as "Exception ignored" and dropped, as in a fork hook
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)


Swallows()
print("went on", flush=True)
try:
    raise_pending_signal()
except KeyboardInterrupt:
    print("raised again", flush=True)
    sys.exit(130)
"""


def test_a_ctrl_c_whose_exception_was_swallowed_is_raised_again() -> None:
    """Seen on this VM under load: Ctrl-C landing in logging's fork hook inside subprocess.Popen was printed as
    "Exception ignored ... KeyboardInterrupt" and the serve capture ran on. The handler remembers the signal; the
    capture's waits raise it again."""
    res = subprocess.run(
        [sys.executable, "-c", LOST_CTRL_C], capture_output=True, text=True, cwd=str(REPO), timeout=120
    )
    assert res.returncode == 130, res.stderr
    assert res.stdout.split() == ["went", "on", "raised", "again"] and "Exception ignored" in res.stderr


def test_an_ignored_ctrl_c_stays_ignored() -> None:
    """A CLI started with SIGINT ignored (a background job of a script) is not made interruptible by max_profile."""
    code = (
        "import os, signal, time\n"
        "from max_profile.util.procs import raise_on_signals, raise_pending_signal\n"
        "raise_on_signals()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(0.2)\n"
        "raise_pending_signal()\n"
        "print('still here')\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert res.returncode == 0 and res.stdout.strip() == "still here", res.stderr
