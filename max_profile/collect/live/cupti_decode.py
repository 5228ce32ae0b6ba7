"""Decode CUPTI activity records copied out in bulk into a :class:`KernelTable`, with numpy (no Python per record).

The C recorder (``native/cupti_ring.c``) copies each kernel record (``CUpti_ActivityKernel<N>``) and
each launch-call record (``CUpti_ActivityAPI``) into two contiguous arrays. Their layout — record
sizes and field offsets, as compiled against the installed CUPTI headers — travels with the bytes
(:class:`RecordLayout`), so a recording can be decoded anywhere (the tests decode one recorded on an
H200). Kernels are joined to their launch call on ``correlationId`` (launch time and thread; where ids
repeat, the last call before the kernel; a join that cannot be right is undone); CUPTI
timestamps are mapped to the host ``perf_counter_ns`` clock by a line through (host, CUPTI) pairs
taken at start and stop. Zero timestamps (CUPTI hands some out) become -1: invalid, dropped and
counted by the analysis, never a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from max_profile.errors import TraceFormatError
from max_profile.model import KernelTable

KERNEL_FIELDS = (
    "size",
    "kind",
    "start",
    "end",
    "deviceId",
    "streamId",
    "correlationId",
    "gridX",
    "blockX",
    "registersPerThread",
    "name",
    "graphNodeId",
    "graphId",
)
API_FIELDS = ("size", "kind", "cbid", "start", "end", "threadId", "correlationId")
KIND_FIELDS = ("CONCURRENT_KERNEL", "KERNEL", "DRIVER", "RUNTIME", "cupti_api_version")
_KERNEL_TYPES: dict[str, Any] = {
    "kind": "<u4",
    "start": "<u8",
    "end": "<u8",
    "deviceId": "<u4",
    "streamId": "<u4",
    "correlationId": "<u4",
    "gridX": ("<i4", (3,)),
    "blockX": ("<i4", (3,)),
    "registersPerThread": "<u2",
    "name": "<u8",
    "graphNodeId": "<u8",
    "graphId": "<u4",
}
_API_TYPES: dict[str, Any] = {
    "kind": "<u4",
    "cbid": "<u4",
    "start": "<u8",
    "end": "<u8",
    "threadId": "<u4",
    "correlationId": "<u4",
}

CUPTI_13_LAYOUT = (216, 0, 16, 24, 40, 48, 92, 52, 64, 6, 104, 144, 156, 40, 0, 4, 8, 16, 28, 32, 10, 3, 4, 5, 130001)
"""``mp_layout()`` of cupti_ring.c compiled against CUDA 13.0's CUPTI headers (CUpti_ActivityKernel10, API 130001)."""


@dataclass(frozen=True)
class RecordLayout:
    """Sizes and offsets of the two record kinds, and the CUPTI activity-kind numbers, as compiled."""

    kernel: dict[str, int]
    api: dict[str, int]
    kinds: dict[str, int]

    @classmethod
    def from_values(cls, values: Sequence[int]) -> RecordLayout:
        nk, na = len(KERNEL_FIELDS), len(API_FIELDS)
        if len(values) < nk + na + len(KIND_FIELDS):
            raise TraceFormatError(
                f"CUPTI record layout has {len(values)} values, expected {nk + na + len(KIND_FIELDS)}"
            )
        layout = cls(
            kernel=dict(zip(KERNEL_FIELDS, values[:nk], strict=True)),
            api=dict(zip(API_FIELDS, values[nk : nk + na], strict=True)),
            kinds=dict(zip(KIND_FIELDS, values[nk + na : nk + na + len(KIND_FIELDS)], strict=True)),
        )
        layout.check()
        return layout

    def values(self) -> list[int]:
        return [
            *(self.kernel[f] for f in KERNEL_FIELDS),
            *(self.api[f] for f in API_FIELDS),
            *(self.kinds[f] for f in KIND_FIELDS),
        ]

    def check(self) -> None:
        """Offsets inside their record and records 8-byte aligned (as CUPTI writes them)."""
        for what, fields, types in (("kernel", self.kernel, _KERNEL_TYPES), ("API", self.api, _API_TYPES)):
            size = fields["size"]
            if size <= 0 or size % 8:
                raise TraceFormatError(f"CUPTI {what} record size {size} is not a positive multiple of 8")
            for name in types:
                one_field = _dtype({"size": 64, name: 0}, {name: types[name]}).fields
                width = one_field[name][0].itemsize  # type: ignore[index]
                if not 0 <= fields[name] <= size - width:
                    raise TraceFormatError(
                        f"CUPTI {what} record field {name} at offset {fields[name]} lies outside the {size}-byte record"
                    )

    def kernel_dtype(self) -> np.dtype:
        return _dtype(self.kernel, _KERNEL_TYPES)

    def api_dtype(self) -> np.dtype:
        return _dtype(self.api, _API_TYPES)


def _dtype(fields: Mapping[str, int], types: Mapping[str, object]) -> np.dtype:
    spec: dict[str, Any] = {
        "names": list(types),
        "formats": list(types.values()),
        "offsets": [fields[n] for n in types],
        "itemsize": fields["size"],
    }
    return np.dtype(spec)  # type: ignore[call-overload]


LAUNCH_AFTER_START_TOLERANCE_NS = 1_000_000
"""How far a joined launch call may start after its kernel (CUPTI's CPU and GPU timestamps; served H100 captures: up
to 0.06 ms) or before an earlier launch of the same stream, before the join is judged impossible."""
IDLE_STREAM_LAUNCH_NS = 50_000_000
"""A kernel that starts on an idle stream (nothing of it running for this long before) runs soon after its launch call:
one joined to a call this much earlier got another call's correlation id. The H200 captures in the tests: at most 4.7
ms between launch and start after 1 ms of idle stream; up to 222 ms only behind a queue."""


@dataclass
class DecodedKernels:
    table: KernelTable
    api_records: int
    graph_launches: int
    unnamed: int
    rejected_launches: int = 0
    """Kernels whose join to a launch call was impossible (:func:`impossible_launch_joins`): timed by their start."""


def impossible_joins_note(kernels: int) -> str:
    """The capture's note for ``kernels`` joins :func:`impossible_launch_joins` undid."""
    return (
        f"CUPTI: {kernels} kernel(s) were joined to a launch call that cannot be theirs (it started after them, out of "
        "their stream's order, or long before them on an idle stream; CUPTI 13.0 can give graph launches wrong "
        "correlation ids in later sessions, fixed in CUDA 13.1 Update 1): timed by their own start, no launch thread"
    )


def impossible_launch_joins(
    start: np.ndarray, end: np.ndarray, stream: np.ndarray, launch: np.ndarray, correlation: np.ndarray
) -> np.ndarray:
    """Mask of kernels whose launch call (joined on ``correlationId``, ``launch`` -1 where none) cannot be theirs:
    the call started after the kernel did, or before a launch of an earlier kernel of the same stream (a stream runs
    its work in launch order), or long before the kernel started on an idle stream (``IDLE_STREAM_LAUNCH_NS``). Every
    kernel sharing a flagged correlation id (one graph launch's nodes) is flagged with it.

    CUPTI 13.0 can hand out wrong correlation ids for graph launches in recording sessions after the first (fixed in
    CUDA 13.1 Update 1, CUPTI's release notes). On an H100 a served window's kernels, counted by launch time, came back
    as 248,742 in one 0.5 s slice and none in three later ones, where each held ~52,000. On another H100 server this
    check undid none of the joins in its first recording session, 1,620 in its second and 182,064 of 190,740 in its
    third, and every window kept its kernels in their slices. All times share the host
    clock (``decode``); kernels without a start time (-1) are not judged, and a kernel whose own join is impossible
    sets no launch order for the next. Captures recorded before this check are not re-judged (every capture in the
    tests passes it)."""
    timed = start >= 0
    joined = timed & (launch >= 0)
    bad = joined & (launch > start + LAUNCH_AFTER_START_TOLERANCE_NS)
    for s in np.unique(stream[joined]):
        idx = np.flatnonzero(timed & (stream == s))
        idx = idx[np.argsort(start[idx], kind="stable")]
        ends = np.maximum.accumulate(end[idx])
        # a kernel whose own join is already impossible (a start time before its launch: a bad stamp) sets no order
        launches = np.maximum.accumulate(np.where(joined[idx] & ~bad[idx], launch[idx], -1))
        before_end = np.r_[np.iinfo(np.int64).min, ends[:-1]]
        before_launch = np.r_[-1, launches[:-1]]
        mine, st = launch[idx], start[idx]
        out_of_order = joined[idx] & (mine < before_launch - LAUNCH_AFTER_START_TOLERANCE_NS)
        idle = (st - before_end > IDLE_STREAM_LAUNCH_NS) & (st - mine > IDLE_STREAM_LAUNCH_NS)
        bad[idx] |= out_of_order | (joined[idx] & idle)
    if bad.any():
        bad |= joined & np.isin(correlation, np.unique(correlation[bad]))
    return bad


def host_clock(pairs: Sequence[tuple[int, int]]) -> tuple[float, float, float]:
    """(host origin, CUPTI origin, host ns per CUPTI ns) from (host, CUPTI) timestamp pairs."""
    if not pairs:
        raise TraceFormatError("no (host, CUPTI) clock pair was taken")
    (h0, c0), (h1, c1) = pairs[0], pairs[-1]
    return float(h0), float(c0), (h1 - h0) / (c1 - c0) if c1 != c0 else 1.0


def unfinished_records(kernel_bytes: bytes, layout: RecordLayout) -> int:
    """Kernel records without a start or end time: CUPTI's forced flush hands out kernels still running as zeros."""
    k = np.frombuffer(kernel_bytes, dtype=layout.kernel_dtype())
    return int(((k["start"] == 0) | (k["end"] == 0)).sum())


def _launch_rows(
    kernel_corr: np.ndarray, kernel_start: np.ndarray, api_corr: np.ndarray, api_start: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each kernel, the row of its launch call among the API records (``correlationId`` equal) and whether it has
    one. Where several calls share an id (CUPTI 13.0 repeats graph launches' ids in later sessions), the last one that
    started no later than the kernel (CUPTI clock), else the first: a launch comes before its work."""
    order = np.lexsort((api_start, api_corr))
    keys, starts = api_corr[order], api_start[order]
    first = np.searchsorted(keys, kernel_corr, side="left")
    last = np.searchsorted(keys, kernel_corr, side="right")
    hit = last > first
    pos = np.minimum(first, keys.size - 1)
    shared = np.flatnonzero(hit & (last - first > 1))
    if shared.size:
        # one pass over the shared ids' calls and kernels in (id, time) order, a call before a kernel at the same time:
        # each kernel takes the position of the last call before it, when that call has its id
        calls = np.flatnonzero(np.isin(keys, kernel_corr[shared]))
        ids = np.concatenate([keys[calls], kernel_corr[shared]])
        times = np.concatenate([starts[calls], kernel_start[shared]])
        is_kernel = np.concatenate([np.zeros(calls.size, dtype=bool), np.ones(shared.size, dtype=bool)])
        merged = np.lexsort((is_kernel, times, ids))
        call_pos = np.concatenate([calls, np.full(shared.size, -1)])[merged]
        latest = np.maximum.accumulate(call_pos)
        at_kernel = is_kernel[merged]
        kernel_rows = np.concatenate([np.full(calls.size, -1), shared])[merged][at_kernel]
        found = latest[at_kernel]
        own = (found >= 0) & (keys[np.maximum(found, 0)] == kernel_corr[kernel_rows])
        pos[kernel_rows] = np.where(own, found, first[kernel_rows])
    return order[pos], hit


def decode(
    kernel_bytes: bytes,
    api_bytes: bytes,
    layout: RecordLayout,
    names: Mapping[int, str],
    clock_pairs: Sequence[tuple[int, int]],
    *,
    graph_cbids: frozenset[int] = frozenset(),
    launch_cbids: frozenset[int] | None = None,
) -> DecodedKernels:
    """The kernels of a recording, on the host clock, joined to their launch calls.

    ``names`` maps the kernel-name addresses in the records to their text; ``launch_cbids`` (when given)
    keeps only those API calls as launches (a CUPTI that cannot switch records per call records all).
    """
    kdt, adt = layout.kernel_dtype(), layout.api_dtype()
    if len(kernel_bytes) % kdt.itemsize or len(api_bytes) % adt.itemsize:
        raise TraceFormatError(
            f"CUPTI records are cut short: {len(kernel_bytes)} kernel bytes / {kdt.itemsize}, "
            f"{len(api_bytes)} API bytes / {adt.itemsize}"
        )
    k = np.frombuffer(kernel_bytes, dtype=kdt)
    a = np.frombuffer(api_bytes, dtype=adt)
    kinds = (layout.kinds["CONCURRENT_KERNEL"], layout.kinds["KERNEL"])
    if k.size and not np.isin(k["kind"], kinds).all():
        raise TraceFormatError("CUPTI kernel records of another kind: the record layout does not match the recording")
    h0, c0, scale = host_clock(clock_pairs)

    def to_host(raw: np.ndarray) -> np.ndarray:
        mapped = (h0 + (raw.astype(np.float64) - c0) * scale).astype(np.int64)
        return np.where(raw > 0, mapped, -1)

    addresses, name_idx = np.unique(k["name"], return_inverse=True)
    text = [names.get(int(p), "") or f"<unnamed kernel {int(p):#x}>" for p in addresses]
    unnamed = sum(1 for p in addresses if not names.get(int(p)))
    if launch_cbids is not None and a.size:
        a = a[np.isin(a["cbid"], np.fromiter(launch_cbids, dtype=np.uint32))]
    corr = k["correlationId"].astype(np.int64)
    launch = np.full(k.size, -1, dtype=np.int64)
    tid = np.full(k.size, -1, dtype=np.int64)
    if a.size and k.size:
        rows, hit = _launch_rows(corr, k["start"], a["correlationId"].astype(np.int64), a["start"])
        launch = np.where(hit, to_host(a["start"][rows]), -1)
        tid = np.where(hit, a["threadId"][rows].astype(np.int64), -1)
    start, end, stream = to_host(k["start"]), to_host(k["end"]), k["streamId"].astype(np.int64)
    rejected = impossible_launch_joins(start, end, stream, launch, corr)
    launch, tid = np.where(rejected, -1, launch), np.where(rejected, -1, tid)
    table = KernelTable(
        names=text,
        name_idx=name_idx.astype(np.int32),
        start_ns=start,
        end_ns=end,
        device=k["deviceId"].astype(np.int32),
        stream=stream,
        correlation_id=corr,
        launch_ns=launch,
        launch_tid=tid,
        grid=np.ascontiguousarray(k["gridX"]),
        block=np.ascontiguousarray(k["blockX"]),
        registers=k["registersPerThread"].astype(np.int32),
        graph_id=k["graphId"].astype(np.int64),
        graph_node_id=k["graphNodeId"].astype(np.int64),
    )
    graph_launches = (
        int(np.isin(a["cbid"], np.fromiter(graph_cbids, dtype=np.uint32)).sum()) if graph_cbids and a.size else 0
    )
    order = np.argsort(table.start_ns, kind="stable")
    return DecodedKernels(
        table=table.select(order),
        api_records=int(a.size),
        graph_launches=graph_launches,
        unnamed=unnamed,
        rejected_launches=int(rejected.sum()),
    )
