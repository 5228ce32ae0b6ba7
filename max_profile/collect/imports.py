"""Read traces other tools wrote into a kernel breakdown: ``max-profile kernels --import FILE``.

Formats (detected by content, not by extension):

* nsys SQLite export (``nsys export --type sqlite``), or a ``.nsys-rep`` (exported with nsys when present)
* ``nsys stats --format csv`` output: ``cuda_gpu_trace`` (per kernel) or ``cuda_gpu_kern_sum`` (totals)
* rocprofv3 ``*_kernel_trace.csv`` (+ ``*_marker_api_trace.csv`` beside it for phase ranges)
* rocprofv3 rocpd SQLite (``kernels`` and ``regions`` views)
* Kineto / Chrome-trace JSON (``traceEvents`` with ``cat: kernel``), optionally gzipped
* ``max generate --profile`` stdout (only its cProfile table: no kernels, said so)

Every problem raises :class:`ImportFormatError` naming the file and what is wrong.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np

from max_profile.analyze.breakdown import KernelArrays, build_breakdown
from max_profile.analyze.plan import next_measurement
from max_profile.analyze.rules import evaluate
from max_profile.model import Capture, Environment, KernelBreakdown, PhaseRange, Report, Unavailable


class ImportFormatError(ValueError):
    pass


def _read_head(path: str, n: int = 4096) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(n)
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as gz:
                return gz.read(n)
        except (OSError, EOFError) as exc:
            raise ImportFormatError(f"{path}: truncated or corrupt gzip file ({exc})") from exc
    return head


def _text(path: str) -> str:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ImportFormatError(f"{path}: truncated or corrupt gzip file ({exc})") from exc
    return raw.decode("utf-8", errors="replace")


def detect_format(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise ImportFormatError(f"{path}: file not found")
    if p.is_dir():
        raise ImportFormatError(f"{path}: is a folder; pass the trace file inside it")
    if p.stat().st_size == 0:
        raise ImportFormatError(f"{path}: file is empty")
    head = _read_head(path)
    if head.startswith(b"SQLite format 3\x00"):
        try:
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
            con.close()
        except sqlite3.DatabaseError as exc:
            raise ImportFormatError(f"{path}: corrupt or truncated SQLite file ({exc})") from exc
        if "CUPTI_ACTIVITY_KIND_KERNEL" in names or "StringIds" in names:
            return "nsys-sqlite"
        if "kernels" in names or any(n.startswith("rocpd_") for n in names):
            return "rocpd"
        raise ImportFormatError(f"{path}: an SQLite database, but neither an nsys export nor a rocprofv3 rocpd file")
    if path.endswith(".nsys-rep") or head[:8] in (b"\x00\x00\x00\x00QDST",):
        return "nsys-rep"
    text = head.decode("utf-8", errors="replace")
    stripped = text.lstrip()
    if stripped.startswith("{") or stripped.startswith("["):
        return "kineto-json"
    first_rows = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("Processing [", "Generating SQLite", " **", "**"))]
    header = first_rows[0] if first_rows else ""
    if '"Kind"' in header and "Kernel_Name" in header or header.startswith("Kind,") and "Kernel_Name" in header:
        return "rocprof-kernel-csv"
    if "Start (ns)" in header and "Name" in header or "Start (us)" in header:
        return "nsys-gpu-trace-csv"
    if "Total Time" in header and "Instances" in header and "Name" in header:
        return "nsys-kern-sum-csv"
    if "Top" in text and "Python/CPU functions" in text or "Time to first token" in text:
        return "max-generate-profile"
    raise ImportFormatError(
        f"{path}: unrecognized format (expected an nsys .sqlite/.nsys-rep or stats CSV, a rocprofv3 kernel_trace CSV or rocpd "
        f"database, Kineto JSON, or `max generate --profile` output); first line: {header[:100]!r}"
    )


def _report(source: str, path: str) -> Report:
    env = Environment(vendor="none", vendor_reason=f"imported from {path}; environment of the capture unknown")
    return Report(environment=env, capture=Capture(started_unix_s=time.time(), target=f"import:{source}", collectors=[source]), artifacts=[os.path.abspath(path)])


def _finish(report: Report, vendor: str = "none") -> Report:
    if vendor != "none":
        report.environment = Environment(vendor=vendor, vendor_reason=report.environment.vendor_reason)  # type: ignore[arg-type]
    report.findings = evaluate(report)
    report.next_measurement = next_measurement(report)
    return report


def import_trace(path: str) -> Report:
    fmt = detect_format(path)
    if fmt == "nsys-rep":
        path = _export_nsys_rep(path)
        fmt = "nsys-sqlite"
    if fmt == "nsys-sqlite":
        from max_profile.collect.nsys import NsysFormatError, read_nsys_sqlite

        try:
            trace = read_nsys_sqlite(path)
        except NsysFormatError as exc:
            raise ImportFormatError(str(exc)) from exc
        report = _report("nsys", path)
        if not len(trace.kernels):
            report.kernels = Unavailable(f"{path}: the capture holds no kernels")
            return _finish(report, "nvidia")
        report.kernels = build_breakdown(trace.kernels, source="nsys", ranges=trace.ranges)
        if not trace.ranges and trace.all_range_names:
            report.capture.phase_markers = "none of ours (" + ", ".join(list(trace.all_range_names)[:5]) + ")"
        return _finish(report, "nvidia")
    if fmt == "nsys-gpu-trace-csv":
        return _finish(_import_nsys_gpu_trace(path), "nvidia")
    if fmt == "nsys-kern-sum-csv":
        return _finish(_import_kern_sum(path), "nvidia")
    if fmt == "rocprof-kernel-csv":
        return _finish(_import_rocprof_csv(path), "amd")
    if fmt == "rocpd":
        return _finish(_import_rocpd(path), "amd")
    if fmt == "kineto-json":
        return _finish(_import_kineto(path))
    report = _report("max-generate-profile", path)
    report.kernels = Unavailable(
        f"{path}: `max generate --profile` output without nsys holds only a cProfile table (host functions), no kernels; "
        "install Nsight Systems and re-run it, or use `max-profile kernels --model-path P`"
    )
    return _finish(report)


def _export_nsys_rep(path: str) -> str:
    from max_profile.collect.environment import tool_status

    st = tool_status("nsys")
    if not st.path:
        raise ImportFormatError(f"{path}: reading a .nsys-rep needs nsys to export it (`nsys export --type sqlite`); {st.install_hint}")
    out = str(Path(path).with_suffix(".sqlite"))
    res = subprocess.run([st.path, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", out, path], capture_output=True, text=True, timeout=600, check=False)
    if res.returncode != 0 or not os.path.exists(out):
        raise ImportFormatError(f"{path}: `nsys export` failed: {(res.stderr or res.stdout).strip()[:300]}")
    return out


def _csv_rows(path: str) -> tuple[list[str], list[list[str]]]:
    text = _text(path)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("Processing [", "Generating SQLite", " **", "**"))]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if not rows:
        raise ImportFormatError(f"{path}: no CSV rows")
    return rows[0], rows[1:]


def _col(header: list[str], path: str, *names: str) -> int:
    for n in names:
        if n in header:
            return header.index(n)
    raise ImportFormatError(f"{path}: expected a column {names[0]!r}; the header has {header[:12]}")


def _num(value: str) -> float:
    return float(value.replace(",", "")) if value.strip() else 0.0


def _import_nsys_gpu_trace(path: str) -> Report:
    header, rows = _csv_rows(path)
    unit = 1.0 if "Start (ns)" in header else 1e3
    i_start = _col(header, path, "Start (ns)", "Start (us)")
    i_dur = _col(header, path, "Duration (ns)", "Duration (us)")
    i_name = _col(header, path, "Name")
    i_grid = header.index("GrdX") if "GrdX" in header else None
    names: dict[str, int] = {}
    idx, start, end = [], [], []
    for r in rows:
        if len(r) <= i_name:
            raise ImportFormatError(f"{path}: ragged row with {len(r)} fields: {r[:4]}")
        if i_grid is not None and not r[i_grid].strip():
            continue  # memcpy / memset rows
        s = _num(r[i_start]) * unit
        idx.append(names.setdefault(r[i_name], len(names)))
        start.append(int(s))
        end.append(int(s + _num(r[i_dur]) * unit))
    arr = _arrays(list(names), idx, start, end)
    report = _report("nsys-stats-csv", path)
    report.kernels = build_breakdown(arr, source="nsys stats cuda_gpu_trace")
    return report


def _arrays(names: list[str], idx: list[int], start: list[int], end: list[int]) -> KernelArrays:
    n = len(idx)
    return KernelArrays(
        names=names,
        name_idx=np.array(idx, dtype=np.int32),
        start=np.array(start, dtype=np.int64),
        end=np.array(end, dtype=np.int64),
        launch=np.full(n, -1, dtype=np.int64),
        tid=np.full(n, -1, dtype=np.int64),
        device=np.zeros(n, dtype=np.int32),
        graph=np.zeros(n, dtype=bool),
    )


def _import_kern_sum(path: str) -> Report:
    """Totals only: expand each row into one synthetic interval per kernel name (no phases)."""
    header, rows = _csv_rows(path)
    unit = 1.0 if any("(ns)" in h for h in header) else 1e3
    i_total = _col(header, path, "Total Time (ns)", "Total Time (us)")
    i_inst = _col(header, path, "Instances")
    i_name = _col(header, path, "Name")
    names, idx, start, end = [], [], [], []
    t = 0
    counts = []
    for r in rows:
        total = int(_num(r[i_total]) * unit)
        names.append(r[i_name])
        idx.append(len(names) - 1)
        start.append(t)
        end.append(t + total)
        counts.append(int(_num(r[i_inst])))
        t += total
    arr = _arrays(names, idx, start, end)
    report = _report("nsys-kern-sum-csv", path)
    bd = build_breakdown(arr, source="nsys stats cuda_gpu_kern_sum (totals only: no phases, no timeline)")
    # restore the real instance counts the summary carries
    by_name = {n: c for n, c in zip(names, counts, strict=True)}
    from max_profile.analyze.families import base_name

    fixed = []
    for row in bd.top_kernels:
        c = sum(v for k, v in by_name.items() if base_name(k) == row.name) or row.count
        fixed.append(type(row)(name=row.name, family=row.family, count=c, total_ms=row.total_ms, mean_us=row.total_ms * 1e3 / c, share_pct=row.share_pct))
    report.kernels = KernelBreakdown(**{**{f: getattr(bd, f) for f in bd.__struct_fields__}, "top_kernels": fixed})
    return report


def _import_rocprof_csv(path: str) -> Report:
    header, rows = _csv_rows(path)
    i_name = _col(header, path, "Kernel_Name")
    i_start = _col(header, path, "Start_Timestamp")
    i_end = _col(header, path, "End_Timestamp")
    i_agent = header.index("Agent_Id") if "Agent_Id" in header else None
    i_tid = header.index("Thread_Id") if "Thread_Id" in header else None
    names: dict[str, int] = {}
    idx, start, end, dev, tid = [], [], [], [], []
    for r in rows:
        if len(r) <= max(i_name, i_start, i_end):
            raise ImportFormatError(f"{path}: ragged row with {len(r)} fields: {r[:4]}")
        idx.append(names.setdefault(r[i_name], len(names)))
        start.append(int(_num(r[i_start])))
        end.append(int(_num(r[i_end])))
        agent = r[i_agent] if i_agent is not None else "0"
        dev.append(int(re.sub(r"\D", "", agent) or 0))
        tid.append(int(_num(r[i_tid])) if i_tid is not None else -1)
    arr = _arrays(list(names), idx, start, end)
    arr.device = np.array(dev, dtype=np.int32)
    ranges = _rocprof_markers(path)
    report = _report("rocprofv3-csv", path)
    report.kernels = build_breakdown(arr, source="rocprofv3 kernel_trace", ranges=ranges)
    return report


def _rocprof_markers(kernel_csv: str) -> list[PhaseRange]:
    marker = kernel_csv.replace("kernel_trace", "marker_api_trace")
    if marker == kernel_csv or not os.path.exists(marker):
        return []
    header, rows = _csv_rows(marker)
    i_fn = _col(header, marker, "Function")
    i_start = _col(header, marker, "Start_Timestamp")
    i_end = _col(header, marker, "End_Timestamp")
    i_tid = header.index("Thread_Id") if "Thread_Id" in header else None
    out = []
    for r in rows:
        name = r[i_fn]
        out.append(PhaseRange(name=name, start_ns=int(_num(r[i_start])), end_ns=int(_num(r[i_end])), tid=int(_num(r[i_tid])) if i_tid is not None else None,
                              domain="max_profile" if name.startswith("max_profile:") else None))
    return out


def _import_rocpd(path: str) -> Report:
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        rows = con.execute("SELECT name, start, end, agent_abs_index, tid FROM kernels").fetchall()
        try:
            regions = con.execute(
                "SELECT coalesce(json_extract(extdata, '$.message'), name), start, end, tid FROM regions WHERE category LIKE 'MARKER%'"
            ).fetchall()
        except sqlite3.DatabaseError:
            regions = []
        con.close()
    except sqlite3.DatabaseError as exc:
        raise ImportFormatError(f"{path}: not a readable rocpd database ({exc})") from exc
    names: dict[str, int] = {}
    idx = [names.setdefault(r[0], len(names)) for r in rows]
    arr = _arrays(list(names), idx, [int(r[1]) for r in rows], [int(r[2]) for r in rows])
    arr.device = np.array([int(r[3] or 0) for r in rows], dtype=np.int32)
    ranges = [PhaseRange(name=str(r[0]), start_ns=int(r[1]), end_ns=int(r[2]), tid=r[3]) for r in regions]
    report = _report("rocpd", path)
    report.kernels = build_breakdown(arr, source="rocprofv3 rocpd", ranges=ranges)
    return report


def _import_kineto(path: str) -> Report:
    try:
        doc = json.loads(_text(path))
    except json.JSONDecodeError as exc:
        raise ImportFormatError(f"{path}: truncated or invalid JSON ({exc.msg} at line {exc.lineno})") from exc
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ImportFormatError(f"{path}: JSON without a traceEvents list (not a Kineto / Chrome trace)")
    names: dict[str, int] = {}
    idx, start, end, dev = [], [], [], []
    ranges: list[PhaseRange] = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        ts, dur = float(e.get("ts", 0)), float(e.get("dur", 0))
        if cat == "kernel":
            idx.append(names.setdefault(str(e.get("name", "?")), len(names)))
            start.append(int(ts * 1e3))
            end.append(int((ts + dur) * 1e3))
            args = e.get("args") or {}
            dev.append(int(args.get("device", 0)) if isinstance(args, dict) else 0)
        elif cat in ("user_annotation", "gpu_user_annotation") and str(e.get("name", "")).split(":")[-1] in ("prefill", "decode", "mixed"):
            ranges.append(PhaseRange(name=str(e["name"]), start_ns=int(ts * 1e3), end_ns=int((ts + dur) * 1e3), domain="max_profile"))
    if not idx:
        raise ImportFormatError(f"{path}: the trace has no GPU kernel events (cat: kernel)")
    arr = _arrays(list(names), idx, start, end)
    arr.device = np.array(dev, dtype=np.int32)
    report = _report("kineto-json", path)
    report.kernels = build_breakdown(arr, source="kineto json", ranges=ranges)
    return report
