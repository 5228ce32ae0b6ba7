"""One matrix over every file source and one over every output, so a new one cannot ship untested.

Readers: each :data:`~max_profile.collect.readers.sources.SOURCES` entry has a seed below (the real H200 nsys export cut
down, the documented-format fakes for AMD shared with the fuzzer, small hand-written CSVs): the sniffer must pick that
source, reading must give a raw capture that analyses and renders, and the same file cut in half must be refused with
a clear error or read (never an untyped exception). Outputs: each :data:`~max_profile.render.outputs.OUTPUTS` entry
writes the H200 capture and the CPU serve sweep, and what it wrote is read back with that format's own parser.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from max_profile.analyze.report import build_report
from max_profile.collect.readers.sources import SOURCES, detect_format, import_trace
from max_profile.errors import MaxProfileError, ToolMissingError, TraceFormatError
from max_profile.model import RawCapture, Report
from max_profile.render.outputs import OUTPUTS, write_outputs
from max_profile.render.text import render_text

from .. import fuzzing
from ..conftest import DATA


def _gzipped_nsys(out: Path) -> Path:
    seed = out / "trace.sqlite.gz"
    seed.write_bytes(gzip.compress(fuzzing._trimmed_nsys(out).read_bytes()))
    return seed


def _unknown_sqlite(out: Path) -> Path:
    db = out / "other.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE customers (id INTEGER)")
    con.commit()
    con.close()
    return db


def _text(name: str, body: str) -> Callable[[Path], Path]:
    def build(out: Path) -> Path:
        (out / name).write_text(body)
        return out / name

    return build


def _bare_chrome(out: Path) -> Path:
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": f"gemv_split_k_bf16_{i % 2}",
            "ts": 12.0 + 10 * i,
            "dur": 5.0,
            "args": {"device": 0},
        }
        for i in range(20)
    ]
    (out / "trace.json").write_text(json.dumps(events))
    return out / "trace.json"


MAX_GENERATE = (
    "Note: Nsight Systems (`nsys`) not found on PATH; only Python/CPU profile will be captured.\nPrompt size: 11\n"
    "Time to first token: 12.5 ms\n=== Top 10 Python/CPU functions (50.3% of CPU time, 23.32 ms total) ===\n"
)


def _otlp_protobuf(out: Path) -> Path:
    """One OTLP protobuf body, as MAX's exporter sends it (spans made with the OpenTelemetry SDK)."""
    from ..otlp_spans import protobuf_body, served_spans

    (out / "traces.pb").write_bytes(protobuf_body(served_spans(requests=2, output_tokens=4).spans))
    return out / "traces.pb"


def _copy(src: Path, out: Path) -> Path:
    dest = out / src.name
    dest.write_bytes(src.read_bytes())
    return dest


SEEDS: dict[str, Callable[[Path], Path]] = {
    "gzipped-sqlite": _gzipped_nsys,
    "nsys-sqlite": fuzzing._trimmed_nsys,
    "rocpd": fuzzing._rocpd,
    "sqlite-unknown": _unknown_sqlite,
    "nsys-rep": _text("capture.nsys-rep", "not really a report"),
    "ncu-rep": _text("kernel.ncu-rep", "not really a report"),
    "ncu-csv": lambda out: _copy(DATA / "gpu" / "h200_llama180m_host_bound" / "small_ncu_gemv_details.csv", out),
    "rocprof-json": fuzzing._rocprof_json,
    "kineto-json": fuzzing._kineto,
    "otlp-json": lambda out: _copy(DATA / "cpu" / "tiny_llama_otlp_spans" / "spans.jsonl", out),
    "otlp-protobuf": _otlp_protobuf,
    "max-profile-json": lambda out: fuzzing._raw_capture(out)[0],
    "kineto-json-bare": _bare_chrome,
    "rocprof-kernel-csv": _text("run_kernel_trace.csv", fuzzing.ROCPROF),
    "nsys-gpu-trace-csv": fuzzing._gpu_trace_csv,
    "nsys-kern-sum-csv": fuzzing._kern_sum_csv,
    "max-generate-profile": _text("generate.txt", MAX_GENERATE),
}
"""A seed file per source."""

REFUSED = {
    "sqlite-unknown": (TraceFormatError, "neither an nsys export"),
    "nsys-rep": ((ToolMissingError, TraceFormatError), "nsys"),
    "ncu-rep": ((ToolMissingError, TraceFormatError), "ncu"),
}
"""Sources whose seed is refused on a machine without the tool (or, for one, always): the error and what it names."""

NO_KERNELS = {"max-generate-profile", "otlp-json", "otlp-protobuf"}
"""Sources that hold no kernels by nature (said as unavailable)."""
ANALYSES_ONLY = {"ncu-csv"}
"""Sources that hold per-kernel analyses (Nsight Compute), not a kernel timeline."""


def test_every_source_has_a_seed() -> None:
    assert set(SEEDS) == {s.name for s in SOURCES}, "a new Source needs a seed in tests/render/test_matrix.py"


@pytest.mark.parametrize("name", [s.name for s in SOURCES])
def test_source_is_sniffed_read_analysed_and_rendered(name: str, tmp_path: Path) -> None:
    path = SEEDS[name](tmp_path)
    assert detect_format(str(path)).name == name
    if name in REFUSED:
        errors, says = REFUSED[name]
        with pytest.raises(errors, match=says):
            import_trace(str(path))
        return
    raw = import_trace(str(path))
    assert isinstance(raw, RawCapture)
    report = build_report(raw)
    if name in NO_KERNELS:
        assert raw.kernels_unavailable is not None and report.kernels == raw.kernels_unavailable
    elif name in ANALYSES_ONLY:
        assert raw.ncu_launches and report.kernel_analyses, f"{name}: no kernel analysis read"
    else:
        assert len(raw.kernels) or raw.kernel_totals, f"{name}: no kernels read"
        assert report.kernels is not None and not hasattr(report.kernels, "reason")
    assert render_text(report)
    # the saved raw capture reads back to the same report
    raw.save(str(tmp_path / "raw.json.gz"))
    again = build_report(RawCapture.load(str(tmp_path / "raw.json.gz")))
    assert again == report


@pytest.mark.parametrize("name", [s.name for s in SOURCES if s.name not in REFUSED])
def test_source_cut_in_half_is_refused_or_read(name: str, tmp_path: Path) -> None:
    path = SEEDS[name](tmp_path)
    data = path.read_bytes()
    cut = tmp_path / f"cut{''.join(path.suffixes)}"
    cut.write_bytes(data[: len(data) // 2])
    try:
        raw = import_trace(str(cut))
    except MaxProfileError as exc:
        assert str(cut) in str(exc) or cut.name in str(exc), f"{name}: the error does not name the file: {exc}"
        return
    build_report(raw)


# --- outputs ---------------------------------------------------------------------------------
CAPTURES = {
    "h200-cupti": DATA / "gpu" / "h200_llama180m_host_bound" / "small_cupti_raw.json.gz",
    "cpu-serve-sweep": DATA / "cpu" / "serve_sweep_c1_c2_raw.json.gz",
}


def _read_back(name: str, path: Path, report: Report, received: dict[str, list[bytes]]) -> None:
    """Each output parsed by its own format's reader."""
    if name == "text":
        text = path.read_text()
        assert "Environment" in text or "environment" in text.lower()
    elif name == "json":
        assert Report.load(str(path)) == report  # equal values (an int-valued float field reads back as a float)
    elif name == "raw":
        assert build_report(RawCapture.load(str(path))).findings == report.findings
    elif name == "html":
        page = path.read_text()
        assert page.lower().startswith("<!doctype html") and "</html>" in page
    elif name == "perfetto":
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

        trace = pb.Trace.FromString(path.read_bytes())
        assert any(p.HasField("track_event") for p in trace.packet)
    elif name == "prometheus":
        from prometheus_client.parser import text_string_to_metric_families

        assert list(text_string_to_metric_families(path.read_text()))
    elif name == "otel":
        assert received.get("/v1/metrics"), "no OTLP metrics request arrived"
    else:
        raise AssertionError(f"output {name!r} has no read-back check in tests/render/test_matrix.py")


@pytest.mark.parametrize("capture", list(CAPTURES))
@pytest.mark.parametrize("name", [o.name for o in OUTPUTS])
def test_output_writes_what_its_format_reads_back(
    name: str,
    capture: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    otlp_receiver: tuple[str, dict[str, list[bytes]]],
) -> None:
    raw = RawCapture.load(str(CAPTURES[capture]))
    report = build_report(raw)
    output = next(o for o in OUTPUTS if o.name == name)
    endpoint, received = otlp_receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    path = tmp_path / f"out.{name}"
    lines = write_outputs(report, raw, **{name: str(path) if output.takes_path else True})
    assert len(lines) == 1
    if output.takes_path:
        assert path.stat().st_size > 0 and str(path) in lines[0]
    _read_back(name, path, report, received)
