"""Kineto / Chrome-trace JSON (PyTorch profiler, HTA, MAX's libkineto build) as a :class:`RawCapture`.

Events used (``ph: "X"``, ``ts`` / ``dur`` in microseconds):

* ``cat: kernel`` — GPU kernels; ``args.device``, ``args.stream``, ``args.correlation``,
  ``args.grid`` / ``args.block`` (``[x, y, z]``), ``args["registers per thread"]``;
* ``cat: cuda_runtime`` / ``cuda_driver`` — launch calls, joined to kernels on ``args.correlation``
  (launch time and thread: kernels are attributed by launch);
* ``cat: user_annotation`` / ``gpu_user_annotation`` — ranges: ours (``max_profile:decode``) and
  MAX's scheduler ranges (``_schedule(...)``) become phases;
* every ``X`` event bounds the capture window (GPU busy is measured over it);
* ``deviceProperties`` (PyTorch / Kineto: ``id``, ``name``, ``totalGlobalMem``; ``gcnArchName`` on
  ROCm) names the GPUs and the vendor, else the launch categories (``cuda_*`` / ``hip_*``) do.

Equivalent tool: HTA's ``TraceAnalysis(trace_dir=...).get_gpu_kernel_breakdown()``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from max_profile.collect.readers.tables import check_json_depth, ns, number, read_text
from max_profile.errors import TraceFormatError
from max_profile.model import Capture, Environment, GpuInfo, KernelTable, PhaseRange, RawCapture, Vendor
from max_profile.model.tags import Collector, KernelOrigin

US = 1e3
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_api")
_RANGE_CATS = ("user_annotation", "gpu_user_annotation")


def _dims(value: Any) -> tuple[int, int, int] | None:
    if isinstance(value, list) and len(value) == 3:
        dims = [number(v) for v in value]
        if all(d is not None and 0 <= d < 2**31 for d in dims):
            return (int(dims[0]), int(dims[1]), int(dims[2]))  # type: ignore[arg-type]
    return None


def _int(value: Any, default: int) -> int:
    v = number(value)
    return int(v) if v is not None and -(2**62) < v < 2**62 else default


def _small(value: Any, default: int) -> int:
    """A device ordinal or register count: 0 <= v < 2**31, else ``default``."""
    v = _int(value, default)
    return v if 0 <= v < 2**31 else default


_AMD_NAMES = ("amd", "instinct", "radeon")
_NVIDIA_NAMES = ("nvidia", "tesla", "geforce", "quadro", "rtx", "a100", "h100", "h200", "b200", "l40", "a10")


def _environment(doc: Any, path: str, launch_cats: set[str]) -> Environment:
    """Vendor and GPUs of an imported trace: ``deviceProperties`` first, else the launch API categories."""
    props = doc.get("deviceProperties") if isinstance(doc, dict) else None
    vendor: Vendor = "none"
    described: list[tuple[int, str | None, int | None]] = []
    for i, p in enumerate(props[:64] if isinstance(props, list) else []):
        if not isinstance(p, dict):
            continue
        name = p.get("name")
        name = name.strip()[:200] if isinstance(name, str) and name.strip() else None
        lowered = (name or "").lower()
        if "gcnArchName" in p or any(w in lowered for w in _AMD_NAMES):
            vendor = "amd"
        elif vendor == "none" and ("computeMajor" in p or any(w in lowered for w in _NVIDIA_NAMES)):
            vendor = "nvidia"
        memory = _int(p.get("totalGlobalMem"), -1)
        described.append((_small(p.get("id", i), i), name, memory if memory > 0 else None))
    reason = f"imported from {path}; GPUs from the trace's deviceProperties"
    if vendor == "none":
        vendor = (
            "amd"
            if launch_cats & {"hip_runtime", "hip_api"}
            else "nvidia"
            if launch_cats & {"cuda_runtime", "cuda_driver"}
            else "none"
        )
        reason = f"imported from {path}; " + (
            "vendor from the launch API events" if vendor != "none" else "environment of the capture unknown"
        )
    prefix = "amd" if vendor == "amd" else "nv"
    gpus = (
        [GpuInfo(key=f"{prefix}{dev}", name=name, memory_total_bytes=memory) for dev, name, memory in described]
        if vendor != "none"
        else []
    )
    return Environment(vendor=vendor, vendor_reason=reason, gpus=gpus)


def kineto_capture(path: str) -> RawCapture:
    text = read_text(path)
    check_json_depth(text, path)
    unterminated = False
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        doc = _unterminated_array(text)
        if doc is None:
            raise TraceFormatError(f"{path}: truncated or invalid JSON ({exc.msg} at line {exc.lineno})") from exc
        unterminated = True
    except RecursionError as exc:
        raise TraceFormatError(f"{path}: JSON nested too deep") from exc
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceFormatError(f"{path}: JSON without a traceEvents list (not a Kineto / Chrome trace)")
    names: dict[str, int] = {}
    idx: list[int] = []
    start: list[int] = []
    end: list[int] = []
    dev: list[int] = []
    stream: list[int] = []
    corr: list[int] = []
    grid: list[tuple[int, int, int]] = []
    block: list[tuple[int, int, int]] = []
    regs: list[int] = []
    launches: dict[int, tuple[int, int]] = {}
    launch_cats: set[str] = set()
    ranges: list[PhaseRange] = []
    lo, hi = None, None
    skipped = 0
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = ns(e.get("ts"), US), ns(e.get("dur", 0), US)
        if ts is None or dur is None or dur < 0:
            skipped += 1
            continue
        lo = ts if lo is None else min(lo, ts)
        hi = ts + dur if hi is None else max(hi, ts + dur)
        cat = str(e.get("cat", "")).lower()
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        assert isinstance(args, dict)
        name = e.get("name")
        name = name if isinstance(name, str) else str(name) if name is not None else "?"
        if cat == "kernel":
            idx.append(names.setdefault(name, len(names)))
            start.append(ts)
            end.append(ts + dur)
            dev.append(_small(args.get("device", e.get("pid", 0)), 0))
            stream.append(_int(args.get("stream", e.get("tid", 0)), 0))
            corr.append(_int(args.get("correlation", 0), 0))
            grid.append(_dims(args.get("grid")) or (0, 0, 0))
            block.append(_dims(args.get("block")) or (0, 0, 0))
            regs.append(_small(args.get("registers per thread", 0), 0))
        elif cat in _LAUNCH_CATS:
            launch_cats.add(cat)
            c = _int(args.get("correlation", -1), -1)
            if c >= 0:
                launches[c] = (ts, _int(e.get("tid", -1), -1))
        elif cat in _RANGE_CATS:
            ranges.append(
                PhaseRange(
                    name=name,
                    start_ns=ts,
                    end_ns=ts + dur,
                    tid=_int(e.get("tid", -1), -1),
                    domain="max_profile" if name.startswith("max_profile") else None,
                )
            )
    if not idx:
        raise TraceFormatError(f"{path}: the trace has no GPU kernel events (cat: kernel)")
    corr_arr = np.array(corr, dtype=np.int64)
    launch = np.array([launches.get(c, (-1, -1))[0] if c > 0 else -1 for c in corr], dtype=np.int64)
    tid = np.array([launches.get(c, (-1, -1))[1] if c > 0 else -1 for c in corr], dtype=np.int64)
    table = KernelTable(
        names=list(names),
        name_idx=np.array(idx, dtype=np.int32),
        start_ns=np.array(start, dtype=np.int64),
        end_ns=np.array(end, dtype=np.int64),
        device=np.array(dev, dtype=np.int32),
        stream=np.array(stream, dtype=np.int64),
        correlation_id=corr_arr,
        launch_ns=launch if (launch >= 0).any() else None,
        launch_tid=tid if (launch >= 0).any() else None,
        grid=np.array(grid, dtype=np.int32),
        block=np.array(block, dtype=np.int32),
        registers=np.array(regs, dtype=np.int32),
    )
    keep = [
        r
        for r in ranges
        if r.domain == "max_profile"
        or "_schedule(" in r.name
        or r.name.rsplit(":", 1)[-1] in ("prefill", "decode", "mixed")
    ]
    counts: dict[str, int] = {}
    for r in ranges:
        counts[r.name] = counts.get(r.name, 0) + 1
    env = _environment(doc, path, launch_cats)
    raw = RawCapture(
        environment=env,
        capture=Capture(started_unix_s=time.time(), target="import:kineto-json", collectors=[Collector.KINETO_JSON]),
        kernels=table,
        kernel_clock="trace",
        ranges=keep,
        range_names=dict(sorted(counts.items(), key=lambda kv: -kv[1])[:200]),
        kernel_source=KernelOrigin.KINETO.describe("json"),
        artifacts=[os.path.abspath(path)],
    )
    if lo is not None and hi is not None:
        raw.trace_window_ns = (lo, hi)
    if skipped:
        raw.notes.append(f"{skipped} trace event(s) without a usable ts / dur were skipped")
    if unterminated:
        raw.notes.append(
            f"{path}: a JSON array without its closing ']' (the Chrome trace format allows it: the writer stopped); "
            "read as written"
        )
    return raw


def _unterminated_array(text: str) -> Any:
    """The Chrome trace format's JSON Array form may lack its closing ``]`` (a tracer that was killed);
    such a file, ending after a complete event, is read. Anything else stays invalid (None)."""
    body = text.strip()
    if not body.startswith("[") or body.endswith("]"):
        return None
    try:
        doc = json.loads(body.rstrip(",") + "]")
    except (json.JSONDecodeError, RecursionError):
        return None
    return doc if isinstance(doc, list) else None
