"""Time max_profile's nsys reader + build_report (breakdown, rules) on one export; prints one JSON line.

    python3 benchmarks/time_nsys_read.py REPORT.sqlite

Used by breakdown_speed.py (generated 1M-kernel trace) and by h200/archs_and_serve.sh (a real
`max serve` export). ``seconds`` = read + breakdown, after imports; ``peak_rss_mb`` = VmHWM.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def vm_hwm_mb() -> float:
    """This process's own peak RSS: VmHWM is reset by exec; ``ru_maxrss`` is not (Linux folds the
    forking parent's peak into it at exec, which made a trace generator's memory look like ours)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024


def main(path: str) -> dict[str, object]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    t0 = time.perf_counter()
    from max_profile.analyze.report import build_report
    from max_profile.collect.readers.nsys import nsys_capture
    from max_profile.model import KernelBreakdown

    t_import = time.perf_counter()
    raw = nsys_capture(path)
    t_read = time.perf_counter()
    report = build_report(raw)  # the one pipeline: steps, attribution, breakdown, rules, plan
    t_done = time.perf_counter()
    bd = report.kernels
    assert isinstance(bd, KernelBreakdown), bd
    dec = next((p for p in bd.phases if p.phase == "decode" and p.families), None)
    return {
        "seconds": t_done - t_import,
        "read_s": round(t_read - t_import, 3),
        "breakdown_s": round(t_done - t_read, 3),
        "import_s": t_import - t0,
        "peak_rss_mb": vm_hwm_mb(),
        "kernels": bd.kernels,
        "ranges": len(raw.ranges),
        "decode_steps": dec.steps if dec else None,
        "top_family": dec.families[0].family if dec else None,
        "share": dec.families[0].share_pct if dec else None,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
