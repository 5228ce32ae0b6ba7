"""Nsight Compute CSV pages parsed into :class:`~max_profile.model.NcuLaunch` records (no analysis here).

Input: ``ncu --import R.ncu-rep --csv --page details|raw --print-units base`` (or the same printed
live). CSV traps handled (formats measured with ncu 2025.3.1 on an H200): noise before the header
(``==PROF==`` lines and the application's own output), thousands separators (``"3,191,212.5"``),
ragged rows (rules rows are longer than metric rows), units that depend on how the CSV was made
(``ns`` vs ``us``, ``byte`` vs ``Mbyte``), the raw page's units row.
"""

from __future__ import annotations

import csv
import io
import math
import os
import tempfile
import time
from typing import Any

from max_profile.collect.probes.environment import require_tool
from max_profile.errors import TraceFormatError
from max_profile.model import Capture, Environment, NcuLaunch, RawCapture
from max_profile.model.tags import Collector
from max_profile.util.files import check_input_path, read_input
from max_profile.util.procs import run_bounded

NO_KERNELS = "No kernels were profiled"
PERMISSION_ERRORS = ("ERR_NVGPUCTRPERM", "does not have permission to access NVIDIA GPU Performance Counters")
PERMISSION_FIX = (
    "GPU performance counters are restricted to admin users: run ncu as root (sudo), or allow all users with "
    "`echo 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' | sudo tee /etc/modprobe.d/ncu-permissions.conf` "
    "and a reboot (https://developer.nvidia.com/ERR_NVGPUCTRPERM)"
)

_UNIT_SCALE = {
    "ns": 1.0,
    "us": 1e3,
    "usecond": 1e3,
    "ms": 1e6,
    "msecond": 1e6,
    "s": 1e9,
    "second": 1e9,
    "nsecond": 1.0,
    "byte": 1.0,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "tbyte": 1e12,
    "byte/s": 1.0,
    "kbyte/s": 1e3,
    "mbyte/s": 1e6,
    "gbyte/s": 1e9,
    "tbyte/s": 1e12,
    "hz": 1.0,
    "khz": 1e3,
    "mhz": 1e6,
    "ghz": 1e9,
    # without --print-units base (and in older ncu): spelled-out rates, frequencies as cycles per time
    "byte/second": 1.0,
    "kbyte/second": 1e3,
    "mbyte/second": 1e6,
    "gbyte/second": 1e9,
    "tbyte/second": 1e12,
    "cycle/second": 1.0,
    "cycle/usecond": 1e6,
    "cycle/nsecond": 1e9,
    "byte/block": 1.0,
    "kbyte/block": 1e3,
    "mbyte/block": 1e6,
}


def to_number(value: str | None, unit: str | None = None) -> float | None:
    """``"3,191,212,121.21"`` -> 3191212121.21, scaled to base units (``us`` -> ns, ``Mbyte`` -> byte)."""
    if value is None:
        return None
    text = value.strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan"):
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    if not math.isfinite(number):
        return None
    scale = _UNIT_SCALE.get((unit or "").strip().lower(), 1.0)
    scaled = number * scale
    return scaled if math.isfinite(scaled) else None


def metric_value(value: str | None, unit: str | None = None) -> float | None:
    """A metric reading: :func:`to_number`, and never negative (ncu's counters, rates and percentages
    are not; a negative cell is damage and is left out rather than reported)."""
    number = to_number(value, unit)
    return number if number is not None and number >= 0 else None


def _csv_from_text(text: str, path: str) -> list[list[str]]:
    """The CSV part of ncu output: from the header row (first cell ``ID``) on; noise before it dropped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID",') or ln.startswith("ID,")), None)
    if start is None:
        if NO_KERNELS in text:
            raise TraceFormatError(f"{path}: ncu profiled no kernel ('{NO_KERNELS}'): the -k regex matched nothing")
        if any(e in text for e in PERMISSION_ERRORS):
            raise TraceFormatError(f"{path}: {PERMISSION_FIX}")
        raise TraceFormatError(
            f'{path}: not ncu CSV output (no header row starting with "ID"; make it with `ncu --csv --page details '
            "--print-units base`)"
        )
    rows = list(csv.reader(io.StringIO("\n".join(ln for ln in lines[start:] if not ln.startswith("==")))))
    return rows


def parse_ncu_csv(text: str, path: str = "<ncu output>") -> dict[str, dict[str, Any]]:
    """Per profiled launch ID: ``name``, ``grid``, ``block``, ``device``, ``metrics`` {label or metric name: base
    value}, ``rules``."""
    rows = _csv_from_text(text, path)
    header = rows[0]
    if "Metric Name" in header:
        return _parse_details(header, rows[1:], path)
    return _parse_raw(header, rows[1:], path)


def _parse_details(header: list[str], rows: list[list[str]], path: str) -> dict[str, dict[str, Any]]:
    need = {"ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"}
    if not need <= set(header):
        raise TraceFormatError(f"{path}: ncu details CSV lacks columns {sorted(need - set(header))}")
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if not r or not r[0].strip():
            continue
        d = dict(zip(header, r, strict=False))  # ragged rows: metric rows are shorter than rule rows
        k = out.setdefault(
            r[0].strip(),
            {
                "name": d.get("Kernel Name") or "?",
                "grid": d.get("Grid Size"),
                "block": d.get("Block Size"),
                "device": d.get("Device"),
                "metrics": {},
                "sections": {},
                "rules": [],
            },
        )
        label = d.get("Metric Name") or ""
        if label:
            value = metric_value(d.get("Metric Value"), d.get("Metric Unit"))
            if value is not None:
                section = d.get("Section Name") or ""
                k["metrics"].setdefault(label, value)
                k["sections"][f"{section}/{label}"] = value
        elif d.get("Rule Name"):
            desc = (d.get("Rule Description") or "").strip()
            if desc:
                k["rules"].append(f"[{d.get('Rule Type', '')}] {d['Rule Name']}: {desc}")
    if not out:
        raise TraceFormatError(f"{path}: ncu CSV has a header but no profiled kernel rows (truncated?)")
    return out


def _parse_raw(header: list[str], rows: list[list[str]], path: str) -> dict[str, dict[str, Any]]:
    if "Kernel Name" not in header:
        raise TraceFormatError(f"{path}: ncu raw CSV lacks the 'Kernel Name' column")
    has_units = bool(rows) and (not rows[0] or not rows[0][0].strip())  # the second header row: units, first cell empty
    units = rows[0] if has_units else [""] * len(header)
    body = rows[1:] if has_units else rows
    out: dict[str, dict[str, Any]] = {}
    for r in body:
        if not r or not r[0].strip():
            continue
        d = dict(zip(header, r, strict=False))
        metrics = {}
        for i, name in enumerate(header):
            if i < len(r) and "__" in name:
                v = metric_value(r[i], units[i] if i < len(units) else None)
                if v is not None:
                    metrics[name] = v
        out[r[0].strip()] = {
            "name": d.get("Kernel Name") or "?",
            "grid": d.get("Grid Size"),
            "block": d.get("Block Size"),
            "device": d.get("Device"),
            "metrics": metrics,
            "sections": {},
            "rules": [],
        }
    if not out:
        raise TraceFormatError(f"{path}: ncu raw CSV has no kernel rows")
    return out


def read_ncu_files(details_path: str | None, raw_path: str | None = None) -> list[NcuLaunch]:
    """The launches of a details page and / or a raw page (joined on the launch ID)."""
    details = parse_ncu_csv(_read(details_path), details_path) if details_path else {}
    raw = parse_ncu_csv(_read(raw_path), raw_path) if raw_path else {}
    ids = sorted(set(details) | set(raw), key=lambda x: (0, int(x), "") if x.isdigit() else (1, 0, x))
    out = []
    for i in ids:
        d, r = details.get(i) or {}, raw.get(i) or {}
        src = d or r
        metrics = dict(r.get("metrics", {}))
        metrics.update(d.get("metrics", {}))
        # older ncu has no Grid / Block Size columns: Launch Statistics' totals stand in ("1024" threads, not "(1024,
        # 1, 1)")
        grid = src.get("grid") or _total(metrics, "Grid Size")
        block = src.get("block") or _total(metrics, "Block Size")
        out.append(
            NcuLaunch(
                launch_id=i,
                name=str(src.get("name") or "?"),
                grid=grid,
                block=block,
                device=src.get("device"),
                metrics=metrics,
                sections=dict(d.get("sections", {})),
                rules=list(d.get("rules", [])),
            )
        )
    return out


def _total(metrics: dict[str, float], label: str) -> str | None:
    value = metrics.get(label)
    return f"{value:.0f}" if value is not None else None


def ncu_capture(details_path: str | None, raw_path: str | None = None, *, target: str = "ncu import") -> RawCapture:
    """Nsight Compute pages as a :class:`RawCapture` (analysed by ``build_report``)."""
    env = Environment(vendor="nvidia", vendor_reason=f"Nsight Compute pages {details_path or raw_path}")
    raw = RawCapture(environment=env, capture=Capture(started_unix_s=time.time(), target=target))
    fill_ncu_pages(raw, details_path, raw_path)
    return raw


def fill_ncu_pages(raw: RawCapture, details_path: str | None, raw_path: str | None = None) -> None:
    """The launches of Nsight Compute's ``details`` / ``raw`` pages into ``raw`` (ncu among its collectors)."""
    raw.ncu_launches = read_ncu_files(details_path, raw_path)
    raw.kernels_unavailable = None
    raw.capture.collectors = [*raw.capture.collectors, Collector.NCU]


def _read(path: str) -> str:
    return read_input(path).decode("utf-8", errors="replace")


NCU_PAGES = ("details", "raw")


def export_ncu_pages(ncu: str, report: str, out_dir: str, *, timeout_s: float = 600) -> dict[str, str]:
    """``ncu --import REPORT --csv --page details|raw --print-units base`` into ``out_dir``: the page files by name.

    Each call runs in its own process group (ended on timeout or Ctrl-C); a failing call raises
    :class:`TraceFormatError` with ncu's own words.
    """

    pages = {}
    for page in NCU_PAGES:
        out = os.path.join(out_dir, f"{os.path.basename(report).removesuffix('.ncu-rep')}_{page}.csv")
        with open(out, "wb") as fh:
            rc, err = run_bounded(
                [ncu, "--import", report, "--csv", "--page", page, "--print-units", "base"],
                timeout_s=timeout_s,
                stdout=fh,
            )
        if rc != 0:
            why = err.strip()[-300:] or f"exit {rc}"
            raise TraceFormatError(f"{report}: `ncu --import ... --page {page}` failed: {why}")
        pages[page] = out
    return pages


def ncu_rep_capture(report: str, *, target: str = "ncu import") -> RawCapture:
    """An Nsight Compute report (``.ncu-rep``) read through ``ncu --import`` (needs ncu; says how to install it)."""

    check_input_path(report)
    ncu = require_tool(
        "ncu", f"reading {report} (a .ncu-rep is read through `ncu --import {report} --csv --page details`)"
    )
    with tempfile.TemporaryDirectory(prefix="max-profile-ncu-") as tmp:
        pages = export_ncu_pages(ncu, report, tmp)
        raw = ncu_capture(pages["details"], pages["raw"], target=target)
    raw.artifacts = [os.path.abspath(report)]
    return raw
