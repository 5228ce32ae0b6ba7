"""Where the minutes before the first token go, recorded in-process around a MAX load.

Four sources, all MAX's own or max_profile's marks:

* max_profile's marks around each step of the load (imports, config and tokenizer, the pipeline factory, the device
  graph capture, the warm-up and its first token), process start from the kernel (``psutil``);
* MAX's ``CompilationTimer`` log lines (logger ``max.pipelines``): ``Building / Compiling / Initializing <graph> took X
  seconds`` per graph, and ``Jenga KV manager: ... = SIZE (per device)`` for the KV-cache allocation;
* the engine's compile / init totals over the whole load (``max.engine._compilation_stats.collect_compilation_stats``),
  which also count graphs compiled outside a named timer;
* MAX's compile-cache log (``MODULAR_ENABLE_CACHE_LOGGING=1``, on the process's native stderr, kept out of the
  terminal): ``findSyncImpl: cache hit`` / ``miss`` per compiled graph (``.max_cache/mof/mef``) and per kernel.

Equivalent by hand: ``MODULAR_ENABLE_CACHE_LOGGING=1 max generate --model-path P ... 2>&1 | grep -E 'took|cache
hit|miss'``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from max_profile.collect.probes.compile_key import append_ledger, explain_cache, ledger_path, read_ledger
from max_profile.model import StartupPhase, StartupProfile
from max_profile.model.tags import StartupSource

CACHE_LOG_ENV = "MODULAR_ENABLE_CACHE_LOGGING"
CACHE_PREFIX = "[modular-cache]"
MAX_KEPT_LINES = 20_000

WEIGHTS_INIT_MIN_S = 0.05
"""An initialize shorter than this moved no weights (a CPU keeps them mapped in host memory): no bytes or GB/s for
it."""
_TIMER = re.compile(
    r"^(Building|Compiling|Initializing|Building, compiling, and initializing) (.+?)(?: graph)? took ([\d.]+) seconds$"
)
_TIMER_START = re.compile(r"^Building, compiling, and initializing (.+)\.\.\.$")
_KV = re.compile(r"KV manager: .*?= ([\d.]+) (KiB|MiB|GiB|TiB) \(per device\)")
_HIT = re.compile(r"findSyncImpl: cache hit: (\d+) bytes from (\S+)")
_MISS = re.compile(r"findSyncImpl: miss, file not found: (\S+)")
_WRITE = re.compile(r"insertSyncImpl: write success: (\S+)")
_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


@dataclass(frozen=True)
class TimedLine:
    t: float
    """Unix time it was seen."""
    text: str


@dataclass(frozen=True)
class CacheEvent:
    t: float
    kind: str
    """``hit``, ``miss`` or ``write``."""
    path: str
    bytes: int = 0

    @property
    def graph(self) -> bool:
        """A whole compiled graph (MAX's MEF cache), not one kernel or Mojo transform."""
        return "/.max_cache/" in self.path


def parse_cache_line(t: float, text: str) -> CacheEvent | None:
    """A ``[modular-cache]`` line as an event (None for the configuration chatter)."""
    if m := _HIT.search(text):
        return CacheEvent(t, "hit", m.group(2), int(m.group(1)))
    if m := _MISS.search(text):
        return CacheEvent(t, "miss", m.group(1))
    if m := _WRITE.search(text):
        return CacheEvent(t, "write", m.group(1))
    return None


def kv_bytes(text: str) -> int | None:
    """Bytes per device of MAX's ``Jenga KV manager: ... = 1.06 MiB (per device)`` line."""
    m = _KV.search(text)
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


class NativeStderr:
    """Capture the process's file descriptor 2 (native code writes there: MAX's cache log, compiler errors) through a
    pipe, keep its lines with their time, and pass every line through to the real stderr except MAX's cache chatter."""

    def __init__(self) -> None:
        self.lines: list[TimedLine] = []
        self._saved: int | None = None
        self._thread: threading.Thread | None = None
        self._read_fd: int | None = None

    def __enter__(self) -> NativeStderr:
        import sys

        try:
            sys.stderr.flush()
            saved = os.dup(2)
            read_fd, write_fd = os.pipe()
            os.dup2(write_fd, 2)
            os.close(write_fd)
        except OSError:
            return self  # no fd 2 to capture (an embedding app): nothing captured, nothing broken
        self._saved, self._read_fd = saved, read_fd
        self._thread = threading.Thread(target=self._pump, name="max-profile-stderr", daemon=True)
        self._thread.start()
        return self

    def _pump(self) -> None:
        assert self._read_fd is not None and self._saved is not None
        saved = self._saved  # kept: __exit__ forgets it while a child may still write through the pipe
        pending = b""
        with os.fdopen(self._read_fd, "rb", buffering=0) as reader:
            while True:
                chunk = reader.read(65536)
                if not chunk:
                    break
                pending += chunk
                *complete, pending = pending.split(b"\n")
                now = time.time()
                out = []
                for raw in complete:
                    text = raw.decode("utf-8", errors="replace")
                    if len(self.lines) < MAX_KEPT_LINES:
                        self.lines.append(TimedLine(now, text))
                    if not text.startswith(CACHE_PREFIX):
                        out.append(raw + b"\n")
                if out:
                    with contextlib.suppress(OSError):
                        os.write(saved, b"".join(out))
            if pending and not pending.startswith(CACHE_PREFIX.encode()):
                with contextlib.suppress(OSError):
                    os.write(saved, pending)

    def __exit__(self, *exc: object) -> None:
        import sys

        if self._saved is None:
            return
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(self._saved, 2)  # our end of the pipe closes here: the pump sees EOF once no child holds it
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._thread is None or not self._thread.is_alive():
            os.close(self._saved)
        # else: a child started during the load (MAX's compile workers) still holds the pipe; the pump keeps
        # forwarding its lines to the real stderr through the saved descriptor, which stays open for it
        self._saved = None


class MaxLogCapture(logging.Handler):
    """MAX's INFO records of ``max.pipelines`` (its compile timers and KV-cache lines), kept with their time.

    While capturing, the logger is lowered to INFO; records below the level it had go to this handler only (its own
    handlers are held at the old level, and only records at or above it travel on to the parent loggers), so nothing
    is printed that was not printed before. Everything is restored on exit."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.lines: list[TimedLine] = []
        self._logger = logging.getLogger("max.pipelines")
        self._threshold = logging.WARNING
        self._saved: tuple[int, bool, list[tuple[logging.Handler, int]]] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.lines) < MAX_KEPT_LINES:
            self.lines.append(TimedLine(record.created, record.getMessage()))
        if record.levelno >= self._threshold and self._logger.parent is not None:
            self._logger.parent.handle(record)  # what propagation would have done at the old level

    def __enter__(self) -> MaxLogCapture:
        lg = self._logger
        self._threshold = lg.getEffectiveLevel()
        if self._threshold <= logging.INFO:
            lg.addHandler(self)  # INFO already flows: just listen (propagation stays as it is)
            self._saved = None
            return self
        self._saved = (lg.level, lg.propagate, [(h, h.level) for h in lg.handlers])
        for h in lg.handlers:
            if h.level < self._threshold:
                h.setLevel(self._threshold)
        lg.setLevel(logging.INFO)
        lg.propagate = False
        lg.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        lg = self._logger
        lg.removeHandler(self)
        if self._saved is not None:
            level, propagate, handlers = self._saved
            lg.setLevel(level)
            lg.propagate = propagate
            for h, hl in handlers:
                h.setLevel(hl)


@dataclass
class Mark:
    name: str
    start: float
    end: float
    detail: str | None = None


def modular_cache_dir() -> Path | None:
    """MAX's compile cache folder: ``MODULAR_CACHE_DIR``, else XDG's cache folder (``~/.cache/modular``)."""
    explicit = os.environ.get("MODULAR_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "modular"


def cache_files(folder: Path | None) -> dict[str, tuple[int, float]]:
    """{path: (size, mtime)} of every compiled graph and kernel in the cache folder (empty when there is none)."""
    out: dict[str, tuple[int, float]] = {}
    if folder is None or not folder.is_dir():
        return out
    for sub in (".max_cache", ".mogg_cache"):
        for root, _dirs, files in os.walk(folder / sub):
            for name in files:
                path = os.path.join(root, name)
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    out[path] = (st.st_size, st.st_mtime)
    return out


@dataclass
class StartupRecorder:
    """Marks around a load; MAX's log, its cache log and the engine's compile stats while active.

    rec = StartupRecorder()
    with rec.capturing():
        with rec.mark("import MAX"): import max.pipelines
        ...
    raw.startup = startup_profile(rec, key=...)   # in max_profile.collect.startup_profile
    """

    process_start: float = field(default_factory=lambda: _process_start())
    created: float = field(default_factory=time.time)
    marks: list[Mark] = field(default_factory=list)
    log: list[TimedLine] = field(default_factory=list)
    stderr: list[TimedLine] = field(default_factory=list)
    engine_compile_s: float | None = None
    engine_init_s: float | None = None
    cache_dir: Path | None = None
    cache_before: dict[str, tuple[int, float]] = field(default_factory=dict)
    cache_after: dict[str, tuple[int, float]] = field(default_factory=dict)
    first_token: float | None = None
    failure_text: str = ""

    @contextlib.contextmanager
    def mark(self, name: str, detail: str | None = None) -> Iterator[Mark]:
        m = Mark(name, time.time(), 0.0, detail)
        try:
            yield m
        finally:
            m.end = time.time()
            self.marks.append(m)

    @contextlib.contextmanager
    def capturing(self) -> Iterator[StartupRecorder]:
        """MAX's log, its native stderr (with the cache log turned on) and the engine's compile totals, around a
        load."""
        self.cache_dir = modular_cache_dir()
        self.cache_before = cache_files(self.cache_dir)
        had = os.environ.get(CACHE_LOG_ENV)
        os.environ[CACHE_LOG_ENV] = "1"
        stats_cm = _compilation_stats()
        stats = stats_cm.__enter__() if stats_cm is not None else None
        try:
            with MaxLogCapture() as log, NativeStderr() as err:
                try:
                    yield self
                finally:
                    self.log = list(log.lines)
                    self.stderr = list(err.lines)
        finally:
            if had is None:
                os.environ.pop(CACHE_LOG_ENV, None)
            else:
                os.environ[CACHE_LOG_ENV] = had
            if stats_cm is not None:
                with contextlib.suppress(Exception):
                    stats_cm.__exit__(None, None, None)
                self.engine_compile_s = float(getattr(stats, "compile_seconds", 0.0))
                self.engine_init_s = float(getattr(stats, "init_seconds", 0.0))
            self.cache_after = cache_files(self.cache_dir)


def _compilation_stats() -> contextlib.AbstractContextManager[object] | None:
    try:
        from max.engine._compilation_stats import collect_compilation_stats
    except ImportError:
        return None
    return collect_compilation_stats()


PROGRAM_ENTRY: float | None = None
"""When the ``max-profile`` command began (set by the CLI: its package's import time), None in a user's own program."""
EXEC_GAP_S = 5.0
"""A process created this long before the command began ran another program first (a shell's ``exec``, ``sh -c "pip
install ... && max-profile startup"``): its time is not this command's start-up."""


def process_start(created: float | None, entry: float | None) -> float | None:
    """Where a start-up profile starts: the process's creation, or the command's own entry when the process ran another
    program for longer than :data:`EXEC_GAP_S` before it (an exec keeps the process and its creation time)."""
    if entry is not None and (created is None or created < entry - EXEC_GAP_S):
        return entry
    return created


def _process_start() -> float:
    created: float | None
    try:
        import psutil

        created = float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - no process table: the profile starts at the command's entry or the recorder
        created = None
    return process_start(created, PROGRAM_ENTRY) or time.time()


# ---------------------------------------------------------------------------------------------------------------------
# The recorded marks and lines turned into phases


@dataclass
class _Graph:
    name: str
    start: float
    end: float | None = None
    build: float = 0.0
    compile: float = 0.0
    init: float = 0.0
    total: float = 0.0


def graphs_from_log(lines: list[TimedLine]) -> list[_Graph]:
    """Each ``CompilationTimer`` region of MAX's log: its name, start, end and the seconds it logged per part."""
    graphs: list[_Graph] = []
    open_by_name: dict[str, _Graph] = {}
    for line in lines:
        text = line.text.strip()
        if m := _TIMER_START.match(text):
            g = _Graph(m.group(1), line.t)
            graphs.append(g)
            open_by_name[g.name] = g
        elif m := _TIMER.match(text):
            kind, name, secs = m.group(1), m.group(2), float(m.group(3))
            found = open_by_name.get(name)
            if found is None:
                continue
            if kind == "Building":
                found.build = secs
            elif kind == "Compiling":
                found.compile = secs
            elif kind == "Initializing":
                found.init = secs
            else:
                found.total, found.end = secs, line.t
                open_by_name.pop(name, None)
    return [g for g in graphs if g.end is not None]


def cache_events(lines: list[TimedLine]) -> list[CacheEvent]:
    return [e for e in (parse_cache_line(x.t, x.text) for x in lines if CACHE_PREFIX in x.text) if e is not None]


def _cache_state(events: list[CacheEvent], start: float, end: float) -> str | None:
    inside = [e for e in events if start <= e.t <= end and e.graph and e.kind in ("hit", "miss")]
    if not inside:
        return None
    kinds = {e.kind for e in inside}
    return "hit" if kinds == {"hit"} else "miss" if kinds == {"miss"} else "partial"


def _phase(name: str, seconds: float, **kw: object) -> StartupPhase:
    return StartupPhase(name=name, seconds=round(max(seconds, 0.0), 3), **kw)  # type: ignore[arg-type]


def pipeline_phases(
    start: float,
    end: float,
    lines: list[TimedLine],
    events: list[CacheEvent],
    *,
    engine_compile_s: float | None,
    weight_bytes: int | None,
    devices: int,
) -> list[StartupPhase]:
    """The pipeline factory's time split by MAX's own log: setup before the first graph (weights), each graph's build,
    compile (hit / miss) and initialize, the KV-cache allocation, the rest."""
    graphs = graphs_from_log([x for x in lines if start <= x.t <= end])
    kv_lines = [(x.t, kv_bytes(x.text)) for x in lines if start <= x.t <= end and kv_bytes(x.text) is not None]
    phases: list[StartupPhase] = []
    unnamed = max((engine_compile_s or 0.0) - sum(g.compile for g in graphs), 0.0)
    cursor = start
    first = True

    def gap(until: float, label: str) -> None:
        nonlocal first
        secs = until - cursor
        kv = next((b for t, b in kv_lines if cursor <= t <= until), None)
        if first:
            first = False
            hidden = min(unnamed, secs) if unnamed > 0.05 else 0.0
            if hidden:
                state = _cache_state(
                    [e for e in events if not any(g.start <= e.t <= (g.end or g.start) for g in graphs)], start, end
                )
                phases.append(
                    _phase(
                        "graphs built outside MAX's named timers (engine time)",
                        hidden,
                        cache=state,
                        detail="MAX logs no 'Compiling ... took' line for these; the engine timed them",
                    )
                )
            phases.append(_phase("model setup before the first graph (weights mapped, adapters)", secs - hidden))
        elif kv is not None:
            phases.append(_phase("KV cache allocation and pipeline setup", secs, bytes=kv * max(devices, 1)))
        elif secs > 0.001:
            phases.append(_phase(label, secs))

    weights_at = (
        max(graphs, key=lambda g: g.init).name if graphs else None
    )  # the graph whose initialize moves the weights
    for g in graphs:
        gap(g.start, "pipeline setup between graphs")
        state = _cache_state(events, g.start, g.end or g.start)
        phases.append(_phase(f"build {g.name} graph", g.build))
        phases.append(_phase(f"compile {g.name}", g.compile, cache=state))
        if g.name == weights_at and weight_bytes and g.init >= WEIGHTS_INIT_MIN_S:
            phases.append(
                _phase(
                    f"initialize {g.name} (weights to the device)",
                    g.init,
                    bytes=weight_bytes,
                    gb_per_s=round(weight_bytes / g.init / 1e9, 3),
                )
            )
        else:
            phases.append(_phase(f"initialize {g.name}", g.init))
        other = (g.end or g.start) - g.start - g.build - g.compile - g.init
        if other > 0.05:
            phases.append(_phase(f"{g.name}: cache lookup and other work in MAX's timer", other))
        cursor = g.end or g.start
    gap(end, "pipeline setup after the graphs")
    return phases


_MOJO_ERROR = re.compile(r"([\w./+-]+\.mojo):(\d+)(?::(\d+))?:?\s*(?:error:)?\s*(.*)")
_GPU_ARCH = re.compile(r"\b(sm_?\d{2,3}[a-z]?|gfx\d{3,4}[a-z]?)\b")


def compile_failure(lines: list[str], gpu_name: str | None = None) -> str | None:
    """A MAX compiler failure in the text a load left (its native stderr, the exception chain): the failing kernel's
    file:line and message, and the GPU architecture; None when the text shows no compiler error."""
    text = "\n".join(lines)
    if "Failed to compile" not in text and ".mojo:" not in text:
        return None
    located = [m for m in (_MOJO_ERROR.search(ln) for ln in lines if ".mojo:" in ln) if m]
    errors = [m for m in located if "error" in m.string] or located
    where = f"{errors[0].group(1).rsplit('/', 1)[-1]}:{errors[0].group(2)}" if errors else None
    message = errors[0].group(4).strip()[:200] if errors else ""
    arch_m = _GPU_ARCH.search(
        re.sub(r"\S+\.mojo\S*", " ", text)
    )  # not a folder of the kernel's path (".../gpu/sm90/matmul.mojo")
    arch = arch_m.group(1) if arch_m else None
    target = arch or gpu_name or "this device"
    parts = [f"a MAX compiler failure on {target}, not a problem in your model"]
    if where:
        parts.append(f"MAX's kernel {where}" + (f": {message}" if message else ""))
    parts.append(
        "try another weight encoding (--quantization-encoding) or batch / length settings, another GPU, and report it "
        f"to Modular (https://github.com/modular/modular/issues) with this line, the MAX version and {target}"
    )
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------------------------------
# Why a compile happened: the compile key against the ones this cache saw before


def startup_profile(
    rec: StartupRecorder,
    *,
    key: dict[str, str],
    warm_command: str,
    weight_bytes: int | None,
    devices: int,
    failure: str | None = None,
    end: float | None = None,
) -> StartupProfile:
    """The recorder's marks and MAX's lines as phases from process start to the first token (or ``end``), with the cache
    verdict and its reason (the ledger of compile keys this cache saw is read and appended)."""
    phases: list[StartupPhase] = []
    first_mark = min((m.start for m in rec.marks), default=rec.created)
    phases.append(_phase("Python start and imports before the load", first_mark - rec.process_start))
    events = cache_events(rec.stderr)
    last = first_mark
    for m in sorted(rec.marks, key=lambda x: x.start):
        if m.start - last > 0.05:
            phases.append(_phase("max_profile's own work between steps", m.start - last))
        if m.name == "pipeline":
            phases += pipeline_phases(
                m.start,
                m.end,
                rec.log,
                events,
                engine_compile_s=rec.engine_compile_s,
                weight_bytes=weight_bytes,
                devices=devices,
            )
        elif m.name == "warm-up" and rec.first_token is not None and m.start <= rec.first_token <= m.end:
            phases.append(_phase("first token (warm-up prefill)", rec.first_token - m.start))
            phases.append(_phase("rest of the warm-up generation", m.end - rec.first_token))
        else:
            phases.append(_phase(m.name, m.end - m.start, detail=m.detail))
        last = max(last, m.end)
    graph_events = [e for e in events if e.graph and e.kind in ("hit", "miss")]
    kinds = {e.kind for e in graph_events}
    new_graphs = [p for p in rec.cache_after if p not in rec.cache_before and "/.max_cache/" in p]
    if kinds:
        state = "hit" if kinds == {"hit"} else "miss" if kinds == {"miss"} else "partial"
    else:
        state = "miss" if new_graphs else "unknown"
    ledger = ledger_path(rec.cache_dir)
    reason = explain_cache(
        state, key, read_ledger(ledger), rec.cache_dir, not any("/.max_cache/" in p for p in rec.cache_before)
    )
    append_ledger(ledger, key, state)
    finish = end if end is not None else (rec.first_token if rec.first_token and rec.first_token > last else last)
    logged = sum(g.compile for g in graphs_from_log(rec.log))
    return StartupProfile(
        total_s=round(finish - rec.process_start, 3),
        phases=phases,
        cache=state,
        cache_reason=f"{state}: {reason}",
        cache_dir=str(rec.cache_dir) if rec.cache_dir else None,
        compile_key=key,
        max_logged_compile_s=round(logged, 3),
        engine_compile_s=round(rec.engine_compile_s, 3) if rec.engine_compile_s is not None else None,
        warm_cache_command=warm_command if state != "hit" else None,
        failure=failure,
    )


_LOG_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d(?:\.\d+)?) (?:[A-Z]+): ?(.*)$")
_WORKER_TOTALS = re.compile(r"Model pipeline initialized in [\d.]+s \(graph build: [\d.]+s, graph compile: ([\d.]+)s")


def timed_log_lines(text: str, launched_unix: float) -> list[TimedLine]:
    """``max serve``'s log as timed lines: ``HH:MM:SS.mmm LEVEL: message`` in local time (the date is the launch's; a
    line without a time, MAX's cache log among them, takes the time of the line before it)."""
    import datetime as dt

    day = dt.datetime.fromtimestamp(launched_unix)
    out: list[TimedLine] = []
    last = launched_unix
    for line in text.splitlines():
        m = _LOG_LINE.match(line)
        if m:
            sec = float(m.group(3))
            stamp = day.replace(
                hour=int(m.group(1)), minute=int(m.group(2)), second=int(sec), microsecond=int((sec % 1) * 1e6)
            ).timestamp()
            if stamp < launched_unix - 43200:
                stamp += 86400  # past midnight
            last = stamp
            out.append(TimedLine(stamp, m.group(4)))
        else:
            out.append(TimedLine(last, line))
    return out


def serve_startup(
    text: str,
    *,
    launched_unix: float,
    ready_unix: float,
    key: dict[str, str],
    warm_command: str,
    weight_bytes: int | None,
    devices: int,
    cache: Path | None,
    cache_was_empty: bool,
) -> StartupProfile | None:
    """``max serve``'s launch to /health 200 from its own log: the API server's start, the model worker's start
    (imports, driver), each graph (compile with cache hit or miss: the server ran with MAX's cache log on), KV cache,
    warm-up."""
    lines = timed_log_lines(text, launched_unix)
    timed = [x for x in lines if not x.text.startswith(CACHE_PREFIX)]
    if not timed:
        return None

    def when(pattern: str) -> float | None:
        return next((x.t for x in timed if pattern in x.text), None)

    phases: list[StartupPhase] = []
    marks = [
        ("server process start and imports (to MAX's first log line)", launched_unix),
        ("API server setup (task detection, configuration)", timed[0].t),
        (
            "model worker start (Python imports, driver)",
            when("Starting subprocess: Model Worker") or when("Starting worker"),
        ),
        ("pipeline", when("Initializing model pipeline")),
        ("warm-up and worker readiness", when("Model pipeline initialized in")),
        ("server ready to /health 200", when("Model worker ready")),
        ("end", ready_unix),
    ]
    present = [(name, t) for name, t in marks if t is not None]
    events = cache_events(lines)
    engine = None
    for x in timed:
        if m := _WORKER_TOTALS.search(x.text):
            engine = float(m.group(1))
    for (name, start), (_next, end) in zip(present, present[1:], strict=False):
        if name == "pipeline":
            phases += pipeline_phases(
                start, end, timed, events, engine_compile_s=engine, weight_bytes=weight_bytes, devices=devices
            )
        else:
            phases.append(_phase(name, end - start))
    graph = [e for e in events if e.graph and e.kind in ("hit", "miss")]
    kinds = {e.kind for e in graph}
    state = ("hit" if kinds == {"hit"} else "miss" if kinds == {"miss"} else "partial") if kinds else "unknown"
    ledger = ledger_path(cache)
    reason = explain_cache(state, key, read_ledger(ledger), cache, cache_was_empty)
    append_ledger(ledger, key, state)
    return StartupProfile(
        total_s=round(ready_unix - launched_unix, 3),
        phases=phases,
        cache=state,
        cache_reason=f"{state}: {reason}",
        cache_dir=str(cache) if cache else None,
        compile_key=key,
        max_logged_compile_s=round(sum(g.compile for g in graphs_from_log(timed)), 3),
        engine_compile_s=engine,
        warm_cache_command=warm_command if state != "hit" else None,
        source=StartupSource.SERVE_LOG,
        failure=compile_failure([x.text for x in lines]),
    )
