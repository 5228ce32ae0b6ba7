"""The CI gate on a noisy machine: ``examples/diff_gate.py`` run unchanged N times against one baseline, beside busy
loops that take the cores (what a shared CI runner or a test suite beside it does), every run printed.

    python benchmarks/diff_gate_under_load.py [--runs 20] [--busy 2] [--tokens 320] [--burn-ms 0.8] [--sleep-ms 2]
                                              [--json out.json]

The baseline is recorded first on the quiet machine; then each run profiles the same generation with ``--busy``
processes spinning beside it and compares. An unchanged run that exits 1 (REGRESSION) is a false regression; exit 5 is
the gate saying it could not judge (inconclusive), 0 no regression. Then the injected changes, each once: more work per
step (``--burn-ms`` of process CPU time spun in every step) beside the busy loops, a wait (``--sleep-ms``) beside them,
and the same wait on the quiet machine. Printed per run: exit code, outcome, and the gate's verdict lines.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPIN = "while True: pass"


def gate(
    baseline: Path, tokens: int, save: Path | None = None, extra: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    cmd = [sys.executable, str(REPO / "examples" / "diff_gate.py"), "--baseline", str(baseline)]
    cmd += ["--tokens", str(tokens)] + (["--save-run", str(save)] if save else []) + list(extra or [])
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)


def host_load(path: Path) -> str:
    """The run's own record of the host's load: cores used by its process tree and by everything else."""
    sys.path.insert(0, str(REPO))
    from max_profile.model import RawCapture

    load = RawCapture.load(str(path)).capture.host_load
    if load is None:
        return "host load not recorded"
    return f"own {load.own_cores:.2f} / others {load.other_cores:.2f} of {load.cores} cores over {load.window_s:.1f} s"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--busy", type=int, default=2, help="busy loops beside each run (python3 -c 'while True: pass')")
    ap.add_argument("--tokens", type=int, default=800)
    ap.add_argument("--json", help="write every run here")
    ap.add_argument("--burn-ms", type=float, default=0.8, help="CPU time spun per step in the more-work run")
    ap.add_argument("--sleep-ms", type=float, default=2.0, help="sleep per step in the wait runs")
    args = ap.parse_args()
    runs: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline_raw.json.gz"
        first = gate(baseline, args.tokens)
        print(f"baseline: exit {first.returncode} ({'recorded' if baseline.exists() else 'NOT recorded'})", flush=True)
        if not baseline.exists():
            print(first.stdout[-2000:], first.stderr[-2000:])
            return 1
        plan = [("unchanged", args.busy, [])] * args.runs + [
            ("burn", args.busy, ["--inject-burn-ms", str(args.burn_ms)]),
            ("sleep", args.busy, ["--inject-delay-ms", str(args.sleep_ms)]),
            ("sleep, quiet", 0, ["--inject-delay-ms", str(args.sleep_ms)]),
        ]
        for i, (what, busy, extra) in enumerate(plan, 1):
            spinners = [subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True) for _ in range(busy)]
            try:
                time.sleep(1.0 if busy else 0.0)
                t0 = time.time()
                saved = Path(tmp) / f"run{i}_raw.json.gz"
                run = gate(baseline, args.tokens, saved, extra)
            finally:
                for p in spinners:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            verdicts = [line.strip() for line in run.stdout.splitlines() if re.match(r"\s*(REGRESSION|slower|faster|"
                        r"changed|no regression|INCONCLUSIVE|host timing not judged)", line)]  # fmt: skip
            load = host_load(saved) if saved.exists() else "no capture"
            secs = round(time.time() - t0, 1)
            outcome = {0: "no regression", 1: "regression", 5: "inconclusive"}.get(run.returncode, "error")
            runs.append(
                {"run": i, "what": what, "busy": busy, "exit": run.returncode, "outcome": outcome, "seconds": secs,
                 "host_load": load, "verdicts": verdicts}
            )  # fmt: skip
            print(f"run {i:2d} ({what}, {busy} busy): exit {run.returncode} {outcome} in {secs:5.1f} s, {load} | "
                  + " | ".join(verdicts), flush=True)  # fmt: skip
            if run.returncode not in (0, 1, 5):
                print(run.stdout[-3000:], run.stderr[-3000:], flush=True)
    unchanged = [r for r in runs if r["what"] == "unchanged"]
    false = sum(1 for r in unchanged if r["exit"] == 1)
    said = {r["what"]: r["outcome"] for r in runs if r["what"] != "unchanged"}
    print(
        f"{false} false regression(s) in {len(unchanged)} unchanged runs beside {args.busy} busy loops "
        f"({sum(1 for r in unchanged if r['exit'] == 5)} inconclusive, "
        f"{sum(1 for r in unchanged if r['exit'] == 0)} no regression); injected: {said}",
        flush=True,
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"busy": args.busy, "runs": runs, "false_regressions": false}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
