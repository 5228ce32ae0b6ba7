"""Time max_profile's nsys reader + breakdown on a real export (used by archs_and_serve.sh serve).

    python3 benchmarks/h200/time_nsys_read.py REPORT.sqlite
"""

from __future__ import annotations

import json
import resource
import sys
import time

from max_profile.analyze.breakdown import build_breakdown
from max_profile.collect.nsys import read_nsys_sqlite

t0 = time.perf_counter()
trace = read_nsys_sqlite(sys.argv[1])
t1 = time.perf_counter()
bd = build_breakdown(trace.kernels, source="nsys", ranges=trace.ranges)
t2 = time.perf_counter()
print(json.dumps({"kernels": bd.kernels, "read_s": round(t1 - t0, 3), "breakdown_s": round(t2 - t1, 3),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "ranges": len(trace.ranges)}))
