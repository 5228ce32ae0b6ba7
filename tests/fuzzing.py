"""Fuzzing every reader: mutators over real seed files, and one verdict per input.

Seeds are the project's real captures (the H200 nsys export, ncu pages, a CPU NVTX log, raw captures
and reports) cut down to a few hundred records, plus the documented-format fakes for AMD (named as
such in tests/collect/readers/test_imports.py). Mutators work on bytes (flips, cuts, inserts), on CSV cells and headers,
on JSON nodes, on SQLite rows and tables, and on NVTX log lines. Each input goes through the public path
(import -> ``build_report``, ``RawCapture.load``, ``Report.load`` + rendering, the server-log scanner) and
is classified:

* ``accepted`` — read, and the report holds no negative time, NaN or infinity;
* ``refused``  — a :class:`~max_profile.errors.MaxProfileError` (one clear message naming the file);
* ``untyped``  — any other exception: a bug;
* ``garbage``  — accepted with impossible numbers: a bug;
* ``hang``     — over the time limit: a bug.

``tests/collect/readers/test_fuzz.py`` runs a bounded sample with hypothesis driving the choices; ``benchmarks/fuzz.py``
runs thousands per reader with a plain seeded random.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
import shutil
import signal
import sqlite3
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"
HANG_S = 30.0
CATEGORIES = ("accepted", "refused", "untyped", "garbage", "hang")


class Hang(Exception):
    pass


@dataclass
class Outcome:
    category: str
    detail: str = ""


# --- seeds ----------------------------------------------------------------------------------
def _trimmed_nsys(out: Path) -> Path:
    """The real H200 nsys export with all but its first few hundred kernels / launches removed."""
    raw = out / "seed_nsys_full.sqlite"
    raw.write_bytes(gzip.decompress((DATA / "gpu" / "h200_llama180m_host_bound" / "small_nsys.sqlite.gz").read_bytes()))
    con = sqlite3.connect(raw)
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid > 300")
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE rowid > 1200")
    con.execute("DELETE FROM NVTX_EVENTS WHERE rowid > 60")
    con.commit()
    con.execute("VACUUM")
    con.close()
    seed = out / "seed_nsys.sqlite"
    raw.rename(seed)
    return seed


def _kineto(out: Path) -> Path:
    from max_profile.model import RawCapture

    raw = RawCapture.load(str(DATA / "gpu" / "h200_llama180m_host_bound" / "small_cupti_raw.json.gz"))
    t = raw.kernels
    events: list[dict[str, Any]] = []
    for i in range(200):
        corr = int(t.correlation_id[i]) if t.correlation_id is not None else i
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": t.name_of(i),
                "pid": 0,
                "tid": 7,
                "ts": t.start_ns[i] / 1e3,
                "dur": (t.end_ns[i] - t.start_ns[i]) / 1e3,
                "args": {"device": 0, "stream": 7, "correlation": corr, "grid": [1, 64, 1], "block": [128, 1, 1]},
            }
        )
        if t.launch_ns is not None:
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_driver",
                    "name": "cuLaunchKernelEx",
                    "pid": 1,
                    "tid": 2,
                    "ts": t.launch_ns[i] / 1e3,
                    "dur": 1.0,
                    "args": {"correlation": corr},
                }
            )
    events.append(
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "max_profile:decode",
            "pid": 1,
            "tid": 1,
            "ts": t.start_ns[0] / 1e3 - 5,
            "dur": 500.0,
        }
    )
    seed = out / "seed_kineto.json"
    seed.write_text(json.dumps({"traceEvents": events}))
    return seed


def _rocprof_json(out: Path) -> Path:
    """rocprofv3 JSON (its documented layout) holding 200 real kernels of the H200 capture and one roctx range."""
    from max_profile.model import RawCapture

    t = RawCapture.load(str(DATA / "gpu" / "h200_llama180m_host_bound" / "small_cupti_raw.json.gz")).kernels
    symbols = [{"kernel_id": i, "kernel_name": name} for i, name in enumerate(t.names)]
    dispatches = [
        {
            "kind": 11,
            "thread_id": 905,
            "correlation_id": {"internal": i + 1, "external": 0},
            "start_timestamp": int(t.start_ns[i]),
            "end_timestamp": int(t.end_ns[i]),
            "dispatch_info": {
                "agent_id": {"handle": 40},
                "queue_id": {"handle": 7},
                "kernel_id": int(t.name_idx[i]),
                "grid_size": {"x": 64, "y": 1, "z": 1},
                "workgroup_size": {"x": 128, "y": 1, "z": 1},
            },
        }
        for i in range(200)
    ]
    marker = {
        "kind": 1,
        "thread_id": 900,
        "correlation_id": {"internal": 9999, "external": 0},
        "start_timestamp": int(t.start_ns[0]) - 5000,
        "end_timestamp": int(t.start_ns[0]) + 500_000,
    }
    process = {
        "agents": [{"id": {"handle": 40}, "type": 2, "logical_node_type_id": 0, "product_name": "AMD Instinct MI300X"}],
        "kernel_symbols": symbols,
        "strings": {
            "buffer_records": [{"kind": "NONE"}, {"kind": "MARKER_CORE_RANGE_API"}],
            "marker_api": [{"key": 9999, "value": "max_profile:decode"}],
        },
        "buffer_records": {"kernel_dispatch": dispatches, "marker_api": [marker]},
    }
    seed = out / "seed_rocprof.json"
    seed.write_text(json.dumps({"rocprofiler-sdk-tool": [process]}))
    return seed


def _raw_capture(out: Path) -> tuple[Path, Path]:
    from max_profile.analyze.report import build_report
    from max_profile.model import KernelTable, RawCapture

    raw = RawCapture.load(str(DATA / "gpu" / "h200_llama180m_host_bound" / "small_cupti_raw.json.gz"))
    raw.kernels = raw.kernels.select(slice(0, 300))
    raw.kernels = KernelTable.from_records(raw.kernels.records())
    raw.steps = raw.steps[:7]
    raw.save(str(out / "seed_raw.json"))
    build_report(raw).save(str(out / "seed_report.json"))
    return out / "seed_raw.json", out / "seed_report.json"


ROCPROF = (
    '"Kind","Agent_Id","Queue_Id","Stream_Id","Thread_Id","Dispatch_Id","Kernel_Id","Kernel_Name","Correlation_Id",'
    '"Start_Timestamp","End_Timestamp",'
    '"LDS_Block_Size","Scratch_Size","VGPR_Count","Accum_VGPR_Count","SGPR_Count","Workgroup_Size_X",'
    '"Workgroup_Size_Y","Workgroup_Size_Z","Grid_Size_X","Grid_Size_Y","Grid_Size_Z"\n'
) + "".join(
    '"KERNEL_DISPATCH","Agent '
    f'{4 + i % 2}",1,0,905,{i},{10 + i % 3},'
    f'"{["gemv_split_k_bf16_gfx942", "mha_decode_gfx942_bf16", "matmul_bf16"][i % 3]}",{i},'
    f"{1000 + 300 * i},{1200 + 300 * i},0,0,8,0,16,64,1,1,64,1,1\n"
    for i in range(60)
)
ROCPROF_MARKERS = (
    '"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"\n'
    + "".join(
        f'"MARKER_CORE_RANGE_API","max_profile:{"prefill" if i == 0 else "decode"}",'
        f"900,900,{i},{900 + 3000 * i},{3850 + 3000 * i}\n"
        for i in range(6)
    )
)
SERVE_LOG = (
    "INFO: Started server process [4242]\nINFO:     Waiting for application startup.\nWARNING: telemetry disabled\n"
    'Traceback (most recent call last):\n  File "x.py", line 3, in <module>\nValueError: No architecture found for '
    "FooForCausalLM\n"
    "ERROR: Address already in use\nABORT: symbol not found: nvtxRangeStartEx\n"
)


def _rocpd(out: Path) -> Path:
    db = out / "seed_rocpd.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE rocpd_kernel_dispatch (id INTEGER)")
    con.execute("CREATE TABLE kernels (name TEXT, start INTEGER, end INTEGER, agent_abs_index INTEGER, tid INTEGER)")
    con.execute(
        "CREATE TABLE regions (category TEXT, name TEXT, start INTEGER, end INTEGER, tid INTEGER, extdata TEXT)"
    )
    con.executemany(
        "INSERT INTO kernels VALUES (?, ?, ?, ?, ?)",
        [(["gemv_split_k_bf16", "sm90_matmul_bf16"][i % 2], 1000 + 500 * i, 1400 + 500 * i, 4, 905) for i in range(80)],
    )
    con.executemany(
        "INSERT INTO regions VALUES ('MARKER_CORE_RANGE_API', 'roctxThreadRangeA', ?, ?, 900, ?)",
        [
            (
                900 + 5000 * i,
                5800 + 5000 * i,
                json.dumps({"message": "max_profile:" + ("prefill" if i == 0 else "decode")}),
            )
            for i in range(8)
        ],
    )
    con.commit()
    con.close()
    return db


def _gpu_trace_csv(out: Path) -> Path:
    rows = [
        "Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),DymSMem (MB),Bytes "
        "(MB),Throughput (MB/s),SrcMemKd,DstMemKd,Device,Ctx,GreenCtx,Strm,Name"
    ]
    rows += [
        f"{525000000 + 7000 * i},{2000 + i},{100 + i},4096,1,1,256,1,1,16,0.000,0.000,,,,,NVIDIA H200 "
        f'(0),1,,7,"gemv_split_k_{i % 4}(float *, int)"'
        for i in range(80)
    ]
    rows.insert(5, "525074279,2016,121,,,,,,,,,,4.194,2080504.807,Device,,NVIDIA H200 (0),1,,7,[CUDA memset]")
    seed = out / "seed_gpu_trace.csv"
    seed.write_text("Processing [x.sqlite] with [cuda_gpu_trace.py]... \n" + "\n".join(rows) + "\n")
    return seed


def _kern_sum_csv(out: Path) -> Path:
    seed = out / "seed_kern_sum.csv"
    seed.write_text(
        "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
        + "".join(
            f"{10.0 - i / 10:.1f},{84512 * (20 - i)},{2 + i},42256.0,42256.0,40832,43680,2013.8,kernel_{i}\n"
            for i in range(20)
        )
    )
    return seed


# --- mutators -------------------------------------------------------------------------------
WEIRD_TEXT = [
    "",
    " ",
    "-1",
    "-9223372036854775808",
    "9223372036854775807",
    "99999999999999999999999",
    "1e308",
    "-1e308",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "0x1F",
    "1,2,3",
    "\x00",
    "é☃" * 3,
    '"',
    "'",
    "\n",
    "x" * 5000,
    "null",
    "true",
    "[]",
    "{}",
    "3.5",
    "-0",
    "1e-300",
]


def _weird_value(rng: Any) -> Any:
    kind = rng.randrange(9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([-1, 0, 1, -(2**63), 2**63 - 1, 2**70, -(2**70)])
    if kind == 2:
        return rng.choice([float("nan"), float("inf"), -float("inf"), -1.5, 1e308, 1e-320])
    if kind == 3:
        return rng.choice(WEIRD_TEXT)
    if kind == 4:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12)))
    if kind == 5:
        return [rng.randrange(10)] * rng.randrange(4)
    if kind == 6:
        return {"k": rng.randrange(10)}
    if kind == 7:
        return "".join(rng.choice(string.printable) for _ in range(rng.randrange(1, 40)))
    return rng.random() * 10 ** rng.randrange(-5, 25)


def mutate_bytes(data: bytes, rng: Any) -> bytes:
    if not data:
        return bytes([rng.randrange(256)])
    b = bytearray(data)
    op = rng.randrange(6)
    if op == 0:  # flip bytes
        for _ in range(rng.randrange(1, 20)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif op == 1:  # cut
        del b[rng.randrange(len(b)) :]
    elif op == 2:  # insert junk
        at = rng.randrange(len(b))
        b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    elif op == 3:  # duplicate a chunk
        a = rng.randrange(len(b))
        z = min(len(b), a + rng.randrange(1, 4096))
        b[z:z] = b[a:z]
    elif op == 4:  # zero a region
        a = rng.randrange(len(b))
        for i in range(a, min(len(b), a + rng.randrange(1, 512))):
            b[i] = 0
    else:  # drop a region
        a = rng.randrange(len(b))
        del b[a : a + rng.randrange(1, 2048)]
    return bytes(b)


def mutate_csv(text: str, rng: Any) -> str:
    lines = text.splitlines()
    pre = [ln for ln in lines if ln.startswith(("Processing", "**", "=="))]
    body = [ln for ln in lines if ln not in pre]
    try:
        rows = list(csv.reader(io.StringIO("\n".join(body))))
    except csv.Error:
        return mutate_bytes(text.encode(), rng).decode("utf-8", errors="replace")
    if not rows:
        return text
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(7)
        r = rng.randrange(len(rows))
        if op == 0 and rows[r]:  # a cell
            c = rng.randrange(len(rows[r]))
            rows[r][c] = str(_weird_value(rng))
        elif op == 1 and rows[0]:  # a header name
            c = rng.randrange(len(rows[0]))
            rows[0][c] = rng.choice(
                ["", "Name", "Start (ns)", "Kernel Name", "X", rows[0][c].lower(), rows[0][c] + " "]
            )
        elif op == 2:  # ragged row
            rows[r] = rows[r][: rng.randrange(len(rows[r]) + 1)]
        elif op == 3:  # extra columns
            rows[r] = rows[r] + [str(_weird_value(rng)) for _ in range(rng.randrange(1, 5))]
        elif op == 4 and len(rows) > 1:  # drop or duplicate rows
            del rows[rng.randrange(1, len(rows))]
        elif op == 5 and rows[0]:  # drop a column everywhere
            c = rng.randrange(len(rows[0]))
            rows = [row[:c] + row[c + 1 :] for row in rows]
        else:
            rows.insert(rng.randrange(len(rows) + 1), [str(_weird_value(rng)) for _ in range(rng.randrange(1, 25))])
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return "\n".join(pre) + ("\n" if pre else "") + out.getvalue()


def _json_nodes(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(doc, dict):
        for k, v in list(doc.items())[:60]:
            out += _json_nodes(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:60]):
            out += _json_nodes(v, (*path, i))
    return out


def mutate_json(text: str, rng: Any) -> str:
    try:
        doc = json.loads(text)
    except ValueError:
        return mutate_bytes(text.encode(), rng).decode("utf-8", errors="replace")
    for _ in range(rng.randrange(1, 4)):
        nodes = _json_nodes(doc)
        path = nodes[rng.randrange(len(nodes))]
        if not path:
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        op = rng.randrange(4)
        if op == 0 or op == 3:
            value = _weird_value(rng)
            parent[key] = value.decode("latin-1") if isinstance(value, bytes) else value
        elif op == 1 and isinstance(parent, dict):
            del parent[key]
        elif op == 2:
            parent[key] = [parent[key]] if rng.random() < 0.5 else {"x": parent[key]}
    return json.dumps(doc, allow_nan=True)


def mutate_sqlite(path: Path, rng: Any) -> None:
    con = sqlite3.connect(path)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for _ in range(rng.randrange(1, 5)):
            table = rng.choice(tables)
            cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
            op = rng.randrange(6)
            if op <= 2 and cols:
                col = rng.choice(cols)
                value = _weird_value(rng)
                if isinstance(value, (list, dict)):
                    value = json.dumps(value)
                if isinstance(value, int) and not -(2**63) <= value < 2**63:
                    value = str(value)
                where = (
                    ""
                    if rng.random() < 0.1
                    else f" WHERE rowid IN (SELECT rowid FROM {table} ORDER BY random() LIMIT {rng.randrange(1, 20)})"
                )
                con.execute(f'UPDATE {table} SET "{col}" = ?{where}', (value,))
            elif op == 3:
                con.execute(
                    f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} ORDER BY random() LIMIT "
                    f"{rng.randrange(1, 200)})"
                )
            elif op == 4:
                con.execute(f"INSERT INTO {table} SELECT * FROM {table} LIMIT {rng.randrange(1, 50)}")
            elif rng.random() < 0.3:
                con.execute(f"DROP TABLE {table}")
                tables.remove(table)
                if not tables:
                    break
        con.commit()
    except sqlite3.DatabaseError:
        pass
    finally:
        con.close()
    if rng.random() < 0.2:
        path.write_bytes(mutate_bytes(path.read_bytes(), rng))


def mutate_lines(text: str, rng: Any) -> str:
    lines = text.splitlines()
    for _ in range(rng.randrange(1, 8)):
        i = rng.randrange(len(lines))
        op = rng.randrange(5)
        parts = lines[i].split(" ")
        if op == 0 and parts:
            parts[rng.randrange(len(parts))] = str(_weird_value(rng))
            lines[i] = " ".join(parts)
        elif op == 1:
            del lines[i]
        elif op == 2:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif op == 3:
            lines[i] = (
                lines[i].replace("\t", " ")
                if rng.random() < 0.5
                else lines[i] + "\t" + "".join(rng.choice(string.printable) for _ in range(30))
            )
        else:
            lines[i] = rng.choice(["PUSH", "POP", "START", "END", "MARK"]) + " " + lines[i]
    return "\n".join(lines) + "\n"


# --- readers --------------------------------------------------------------------------------
def _check_report(report: Any) -> str | None:
    """Why a report holds impossible numbers (negative times or counts, NaN, infinity, busy over 100 %), or None."""
    from max_profile.model import find_impossible_number

    found = find_impossible_number(
        msgspec.to_builtins(report, enc_hook=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    )
    if found:
        return found
    k = getattr(report, "kernels", None)
    busy = getattr(k, "gpu_busy_pct", None)
    if busy is not None and busy > 100.0 + 1e-9:
        return f"gpu_busy_pct = {busy}"
    return None


def _import_and_build(path: Path) -> Any:
    from max_profile.analyze.report import build_report
    from max_profile.collect.readers.sources import import_trace
    from max_profile.render.text import render_text

    report = build_report(import_trace(str(path)))
    render_text(report)
    return report


def _ncu_pair(details: Path, raw: Path | None) -> Any:
    from max_profile.analyze.report import build_report
    from max_profile.collect.readers.ncu import ncu_capture

    return build_report(ncu_capture(str(details), str(raw) if raw else None))


def _nvtx(path: Path) -> Any:
    from max_profile.analyze.report import build_report
    from max_profile.collect.live.nvtx_log import read_nvtx_log
    from max_profile.model import Capture, Environment, RawCapture

    log = read_nvtx_log(path)
    raw = RawCapture(
        environment=Environment(vendor="none", vendor_reason="fuzz"),
        capture=Capture(started_unix_s=0.0),
        kernels=log.op_table(),
        ranges=log.phase_ranges(),
        kernel_source="nvtx-log",
    )
    return build_report(raw)


def _raw_json(path: Path) -> Any:
    from max_profile.analyze.report import build_report
    from max_profile.model import RawCapture
    from max_profile.render.text import render_text

    report = build_report(RawCapture.load(str(path)))
    render_text(report)
    return report


def _report_json(path: Path) -> Any:
    from max_profile.model import Report
    from max_profile.render.text import render_text

    report = Report.load(str(path))
    render_text(report)
    return report


def _serve_log(path: Path) -> Any:
    from max_profile.serve import scan_server_log

    lines = scan_server_log(path.read_bytes().decode("utf-8", errors="replace"))
    assert all(isinstance(x, str) and len(x) <= 2000 for x in lines)
    return None


@dataclass
class Reader:
    name: str
    suffix: str
    mutate: Callable[[Path, Any], None]
    read: Callable[[Path], Any]
    seed: Path | None = None
    extra: dict[str, Path] = field(default_factory=dict)


def _text_mutator(fn: Callable[[str, Any], str]) -> Callable[[Path, Any], None]:
    def mutate(path: Path, rng: Any) -> None:
        text = path.read_text(errors="replace")
        out = (
            fn(text, rng) if rng.random() < 0.8 else mutate_bytes(text.encode(), rng).decode("utf-8", errors="replace")
        )
        path.write_text(out)

    return mutate


def _bytes_mutator(path: Path, rng: Any) -> None:
    path.write_bytes(mutate_bytes(path.read_bytes(), rng))


def readers(workdir: Path) -> dict[str, Reader]:
    """Every reader with its seed (built in ``workdir``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    raw_seed, report_seed = _raw_capture(workdir)
    rocprof = workdir / "seed_kernel_trace.csv"
    rocprof.write_text(ROCPROF)
    ncu_raw = workdir / "seed_ncu_raw.csv"
    ncu_raw.write_bytes(
        gzip.decompress((DATA / "gpu" / "h200_llama180m_host_bound" / "small_ncu_mha_raw.csv.gz").read_bytes())
    )
    serve_log = workdir / "seed_server.log"
    serve_log.write_text(SERVE_LOG * 20)
    table = [
        Reader("nsys-sqlite", ".sqlite", mutate_sqlite, _import_and_build, _trimmed_nsys(workdir)),
        Reader("nsys-gpu-trace-csv", ".csv", _text_mutator(mutate_csv), _import_and_build, _gpu_trace_csv(workdir)),
        Reader("nsys-kern-sum-csv", ".csv", _text_mutator(mutate_csv), _import_and_build, _kern_sum_csv(workdir)),
        Reader("rocprofv3-csv", "_kernel_trace.csv", _text_mutator(mutate_csv), _import_and_build, rocprof),
        Reader("rocpd", ".db", mutate_sqlite, _import_and_build, _rocpd(workdir)),
        Reader("kineto-json", ".json", _text_mutator(mutate_json), _import_and_build, _kineto(workdir)),
        Reader("rocprofv3-json", ".json", _text_mutator(mutate_json), _import_and_build, _rocprof_json(workdir)),
        Reader(
            "ncu-details-csv",
            ".csv",
            _text_mutator(mutate_csv),
            lambda p: _ncu_pair(p, None),
            DATA / "gpu" / "h200_llama180m_host_bound" / "small_ncu_mha_details.csv",
        ),
        Reader(
            "ncu-raw-csv",
            ".csv",
            _text_mutator(mutate_csv),
            lambda p: _ncu_pair(DATA / "gpu" / "h200_llama180m_host_bound" / "small_ncu_mha_details.csv", p),
            ncu_raw,
        ),
        Reader("nvtx-log", ".log", _text_mutator(mutate_lines), _nvtx, DATA / "cpu" / "nvtx_log_sample.txt"),
        Reader("raw-capture-json", ".json", _text_mutator(mutate_json), _raw_json, raw_seed),
        Reader("report-json", ".json", _text_mutator(mutate_json), _report_json, report_seed),
        Reader("serve-log", ".log", _bytes_mutator, _serve_log, serve_log),
    ]
    markers = workdir / "seed_marker_api_trace.csv"
    markers.write_text(ROCPROF_MARKERS)
    table[3].extra["markers"] = markers
    return {r.name: r for r in table}


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def run_one(reader: Reader, rng: Any, workdir: Path, index: int, hang_s: float = HANG_S) -> Outcome:
    """Mutate the seed once and read it; the outcome's category (see the module docstring)."""
    from max_profile.errors import MaxProfileError

    assert reader.seed is not None
    target = workdir / f"case{index % 4}{reader.suffix}"
    shutil.copyfile(reader.seed, target)
    if "markers" in reader.extra:  # rocprofv3 writes the marker trace beside the kernel trace
        markers = target.with_name(target.name.replace("kernel_trace", "marker_api_trace"))
        shutil.copyfile(reader.extra["markers"], markers)
        if rng.random() < 0.3:
            _text_mutator(mutate_csv)(markers, rng)
    reader.mutate(target, rng)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, hang_s)
    try:
        result = reader.read(target)
    except Hang:
        return Outcome("hang", f"over {hang_s:g} s")
    except MaxProfileError as exc:
        return Outcome("refused", str(exc)[:200])
    except Exception as exc:  # noqa: BLE001 - the point: anything else is a finding
        return Outcome("untyped", f"{type(exc).__name__}: {str(exc)[:200]} (at {_where(exc)})")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    why = _check_report(result) if result is not None else None
    return Outcome("garbage", why) if why else Outcome("accepted")


def _where(exc: BaseException) -> str:
    """The innermost max_profile frame of the exception's traceback, as file:line."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "max_profile" in f.filename]
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


def new_rng(seed: int) -> random.Random:
    return random.Random(seed)
