"""rocprofv3 output as a :class:`RawCapture`: the kernel-trace CSV (+ its marker CSV) and the rocpd database.

``rocprofv3 --kernel-trace --marker-trace --output-format csv -d OUT -- <cmd>`` writes
``<pid>_kernel_trace.csv`` (columns in ../shared/research/formats.md §2; older builds lack
``Stream_Id`` and name the segment sizes differently) and ``<pid>_marker_api_trace.csv`` (roctx
ranges: ours are ``max_profile:prefill`` / ``decode``). ``--output-format rocpd`` writes an SQLite
database with ``kernels`` and ``regions`` views; ``--output-format json`` one ``rocprofiler-sdk-tool``
document. Timestamps are nanoseconds.
"""

from __future__ import annotations

import json
import os
import re
import time

import numpy as np

from max_profile.collect.readers.tables import (
    ROCPROF_JSON_KEY,
    check_json_depth,
    column,
    csv_rows,
    ns,
    optional_column,
    read_text,
)
from max_profile.errors import TraceFormatError
from max_profile.model import Capture, Environment, GpuInfo, KernelTable, PhaseRange, RawCapture, Unavailable
from max_profile.util.files import SQLITE_ERRORS, open_sqlite_readonly

_AGENT_DIGITS = re.compile(r"\d+")


def _raw(
    source: str,
    path: str,
    table: KernelTable,
    ranges: list[PhaseRange],
    skipped: int,
    gpus: list[GpuInfo] | None = None,
) -> RawCapture:
    env = Environment(
        vendor="amd", vendor_reason=f"imported from {path}; environment of the capture unknown", gpus=gpus or []
    )
    raw = RawCapture(
        environment=env,
        capture=Capture(started_unix_s=time.time(), target=f"import:{source}", collectors=[source]),
        kernels=table,
        kernel_clock="trace",
        ranges=ranges,
        kernel_source=source.replace("-", " "),
        artifacts=[os.path.abspath(path)],
    )
    if skipped:
        raw.notes.append(f"{skipped} row(s) of {path} had no usable name or timestamps and were skipped")
    if not len(table):
        raw.kernels_unavailable = Unavailable(f"{path}: the trace holds no kernel dispatch")
    return raw


def _roctx_range(name: str, start_ns: int, end_ns: int, tid: int | None) -> PhaseRange:
    """A roctx range; ours (``max_profile:prefill`` / ``decode``) carry the max_profile domain."""
    return PhaseRange(
        name=name,
        start_ns=start_ns,
        end_ns=end_ns,
        tid=tid,
        domain="max_profile" if name.startswith("max_profile:") else None,
    )


def _small(value: object, default: int) -> int:
    """A count, ordinal or size cell: an integer 0 <= v < 2**31, else ``default``."""
    v = ns(value)
    return v if v is not None and 0 <= v < 2**31 else default


def _dims(row: list[str], idx: list[int | None]) -> tuple[int, int, int]:
    out = [1 if i is None else _small(row[i] if i < len(row) else None, 0) for i in idx]  # a missing Y / Z column is 1
    return (out[0], out[1], out[2])


def rocprof_csv_capture(path: str) -> RawCapture:
    header, rows = csv_rows(path)
    # rocprofv3 names first, then rocprofv2's (GPU_ID, TID, Correlation_ID, Grid_Size) and legacy rocprof's
    # results.csv (KernelName, BeginNs, EndNs, gpu-id, tid, grd, wgr: total sizes, one number each)
    i_name = column(header, path, "Kernel_Name", "KernelName")
    i_start = column(header, path, "Start_Timestamp", "BeginNs")
    i_end = column(header, path, "End_Timestamp", "EndNs")
    i_agent = optional_column(header, "Agent_Id", "GPU_ID", "gpu-id")
    i_tid = optional_column(header, "Thread_Id", "TID", "tid")
    i_stream = optional_column(header, "Stream_Id", "Queue_Id", "Queue_ID", "queue-id")
    i_corr = optional_column(header, "Correlation_Id", "Correlation_ID")
    grid_cols = [optional_column(header, f"Grid_Size_{a}") for a in "XYZ"]
    block_cols = [optional_column(header, f"Workgroup_Size_{a}") for a in "XYZ"]
    if grid_cols[0] is None:
        grid_cols = [optional_column(header, "Grid_Size", "grd"), None, None]
    if block_cols[0] is None:
        block_cols = [optional_column(header, "Workgroup_Size", "wgr"), None, None]
    names: dict[str, int] = {}
    idx, start, end, dev, tid, stream, corr, grid, block = ([] for _ in range(9))  # type: ignore[var-annotated]
    skipped = 0
    width = max(i_name, i_start, i_end)
    for r in rows:
        if len(r) <= width:
            skipped += 1
            continue
        s, e = ns(r[i_start]), ns(r[i_end])
        if s is None or e is None:
            skipped += 1
            continue
        idx.append(names.setdefault(r[i_name], len(names)))
        start.append(s)
        end.append(e)
        agent = _AGENT_DIGITS.search(r[i_agent]) if i_agent is not None and i_agent < len(r) else None
        dev.append(min(int(agent.group()), 2**31 - 1) if agent else 0)
        tid.append(ns(r[i_tid]) or -1 if i_tid is not None and i_tid < len(r) else -1)
        stream.append(ns(r[i_stream]) or 0 if i_stream is not None and i_stream < len(r) else 0)
        corr.append(ns(r[i_corr]) or 0 if i_corr is not None and i_corr < len(r) else 0)
        grid.append(_dims(r, grid_cols))
        block.append(_dims(r, block_cols))
    table = KernelTable(
        names=list(names),
        name_idx=np.array(idx, dtype=np.int32),
        start_ns=np.array(start, dtype=np.int64),
        end_ns=np.array(end, dtype=np.int64),
        device=np.array(dev, dtype=np.int32),
        launch_tid=np.array(tid, dtype=np.int64) if i_tid is not None else None,
        stream=np.array(stream, dtype=np.int64),
        correlation_id=np.array(corr, dtype=np.int64),
        grid=np.array(grid, dtype=np.int32).reshape(-1, 3) if any(c is not None for c in grid_cols) else None,
        block=np.array(block, dtype=np.int32).reshape(-1, 3) if any(c is not None for c in block_cols) else None,
    )
    ranges, bad = _markers(path)
    return _raw("rocprofv3-csv", path, table, ranges, skipped + bad)


def _markers(kernel_csv: str) -> tuple[list[PhaseRange], int]:
    """Ranges from the marker CSV beside a kernel-trace CSV (``*_marker_api_trace.csv``), if any."""
    marker = kernel_csv.replace("kernel_trace", "marker_api_trace")
    if marker == kernel_csv or not os.path.exists(marker):
        return [], 0
    header, rows = csv_rows(marker)
    i_fn = column(header, marker, "Function")
    i_start = column(header, marker, "Start_Timestamp")
    i_end = column(header, marker, "End_Timestamp")
    i_tid = optional_column(header, "Thread_Id")
    out = []
    bad = 0
    for r in rows:
        if len(r) <= max(i_fn, i_start, i_end):
            bad += 1
            continue
        s, e = ns(r[i_start]), ns(r[i_end])
        if s is None or e is None:
            bad += 1
            continue
        name = r[i_fn]
        out.append(_roctx_range(name, s, e, ns(r[i_tid]) if i_tid is not None and i_tid < len(r) else None))
    return out, bad


_ROCPD_OPTIONAL = {
    "device": ("agent_abs_index", "agent_log_index", "agent_id"),
    "tid": ("tid", "thread_id"),
    "stream": ("stream_id", "queue_id"),
    "corr": ("corr_id", "correlation_id"),
    "grid_x": ("grid_x",),
    "grid_y": ("grid_y",),
    "grid_z": ("grid_z",),
    "block_x": ("workgroup_x",),
    "block_y": ("workgroup_y",),
    "block_z": ("workgroup_z",),
}
"""Columns of rocpd's ``kernels`` view read when present (their names differ between rocprofiler-sdk versions)."""


def rocpd_capture(path: str) -> RawCapture:
    """A rocpd database (``rocprofv3 --output-format rocpd``): its ``kernels`` and ``regions`` views."""
    try:
        con = open_sqlite_readonly(path)
        try:
            have = {str(r[1]) for r in con.execute("PRAGMA table_info(kernels)")}
            if not have:
                raise TraceFormatError(
                    f"{path}: a rocpd database without a kernels view (was the kernel trace on? "
                    "`rocprofv3 --kernel-trace --output-format rocpd -- CMD`)"
                )
            if not {"name", "start", "end"} <= have:
                raise TraceFormatError(
                    f"{path}: the rocpd kernels view lacks name / start / end (columns: {sorted(have)[:20]})"
                )
            picked = {key: next((c for c in options if c in have), None) for key, options in _ROCPD_OPTIONAL.items()}
            exprs = ", ".join(f'"{c}"' if c else "NULL" for c in picked.values())
            rows = con.execute(f"SELECT name, start, end, {exprs} FROM kernels").fetchall()
            try:
                regions = con.execute(
                    "SELECT coalesce(json_extract(extdata, '$.message'), name), start, end, tid FROM regions WHERE "
                    "category LIKE 'MARKER%'"
                ).fetchall()
            except SQLITE_ERRORS:
                regions = []
        finally:
            con.close()
    except SQLITE_ERRORS as exc:
        raise TraceFormatError(f"{path}: not a readable rocpd database ({exc})") from exc
    names: dict[str, int] = {}
    idx, start, end, dev, tid, stream, corr, grid, block = ([] for _ in range(9))  # type: ignore[var-annotated]
    skipped = 0
    for name, s, e, agent, t, strm, c, gx, gy, gz, bx, by, bz in rows:
        s_ns, e_ns = ns(s), ns(e)
        if s_ns is None or e_ns is None or not isinstance(name, (str, bytes)):
            skipped += 1
            continue
        text = name.decode("utf-8", errors="replace") if isinstance(name, bytes) else name
        idx.append(names.setdefault(text, len(names)))
        start.append(s_ns)
        end.append(e_ns)
        dev.append(_small(agent, 0))
        tid.append(ns(t) or -1)
        stream.append(ns(strm) or 0)
        corr.append(ns(c) or 0)
        grid.append((_small(gx, 0), _small(gy, 1), _small(gz, 1)))
        block.append((_small(bx, 0), _small(by, 1), _small(bz, 1)))
    has_dims = picked["grid_x"] is not None
    table = KernelTable(
        names=list(names),
        name_idx=np.array(idx, dtype=np.int32),
        start_ns=np.array(start, dtype=np.int64),
        end_ns=np.array(end, dtype=np.int64),
        device=np.array(dev, dtype=np.int32),
        launch_tid=np.array(tid, dtype=np.int64),
        stream=np.array(stream, dtype=np.int64),
        correlation_id=np.array(corr, dtype=np.int64),
        grid=np.array(grid, dtype=np.int32).reshape(-1, 3) if has_dims else None,
        block=np.array(block, dtype=np.int32).reshape(-1, 3) if picked["block_x"] is not None else None,
    )
    ranges = []
    for name, s, e, t in regions:
        s_ns, e_ns = ns(s), ns(e)
        if s_ns is None or e_ns is None or name is None:
            skipped += 1
            continue
        ranges.append(_roctx_range(str(name), s_ns, e_ns, ns(t)))
    return _raw("rocprofv3-rocpd", path, table, ranges, skipped)


_GPU_AGENT_TYPES = (2, "GPU", "ROCPROFILER_AGENT_TYPE_GPU")


def rocprof_json_capture(path: str) -> RawCapture:
    """rocprofv3 ``--output-format json`` (``{"rocprofiler-sdk-tool": [one object per process]}``) as a raw capture.

    Per process: ``buffer_records.kernel_dispatch`` (start / end timestamps in ns, ``dispatch_info`` with
    kernel id, agent and queue handles, grid and workgroup sizes), ``kernel_symbols`` (kernel id → name),
    ``agents`` (GPU names), and roctx ranges from ``buffer_records.marker_api`` records of kind
    ``MARKER_CORE_RANGE_API`` named through ``strings.marker_api`` (correlation id → message).
    Equivalent: ``rocprofv3 --kernel-trace --marker-trace --output-format json -d OUT -- <cmd>``.
    """
    text = read_text(path)
    check_json_depth(text, path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{path}: truncated or invalid JSON ({exc.msg} at line {exc.lineno})") from exc
    tool = doc.get(ROCPROF_JSON_KEY) if isinstance(doc, dict) else None
    processes = tool if isinstance(tool, list) else [tool] if isinstance(tool, dict) else None
    if not processes or not all(isinstance(p, dict) for p in processes):
        raise TraceFormatError(
            f"{path}: JSON without a {ROCPROF_JSON_KEY!r} list of process objects (not rocprofv3 JSON output)"
        )
    names: dict[str, int] = {}
    cols: dict[str, list[int]] = {k: [] for k in ("idx", "start", "end", "dev", "tid", "stream", "corr")}
    grid: list[tuple[int, int, int]] = []
    block: list[tuple[int, int, int]] = []
    ranges: list[PhaseRange] = []
    gpu_names: dict[int, str] = {}
    skipped = 0
    for proc in processes:
        symbols = _json_symbols(proc.get("kernel_symbols"))
        agents = _json_gpu_agents(proc.get("agents"), gpu_names)
        found = proc.get("buffer_records")
        buffers: dict[str, object] = found if isinstance(found, dict) else {}
        dispatches = buffers.get("kernel_dispatch") or []
        if not isinstance(dispatches, list):
            raise TraceFormatError(f"{path}: buffer_records.kernel_dispatch is not a list")
        for rec in dispatches:
            info = rec.get("dispatch_info") if isinstance(rec, dict) else None
            s, e = (
                (ns(rec.get("start_timestamp")), ns(rec.get("end_timestamp")))
                if isinstance(info, dict)
                else (None, None)
            )
            if s is None or e is None or not isinstance(info, dict):
                skipped += 1
                continue
            kernel_id = _small(info.get("kernel_id"), -1)
            name = symbols.get(kernel_id) or f"<kernel id {kernel_id}>"
            cols["idx"].append(names.setdefault(name, len(names)))
            cols["start"].append(s)
            cols["end"].append(e)
            # handles are 64-bit values (often addresses): kept whole, not bounded like counts
            cols["dev"].append(agents.get(_id(_handle(info.get("agent_id"))), 0))
            cols["tid"].append(_id(rec.get("thread_id")))
            cols["stream"].append(max(_id(_handle(info.get("queue_id"))), 0))
            cols["corr"].append(max(_id(_handle(rec.get("correlation_id"), "internal")), 0))
            grid.append(_xyz(info.get("grid_size")))
            block.append(_xyz(info.get("workgroup_size")))
        ranges += _json_ranges(proc, buffers)
    table = KernelTable(
        names=list(names),
        name_idx=np.array(cols["idx"], dtype=np.int32),
        start_ns=np.array(cols["start"], dtype=np.int64),
        end_ns=np.array(cols["end"], dtype=np.int64),
        device=np.array(cols["dev"], dtype=np.int32),
        launch_tid=np.array(cols["tid"], dtype=np.int64),
        stream=np.array(cols["stream"], dtype=np.int64),
        correlation_id=np.array(cols["corr"], dtype=np.int64),
        grid=np.array(grid, dtype=np.int32).reshape(-1, 3),
        block=np.array(block, dtype=np.int32).reshape(-1, 3),
    )
    return _raw(
        "rocprofv3-json",
        path,
        table,
        ranges,
        skipped,
        gpus=[GpuInfo(key=f"amd{i}", name=gpu_names[i]) for i in sorted(gpu_names)],
    )


def _id(value: object) -> int:
    """A non-negative id or handle (up to 64 bits), else -1."""
    v = ns(value)
    return v if v is not None and v >= 0 else -1


def _handle(value: object, key: str = "handle") -> object:
    """``{"handle": N}`` (agents, queues) or ``{"internal": N, "external": M}`` (correlation ids) as N; a bare number
    as is."""
    return value.get(key) if isinstance(value, dict) else value


def _xyz(value: object) -> tuple[int, int, int]:
    if not isinstance(value, dict):
        return (0, 0, 0)
    return (_small(value.get("x"), 0), _small(value.get("y"), 1), _small(value.get("z"), 1))


def _json_symbols(symbols: object) -> dict[int, str]:
    """Kernel id → name from ``kernel_symbols`` (a list of objects with ``kernel_id``, or indexed by it)."""
    entries = symbols if isinstance(symbols, list) else list(symbols.values()) if isinstance(symbols, dict) else []
    out: dict[int, str] = {}
    for i, sym in enumerate(entries):
        if not isinstance(sym, dict):
            continue
        name = sym.get("formatted_kernel_name") or sym.get("kernel_name") or sym.get("truncated_kernel_name")
        if isinstance(name, str) and name:
            out[_small(sym.get("kernel_id"), i)] = name
    return out


def _json_gpu_agents(agents: object, gpu_names: dict[int, str]) -> dict[int, int]:
    """Agent handle → GPU ordinal (``logical_node_type_id``, else the order among GPU agents); GPU names collected."""
    out: dict[int, int] = {}
    for agent in agents if isinstance(agents, list) else []:
        if not isinstance(agent, dict) or agent.get("type") not in _GPU_AGENT_TYPES:
            continue
        ordinal = _small(agent.get("logical_node_type_id"), len(out))
        out[_id(_handle(agent.get("id")))] = ordinal
        product = agent.get("product_name") or agent.get("name")
        if isinstance(product, str) and product:
            gpu_names.setdefault(ordinal, product)
    return out


def _json_ranges(proc: dict[str, object], buffers: dict[str, object]) -> list[PhaseRange]:
    """roctx ranges: ``marker_api`` records of a range kind, their text from ``strings.marker_api`` by correlation
    id."""
    strings = proc.get("strings")
    strings = strings if isinstance(strings, dict) else {}
    messages = {}
    marker_strings = strings.get("marker_api")
    for item in marker_strings if isinstance(marker_strings, list) else []:
        if isinstance(item, dict) and isinstance(item.get("value"), str):
            messages[_id(item.get("key"))] = item["value"]
    kind_list = strings.get("buffer_records")
    kinds: list[object] = kind_list if isinstance(kind_list, list) else []
    records = buffers.get("marker_api") or []
    out: list[PhaseRange] = []
    for rec in records if isinstance(records, list) else []:
        if not isinstance(rec, dict):
            continue
        kind = _small(rec.get("kind"), -1)
        entry = kinds[kind] if 0 <= kind < len(kinds) else None
        kind_name = entry.get("kind") if isinstance(entry, dict) else None
        if kind_name is not None and kind_name != "MARKER_CORE_RANGE_API":
            continue  # roctx API calls themselves, marks, names: not ranges
        name = messages.get(_id(_handle(rec.get("correlation_id"), "internal")))
        s, e = ns(rec.get("start_timestamp")), ns(rec.get("end_timestamp"))
        if name is None or s is None or e is None or e <= s:
            continue
        out.append(_roctx_range(name, s, e, ns(rec.get("thread_id"))))
    return out
