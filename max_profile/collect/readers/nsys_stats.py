"""``nsys stats --format csv`` outputs and ``max generate --profile``'s kernel table as a :class:`RawCapture`.

* ``cuda_gpu_trace``: one row per GPU operation (``Start (ns),Duration (ns),CorrId,GrdX,...,Strm,Name``);
  memcpy / memset rows (empty grid) are not kernels.
* ``cuda_gpu_kern_sum``: totals per kernel name (``Total Time (ns),Instances,...,Name``): no timeline.
* ``max generate --profile`` stdout: its ``=== Top N GPU kernels ===`` table (totals), or only a
  cProfile table when nsys was missing (no kernels: said so).
"""

from __future__ import annotations

import os
import re
import time

import numpy as np

from max_profile.collect.readers.tables import column, csv_rows, ns, number, optional_column, read_text
from max_profile.model import Capture, Environment, GpuInfo, KernelTable, KernelTotal, RawCapture, Unavailable
from max_profile.model.tags import KernelOrigin

_DEVICE_ORDINAL = re.compile(r"\((\d+)\)\s*$")


def _raw(source: str, path: str, vendor: str = "nvidia") -> RawCapture:
    reason = f"imported from {path}; environment of the capture unknown"
    env = Environment(vendor=vendor, vendor_reason=reason)  # type: ignore[arg-type]
    return RawCapture(
        environment=env,
        capture=Capture(started_unix_s=time.time(), target=f"import:{source}", collectors=[source]),
        kernel_clock="trace",
        artifacts=[os.path.abspath(path)],
    )


def gpu_trace_capture(path: str) -> RawCapture:
    header, rows = csv_rows(path)
    scale = 1.0 if "Start (ns)" in header else 1e3
    i_start = column(header, path, "Start (ns)", "Start (us)")
    i_dur = column(header, path, "Duration (ns)", "Duration (us)")
    i_name = column(header, path, "Name")
    i_grid = [optional_column(header, c) for c in ("GrdX", "GrdY", "GrdZ")]
    i_block = [optional_column(header, c) for c in ("BlkX", "BlkY", "BlkZ")]
    i_dev = optional_column(header, "Device")
    i_strm = optional_column(header, "Strm")
    i_corr = optional_column(header, "CorrId")
    i_regs = optional_column(header, "Reg/Trd")
    names: dict[str, int] = {}
    idx, start, end, dev, stream, corr, grid, block, regs = ([] for _ in range(9))  # type: ignore[var-annotated]
    skipped = 0
    width = max(i_start, i_dur, i_name)
    gpu_names: dict[int, str | None] = {}  # "NVIDIA H100 80GB HBM3 (0)" in the Device column

    def cell(r: list[str], i: int | None) -> str:
        return r[i] if i is not None and i < len(r) else ""

    for r in rows:
        if len(r) <= width:
            skipped += 1
            continue
        if i_grid[0] is not None and not cell(r, i_grid[0]).strip():
            continue  # memcpy / memset rows
        s, d = ns(r[i_start], scale), ns(r[i_dur], scale)
        if s is None or d is None or d < 0:
            skipped += 1
            continue
        idx.append(names.setdefault(r[i_name], len(names)))
        start.append(s)
        end.append(s + d)
        device_cell = cell(r, i_dev)
        m = _DEVICE_ORDINAL.search(device_cell)
        dev.append(int(m.group(1)) if m and len(m.group(1)) < 9 else 0)
        if m and len(gpu_names) < 64 and dev[-1] not in gpu_names:
            gpu_names[dev[-1]] = device_cell[: m.start()].strip()[:200] or None
        stream.append(ns(cell(r, i_strm)) or 0)
        corr.append(ns(cell(r, i_corr)) or 0)
        grid.append(tuple(min(max(ns(cell(r, i)) or 0, 0), 2**31 - 1) for i in i_grid))
        block.append(tuple(min(max(ns(cell(r, i)) or 0, 0), 2**31 - 1) for i in i_block))
        regs.append(min(max(ns(cell(r, i_regs)) or 0, 0), 2**31 - 1))
    raw = _raw("nsys-stats-csv", path)
    if gpu_names:
        raw.environment = Environment(
            vendor="nvidia",
            vendor_reason=f"imported from {path}; GPUs from its Device column",
            gpus=[GpuInfo(key=f"nv{i}", name=name) for i, name in sorted(gpu_names.items())],
        )
    raw.kernels = KernelTable(
        names=list(names),
        name_idx=np.array(idx, dtype=np.int32),
        start_ns=np.array(start, dtype=np.int64),
        end_ns=np.array(end, dtype=np.int64),
        device=np.array(dev, dtype=np.int32),
        stream=np.array(stream, dtype=np.int64),
        correlation_id=np.array(corr, dtype=np.int64),
        grid=np.array(grid, dtype=np.int32).reshape(-1, 3),
        block=np.array(block, dtype=np.int32).reshape(-1, 3),
        registers=np.array(regs, dtype=np.int32),
    )
    raw.kernel_source = KernelOrigin.NSYS_STATS.value + " cuda_gpu_trace"
    if skipped:
        raw.notes.append(f"{skipped} row(s) of {path} had no usable start / duration and were skipped")
    if not len(raw.kernels):
        raw.kernels_unavailable = Unavailable(f"{path}: no kernel rows (only memcpy / memset?)")
    return raw


def kern_sum_capture(path: str) -> RawCapture:
    header, rows = csv_rows(path)
    scale = 1.0 if any("(ns)" in h for h in header) else 1e3
    i_total = column(header, path, "Total Time (ns)", "Total Time (us)", "Total Time", "Sum (ns)")
    i_inst = column(header, path, "Instances")
    i_name = column(header, path, "Name", "Kernel Name")
    totals = []
    skipped = 0
    for r in rows:
        if len(r) <= max(i_total, i_inst, i_name):
            skipped += 1
            continue
        total, count = ns(r[i_total], scale), number(r[i_inst])
        if total is None or count is None or total < 0 or not 1 <= count < 2**40:
            skipped += 1
            continue
        totals.append(KernelTotal(name=r[i_name], count=int(count), total_ns=total))
    raw = _raw("nsys-kern-sum-csv", path)
    raw.kernel_totals = totals
    raw.kernel_source = KernelOrigin.NSYS_STATS.value + " cuda_gpu_kern_sum (totals only: no phases, no timeline)"
    if skipped:
        raw.notes.append(f"{skipped} row(s) of {path} had no usable totals and were skipped")
    if not totals:
        raw.kernels_unavailable = Unavailable(f"{path}: no kernel rows")
    return raw


_TOP_ROW = re.compile(r"^\s*([\d.]+)%\s+([\d.]+)\s*(s|ms|us|ns)\s+(\d+)\s+(\S.*?)\s*$")
_UNIT = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}


def max_generate_capture(path: str) -> RawCapture:
    """``max generate --profile`` stdout: the ``Top N GPU kernels`` table as totals, or a reason when there is none."""
    text = read_text(path)
    raw = _raw("max-generate-profile", path, vendor="none")
    totals = []
    in_table = False
    for line in text.splitlines():
        if line.startswith("=== Top") and "GPU kernels" in line:
            in_table = True
            continue
        if in_table:
            m = _TOP_ROW.match(line)
            if m and len(m.group(4)) < 13 and float(m.group(2)) < 1e12:
                totals.append(
                    KernelTotal(
                        name=m.group(5), count=int(m.group(4)), total_ns=int(float(m.group(2)) * _UNIT[m.group(3)])
                    )
                )
            elif line.strip() and not line.lstrip().startswith("%"):
                in_table = False
    if totals:
        raw.kernel_totals = totals
        raw.kernel_source = (
            KernelOrigin.MAX_GENERATE.value + " --profile top-kernels table (totals only; the table lists the top N)"
        )
        raw.environment = Environment(vendor="nvidia", vendor_reason=raw.environment.vendor_reason)
    else:
        raw.kernels_unavailable = Unavailable(
            f"{path}: `max generate --profile` output without nsys holds only a cProfile table (host functions), no "
            "kernels; install Nsight Systems and re-run it, or use `max-profile kernels --model-path P`"
        )
    return raw
