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

import argparse
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from max_profile.collect.gpu_sampling import GpuSampler
from max_profile.model import Capture, Report, ServeSummary, Unavailable
from max_profile.procs import kill_group

MODES = ("utilization", "kernels", "nsys", "rocprof")
KERNEL_MODES = ("kernels", "nsys", "rocprof")
"""Modes that want every kernel: device graph capture off, MAX's NVTX / roctx ranges on."""
EARLY_ERRORS = re.compile(
    r"(Error: No such option|Error: Invalid value|No such file or directory|does not exist|is not a valid|"
    r"Address already in use|address already in use|out of memory|OutOfMemory|CUDA_ERROR|No architecture found|"
    r"ABORT: |Process launch is not allowed in this state|Failed to import custom model|Traceback \(most recent call last\)|Worker crashed|ValueError:|RuntimeError:|ModuleNotFoundError:)"
)
READY_TIMEOUT_S = 900.0


class ServeError(RuntimeError):
    """A serve capture that could not go on; the message says why (with the server's log lines)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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
        if self.mode in KERNEL_MODES and "--device-graph-capture" not in self.extra_args:
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
            lines.append("server       nsys launch --session-new=max-profile-<pid>-<random> --trace=cuda,nvtx " + " ".join(self.serve_command()))
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


@dataclass
class RequestRecord:
    ttft_ms: float | None
    itl_ms: list[float]
    tokens: int
    ok: bool
    error: str | None = None
    started_ns: int = 0
    """perf_counter_ns when the request was sent, and when its stream ended (the window keeps overlapping ones)."""
    ended_ns: int = 0


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
        record = self._request()
        record.started_ns, record.ended_ns = t_sent, time.perf_counter_ns()
        return record

    def _request(self) -> RequestRecord:
        body = json.dumps({"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0, "stream": True, "ignore_eos": True})
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            t0 = time.perf_counter()
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                return RequestRecord(None, [], 0, False, f"HTTP {resp.status}: {resp.read(300).decode(errors='replace')}")
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
            return RequestRecord((first - t0) * 1e3 if first else None, gaps, tokens, True)
        except (OSError, http.client.HTTPException) as exc:
            return RequestRecord(None, [], 0, False, f"{type(exc).__name__}: {exc}")


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
        lines = [ln.strip() for ln in self.log_text().splitlines() if EARLY_ERRORS.search(ln)]
        return [ln for ln in lines if "telemetry" not in ln.lower()][-5:]

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
            raise ServeError(f"the server exited (code {server.proc.returncode}) before it was ready: " + " | ".join(lines))
        errors = [ln for ln in server.early_errors() if "Traceback" not in ln or len(server.early_errors()) == 1]
        if errors and time.monotonic() - t0 > 1.0:
            time.sleep(1.0)  # let the traceback's last line reach the log
            raise ServeError("the server log shows an error before it was ready: " + " | ".join(server.early_errors()))
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return time.monotonic() - t0
        except (OSError, http.client.HTTPException):
            pass
        elapsed = time.monotonic() - t0
        if elapsed > timeout_s:
            raise ServeError(f"/health did not answer 200 within {timeout_s:.0f} s (server still starting: a cold compile?)")
        if elapsed - announced > 15:
            announced = elapsed
            progress(f"waiting for /health ({elapsed:.0f} s)")
        time.sleep(0.25)


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if len(values) else None


def _server_env(plan: ServePlan, tmpdir: Path, extra: dict[str, str]) -> dict[str, str]:
    from max_profile.collect.gpu_sampling import clean_child_env

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
                      ready_timeout_s: float = READY_TIMEOUT_S, artifacts_dir: str | None = None) -> Report:
    """Run the plan (see the module docstring); raises :class:`ServeError` with the reason on any failure."""
    from max_profile.collect.environment import detect_environment
    from max_profile.tinymodel import is_model_folder

    problem = is_model_folder(plan.model_path)
    if problem:
        raise ServeError(problem)
    if plan.mode not in MODES:
        raise ServeError(f"unknown --mode {plan.mode!r}: use {' or '.join(MODES)}")
    for port in (plan.port, plan.metrics_port):
        if port_in_use(port):
            raise ServeError(f"port {port} is already in use on 127.0.0.1: pick another --port (or leave it out for a free one)")
    env = detect_environment(check_tools=False)
    profiler = _profiler_for(plan.mode, env.vendor)
    if plan.mode in KERNEL_MODES and plan.profiling_mode == "auto" and plan.resolved_profiling_mode() == "off":
        from max_profile.collect.nvtx_log import MAX_GPU_NVTX_PROBLEM

        progress(f"MODULAR_ENABLE_PROFILING=off: {MAX_GPU_NVTX_PROBLEM}; kernels are recorded but not split by phase")
    ok = confirm(plan) if callable(confirm) else confirm
    if not ok:
        raise ServeError("not confirmed: nothing was started (pass --yes, or confirm=True in the API)")
    preflight = []
    for spec in plan.custom_architectures:
        from max_profile.preflight import check_architecture

        result = check_architecture(spec, model_path=plan.model_path, serve=True)
        preflight.append(result)
        if not result.ok:
            bad = next(c for c in result.checks if not c.ok and c.severity == "error")
            raise ServeError(f"custom architecture {spec} fails preflight: {bad.message}")
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
    from max_profile.collect.environment import tool_status

    need = {"nsys": ("nsys", "nvidia", "NVIDIA"), "rocprof": ("rocprofv3", "amd", "AMD")}.get(mode)
    if need is None:
        return None
    tool, want, label = need
    if vendor != want:
        other = "--mode rocprof" if want == "nvidia" else "--mode nsys"
        raise ServeError(f"--mode {mode} needs an {label} GPU; this machine has {vendor if vendor != 'none' else 'no GPU'} "
                         f"(use --mode kernels for MAX's op ranges on any device{', or ' + other if vendor in ('nvidia', 'amd') else ''})")
    st = tool_status(tool)
    if not st.usable or not st.path:
        raise ServeError(f"{tool} is needed for --mode {mode}: {st.problem}. Install: {st.install_hint}", exit_code=3)
    return st.path


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
        raise ServeError(f"the warm pass failed (exit {warm.returncode}): " + " | ".join(tail))


def _watch_window(server: ServerProcess, until: float) -> None:
    """Sleep until ``until`` (monotonic), failing at once if the server dies."""
    while time.monotonic() < until:
        if not server.alive():
            raise ServeError(f"the server died during the capture window (exit {server.proc.returncode}): "
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
        if self.sampler is not None and self.sampler._recorder is not None:
            self.sampler.stop(failed=True)


def _capture_in_worker(plan: ServePlan, env: Any, preflight: list[Any], tmp: Path, ready_timeout_s: float, progress: Callable[[str], None],
                       artifacts_dir: str | None) -> Report:
    """utilization / kernels: the window is bounded by max_profile itself (and the worker hook)."""
    extra_env: dict[str, str] = {}
    nvtx_template = None
    cupti_dir = tmp / "cupti"
    if plan.mode == "kernels" and plan.resolved_profiling_mode() != "off":
        from max_profile.collect.nvtx_log import NvtxInjectionUnavailable, build_injection_library

        try:
            nvtx_template = str(tmp / "nvtx-%p.log")
            extra_env.update({"NVTX_INJECTION64_PATH": build_injection_library(), "MAX_PROFILE_NVTX_LOG": nvtx_template})
        except NvtxInjectionUnavailable as exc:
            progress(f"no NVTX log ({exc})")
    if plan.mode == "kernels" and env.vendor == "nvidia":
        cupti_dir.mkdir()
        hook = str(Path(__file__).parent / "collect" / "worker_hook")
        extra_env.update({"MAX_PROFILE_WORKER_CUPTI_DIR": str(cupti_dir), "PYTHONPATH": hook + os.pathsep + os.environ.get("PYTHONPATH", ""),
                          # launch records serve the attribution to MAX's scheduler ranges, which need profiling on
                          "MAX_PROFILE_WORKER_CUPTI_LAUNCHES": "1" if plan.resolved_profiling_mode() != "off" else "0"})
    cmd = plan.serve_command()
    progress("starting: " + " ".join(cmd))
    server = ServerProcess(cmd, _server_env(plan, tmp, extra_env), tmp)
    window = _Window(plan)
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
        kernels_raw = _collect_worker_kernels(tmp, nvtx_template, cupti_dir, (w0, w1), server)
        saved = _keep_artifacts(tmp, artifacts_dir)
    finally:
        window.abort()
        server.stop()
    return _report(plan, env, preflight, window.load.records, ready_s, (w0, w1), window.sampler, kernels_raw, cmd, saved.get("server.log"), list(saved.values()))


def _artifacts_folder(artifacts_dir: str | None, name: str) -> Path:
    dest = Path(artifacts_dir) if artifacts_dir else Path.cwd() / name
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def _capture_nsys(plan: ServePlan, env: Any, preflight: list[Any], tmp: Path, nsys: str, ready_timeout_s: float, progress: Callable[[str], None],
                  artifacts_dir: str | None) -> Report:
    """nsys launch / start / stop / shutdown with a unique session; the report is kept and read back."""
    from max_profile.analyze.breakdown import build_breakdown
    from max_profile.collect import serve_profilers as sp
    from max_profile.collect.nsys import NsysFormatError, read_nsys_sqlite

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
    collecting = False
    try:
        ready_s = wait_ready(server, plan.port, ready_timeout_s, progress)
        progress(f"/health 200 after {ready_s:.1f} s; load, then nsys start for {plan.duration_s:g} s")
        window.start_load_ahead()
        rc, out = sp.run_bounded(sp.nsys_start_command(nsys, session, rep_base), tool_env, timeout_s=120)
        if rc != 0:
            raise ServeError(f"`nsys start --session={session}` failed (exit {rc}): {out.strip()[-300:]}")
        collecting = True
        window.start_sampling()
        w0 = time.perf_counter_ns()
        _watch_window(server, time.monotonic() + plan.duration_s)
        w1 = time.perf_counter_ns()
        progress("nsys stop (writes the report; can take a minute)")
        rc, out = sp.run_bounded(sp.nsys_stop_command(nsys, session), tool_env)
        collecting = False
        window.finish()
        if rc != 0:
            raise ServeError(f"`nsys stop --session={session}` failed (exit {rc}): {out.strip()[-300:]}")
    finally:
        window.abort()
        if collecting:
            sp.run_bounded(sp.nsys_stop_command(nsys, session), tool_env, timeout_s=120)
        sp.run_bounded(sp.nsys_shutdown_command(nsys, session), tool_env, timeout_s=60)
        server.stop()
        _keep_artifacts(tmp, str(dest))
    rep = rep_base + ".nsys-rep"
    why = sp.verify_artifact(rep, "nsys-rep")
    if why:
        raise ServeError(f"nsys wrote no usable report: {why}")
    sqlite_path = rep_base + ".sqlite"
    rc, out = sp.run_bounded([nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", sqlite_path, rep], tool_env, timeout_s=600)
    why = sp.verify_artifact(sqlite_path, "sqlite") if rc == 0 else f"`nsys export` failed (exit {rc}): {out.strip()[-300:]}"
    kernels: Any
    if why:
        kernels = Unavailable(f"the nsys report could not be read back: {why}")
    else:
        try:
            trace = read_nsys_sqlite(sqlite_path)
            kernels = build_breakdown(trace.kernels, source="nsys (max serve)", ranges=trace.ranges)
        except NsysFormatError as exc:
            kernels = Unavailable(f"the nsys report could not be read back: {exc}")
    artifacts = [f"{rep}  (open with: nsys-ui {rep})", sqlite_path, str(dest / "server.log")]
    return _report(plan, env, preflight, window.load.records, ready_s, (w0, w1), window.sampler, kernels, cmd, str(dest / "server.log"), artifacts)


def _capture_rocprof(plan: ServePlan, env: Any, preflight: list[Any], tmp: Path, rocprof: str, ready_timeout_s: float,
                     progress: Callable[[str], None], artifacts_dir: str | None) -> Report:
    """The three-pass rocprofv3 routine: (warm done) → R2 = launch to /health → profile with the window at R2 + 10 s."""
    from max_profile.collect import serve_profilers as sp
    from max_profile.collect.imports import ImportFormatError, import_trace

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
    kernels: Any
    if why:
        kernels = Unavailable(f"rocprofv3 wrote no usable kernel trace: {why}")
    else:
        try:
            kernels = import_trace(str(csv_path)).kernels
        except ImportFormatError as exc:
            kernels = Unavailable(f"the rocprofv3 kernel trace could not be read: {exc}")
    artifacts = [str(csv_path or out_dir), str(dest / "server.log")]
    return _report(plan, env, preflight, window.load.records, ready_s, (w0, w1), window.sampler, kernels, cmd, str(dest / "server.log"), artifacts)


def _collect_worker_kernels(tmp: Path, nvtx_template: str | None, cupti_dir: Path, window: tuple[int, int], server: ServerProcess) -> Any:
    """Kernels (or ops) the model worker ran in the window, with MAX's scheduler ranges as phases."""
    from max_profile.analyze.breakdown import build_breakdown
    from max_profile.model import KernelRecord

    lo, hi = window
    deadline = time.monotonic() + 20
    dumps: list[Path] = []
    if cupti_dir.exists():
        while time.monotonic() < deadline and not list(cupti_dir.glob("kernels-*.json")) and server.alive():
            time.sleep(0.2)
        dumps = list(cupti_dir.glob("kernels-*.json"))
    if nvtx_template is None and not dumps:
        return None
    from max_profile.collect.nvtx_log import read_nvtx_log

    ranges = []
    ops: list[KernelRecord] = []
    for path in tmp.glob("nvtx-*.log"):
        try:
            log = read_nvtx_log(path)
        except (OSError, ValueError):
            continue
        ranges += [r for r in log.phase_ranges() if lo <= r.start_ns <= hi]
        ops += [k for k in log.op_records() if lo <= k.start_ns <= hi]
    if dumps:
        import msgspec

        kernels = [k for p in dumps for k in msgspec.json.decode(p.read_bytes(), type=list[KernelRecord]) if lo <= (k.launch_ns or k.start_ns) <= hi]
        if kernels:
            coverage, overhead_pct = _coverage(cupti_dir, window)
            breakdown = build_breakdown(kernels, source="cupti (model worker" + coverage + ")", ranges=ranges)
            return msgspec.structs.replace(breakdown, tracer_overhead_pct=overhead_pct)
    if ops:
        return build_breakdown(ops, source="nvtx-log (model worker ops, host time)", ranges=ranges)
    return Unavailable("the model worker recorded no kernels or op ranges in the window (MODULAR_ENABLE_PROFILING must reach the worker)")


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
    share of the window its buffer callbacks took (None when not reported)."""
    import json

    for path in cupti_dir.glob("coverage-*.json"):
        try:
            c = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        window_s = (window[1] - window[0]) / 1e9
        covered = (min(c["stopped_ns"], window[1]) - max(c["started_ns"], window[0])) / 1e9
        dropped = f", {c['dropped']} dropped" if c.get("dropped") else ""
        if "callback_s" not in c:
            return f", recorded {covered:.1f} of {window_s:.1f} s{dropped}", None
        cost = f", {c['callback_s']:.2f} s in CUPTI callbacks for {c.get('api_records', 0)} API records"
        return f", recorded {covered:.1f} of {window_s:.1f} s{dropped}{cost}", 100.0 * c["callback_s"] / max(window_s, 1e-9)
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


def _report(plan: ServePlan, env: Any, preflight: list[Any], records: list[RequestRecord], ready_s: float, window: tuple[int, int],
            sampler: Any, kernels: Any, cmd: list[str], log_copy: str | None, artifacts: list[str]) -> Report:
    from max_profile import __version__
    from max_profile.analyze.plan import next_measurement
    from max_profile.analyze.rules import evaluate
    from max_profile.analyze.utilization import summarize_gpus, window_samples
    from max_profile.model import UtilizationSection

    # the load runs longer than the window (warm-up, profiler start / stop): keep what overlapped it
    records = [r for r in records if r.ended_ns >= window[0] and r.started_ns <= window[1]] or records
    good = [r for r in records if r.ok]
    ttft = [r.ttft_ms for r in good if r.ttft_ms is not None]
    itl = [g for r in good for g in r.itl_ms]
    window_s = (window[1] - window[0]) / 1e9
    tokens = sum(r.tokens for r in good)
    itl_p50 = _pct(itl, 50)
    summary = ServeSummary(
        mode=plan.mode, port=plan.port, window_s=window_s, requests=len(records), failed_requests=len(records) - len(good), output_tokens=tokens,
        ttft_ms_p50=_pct(ttft, 50), ttft_ms_p90=_pct(ttft, 90), itl_ms_p50=itl_p50, itl_ms_p90=_pct(itl, 90),
        tokens_per_s=(1e3 / itl_p50) if itl_p50 else None, time_to_ready_s=ready_s, commands=[cmd], server_log=log_copy,
    )
    capture = Capture(started_unix_s=time.time() - window_s, ended_unix_s=time.time(), target="max serve", model_path=plan.model_path, devices=plan.devices,
                      device_graph_capture="--device-graph-capture" in plan.extra_args, profiling_mode=plan.resolved_profiling_mode() if plan.mode in KERNEL_MODES else None,
                      collectors=[f"serve:{plan.mode}"], phase_markers="MAX scheduler ranges" if plan.mode in KERNEL_MODES and plan.resolved_profiling_mode() != "off" else None)
    report = Report(environment=env, capture=capture, preflight=preflight, serve=summary, tool_version=__version__, artifacts=artifacts)
    if sampler.unavailable is not None:
        report.utilization = sampler.unavailable
    else:
        report.utilization = UtilizationSection(source="max.profiler.gpu.BackgroundRecorder (serve window)", interval_s=0.1,
                                                gpus=summarize_gpus(window_samples(sampler.samples, window, 100_000_000)), samples=sampler.samples, window_ns=window)
    report.kernels = kernels
    if not good:
        first_error = next((r.error for r in records if r.error), "no request completed")
        report.kernels = report.kernels or Unavailable(f"no request completed in the window: {first_error}")
    report.findings = evaluate(report)
    report.next_measurement = next_measurement(report)
    return report


# ---------------------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace, progress: Any) -> int:
    from max_profile.cli import CliError, _print, _write_json

    extra = list(args.extra or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    if not args.duration > 0:
        raise CliError("--duration must be > 0 seconds")
    plan = ServePlan(model_path=args.model_path, devices=args.devices or "cpu", mode=args.mode, duration_s=args.duration,
                     port=args.port or free_port(), metrics_port=args.metrics_port or free_port(),
                     custom_architectures=list(args.custom_architectures or []), extra_args=extra, warm=not args.no_warm, max_tokens=args.max_tokens,
                     profiling_mode=args.profiling_mode)
    print("max-profile serve plan:\n" + plan.describe(), file=sys.stderr)

    def confirm(p: ServePlan) -> bool:
        if args.yes:
            return True
        if sys.stdin.isatty():
            return input("Proceed? [y/N] ").strip().lower() in ("y", "yes")
        return False

    try:
        report = run_serve_capture(plan, confirm=confirm, progress=progress, ready_timeout_s=args.ready_timeout, artifacts_dir=args.artifacts_dir)
    except ServeError as exc:
        raise CliError(str(exc), exc.exit_code) from exc
    _print(report)
    _write_json(report, args.json, progress)
    return 0


def register_cli(sub: Any) -> None:
    p = sub.add_parser("serve", help="profile `max serve`: plan, confirm, warm, capture under a concurrency-1 load, clean up")
    p.add_argument("--model-path", required=True)
    p.add_argument("--devices", help="cpu, gpu, gpu:N ... (default cpu)")
    p.add_argument("--mode", choices=MODES, default="utilization")
    p.add_argument("--duration", type=float, default=10.0, help="capture window in seconds (about 10 s shows the kernel mix)")
    p.add_argument("--port", type=int, help="API port (default: a free one)")
    p.add_argument("--metrics-port", type=int, help="Prometheus metrics port (default: a free one; MAX's own default is a fixed 8001)")
    p.add_argument("--custom-architectures", action="append", metavar="DIR")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per load request")
    p.add_argument("--profiling-mode", choices=["auto", "on", "detailed", "off"], default="auto",
                   help="MODULAR_ENABLE_PROFILING for the kernel modes (auto: on, unless MAX cannot use NVTX on this GPU)")
    p.add_argument("--no-warm", action="store_true", help="skip the warm pass (the compile cache is already filled)")
    p.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT_S, help="seconds allowed until /health answers 200")
    p.add_argument("--artifacts-dir", help="keep the server log (and captures) here")
    p.add_argument("--yes", "-y", action="store_true", help="start without asking")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="-- then extra `max serve` flags")
    p.set_defaults(func=cmd_serve)
