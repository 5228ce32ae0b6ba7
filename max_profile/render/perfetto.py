"""A Perfetto trace (protobuf) of a raw capture: open it at https://ui.perfetto.dev or with trace_processor.

Tracks: one for the steps (slices named ``decode #12`` with phase, batch, fed / model tokens and
context as arguments), one per GPU stream with every kernel (name; family as the category; grid
and block as arguments), one per launching thread with an instant at each launch call and a flow
arrow from it to its kernel, counter tracks for GPU utilization, memory and SM clock, and for a serve
capture one track of load windows (``concurrency 4``) and request lanes (each request a slice with its
tokens, TTFT and error; overlapping requests on separate lanes).

Small parts (descriptors, interned names, steps, counters) are built with the ``perfetto``
package's protos and ``TraceProtoBuilder``. Kernels — a million of them — are written in the same
protobuf wire format with numpy (varints and nested lengths computed as arrays), which is what
makes a million-kernel export take seconds; tests parse every packet back with
``perfetto_trace_pb2``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from max_profile.analyze.breakdown import valid_kernels
from max_profile.analyze.families import FAMILIES, classify_kernel
from max_profile.analyze.timeline import capture_timeline
from max_profile.model import KernelTable, LoadWindow, RawCapture, RequestRecord, Step, UtilizationSample
from max_profile.util.files import write_output

SEQUENCE_ID = 7
STEPS_TRACK = 10
LOAD_TRACK = 11
REQUEST_TRACK_BASE = 4_000_000
GPU_TRACK_BASE = 1_000_000
THREAD_TRACK_BASE = 2_000_000
COUNTER_TRACK_BASE = 3_000_000
OP_TRACK_BASE = 5_000_000
SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = 1, 2, 3, 4
SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE = 1, 2


def _window_label(w: LoadWindow) -> str:
    """A load window's slice name: its concurrency, and what the recorder did in it where that is known."""
    if w.reference:
        return f"concurrency {w.concurrency} (reference, recorder off)"
    return f"concurrency {w.concurrency}" + (" (recorded)" if w.traced else "")


# --- protobuf wire format, vectorized -------------------------------------------------------


def _varint(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value as a protobuf varint: (bytes [n, 10], lengths [n])."""
    v = np.asarray(values).astype(np.uint64)
    out = np.zeros((v.size, 10), dtype=np.uint8)
    lengths = np.ones(v.size, dtype=np.int64)
    x = v.copy()
    for i in range(10):
        low = (x & np.uint64(0x7F)).astype(np.uint8)
        x >>= np.uint64(7)
        more = x != 0
        out[:, i] = low | (more.astype(np.uint8) << 7)
        lengths = np.where(more, i + 2, lengths)
        if not more.any():
            break
    return out, lengths


class Col:
    """One field's bytes for every row: a constant (a tag) or per-row bytes (bytes [n, w], lengths [n]); ``mask`` drops
    it from rows."""

    def __init__(self, data: bytes | tuple[np.ndarray, np.ndarray], mask: np.ndarray | None = None) -> None:
        self.const: bytes | None = data if isinstance(data, bytes) else None
        self.data: np.ndarray | None = None if isinstance(data, bytes) else data[0]
        self.lengths: np.ndarray | None = None if isinstance(data, bytes) else data[1]
        self.mask = mask

    def length(self, n: int) -> np.ndarray | int:
        base: np.ndarray | int = len(self.const) if self.const is not None else self.lengths  # type: ignore[assignment]
        if self.mask is None:
            return base
        return np.where(self.mask, base, 0)


def _tag(field: int, wire: int) -> bytes:
    out, length = _varint(np.array([(field << 3) | wire]))
    return bytes(out[0, : length[0]])


def _total(columns: Sequence[Col], n: int) -> np.ndarray:
    total = np.zeros(n, dtype=np.int64)
    for col in columns:
        total += col.length(n)
    return total


def _rows(columns: Sequence[Col], n: int) -> np.ndarray:
    """Concatenate the fields of every row into one buffer (rows one after the other)."""
    row_len = _total(columns, n)
    buf = np.zeros(int(row_len.sum()), dtype=np.uint8)
    offset = np.concatenate(([0], np.cumsum(row_len)[:-1])) if n else np.zeros(0, dtype=np.int64)
    for col in columns:
        rows = np.flatnonzero(col.mask) if col.mask is not None else None
        if col.const is not None:
            at = offset if rows is None else offset[rows]
            for k, byte in enumerate(col.const):
                buf[at + k] = byte
        else:
            assert col.data is not None and col.lengths is not None
            lengths = col.lengths if rows is None else col.lengths[rows]
            data = col.data if rows is None else col.data[rows]
            at = offset if rows is None else offset[rows]
            for k in range(int(lengths.max()) if lengths.size else 0):
                sel = lengths > k
                if sel.all():
                    buf[at + k] = data[:, k]
                else:
                    buf[at[sel] + k] = data[sel, k]
        length = col.length(n)
        offset = offset + length
    return buf


class _Interner:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        return self.ids.setdefault(text, len(self.ids) + 1)


def _host_events(
    event: Callable[[int, int, int], Any],
    names: _Interner,
    arg_names: _Interner,
    steps: Sequence[Step],
    load_windows: Sequence[LoadWindow],
    requests: Sequence[RequestRecord],
    lanes: list[int],
) -> None:
    """The host-clock slices: each step (its phase, batch and tokens), each load window, each request on its lane."""
    for i, s in enumerate(steps):
        begin = event(s.start_ns, SLICE_BEGIN, STEPS_TRACK)
        begin.name_iid = names.ids[f"{s.phase} step"]
        for key, value in (
            ("step", i),
            ("batch", s.batch_size),
            ("fed tokens", s.input_tokens),
            ("context tokens", s.context_tokens),
            ("model tokens", s.model_input_tokens),
        ):
            if value is not None:
                begin.debug_annotations.add(name_iid=arg_names.ids[key], int_value=int(value))
        begin.debug_annotations.add(name_iid=arg_names.ids["phase"], string_value=s.phase)
        event(max(s.end_ns, s.start_ns), SLICE_END, STEPS_TRACK)
    for w in load_windows:
        begin = event(w.window_ns[0], SLICE_BEGIN, LOAD_TRACK)
        begin.name_iid = names.ids[_window_label(w)]
        begin.debug_annotations.add(name_iid=arg_names.ids["requests"], int_value=len(w.requests))
        event(max(w.window_ns), SLICE_END, LOAD_TRACK)
    for r, lane in zip(requests, lanes, strict=True):
        begin = event(r.started_ns, SLICE_BEGIN, REQUEST_TRACK_BASE + lane)
        begin.name_iid = names.ids["request" if r.ok else "request (failed)"]
        begin.debug_annotations.add(name_iid=arg_names.ids["tokens"], int_value=r.tokens)
        if r.ttft_ms is not None:
            begin.debug_annotations.add(name_iid=arg_names.ids["TTFT ms"], double_value=r.ttft_ms)
        if r.error:
            begin.debug_annotations.add(name_iid=arg_names.ids["error"], string_value=r.error[:200])
        event(max(r.ended_ns, r.started_ns), SLICE_END, REQUEST_TRACK_BASE + lane)


def _interned_packet(
    builder: Any, names: _Interner, cats: _Interner, arg_names: _Interner, arg_values: _Interner
) -> None:
    """The packet that clears the sequence's incremental state and interns every name the events refer to by id."""
    first = builder.add_packet()
    first.trusted_packet_sequence_id = SEQUENCE_ID
    first.sequence_flags = SEQ_INCREMENTAL_STATE_CLEARED
    for text, iid in names.ids.items():
        first.interned_data.event_names.add(iid=iid, name=text)
    for text, iid in cats.ids.items():
        first.interned_data.event_categories.add(iid=iid, name=text)
    for text, iid in arg_names.ids.items():
        first.interned_data.debug_annotation_names.add(iid=iid, name=text)
    for text, iid in arg_values.ids.items():
        first.interned_data.debug_annotation_string_values.add(iid=iid, str=text.encode())


def _counter_and_op_events(
    event: Callable[[int, int, int], Any],
    raw: RawCapture,
    counters: dict[tuple[str, str], int],
    ops: KernelTable,
    op_tracks: dict[int, int],
    op_iid: np.ndarray,
) -> None:
    """The GPU samples as counter tracks, and MAX's op ranges as slices on their host threads' lanes."""
    for sample in raw.samples if counters else []:
        memory = None if sample.memory_used_bytes is None else sample.memory_used_bytes / 2**30
        readings: tuple[tuple[str, float | int | None], ...] = (
            ("utilization %", sample.utilization_pct),
            ("memory GiB", memory),
            ("SM clock MHz", sample.sm_clock_mhz),
        )
        for what, reading in readings:
            if reading is not None:
                event(sample.t_ns, COUNTER, counters[(sample.gpu, what)]).double_counter_value = float(reading)
    if op_tracks and ops.launch_tid is not None:
        for i in np.argsort(ops.start_ns, kind="stable"):
            track = op_tracks[int(ops.launch_tid[i])]
            event(int(ops.start_ns[i]), SLICE_BEGIN, track).name_iid = int(op_iid[ops.name_idx[i]])
            event(max(int(ops.end_ns[i]), int(ops.start_ns[i])), SLICE_END, track)


def _counter_tracks(samples: Sequence[UtilizationSample]) -> dict[tuple[str, str], int]:
    """A counter track per GPU and reading (utilization, memory, SM clock), in the order they first appear."""
    counters: dict[tuple[str, str], int] = {}
    for sample in samples:
        for what in ("utilization %", "memory GiB", "SM clock MHz"):
            counters.setdefault((sample.gpu, what), COUNTER_TRACK_BASE + len(counters))
    return counters


def build_perfetto(raw: RawCapture) -> bytes:
    """The serialized Perfetto trace of a raw capture."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    builder = TraceProtoBuilder()
    names, cats, arg_names, arg_values = _Interner(), _Interner(), _Interner(), _Interner()
    table = raw.kernels.select(valid_kernels(raw.kernels)) if len(raw.kernels) else raw.kernels

    def descriptor(uuid: int, name: str, parent: int | None = None, counter: bool = False) -> None:
        packet = builder.add_packet()
        packet.track_descriptor.uuid = uuid
        packet.track_descriptor.name = name
        if parent is not None:
            packet.track_descriptor.parent_uuid = parent
        if counter:
            packet.track_descriptor.counter.SetInParent()

    descriptor(STEPS_TRACK, f"steps ({raw.capture.target or 'capture'})")
    streams = _stream_tracks(table)
    for (device, stream), uuid in streams.items():
        descriptor(uuid, f"GPU {device} stream {stream}")
    threads: dict[int, int] = {}
    if table.launch_tid is not None:
        for tid in np.unique(table.launch_tid[table.launch_tid >= 0]):
            threads[int(tid)] = THREAD_TRACK_BASE + len(threads)
            descriptor(threads[int(tid)], f"launch thread {int(tid)}")
    ops = raw.op_ranges if raw.kernel_clock == "host" else KernelTable.empty()  # op ranges are on the host clock
    op_tracks: dict[int, int] = {}
    if len(ops) and ops.launch_tid is not None:  # --kernels ops: MAX's op ranges, one lane per host thread
        for tid in np.unique(ops.launch_tid):
            op_tracks[int(tid)] = OP_TRACK_BASE + len(op_tracks)
            descriptor(op_tracks[int(tid)], f"MAX ops, thread {int(tid)} (host: each op's launch)")
    counters = _counter_tracks(raw.samples) if raw.kernel_clock == "host" or not len(table) else {}
    for (gpu, what), uuid in counters.items():
        descriptor(uuid, f"{gpu} {what}", counter=True)

    host_clock = raw.kernel_clock == "host" or not len(table)  # requests and load windows are on the host clock
    lanes = request_lanes(raw.requests) if host_clock else []
    if host_clock and raw.load_windows:
        descriptor(LOAD_TRACK, "load (concurrency levels)")
    for lane in range(max(lanes, default=-1) + 1):
        descriptor(REQUEST_TRACK_BASE + lane, f"requests, lane {lane}")

    # interned names first: kernel names, families, argument names and values
    kernel_iid = np.array([names(n) for n in table.names] or [0], dtype=np.int64)
    family_iid = np.array([cats(classify_kernel(n)) for n in table.names] or [0], dtype=np.int64)
    grid_key = block_key = None
    if table.grid is not None and len(table):
        grid_key = np.array([arg_values("x".join(map(str, g))) for g in _distinct_dims(table.grid)], dtype=np.int64)
    if table.block is not None and len(table):
        block_key = np.array([arg_values("x".join(map(str, b))) for b in _distinct_dims(table.block)], dtype=np.int64)
    steps = capture_timeline(raw).steps  # the steps the report's breakdown attributes kernels to
    for s in steps:
        names(f"{s.phase} step")
    for key in (
        "grid",
        "block",
        "phase",
        "batch",
        "fed tokens",
        "model tokens",
        "context tokens",
        "step",
        "tokens",
        "TTFT ms",
        "error",
        "requests",
    ):
        arg_names(key)
    for w in raw.load_windows if host_clock else []:
        names(_window_label(w))
    for text in ("request", "request (failed)"):
        names(text)
    launch_name = names("launch")
    op_iid = np.array([names(n) for n in ops.names] or [0], dtype=np.int64)

    _interned_packet(builder, names, cats, arg_names, arg_values)

    def event(ts: int, kind: int, track: int) -> pb.TrackEvent:
        packet = builder.add_packet()
        packet.timestamp = ts
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        packet.sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE
        packet.track_event.type = kind
        packet.track_event.track_uuid = track
        return packet.track_event

    _host_events(event, names, arg_names, steps, raw.load_windows if host_clock else [], raw.requests, lanes)
    _counter_and_op_events(event, raw, counters, ops, op_tracks, op_iid)
    head = builder.serialize()
    if not len(table):
        return bytes(head)
    return bytes(head) + _kernel_packets(
        table, streams, threads, kernel_iid, family_iid, grid_key, block_key, arg_names.ids, launch_name
    )


def request_lanes(requests: Sequence[RequestRecord]) -> list[int]:
    """A lane per request (in the given order) such that requests on one lane never overlap: the first lane free
    when it starts (Perfetto slices on one track must nest; concurrent requests do not)."""
    lanes = [0] * len(requests)
    free_at: list[int] = []
    for i in sorted(range(len(requests)), key=lambda k: requests[k].started_ns):
        r = requests[i]
        lane = next((n for n, t in enumerate(free_at) if t <= r.started_ns), len(free_at))
        if lane == len(free_at):
            free_at.append(0)
        free_at[lane] = max(r.ended_ns, r.started_ns)
        lanes[i] = lane
    return lanes


def _distinct_dims(dims: np.ndarray) -> list[tuple[int, int, int]]:
    """The distinct (x, y, z) triples in the order :func:`_dims_index` numbers them."""
    key = np.unique(
        dims[:, 0].astype(np.int64) | (dims[:, 1].astype(np.int64) << 21) | (dims[:, 2].astype(np.int64) << 42)
    )
    mask = (1 << 21) - 1
    return [(int(x & mask), int((x >> 21) & mask), int(x >> 42)) for x in key]


def _stream_tracks(table: KernelTable) -> dict[tuple[int, int], int]:
    if not len(table):
        return {}
    streams = table.stream if table.stream is not None else np.zeros(len(table), dtype=np.int64)
    keys = np.unique(table.device.astype(np.int64) * (1 << 32) + streams)
    return {(int(k >> 32), int(k & 0xFFFFFFFF)): GPU_TRACK_BASE + i for i, k in enumerate(keys)}


def _kernel_packets(
    table: KernelTable,
    streams: dict[tuple[int, int], int],
    threads: dict[int, int],
    kernel_iid: np.ndarray,
    family_iid: np.ndarray,
    grid_key: np.ndarray | None,
    block_key: np.ndarray | None,
    arg_ids: dict[str, int],
    launch_name: int,
) -> bytes:
    """Every kernel as a slice begin / end on its stream's track, and an instant with a flow at its launch call, in
    time order.

    All packets are one table of rows sorted by time; each row's fields (present or masked out) are written with
    numpy, the nested lengths (TrackEvent inside TracePacket inside Trace) computed from the fields' lengths.
    """
    n = len(table)
    stream = table.stream if table.stream is not None else np.zeros(n, dtype=np.int64)
    track = _track_ids(table.device.astype(np.int64), stream, streams)
    has_launch = (
        (table.launch_ns >= 0) & (table.launch_tid >= 0)
        if table.launch_ns is not None and table.launch_tid is not None and threads
        else np.zeros(n, dtype=bool)
    )
    kinds = [np.full(n, SLICE_BEGIN), np.full(n, SLICE_END)]
    times = [table.start_ns, table.end_ns]
    index = [np.arange(n), np.arange(n)]
    if has_launch.any():
        sel = np.flatnonzero(has_launch)
        kinds.append(np.full(sel.size, INSTANT))
        times.append(table.launch_ns[sel])  # type: ignore[index]
        index.append(sel)
    kind = np.concatenate(kinds)
    ts = np.concatenate(times)
    k = np.concatenate(index)
    rank = np.select([kind == SLICE_END, kind == INSTANT], [0, 1], 2)
    order = np.lexsort((rank, ts))
    kind, ts, k = kind[order], ts[order], k[order]
    rows = kind.size
    begin, instant = kind == SLICE_BEGIN, kind == INSTANT
    if threads and table.launch_tid is not None:
        tids = np.array(sorted(threads), dtype=np.int64)
        thread_uuid = np.array([threads[int(t)] for t in tids], dtype=np.int64)
        launch_track = thread_uuid[np.clip(np.searchsorted(tids, table.launch_tid[k]), 0, len(tids) - 1)]
        track_col = np.where(instant, launch_track, track[k])
    else:
        track_col = track[k]
    flow = (k + 1).astype(np.uint64)
    name = np.where(instant, launch_name, kernel_iid[table.name_idx[k]])
    named = begin | instant
    ev = [
        Col(_tag(9, 0)),
        Col(_varint(kind)),
        Col(_tag(11, 0)),
        Col(_varint(track_col)),
        Col(_tag(3, 0), begin),
        Col(_varint(family_iid[table.name_idx[k]]), begin),
        Col(_tag(10, 0), named),
        Col(_varint(name), named),
    ]
    for key, dims, values in (("grid", table.grid, grid_key), ("block", table.block, block_key)):
        if dims is None or values is None:
            continue
        ann = [
            Col(_tag(1, 0)),
            Col(_varint(np.full(rows, arg_ids[key]))),
            Col(_tag(17, 0)),
            Col(_varint(values[_dims_index(dims)[k]])),
        ]
        ev += [
            Col(_tag(4, 2), begin),
            Col(_varint(_total(ann, rows)), begin),
            *[
                Col((c.data, c.lengths) if c.const is None else c.const, begin)  # type: ignore[arg-type]
                for c in ann
            ],
        ]
    fixed = (np.ascontiguousarray(flow, dtype="<u8").view(np.uint8).reshape(-1, 8), np.full(rows, 8, dtype=np.int64))
    ends_flow = begin & has_launch[k]
    ev += [Col(_tag(48, 1), ends_flow), Col(fixed, ends_flow), Col(_tag(47, 1), instant), Col(fixed, instant)]
    te_len = _total(ev, rows)
    head = [
        Col(_tag(8, 0)),
        Col(_varint(ts)),
        Col(_tag(10, 0)),
        Col(_varint(np.full(rows, SEQUENCE_ID))),
        Col(_tag(13, 0)),
        Col(_varint(np.full(rows, SEQ_NEEDS_INCREMENTAL_STATE))),
        Col(_tag(11, 2)),
        Col(_varint(te_len)),
    ]
    packet_len = te_len + _total(head, rows)
    return _rows([Col(_tag(1, 2)), Col(_varint(packet_len)), *head, *ev], rows).tobytes()


def _dims_index(dims: np.ndarray) -> np.ndarray:
    """Each row's index among the sorted distinct (x, y, z) triples (dimensions < 2**21)."""
    key = dims[:, 0].astype(np.int64) | (dims[:, 1].astype(np.int64) << 21) | (dims[:, 2].astype(np.int64) << 42)
    _, inverse = np.unique(key, return_inverse=True)
    return inverse.reshape(-1)


def _track_ids(device: np.ndarray, stream: np.ndarray, lookup: dict[tuple[int, int], int]) -> np.ndarray:
    keys = device * (1 << 32) + stream
    uniq = np.array(sorted(d * (1 << 32) + s for d, s in lookup), dtype=np.int64)
    uuids = np.array([lookup[(int(u >> 32), int(u & 0xFFFFFFFF))] for u in uniq], dtype=np.int64)
    return uuids[np.searchsorted(uniq, keys)]


def write_perfetto(raw: RawCapture, path: str) -> None:
    write_output(path, build_perfetto(raw))


__all__ = ["FAMILIES", "build_perfetto", "write_perfetto"]
