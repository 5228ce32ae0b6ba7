"""How busy the host was while a capture ran, and with what: this process (and its children) vs everything else.

Timing figures (step times, tokens/s, tracer cost) mean little when other processes fight the profiled one for the
CPU (a shared machine, a test suite beside it, a compile). Two snapshots of per-process CPU time (``psutil``, the
library MAX itself uses) bracket the window; their difference says how many cores this process tree used, how many
everything else used, and which other processes used the most. Equivalent manual check: ``pidstat 1`` / ``top -b -n 2``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from max_profile.model import BusyProcess, HostLoad

TOP_OTHERS = 5
"""Other processes named in the record (the busiest)."""


def _cpu_seconds() -> dict[int, tuple[str, float]]:
    """{pid: (name, user + system CPU seconds)} of every process this user can read."""
    import psutil

    out: dict[int, tuple[str, float]] = {}
    for proc in psutil.process_iter(["pid", "name", "cpu_times"]):
        info = proc.info
        times = info.get("cpu_times")
        if times is None:
            continue
        out[int(info["pid"])] = (str(info.get("name") or "?"), float(times.user + times.system))
    return out


def _own_tree() -> set[int]:
    import psutil

    me = psutil.Process()
    try:
        return {me.pid, *(c.pid for c in me.children(recursive=True))}
    except psutil.Error:
        return {me.pid}


@dataclass
class HostLoadProbe:
    """Start before the window, stop after it: :meth:`stop` returns the :class:`HostLoad` of the window (None where
    psutil cannot read processes here)."""

    observed: frozenset[int] = frozenset()
    """The process tree being observed (an attached server's): counted apart, not as other load."""
    _t0: float = 0.0
    _before: dict[int, tuple[str, float]] = field(default_factory=dict)
    _system0: tuple[float, float] | None = None
    problem: str | None = None

    def start(self) -> None:
        try:
            import psutil

            self._before = _cpu_seconds()
            cpu = psutil.cpu_times()
            self._system0 = (float(sum(cpu)), float(cpu.idle + getattr(cpu, "iowait", 0.0)))
        except Exception as exc:  # noqa: BLE001 - a probe that cannot read the host says so; the capture goes on
            self.problem = f"host load not recorded ({type(exc).__name__}: {exc})"
        self._t0 = time.monotonic()

    def stop(self) -> HostLoad | None:
        if self.problem or self._system0 is None:
            return None
        window = time.monotonic() - self._t0
        try:
            import psutil

            after = _cpu_seconds()
            own = _own_tree()
            cpu = psutil.cpu_times()
            load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        except Exception as exc:  # noqa: BLE001
            self.problem = f"host load not recorded ({type(exc).__name__}: {exc})"
            return None
        if window <= 0:
            return None
        total = float(sum(cpu)) - self._system0[0]
        idle = float(cpu.idle + getattr(cpu, "iowait", 0.0)) - self._system0[1]
        cores = os.cpu_count() or 1
        own_s = other_s = observed_s = 0.0
        others: list[BusyProcess] = []
        for pid, (name, secs) in after.items():
            prev = self._before.get(pid)
            used = (
                max(secs - prev[1], 0.0) if prev is not None else secs
            )  # started inside the window: all its time is in it
            if pid in own:
                own_s += used
            elif pid in self.observed:
                observed_s += used
            else:
                other_s += used
                if used > 0:
                    others.append(BusyProcess(pid=pid, name=name[:60], cores=round(used / window, 3)))
        others.sort(key=lambda p: -p.cores)
        return HostLoad(
            window_s=round(window, 3),
            cores=cores,
            cpu_busy_pct=round(100.0 * (total - idle) / total, 1) if total > 0 else None,
            own_cores=round(own_s / window, 3),
            other_cores=round(other_s / window, 3),
            load_avg_1m=load1,
            busiest_others=others[:TOP_OTHERS],
            observed_cores=round(observed_s / window, 3) if self.observed else None,
        )
