"""Every file format max_profile reads, as one registry of :class:`Source` entries: how to recognize a file from its
head, and how to read it into a :class:`~max_profile.model.RawCapture`.

A new format is one more :class:`Source` in :data:`SOURCES` (order matters: the first whose ``sniff`` accepts a file
reads it); ``max-profile report FILE``, ``kernels --import FILE`` and :func:`max_profile.load` all go through it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from max_profile.collect.readers.otlp import looks_like_otlp_json
from max_profile.collect.readers.tables import NOISE_PREFIXES, ROCPROF_JSON_KEY
from max_profile.errors import TraceFormatError
from max_profile.model import Report, load_saved
from max_profile.util.files import (
    SQLITE_ERRORS,
    SQLITE_MAGIC,
    check_input_path,
    is_gzip,
    open_sqlite_readonly,
    read_head,
    read_input,
)

if TYPE_CHECKING:
    from max_profile.model import RawCapture


def _reader(module: str, name: str) -> Callable[[str], RawCapture]:
    """``module.name(path)``, the module imported on the first read: recognizing a file (and showing a saved report)
    loads no reader and none of numpy."""

    def read(path: str) -> RawCapture:
        return getattr(importlib.import_module(f"max_profile.collect.readers.{module}"), name)(path)  # type: ignore[no-any-return]

    read.__name__ = read.__qualname__ = name
    return read


nsys_capture = _reader("nsys", "nsys_capture")
rocpd_capture = _reader("rocprof", "rocpd_capture")
rocprof_csv_capture = _reader("rocprof", "rocprof_csv_capture")
rocprof_json_capture = _reader("rocprof", "rocprof_json_capture")
ncu_rep_capture = _reader("ncu", "ncu_rep_capture")
otlp_capture = _reader("otlp_passes", "otlp_capture")
kineto_capture = _reader("kineto", "kineto_capture")
gpu_trace_capture = _reader("nsys_stats", "gpu_trace_capture")
kern_sum_capture = _reader("nsys_stats", "kern_sum_capture")
max_generate_capture = _reader("nsys_stats", "max_generate_capture")


@dataclass
class Head:
    """What a source may look at to recognize a file: its first bytes (decompressed), its name, its SQLite tables."""

    path: str
    bytes: bytes

    @cached_property
    def text(self) -> str:
        return self.bytes.decode("utf-8", errors="replace")

    @cached_property
    def gzip(self) -> bool:
        return is_gzip(self.path)

    @cached_property
    def sqlite(self) -> bool:
        return self.bytes.startswith(SQLITE_MAGIC)

    @cached_property
    def tables(self) -> set[str]:
        """The SQLite file's table names (empty for anything else); a damaged database is refused here."""
        if not self.sqlite or self.gzip:
            return set()
        try:
            con = open_sqlite_readonly(self.path)
            try:
                return {str(r[0]) for r in con.execute("SELECT name FROM sqlite_master")}
            finally:
                con.close()
        except SQLITE_ERRORS as exc:
            raise TraceFormatError(f"{self.path}: corrupt or truncated SQLite file ({exc})") from exc

    @cached_property
    def first_row(self) -> str:
        """The first line of a text file that is not a profiler's banner (the CSV header)."""
        rows = [ln for ln in self.text.splitlines() if ln.strip() and not ln.startswith(NOISE_PREFIXES)]
        return rows[0] if rows else ""


@dataclass(frozen=True)
class Source:
    """One file format: ``sniff(head)`` says whether a file is one; ``read(path)`` reads it (no analysis)."""

    name: str
    describe: str
    sniff: Callable[[Head], bool]
    read: Callable[[str], RawCapture]

    @property
    def saved(self) -> bool:
        """One of max_profile's own files (a raw capture or an analysed report), not a trace to read."""
        return self.read is _read_saved


def _json_object(h: Head) -> bool:
    return h.text.lstrip().startswith("{")


def _read_ncu_csv(path: str) -> RawCapture:
    """One Nsight Compute page: the details page (sections, rules) or the raw page (every metric), by its columns."""
    from max_profile.collect.readers.ncu import ncu_capture

    head = read_input(path)[:4096].decode("utf-8", errors="replace").splitlines()[0]
    return (
        ncu_capture(path, target="import:ncu-csv")
        if '"Metric Name"' in head
        else ncu_capture(None, path, target="import:ncu-csv")
    )


def _read_gzipped_sqlite(path: str) -> RawCapture:
    """The export unpacked to a temporary file; what the capture says of its file names the user's file, not that
    one."""
    with _gunzipped(path) as plain:
        raw = import_trace(plain)
    raw.artifacts = [os.path.abspath(path)]
    raw.environment = msgspec.structs.replace(
        raw.environment, vendor_reason=raw.environment.vendor_reason.replace(plain, path)
    )
    return raw


def _read_nsys_rep(path: str) -> RawCapture:
    from max_profile.collect.probes.environment import require_tool
    from max_profile.collect.readers.nsys import export_sqlite

    nsys = require_tool("nsys", f"reading {path} (a .nsys-rep is exported to SQLite with `nsys export --type sqlite`)")
    out = str(Path(path).with_suffix(".sqlite"))
    why = export_sqlite(nsys, path, out)
    if why:
        raise TraceFormatError(f"{path}: {why}")
    return nsys_capture(out)


def _refuse_other_sqlite(path: str) -> RawCapture:
    raise TraceFormatError(f"{path}: an SQLite database, but neither an nsys export nor a rocprofv3 rocpd file")


def _read_saved(path: str) -> RawCapture:
    saved = load_saved(path)
    if isinstance(saved, Report):
        raise TraceFormatError(
            f"{path}: an analysed report, not a trace or raw capture (render it with `max-profile report {path}`)"
        )
    return saved


SOURCES: tuple[Source, ...] = (
    Source("gzipped-sqlite", "a gzipped SQLite export", lambda h: h.sqlite and h.gzip, _read_gzipped_sqlite),
    Source(
        "nsys-sqlite",
        "an nsys .sqlite export",
        lambda h: bool(h.tables & {"CUPTI_ACTIVITY_KIND_KERNEL", "StringIds"}),
        nsys_capture,
    ),
    Source(
        "rocpd",
        "a rocprofv3 rocpd database",
        lambda h: "kernels" in h.tables or any(t.startswith("rocpd_") for t in h.tables),
        rocpd_capture,
    ),
    Source("sqlite-unknown", "", lambda h: h.sqlite and not h.gzip, _refuse_other_sqlite),
    Source(
        "nsys-rep",
        "an nsys .nsys-rep",
        lambda h: h.path.endswith(".nsys-rep") or h.bytes[4:8] == b"QDST",
        _read_nsys_rep,
    ),
    Source("ncu-rep", "an Nsight Compute .ncu-rep", lambda h: h.path.endswith(".ncu-rep"), ncu_rep_capture),
    Source(
        "ncu-csv",
        "an Nsight Compute CSV page (`ncu --csv --page details` or `--page raw`)",
        lambda h: h.text.lstrip("\ufeff").startswith('"ID","Process ID"'),
        _read_ncu_csv,
    ),
    Source(
        "otlp-json",
        "OpenTelemetry spans (OTLP/JSON; a Collector's file exporter)",
        lambda h: looks_like_otlp_json(h.text),
        otlp_capture,
    ),
    Source(
        "otlp-protobuf",
        "OpenTelemetry spans (an OTLP protobuf ExportTraceServiceRequest, .pb / .otlp)",
        lambda h: h.path.removesuffix(".gz").endswith((".otlp", ".pb")),
        otlp_capture,
    ),
    Source(
        "rocprof-json",
        "a rocprofv3 JSON",
        lambda h: _json_object(h) and f'"{ROCPROF_JSON_KEY}"' in h.text,
        rocprof_json_capture,
    ),
    Source(
        "kineto-json",
        "a Kineto / Chrome-trace JSON",
        lambda h: _json_object(h) and '"traceEvents"' in h.text,
        kineto_capture,
    ),
    Source(
        "max-profile-json",
        "a max_profile raw capture or report",
        lambda h: _json_object(h) and any(k in h.text for k in ('"schema_version"', '"environment"', '"capture"')),
        _read_saved,
    ),
    Source("kineto-json-bare", "", lambda h: _json_object(h) or h.text.lstrip().startswith("["), kineto_capture),
    Source(
        "rocprof-kernel-csv",
        "a rocprofv3 kernel_trace CSV (or rocprofv2 / rocprof results.csv)",
        lambda h: (
            ("Kernel_Name" in h.first_row and ("Kind" in h.first_row or "Start_Timestamp" in h.first_row))
            or ("KernelName" in h.first_row and "BeginNs" in h.first_row)
        ),
        rocprof_csv_capture,
    ),
    Source(
        "nsys-gpu-trace-csv",
        "an `nsys stats` cuda_gpu_trace CSV",
        lambda h: ("Start (ns)" in h.first_row and "Name" in h.first_row) or "Start (us)" in h.first_row,
        gpu_trace_capture,
    ),
    Source(
        "nsys-kern-sum-csv",
        "an `nsys stats` cuda_gpu_kern_sum CSV",
        lambda h: all(k in h.first_row for k in ("Total Time", "Instances", "Name")),
        kern_sum_capture,
    ),
    Source(
        "max-generate-profile",
        "`max generate --profile` output",
        lambda h: (
            ("GPU kernels" in h.text and "=== Top" in h.text)
            or "Python/CPU functions" in h.text
            or "Time to first token" in h.text
        ),
        max_generate_capture,
    ),
)
"""Checked in this order; the first that accepts a file reads it."""
FORMATS = tuple(s.name for s in SOURCES if s.describe)


def detect_format(path: str) -> Source:
    """The source that reads ``path`` (by content, not by extension); :class:`TraceFormatError` for anything else."""
    check_input_path(path)
    head = Head(path, read_head(path))
    for source in SOURCES:
        if source.sniff(head):
            return source
    own = _own_output(path, head)
    if own:
        raise TraceFormatError(f"{path}: {own}: pass the run's --raw capture (or its --json report)")
    first = head.first_row[:60].encode("ascii", "backslashreplace").decode()
    raise TraceFormatError(
        f"{path}: unrecognized format (first bytes {first!r}); it reads raw captures, reports, nsys, rocprofv3, "
        "Kineto, ncu and `max generate --profile` output"
    )


_OWN_OUTPUTS = (
    (".pftrace", "a Perfetto trace (--perfetto; open it in ui.perfetto.dev)"),
    (".html", "an HTML page (--html)"),
    (".htm", "an HTML page (--html)"),
    (".prom", "Prometheus text (--prometheus)"),
    (".txt", "a text report (--text)"),
)


def _own_output(path: str, head: Head) -> str | None:
    """What one of max_profile's own write-only outputs is, when ``path`` is one (by its extension and first bytes)."""
    name = path.lower().removesuffix(".gz")
    said = next((what for ext, what in _OWN_OUTPUTS if name.endswith(ext)), None)
    if said is None and head.text.lstrip().startswith(("<!doctype html", "<html")):
        said = "an HTML page (--html)"
    return said


def load_any(path: str, source: Source | None = None) -> RawCapture | Report:
    """A saved raw capture or report as it is, or any trace read into a raw capture; ``source``: the file's format where
    the caller has already detected it."""
    source = source or detect_format(path)
    if source.saved:
        return load_saved(path)
    return source.read(path)


def import_trace(path: str, fmt: str | None = None) -> RawCapture:
    """Read a trace file into a :class:`RawCapture` (no analysis: ``build_report`` does that); ``fmt`` forces a source
    by name."""
    source = next((s for s in SOURCES if s.name == fmt), None) if fmt else detect_format(path)
    if source is None:
        raise TraceFormatError(f"{path}: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    return source.read(path)


@contextlib.contextmanager
def _gunzipped(path: str) -> Iterator[str]:
    """A gzipped SQLite file (a compressed export) unpacked to a temporary file for SQLite to open."""
    with tempfile.TemporaryDirectory(prefix="max-profile-gunzip-") as tmp:
        plain = os.path.join(tmp, Path(path).name.removesuffix(".gz") or "trace.sqlite")
        with open(plain, "wb") as fh:
            fh.write(read_input(path))
        yield plain
