"""Every output of a capture behind one interface, in one registry the CLI and the Python API loop over.

An :class:`Output` writes one file (or export) from a :class:`~max_profile.model.Report` and, where it needs the
kernels themselves, the :class:`~max_profile.model.RawCapture` it was built from. Before any capture runs,
:func:`check_outputs` probes that each requested path can be written and that each output's libraries import, so a
read-only folder or a missing package fails in a second, not after minutes of compile and capture.

    from max_profile.render.outputs import write_outputs
    write_outputs(prof.report, prof.raw_capture, json="r.json", html="r.html", perfetto="t.pftrace", raw="raw.json.gz")
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from max_profile.errors import InputError, ToolMissingError

if TYPE_CHECKING:
    from max_profile.model import RawCapture, Report, RequestRecord, ToolStatus
from max_profile.util.files import write_output

# each writer imports its renderer when it runs: the CLI's parser reads this registry (``max-profile --help``)


@dataclass(frozen=True)
class Output:
    """One output: its name (the CLI flag and keyword), what it writes, what it needs."""

    name: str
    help: str
    write: Callable[[Report, RawCapture | None, str], str]
    """(report, raw or None, path) -> the line that says where it went."""
    modules: tuple[str, ...] = ()
    """Modules it imports (checked before a capture)."""
    install: str = ""
    needs_raw: bool = False
    """Needs the raw capture (every kernel), not only the report."""
    takes_path: bool = True
    """False for exports that go to an endpoint (OTel)."""


def _requests(raw: RawCapture | None) -> Sequence[RequestRecord]:
    return raw.requests if raw is not None else ()


def _text(report: Report, raw: RawCapture | None, path: str) -> str:
    from max_profile.render.text import render_text

    write_output(path, render_text(report).encode())  # the terminal's width, as the CLI prints it (COLUMNS=N sets it)
    return f"text report written to {path}"


def _json(report: Report, raw: RawCapture | None, path: str) -> str:
    report.save(path)
    return f"report written to {path}"


def _raw(report: Report, raw: RawCapture | None, path: str) -> str:
    assert raw is not None
    raw.save(path)
    return f"raw capture (steps, kernels, samples) written to {path}"


def _html(report: Report, raw: RawCapture | None, path: str) -> str:
    from max_profile.render.html import render_html

    write_output(path, render_html(report).encode())
    return f"HTML report written to {path} (open it in a browser: file://{os.path.abspath(path)})"


def _perfetto(report: Report, raw: RawCapture | None, path: str) -> str:
    assert raw is not None
    from max_profile.render.perfetto import write_perfetto

    write_perfetto(raw, path)
    return f"Perfetto trace written to {path} (open it at https://ui.perfetto.dev)"


def _prometheus(report: Report, raw: RawCapture | None, path: str) -> str:
    from max_profile.render.telemetry import prometheus_text

    write_output(path, prometheus_text(report, requests=_requests(raw)).encode())
    return f"Prometheus metrics written to {path} (text exposition format)"


def _otel(report: Report, raw: RawCapture | None, path: str) -> str:
    from max_profile.render.telemetry import export_otel, otlp_providers_from_env

    export = otlp_providers_from_env()
    export_otel(
        report, meter_provider=export.meter_provider, tracer_provider=export.tracer_provider, requests=_requests(raw)
    )
    export.finish()
    return f"OpenTelemetry metrics and spans exported to {export.endpoint}"


_BASE = "pip install 'max-profile'   (a dependency of max-profile is missing: reinstall it)"
OUTPUTS: tuple[Output, ...] = (
    Output(
        "raw",
        "also write the raw capture (.gz to compress); `max-profile report PATH` rebuilds the report",
        _raw,
        ("msgspec",),
        _BASE,
        needs_raw=True,
    ),
    Output("text", "also write the text report (what is printed, without colour) to a file", _text, ("rich",), _BASE),
    Output("json", "write the analysed report as JSON", _json, ("msgspec",), _BASE),
    Output(
        "html",
        "write the report as one self-contained HTML page (plots inlined, works offline)",
        _html,
        ("bokeh",),
        "pip install 'bokeh>=3.4'",
    ),
    Output(
        "perfetto",
        "write a Perfetto trace (steps, every kernel per stream, launches, GPU counters)",
        _perfetto,
        ("perfetto.protos.perfetto.trace.perfetto_trace_pb2",),
        "pip install 'perfetto>=0.11'",
        needs_raw=True,
    ),
    Output(
        "prometheus",
        "write the figures as Prometheus exposition text (node_exporter textfile collector)",
        _prometheus,
        ("prometheus_client",),
        "pip install 'prometheus-client>=0.20'",
    ),
    Output(
        "otel",
        "export the figures and spans over OTLP to OTEL_EXPORTER_OTLP_ENDPOINT (OTEL_* variables as usual)",
        _otel,
        ("opentelemetry.sdk.metrics", "opentelemetry.exporter.otlp.proto.http.metric_exporter"),
        "pip install 'opentelemetry-sdk>=1.30' 'opentelemetry-exporter-otlp-proto-http>=1.30' "
        "'opentelemetry-exporter-otlp-proto-grpc>=1.30'",
        takes_path=False,
    ),
)
"""Written in this order; OTel last, so an export failure comes after every file is on disk."""
BY_NAME = {o.name: o for o in OUTPUTS}


def probe_writable(path: str, what: str) -> None:
    """The file ``path`` can be created: its folder exists, is a folder, and accepts a new file (a read-only mount,
    missing permissions or a full disk fail here, before any capture). :class:`InputError` naming the path."""
    p = Path(path).expanduser()
    folder = p.resolve().parent
    if p.is_dir():
        raise InputError(f"{what} {path}: is a folder; give a file name")
    if not folder.is_dir():
        raise InputError(f"{what} {path}: the folder {folder} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{p.name}.", suffix=".probe"):
            pass
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot write in {folder} ({exc.strerror or exc})") from exc
    if p.exists() and not os.access(p, os.W_OK):
        raise InputError(f"{what} {path}: the file exists and is not writable")


def missing_modules(output: Output) -> list[str]:
    """Modules an output needs that do not import here."""
    missing = []
    for name in output.modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def check_outputs(requested: dict[str, str | bool | None]) -> None:
    """Before any capture: every requested output's path writable (exit 2) and its libraries importable (exit 3, the
    install command named); the OTLP endpoint configured."""
    for name, target in requested.items():
        if not target:
            continue
        output = BY_NAME[name]
        missing = missing_modules(output)
        if missing:
            raise ToolMissingError(
                f"--{name} needs {', '.join(missing)}, which does not import here. Install: {output.install}"
            )
        if output.takes_path and isinstance(target, str):
            probe_writable(target, f"--{name}")
        if name == "otel":
            from max_profile.render.telemetry import otlp_settings

            otlp_settings()  # a missing endpoint is said now, not after a capture of minutes


def write_outputs(
    report: Report,
    capture: RawCapture | None = None,
    *,
    progress: Callable[[str], None] = lambda line: None,
    **targets: str | bool | None,
) -> list[str]:
    """Write every requested output (``text="r.txt"``, ``json="r.json"``, ``html=...``, ``perfetto=...``, ``raw=...``,
    ``prometheus=...``,
    ``otel=True``) in registry order; returns the lines saying where each went."""
    unknown = set(targets) - set(BY_NAME)
    if unknown:
        raise InputError(f"unknown output(s) {', '.join(sorted(unknown))}: use {', '.join(BY_NAME)}")
    lines = []
    for output in OUTPUTS:
        target = targets.get(output.name)
        if not target:
            continue
        if output.needs_raw and capture is None:
            raise InputError(
                f"{output.name} needs the raw capture the report was built from (pass capture=, or --raw of the run)"
            )
        line = output.write(report, capture, target if isinstance(target, str) else "")
        progress(line)
        lines.append(line)
    return lines


def output_checks() -> list[ToolStatus]:
    """Each output and whether its libraries import here (``max-profile doctor``), with the install command when not."""
    from max_profile.model import ToolStatus

    checks = []
    for output in OUTPUTS:
        missing = missing_modules(output)
        checks.append(
            ToolStatus(
                name=f"--{output.name}",
                path=None if missing else "ready",
                problem=f"needs {', '.join(missing)}" if missing else None,
                install_hint=output.install if missing else None,
            )
        )
    return checks
