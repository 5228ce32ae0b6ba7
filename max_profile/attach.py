"""``max-profile attach URL``: a bounded, read-only look at a ``max serve`` that is already running.

Nothing about the server is started, stopped or reconfigured. Over a window of ``duration`` seconds it reads the
server's own Prometheus metrics before and after (counter and histogram deltas: requests, tokens, CE / TG batch times,
batch sizes, queue, KV-cache use, preemptions), samples the GPUs (this machine's; the ones the server's processes use
are named when it runs here), and records the host's load. ``--probe`` adds a few streaming requests of its own (client
TTFT / ITL); ``--concurrency 1,4,16`` drives a closed-loop load per level (a sweep) instead. ``--otlp PORT`` receives
the servers' own OpenTelemetry spans for the window: each forward pass and request, per replica (several URLs, or a
Collector feeding many). A server that dies in the window is reported with what was seen, and the command fails (exit
4); the server is not ours to clean up.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from max_profile.collect.probes.environment import detect_environment
from max_profile.collect.probes.model_files import read_model_config, read_model_weights
from max_profile.collect.readers.otlp import BATCH_SPAN
from max_profile.collect.readers.otlp_passes import passes_from_spans
from max_profile.collect.server.load_window import ServerTarget, ServerWindow, window_recorders
from max_profile.collect.server.otlp_receiver import OtlpReceiver, parse_listen
from max_profile.collect.server.serve_client import split_url, stream_completion
from max_profile.collect.server.serve_metrics import scrape
from max_profile.errors import InputError
from max_profile.model import Capture, RawCapture, RequestRecord, ServeRun, Unavailable
from max_profile.model.tags import Collector, TargetKind
from max_profile.util.procs import raise_pending_signal

PROBE_REQUESTS = 3
DEFAULT_METRICS_PORT = 8001
"""MAX 26.7's ``MAX_SERVE_METRICS_ENDPOINT_PORT`` default."""
TRACE_HEADERS_HOWTO = (
    "per-request kernel capture needs the server started with MAX_SERVE_KERNEL_TRACE_HEADERS=1, MAX's profiler plugin "
    "(MODULAR_PROFILER_PLUGIN=<libMAXProfilerPlugin.so>; the PyPI 26.7 wheels do not ship it) and an OTLP endpoint "
    "(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); a request with header `x-max-trace-level: kernel-sampled` then arms a "
    "capture"
)


@dataclass
class AttachPlan:
    url: str
    metrics_url: str | None = None
    duration_s: float = 10.0
    probe: bool = False
    concurrency: list[int] = field(default_factory=list)
    slo_ms: dict[str, float] = field(default_factory=dict)
    prompt: str = "I believe the meaning of life is"
    max_tokens: int = 64
    timeout_s: float = 5.0
    replicas: list[str] = field(default_factory=list)
    """Further servers (URLs) in the same window: probes go to each in turn; their passes come from the spans."""
    otlp: str | None = None
    """``[HOST:]PORT`` to receive the servers' OTLP spans on for the window (``--otlp``)."""
    otlp_save: str | None = None
    """Write every span received to this file, as a Collector's file exporter does (``max-profile report`` reads it)."""
    otlp_flush_s: float = 6.0
    """How long after the window to wait for spans still in the exporters' batches (OTel's default delay is 5 s)."""


@dataclass
class AttachResult:
    raw: RawCapture
    failure: str | None = None
    """Why the capture failed (the server died or stopped answering in the window); the raw capture holds what was
    seen."""


def _get_json(host: str, port: int, path: str, timeout_s: float) -> tuple[int, object]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read(1 << 20)
    finally:
        conn.close()
    try:
        return resp.status, json.loads(body) if body else None
    except ValueError:
        return resp.status, None


def identify_server(url: str, timeout_s: float = 5.0) -> tuple[str, str | None]:
    """(served model name, MAX version) of a running ``max serve``; :class:`InputError` when the URL is not one."""
    try:
        host, port, prefix = split_url(url)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    try:
        health, _ = _get_json(host, port, f"{prefix}/health", timeout_s)
        status, models = _get_json(host, port, f"{prefix}/v1/models", timeout_s)
    except (OSError, http.client.HTTPException) as exc:
        raise InputError(
            f"{url}: no server answers there ({type(exc).__name__}: {exc}); give the URL of a running `max serve` "
            "(http://HOST:PORT)"
        ) from exc
    data = models.get("data") if isinstance(models, dict) else None
    if (
        health != 200
        or status != 200
        or not isinstance(data, list)
        or not data
        or not isinstance(data[0], dict)
        or "id" not in data[0]
    ):
        raise InputError(
            f"{url}: not a MAX server (GET /health answered {health}, GET /v1/models {status} without a model list): "
            "give the URL of a running `max serve` (http://HOST:PORT)"
        )
    version = None
    try:
        code, doc = _get_json(host, port, f"{prefix}/version", timeout_s)
        if code == 200 and isinstance(doc, dict):
            version = str(doc.get("version")) if doc.get("version") else None
    except (OSError, http.client.HTTPException):
        pass
    return str(data[0]["id"]), version


def default_metrics_url(url: str) -> str:
    host, _port, _prefix = split_url(url)
    return f"http://{host}:{DEFAULT_METRICS_PORT}/metrics"


@dataclass(frozen=True)
class LocalServer:
    """The attached server's processes on this machine, found by the port it listens on."""

    pid: int
    """The process that holds the listening socket (the topmost, where several share it)."""
    pids: tuple[int, ...]
    """It and every process under it (the model worker among them)."""
    environ: dict[str, str]
    """Its environment's MAX and OpenTelemetry settings (what the server runs with)."""
    cmdline: str
    gpus: tuple[str, ...]


def is_this_machine(host: str) -> bool:
    """Whether ``host`` names this machine (loopback, or one of its interfaces' addresses): only then can the server be
    one of its processes."""
    import socket

    import psutil

    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    mine = {"0.0.0.0", "::"}
    try:
        mine |= {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    except (psutil.Error, OSError):
        pass
    return any(a.startswith("127.") or a == "::1" or a in mine for a in addresses)


def listening_pids(port: int) -> set[int]:
    """The processes holding a TCP socket that listens on ``port`` here (the socket's inode to the processes whose
    file descriptors hold it: ``ss -ltnp 'sport = :PORT'``); empty where none is visible to this user."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return set()
    return {c.pid for c in conns if c.pid and c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN}


def server_tree(
    holders: set[int], parent_of: dict[int, int], children_of: dict[int, list[int]]
) -> tuple[int, set[int]]:
    """The server's root and its processes from the socket's holders: the holder whose parent does not hold the socket
    too (a forked worker shares its parent's socket), then every holder and everything under them. Nothing above the
    holders is ever taken: the server's parent may be a shell, a supervisor or PID 1."""
    roots = sorted(p for p in holders if parent_of.get(p) not in holders)
    tree: set[int] = set()
    todo = list(holders)
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children_of.get(pid, []))
    return (roots or sorted(holders))[0], tree


def local_server(port: int) -> LocalServer | None:
    """The server listening on ``port`` here: its processes (by the socket, never by words in command lines), its
    environment's trace settings and the GPUs it uses (NVML's compute processes); None when no process of this machine
    visible to this user listens there."""
    import psutil

    holders = listening_pids(port)
    if not holders:
        return None
    parent_of: dict[int, int] = {}
    children_of: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["pid", "ppid"]):
        pid, ppid = int(proc.info["pid"]), int(proc.info["ppid"] or 0)
        parent_of[pid] = ppid
        children_of.setdefault(ppid, []).append(pid)
    root, tree = server_tree(holders, parent_of, children_of)
    try:
        proc = psutil.Process(root)
        # the listening process's own environment: what the server runs with (a launching shell above it may differ)
        environ = {k: v for k, v in proc.environ().items() if k.startswith(("MAX_SERVE_", "MODULAR_", "OTEL_"))}
        cmdline = " ".join(proc.cmdline())
    except (psutil.Error, OSError):
        environ, cmdline = {}, ""
    return LocalServer(root, tuple(sorted(tree)), environ, cmdline, tuple(_gpus_of(tree)))


def _gpus_of(pids: set[int]) -> list[str]:
    try:
        import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]

        pynvml.nvmlInit()
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            if any(p.pid in pids for p in procs):
                found.append(f"nv{i}")
        return found
    except Exception:  # noqa: BLE001 - no NVML: the GPUs are not named
        return []


def _alive(host: str, port: int, prefix: str, timeout_s: float) -> bool:
    try:
        code, _ = _get_json(host, port, f"{prefix}/health", timeout_s)
        return code == 200
    except (OSError, http.client.HTTPException):
        return False


def otlp_setup(endpoint: str) -> list[str]:
    """How to send a server's (or a fleet's) spans to ``endpoint``: the environment of ``max serve`` and the
    Collector exporter entry."""
    base = endpoint.removesuffix("/v1/traces")
    return [
        f"send MAX's spans here: start each server with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={endpoint} "
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf MAX_SERVE_KERNEL_TRACE_LEVEL=batch "
        "OTEL_RESOURCE_ATTRIBUTES=service.instance.id=<replica name> max serve ...",
        f"or, through a fleet's OpenTelemetry Collector, add an exporter `otlphttp/max-profile: {{endpoint: {base}}}` "
        "to its traces pipeline (`exporters: [..., otlphttp/max-profile]`)",
    ]


def _server_notes(url: str, found: LocalServer | None, several: bool) -> list[str]:
    """What the capture says of one attached server's processes here (found by its port, or not)."""
    label = f"{url}: " if several else ""
    if found is None:
        return [
            f"{label}no process of this machine (visible to this user) listens on its port: the server's CPU time is "
            f"not told apart from other load here, and GPU samples are of this machine's GPUs; {TRACE_HEADERS_HOWTO}"
        ]
    return [
        f"{label}server process {found.pid} on this machine, found by the port it listens on ({len(found.pids)} "
        "process(es) with its workers)"
        + (f", using GPU(s) {', '.join(found.gpus)}" if found.gpus else "")
        + (f": {found.cmdline[:200]}" if found.cmdline else ""),
        _trace_headers_note(found),
    ]


def run_attach(plan: AttachPlan, progress: Callable[[str], None] = lambda m: None) -> AttachResult:
    """The window(s) on the running server(s) (see the module docstring). A load (``concurrency``) drives every server
    named, each at the level's concurrency."""
    if not plan.duration_s > 0:
        raise InputError("--duration must be > 0 seconds")
    if any(c < 1 for c in plan.concurrency):
        raise InputError("--concurrency needs levels >= 1 (e.g. 1,4,16)")
    urls = [plan.url, *plan.replicas]
    if len(set(urls)) < len(urls):
        raise InputError(f"a server is named twice ({', '.join(u for u in urls if urls.count(u) > 1)}): name each once")
    model, version = identify_server(plan.url, plan.timeout_s)
    others = [(url, identify_server(url, plan.timeout_s)[0]) for url in plan.replicas]
    listen = parse_listen(plan.otlp) if plan.otlp else None
    host, port, prefix = split_url(plan.url)
    metrics_url = plan.metrics_url or default_metrics_url(plan.url)
    env = detect_environment(check_tools=False)
    notes: list[str] = []
    found = {url: local_server(split_url(url)[1]) if is_this_machine(split_url(url)[0]) else None for url in urls}
    first = scrape(metrics_url)
    if first.problem:
        notes.append(
            f"the server's metrics could not be read at {metrics_url} ({first.problem}): server-side batch times, "
            "queue and KV-cache use are missing; they need MAX_SERVE_DISABLE_TELEMETRY unset or 0 and the metrics "
            "port (MAX_SERVE_METRICS_ENDPOINT_PORT, default 8001; --metrics-url here)"
        )
    for url in urls:
        notes.extend(_server_notes(url, found[url], len(urls) > 1))
    progress(
        f"attached to {plan.url} (model {model}, MAX {version or '?'}); metrics {metrics_url}: "
        + ("unreadable" if first.problem else f"{len(first.points)} samples")
    )
    local_model = os.path.isdir(model)  # served from a local folder: its config and weights price the decode step
    capture = Capture(
        started_unix_s=time.time(),
        target=TargetKind.ATTACH.target(plan.url),
        model_path=model,
        collectors=[Collector.ATTACH],
        model_config=read_model_config(model) if local_model else None,
        model_weights=read_model_weights(model) if local_model else None,
    )
    first_found = found[plan.url]
    raw = RawCapture(
        environment=env,
        capture=capture,
        serve=ServeRun(
            mode="attach",
            port=port,
            servers=urls if len(urls) > 1 else [],
            pid=first_found.pid if first_found is not None else None,
            otlp=plan.otlp,
        ),
        slo_ms=dict(plan.slo_ms),
        notes=notes,
    )
    levels = plan.concurrency or [0]
    target = ServerTarget(host, port, model, plan.prompt, plan.max_tokens, prefix)
    targets = [target] + [
        ServerTarget(*split_url(url)[:2], name, plan.prompt, plan.max_tokens, split_url(url)[2]) for url, name in others
    ]
    server_pids = frozenset(pid for f in found.values() if f is not None for pid in f.pids)
    windows: list[ServerWindow] = []
    failure = None
    receiver = OtlpReceiver(*listen, keep_bodies=plan.otlp_save is not None) if listen else None
    try:
        if receiver is not None:
            for line in otlp_setup(receiver.endpoint):
                progress(line)
            for f in found.values():
                if f is not None:
                    notes.extend(_otlp_env_note(f, receiver.port))
        for level in levels:
            window, failure = _window(plan, targets, metrics_url, level, progress, raw, server_pids)
            windows.append(window)
            window.fill(raw)
            if failure:
                break
        raw.load_windows = [w.load_window() for w in windows]
        raw.window_ns = (windows[0].span[0], windows[-1].span[1])
        if receiver is not None:
            progress(f"waiting up to {plan.otlp_flush_s:g} s for the exporters' last spans")
            receiver.wait_past(raw.window_ns[1] + time.time_ns() - time.perf_counter_ns(), plan.otlp_flush_s)
            _spans_into(raw, receiver, [w.span for w in windows])
            if plan.otlp_save:
                bodies = receiver.save(plan.otlp_save)
                progress(f"{bodies} OTLP bodies saved to {plan.otlp_save} (max-profile report reads it)")
                raw.artifacts.append(plan.otlp_save)
    finally:
        if receiver is not None:
            receiver.stop()
    raw.requests = [r for w in windows for r in w.records]
    if not raw.samples:
        raw.utilization_unavailable = Unavailable(f"not sampled: {env.vendor_reason}")
    raw.capture.ended_unix_s = time.time()
    return AttachResult(raw=raw, failure=failure)


def _trace_headers_note(local: LocalServer) -> str:
    environ = local.environ
    if environ.get("MAX_SERVE_KERNEL_TRACE_HEADERS", "0").lower() not in ("1", "true", "yes"):
        return "per-request kernel capture is off on this server: " + TRACE_HEADERS_HOWTO
    if not environ.get("MODULAR_PROFILER_PLUGIN"):
        return (
            "the server has MAX_SERVE_KERNEL_TRACE_HEADERS on but no MODULAR_PROFILER_PLUGIN: MAX refuses per-request "
            "captures then ('Ignoring MAX_SERVE_KERNEL_TRACE_HEADERS: no profiler is available'); "
            + TRACE_HEADERS_HOWTO
        )
    endpoint = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "its OTLP endpoint"
    )
    return (
        f"the server can capture kernels per request (trace headers and profiler plugin set): a probe request with "
        f"`x-max-trace-level: kernel-sampled` sends its kernels to {endpoint}, where they are read (max_profile's "
        "--otlp receives MAX's pass and request spans, not the kernel events)"
    )


def _spans_into(raw: RawCapture, receiver: OtlpReceiver, windows: list[tuple[int, int]]) -> None:
    """The windows' passes and requests from the spans received (steps and server requests of ``raw``): only those that
    ended inside a level's window (a sweep's pauses are no level's)."""
    offset = time.time_ns() - time.perf_counter_ns()
    raw.capture.unix_minus_perf_counter_ns = offset
    spans = receiver.spans()
    passes = passes_from_spans(spans, offset, windows)
    raw.notes.append(receiver.summary())
    if not passes.steps and not passes.server_requests:
        raw.notes.append(no_passes_note(len(spans), any(s.name == BATCH_SPAN for s in spans), receiver.endpoint))
        return
    passes.fill(raw)
    raw.notes.append(
        f"{len(passes.steps)} forward passes and {len(passes.server_requests)} requests in the window from MAX's spans "
        f"({', '.join(passes.replicas)})"
    )


def no_passes_note(spans: int, batch_spans: bool, endpoint: str) -> str:
    """Why the window has no pass from MAX's spans: spans arrive but none of a pass inside it (an idle server, or
    passes outside the window), spans without ``max.batch`` at all (the trace level is off), or nothing arrived."""
    if spans and batch_spans:
        return "spans arrive; no forward pass in the window (the server ran none while it was open)"
    if spans:
        return (
            f"spans arrive ({spans}), but no max.batch span: the server exports no pass (start it with "
            "MAX_SERVE_KERNEL_TRACE_LEVEL=batch)"
        )
    return "no MAX serve span arrived for the window: " + " ".join(otlp_setup(endpoint))


def _otlp_env_note(local: LocalServer, port: int) -> list[str]:
    environ = local.environ
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
    level = environ.get("MAX_SERVE_KERNEL_TRACE_LEVEL", "off")
    problems = []
    if f":{port}" not in endpoint:
        problems.append(f"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is {endpoint or 'unset'}")
    if level not in ("batch", "op", "kernel"):
        problems.append(f"MAX_SERVE_KERNEL_TRACE_LEVEL is {level} (max.batch spans need batch or above)")
    return [f"the local server {local.pid} does not send its passes here: {'; '.join(problems)}"] if problems else []


def _window(
    plan: AttachPlan,
    targets: list[ServerTarget],
    metrics_url: str,
    concurrency: int,
    progress: Callable[[str], None],
    raw: RawCapture,
    server_pids: frozenset[int] = frozenset(),
) -> tuple[ServerWindow, str | None]:
    """One window: our own load (a sweep level) or the server's own traffic (and a few probes); read-only otherwise.
    ``server_pids``: the attached servers' processes on this machine (their load is the work observed); the load of a
    sweep level drives every one of ``targets`` at ``concurrency`` each, probes go to each in turn."""
    target = targets[0]
    recorders = window_recorders(raw.environment.vendor != "none", "", server_pids)
    window = ServerWindow(targets, concurrency, plan.duration_s, metrics_url, recorders)
    probes: list[RequestRecord] = []
    failure = None
    try:
        window.start_load(ahead=True)
        window.open()
        deadline = time.monotonic() + plan.duration_s
        while time.monotonic() < deadline:
            raise_pending_signal()
            if plan.probe and not concurrency and len(probes) < PROBE_REQUESTS * len(targets):
                to = targets[len(probes) % len(targets)]
                probes.append(stream_completion(to.host, to.port, to.model, to.prompt, to.max_tokens, prefix=to.prefix))
                if not probes[-1].ok and not _alive(to.host, to.port, to.prefix, plan.timeout_s):
                    failure = f"the server stopped answering during the window ({probes[-1].error})"
                    break
                continue
            time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))
            if not _alive(target.host, target.port, target.prefix, plan.timeout_s):
                failure = "the server stopped answering /health during the window"
                break
        window.close()
        window.finish(None if concurrency else probes)
    finally:
        window.abort()
    label = (
        f"concurrency {concurrency}" + (f" on each of {len(targets)} servers" if len(targets) > 1 else "")
        if concurrency
        else "server's own traffic" + (f" + {len(probes)} probe requests" if probes else "")
    )
    problem = window.after.problem if window.after is not None else "not read"
    progress(f"{label}: {window.summary()}, metrics {'unreadable: ' + problem if problem else 'read'}")
    return window, failure
