"""HTML and Perfetto export of a 1,000,000-kernel capture: size and time, side by side with the analysis.

    python benchmarks/render_speed.py [--kernels 1000000]

The capture is the generated nsys-schema trace of breakdown_speed.py (the kernel mix of a real H200
decode step, 3.3 other driver calls per launch). Goals: HTML <= 5 MB built in <= 3 s; Perfetto
export <= 5 s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=1_000_000)
    args = ap.parse_args()
    from breakdown_speed import make_sqlite

    from max_profile.analyze.report import build_report
    from max_profile.collect.readers.nsys import nsys_capture
    from max_profile.render.html import render_html
    from max_profile.render.perfetto import build_perfetto

    with tempfile.TemporaryDirectory(prefix="mp-render-") as tmp:
        db = Path(tmp) / "trace.sqlite"
        steps = make_sqlite(db, args.kernels)
        t0 = time.perf_counter()
        raw = nsys_capture(str(db))
        t1 = time.perf_counter()
        report = build_report(raw)
        t2 = time.perf_counter()
        page = render_html(report)
        t3 = time.perf_counter()
        trace = build_perfetto(raw)
        t4 = time.perf_counter()
    print(f"capture: {len(raw.kernels)} kernels in {steps} steps; read {t1 - t0:.2f} s, build_report {t2 - t1:.2f} s")
    print(
        f"HTML:     {len(page) / 2**20:.2f} MiB in {t3 - t2:.2f} s   (goal <= 5 MB, <= 3 s: "
        f"{'met' if len(page) <= 5e6 and t3 - t2 <= 3 else 'NOT met'})"
    )
    print(
        f"Perfetto: {len(trace) / 2**20:.1f} MiB in {t4 - t3:.2f} s   (goal <= 5 s: "
        f"{'met' if t4 - t3 <= 5 else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
