"""Diff two runs as a CI gate: record a baseline once, then fail the build when a change makes decode
significantly slower than the threshold.

    python examples/diff_gate.py --baseline baseline_raw.json.gz [--model-path DIR] [--fail-above 5] [--inject-delay-ms
    0] [--inject-burn-ms 0] [--save-run run_raw.json.gz]

First run (no baseline file): records it and exits 0. Later runs: profile the same generation,
compare with ``diff_reports`` (per-step distributions, Mann-Whitney U, so noise alone does not fail
the gate) and exit 1 on a significant regression above ``--fail-above`` %, 5 when the comparison could not judge
(inconclusive: the host was loaded and the step's wall time moved, or too few steps), 2 when the runs are not
comparable (another model, device or batch), else 0. ``--inject-delay-ms`` adds a host delay to
every step (a wait: the step's wall time grows, its CPU time does not), ``--inject-burn-ms`` spins that much process CPU
time in every step (more work), to see what each looks like to the gate. Same gate from the shell:
``max-profile diff baseline_raw.json.gz candidate_raw.json.gz --fail-above 5``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import max_profile
from max_profile.analyze.diff import diff_reports
from max_profile.render.diff_text import print_diff
from max_profile.render.terminal import fit_to_terminal
from max_profile.runner import generate, load_model
from max_profile.tinymodel import build_tiny_llama
from max_profile.util.files import cache_dir

ap = argparse.ArgumentParser()
ap.add_argument("--baseline", required=True, help="raw capture of the baseline (.json.gz); written when missing")
ap.add_argument("--model-path")
ap.add_argument("--devices", default="cpu")
ap.add_argument("--tokens", type=int, default=800, help="long enough for the host-load record to vouch (>= 0.5 s)")
ap.add_argument("--fail-above", type=float, default=5.0)
ap.add_argument("--inject-delay-ms", type=float, default=0.0, help="sleep this long in every step (a wait)")
ap.add_argument(
    "--inject-burn-ms", type=float, default=0.0, help="spin this much process CPU time in every step (more work)"
)
ap.add_argument("--save-run", help="also save this run's raw capture here (to inspect or to make the next baseline)")
args = ap.parse_args()

baseline = Path(args.baseline)
before = max_profile.load(str(baseline)) if baseline.exists() else None
if before is not None:  # a baseline from other hardware is refused before the model load, not after it
    from max_profile.collect.probes.environment import detect_environment

    here = sorted(g.name or g.key for g in detect_environment(check_tools=False).gpus)
    there = sorted(g.name or g.key for g in before.environment.gpus)
    if here != there:
        print(
            fit_to_terminal(
                f"not comparable: GPUs: {', '.join(there) or 'none'} vs {', '.join(here) or 'none'} (baseline "
                f"{baseline} vs this machine)"
            )
        )
        sys.exit(2)
model_path = args.model_path or str(
    build_tiny_llama(cache_dir("models") / "diff-gate-tiny-llama")
)  # max_profile's cache folder
model = load_model(model_path, devices=args.devices)
generate(model, ["warm up"], 8)
if args.inject_delay_ms or args.inject_burn_ms:  # a stand-in for a new host sync (a wait) or more work per step
    original = model.pipeline.execute

    def slower(inputs: Any) -> Any:
        time.sleep(args.inject_delay_ms / 1e3)
        until = time.process_time() + args.inject_burn_ms / 1e3
        while time.process_time() < until:
            pass
        return original(inputs)

    model.pipeline.execute = slower
with max_profile.profile(model.pipeline, model_path=model_path, devices=args.devices) as prof:
    generate(model, ["I believe the meaning of life is"], args.tokens)
model.close()

if args.save_run:
    prof.raw_capture.save(args.save_run)
if before is None:
    prof.raw_capture.save(str(baseline))
    print(fit_to_terminal(f"baseline recorded in {baseline}; commit it, later runs are compared with it"))
    sys.exit(0)
result = diff_reports(
    max_profile.build_report(before),
    prof.report,
    a_label=str(baseline),
    b_label="this run",
    fail_above_pct=args.fail_above,
    a_raw=before,
    b_raw=prof.raw_capture,
)
print_diff(result)
if not result.comparable:
    sys.exit(2)
sys.exit(1 if result.regression else 5 if result.outcome == "inconclusive" else 0)
