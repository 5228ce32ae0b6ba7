"""Kernel breakdown speed: a generated 1,000,000-kernel nsys-schema SQLite -> per-phase family table,
and the same trace as Kineto JSON through HTA's ``get_gpu_kernel_breakdown``, side by side.

    python benchmarks/breakdown_speed.py [--kernels 1000000] [--no-hta]

Goal: <= 2 s and <= 300 MB for max_profile on 2 cores; >= 5x faster than HTA (``pip install
holistictraceanalysis`` to include it). The kernel names and per-step mix come from the real H200
capture of a 7B-shaped model (tests/data/gpu/h200_llama7b_gemv_decode/big_cupti_raw.json.gz): 302 kernels per decode
step; the API table holds 3.3 other driver calls per launch, as MAX's real nsys export does.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def step_mix() -> list[tuple[str, int]]:
    from max_profile.model import RawCapture

    raw = RawCapture.load(str(REPO / "tests" / "data" / "gpu" / "h200_llama7b_gemv_decode" / "big_cupti_raw.json.gz"))
    step = next(s for s in raw.steps if s.phase == "decode")
    nxt = next(s for s in raw.steps if s.index == step.index + 1)
    return [
        (k.name, k.end_ns - k.start_ns)
        for k in raw.kernels.records()
        if k.launch_ns is not None and step.start_ns <= k.launch_ns < nxt.start_ns and k.start_ns >= 0
    ]


def make_sqlite(path: Path, n_kernels: int) -> int:
    mix = step_mix()
    names = sorted({n for n, _ in mix})
    sid = {n: i + 1 for i, n in enumerate(names)}
    con = sqlite3.connect(path)
    from tests.nsys_schema import SCHEMA  # the tables and columns nsys 2025.3 exports

    con.executescript(SCHEMA)
    other_calls = ["cuStreamIsCapturing", "cuEventRecord", "cuEventQuery", "cuTensorMapEncodeTiled"]
    con.executemany(
        "INSERT INTO StringIds VALUES (?, ?)",
        [(i, n) for n, i in sid.items()]
        + [(len(sid) + 1, "cuLaunchKernelEx"), (len(sid) + 2, "decode"), (len(sid) + 3, "prefill")]
        + [(len(sid) + 4 + i, n) for i, n in enumerate(other_calls)],
    )
    pid = 4242 << 24
    main_tid, worker_tid = pid | 4242, pid | 4300
    con.execute(
        "INSERT INTO NVTX_EVENTS VALUES (0, NULL, 75, NULL, NULL, NULL, 'max_profile', ?, NULL, NULL, 1)", (main_tid,)
    )
    kernels, launches, ranges = [], [], []
    t, corr, count, step = 1_000_000, 0, 0, 0
    while count < n_kernels:
        step_start = t
        k_t = t + 20_000
        for name, dur in mix:
            if count >= n_kernels:
                break
            corr += 1
            count += 1
            # other driver calls as in the real H200 export: 3.3 per launch
            # (tests/data/gpu/h200_llama180m_host_bound/small_nsys.sqlite.gz)
            for j in range(3 if count % 3 else 4):
                launches.append(
                    (k_t - 9_000 + j * 1_000, k_t - 8_500 + j * 1_000, 1, worker_tid, corr, len(sid) + 4 + j, 0)
                )
                corr += 1
            launches.append((k_t - 5_000, k_t - 3_000, 1, worker_tid, corr, len(sid) + 1, 0))
            kernels.append((k_t, k_t + dur, 0, 1, 13, corr, pid, sid[name], sid[name], 40, 1, 1024, 1, 128, 1, 1, None))
            k_t += dur + 300
        t = k_t + 50_000
        ranges.append(
            (step_start, t, 59, None, None, None, None, main_tid, None, len(sid) + (3 if step == 0 else 2), 1)
        )
        step += 1
        if len(kernels) >= 200_000:
            con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (" + ",".join("?" * 17) + ")", kernels)
            con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?)", launches)
            kernels, launches = [], []
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (" + ",".join("?" * 17) + ")", kernels)
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?)", launches)
    con.executemany("INSERT INTO NVTX_EVENTS VALUES (?,?,?,?,?,?,?,?,?,?,?)", ranges)
    con.commit()
    con.close()
    return step


def export_kineto(sqlite_path: Path, out_dir: Path) -> Path:
    con = sqlite3.connect(sqlite_path)
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "rank-0.json"
    with open(path, "w") as fh:
        fh.write(
            '{"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "deviceProperties": [], '
            '"traceEvents": [\n'
        )
        first = True
        for start, end, corr, name in con.execute(
            "SELECT start, end, correlationId, demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL"
        ):
            ev = {
                "ph": "X",
                "cat": "kernel",
                "name": names[name],
                "pid": 0,
                "tid": 13,
                "ts": start / 1e3,
                "dur": (end - start) / 1e3,
                "args": {"device": 0, "stream": 13, "correlation": corr},
            }
            fh.write(("" if first else ",\n") + json.dumps(ev))
            first = False
        fh.write("\n]}\n")
    con.close()
    return path


HTA = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])
from time_nsys_read import vm_hwm_mb
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t_import = time.perf_counter()
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
kernel_type_df, kernel_df = analyzer.get_gpu_kernel_breakdown(visualize=False)
t1 = time.perf_counter()
result = {"seconds": t1 - t_import, "import_s": t_import - t0, "peak_rss_mb": vm_hwm_mb(), "rows": len(kernel_df)}
print(json.dumps(result))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--hta-python", default=sys.executable, help="interpreter with holistictraceanalysis installed")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mp-bench-") as tmp:
        db = Path(tmp) / "trace.sqlite"
        t = time.perf_counter()
        steps = make_sqlite(db, args.kernels)
        print(
            f"generated {args.kernels} kernels in {steps} steps ({db.stat().st_size / 2**20:.0f} MiB SQLite) in "
            f"{time.perf_counter() - t:.1f} s"
        )
        measure = str(REPO / "benchmarks" / "time_nsys_read.py")
        ours = json.loads(
            subprocess.run([sys.executable, measure, str(db)], capture_output=True, text=True, check=True).stdout
        )
        print(
            f"max_profile: read + per-phase family table {ours['seconds']:.2f} s (imports {ours['import_s']:.2f} s), "
            f"peak RSS {ours['peak_rss_mb']:.0f} MB, "
            f"{ours['kernels']} kernels, {ours['decode_steps']} decode steps, top decode family {ours['top_family']} "
            f"{ours['share']:.1f}%"
        )
        print(
            f"goal <= 2 s and <= 300 MB: {'met' if ours['seconds'] <= 2 and ours['peak_rss_mb'] <= 300 else 'NOT met'}"
        )
        if args.no_hta:
            return 0
        trace_dir = Path(tmp) / "kineto"
        export_kineto(db, trace_dir)
        print(f"kineto json: {(trace_dir / 'rank-0.json').stat().st_size / 2**20:.0f} MiB")
        res = subprocess.run(
            [args.hta_python, "-c", HTA, str(trace_dir), str(REPO / "benchmarks")],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            print(
                "HTA failed or is not installed (pip install holistictraceanalysis):",
                res.stderr.strip().splitlines()[-1:] if res.stderr else "",
            )
            return 0
        hta = json.loads(res.stdout.strip().splitlines()[-1])
        print(
            f"HTA get_gpu_kernel_breakdown: {hta['seconds']:.2f} s (imports {hta['import_s']:.2f} s), peak RSS "
            f"{hta['peak_rss_mb']:.0f} MB"
        )
        print(f"ratio (HTA time / max_profile time): {hta['seconds'] / ours['seconds']:.1f}x (goal >= 5x)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
