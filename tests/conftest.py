"""Shared fixtures: one tiny model shape, one MAX compile cache, one loaded pipeline per session.

MAX compiles each model shape (and each profiling mode) once, ~2 min on 2 cores; the cache lives
in MODULAR_CACHE_DIR (default: <repo>/.cache/modular), so later runs are warm.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
os.environ.setdefault("MODULAR_CACHE_DIR", str(REPO / ".cache" / "modular"))
os.environ.setdefault("MAX_PROFILE_CACHE", str(REPO / ".cache" / "max_profile"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# no OpenTelemetry setting of the shell that runs the suite (OTEL_SDK_DISABLED, an exporter endpoint) reaches the tests
# or the servers they start: each test that exports sets its own
for _name in [n for n in os.environ if n.startswith("OTEL_")]:
    del os.environ[_name]

_WORKER_TMP: Path | None = None


@pytest.fixture(autouse=True)
def _c_environment_back_to_os_environ() -> Iterator[None]:
    """After each test, the C environment's ``PYTHONEXECUTABLE`` / ``PYTHONPATH`` are put back to ``os.environ``'s.

    After a model load MAX 26.7's native code sets both in the C environment (see
    ``max_profile.util.procs.child_python_env``), and a child started with ``subprocess.run([sys.executable, ...])``
    inherits them: it runs the system python3 without this venv's packages. Every later test of that xdist worker that
    starts a Python child then failed (CI: ``No module named 'msgspec'`` in tests/cli/test_procs.py, after a test that
    loaded a
    model). Inside the test that loads, the product's own handling is what runs."""
    yield
    for key in ("PYTHONEXECUTABLE", "PYTHONPATH"):
        value = os.environ.get(key)
        if value is None:
            os.unsetenv(key)
        else:
            os.putenv(key, value)


@pytest.fixture(autouse=True, scope="session")
def _fresh_name_caches() -> None:
    """The kernel-name caches and the built-report cache (tests/builders.py) start empty in every test session: a
    mutation-testing run forks sessions from one process, and names classified (or reports built) by the unmutated code
    would hide a mutant (benchmarks/mutation.py)."""
    from max_profile.analyze.families import base_name, classify_kernel

    base_name.cache_clear()
    classify_kernel.cache_clear()
    from .builders import forget_built_reports

    forget_built_reports()


CAPTURE_CACHE_ENV = "MAX_PROFILE_TEST_CAPTURE_CACHE"
"""Set (by benchmarks/mutation.py) to load every recorded raw capture once, when the tests are collected, and hand the
same object to each ``RawCapture.load`` of that file: a mutation run forks one test session per mutant from a process
that collected the tests, so each child starts with the captures decoded (decoding them is most of a fast test's
time). Loading is not analysis (``max_profile/model``, never mutated); the suite passes with the cache on (checked by
the mutation script's clean run) so no test changes a shared capture in place."""


def _cache_recorded_captures() -> None:
    from max_profile.model import RawCapture

    load = RawCapture.load.__func__  # type: ignore[attr-defined]
    cache: dict[str, RawCapture] = {}

    def cached(cls: type[RawCapture], path: str) -> RawCapture:
        key = os.path.realpath(path)
        if key not in cache:
            cache[key] = load(cls, path)
        return cache[key]

    RawCapture.load = classmethod(cached)  # type: ignore[assignment, method-assign]
    for path in sorted(DATA.rglob("*_raw.json*")):
        with contextlib.suppress(Exception):  # a deliberately broken file is the test's to read
            RawCapture.load(str(path))


if os.environ.get(CAPTURE_CACHE_ENV):
    _cache_recorded_captures()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker gets its own TMPDIR (removed at its end): tests that check what a capture leaves
    in the temporary folder see only their own worker's files, not the other worker's servers."""
    global _WORKER_TMP
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        _WORKER_TMP = Path(tempfile.mkdtemp(prefix=f"max-profile-tests-{worker}-"))
        os.environ["TMPDIR"] = str(_WORKER_TMP)
        tempfile.tempdir = None  # recomputed from TMPDIR


HEAVY_FIRST = ("serve/", "cli/", "preflight/", "collect/server/", "collect/probes/", "collect/live/")
"""Folders whose modules start MAX (servers, CLI runs, model loads), in the order the run hands them out: pytest-xdist's
``--dist loadscope`` gives whole modules to the workers in collection order, so a module of minutes handed out last
leaves the other worker idle at the end. The fast analysis modules follow and fill in. Their tests carry the ``max``
marker: ``pytest -m "not max"`` is the fast suite (the analysis on recorded and generated captures)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).resolve().parent

    def rank(item: pytest.Item) -> int:
        rel = item.path.resolve().relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        return next((i for i, prefix in enumerate(HEAVY_FIRST) if rel.startswith(prefix)), len(HEAVY_FIRST))

    items.sort(key=rank)  # stable: the order inside each group is the collection's
    for item in items:
        if rank(item) < len(HEAVY_FIRST):
            item.add_marker(pytest.mark.max)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _WORKER_TMP is not None:
        shutil.rmtree(_WORKER_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from max_profile.tinymodel import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama-f32")


@pytest.fixture(scope="session")
def loaded_model(tiny_model_dir: Path) -> Iterator[object]:
    from max_profile.runner import load_model

    model = load_model(str(tiny_model_dir), devices="cpu")
    yield model
    model.close()


def error_message(stderr: str) -> str:
    """The CLI's one error: its ``max-profile: error:`` line (at most 200 characters, checked) and the indented lines
    that continue it, joined; no traceback."""
    lines = stderr.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith("max-profile: error:")]
    assert len(at) == 1 and "Traceback" not in stderr, stderr
    assert len(lines[at[0]]) <= 200, f"an error line is at most 200 characters (details go below it): {lines[at[0]]}"
    rest = []
    for line in lines[at[0] + 1 :]:
        if not line.startswith("  "):
            break
        rest.append(line.strip())
    return " ".join([lines[at[0]], *rest])


def procs_with(*texts: str) -> list[int]:
    """The processes whose command line holds every one of ``texts`` (not this one, nor a pytest process)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(text in cmd for text in texts) and "-m pytest" not in cmd:
            out.append(int(pid))
    return out


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "max_profile", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=str(REPO),
    )


pytest_plugins = ["pytester"]


@contextlib.contextmanager
def default_sigint() -> Iterator[None]:
    """Children started inside get Ctrl-C's default action even when this test run ignores SIGINT (a background job of a
    non-interactive shell, as `cmd &` in CI scripts, starts with SIGINT ignored, and children inherit it)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


class _OtlpReceiver(http.server.BaseHTTPRequestHandler):
    """A local OTLP/HTTP collector: keeps each request body by path (/v1/metrics, /v1/traces)."""

    received: dict[str, list[bytes]] = {}

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.received.setdefault(self.path, []).append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def otlp_receiver() -> Iterator[tuple[str, dict[str, list[bytes]]]]:
    _OtlpReceiver.received = {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OtlpReceiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _OtlpReceiver.received
    server.shutdown()
