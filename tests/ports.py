"""Ports for the servers the tests start, without the race of ``bind(0)``-then-close.

A port the kernel hands out for ``bind(0)`` is free again once that socket closes, so two xdist workers (or a test and
an outgoing connection) can be given the same one before either server binds it. Here each worker draws from its own
range below Linux's ephemeral range (32768-60999), never twice in one run, and skips a port something else holds.
"""

from __future__ import annotations

import itertools
import os
import random

from max_profile.collect.server.server_process import port_in_use

_FIRST, _PER_WORKER = 20_000, 2_000


def _worker_range() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    start = _FIRST + (index % 6) * _PER_WORKER
    return range(start, start + _PER_WORKER)


_PORTS = _worker_range()
_NEXT = itertools.count(random.randrange(len(_PORTS)))


def free_port() -> int:
    """A port of this worker's range that is free now and was not handed out before in this run."""
    for _ in range(len(_PORTS)):
        port = _PORTS[next(_NEXT) % len(_PORTS)]
        if not port_in_use(port):
            return port
    raise RuntimeError(f"no free port in {_PORTS}")
