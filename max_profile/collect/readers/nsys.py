"""Nsight Systems: read kernels, launches and NVTX ranges from an ``nsys export --type sqlite`` file.

Tables used (schema 3.16 - 3.25; columns checked with ``PRAGMA table_info``, tables are lazy):
``CUPTI_ACTIVITY_KIND_KERNEL`` (kernels), ``CUPTI_ACTIVITY_KIND_RUNTIME`` (runtime *and* driver
API calls, joined on ``correlationId``: launch time and thread), ``NVTX_EVENTS`` (ranges: event
types 59/60/70/71; domains from type 75), ``StringIds``, ``TARGET_INFO_GPU``, and
``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` (device graphs recorded whole, counted: their kernels are missing).

Equivalent: ``nsys stats --report cuda_gpu_kern_sum --report nvtx_kern_sum REPORT.sqlite``.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from max_profile.errors import TraceFormatError
from max_profile.model import Capture, Environment, GpuInfo, KernelTable, PhaseRange, RawCapture, Unavailable
from max_profile.model.tags import Collector, KernelOrigin
from max_profile.util.files import (
    ROW_LIMIT_ENV,
    SQLITE_ERRORS,
    SQLITE_MAGIC,
    check_input_path,
    open_sqlite_readonly,
    row_limit,
)
from max_profile.util.procs import run_bounded

NVTX_RANGE_TYPES = (59, 60, 70, 71)
NVTX_DOMAIN_CREATE = 75


@dataclass
class NsysTrace:
    kernels: KernelTable
    ranges: list[PhaseRange]
    all_range_names: dict[str, int] = field(default_factory=dict)
    gpu_names: list[str] = field(default_factory=list)
    product_version: str | None = None
    graph_kernels: int = 0
    graph_replays: int = 0
    """Device-graph executions recorded whole (``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``: ``--cuda-graph-trace=graph``,
    nsys's default)."""
    graph_replay_ms: float = 0.0


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f"PRAGMA table_info({table})")}


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}


def check_sqlite_file(path: str) -> None:
    p = check_input_path(path)
    with open(p, "rb") as fh:
        head = fh.read(16)
    if head != SQLITE_MAGIC:
        raise TraceFormatError(
            f"{path}: not an SQLite database (an nsys export is made with `nsys export --type sqlite REPORT.nsys-rep`)"
        )


def read_nsys_sqlite(path: str, *, pid: int | None = None) -> NsysTrace:
    """Kernels (with launch time/thread), our phase ranges and MAX's scheduler ranges from an nsys export."""
    check_sqlite_file(path)
    try:
        con = open_sqlite_readonly(path)
        tables = _tables(con)
    except SQLITE_ERRORS as exc:
        raise TraceFormatError(f"{path}: corrupt or truncated SQLite file ({exc})") from exc
    try:
        return _read(con, path, tables, pid)
    except SQLITE_ERRORS as exc:
        raise TraceFormatError(f"{path}: corrupt or truncated SQLite file ({exc})") from exc
    finally:
        con.close()


def nsys_capture(path: str, *, pid: int | None = None) -> RawCapture:
    """An nsys SQLite export as a :class:`RawCapture` (trace clock; ranges as phases)."""
    trace = read_nsys_sqlite(path, pid=pid)
    env = Environment(
        vendor="nvidia",
        vendor_reason=f"imported from {path} (nsys {trace.product_version or '?'})",
        gpus=[GpuInfo(key=f"nv{i}", name=n) for i, n in enumerate(trace.gpu_names)],
    )
    raw = RawCapture(
        environment=env,
        capture=Capture(started_unix_s=time.time(), target="import:nsys", collectors=[Collector.NSYS]),
        artifacts=[os.path.abspath(path)],
    )
    merge_trace(raw, trace, KernelOrigin.NSYS.describe(), path)
    return raw


def merge_trace(raw: RawCapture, trace: NsysTrace, source: str, path: str) -> None:
    """An nsys trace's kernels, ranges and graph replays into a raw capture (on the trace's clock); the one place every
    nsys path (import, ``kernels --backend nsys``, ``serve --mode nsys``) merges its trace."""
    raw.kernels, raw.ranges, raw.range_names = trace.kernels, trace.ranges, trace.all_range_names
    raw.kernel_clock = "trace"
    raw.kernel_source = source
    note_graph_replays(raw, trace)
    if trace.graph_kernels or trace.graph_replays:
        raw.capture.device_graph_capture = True  # seen in the trace: kernels inside graphs, or graph replays
    if not len(trace.kernels):
        raw.kernels_unavailable = Unavailable(f"{path}: the capture holds no kernels")


def export_sqlite(
    nsys: str, report: str, out: str, *, timeout_s: float = 600, env: dict[str, str] | None = None
) -> str | None:
    """``nsys export --type sqlite`` of a ``.nsys-rep``; None on success, else why it failed."""

    rc, text = run_bounded(
        [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", out, report], env, timeout_s=timeout_s
    )
    if rc != 0:
        return f"`nsys export` failed (exit {rc}): {text.strip()[-300:]}"
    if not os.path.exists(out):
        return f"`nsys export` wrote no {out}"
    return None


def _read(con: sqlite3.Connection, path: str, tables: set[str], pid: int | None) -> NsysTrace:
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        if "StringIds" not in tables and "META_DATA_EXPORT" not in tables:
            raise TraceFormatError(
                f"{path}: an SQLite file, but not an nsys export (no CUPTI_ACTIVITY_KIND_KERNEL / StringIds tables)"
            )
        if GRAPH_TRACE_TABLE in tables:
            raise TraceFormatError(
                f"{path}: the nsys export holds device-graph replays but no kernel: nsys recorded the graphs whole "
                "(--cuda-graph-trace=graph, its default); capture with `nsys profile --trace=cuda,nvtx "
                "--cuda-graph-trace=node`"
            )
        raise TraceFormatError(
            f"{path}: the nsys export contains no CUDA kernel data (capture with `nsys profile --trace=cuda,nvtx`)"
        )
    if "StringIds" not in tables:
        raise TraceFormatError(
            f"{path}: the nsys export has no StringIds table, so kernel names cannot be read "
            "(a partial or hand-edited export? export again with `nsys export --type sqlite REPORT.nsys-rep`)"
        )
    kcols = _columns(con, "CUPTI_ACTIVITY_KIND_KERNEL")
    name_col = "demangledName" if "demangledName" in kcols else "shortName" if "shortName" in kcols else None
    if name_col is None or not {"start", "end", "correlationId"} <= kcols:
        raise TraceFormatError(
            f"{path}: CUPTI_ACTIVITY_KIND_KERNEL lacks the expected columns (start, end, correlationId, demangledName)"
        )
    graph_col = "graphNodeId" if "graphNodeId" in kcols else "NULL"
    stream_col = "streamId" if "streamId" in kcols else "0"
    pid_col = "globalPid" if "globalPid" in kcols else "0"
    # String id, stream, device and "is a graph node" packed in SQL into one integer (string ids are row
    # numbers of StringIds, streams and devices small ordinals): one column to materialize instead of four.
    packed_expr = (
        f"({name_col} << 32) | (({stream_col} & 65535) << 16) | ((deviceId & 32767) << 1) | "
        f"(coalesce({graph_col}, 0) != 0)"
    )
    kernel_exprs = ["start", "end", packed_expr, "correlationId"] + ([pid_col] if pid is not None else [])
    reads = [TableRead("CUPTI_ACTIVITY_KIND_KERNEL", tuple(kernel_exprs))]
    launch_ids: list[int] = []
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables and "StringIds" in tables:
        # only launch calls (cuLaunchKernel*, cudaLaunch*, graph launches): MAX's traces hold 3.3 other API
        # rows per launch; a literal id list filters them faster than a subquery
        launch_ids = [
            int(r[0])
            for r in con.execute(
                "SELECT id FROM StringIds WHERE value LIKE 'cu%Launch%' OR value LIKE 'cuda%Launch%' OR value LIKE "
                "'hip%Launch%'"
            )
        ]
    if launch_ids:
        where = f"nameId IN ({', '.join(map(str, launch_ids))}) AND correlationId IS NOT NULL"
        reads.append(TableRead("CUPTI_ACTIVITY_KIND_RUNTIME", ("correlationId", "start", "globalTid"), where))
    columns = _read_int64_columns(path, reads)
    start, end, packed, corr = columns[0][:4]
    gpid = columns[0][4] if pid is not None else None
    api_corr, api_start, api_tid = columns[1] if len(columns) > 1 else (np.zeros(0, np.int64),) * 3
    # each field unpacked with one temporary at most: a million kernels' columns are 8 MB each
    name = packed >> 32
    stream = packed >> 16
    stream &= 65535
    field = packed >> 1
    field &= 32767
    dev = field.astype(np.int32)
    graph = np.bitwise_and(packed, 1, out=field)
    del packed, columns
    if gpid is not None and start.size:
        keep = ((gpid >> 24) & 0xFFFFFF) == pid
        start, end, name, stream, dev, graph, corr = (
            start[keep],
            end[keep],
            name[keep],
            stream[keep],
            dev[keep],
            graph[keep],
            corr[keep],
        )
    if start.size and int(name.min()) < 0:
        raise TraceFormatError(f"{path}: CUPTI_ACTIVITY_KIND_KERNEL.{name_col} holds negative string ids")
    name_ids, name_idx = _dense_codes(name)
    del name
    names = _strings(con, [int(i) for i in name_ids])
    launch, tid = _launch_columns(corr, api_corr, api_start, api_tid)
    del api_corr, api_start, api_tid
    kernels = KernelTable(
        names=[_text(names.get(int(i)), int(i)) for i in name_ids],
        name_idx=name_idx,
        start_ns=np.ascontiguousarray(start),
        end_ns=np.ascontiguousarray(end),
        device=dev,
        launch_ns=launch,
        launch_tid=tid,
        stream=stream,
        correlation_id=corr,
        graph_id=graph,
    )
    ranges, counts = _ranges(con, tables)
    gpus: list[str] = []
    if "TARGET_INFO_GPU" in tables:
        gpus = [str(r[0]) for r in con.execute("SELECT name FROM TARGET_INFO_GPU ORDER BY id")]
    replays, replay_ms = _graph_replays(con, tables, pid)
    version = None
    if "META_DATA_EXPORT" in tables:
        row = con.execute("SELECT value FROM META_DATA_EXPORT WHERE name='EXPORT_PRODUCT_VERSION'").fetchone()
        version = str(row[0]) if row else None
    return NsysTrace(
        kernels=kernels,
        ranges=ranges,
        all_range_names=counts,
        gpu_names=gpus,
        product_version=version,
        graph_kernels=int(graph.sum()),
        graph_replays=replays,
        graph_replay_ms=replay_ms,
    )


GRAPH_TRACE_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"


def _graph_replays(con: sqlite3.Connection, tables: set[str], pid: int | None) -> tuple[int, float]:
    """(executions, GPU ms) of device graphs recorded whole: their kernels are not in the kernel table."""
    if GRAPH_TRACE_TABLE not in tables:
        return 0, 0.0
    cols = _columns(con, GRAPH_TRACE_TABLE)
    if not {"start", "end"} <= cols:
        return 0, 0.0
    where = "end > start"
    if pid is not None and "globalPid" in cols:
        where += f" AND ((globalPid >> 24) & 16777215) = {int(pid)}"
    count, total = con.execute(
        f"SELECT count(*), coalesce(sum(end - start), 0) FROM {GRAPH_TRACE_TABLE} WHERE {where}"
    ).fetchone()
    return int(count), float(total) / 1e6


def note_graph_replays(raw: RawCapture, trace: NsysTrace) -> None:
    """Say that device graphs ran as opaque replays (and count them as graph launches, so the breakdown is marked
    unreliable)."""
    if not trace.graph_replays:
        return
    raw.graph_launches = max(raw.graph_launches, trace.graph_replays)
    if trace.graph_kernels:
        return
    raw.notes.append(
        f"{trace.graph_replays} device-graph replays ({trace.graph_replay_ms:.1f} ms of GPU time) were recorded whole "
        "(nsys --cuda-graph-trace=graph, its default): the kernels inside them are not in this trace, so GPU busy, "
        "families and per-step kernel numbers cover only the kernels launched outside graphs; record with `nsys "
        "profile --cuda-graph-trace=node`"
    )


def _text(value: object, string_id: int) -> str:
    """A StringIds value as text (a damaged export can hold BLOBs or NULLs there)."""
    if value is None:
        return f"<string {string_id}>"
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _dense_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for small non-negative ids (string ids), by table lookup."""
    if values.size == 0 or values.min() < 0 or values.max() > 4 * values.size + 1_000_000:
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse.reshape(-1)
    present = np.bincount(values) > 0
    uniq = np.flatnonzero(present)
    code = np.cumsum(present, dtype=np.int32) - 1  # the codes as the kernel table keeps them: no int64 pass
    return uniq, code[values]


def _launch_columns(
    corr: np.ndarray, api_corr: np.ndarray, api_start: np.ndarray, api_tid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each kernel's launch call start and thread, by correlation id (unique per process), -1 where no launch row
    matches."""
    if not (api_corr.size and corr.size):
        return np.full(corr.shape[0], -1, dtype=np.int64), np.full(corr.shape[0], -1, dtype=np.int64)
    pos = _positions_of(api_corr, corr)
    missed = pos < 0
    launch = api_start[pos]
    launch[missed] = -1
    tid = api_tid[pos]
    tid[missed] = -1
    return launch, tid


def _positions_of(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Index in ``keys`` of each wanted value, -1 where absent (a duplicated key: one of its rows).

    Correlation ids are dense counters, so a direct table is used when their span is small; else a
    sorted search.
    """
    lo, hi = int(keys.min()), int(keys.max())
    if lo >= 0 and hi - lo <= 4 * keys.size + 1_000_000:
        table = np.full(hi - lo + 1, -1, dtype=np.int32 if keys.size < 2**31 else np.int64)
        table[keys - lo] = np.arange(keys.size)
        outside = (wanted < lo) | (wanted > hi)
        offset = wanted - lo
        np.clip(offset, 0, hi - lo, out=offset)
        found = table[offset]
        del offset, table
        found[outside] = -1
        return found
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    pos = np.minimum(np.searchsorted(sorted_keys, wanted), keys.size - 1)
    return np.where(sorted_keys[pos] == wanted, order[pos], -1)


class TableRead(NamedTuple):
    """Integer expressions over the rows of ``table`` that match ``where`` (each NULL reads as 0)."""

    table: str
    exprs: tuple[str, ...]
    where: str = "1"


MAX_WINDOWS = 4096
LAUNCH_ROWS_PER_KERNEL = 8
"""The runtime-API table holds every CUDA call (MAX's traces: 4.3 per launch); it is refused past this
many times the row limit, as only its launch rows are read."""


def _check_row_count(con: sqlite3.Connection, path: str, read: TableRead, rowid_span: int) -> None:
    """Refuse a table with more rows than :func:`row_limit` allows (bounded memory), naming the override."""
    limit = row_limit() * (LAUNCH_ROWS_PER_KERNEL if read.where != "1" else 1)
    if rowid_span <= limit:
        return
    rows = int(con.execute(f"SELECT count(*) FROM {read.table}").fetchone()[0])
    if rows > limit:
        raise TraceFormatError(
            f"{path}: {read.table} holds {rows:,} rows, more than the {limit:,} max_profile reads into memory (about 1 "
            "GB); capture fewer steps (a lower --max-new-tokens, or `nsys profile --capture-range=nvtx`) or set "
            f"{ROW_LIMIT_ENV}=N to read it anyway"
        )


def _read_int64_columns(path: str, reads: list[TableRead], window: int = 500_000) -> list[list[np.ndarray]]:
    """Per read, one int64 array per expression, in rowid order; rowid windows read in parallel.

    Rows are read by the Arrow ADBC SQLite driver (C; ``adbc-driver-sqlite``) into Arrow arrays that
    numpy views without a Python value per cell (a million kernels as Python tuples took 2.2 s).
    Each window is one Arrow batch, filled inside ``execute_query``, which releases the GIL, so the
    windows of both tables keep every core busy.
    """
    from concurrent.futures import ThreadPoolExecutor

    import adbc_driver_manager
    import adbc_driver_sqlite
    import nanoarrow

    uri = Path(path).resolve().as_uri() + "?mode=ro"
    jobs: list[tuple[int, str]] = []
    with closing(open_sqlite_readonly(path)) as con:
        for index, read in enumerate(reads):
            # two queries: each is one b-tree descent, while min() and max() together scan the table
            lo = con.execute(f"SELECT min(rowid) FROM {read.table}").fetchone()[0]
            hi = con.execute(f"SELECT max(rowid) FROM {read.table}").fetchone()[0]
            if lo is None:
                continue
            _check_row_count(con, path, read, int(hi) - int(lo) + 1)
            exprs = ", ".join(f"coalesce({e}, 0)" for e in read.exprs)
            if (int(hi) - int(lo)) // window > MAX_WINDOWS:  # rowids far apart (an edited file): one sequential read
                jobs.append((index, f"SELECT {exprs} FROM {read.table} WHERE ({read.where}) ORDER BY rowid"))
                continue
            for first in range(int(lo), int(hi) + 1, window):
                jobs.append(
                    (
                        index,
                        f"SELECT {exprs} FROM {read.table} WHERE rowid >= {first} AND rowid < {first + window} AND "
                        f"({read.where})",
                    )
                )
    local = threading.local()
    opened: list[Any] = []

    def run(job: tuple[int, str]) -> list[np.ndarray]:
        index, query = job
        conn = getattr(local, "conn", None)
        if conn is None:
            database = adbc_driver_sqlite.connect(uri)
            conn = local.conn = adbc_driver_manager.AdbcConnection(database)
            opened.extend((conn, database))
        with adbc_driver_manager.AdbcStatement(conn) as statement:
            statement.set_options(**{"adbc.sqlite.query.batch_rows": str(window + 1)})
            statement.set_sql_query(query)
            handle, _ = statement.execute_query()
            stream = nanoarrow.ArrayStream(handle)
            out = [[] for _ in reads[index].exprs]  # type: list[list[np.ndarray]]
            for batch in stream:
                for i, column in enumerate(out):
                    child = batch.child(i)
                    if child.schema.type != nanoarrow.Type.INT64:
                        raise TraceFormatError(
                            f"{path}: {reads[index].table}.{reads[index].exprs[i]} holds "
                            f"{child.schema.type.name.lower()} values, not integers"
                        )
                    column.append(
                        np.frombuffer(child.buffer(1), dtype=np.int64)[child.offset : child.offset + len(child)].copy()
                    )
            return [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in out]

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 2))) as pool:
            parts = list(pool.map(run, jobs))
    except adbc_driver_manager.Error as exc:
        raise sqlite3.DatabaseError(str(exc).splitlines()[0]) from exc
    finally:
        for obj in opened:
            obj.close()
    result: list[list[np.ndarray]] = []
    for index, read in enumerate(reads):
        mine = [p for (i, _), p in zip(jobs, parts, strict=True) if i == index]
        columns = []
        for c in range(len(read.exprs)):
            columns.append(np.concatenate([p[c] for p in mine]) if mine else np.zeros(0, dtype=np.int64))
            for p in mine:  # the windows' copy of this column goes as soon as it is joined
                p[c] = _EMPTY
        result.append(columns)
    return result


_EMPTY = np.zeros(0, dtype=np.int64)


def _strings(con: sqlite3.Connection, ids: list[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for i in range(0, len(ids), 900):
        chunk = ids[i : i + 900]
        q = ",".join("?" * len(chunk))
        out.update(dict(con.execute(f"SELECT id, value FROM StringIds WHERE id IN ({q})", chunk).fetchall()))
    return out


PHASE_RANGE_TEXTS = ("prefill", "decode", "mixed")


def _ranges(con: sqlite3.Connection, tables: set[str]) -> tuple[list[PhaseRange], dict[str, int]]:
    """Our phase ranges and MAX's scheduler ranges; plus a count of every range name, by domain.

    A MAX trace with profiling on holds a range per op (millions): SQLite filters and counts them,
    and Python sees only the phase and scheduler ranges.
    """
    if "NVTX_EVENTS" not in tables:
        return [], {}
    cols = _columns(con, "NVTX_EVENTS")
    domain_col = "e.domainId" if "domainId" in cols else "0"
    text = "coalesce(s.value, e.text, '')" if "StringIds" in tables and "textId" in cols else "coalesce(e.text, '')"
    source = (
        "NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId"
        if "StringIds" in tables and "textId" in cols
        else "NVTX_EVENTS e"
    )
    ranges_only = f"e.eventType IN {NVTX_RANGE_TYPES}"
    domains: dict[tuple[int, int], str] = {}
    domain_col = (
        f"CAST({domain_col} AS INTEGER)"  # an edited file may hold text or reals: read as integers, never trusted
    )
    gtid_col = "CAST(e.globalTid AS INTEGER)"
    for name, gtid, dom in con.execute(
        f"SELECT e.text, {gtid_col}, {domain_col} FROM NVTX_EVENTS e WHERE e.eventType = {NVTX_DOMAIN_CREATE}"
    ):
        domains[((gtid or 0) >> 24 & 0xFFFFFF, dom or 0)] = _text(name or "", -1)

    def domain_of(gtid: int | None, dom: int | None) -> str:
        return domains.get(((gtid or 0) >> 24 & 0xFFFFFF, dom or 0), "") if dom else ""

    counts: dict[str, int] = {}
    for pid, dom, name, n in con.execute(
        f"SELECT (coalesce({gtid_col}, 0) >> 24) & 16777215, {domain_col}, {text}, count(*) FROM {source} WHERE "
        f"{ranges_only} GROUP BY 1, 2, 3"
    ):
        full = f"{domain_of(pid << 24, dom)}:{_text(name, -1)}"
        counts[full] = counts.get(full, 0) + n
    last = (
        con.execute(
            f"SELECT max(CAST(coalesce(e.end, e.start) AS INTEGER)) FROM NVTX_EVENTS e WHERE {ranges_only}"
        ).fetchone()[0]
        or 0
    )
    ours = sorted({dom for (_, dom), name in domains.items() if name == "max_profile"})
    wanted = [f"{text} LIKE '\\_schedule(%' ESCAPE '\\'", f"{text} IN {PHASE_RANGE_TEXTS}"]
    if ours:
        wanted.append(f"{domain_col} IN ({', '.join(str(d) for d in ours)})")
    ranges: list[PhaseRange] = []
    for start, end, raw_name, gtid, dom in con.execute(
        f"SELECT CAST(coalesce(e.start, -1) AS INTEGER), CAST(e.end AS INTEGER), {text}, {gtid_col}, {domain_col} FROM "
        f"{source} WHERE {ranges_only} AND ({' OR '.join(wanted)})"
    ):
        # a missing start reads as -1: the step timeline leaves such ranges out and says how many
        name = _text(raw_name, -1)
        domain = domain_of(gtid, dom)
        if domain == "max_profile" or name.startswith("_schedule(") or name in PHASE_RANGE_TEXTS:
            ranges.append(
                PhaseRange(
                    name=f"{domain}:{name}" if domain else name,
                    start_ns=int(start),
                    end_ns=int(end if end is not None else last),
                    tid=int(gtid) if gtid is not None else None,
                    domain=domain or None,
                )
            )
    ranges.sort(key=lambda r: r.start_ns)
    return ranges, counts
