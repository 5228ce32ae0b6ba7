"""Profile ``max serve``: planned, confirmed, warmed, bounded, fail-fast, and cleaned up.

    max-profile serve --model-path P [--devices D] [--mode utilization|kernels] [--duration 10] [--yes] [-- EXTRA SERVE FLAGS]

1. Plan: the model, flags, commands and expected cost are printed; nothing starts without
   confirmation (``--yes``, a TTY answer, or ``confirm=`` in the API).
2. Custom architectures are preflighted first. A warm pass (``max warm-cache``) fills the compile cache.
3. The server runs in its own process group and its own TMPDIR (MAX leaves ZMQ socket files there),
   on free ports (API and metrics: ``MAX_SERVE_METRICS_ENDPOINT_PORT``), with
   ``OTEL_SDK_DISABLED=true`` (no telemetry egress, /metrics kept).
4. Fail fast: while waiting for ``/health``, the process must stay alive and its log must show no
   early error (bad flag, missing model, out of memory, port in use); those lines are reported.
5. A concurrency-1 streaming load on ``/v1/completions`` outlasts the capture window; the client
   records time to first token and inter-token latency.
6. Capture (``--mode``): ``utilization`` samples the GPU over the window; ``kernels`` records what the
   model worker runs — MAX's op ranges through the NVTX log library on any device, plus CUPTI inside
   the worker on NVIDIA (an environment-activated hook) — tied to MAX's scheduler ranges
   ``_schedule(... batch_type=CE|TG)``.
7. Only the server's own process group is stopped; its TMPDIR is removed; artifacts are checked.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from max_profile.collect.environment import detect_environment, require_tool
from max_profile.collect.gpu_sampling import GpuSampler, clean_child_env
from max_profile.errors import CaptureError, InputError
from max_profile.model import (
    Capture,
    Environment,
    KernelTable,
    PhaseRange,
    PreflightResult,
    RawCapture,
    RequestRecord,
    ServeRun,
    ranges_within,
)
from max_profile.util.models import check_model_folder
from max_profile.util.procs import kill_group, run_bounded

MODES = ("utilization", "kernels", "nsys", "rocprof")
KERNEL_MODES = ("kernels", "nsys", "rocprof")
"""Modes that want every kernel: device graph capture off, MAX's NVTX / roctx ranges on."""
EARLY_ERRORS = re.compile(
    r"(Error: No such option|Error: Invalid value|No such file or directory|does not exist|is not a valid|"
    r"Address already in use|address already in use|out of memory|OutOfMemory|CUDA_ERROR|No architecture found|"
    r"ABORT: |Process launch is not allowed in this state|Failed to import custom model|Traceback \(most recent call last\)|Worker crashed|ValueError:|RuntimeError:|ModuleNotFoundError:)"
)
READY_TIMEOUT_S = 900.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def max_command() -> list[str]:
    """How to run the ``max`` CLI of this interpreter's MAX."""
    exe = Path(sys.executable).with_name("max")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("max")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from max._entrypoints.pipelines import main; sys.argv[0] = 'max'; main()"]


@dataclass
class ServePlan:
    model_path: str
    devices: str
    mode: str
    duration_s: float
    port: int
    metrics_port: int
    custom_architectures: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    warm: bool = True
    prompt: str = "I believe the meaning of life is"
    max_tokens: int = 64
    vendor: str = "none"
    """The GPU vendor here: on NVIDIA the kernel modes keep MAX's device graphs (CUPTI and nsys record each kernel
    inside them); elsewhere they are turned off, as MAX's op ranges and rocprof's trace would hide graph replays."""
    profiling_mode: str = "auto"
    """MODULAR_ENABLE_PROFILING in the kernel modes: ``on`` carries MAX's scheduler ranges (the phases; it shares
    the compile cache with ``max-profile run --kernels nvtx-log``); ``detailed`` adds Python spans (another compile);
    ``off`` has no ranges (kernels are not split by phase). ``auto``: ``on`` where MAX can use it, else ``off``."""

    def resolved_profiling_mode(self) -> str:
        from max_profile.collect.nvtx_log import max_profiling_usable

        if self.profiling_mode != "auto":
            return self.profiling_mode
        return "on" if max_profiling_usable(self.devices) else "off"

    def serve_command(self) -> list[str]:
        cmd = [*max_command(), "serve", "--model-path", self.model_path, "--devices", self.devices, "--host", "127.0.0.1", "--port", str(self.port)]
        for c in self.custom_architectures:
            cmd += ["--custom-architectures", c]
        chosen = {"--device-graph-capture", "--no-device-graph-capture"} & set(self.extra_args)
        if self.mode in KERNEL_MODES and self.vendor != "nvidia" and not chosen:
            cmd.append("--no-device-graph-capture")
        return cmd + list(self.extra_args)

    def warm_command(self) -> list[str]:
        cmd = [*max_command(), "warm-cache", "--model-path", self.model_path, "--devices", self.devices]
        for c in self.custom_architectures:
            cmd += ["--custom-architectures", c]
        return cmd

    def describe(self) -> str:
        lines = [
            f"model        {self.model_path} on {self.devices}",
            f"capture      {self.mode}, {self.duration_s:g} s window, concurrency-1 load on /v1/completions (stream, {self.max_tokens} tokens/request)",
            f"ports        API {self.port}, metrics {self.metrics_port}",
        ]
        if self.warm:
            lines.append("warm pass    " + " ".join(self.warm_command()))
        if self.mode == "nsys":
            lines.append("server       nsys launch --session-new=max-profile-<pid>-<random> --trace=cuda,nvtx --cuda-graph-trace=node "
                         + " ".join(self.serve_command()))
            lines.append("window       nsys start --session=… -o <artifacts>/serve  …  nsys stop; nsys export --type sqlite; nsys shutdown")
        elif self.mode == "rocprof":
            lines.append("pass 2       " + " ".join(self.serve_command()) + "   (measures R2 = launch → /health 200, then stops)")
            lines.append("pass 3       rocprofv3 --kernel-trace --marker-trace -f csv --collection-period (R2+10):"
                         f"{self.duration_s:g}:1 -- " + " ".join(self.serve_command()))
        else:
            lines.append("server       " + " ".join(self.serve_command()))
        lines.append("cost         a cold compile takes minutes (about 2 min per shape on 2 CPU cores, 3.5 min on an H200); warm: ~10 s to /health, "
                     f"then {self.duration_s:g} s of capture")
        return "\n".join(lines)


class LoadGenerator(threading.Thread):
    """Concurrency-1 streaming completions until stopped (bounded: ``max_requests`` and a deadline)."""

    def __init__(self, port: int, model: str, prompt: str, max_tokens: int, deadline_s: float, max_requests: int = 10_000) -> None:
        super().__init__(daemon=True, name="max-profile-load")
        self.port, self.model, self.prompt, self.max_tokens = port, model, prompt, max_tokens
        self.deadline = time.monotonic() + deadline_s
        self.max_requests = max_requests
        self.stop_event = threading.Event()
        self.records: list[RequestRecord] = []

    def run(self) -> None:
        while not self.stop_event.is_set() and time.monotonic() < self.deadline and len(self.records) < self.max_requests:
            self.records.append(self.one_request())
            if not self.records[-1].ok:
                time.sleep(0.2)

    def one_request(self) -> RequestRecord:
        t_sent = time.perf_counter_ns()
        ok, tokens, ttft, gaps, error = self._request()
        return RequestRecord(started_ns=t_sent, ended_ns=time.perf_counter_ns(), ok=ok, tokens=tokens, ttft_ms=ttft, itl_ms=gaps, error=error)

    def _request(self) -> tuple[bool, int, float | None, list[float], str | None]:
        body = json.dumps({"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0, "stream": True, "ignore_eos": True})
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            t0 = time.perf_counter()
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                return False, 0, None, [], f"HTTP {resp.status}: {resp.read(300).decode(errors='replace')}"
            first: float | None = None
            last = t0
            gaps: list[float] = []
            tokens = 0
            for raw in resp:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                now = time.perf_counter()
                tokens += 1
                if first is None:
                    first = now
                else:
                    gaps.append((now - last) * 1e3)
                last = now
                if self.stop_event.is_set() and time.monotonic() > self.deadline:
                    break
            conn.close()
            return True, tokens, (first - t0) * 1e3 if first else None, gaps, None
        except (OSError, http.client.HTTPException) as exc:
            return False, 0, None, [], f"{type(exc).__name__}: {exc}"


MAX_LOG_LINE = 500


def scan_server_log(text: str, last: int = 5) -> list[str]:
    """The last ``last`` lines of a server log that show an early error (bad flag, missing model, OOM, port in use...).

    Telemetry noise is skipped; each line is cut to MAX_LOG_LINE characters (a log can hold anything).
    """
    lines = [ln.strip()[:MAX_LOG_LINE] for ln in text.splitlines() if len(ln) < 100_000 and EARLY_ERRORS.search(ln)]
    return [ln for ln in lines if "telemetry" not in ln.lower()][-last:]


class ServerProcess:
    """``max serve`` in its own process group and TMPDIR, with its log in that folder."""

    def __init__(self, cmd: list[str], env: dict[str, str], workdir: Path) -> None:
        self.cmd = cmd
        self.workdir = workdir
        self.log_path = workdir / "server.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=str(workdir), start_new_session=True)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def early_errors(self) -> list[str]:
        return scan_server_log(self.log_text())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        kill_group(self.proc, grace_s=10)
        self._log.close()


def wait_ready(server: ServerProcess, port: int, timeout_s: float, progress: Callable[[str], None]) -> float:
    """Seconds to /health 200. Fails at once when the process dies or its log shows an early error."""
    t0 = time.monotonic()
    announced = 0.0
    while True:
        if not server.alive():
            lines = server.early_errors() or server.log_text().strip().splitlines()[-5:]
            raise CaptureError(f"the server exited (code {server.proc.returncode}) before it was ready: " + " | ".join(lines))
        errors = [ln for ln in server.early_errors() if "Traceback" not in ln or len(server.early_errors()) == 1]
        if errors and time.monotonic() - t0 > 1.0:
            time.sleep(1.0)  # let the traceback's last line reach the log
            raise CaptureError("the server log shows an error before it was ready: " + " | ".join(server.early_errors()))
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return time.monotonic() - t0
        except (OSError, http.client.HTTPException):
            pass
        elapsed = time.monotonic() - t0
        if elapsed > timeout_s:
            raise CaptureError(f"/health did not answer 200 within {timeout_s:.0f} s (server still starting: a cold compile?)")
        if elapsed - announced > 15:
            announced = elapsed
            progress(f"waiting for /health ({elapsed:.0f} s)")
        time.sleep(0.25)


def _server_env(plan: ServePlan, tmpdir: Path, extra: dict[str, str]) -> dict[str, str]:
    env = clean_child_env(
        {
            "TMPDIR": str(tmpdir),
            "MAX_SERVE_METRICS_ENDPOINT_PORT": str(plan.metrics_port),
            "OTEL_SDK_DISABLED": "true",
            "HF_HUB_OFFLINE": "1",
            "MODULAR_ENABLE_PROFILING": plan.resolved_profiling_mode() if plan.mode in KERNEL_MODES else os.environ.get("MODULAR_ENABLE_PROFILING", "off"),
        }
    )
    env.update(extra)
    return env


@contextlib.contextmanager
def _own_tmpdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="max-profile-serve-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_serve_capture(plan: ServePlan, *, confirm: bool | Callable[[ServePlan], bool], progress: Callable[[str], None] = lambda m: None,
                      ready_timeout_s: float = READY_TIMEOUT_S, artifacts_dir: str | None = None) -> RawCapture:
    """Run the plan (see the module docstring) and return what it recorded.

    Bad plans raise :class:`InputError`, a missing profiler :class:`ToolMissingError`, a server or
    profiler that fails :class:`CaptureError`; nothing is left running in any case.
    """
    from max_profile.preflight import preflight_gate

    check_model_folder(plan.model_path)
    if plan.mode not in MODES:
        raise InputError(f"unknown --mode {plan.mode!r}: use {' or '.join(MODES)}")
    if not plan.duration_s > 0:
        raise InputError("--duration must be > 0 seconds")
    for port in (plan.port, plan.metrics_port):
        if port_in_use(port):
            raise InputError(f"port {port} is already in use on 127.0.0.1: pick another --port (or leave it out for a free one)")
    env = detect_environment(check_tools=False)
    profiler = _profiler_for(plan.mode, env.vendor)
    if plan.mode in KERNEL_MODES and plan.profiling_mode == "auto" and plan.resolved_profiling_mode() == "off":
        from max_profile.collect.nvtx_log import MAX_GPU_NVTX_PROBLEM

        progress(f"MODULAR_ENABLE_PROFILING=off: {MAX_GPU_NVTX_PROBLEM}; kernels are recorded but not split by phase")
    ok = confirm(plan) if callable(confirm) else confirm
    if not ok:
        raise InputError("not confirmed: nothing was started (pass --yes, or confirm=True in the API)")
    preflight = preflight_gate(plan.custom_architectures, plan.model_path, serve=True, progress=progress)
    with _own_tmpdir() as tmp:
        if plan.warm:
            _warm_pass(plan, tmp, ready_timeout_s, progress)
        if plan.mode == "nsys":
            assert profiler is not None
            return _capture_nsys(plan, env, preflight, tmp, profiler, ready_timeout_s, progress, artifacts_dir)
        if plan.mode == "rocprof":
            assert profiler is not None
            return _capture_rocprof(plan, env, preflight, tmp, profiler, ready_timeout_s, progress, artifacts_dir)
        return _capture_in_worker(plan, env, preflight, tmp, ready_timeout_s, progress, artifacts_dir)


def _profiler_for(mode: str, vendor: str) -> str | None:
    """The profiler binary a mode needs, checked before anything starts (wrong vendor, missing tool)."""
    need = {"nsys": ("nsys", "nvidia", "NVIDIA"), "rocprof": ("rocprofv3", "amd", "AMD")}.get(mode)
    if need is None:
        return None
    tool, want, label = need
    if vendor != want:
        other = "--mode rocprof" if want == "nvidia" else "--mode nsys"
        raise InputError(f"--mode {mode} needs an {label} GPU; this machine has {vendor if vendor != 'none' else 'no GPU'} "
                         f"(use --mode kernels for MAX's op ranges on any device{', or ' + other if vendor in ('nvidia', 'amd') else ''})")
    return require_tool(tool, f"--mode {mode}")


def _warm_pass(plan: ServePlan, tmp: Path, timeout_s: float, progress: Callable[[str], None]) -> None:
    progress("warm pass (fills the compile cache): " + " ".join(plan.warm_command()))
    warm = subprocess.Popen(plan.warm_command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=_server_env(plan, tmp, {}), start_new_session=True)
    try:
        _, err = warm.communicate(timeout=timeout_s)
    except BaseException:
        kill_group(warm)
        raise
    if warm.returncode != 0:
        lines = [ln for ln in err.decode(errors="replace").strip().splitlines() if ln.strip()]
        tail = [ln for ln in lines if EARLY_ERRORS.search(ln)][-3:] or lines[-3:]
        raise CaptureError(f"the warm pass failed (exit {warm.returncode}): " + " | ".join(tail))


def _watch_window(server: ServerProcess, until: float) -> None:
    """Sleep until ``until`` (monotonic), failing at once if the server dies."""
    while time.monotonic() < until:
        if not server.alive():
            raise CaptureError(f"the server died during the capture window (exit {server.proc.returncode}): "
                             + " | ".join(server.early_errors() or server.log_text().strip().splitlines()[-3:]))
        time.sleep(0.1)


class _Window:
    """Load + GPU sampling around a capture window; always torn down."""

    def __init__(self, plan: ServePlan) -> None:
        self.plan = plan
        self.load = LoadGenerator(plan.port, plan.model_path, plan.prompt, plan.max_tokens, deadline_s=plan.duration_s + 120)
        self.sampler: GpuSampler | None = None

    def start_load(self) -> None:
        self.load.start()

    def start_load_ahead(self) -> None:
        """Start the load and let it run a moment, so the window opens on a server already busy."""
        self.load.start()
        time.sleep(min(2.0, self.plan.duration_s / 4))

    def start_sampling(self) -> None:
        self.sampler = GpuSampler(0.1)
        self.sampler.start()

    def finish(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        self.load.stop_event.set()
        self.load.join(timeout=70)

    def abort(self) -> None:
        self.load.stop_event.set()
        if self.sampler is not None and self.sampler.running:
            self.sampler.stop(failed=True)


def _capture_in_worker(plan: ServePlan, env: Environment, preflight: list[PreflightResult], tmp: Path, ready_timeout_s: float,
                       progress: Callable[[str], None], artifacts_dir: str | None) -> RawCapture:
    """utilization / kernels: the window is bounded by max_profile itself (and the worker hook)."""
    extra_env: dict[str, str] = {}
    nvtx_template = None
    cupti_dir = tmp / "cupti"
    if plan.mode == "kernels" and plan.resolved_profiling_mode() != "off":
        from max_profile.collect.nvtx_log import build_injection_library
        from max_profile.errors import ToolMissingError

        try:
            nvtx_template = str(tmp / "nvtx-%p.log")
            extra_env.update({"NVTX_INJECTION64_PATH": build_injection_library(), "MAX_PROFILE_NVTX_LOG": nvtx_template})
        except ToolMissingError as exc:
            progress(f"no NVTX log ({exc})")
    if plan.mode == "kernels" and env.vendor == "nvidia":
        cupti_dir.mkdir()
        from max_profile.collect.cupti_native import build_cupti_library
        from max_profile.errors import MaxProfileError

        try:  # built here, once, so the worker's prepare step only loads it
            extra_env["MAX_PROFILE_CUPTI_RING_LIB"] = build_cupti_library()
        except MaxProfileError as exc:
            progress(f"the C CUPTI recorder is unavailable ({exc}); the worker falls back to cupti-python (slower, said in the report)")
        hook = str(Path(__file__).parent / "collect" / "worker_hook")
        extra_env.update({"MAX_PROFILE_WORKER_CUPTI_DIR": str(cupti_dir), "PYTHONPATH": hook + os.pathsep + os.environ.get("PYTHONPATH", ""),
                          # launch records serve the attribution to MAX's scheduler ranges, which need profiling on
                          "MAX_PROFILE_WORKER_CUPTI_LAUNCHES": "1" if plan.resolved_profiling_mode() != "off" else "0"})
    cmd = plan.serve_command()
    progress("starting: " + " ".join(cmd))
    server = ServerProcess(cmd, _server_env(plan, tmp, extra_env), tmp)
    window = _Window(plan)
    raw = _new_raw(plan, env, preflight, cmd)
    try:
        ready_s = wait_ready(server, plan.port, ready_timeout_s, progress)
        progress(f"/health 200 after {ready_s:.1f} s; load and {plan.duration_s:g} s capture window")
        if cupti_dir.exists():
            progress(_prepare_worker_hook(cupti_dir, server))
        window.start_load_ahead()
        window.start_sampling()
        if cupti_dir.exists():
            (cupti_dir / "start").touch()
        w0 = time.perf_counter_ns()
        _watch_window(server, time.monotonic() + plan.duration_s)
        w1 = time.perf_counter_ns()
        if cupti_dir.exists():
            (cupti_dir / "stop").touch()
        window.finish()
        if plan.mode == "kernels":
            _collect_worker_kernels(raw, tmp, nvtx_template, cupti_dir, (w0, w1), server)
        saved = _keep_artifacts(tmp, artifacts_dir)
    finally:
        window.abort()
        server.stop()
    return _finish_raw(raw, plan, window, ready_s, (w0, w1), saved.get("server.log"), list(saved.values()))


def _new_raw(plan: ServePlan, env: Environment, preflight: list[PreflightResult], cmd: list[str]) -> RawCapture:
    profiling = plan.resolved_profiling_mode() if plan.mode in KERNEL_MODES else None
    capture = Capture(started_unix_s=time.time(), target="max serve", model_path=plan.model_path, devices=plan.devices,
                      device_graph_capture="--device-graph-capture" in plan.extra_args if plan.mode in KERNEL_MODES else True,
                      profiling_mode=profiling, collectors=[f"serve:{plan.mode}"],
                      phase_markers="MAX scheduler ranges" if profiling not in (None, "off") else None)
    return RawCapture(environment=env, capture=capture, preflight=list(preflight), serve=ServeRun(mode=plan.mode, port=plan.port, commands=[cmd]))


def _finish_raw(raw: RawCapture, plan: ServePlan, window: _Window, ready_s: float, span: tuple[int, int], log_copy: str | None,
                artifacts: list[str]) -> RawCapture:
    assert raw.serve is not None
    raw.serve = ServeRun(mode=raw.serve.mode, port=raw.serve.port, time_to_ready_s=ready_s, commands=raw.serve.commands, server_log=log_copy)
    raw.capture.ended_unix_s = time.time()
    raw.window_ns = span
    raw.requests = list(window.load.records)
    raw.artifacts = [*raw.artifacts, *artifacts]
    sampler = window.sampler
    if sampler is None or sampler.unavailable is not None:
        raw.utilization_unavailable = sampler.unavailable.reason if sampler and sampler.unavailable else "GPU sampling did not run"
    else:
        raw.samples = sampler.samples
        raw.sample_interval_s = sampler.interval_s
        raw.sample_source = f"{sampler.source} (serve window)"
    return raw


def _artifacts_folder(artifacts_dir: str | None, name: str) -> Path:
    dest = Path(artifacts_dir) if artifacts_dir else Path.cwd() / name
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def _capture_nsys(plan: ServePlan, env: Environment, preflight: list[PreflightResult], tmp: Path, nsys: str, ready_timeout_s: float,
                  progress: Callable[[str], None], artifacts_dir: str | None) -> RawCapture:
    """nsys launch / start / stop / shutdown with a unique session; the report is kept and read back."""
    from max_profile.collect import serve_profilers as sp
    from max_profile.collect.nsys import export_sqlite, note_graph_replays, read_nsys_sqlite
    from max_profile.errors import TraceFormatError

    tool_env = _server_env(plan, tmp, {})
    stale = sp.clean_stale_nsys_sessions(nsys, tool_env)
    if stale:
        progress("shut down stale max-profile nsys sessions: " + ", ".join(stale))
    session = sp.nsys_session_name()
    dest = _artifacts_folder(artifacts_dir, session)
    rep_base = str(dest / "serve")
    cmd = sp.nsys_launch_command(nsys, session, plan.serve_command())
    progress("starting: " + " ".join(cmd))
    server = ServerProcess(cmd, tool_env, tmp)
    window = _Window(plan)
    raw = _new_raw(plan, env, preflight, cmd)
    collecting = False
    try:
        ready_s = wait_ready(server, plan.port, ready_timeout_s, progress)
        progress(f"/health 200 after {ready_s:.1f} s; load, then nsys start for {plan.duration_s:g} s")
        window.start_load_ahead()
        rc, out = run_bounded(sp.nsys_start_command(nsys, session, rep_base), tool_env, timeout_s=120)
        if rc != 0:
            raise CaptureError(f"`nsys start --session={session}` failed (exit {rc}): {out.strip()[-300:]}")
        collecting = True
        window.start_sampling()
        w0 = time.perf_counter_ns()
        _watch_window(server, time.monotonic() + plan.duration_s)
        w1 = time.perf_counter_ns()
        progress("nsys stop (writes the report; can take a minute)")
        rc, out = run_bounded(sp.nsys_stop_command(nsys, session), tool_env)
        collecting = False
        window.finish()
        if rc != 0:
            raise CaptureError(f"`nsys stop --session={session}` failed (exit {rc}): {out.strip()[-300:]}")
    finally:
        window.abort()
        if collecting:
            run_bounded(sp.nsys_stop_command(nsys, session), tool_env, timeout_s=120)
        run_bounded(sp.nsys_shutdown_command(nsys, session), tool_env, timeout_s=60)
        server.stop()
        _keep_artifacts(tmp, str(dest))
    rep = rep_base + ".nsys-rep"
    why = sp.verify_artifact(rep, "nsys-rep")
    if why:
        raise CaptureError(f"nsys wrote no usable report: {why}")
    sqlite_path = rep_base + ".sqlite"
    why = export_sqlite(nsys, rep, sqlite_path, env=tool_env) or sp.verify_artifact(sqlite_path, "sqlite")
    if why:
        raw.kernels_unavailable = f"the nsys report could not be read back: {why}"
    else:
        try:
            trace = read_nsys_sqlite(sqlite_path)
            raw.kernels, raw.ranges, raw.range_names = trace.kernels, trace.ranges, trace.all_range_names
            raw.kernel_clock = "trace"
            raw.kernel_source = "nsys (max serve)"
            note_graph_replays(raw, trace)
        except TraceFormatError as exc:
            raw.kernels_unavailable = f"the nsys report could not be read back: {exc}"
    artifacts = [f"{rep}  (open with: nsys-ui {rep})", sqlite_path, str(dest / "server.log")]
    return _finish_raw(raw, plan, window, ready_s, (w0, w1), str(dest / "server.log"), artifacts)


def _capture_rocprof(plan: ServePlan, env: Environment, preflight: list[PreflightResult], tmp: Path, rocprof: str, ready_timeout_s: float,
                     progress: Callable[[str], None], artifacts_dir: str | None) -> RawCapture:
    """The three-pass rocprofv3 routine: (warm done) → R2 = launch to /health → profile with the window at R2 + 10 s."""
    from max_profile.collect import serve_profilers as sp
    from max_profile.collect.rocprof import rocprof_csv_capture
    from max_profile.errors import TraceFormatError

    plain = plan.serve_command()
    progress("pass 2: measuring launch → /health (R2): " + " ".join(plain))
    probe = ServerProcess(plain, _server_env(plan, tmp, {}), tmp)
    try:
        r2 = wait_ready(probe, plan.port, ready_timeout_s, progress)
    finally:
        probe.stop()
    delay = r2 + sp.ROCPROF_WINDOW_DELAY_S
    dest = _artifacts_folder(artifacts_dir, f"max-profile-rocprof-{os.getpid()}-{int(time.time())}")
    out_dir = dest / "rocprof"
    cmd = sp.rocprof_command(rocprof, str(out_dir), delay, plan.duration_s, plain)
    progress(f"pass 3: R2 = {r2:.1f} s, window {delay:.1f}–{delay + plan.duration_s:.1f} s after launch: " + " ".join(cmd))
    server = ServerProcess(cmd, _server_env(plan, tmp, {}), tmp)
    launched = time.monotonic()
    window = _Window(plan)
    raw = _new_raw(plan, env, preflight, cmd)
    try:
        ready_s = wait_ready(server, plan.port, ready_timeout_s, progress)
        window.start_load()
        _watch_window(server, launched + delay)
        window.start_sampling()
        w0 = time.perf_counter_ns()
        _watch_window(server, launched + delay + plan.duration_s)
        w1 = time.perf_counter_ns()
        _watch_window(server, time.monotonic() + 1.0)  # let the collection period close
        window.finish()
    finally:
        window.abort()
        server.stop()  # SIGTERM to the group: rocprofv3's tool writes its files at exit
        _keep_artifacts(tmp, str(dest))
    csv_path = sp.find_rocprof_kernel_csv(out_dir)
    why = sp.verify_artifact(csv_path, "rocprof-csv", min_bytes=64) if csv_path else f"no *kernel_trace.csv under {out_dir}"
    if why:
        raw.kernels_unavailable = f"rocprofv3 wrote no usable kernel trace: {why}"
    else:
        try:
            trace = rocprof_csv_capture(str(csv_path))
            raw.kernels, raw.ranges, raw.kernel_clock, raw.kernel_source = trace.kernels, trace.ranges, "trace", "rocprofv3 (max serve)"
            raw.notes += trace.notes
        except TraceFormatError as exc:
            raw.kernels_unavailable = f"the rocprofv3 kernel trace could not be read: {exc}"
    artifacts = [str(csv_path or out_dir), str(dest / "server.log")]
    return _finish_raw(raw, plan, window, ready_s, (w0, w1), str(dest / "server.log"), artifacts)


def _collect_worker_kernels(raw: RawCapture, tmp: Path, nvtx_template: str | None, cupti_dir: Path, window: tuple[int, int],
                            server: ServerProcess) -> None:
    """Kernels (or ops) the model worker ran in the window, with MAX's scheduler ranges as phases, into ``raw``."""
    from max_profile.collect.nvtx_log import read_nvtx_log

    deadline = time.monotonic() + 20
    dumps: list[Path] = []
    if cupti_dir.exists():
        while time.monotonic() < deadline and not list(cupti_dir.glob("kernels-*.json")) and server.alive():
            time.sleep(0.2)
        dumps = list(cupti_dir.glob("kernels-*.json"))
    ranges: list[PhaseRange] = []
    ops: list[KernelTable] = []
    for path in tmp.glob("nvtx-*.log"):
        try:
            log = read_nvtx_log(path)
        except (OSError, ValueError):
            continue
        ranges += ranges_within(log.phase_ranges(), window)
        ops.append(log.op_table().within(window))
    raw.ranges = ranges
    if dumps:
        tables = [KernelTable.from_json(p.read_bytes(), str(p)).within(window) for p in dumps]
        kernels = KernelTable.concat(tables)
        if len(kernels):
            coverage, callback_s = _coverage(cupti_dir, window)
            raw.kernels, raw.kernel_source, raw.tracer_callback_s = kernels, "cupti (model worker" + coverage + ")", callback_s
            return
    op_table = KernelTable.concat(ops)
    if len(op_table):
        raw.kernels, raw.kernel_source = op_table, "nvtx-log (model worker ops, host time)"
        return
    if nvtx_template is None and not dumps:
        return
    raw.kernels_unavailable = "the model worker recorded no kernels or op ranges in the window (MODULAR_ENABLE_PROFILING must reach the worker)"


def _prepare_worker_hook(cupti_dir: Path, server: ServerProcess, timeout_s: float = 30.0) -> str:
    """Ask the worker hooks to import CUPTI now (before the window) and wait for one to be ready.

    Processes without the CUDA driver loaded (API server, metrics worker) skip; the answer is a
    progress line: which process is ready, or why none is.
    """
    (cupti_dir / "prepare").touch()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.alive():
        ready = sorted(p.name.removeprefix("ready-") for p in cupti_dir.glob("ready-*"))
        if ready:
            return f"CUPTI ready in process {', '.join(ready)} (the ones with the CUDA driver loaded)"
        failed = list(cupti_dir.glob("unavailable-*.txt"))
        if failed:
            return f"CUPTI unavailable in the model worker ({failed[0].read_text().strip()}); kernels will be missing"
        time.sleep(0.05)
    skipped = len(list(cupti_dir.glob("skipped-*.txt")))
    return f"no process answered as CUPTI-ready within {timeout_s:g} s ({skipped} without the CUDA driver skipped); kernels may be missing"


def _coverage(cupti_dir: Path, window: tuple[int, int]) -> tuple[str, float | None]:
    """How much of the window the worker's CUPTI recording covered, records it dropped, and the
    seconds its buffer callbacks took while recording (None when not reported)."""
    for path in cupti_dir.glob("coverage-*.json"):
        try:
            c = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        window_s = (window[1] - window[0]) / 1e9
        covered = (min(c["stopped_ns"], window[1]) - max(c["started_ns"], window[0])) / 1e9
        dropped = f", {c['dropped']} dropped" if c.get("dropped") else ""
        if c.get("collector") == "CuptiKernelCollector":
            dropped += ", cupti-python per-record callbacks"
        if "callback_s" not in c:
            return f", recorded {covered:.1f} of {window_s:.1f} s{dropped}", None
        cost = f", {c['callback_s']:.2f} s in CUPTI callbacks for {c.get('api_records', 0)} API records"
        return f", recorded {covered:.1f} of {window_s:.1f} s{dropped}{cost}", float(c["callback_s"])
    return "", None


def _keep_artifacts(tmp: Path, artifacts_dir: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    if not artifacts_dir:
        return out
    dest = Path(artifacts_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("server.log",):
        src = tmp / name
        if src.exists() and src.stat().st_size > 0:
            shutil.copy2(src, dest / name)
            out[name] = str(dest / name)
    return out
