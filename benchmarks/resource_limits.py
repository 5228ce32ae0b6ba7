"""Hostile inputs at full size, through the CLI: peak memory (RSS) and seconds for each, side by side.

    python benchmarks/resource_limits.py [--rows 100000000] [--dir /tmp]

Cases: a gzip bomb (2 GiB of output from 2 MiB), a sparse 10 GB JSON file, JSON nested 100,000 deep, and
an nsys-schema SQLite export whose kernel table holds ``--rows`` rows (10^8 by default: about 5 GB on
disk and a minute or two to build). Target: each is refused or read within 1 GB and bounded
time. The pytest versions (tests/collect/readers/test_limits.py) use the same cases, the SQLite one with a
lowered limit.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _sqlite_with_rows(path: Path, rows: int) -> None:
    from tests.nsys_schema import make_nsys_sqlite

    make_nsys_sqlite(path, decode_steps=4)
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    have = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL "
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        "SELECT 10 + i * 10, 15 + i * 10, 0, 1, 7, 1000000 + i, 0, 1, 1, 32, 1, 1, 1, 128, 1, 1, NULL FROM n",
        (rows - have,),
    )
    con.commit()
    con.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000_000)
    ap.add_argument("--dir", default=None, help="where the inputs are built (needs ~5 GB free for 10^8 rows)")
    args = ap.parse_args()
    from tests.test_limits import _gzip_bomb, _run_measured

    with tempfile.TemporaryDirectory(prefix="mp-limits-", dir=args.dir) as tmp:
        work = Path(tmp)
        cases: list[tuple[str, list[str], float]] = []
        bomb = work / "bomb.json.gz"
        _gzip_bomb(bomb, 2 << 30)
        cases.append(("gzip bomb, 2 GiB out", ["kernels", "--import", str(bomb)], 0.0))
        big = work / "big.json"
        with open(big, "wb") as fh:
            fh.write(b'{"traceEvents": [')
            fh.truncate(10 * 10**9)
        cases.append(("10 GB file (sparse)", ["kernels", "--import", str(big)], 0.0))
        deep = work / "deep.json"
        deep.write_text('{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}")
        cases.append(("JSON 100,000 deep", ["kernels", "--import", str(deep)], 0.0))
        db = work / "rows.sqlite"
        t0 = time.perf_counter()
        _sqlite_with_rows(db, args.rows)
        built = time.perf_counter() - t0
        cases.append((f"SQLite {args.rows:,} kernel rows", ["kernels", "--import", str(db)], built))
        print(f"{'case':34s} {'exit':>4s} {'peak MiB':>9s} {'seconds':>8s}  message")
        worst = 0
        for name, argv, prep in cases:
            t0 = time.perf_counter()
            rc, err, peak_kib = _run_measured(*argv, timeout=3600)
            took = time.perf_counter() - t0
            line = next((ln for ln in err.splitlines() if ln.startswith("max-profile: error:")), "(no error)")
            print(
                f"{name:34s} {rc:4d} {peak_kib / 1024:9.0f} {took:8.1f}  {line[:150]}"
                + (f"  [input built in {prep:.0f} s]" if prep else "")
            )
            worst = max(worst, peak_kib)
        print(f"worst peak RSS: {worst / 1024:.0f} MiB (bound: 1 GB = 954 MiB)")
    return 0 if worst < 1_000_000 else 1


if __name__ == "__main__":
    sys.exit(main())
