"""Embed max_profile in a long-running app: a capture switched on from outside while the app keeps generating.

    python examples/embed_in_app.py [--model-path DIR] [--run-seconds 60] [--steps 32] [--admin-port 8089]
    kill -USR1 <pid>                               # capture the next 32 steps in the background
    curl 'http://127.0.0.1:8089/profile?steps=16'   # capture 16 steps, get the report as JSON
    kill <pid>                                     # stop before --run-seconds: the app finishes cleanly

The app (here a loop of completions) owns the pipeline. ``Profiler`` costs nothing until a capture is
asked for: no hook is installed while it is off. Each capture writes ``capture-N.json`` (the report)
and ``metrics.prom`` (Prometheus text, for node_exporter's textfile collector) to --out, and exports
OpenTelemetry metrics and spans when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set. A signal handler must not
block, so it starts ``capture_in_background``; the admin endpoint blocks only its own request thread.
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from max_profile import Profiler, build_report
from max_profile.model import RawCapture, Report
from max_profile.render.telemetry import export_otel, otlp_providers_from_env, prometheus_text
from max_profile.render.terminal import fit_to_terminal
from max_profile.runner import generate, load_model
from max_profile.tinymodel import build_tiny_llama

ap = argparse.ArgumentParser()
ap.add_argument("--model-path")
ap.add_argument("--devices", default="cpu")
ap.add_argument("--run-seconds", type=float, default=60.0)
ap.add_argument("--steps", type=int, default=32)
ap.add_argument("--admin-port", type=int, default=0, help="0: any free port (printed)")
ap.add_argument("--out", default="max-profile-embedded", help="folder for what it writes (created)")
args = ap.parse_args()
Path(args.out).mkdir(parents=True, exist_ok=True)

model_path = args.model_path or str(build_tiny_llama(Path(args.out) / "tiny-llama"))
model = load_model(model_path, devices=args.devices)
profiler = Profiler(model.pipeline, model_path=model_path, devices=args.devices)
captures: list[Report] = []


def publish(raw: RawCapture) -> Report:
    report = build_report(raw)
    captures.append(report)
    Path(args.out, f"capture-{len(captures)}.json").write_bytes(report.to_json())
    Path(args.out, "metrics.prom").write_text(prometheus_text(report))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        export = otlp_providers_from_env()
        export_otel(report, meter_provider=export.meter_provider, tracer_provider=export.tracer_provider)
        export.finish()
    print(fit_to_terminal(f"capture {len(captures)}: {len(raw.steps)} steps -> {args.out}"), flush=True)
    return report


def on_signal(signum: int, frame: object) -> None:
    if not profiler.active:
        future: Future[RawCapture] = profiler.capture_in_background(steps=args.steps, timeout_s=120)
        future.add_done_callback(
            lambda f: publish(f.result()) if f.exception() is None else print(f"capture failed: {f.exception()}")
        )


class Admin(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        query = parse_qs(urlparse(self.path).query)
        try:
            report = publish(profiler.capture(steps=int(query.get("steps", [args.steps])[0]), timeout_s=120))
            body, code = report.to_json(), 200
        except Exception as exc:  # noqa: BLE001 - busy, bad steps=...: told to the caller
            body, code = str(exc).encode(), 409
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


stopping = threading.Event()
signal.signal(signal.SIGUSR1, on_signal)
signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())  # a service manager's stop: finish cleanly
admin = http.server.ThreadingHTTPServer(("127.0.0.1", args.admin_port), Admin)
threading.Thread(target=admin.serve_forever, daemon=True).start()
print(
    fit_to_terminal(f"pid {os.getpid()}; admin on http://127.0.0.1:{admin.server_address[1]}/profile?steps=N"),
    flush=True,
)

deadline, completions = time.monotonic() + args.run_seconds, 0
while time.monotonic() < deadline and not stopping.is_set():  # the app's own work, uninterrupted by profiling
    generate(model, ["the app keeps serving"], 8)
    completions += 1
admin.shutdown()
print(fit_to_terminal(f"{completions} completions; {len(captures)} captures"), flush=True)
model.close()
