"""Every kernel this process launches, recorded in-process with CUPTI (``cupti-python``, NVIDIA).

MAX launches through the driver API (``cuLaunchKernel``), which CUPTI's activity API sees.
Kernel records (``CONCURRENT_KERNEL``) are joined on ``correlation_id`` to their launching
driver call (``DRIVER``), which gives the launch time and thread: a kernel belongs to the
step whose host interval contains its *launch*, which stays right with MAX's overlap
pipeline where a step's kernels run while the host prepares the next step.

CUPTI timestamps are on CUPTI's clock; they are mapped to the host ``perf_counter_ns`` clock
by a linear fit through (host, ``cupti.get_timestamp()``) pairs taken at start and stop.
Buffers are bounded (``buffer_bytes`` each, CUPTI reuses them) and flushed on stop.
Only launch calls are kept among the API records where CUPTI allows it
(``cuptiActivityEnableDriverApi`` / ``RuntimeApi``, CUDA 12.5+): MAX makes 3.3 other driver calls
(stream and event queries...) per launch, and each record costs Python time in the buffer
callback. ``callback_s`` and ``api_records`` say what the recording cost.
Equivalent CLI: ``nsys profile --trace=cuda`` then ``nsys stats --report cuda_gpu_kern_sum``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from max_profile.collect.live.cupti_decode import impossible_launch_joins
from max_profile.errors import ToolMissingError
from max_profile.model import KernelTable

_LAUNCH_PREFIXES = ("cuLaunch", "cudaLaunch", "cuGraphLaunch", "cudaGraphLaunch")


_ACTIVE: CuptiKernelCollector | None = None
_REGISTERED = False


def _requested() -> tuple[int, int]:
    return (_ACTIVE._buffer_bytes if _ACTIVE else 8 << 20), 0


def _completed(activities: Any) -> None:
    if _ACTIVE is not None:
        _ACTIVE._buffer_completed(activities)


def _launch_switch_table(cupti: Any, max_cbid: int = 4096) -> list[tuple[Any, int, bool]] | None:
    """Every driver / runtime call id with its per-call activity switch and whether it launches.

    None where this CUPTI has no per-call switch (before CUDA 12.5) or no launch call is recognized
    (switching the others off would then lose the kernel-to-launch join). Thousands of name lookups:
    built when the collector is made, not when recording starts.
    """
    domains = cupti.CallbackDomain
    switches = [
        (domains.DRIVER_API, getattr(cupti, "activity_enable_driver_api", None)),
        (domains.RUNTIME_API, getattr(cupti, "activity_enable_runtime_api", None)),
    ]
    if any(switch is None for _, switch in switches):
        return None
    calls: list[tuple[Any, int, bool]] = []
    for domain, switch in switches:
        for cbid in range(1, max_cbid):
            try:
                name = str(cupti.get_callback_name(domain, cbid))
            except Exception:  # noqa: BLE001 - ids past the table or reserved
                continue
            calls.append((switch, cbid, name.startswith(_LAUNCH_PREFIXES)))
    return calls if any(launch for _, _, launch in calls) else None


def _keep_only_launch_records(calls: list[tuple[Any, int, bool]] | None) -> str | None:
    """Switch off DRIVER / RUNTIME activity records for every call but kernel and graph launches.

    Returns what was kept, or None when there is nothing to switch (see :func:`_launch_switch_table`).
    """
    if not calls:
        return None
    kept = sum(launch for _, _, launch in calls)
    off = 0
    for switch, cbid, launch in calls:
        try:
            switch(cbid, 1 if launch else 0)
        except Exception:  # noqa: BLE001 - a call this CUPTI cannot switch stays recorded
            continue
        off += not launch
    return f"launch calls only ({kept} kept, {off} other driver/runtime calls off)"


class CuptiKernelCollector:
    """Start/stop CUPTI activity collection; ``kernels`` holds the result after ``stop``."""

    native = False
    """cupti-python: a Python object per record (see cupti_native for the C recorder)."""

    def __init__(self, buffer_bytes: int = 8 << 20, max_kernels: int = 5_000_000, launches: bool = True) -> None:
        """``launches=False`` records kernels only (no launch time / thread): half the records, for
        captures where nothing is attributed by launch (no phase ranges)."""
        try:
            from cupti import cupti  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except Exception as exc:  # noqa: BLE001
            raise ToolMissingError(
                f"cupti-python is not importable ({type(exc).__name__}: {exc}); pip install 'max-profile[nvidia]'"
            ) from exc
        self._cupti = cupti
        self._buffer_bytes = buffer_bytes
        self._record_launches = launches
        self._launch_switches = _launch_switch_table(cupti) if launches else None
        self._max_kernels = max_kernels
        self._kernels: list[tuple[Any, ...]] = []
        self._launches: dict[int, tuple[int, int, int]] = {}
        self._cb_names: dict[int, str] = {}
        self._kinds: list[Any] = []
        self._sync: list[tuple[int, int]] = []
        self.dropped = 0
        self.kernels: KernelTable = KernelTable.empty()
        self.graph_launches = 0
        self.rejected_launches = 0
        self.resume_problem: str | None = None
        self.api_records = 0
        self.callback_s = 0.0
        self.callback_s_before_stop = 0.0
        """Callback time while recording (the flush at ``stop`` runs after the profiled work)."""
        self.api_filter = "all API records (this CUPTI cannot filter by call)"
        self.unfinished = 0  # cupti-python hands over finished records only
        self.stop_s = 0.0

    def _pair(self) -> tuple[int, int]:
        h0 = time.perf_counter_ns()
        c = int(self._cupti.get_timestamp())
        h1 = time.perf_counter_ns()
        return (h0 + h1) // 2, c

    def start(self) -> None:
        global _ACTIVE, _REGISTERED
        if _ACTIVE is not None:
            raise RuntimeError("another CUPTI kernel collection is active in this process")
        cupti = self._cupti
        kinds = cupti.ActivityKind
        self._kinds = [kinds.CONCURRENT_KERNEL] + ([kinds.DRIVER, kinds.RUNTIME] if self._record_launches else [])
        _ACTIVE = self
        # registered at every start: another recorder of this process may have registered its own since
        cupti.activity_register_callbacks(_requested, _completed)
        _REGISTERED = True
        for k in self._kinds:
            cupti.activity_enable(k)
        if self._record_launches:
            self.api_filter = _keep_only_launch_records(self._launch_switches) or self.api_filter
        else:
            self.api_filter = "no API records (kernels only)"
        self._sync.append(self._pair())

    def pause(self) -> None:
        """cupti-python cannot pause cheaply: it records every step (``native`` False tells the recorder)."""

    def resume(self) -> None:
        """See :meth:`pause`."""

    def stop(self) -> KernelTable:
        global _ACTIVE
        cupti = self._cupti
        self.callback_s_before_stop = self.callback_s
        self._sync.append(self._pair())
        try:
            for k in self._kinds:
                try:
                    cupti.activity_disable(k)
                except Exception:  # noqa: BLE001
                    pass
            cupti.activity_flush_all(1)
        finally:
            _ACTIVE = None
        self.kernels = self._to_table()
        return self.kernels

    # CUPTI callbacks -------------------------------------------------------------------------
    def _buffer_completed(self, activities: Any) -> None:
        t0 = time.perf_counter()
        try:
            self._take(activities)
        finally:
            self.callback_s += time.perf_counter() - t0

    def _take(self, activities: Any) -> None:
        cupti = self._cupti
        kinds = cupti.ActivityKind
        kernel_kind, driver_kind = kinds.CONCURRENT_KERNEL, kinds.DRIVER
        for a in activities:
            kind = a.kind
            if kind == kernel_kind:
                if len(self._kernels) >= self._max_kernels:
                    self.dropped += 1
                    continue
                self._kernels.append(
                    (
                        a.name,
                        a.start,
                        a.end,
                        a.device_id,
                        a.stream_id,
                        a.correlation_id,
                        (a.grid_x, a.grid_y, a.grid_z),
                        (a.block_x, a.block_y, a.block_z),
                        a.registers_per_thread,
                        getattr(a, "graph_id", 0) or 0,
                        getattr(a, "graph_node_id", 0) or 0,
                    )
                )
            else:
                self.api_records += 1
                cbid = a.cbid
                name = self._cb_names.get(cbid)
                if name is None:
                    dom = cupti.CallbackDomain.DRIVER_API if kind == driver_kind else cupti.CallbackDomain.RUNTIME_API
                    try:
                        name = str(cupti.get_callback_name(dom, cbid))
                    except Exception:  # noqa: BLE001
                        name = ""
                    self._cb_names[cbid] = name
                if name.startswith(_LAUNCH_PREFIXES):
                    if "Graph" in name:
                        self.graph_launches += 1
                    self._launches[a.correlation_id] = (a.start, a.end, a.thread_id)

    # ------------------------------------------------------------------------------------------
    def _to_table(self) -> KernelTable:
        """The records as columns on the host clock (a linear fit through the start / stop clock pairs).

        CUPTI sometimes hands out kernel records with zero timestamps (120 of 22,306 on the H200):
        those map to -1 (invalid) for the analysis to drop and count, never to a time.
        """
        (h0, c0), (h1, c1) = self._sync[0], self._sync[-1]
        scale = (h1 - h0) / (c1 - c0) if c1 != c0 else 1.0
        rows = self._kernels
        n = len(rows)

        def host(raw: np.ndarray) -> np.ndarray:
            mapped = (h0 + (raw.astype(np.float64) - c0) * scale).astype(np.int64)
            return np.where(raw > 0, mapped, -1)

        names: dict[str, int] = {}
        name_idx = np.fromiter((names.setdefault(str(r[0]), len(names)) for r in rows), dtype=np.int32, count=n)
        start = host(np.fromiter((r[1] for r in rows), dtype=np.int64, count=n))
        end = host(np.fromiter((r[2] for r in rows), dtype=np.int64, count=n))
        corr = np.fromiter((r[5] for r in rows), dtype=np.int64, count=n)
        launch_raw = np.array([self._launches.get(int(c), (0, 0, -1))[0] for c in corr], dtype=np.int64)
        tid = np.array([self._launches.get(int(c), (0, 0, -1))[2] for c in corr], dtype=np.int64)
        stream = np.fromiter((r[4] for r in rows), dtype=np.int64, count=n)
        launch = host(launch_raw)
        rejected = impossible_launch_joins(start, end, stream, launch, corr)  # as the C recorder's decode does
        self.rejected_launches = int(rejected.sum()) if self._record_launches else 0
        launch, tid = np.where(rejected, -1, launch), np.where(rejected, -1, tid)
        table = KernelTable(
            names=list(names),
            name_idx=name_idx,
            start_ns=start,
            end_ns=end,
            device=np.fromiter((r[3] for r in rows), dtype=np.int32, count=n),
            stream=stream,
            correlation_id=corr,
            launch_ns=launch if self._record_launches else None,
            launch_tid=tid if self._record_launches else None,
            grid=np.array([r[6] for r in rows], dtype=np.int32).reshape(-1, 3),
            block=np.array([r[7] for r in rows], dtype=np.int32).reshape(-1, 3),
            registers=np.fromiter((r[8] for r in rows), dtype=np.int32, count=n),
            graph_id=np.fromiter((r[9] for r in rows), dtype=np.int64, count=n),
            graph_node_id=np.fromiter((r[10] for r in rows), dtype=np.int64, count=n),
        )
        order = np.argsort(table.start_ns, kind="stable")
        return table.select(order)
