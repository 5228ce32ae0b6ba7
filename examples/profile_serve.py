"""Profile ``max serve`` under load: time to ready, client-side TTFT / inter-token latency, GPU
utilization and (mode ``kernels``) the server's kernels per phase.

    python examples/profile_serve.py [--model-path DIR] [--devices cpu|gpu] [--mode utilization|kernels|nsys|rocprof]
    [--no-warm]

The plan is printed first and nothing starts until it is confirmed (``confirm=True`` here; the CLI
asks). The server runs in its own process group and temp folder and is stopped — with everything it
started — however the capture ends: done, failed, or Ctrl-C. Without --model-path a tiny random Llama
is built (a cold compile takes about 2 minutes on 2 CPU cores, warm about 10 s to /health).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import max_profile
from max_profile.collect.probes.environment import detect_environment
from max_profile.render.terminal import fit_to_terminal
from max_profile.serve import SERVE_MODES, ServePlan, free_port, resolve_plan, run_serve_capture
from max_profile.tinymodel import build_tiny_llama

ap = argparse.ArgumentParser()
ap.add_argument("--model-path")
ap.add_argument("--devices", default="cpu")
ap.add_argument("--mode", default="utilization", choices=list(SERVE_MODES))
ap.add_argument("--seconds", type=float, default=5.0)
ap.add_argument("--out", default="max-profile-profile-serve", help="folder for what it writes (created)")
ap.add_argument("--no-warm", action="store_true", help="skip `max warm-cache` (when the compile cache is known warm)")
args = ap.parse_args()
Path(args.out).mkdir(parents=True, exist_ok=True)
model_path = args.model_path or str(build_tiny_llama(Path(args.out) / "tiny-llama"))

plan = ServePlan(
    model_path=model_path,
    devices=args.devices,
    mode=args.mode,
    duration_s=args.seconds,
    port=free_port(),
    metrics_port=free_port(),
    max_tokens=16,
    warm=not args.no_warm,
)
try:
    resolved = resolve_plan(plan, detect_environment(check_tools=False).vendor)  # checked before anything starts
    print(resolved.describe())
    raw = run_serve_capture(
        resolved,
        confirm=True,
        progress=lambda line: print(fit_to_terminal(line)),
        artifacts_dir=str(Path(args.out) / "artifacts"),
    )
except max_profile.MaxProfileError as exc:  # server died on start, port taken, profiler missing...: one reason
    raise SystemExit(f"serve capture failed: {exc}") from None

report = max_profile.build_report(raw)
serve = report.serve
assert serve is not None
print(
    fit_to_terminal(
        f"ready in {serve.time_to_ready_s:.1f} s; {serve.requests} requests ({serve.failed_requests} failed) in "
        f"{serve.window_s:.1f} s"
    )
)
print(
    fit_to_terminal(
        f"TTFT p50 {serve.ttft_ms_p50:.1f} ms, p90 {serve.ttft_ms_p90:.1f} ms; inter-token p50 {serve.itl_ms_p50:.2f} "
        f"ms; {serve.tokens_per_s:.0f} tokens/s"
    )
)
for finding in report.findings:
    print(fit_to_terminal(f"[{finding.severity}] {finding.id}: {finding.title}"))
raw.save(str(Path(args.out) / "serve_raw.json.gz"))
print(fit_to_terminal(f"raw capture, server log and artifacts in {args.out}"))
