"""Nsight Compute: one targeted run per kernel, parsed into :class:`KernelAnalysis` with a verdict.

``max-profile kernel NAME --model-path P`` runs
``ncu --target-processes all --clock-control none -k regex:NAME --launch-skip K -c N --set full -o R <generation>``
then reads ``ncu --import R.ncu-rep --csv --page details|raw --print-units base``.

CSV traps handled (formats measured with ncu 2025.3.1 on an H200): noise before the header
(``==PROF==`` lines and the application's own output), thousands separators (``"3,191,212.5"``),
ragged rows (rules rows are longer than metric rows), units that depend on how the CSV was
made (``ns`` vs ``us``, ``byte`` vs ``Mbyte``), the raw page's units row.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from max_profile.model import Finding, KernelAnalysis, StallReason
from max_profile.procs import kill_group

NO_KERNELS = "No kernels were profiled"
PERMISSION_ERRORS = ("ERR_NVGPUCTRPERM", "does not have permission to access NVIDIA GPU Performance Counters")
PERMISSION_FIX = (
    "GPU performance counters are restricted to admin users: run ncu as root (sudo), or allow all users with "
    "`echo 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' | sudo tee /etc/modprobe.d/ncu-permissions.conf` "
    "and a reboot (https://developer.nvidia.com/ERR_NVGPUCTRPERM)"
)
MAX_LAUNCHES = 20

STALL_MEANINGS: dict[str, str] = {
    "long_scoreboard": "waiting on global/local memory (L1TEX) results: memory latency",
    "short_scoreboard": "waiting on shared memory or special-function results",
    "math_pipe_throttle": "math pipe busy: compute-bound on that pipe",
    "mio_throttle": "memory I/O queue full (shared memory / special instructions)",
    "lg_throttle": "local/global memory queue full: too many outstanding memory ops",
    "barrier": "waiting at __syncthreads / barriers",
    "membar": "waiting on a memory barrier",
    "not_selected": "eligible but another warp was picked (enough parallelism)",
    "selected": "issuing (not a stall)",
    "wait": "fixed-latency dependency",
    "no_instruction": "instruction cache miss / no instruction fetched",
    "branch_resolving": "waiting on branch target computation",
    "dispatch_stall": "dispatch stall (pipeline conflict)",
    "drain": "waiting for memory stores to drain at exit",
    "imc_miss": "immediate constant cache miss",
    "tex_throttle": "texture queue full",
    "sleeping": "warp sleeping (nanosleep / yield)",
    "gmma": "waiting on warpgroup MMA (wgmma) completion",
    "misc": "miscellaneous",
}

_UNIT_SCALE = {
    "ns": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9, "nsecond": 1.0,
    "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
    "byte/s": 1.0, "kbyte/s": 1e3, "mbyte/s": 1e6, "gbyte/s": 1e9, "tbyte/s": 1e12,
    "hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9,
    "byte/block": 1.0, "kbyte/block": 1e3, "mbyte/block": 1e6,
}


class NcuError(RuntimeError):
    """An ncu run or file that cannot be used; the message says why and what to do."""


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
    scale = _UNIT_SCALE.get((unit or "").strip().lower(), 1.0)
    return number * scale


def _csv_from_text(text: str, path: str) -> list[list[str]]:
    """The CSV part of ncu output: from the header row (first cell ``ID``) on; noise before it dropped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID",') or ln.startswith("ID,")), None)
    if start is None:
        if NO_KERNELS in text:
            raise NcuError(f"{path}: ncu profiled no kernel ('{NO_KERNELS}'): the -k regex matched nothing")
        if any(e in text for e in PERMISSION_ERRORS):
            raise NcuError(f"{path}: {PERMISSION_FIX}")
        raise NcuError(f"{path}: not ncu CSV output (no header row starting with \"ID\"; make it with `ncu --csv --page details --print-units base`)")
    rows = list(csv.reader(io.StringIO("\n".join(ln for ln in lines[start:] if not ln.startswith("==")))))
    return rows


def parse_ncu_csv(text: str, path: str = "<ncu output>") -> dict[str, dict[str, Any]]:
    """Per profiled launch ID: ``name``, ``grid``, ``block``, ``device``, ``metrics`` {label or metric name: base value}, ``rules``."""
    rows = _csv_from_text(text, path)
    header = rows[0]
    if "Metric Name" in header:
        return _parse_details(header, rows[1:], path)
    return _parse_raw(header, rows[1:], path)


def _parse_details(header: list[str], rows: list[list[str]], path: str) -> dict[str, dict[str, Any]]:
    need = {"ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"}
    if not need <= set(header):
        raise NcuError(f"{path}: ncu details CSV lacks columns {sorted(need - set(header))}")
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if not r or not r[0].strip():
            continue
        d = dict(zip(header, r, strict=False))  # ragged rows: metric rows are shorter than rule rows
        k = out.setdefault(d["ID"], {"name": d["Kernel Name"], "grid": d.get("Grid Size"), "block": d.get("Block Size"),
                                     "device": d.get("Device"), "metrics": {}, "sections": {}, "rules": []})
        label = d.get("Metric Name") or ""
        if label:
            value = to_number(d.get("Metric Value"), d.get("Metric Unit"))
            if value is not None:
                section = d.get("Section Name") or ""
                k["metrics"].setdefault(label, value)
                k["sections"][f"{section}/{label}"] = value
        elif d.get("Rule Name"):
            desc = (d.get("Rule Description") or "").strip()
            if desc:
                k["rules"].append(f"[{d.get('Rule Type', '')}] {d['Rule Name']}: {desc}")
    if not out:
        raise NcuError(f"{path}: ncu CSV has a header but no profiled kernel rows (truncated?)")
    return out


def _parse_raw(header: list[str], rows: list[list[str]], path: str) -> dict[str, dict[str, Any]]:
    if "Kernel Name" not in header:
        raise NcuError(f"{path}: ncu raw CSV lacks the 'Kernel Name' column")
    units = rows[0] if rows and not rows[0][0].strip() else [""] * len(header)
    body = rows[1:] if rows and not rows[0][0].strip() else rows
    out: dict[str, dict[str, Any]] = {}
    for r in body:
        if not r or not r[0].strip():
            continue
        d = dict(zip(header, r, strict=False))
        metrics = {}
        for i, name in enumerate(header):
            if i < len(r) and "__" in name:
                v = to_number(r[i], units[i] if i < len(units) else None)
                if v is not None:
                    metrics[name] = v
        out[d["ID"]] = {"name": d["Kernel Name"], "grid": d.get("Grid Size"), "block": d.get("Block Size"), "device": d.get("Device"),
                        "metrics": metrics, "sections": {}, "rules": []}
    if not out:
        raise NcuError(f"{path}: ncu raw CSV has no kernel rows")
    return out


def _first(m: dict[str, float], *keys: str) -> float | None:
    for k in keys:
        if k in m:
            return m[k]
    return None


def analyze_launch(launch_id: str, details: dict[str, Any] | None, raw: dict[str, Any] | None = None) -> KernelAnalysis:
    """One profiled launch -> :class:`KernelAnalysis` (details-page labels, raw-page metric names, or both)."""
    src = details or raw or {}
    m: dict[str, float] = dict((raw or {}).get("metrics", {}))
    m.update((details or {}).get("metrics", {}))
    sections: dict[str, float] = (details or {}).get("sections", {})
    compute = _first(m, "Compute (SM) Throughput", "sm__throughput.avg.pct_of_peak_sustained_elapsed")
    memory = sections.get("GPU Speed Of Light Throughput/Memory Throughput", _first(m, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"))
    dram_pct = _first(m, "DRAM Throughput", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed")
    dram_bps = sections.get("Memory Workload Analysis/Memory Throughput", _first(m, "dram__bytes.sum.per_second"))
    limits = {
        "registers": _first(m, "Block Limit Registers", "launch__occupancy_limit_registers"),
        "shared memory": _first(m, "Block Limit Shared Mem", "launch__occupancy_limit_shared_mem"),
        "warps": _first(m, "Block Limit Warps", "launch__occupancy_limit_warps"),
        "blocks per SM": _first(m, "Block Limit SM", "launch__occupancy_limit_blocks"),
        "barriers": _first(m, "Block Limit Barriers", "launch__occupancy_limit_barriers"),
    }
    known = {k: v for k, v in limits.items() if v is not None}
    limiter = min(known, key=lambda k: known[k]) if known else None
    stalls = []
    for name, value in m.items():
        mm = re.fullmatch(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio", name)
        if mm and mm.group(1) != "selected" and value > 0:
            stalls.append(StallReason(reason=mm.group(1), cycles_per_instruction=value, meaning=STALL_MEANINGS.get(mm.group(1), "")))
    stalls.sort(key=lambda s: -s.cycles_per_instruction)
    flops = _achieved_flops(m)
    intensity = flops / dram_bps if flops is not None and dram_bps else None
    achieved = _first(m, "Achieved Occupancy", "sm__warps_active.avg.pct_of_peak_sustained_active")
    theoretical = _first(m, "Theoretical Occupancy", "sm__maximum_warps_per_active_cycle_pct")
    return KernelAnalysis(
        kernel_name=src.get("name", "?"),
        launch_id=int(launch_id) if str(launch_id).isdigit() else 0,
        duration_ns=_first(m, "Duration", "gpu__time_duration.sum"),
        compute_throughput_pct=compute,
        memory_throughput_pct=memory,
        dram_throughput_pct=dram_pct,
        dram_bytes_per_s=dram_bps,
        achieved_occupancy_pct=achieved,
        theoretical_occupancy_pct=theoretical,
        occupancy_limiter=limiter,
        registers_per_thread=_first(m, "Registers Per Thread", "launch__registers_per_thread"),
        block_size=src.get("block"),
        grid_size=src.get("grid"),
        stalls=stalls[:6],
        achieved_flop_per_s=flops,
        arithmetic_intensity=intensity,
        bound=_bound(compute, memory),
        ncu_rules=list((details or {}).get("rules", []))[:12],
        metrics={k: v for k, v in m.items() if " " in k or k.startswith(("gpu__", "dram__", "sm__"))},
        device=src.get("device"),
    )


def _achieved_flops(m: dict[str, float]) -> float | None:
    rate = m.get("smsp__cycles_elapsed.avg.per_second")
    if rate is None:
        return None
    per_cycle = 0.0
    found = False
    for prefix, mult in (("f", 1.0), ("d", 1.0), ("h", 2.0)):
        add = m.get(f"smsp__sass_thread_inst_executed_op_{prefix}add_pred_on.sum.per_cycle_elapsed")
        mul = m.get(f"smsp__sass_thread_inst_executed_op_{prefix}mul_pred_on.sum.per_cycle_elapsed")
        fma = m.get(f"smsp__sass_thread_inst_executed_op_{prefix}fma_pred_on.sum.per_cycle_elapsed")
        if add is not None or mul is not None or fma is not None:
            found = True
            per_cycle += mult * ((add or 0.0) + (mul or 0.0) + 2.0 * (fma or 0.0))
    flops = per_cycle * rate
    # Tensor-core work: the aggregate path metrics (sm__ops_path_tensor_src_<in>_dst_<out>) only;
    # the per-instruction ones (sm__ops_path_tensor_op_hgmma_...) count the same work again.
    for name, v in m.items():
        if re.fullmatch(r"sm__ops_path_tensor_src_[a-z0-9_]+\.sum\.per_second", name):
            found = True
            flops += v
    return flops if found else None


def _bound(compute: float | None, memory: float | None) -> str | None:
    if compute is None and memory is None:
        return None
    c, mem = compute or 0.0, memory or 0.0
    if max(c, mem) < 40.0:
        return "latency"
    if abs(c - mem) < 10.0 and min(c, mem) >= 60.0:
        return "balanced"
    return "memory" if mem >= c else "compute"


def kernel_findings(a: KernelAnalysis) -> list[Finding]:
    """Verdicts for one analyzed kernel (pure)."""
    out: list[Finding] = []
    ev: dict[str, float | int | str | None] = {
        "kernel": a.kernel_name[:80], "compute_pct": a.compute_throughput_pct, "memory_pct": a.memory_throughput_pct, "dram_pct": a.dram_throughput_pct,
        "achieved_occupancy_pct": a.achieved_occupancy_pct, "theoretical_occupancy_pct": a.theoretical_occupancy_pct,
    }
    top = a.stalls[0] if a.stalls else None
    if top:
        ev["top_stall"] = f"{top.reason} ({top.cycles_per_instruction:.2f} cycles/instr)"
    if a.bound == "memory" and (a.dram_throughput_pct or 0) >= 70:
        out.append(Finding(id="kernel-memory-bound-near-peak", severity="info", confidence=0.8, evidence=ev,
                           title=f"Memory-bound at {a.dram_throughput_pct:.0f}% of peak DRAM bandwidth: near its roofline (healthy for a decode GEMV)"))
    elif a.bound == "memory":
        out.append(Finding(id="kernel-memory-bound", severity="warning", confidence=0.7, evidence=ev,
                           title="Memory-bound but well below peak DRAM bandwidth",
                           next_step="Look at the memory access pattern rules below (coalescing, L2 hit rate) and at occupancy."))
    elif a.bound == "compute" and (a.compute_throughput_pct or 0) < 60:
        out.append(Finding(id="kernel-compute-far-from-peak", severity="warning", confidence=0.6, evidence=ev,
                           title="Compute-bound but far from peak compute throughput",
                           next_step="Check tensor-core use (sm__inst_executed_pipe_tensor_op_*) and tile shapes."))
    elif a.bound == "latency":
        title = "Latency-bound: neither compute nor memory is busy"
        if top and top.reason == "long_scoreboard":
            title += " — warps mostly wait on memory (long scoreboard)"
        out.append(Finding(id="kernel-latency-bound", severity="warning", confidence=0.7, evidence=ev, title=title,
                           next_step="More parallelism per SM (larger grid / more warps) or fewer dependent memory loads."))
    if a.achieved_occupancy_pct is not None and a.theoretical_occupancy_pct is not None and a.achieved_occupancy_pct < 0.5 * a.theoretical_occupancy_pct:
        out.append(Finding(id="kernel-low-occupancy", severity="info", confidence=0.6, evidence={**ev, "limiter": a.occupancy_limiter},
                           title=f"Achieved occupancy {a.achieved_occupancy_pct:.0f}% is under half the theoretical {a.theoretical_occupancy_pct:.0f}% (limiter: {a.occupancy_limiter})"))
    elif a.theoretical_occupancy_pct is not None and a.theoretical_occupancy_pct < 50 and a.occupancy_limiter:
        out.append(Finding(id="kernel-occupancy-limited", severity="info", confidence=0.6, evidence={**ev, "limiter": a.occupancy_limiter},
                           title=f"Theoretical occupancy {a.theoretical_occupancy_pct:.0f}% is limited by {a.occupancy_limiter}"))
    return out


def read_ncu_files(details_path: str | None, raw_path: str | None = None) -> list[KernelAnalysis]:
    details = parse_ncu_csv(_read(details_path), details_path) if details_path else {}
    raw = parse_ncu_csv(_read(raw_path), raw_path) if raw_path else {}
    ids = sorted(set(details) | set(raw), key=lambda x: int(x) if x.isdigit() else 0)
    return [analyze_launch(i, details.get(i), raw.get(i)) for i in ids]


def _read(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise NcuError(f"{path}: file not found")
    data = p.read_bytes()
    if not data:
        raise NcuError(f"{path}: file is empty")
    if data[:2] == b"\x1f\x8b":
        import gzip

        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# Running ncu
# ---------------------------------------------------------------------------------------------


def name_filter(name: str) -> str:
    """``-k`` value for a kernel name or regex: a breakdown name keeps its distinctive base, never its hash."""
    from max_profile.analyze.families import distinctive_regex

    if name.startswith("regex:"):
        name = name[6:]
    if not name or name.strip() in (".*", ".", "*", ".+"):
        raise NcuError("refusing to profile every kernel: give a kernel name or a regex that selects one kernel (ncu replays each launch many times)")
    if re.fullmatch(r"[\w.]+", name):
        return "regex:" + distinctive_regex(name)
    return "regex:" + name


def ncu_command(ncu: str, name: str, launches: int, launch_skip: int, section_set: str, report: str, target: list[str]) -> list[str]:
    if not 1 <= launches <= MAX_LAUNCHES:
        raise NcuError(f"--launches must be between 1 and {MAX_LAUNCHES} (each launch is replayed dozens of times)")
    return [ncu, "--target-processes", "all", "--clock-control", "none", "-k", name_filter(name), "--launch-skip", str(launch_skip),
            "-c", str(launches), "--set", section_set, "-o", report, "-f", *target]


def run_ncu(cmd: list[str], log_path: Path, timeout_s: float, progress: Any) -> str:
    from max_profile.collect.gpu_sampling import clean_child_env

    progress("running: " + " ".join(cmd))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=clean_child_env(), start_new_session=True)
        t0 = time.monotonic()
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout_s:
                    kill_group(proc, grace_s=10)
                    raise NcuError(f"ncu did not finish within {timeout_s:.0f} s; stopped it (its process group only). Profile fewer launches (-c) or a narrower regex")
                time.sleep(1)
        except KeyboardInterrupt:
            kill_group(proc, grace_s=10)
            raise
    return log_path.read_text(errors="replace")


def cmd_kernel(args: argparse.Namespace, progress: Any) -> int:
    from max_profile.cli import EXIT_TOOL_MISSING, CliError, _print, _write_json
    from max_profile.collect.environment import detect_environment, tool_status
    from max_profile.model import Capture, Report

    try:
        if args.import_file:
            analyses = read_ncu_files(args.import_file, args.import_raw)
        else:
            if not args.model_path:
                raise CliError("kernel needs --model-path P (run a short generation under ncu) or --import CSV")
            name_filter(args.name)
            st = tool_status("ncu")
            if not st.path:
                raise CliError(f"ncu (Nsight Compute) is needed: {st.install_hint}", EXIT_TOOL_MISSING)
            work = Path(args.output_dir or tempfile.mkdtemp(prefix="max-profile-ncu-"))
            work.mkdir(parents=True, exist_ok=True)
            report_base = str(work / "kernel")
            target = [sys.executable, "-m", "max_profile", "-q", "run", "--model-path", args.model_path, "--devices", args.devices or "gpu",
                      "--max-new-tokens", str(args.max_new_tokens), "--warmup", "0", "--kernels", "off"]
            cmd = ncu_command(st.path, args.name, args.launches, args.launch_skip, args.set, report_base, target)
            out = run_ncu(cmd, work / "ncu.log", args.timeout, progress)
            if NO_KERNELS in out or not os.path.exists(report_base + ".ncu-rep"):
                raise CliError(_no_kernels_message(args.name, out, args.suggest_from))
            if any(e in out for e in PERMISSION_ERRORS):
                raise CliError(PERMISSION_FIX)
            pages = {}
            for page in ("details", "raw"):
                res = subprocess.run([st.path, "--import", report_base + ".ncu-rep", "--csv", "--page", page, "--print-units", "base"],
                                     capture_output=True, text=True, timeout=600, check=False)
                pages[page] = work / f"kernel_{page}.csv"
                pages[page].write_text(res.stdout)
            analyses = read_ncu_files(str(pages["details"]), str(pages["raw"]))
    except NcuError as exc:
        raise CliError(str(exc)) from exc
    env = detect_environment(check_tools=False)
    report = Report(environment=env, capture=Capture(started_unix_s=time.time(), target=f"ncu:{args.name}", model_path=args.model_path, collectors=["ncu"]))
    report.kernel_analyses = analyses
    report.findings = [f for a in analyses for f in kernel_findings(a)]
    if not args.import_file:
        report.artifacts = [f"{report_base}.ncu-rep  (open with: ncu-ui {report_base}.ncu-rep)", str(work / "kernel_details.csv"), str(work / "kernel_raw.csv")]
    _print(report)
    _write_json(report, args.json, progress)
    return 0


def _no_kernels_message(name: str, log: str, suggest_from: str | None) -> str:
    msg = f"ncu profiled no kernel: the filter {name_filter(name)!r} matched no launch"
    candidates: list[str] = []
    if suggest_from and os.path.exists(suggest_from):
        from max_profile.model import KernelBreakdown, Report

        rep = Report.load(suggest_from)
        if isinstance(rep.kernels, KernelBreakdown):
            candidates = [k.name for k in rep.kernels.top_kernels]
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.3) if candidates else []
    if close:
        msg += "; close names from the breakdown: " + ", ".join(close)
    else:
        msg += "; take a name from `max-profile kernels` (its top-kernels table), or widen the regex; --launch-skip may skip past all launches"
    return msg


def register_cli(sub: Any) -> None:
    p = sub.add_parser("kernel", help="why is this kernel slow: a targeted Nsight Compute run (or --import an ncu CSV)")
    p.add_argument("name", help="kernel name (hash suffix ignored) or regex (regex:...) — required: ncu never profiles every kernel here")
    p.add_argument("--model-path")
    p.add_argument("--devices", default="gpu")
    p.add_argument("--launches", "-c", type=int, default=3, help=f"launches to profile (1..{MAX_LAUNCHES})")
    p.add_argument("--launch-skip", type=int, default=16, help="matching launches to skip first (past prefill into decode)")
    p.add_argument("--set", default="full", choices=["basic", "full"], help="ncu section set")
    p.add_argument("--max-new-tokens", type=int, default=24, help="tokens of the generation run under ncu")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before the ncu run is stopped")
    p.add_argument("--output-dir", help="where the .ncu-rep and CSVs go (default: a temp folder)")
    p.add_argument("--suggest-from", metavar="REPORT_JSON", help="a kernels report whose names are suggested when the regex matches nothing")
    p.add_argument("--import", dest="import_file", metavar="CSV", help="an existing `ncu --csv --page details` output")
    p.add_argument("--import-raw", metavar="CSV", help="the matching `--page raw` output (stall reasons, roofline)")
    p.add_argument("--json", metavar="PATH")
    p.set_defaults(func=cmd_kernel)


__all__ = ["NcuError", "analyze_launch", "kernel_findings", "parse_ncu_csv", "read_ncu_files", "register_cli"]
