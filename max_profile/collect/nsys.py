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
    # Three integers per kernel, packed in SQL: durations fit 31 bits (2 s), string ids 20 bits,
    # devices 8 bits; longer kernels or more names re-read the columns one by one.
    narrow = ["start", f"((end - start) << 32) | ({name_col} << 12) | ((deviceId & 255) << 4) | (coalesce({graph_col}, 0) != 0)", "correlationId"]
    if pid is not None:
        narrow.append(pid_col)
    kernel_jobs = [ColumnRead("CUPTI_ACTIVITY_KIND_KERNEL", c) for c in narrow]
    # whether the packing holds (checked in parallel with the reads; rare traces re-read wide)
    check = ColumnRead("CUPTI_ACTIVITY_KIND_KERNEL", f"max(end - start) >= 2147483648 OR max({name_col}) >= 1048576", aggregate=True)
    api_jobs: list[ColumnRead] = []
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        # only launch calls (cuLaunchKernel*, cudaLaunch*, graph launches): real traces hold ~3x more other API rows
        launch_names = "(SELECT id FROM StringIds WHERE value LIKE 'cu%Launch%' OR value LIKE 'cuda%Launch%' OR value LIKE 'hip%Launch%')"
        api_jobs = [ColumnRead("CUPTI_ACTIVITY_KIND_RUNTIME", c, f"correlationId IS NOT NULL AND nameId IN {launch_names}") for c in ("correlationId", "start", "globalTid")]
    cols = _fetch_int64_columns(path, [*kernel_jobs, *api_jobs, check])
    wide = bool(cols[-1].size and cols[-1].max())
    api_corr, api_start, api_tid = cols[len(kernel_jobs) : len(kernel_jobs) + 3] if api_jobs else (np.zeros(0, np.int64),) * 3
    gpid = cols[len(narrow) - 1] if pid is not None else None
    if wide:
        wide_exprs = ["start", "end - start", name_col, "deviceId", f"coalesce({graph_col}, 0) != 0", "correlationId"]
        start, dur, name, dev, graph, corr = _fetch_int64_columns(path, [ColumnRead("CUPTI_ACTIVITY_KIND_KERNEL", c) for c in wide_exprs])
    else:
        start, packed, corr = cols[:3]
        dur, name, dev, graph = packed >> 32, (packed >> 12) & 0xFFFFF, (packed >> 4) & 0xFF, packed & 1
    if gpid is not None and start.size:
        keep = ((gpid >> 24) & 0xFFFFFF) == pid
        start, dur, name, dev, graph, corr = start[keep], dur[keep], name[keep], dev[keep], graph[keep], corr[keep]
    name_ids, name_idx = np.unique(name, return_inverse=True)
    names = _strings(con, [int(i) for i in name_ids])
    launch = np.full(start.shape[0], -1, dtype=np.int64)
    tid = np.full(start.shape[0], -1, dtype=np.int64)
    if api_corr.size and start.size:
        # correlation ids are unique per process; join kernels to launches by sorted search
        order = np.argsort(api_corr, kind="stable")
        ids = api_corr[order]
        pos = np.minimum(np.searchsorted(ids, corr), ids.size - 1)
        hit = ids[pos] == corr
        launch = np.where(hit, api_start[order][pos], -1)
        tid = np.where(hit, api_tid[order][pos], -1)
    kernels = KernelArrays(
        names=[names.get(int(i), f"<string {int(i)}>") for i in name_ids],
        name_idx=name_idx.astype(np.int32),
        start=np.ascontiguousarray(start),
        end=start + dur,
        launch=launch,
        tid=tid,
        device=dev.astype(np.int32),
        graph=graph != 0,
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


class ColumnRead(NamedTuple):
    """One integer expression over the rows of ``table`` matching ``where``; ``aggregate``: a single value."""

    table: str
    expr: str
    where: str = "1"
    aggregate: bool = False


def _fetch_int64_columns(path: str, jobs: list[ColumnRead], window: int = 500_000) -> list[np.ndarray]:
    """Integer columns as int64 arrays (an aggregate: a one-element array), one job each, run in parallel.

    Each column comes out of SQLite as one ``group_concat`` text per rowid window and numpy parses
    it: a Python value per cell was the dominant cost (a million kernels took 2.2 s as tuples), and
    a ``group_concat`` runs inside one ``sqlite3_step`` call, which releases the GIL, so columns on
    separate read-only connections use every core. NULLs read as 0.
    """
    from concurrent.futures import ThreadPoolExecutor

    local = threading.local()
    opened: list[sqlite3.Connection] = []

    def run(job: ColumnRead) -> np.ndarray:
        table, expr, where = job.table, job.expr, job.where
        con = getattr(local, "con", None)
        if con is None:
            con = local.con = _connect_ro(path)
            opened.append(con)
        if job.aggregate:
            return np.array([int(con.execute(f"SELECT {expr} FROM {table} WHERE {where}").fetchone()[0] or 0)], dtype=np.int64)
        lo, hi = con.execute(f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
        if lo is None:
            return np.zeros(0, dtype=np.int64)
        # Same WHERE, same plan (a rowid range scan) for every column of a table: the rows line up.
        query = f"SELECT group_concat(coalesce({expr}, 0)) FROM {table} WHERE rowid >= ? AND rowid < ? AND ({where})"
        parts = []
        for first in range(int(lo), int(hi) + 1, window):
            text = con.execute(query, (first, first + window)).fetchone()[0]
            if text:
                parts.append(np.fromstring(text, dtype=np.int64, sep=","))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 2))) as pool:
            return list(pool.map(run, jobs))
    finally:
        for con in opened:
            con.close()


def _strings(con: sqlite3.Connection, ids: list[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for i in range(0, len(ids), 900):
        chunk = ids[i : i + 900]
        q = ",".join("?" * len(chunk))
        out.update(dict(con.execute(f"SELECT id, value FROM StringIds WHERE id IN ({q})", chunk).fetchall()))
    return out


def _ranges(con: sqlite3.Connection, tables: set[str]) -> tuple[list[PhaseRange], dict[str, int]]:
    if "NVTX_EVENTS" not in tables:
        return [], {}
    cols = _columns(con, "NVTX_EVENTS")
    text_id = "textId" if "textId" in cols else "NULL"
    domain_col = "domainId" if "domainId" in cols else "0"
    domains: dict[tuple[int, int], str] = {}
    for text, gtid, dom in con.execute(f"SELECT text, globalTid, {domain_col} FROM NVTX_EVENTS WHERE eventType = {NVTX_DOMAIN_CREATE}"):
        domains[((gtid or 0) >> 24 & 0xFFFFFF, dom or 0)] = text or ""
    rows = con.execute(
        f"SELECT e.start, e.end, coalesce(s.value, e.text, ''), e.globalTid, {domain_col} FROM NVTX_EVENTS e "
        f"LEFT JOIN StringIds s ON s.id = e.{text_id} WHERE e.eventType IN {NVTX_RANGE_TYPES}"
    ).fetchall() if "StringIds" in tables else con.execute(
        f"SELECT start, end, coalesce(text, ''), globalTid, {domain_col} FROM NVTX_EVENTS WHERE eventType IN {NVTX_RANGE_TYPES}"
    ).fetchall()
    last = max((r[1] or r[0] for r in rows), default=0)
    ranges: list[PhaseRange] = []
    counts: dict[str, int] = {}
    for start, end, text, gtid, dom in rows:
        domain = domains.get(((gtid or 0) >> 24 & 0xFFFFFF, dom or 0), "") if dom else ""
        full = f"{domain}:{text}"
        counts[full] = counts.get(full, 0) + 1
        if domain == "max_profile" or text.startswith("_schedule(") or text in ("prefill", "decode", "mixed"):
            ranges.append(PhaseRange(name=full if domain else text, start_ns=int(start), end_ns=int(end if end is not None else last), tid=int(gtid) if gtid is not None else None, domain=domain or None))
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
