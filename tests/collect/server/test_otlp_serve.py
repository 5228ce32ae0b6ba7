"""MAX's own spans from real CPU `max serve` processes (tiny model) exporting OTLP to max_profile's receiver: `attach
--otlp` on one server against the requests it sent, two servers behind one attach (the per-replica table and the fleet
total), and the spans saved as a Collector's file export read back through `report FILE` into the same numbers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from max_profile.analyze.report import build_report
from max_profile.attach import AttachPlan, run_attach
from max_profile.collect.readers.sources import import_trace
from max_profile.model import RawCapture
from max_profile.util.procs import clean_child_env

from ...conftest import run_cli
from ...outside_servers import OutsideServer, start_outside_server
from ...ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.max]

TOKENS = 12


def _start(name: str, model: Path, otlp_port: int, folder: Path, detached: bool = False) -> OutsideServer:
    """`max serve` as a user would start it to export its spans (the variables attach --otlp prints); ``detached``: as
    `setsid max serve ... &` leaves it (its parent the machine's init)."""
    return start_outside_server(
        model,
        folder / f"{name}.log",
        detached=detached,
        env={
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{otlp_port}/v1/traces",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}",  # MAX's metrics export too: not to Modular
            "MAX_SERVE_KERNEL_TRACE_LEVEL": "batch",
            "OTEL_BSP_SCHEDULE_DELAY": "500",
            "OTEL_RESOURCE_ATTRIBUTES": f"service.instance.id={name}",
        },
    )


@pytest.fixture(scope="module")
def fleet(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[OutsideServer], int]]:
    """Two servers of the tiny model exporting to one OTLP port (nothing listens there between tests: their exporter
    drops what it cannot send)."""
    folder = tmp_path_factory.mktemp("fleet")
    otlp_port = free_port()
    replicas = [
        _start("replica-a", tiny_model_dir, otlp_port, folder, detached=True),
        _start("replica-b", tiny_model_dir, otlp_port, folder),
    ]
    try:
        for r in replicas:
            r.wait_healthy()
        yield replicas, otlp_port
    finally:
        for r in replicas:
            r.stop()


def test_attach_otlp_reports_every_pass_of_the_requests_it_sent(fleet: tuple[list[OutsideServer], int]) -> None:
    (a, _b), otlp_port = fleet
    lines: list[str] = []
    plan = AttachPlan(url=a.url, duration_s=6, probe=True, max_tokens=TOKENS, otlp=str(otlp_port))
    result = run_attach(plan, lines.append)
    assert result.failure is None
    assert any("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:" in line for line in lines)  # the setup printed
    assert any("otlphttp/max-profile" in line for line in lines)
    raw = result.raw
    sent = [r for r in raw.requests if r.ok]
    assert len(sent) == 3
    # every request of ours, as the server's own spans tell it
    assert len(raw.server_requests) == 3 and {r.replica for r in raw.server_requests} == {"replica-a"}
    assert sorted(r.output_tokens for r in raw.server_requests) == sorted(r.tokens for r in sent)
    # one prefill pass per request and one decode pass per further token (the probes run one after another)
    prefill = [s for s in raw.steps if s.phase == "prefill"]
    decode = [s for s in raw.steps if s.phase == "decode"]
    assert len(prefill) == 3
    assert len(decode) == sum(r.output_tokens - 1 for r in raw.server_requests)
    w0, w1 = raw.window_ns  # type: ignore[misc]
    assert all(w0 <= s.end_ns <= w1 for s in raw.steps)
    # TTFT from the spans: the server's side of the client's
    for span_req, ours in zip(sorted(raw.server_requests, key=lambda r: r.started_ns), sent, strict=True):
        assert span_req.ttft_ns is not None and ours.ttft_ms is not None
        assert 0 < span_req.ttft_ns / 1e6 <= ours.ttft_ms + 50
    report = build_report(raw)
    assert report.step_summary is not None and report.step_summary.source == "MAX serve spans"  # type: ignore[union-attr]
    assert [r.replica for r in report.replicas] == ["replica-a"] and report.replicas[0].passes == len(raw.steps)


def test_two_replicas_behind_one_attach_and_the_collector_file(
    fleet: tuple[list[OutsideServer], int], tmp_path: Path
) -> None:
    """A load of concurrency 2 on each of two replicas behind one attach: both in the table with their passes, the
    fleet their sum, each named by its URL, the detached one (its parent the machine's init) found by its port."""
    (a, b), otlp_port = fleet
    res = run_cli(
        "attach",
        a.url,
        b.url,
        "--otlp",
        f"127.0.0.1:{otlp_port}",
        "--concurrency",
        "2",
        "--duration",
        "6",
        "--max-tokens",
        str(TOKENS),
        "--otlp-save",
        str(tmp_path / "spans.jsonl"),
        "--json",
        str(tmp_path / "r.json"),
        "--raw",
        str(tmp_path / "raw.json.gz"),
        env=clean_child_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Replicas (MAX serve spans)" in res.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    raw = RawCapture.load(str(tmp_path / "raw.json.gz"))
    rows = {r["replica"]: r for r in report["replicas"]}
    assert set(rows) == {"replica-a", "replica-b", "fleet"}
    window = raw.load_windows[0].window_ns
    for name, server in (("replica-a", a), ("replica-b", b)):
        row = rows[name]
        assert row["server"] == server.url and not row["silent"]
        # the load drove this replica too: the passes its own spans tell of inside the window
        passes = [s for s in raw.steps if s.replica == name and window[0] <= s.end_ns <= window[1]]
        assert row["passes"] == len(passes) > 0
        ours = [r for r in raw.requests if r.server == server.url and r.ok and window[0] <= r.ended_ns <= window[1]]
        assert ours and abs(row["requests"] - len(ours)) <= 2  # the server's span ends a moment before our stream
    assert rows["fleet"]["passes"] == rows["replica-a"]["passes"] + rows["replica-b"]["passes"]
    assert rows["fleet"]["requests"] == rows["replica-a"]["requests"] + rows["replica-b"]["requests"]
    assert report["slowest_replica"].split(":")[0] in ("replica-a", "replica-b")
    # the detached server found by the port it listens on: its own process, never its parent (the machine's init)
    parent = int(Path(f"/proc/{a.pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    assert parent != a.proc.pid  # its launcher is gone
    notes = "\n".join(report["notes"])
    assert f"server process {a.pid} on this machine" in notes and f"server process {b.proc.pid} " in notes
    assert f"server process {parent} " not in notes
    # the same spans as a Collector's file exporter writes them, through `report FILE`: the same passes
    saved = import_trace(str(tmp_path / "spans.jsonl"))
    from_file = build_report(saved)
    file_rows = {r.replica: r for r in from_file.replicas}
    for name in ("replica-a", "replica-b"):
        assert file_rows[name].passes >= rows[name]["passes"]  # the file keeps every span received, the window its own
        assert file_rows[name].requests >= rows[name]["requests"]
    window_steps = [(s["start_ns"], s["end_ns"]) for s in report["steps"]]
    offset = report["capture"]["unix_minus_perf_counter_ns"]
    file_steps = {(s.start_ns - offset, s.end_ns - offset) for s in saved.steps}
    assert all(step in file_steps for step in window_steps)
