"""Read any supported file into a :class:`RawCapture`: ``max-profile report FILE`` and ``kernels --import FILE``.

Formats, detected by content (not by extension):

* a saved max_profile raw capture (``--raw``, ``.json`` / ``.json.gz``) — or an analysed report
* nsys SQLite export (``nsys export --type sqlite``), or a ``.nsys-rep`` (exported with nsys when present)
* ``nsys stats --format csv``: ``cuda_gpu_trace`` (per kernel) or ``cuda_gpu_kern_sum`` (totals)
* rocprofv3 ``*_kernel_trace.csv`` (+ ``*_marker_api_trace.csv`` beside it for phase ranges)
* rocprofv3 rocpd SQLite (``kernels`` and ``regions`` views)
* rocprofv3 JSON (``--output-format json``: a ``rocprofiler-sdk-tool`` document)
* Kineto / Chrome-trace JSON (``traceEvents`` with ``cat: kernel``), optionally gzipped
* ``max generate --profile`` stdout (its top-kernels table; without nsys only a cProfile table: said so)
* an Nsight Compute report (``.ncu-rep``, read through ``ncu --import``: the per-kernel deep dive)

Every problem raises :class:`~max_profile.errors.TraceFormatError` (or ``InputError``) naming the file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from max_profile.collect.kineto import kineto_capture
from max_profile.collect.ncu import ncu_rep_capture
from max_profile.collect.nsys import SQLITE_MAGIC, export_sqlite, nsys_capture
from max_profile.collect.nsys_stats import gpu_trace_capture, kern_sum_capture, max_generate_capture
from max_profile.collect.rocprof import ROCPROF_JSON_KEY, rocpd_capture, rocprof_csv_capture, rocprof_json_capture
from max_profile.collect.tables import NOISE_PREFIXES
from max_profile.errors import TraceFormatError
from max_profile.model import RawCapture, Report, load_saved
from max_profile.util.files import SQLITE_ERRORS, check_input_path, is_gzip, open_sqlite_readonly, read_head, read_input

FORMATS = ("max-profile-json", "gzipped-sqlite", "nsys-sqlite", "nsys-rep", "nsys-gpu-trace-csv", "nsys-kern-sum-csv", "rocprof-kernel-csv", "rocpd",
           "rocprof-json", "kineto-json", "max-generate-profile", "ncu-rep")


def detect_format(path: str) -> str:
    check_input_path(path)
    head = read_head(path)
    if head.startswith(SQLITE_MAGIC) and is_gzip(path):
        return "gzipped-sqlite"
    if head.startswith(SQLITE_MAGIC):
        try:
            con = open_sqlite_readonly(path)
            try:
                names = {str(r[0]) for r in con.execute("SELECT name FROM sqlite_master")}
            finally:
                con.close()
        except SQLITE_ERRORS as exc:
            raise TraceFormatError(f"{path}: corrupt or truncated SQLite file ({exc})") from exc
        if "CUPTI_ACTIVITY_KIND_KERNEL" in names or "StringIds" in names:
            return "nsys-sqlite"
        if "kernels" in names or any(n.startswith("rocpd_") for n in names):
            return "rocpd"
        raise TraceFormatError(f"{path}: an SQLite database, but neither an nsys export nor a rocprofv3 rocpd file")
    if path.endswith(".nsys-rep") or head[4:8] == b"QDST":
        return "nsys-rep"
    if path.endswith(".ncu-rep"):
        return "ncu-rep"
    text = head.decode("utf-8", errors="replace")
    stripped = text.lstrip()
    if stripped.startswith("{"):
        if f'"{ROCPROF_JSON_KEY}"' in text:
            return "rocprof-json"
        if '"traceEvents"' in text:
            return "kineto-json"
        if '"schema_version"' in text or '"environment"' in text or '"capture"' in text:
            return "max-profile-json"
        return "kineto-json"
    if stripped.startswith("["):
        return "kineto-json"
    first_rows = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(NOISE_PREFIXES)]
    header = first_rows[0] if first_rows else ""
    if "Kernel_Name" in header and ("Kind" in header or "Start_Timestamp" in header) or "KernelName" in header and "BeginNs" in header:
        return "rocprof-kernel-csv"
    if "Start (ns)" in header and "Name" in header or "Start (us)" in header:
        return "nsys-gpu-trace-csv"
    if "Total Time" in header and "Instances" in header and "Name" in header:
        return "nsys-kern-sum-csv"
    if "GPU kernels" in text and "=== Top" in text or "Python/CPU functions" in text or "Time to first token" in text:
        return "max-generate-profile"
    raise TraceFormatError(
        f"{path}: unrecognized format (expected a max_profile raw capture, an nsys .sqlite/.nsys-rep or stats CSV, a rocprofv3 "
        f"kernel_trace CSV, rocpd database or JSON, Kineto JSON, `max generate --profile` output or an .ncu-rep); first line: {header[:100]!r}"
    )


def load_any(path: str) -> RawCapture | Report:
    """A saved raw capture or report as it is, or any trace imported into a raw capture."""
    fmt = detect_format(path)
    if fmt == "max-profile-json":
        return load_saved(path)
    return import_trace(path, fmt)


def import_trace(path: str, fmt: str | None = None) -> RawCapture:
    """Read a trace file into a :class:`RawCapture` (no analysis: ``build_report`` does that)."""
    fmt = fmt or detect_format(path)
    if fmt == "max-profile-json":
        saved = load_saved(path)
        if isinstance(saved, Report):
            raise TraceFormatError(f"{path}: an analysed report, not a trace or raw capture (render it with `max-profile report {path}`)")
        return saved
    if fmt == "nsys-rep":
        path = _export_nsys_rep(path)
        fmt = "nsys-sqlite"
    if fmt == "gzipped-sqlite":
        with _gunzipped(path) as plain:
            raw = import_trace(plain)
        raw.artifacts = [os.path.abspath(path)]
        return raw
    readers: dict[str, Callable[[str], RawCapture]] = {
        "nsys-sqlite": nsys_capture,
        "nsys-gpu-trace-csv": gpu_trace_capture,
        "nsys-kern-sum-csv": kern_sum_capture,
        "rocprof-kernel-csv": rocprof_csv_capture,
        "rocpd": rocpd_capture,
        "rocprof-json": rocprof_json_capture,
        "kineto-json": kineto_capture,
        "max-generate-profile": max_generate_capture,
        "ncu-rep": ncu_rep_capture,
    }
    return readers[fmt](path)


@contextlib.contextmanager
def _gunzipped(path: str) -> Iterator[str]:
    """A gzipped SQLite file (a compressed export) unpacked to a temporary file for SQLite to open."""
    with tempfile.TemporaryDirectory(prefix="max-profile-gunzip-") as tmp:
        plain = os.path.join(tmp, Path(path).name.removesuffix(".gz") or "trace.sqlite")
        with open(plain, "wb") as fh:
            fh.write(read_input(path))
        yield plain


def _export_nsys_rep(path: str) -> str:
    from max_profile.collect.environment import require_tool

    nsys = require_tool("nsys", f"reading {path} (a .nsys-rep is exported to SQLite with `nsys export --type sqlite`)")
    out = str(Path(path).with_suffix(".sqlite"))
    why = export_sqlite(nsys, path, out)
    if why:
        raise TraceFormatError(f"{path}: {why}")
    return out
