"""Nsight Systems: read kernels, NVTX ranges and launches from an ``nsys export --type sqlite`` file,
and run a generation under ``nsys profile`` with warm-up outside the capture.

Tables used (schema 3.16 - 3.25; columns checked with ``PRAGMA table_info``, tables are lazy):
``CUPTI_ACTIVITY_KIND_KERNEL`` (kernels), ``CUPTI_ACTIVITY_KIND_RUNTIME`` (runtime *and* driver
API calls, joined on ``correlationId``: launch time and thread), ``NVTX_EVENTS`` (ranges: event
types 59/60/70/71; domains from type 75), ``StringIds``, ``TARGET_INFO_GPU``.

Equivalent: ``nsys stats --report cuda_gpu_kern_sum --report nvtx_kern_sum REPORT.sqlite``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import numpy as np

from max_profile.analyze.breakdown import KernelArrays
from max_profile.model import PhaseRange, Step

SQLITE_MAGIC = b"SQLite format 3\x00"
NVTX_RANGE_TYPES = (59, 60, 70, 71)
NVTX_DOMAIN_CREATE = 75


class NsysFormatError(ValueError):
    """The file is not a readable nsys SQLite export (the message names the file and the problem)."""


@dataclass
class NsysTrace:
    kernels: KernelArrays
    ranges: list[PhaseRange]
    all_range_names: dict[str, int] = field(default_factory=dict)
    gpu_names: list[str] = field(default_factory=list)
    product_version: str | None = None
    graph_kernels: int = 0


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f"PRAGMA table_info({table})")}


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}


def check_sqlite_file(path: str) -> None:
    p = Path(path)
    if not p.exists():
        raise NsysFormatError(f"{path}: file not found")
    if p.stat().st_size == 0:
        raise NsysFormatError(f"{path}: file is empty")
    with open(path, "rb") as fh:
        head = fh.read(16)
    if head != SQLITE_MAGIC:
        raise NsysFormatError(f"{path}: not an SQLite database (an nsys export is made with `nsys export --type sqlite REPORT.nsys-rep`)")


def _connect_ro(path: str) -> sqlite3.Connection:
    return sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True, check_same_thread=False)


def read_nsys_sqlite(path: str, *, pid: int | None = None) -> NsysTrace:
    """Kernels (with launch time/thread), our phase ranges and MAX's scheduler ranges from an nsys export."""
    check_sqlite_file(path)
    try:
        con = _connect_ro(path)
        tables = _tables(con)
    except sqlite3.DatabaseError as exc:
        raise NsysFormatError(f"{path}: corrupt or truncated SQLite file ({exc})") from exc
    try:
        return _read(con, path, tables, pid)
    except sqlite3.DatabaseError as exc:
        raise NsysFormatError(f"{path}: corrupt or truncated SQLite file ({exc})") from exc
    finally:
        con.close()


def _read(con: sqlite3.Connection, path: str, tables: set[str], pid: int | None) -> NsysTrace:
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        if "StringIds" not in tables and "META_DATA_EXPORT" not in tables:
            raise NsysFormatError(f"{path}: an SQLite file, but not an nsys export (no CUPTI_ACTIVITY_KIND_KERNEL / StringIds tables)")
        raise NsysFormatError(f"{path}: the nsys export contains no CUDA kernel data (capture with `nsys profile --trace=cuda,nvtx`)")
    kcols = _columns(con, "CUPTI_ACTIVITY_KIND_KERNEL")
    name_col = "demangledName" if "demangledName" in kcols else "shortName" if "shortName" in kcols else None
    if name_col is None or not {"start", "end", "correlationId"} <= kcols:
        raise NsysFormatError(f"{path}: CUPTI_ACTIVITY_KIND_KERNEL lacks the expected columns (start, end, correlationId, demangledName)")
    graph_col = "graphNodeId" if "graphNodeId" in kcols else "NULL"
    pid_col = "globalPid" if "globalPid" in kcols else "0"
    # String id, device and "is a graph node" packed in SQL into one integer (string ids are row
    # numbers of StringIds, devices are ordinals): one column fewer to materialize per kernel.
    packed_expr = f"({name_col} << 16) | ((deviceId & 32767) << 1) | (coalesce({graph_col}, 0) != 0)"
    kernel_exprs = ["start", "end", packed_expr, "correlationId"] + ([pid_col] if pid is not None else [])
    reads = [TableRead("CUPTI_ACTIVITY_KIND_KERNEL", tuple(kernel_exprs))]
    launch_ids: list[int] = []
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables and "StringIds" in tables:
        # only launch calls (cuLaunchKernel*, cudaLaunch*, graph launches): MAX's traces hold 3.3 other API
        # rows per launch; a literal id list filters them faster than a subquery
        launch_ids = [int(r[0]) for r in con.execute(
            "SELECT id FROM StringIds WHERE value LIKE 'cu%Launch%' OR value LIKE 'cuda%Launch%' OR value LIKE 'hip%Launch%'")]
    if launch_ids:
        where = f"nameId IN ({', '.join(map(str, launch_ids))}) AND correlationId IS NOT NULL"
        reads.append(TableRead("CUPTI_ACTIVITY_KIND_RUNTIME", ("correlationId", "start", "globalTid"), where))
    columns = _read_int64_columns(path, reads)
    start, end, packed, corr = columns[0][:4]
    gpid = columns[0][4] if pid is not None else None
    api_corr, api_start, api_tid = columns[1] if len(columns) > 1 else (np.zeros(0, np.int64),) * 3
    name, dev, graph = packed >> 16, ((packed >> 1) & 32767).astype(np.int32), (packed & 1).astype(bool)
    del packed, columns
    if gpid is not None and start.size:
        keep = ((gpid >> 24) & 0xFFFFFF) == pid
        start, end, name, dev, graph, corr = start[keep], end[keep], name[keep], dev[keep], graph[keep], corr[keep]
    name_ids, name_idx = _dense_codes(name)
    names = _strings(con, [int(i) for i in name_ids])
    launch = np.full(start.shape[0], -1, dtype=np.int64)
    tid = np.full(start.shape[0], -1, dtype=np.int64)
    if api_corr.size and start.size:
        # correlation ids are unique per process: each kernel's launch row, by id
        pos = _positions_of(api_corr, corr)
        hit = pos >= 0
        launch = np.where(hit, api_start[pos], -1)
        tid = np.where(hit, api_tid[pos], -1)
    kernels = KernelArrays(
        names=[names.get(int(i), f"<string {int(i)}>") for i in name_ids],
        name_idx=name_idx.astype(np.int32),
        start=np.ascontiguousarray(start),
        end=np.ascontiguousarray(end),
        launch=launch,
        tid=tid,
        device=dev,
        graph=graph,
    )
    ranges, counts = _ranges(con, tables)
    gpus: list[str] = []
    if "TARGET_INFO_GPU" in tables:
        gpus = [r[0] for r in con.execute("SELECT name FROM TARGET_INFO_GPU ORDER BY id")]
    version = None
    if "META_DATA_EXPORT" in tables:
        row = con.execute("SELECT value FROM META_DATA_EXPORT WHERE name='EXPORT_PRODUCT_VERSION'").fetchone()
        version = row[0] if row else None
    return NsysTrace(kernels=kernels, ranges=ranges, all_range_names=counts, gpu_names=gpus, product_version=version, graph_kernels=int(kernels.graph.sum()))


def _dense_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for small non-negative ids (string ids), by table lookup."""
    if values.size == 0 or values.min() < 0 or values.max() > 4 * values.size + 1_000_000:
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse.reshape(-1)
    present = np.bincount(values) > 0
    uniq = np.flatnonzero(present)
    code = np.cumsum(present) - 1
    return uniq, code[values]


def _positions_of(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Index in ``keys`` of each wanted value, -1 where absent (a duplicated key: one of its rows).

    Correlation ids are dense counters, so a direct table is used when their span is small; else a
    sorted search.
    """
    lo, hi = int(keys.min()), int(keys.max())
    if lo >= 0 and hi - lo <= 4 * keys.size + 1_000_000:
        table = np.full(hi - lo + 1, -1, dtype=np.int32 if keys.size < 2**31 else np.int64)
        table[keys - lo] = np.arange(keys.size)
        inside = (wanted >= lo) & (wanted <= hi)
        return np.where(inside, table[np.clip(wanted - lo, 0, hi - lo)], -1)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    pos = np.minimum(np.searchsorted(sorted_keys, wanted), keys.size - 1)
    return np.where(sorted_keys[pos] == wanted, order[pos], -1)


def align_steps_to_ranges(steps: list[Step], ranges: list[PhaseRange]) -> list[Step] | None:
    """Host steps moved onto the trace's clock: the k-th ``max_profile`` range is the k-th step.

    Returns None when the trace's ranges of ours do not match the steps one to one.
    """
    ours = [r for r in ranges if (r.domain == "max_profile")]
    if not ours or len(ours) != len(steps):
        return None
    out = []
    for st, r in zip(steps, ours, strict=True):
        label = r.name.rsplit(":", 1)[-1]
        if label != (st.phase if st.batch_size else "drain"):
            return None
        out.append(msgspec.structs.replace(st, start_ns=r.start_ns, end_ns=r.end_ns))
    return out


class TableRead(NamedTuple):
    """Integer expressions over the rows of ``table`` that match ``where`` (each NULL reads as 0)."""

    table: str
    exprs: tuple[str, ...]
    where: str = "1"


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
    with closing(_connect_ro(path)) as con:
        for index, read in enumerate(reads):
            # two queries: each is one b-tree descent, while min() and max() together scan the table
            lo = con.execute(f"SELECT min(rowid) FROM {read.table}").fetchone()[0]
            hi = con.execute(f"SELECT max(rowid) FROM {read.table}").fetchone()[0]
            if lo is None:
                continue
            exprs = ", ".join(f"coalesce({e}, 0)" for e in read.exprs)
            for first in range(int(lo), int(hi) + 1, window):
                jobs.append((index, f"SELECT {exprs} FROM {read.table} WHERE rowid >= {first} AND rowid < {first + window} AND ({read.where})"))
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
                        raise NsysFormatError(f"{path}: {reads[index].table}.{reads[index].exprs[i]} holds {child.schema.type.name.lower()} values, not integers")
                    column.append(np.frombuffer(child.buffer(1), dtype=np.int64)[child.offset : child.offset + len(child)].copy())
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
    source = "NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId" if "StringIds" in tables and "textId" in cols else "NVTX_EVENTS e"
    ranges_only = f"e.eventType IN {NVTX_RANGE_TYPES}"
    domains: dict[tuple[int, int], str] = {}
    for name, gtid, dom in con.execute(f"SELECT e.text, e.globalTid, {domain_col} FROM NVTX_EVENTS e WHERE e.eventType = {NVTX_DOMAIN_CREATE}"):
        domains[((gtid or 0) >> 24 & 0xFFFFFF, dom or 0)] = name or ""

    def domain_of(gtid: int | None, dom: int | None) -> str:
        return domains.get(((gtid or 0) >> 24 & 0xFFFFFF, dom or 0), "") if dom else ""

    counts: dict[str, int] = {}
    for pid, dom, name, n in con.execute(
        f"SELECT (coalesce(e.globalTid, 0) >> 24) & 16777215, {domain_col}, {text}, count(*) FROM {source} WHERE {ranges_only} GROUP BY 1, 2, 3"
    ):
        full = f"{domain_of(pid << 24, dom)}:{name}"
        counts[full] = counts.get(full, 0) + n
    last = con.execute(f"SELECT max(coalesce(e.end, e.start)) FROM NVTX_EVENTS e WHERE {ranges_only}").fetchone()[0] or 0
    ours = sorted({dom for (_, dom), name in domains.items() if name == "max_profile"})
    wanted = [f"{text} LIKE '\\_schedule(%' ESCAPE '\\'", f"{text} IN {PHASE_RANGE_TEXTS}"]
    if ours:
        wanted.append(f"{domain_col} IN ({', '.join(str(d) for d in ours)})")
    ranges: list[PhaseRange] = []
    for start, end, name, gtid, dom in con.execute(f"SELECT e.start, e.end, {text}, e.globalTid, {domain_col} FROM {source} WHERE {ranges_only} AND ({' OR '.join(wanted)})"):
        domain = domain_of(gtid, dom)
        if domain == "max_profile" or name.startswith("_schedule(") or name in PHASE_RANGE_TEXTS:
            ranges.append(PhaseRange(name=f"{domain}:{name}" if domain else name, start_ns=int(start), end_ns=int(end if end is not None else last),
                                     tid=int(gtid) if gtid is not None else None, domain=domain or None))
    ranges.sort(key=lambda r: r.start_ns)
    return ranges, counts


# ---------------------------------------------------------------------------------------------
# Running nsys
# ---------------------------------------------------------------------------------------------

NSYS_CHILD = """
import os, sys, json
sys.path[:0] = json.loads(os.environ['MAX_PROFILE_SYSPATH'])
from max_profile.collect.nsys import _child_main
_child_main()
"""


def _child_main() -> None:
    """Runs inside ``nsys profile --capture-range=cudaProfilerApi``: load, warm up, capture the generation."""
    import json

    from max_profile.runner import generate, load_model

    spec = json.loads(os.environ["MAX_PROFILE_NSYS_SPEC"])
    model = load_model(spec["model_path"], devices=spec["devices"], max_batch_size=spec["batch"], custom_architectures=spec["custom"])
    prompts = [spec["prompt"]] * spec["batch"]
    generate(model, prompts, spec["warmup"])
    # MAX's own cuProfilerStart/Stop bracketing (pushes the context MAX opened): the capture
    # range of `nsys profile --capture-range=cudaProfilerApi` starts after the warm-up.
    from max.profiler.oneshot._cuda import cuda_profiler_region

    from max_profile.session import profile

    with cuda_profiler_region():
        with profile(model.pipeline, kernels="off", gpu_sampling=False, model_path=spec["model_path"], devices=spec["devices"]) as prof:
            generate(model, prompts, spec["tokens"])
    with open(spec["steps_out"], "wb") as fh:
        fh.write(prof.report.to_json())
    model.close()


def nsys_profile_command(nsys: str, output: str) -> list[str]:
    """The nsys command line (argument list; never a shell string)."""
    return [nsys, "profile", "--trace=cuda,nvtx", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "--cuda-graph-trace=node", "--force-overwrite=true", "--export=sqlite", "-o", output]


def profile_generation_with_nsys(args: Any, progress: Any) -> Any:
    """``max-profile kernels --backend nsys``: nsys around a child that warms up and then captures."""
    import json

    from max_profile.analyze.breakdown import build_breakdown
    from max_profile.analyze.plan import next_measurement
    from max_profile.analyze.rules import evaluate
    from max_profile.cli import EXIT_TOOL_MISSING, CliError
    from max_profile.collect.environment import tool_status
    from max_profile.model import Report

    st = tool_status("nsys")
    if not st.usable:
        raise CliError(f"nsys is needed for --backend nsys: {st.problem}. Install: {st.install_hint}", EXIT_TOOL_MISSING)
    assert st.path is not None
    out_dir = Path(tempfile.mkdtemp(prefix="max-profile-nsys-"))
    rep = str(out_dir / "capture")
    steps_out = str(out_dir / "host_report.json")
    spec = {"model_path": args.model_path, "devices": args.devices or "gpu", "batch": args.batch_size, "custom": args.custom_architectures or [],
            "prompt": args.prompt, "warmup": max(args.warmup, 1), "tokens": args.max_new_tokens, "steps_out": steps_out}
    from max_profile.collect.gpu_sampling import clean_child_env

    env = clean_child_env({"MAX_PROFILE_NSYS_SPEC": json.dumps(spec), "MAX_PROFILE_SYSPATH": json.dumps(sys.path)})
    cmd = nsys_profile_command(st.path, rep) + [sys.executable, "-c", NSYS_CHILD]
    progress("running: " + " ".join(cmd[:-2]) + " python <generation>")
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        from max_profile.procs import kill_group

        kill_group(proc)
        raise
    sqlite_path = rep + ".sqlite"
    if rc != 0 or not os.path.exists(sqlite_path):
        raise CliError(f"nsys profile failed (exit {rc}); no {sqlite_path} was written")
    trace = read_nsys_sqlite(sqlite_path)
    host = Report.from_json(Path(steps_out).read_bytes())
    aligned = align_steps_to_ranges(host.steps, trace.ranges)
    if aligned is not None:
        host.kernels = build_breakdown(trace.kernels, source="nsys", steps=aligned)
    else:
        host.kernels = build_breakdown(trace.kernels, source="nsys", ranges=trace.ranges)
    host.artifacts = [rep + ".nsys-rep  (open with: nsys-ui " + rep + ".nsys-rep)", sqlite_path]
    host.findings = evaluate(host)
    host.next_measurement = next_measurement(host)
    return host
