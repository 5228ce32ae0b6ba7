"""Profile ``max serve``: planned, confirmed, warmed, bounded, fail-fast, and cleaned up — one lifecycle for every mode.

    max-profile serve --model-path P [--devices D] [--mode utilization|kernels|nsys|rocprof] [--duration 10]
                      [--concurrency 1,4,16] [--slo ttft=MS,itl=MS] [--yes] [-- EXTRA SERVE FLAGS]

1. Plan: the model, flags, commands and expected cost are printed; nothing starts without confirmation (``--yes``,
   a TTY answer, or ``confirm=`` in the API). Custom architectures are preflighted; a warm pass (``max warm-cache``)
   fills the compile cache.
2. The mode's recorder (:mod:`max_profile.collect.server.serve_recorders`) may wrap the launch and add to the
   environment. The server runs in its own process group and TMPDIR, on free ports (API, and metrics on
   ``MAX_SERVE_METRICS_ENDPOINT_PORT``), with ``OTEL_SDK_DISABLED=true`` (no telemetry egress; /metrics kept).
3. Fail fast: while waiting for ``/health`` the process must stay alive and its log show no early error.
4. Windows: for each concurrency level, a closed-loop streaming load, then the window: the mode's window recorder
   started, the server's /metrics read, GPU samples and host load (all one ``Recorder`` protocol, run by the shared
   ``ServerWindow``); ``duration`` seconds; everything stopped and read back.
5. Only the server's own process group is stopped; its TMPDIR is removed; artifacts are checked.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from max_profile.collect.live.nvtx_log import MAX_GPU_NVTX_PROBLEM, NVTX_V2_FIX
from max_profile.collect.probes.compile_key import compile_key, warm_cache_command
from max_profile.collect.probes.environment import detect_environment
from max_profile.collect.probes.startup import cache_files, modular_cache_dir, serve_startup
from max_profile.collect.readers.otlp_passes import passes_from_spans
from max_profile.collect.server.load_window import ServerTarget, ServerWindow, window_recorders
from max_profile.collect.server.otlp_receiver import OtlpReceiver
from max_profile.collect.server.serve_recorders import ServeRecorder
from max_profile.collect.server.server_process import EARLY_ERRORS, ServerProcess, server_tmpdir, wait_ready
from max_profile.defaults import READY_TIMEOUT_S
from max_profile.errors import CaptureError, InputError
from max_profile.model import (
    Capture,
    Environment,
    PassAgreement,
    PreflightResult,
    RawCapture,
    ServeRun,
    StartupProfile,
    Step,
    Unavailable,
    Workload,
)
from max_profile.model.tags import StepSource, TargetKind, serve_collector
from max_profile.preflight import preflight_gate
from max_profile.serve.modes import cupti_in_worker, resolve_plan
from max_profile.serve.plan import ModeContext, ResolvedServe, ServePlan
from max_profile.util.procs import die_with_parent, kill_group, raise_pending_signal

SPAN_FLUSH_S = 3.0
"""How long after the last window to wait for the server's last spans (its exporter sends every 0.2 s)."""


def run_serve_capture(
    plan: ServePlan | ResolvedServe,
    *,
    confirm: bool | Callable[[ResolvedServe], bool],
    progress: Callable[[str], None] = lambda m: None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    artifacts_dir: str | None = None,
) -> RawCapture:
    """Run the plan (see the module docstring) and return what it recorded.

    Bad plans raise :class:`InputError`, a missing profiler :class:`ToolMissingError`, a server or
    profiler that fails :class:`CaptureError`; nothing is left running in any case. ``confirm`` is asked with the
    resolved plan (its ``describe()`` is what would run).
    """
    env = detect_environment(check_tools=False)
    resolved = plan if isinstance(plan, ResolvedServe) else resolve_plan(plan, env.vendor)
    p = resolved.plan
    cupti = cupti_in_worker(p, resolved.mode)
    if resolved.records_kernels and p.profiling_mode == "auto" and resolved.profiling == "off" and not cupti:
        progress(
            f"MODULAR_ENABLE_PROFILING=off: {MAX_GPU_NVTX_PROBLEM}; the worker's passes are stamped, but no kernel or "
            f"op range is recorded ({NVTX_V2_FIX})"
        )
    ok = confirm(resolved) if callable(confirm) else confirm
    if not ok:
        raise InputError("not confirmed: nothing was started (pass --yes, or confirm=True in the API)")
    preflight = preflight_gate(p.custom_architectures, p.model_path, serve=True, progress=progress)
    with server_tmpdir() as tmp:
        if p.warm:
            warm_pass(resolved, tmp, ready_timeout_s, progress)
        context = ModeContext(env, tmp, ready_timeout_s, progress, artifacts_dir)
        recorder, dest = resolved.mode.make_recorder(resolved, context)
        raw = new_serve_raw(resolved, env, preflight)
        return serve_windows(resolved, recorder, raw, tmp, ready_timeout_s, progress, dest)


def serve_windows(
    resolved: ResolvedServe,
    recorder: ServeRecorder,
    raw: RawCapture,
    tmp: Path,
    ready_timeout_s: float,
    progress: Callable[[str], None],
    artifacts_dir: str | None,
    record: Callable[[int], bool] = lambda window: True,
) -> RawCapture:
    """The one server lifecycle: start (the recorder's command and environment), fail fast, /health, then one window per
    concurrency level (load, metrics, GPU samples, the recorder), teardown; what was recorded goes into ``raw``.

    ``record(window)`` (windows count from 1): whether the recorder runs in that window; a window it skips measures the
    same server untraced (the tracer's cost, A/B on one server: ``benchmarks/serve_ab.py``)."""
    plan, mode = resolved.plan, resolved.mode
    cmd = recorder.command(list(resolved.serve_command))

    cache_was_empty = not any("/.max_cache/" in p for p in cache_files(modular_cache_dir()))
    progress("starting: " + " ".join(cmd))
    receiver = OtlpReceiver() if resolved.spans else None
    spans_env = span_export_env(receiver.endpoint) if receiver is not None else {}
    try:
        server = ServerProcess(cmd, resolved.env_for(tmp, {**recorder.env(), **spans_env}), tmp)
    except BaseException:
        if receiver is not None:
            receiver.stop()
        raise
    recorder.launched(server.started)
    raw.serve = ServeRun(mode=plan.mode, port=plan.port, commands=[cmd])
    metrics_url = f"http://127.0.0.1:{plan.metrics_port}/metrics"
    windows: list[ServerWindow] = []
    target = ServerTarget("127.0.0.1", plan.port, plan.model_path, plan.prompt, plan.max_tokens)
    ready_s: float | None = None
    try:
        ready_s = wait_ready(server, plan.port, ready_timeout_s, progress)
        raw.startup = _serve_startup(resolved, server, ready_s, raw.environment.max_version, cache_was_empty)
        progress(
            f"/health 200 after {ready_s:.1f} s; load and {plan.duration_s:g} s capture window"
            + (f" per level ({', '.join(map(str, plan.concurrency))})" if len(plan.concurrency) > 1 else "")
        )
        recorder.ready(server, progress)
        # (concurrency, reference): the untraced reference window first, before the recorder ever ran in this server
        reference_first = resolved.reference_window and recorder.switched_per_window
        schedule = ([(plan.concurrency[0], True)] if reference_first else []) + [(c, False) for c in plan.concurrency]
        index = 0
        for concurrency, reference in schedule:
            traced = False if reference else record(index := index + 1)
            window = ServerWindow(
                [target],
                concurrency,
                plan.duration_s,
                metrics_url,
                window_recorders(True, "serve window"),
                traced=traced if mode.reference else None,
                reference=reference,
                tracer=recorder.window(index, server, progress) if traced else None,
            )
            windows.append(window)
            window.start_load(ahead=mode.load_ahead)
            window.open()
            _watch_window(server, time.monotonic() + plan.duration_s)
            window.close()
            window.finish()
            window.fill(raw)
            if reference:
                progress(f"reference window, recorder off (concurrency {concurrency}): {window.summary()}")
            elif len(plan.concurrency) > 1:
                progress(
                    f"window {index} (concurrency {concurrency}{', recorded' if traced else ''}): {window.summary()}"
                )
        if receiver is not None:
            measured = [w.span for w in windows if not w.reference] or [w.span for w in windows]
            spans_into_serve(raw, receiver, measured, progress)
        saved = _keep_artifacts(tmp, artifacts_dir)
    finally:
        for w in windows:
            w.abort()
        try:
            recorder.close()
        finally:
            server.stop()
            if receiver is not None:
                receiver.stop()
            if artifacts_dir and recorder.reads_after_teardown:
                _keep_artifacts(tmp, artifacts_dir)
    if recorder.reads_after_teardown:
        recorder.read_after_teardown(raw, windows[-1].span)
        saved = {"server.log": str(Path(artifacts_dir) / "server.log")} if artifacts_dir else {}
    return _finish_raw(raw, windows, ready_s, saved.get("server.log"), [*recorder.artifacts(), *saved.values()])


def span_export_env(endpoint: str) -> dict[str, str]:
    """The server environment that sends MAX's spans to ``endpoint``: traces on (``OTEL_SDK_DISABLED`` false), a
    ``max.batch`` span per forward pass (``MAX_SERVE_KERNEL_TRACE_LEVEL=batch``), exported within 0.2 s, and the generic
    endpoint set so MAX's metrics export goes there too rather than to Modular's collector."""
    return {
        "OTEL_SDK_DISABLED": "false",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint.removesuffix("/v1/traces"),
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=max-profile-serve",
        "MAX_SERVE_KERNEL_TRACE_LEVEL": "batch",
    }


def spans_into_serve(
    raw: RawCapture, receiver: OtlpReceiver, windows: list[tuple[int, int]], progress: Callable[[str], None]
) -> None:
    """The measured windows' passes and requests from MAX's spans (waiting for the exporters' last batches): they are
    the capture's steps where no worker hook recorded any; where it did, the hook's steps stay (its kernels are joined
    to them) and how the two agree is said."""
    offset = time.time_ns() - time.perf_counter_ns()
    receiver.wait_past(windows[-1][1] + offset, SPAN_FLUSH_S)
    spans = receiver.spans()
    passes = passes_from_spans(spans, offset, windows)
    raw.capture.unix_minus_perf_counter_ns = raw.capture.unix_minus_perf_counter_ns or offset
    raw.notes.append(receiver.summary())
    if not passes.steps:
        raw.notes.append(
            "MAX's spans arrive; no forward pass in the window"
            if spans
            else "MAX's spans: none arrived from the server (its OTLP export did not reach the receiver)"
        )
        return
    if raw.steps:
        raw.pass_agreement = span_agreement(raw.steps, passes.steps)
        raw.server_requests = list(passes.server_requests)
        return
    passes.fill(raw)
    progress(f"MAX's spans: {len(passes.steps)} forward passes, {len(passes.server_requests)} requests in the window")


def span_agreement(hook: list[Step], spans: list[Step]) -> PassAgreement:
    """How the worker hook's steps and MAX's ``max.batch`` spans of the same window agree."""

    def median_ms(steps: list[Step]) -> float | None:
        return float(np.median([s.duration_ns for s in steps])) / 1e6 if steps else None

    return PassAgreement(
        hook_steps=len(hook),
        hook_prefill=sum(s.phase == "prefill" for s in hook),
        hook_decode=sum(s.phase == "decode" for s in hook),
        hook_median_ms=median_ms(hook),
        span_passes=len(spans),
        span_prefill=sum(s.phase == "prefill" for s in spans),
        span_decode=sum(s.phase == "decode" for s in spans),
        span_median_ms=median_ms(spans),
    )


def _serve_startup(
    resolved: ResolvedServe, server: ServerProcess, ready_s: float, max_version: str | None, cache_was_empty: bool
) -> StartupProfile | None:
    """Launch to /health 200 from the server's own log (see
    :func:`max_profile.collect.probes.startup.serve_startup`)."""
    plan, weights = resolved.plan, resolved.model_weights
    common = {
        "model_path": plan.model_path,
        "devices": plan.devices,
        "profiling": resolved.profiling,
        "device_graphs": resolved.device_graphs,
        "max_batch_size": None,
        "max_length": None,
        "encoding": None,
        "custom_architectures": list(plan.custom_architectures),
    }
    return serve_startup(
        server.log_text(),
        launched_unix=server.started_unix,
        ready_unix=server.started_unix + ready_s,
        key=compile_key(**common, max_version=max_version),  # type: ignore[arg-type]
        warm_command=warm_cache_command(**common),  # type: ignore[arg-type]
        weight_bytes=sum(g.bytes for g in weights.groups.values()) if weights and weights.groups else None,
        devices=1,
        cache=modular_cache_dir(),
        cache_was_empty=cache_was_empty,
    )


def new_serve_raw(resolved: ResolvedServe, env: Environment, preflight: list[PreflightResult]) -> RawCapture:
    """The raw capture a served run fills: the machine, the plan's settings and model, the preflight's results."""
    plan = resolved.plan
    profiling = resolved.profiling if resolved.records_kernels else None
    capture = Capture(
        started_unix_s=time.time(),
        target=TargetKind.SERVE,
        model_path=plan.model_path,
        devices=plan.devices,
        device_graph_capture=resolved.device_graphs,
        profiling_mode=profiling,
        collectors=[serve_collector(plan.mode)],
        model_config=resolved.model_config,
        model_weights=resolved.model_weights,
        phase_markers=StepSource.WORKER
        if resolved.mode.worker_steps
        else StepSource.SCHEDULER
        if profiling not in (None, "off")
        else None,
        workload=Workload(
            prompt=plan.prompt, max_new_tokens=plan.max_tokens, custom_architectures=list(plan.custom_architectures)
        ),
    )
    return RawCapture(environment=env, capture=capture, preflight=list(preflight), slo_ms=dict(plan.slo_ms))


def _finish_raw(
    raw: RawCapture, windows: list[ServerWindow], ready_s: float | None, log_copy: str | None, artifacts: list[str]
) -> RawCapture:
    assert raw.serve is not None
    raw.serve = ServeRun(
        mode=raw.serve.mode,
        port=raw.serve.port,
        time_to_ready_s=ready_s,
        commands=raw.serve.commands,
        server_log=log_copy,
    )
    raw.capture.ended_unix_s = time.time()
    measured = [w for w in windows if not w.reference] or windows  # the reference window is only the tracer's yardstick
    raw.window_ns = (measured[0].span[0], measured[-1].span[1])
    raw.requests = [r for w in measured for r in w.records]
    raw.load_windows = [w.load_window() for w in windows]
    raw.artifacts = [*raw.artifacts, *artifacts]
    if raw.samples:  # each window filled its GPU samples and host load (the last, a measured one, wins) as it ended
        raw.utilization_unavailable = None  # some windows sampled; a window that could not is said by its absence
    elif raw.utilization_unavailable is None:
        raw.utilization_unavailable = Unavailable("GPU sampling did not run")
    return raw


def warm_pass(resolved: ResolvedServe, tmp: Path, timeout_s: float, progress: Callable[[str], None]) -> None:
    """``max warm-cache`` of the plan's model and settings (the server's environment): the compile cache filled."""
    progress("warm pass (fills the compile cache): " + " ".join(resolved.warm_command))
    warm = subprocess.Popen(
        list(resolved.warm_command),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=resolved.env_for(tmp, {}),
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )
    try:
        raise_pending_signal()
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
        raise_pending_signal()
        if not server.alive():
            raise CaptureError(
                f"the server died during the capture window (exit {server.proc.returncode}): "
                + " | ".join(server.early_errors() or server.log_text().strip().splitlines()[-3:])
            )
        time.sleep(0.1)


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
