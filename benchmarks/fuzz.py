"""Fuzz every reader: thousands of mutated real captures each, through the public path; prints per reader
accepted / typed refusals / untyped / garbage / hangs (over 30 s). Target: 0 untyped, 0 garbage, 0 hangs.

    python benchmarks/fuzz.py [--per-reader 10000] [--readers nsys-sqlite,kineto-json] [--seed 1] [--show 3]

The mutators and seeds are tests/fuzzing.py's (the pytest sample in tests/collect/readers/test_fuzz.py uses the same).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-reader", type=int, default=10_000)
    ap.add_argument("--readers", default="")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--show", type=int, default=3, help="examples of each finding printed per reader")
    args = ap.parse_args()
    from tests.fuzzing import CATEGORIES, new_rng, readers, run_one

    with tempfile.TemporaryDirectory(prefix="mp-fuzz-") as tmp:
        work = Path(tmp)
        table = readers(work / "seeds")
        chosen = [r for r in table.values() if not args.readers or r.name in args.readers.split(",")]
        print(f"{'reader':22s} " + " ".join(f"{c:>9s}" for c in CATEGORIES) + "   seconds")
        total: Counter[str] = Counter()
        for reader in chosen:
            rng = new_rng(args.seed)
            counts: Counter[str] = Counter()
            examples: dict[str, list[str]] = defaultdict(list)
            t0 = time.perf_counter()
            for i in range(args.per_reader):
                out = run_one(reader, rng, work, i)
                counts[out.category] += 1
                if out.category in ("untyped", "garbage", "hang") and len(examples[out.category]) < args.show:
                    examples[out.category].append(out.detail)
            total.update(counts)
            print(
                f"{reader.name:22s} "
                + " ".join(f"{counts[c]:9d}" for c in CATEGORIES)
                + f"   {time.perf_counter() - t0:7.1f}",
                flush=True,
            )
            for cat, found in examples.items():
                for detail in found:
                    print(f"    {cat}: {detail}")
        print(f"{'all':22s} " + " ".join(f"{total[c]:9d}" for c in CATEGORIES))
    return 1 if total["untyped"] or total["garbage"] or total["hang"] else 0


if __name__ == "__main__":
    sys.exit(main())
