"""`max-profile attach` on a real `max serve` (tiny model, CPU) that max_profile did not start: the probe's TTFT / ITL,
the server's metrics deltas against /metrics read by hand, the server untouched afterwards, a sweep, bad URLs, metrics
off, and the server dying mid-window (exit 4, the report kept). One server for the module; the last test kills it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from max_profile.analyze.report import build_report
from max_profile.attach import AttachPlan, run_attach
from max_profile.util.procs import clean_child_env

from ...conftest import REPO, run_cli
from ...outside_servers import OutsideServer, start_outside_server
from ...ports import free_port

pytestmark = pytest.mark.slow


class Server(OutsideServer):
    def counters(self) -> dict[str, float]:
        """The server's own /metrics, read by hand: every counter's value."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
        totals: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                if sample.name.endswith("_total"):
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value  # summed over labels
        return totals


@pytest.fixture(scope="module")
def outside_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`max serve` as a user starts it (its defaults; the metrics port chosen free), in its own process group."""
    started = start_outside_server(tiny_model_dir, tmp_path_factory.mktemp("outside-server") / "server.log")
    server = Server(started.proc, started.port, started.metrics_port, started.log)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def test_attach_probe_matches_the_servers_own_metrics(outside_server: Server, tmp_path: Path) -> None:
    pid = outside_server.proc.pid
    res = run_cli(
        "attach",
        outside_server.url,
        "--metrics-url",
        outside_server.metrics_url,
        "--probe",
        "--duration",
        "6",
        "--json",
        str(tmp_path / "r.json"),
        env=clean_child_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    serve = report["serve"]
    assert serve["requests"] == 3 and serve["failed_requests"] == 0
    assert serve["ttft_ms_p50"] > 0 and serve["itl_ms_p50"] > 0
    assert any("server process" in n for n in report["notes"])  # found through its port on this machine
    # the same window in-process, the server's /metrics read by hand just before it opens and after it closes
    hand: dict[str, dict[str, float]] = {}

    def progress(line: str) -> None:
        if line.startswith(
            "attached to"
        ):  # identified (its /v1/models request is outside the window); the window opens next
            hand["before"] = outside_server.counters()

    result = run_attach(
        AttachPlan(url=outside_server.url, metrics_url=outside_server.metrics_url, duration_s=6, probe=True), progress
    )
    hand["after"] = outside_server.counters()
    assert result.failure is None
    server = build_report(result.raw).server_metrics
    assert server is not None

    def by_hand(name: str) -> float:
        return hand["after"].get(name, 0.0) - hand["before"].get(
            name, 0.0
        )  # a counter is absent until its first increment

    assert server.requests == by_hand("maxserve_request_count_total") == 3
    assert (
        server.output_tokens
        == by_hand("maxserve_num_output_tokens_total")
        == sum(r.tokens for r in result.raw.requests)
        == 3 * 64
    )
    assert server.batches.get("TG", 0) > 0 and server.batch_execution_ms_mean.get("TG", 0) > 0
    # read-only: the same server process, still healthy
    assert outside_server.proc.poll() is None and outside_server.proc.pid == pid and outside_server.healthy()


def test_attach_sweep_and_metrics_off(outside_server: Server, tmp_path: Path) -> None:
    res = run_cli(
        "attach",
        outside_server.url,
        "--metrics-url",
        outside_server.metrics_url,
        "--concurrency",
        "1,2",
        "--duration",
        "4",
        "--max-tokens",
        "16",
        "--json",
        str(tmp_path / "sweep.json"),
        env=clean_child_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    levels = json.loads((tmp_path / "sweep.json").read_text())["load_levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2] and all(
        lv["completed"] > 0 and lv["output_tok_per_s"] > 0 for lv in levels
    )
    closed = f"http://127.0.0.1:{free_port()}/metrics"
    res = run_cli(
        "attach",
        outside_server.url,
        "--metrics-url",
        closed,
        "--probe",
        "--duration",
        "3",
        "--json",
        str(tmp_path / "off.json"),
        env=clean_child_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    off = json.loads((tmp_path / "off.json").read_text())
    assert any("metrics could not be read" in n and "MAX_SERVE_METRICS_ENDPOINT_PORT" in n for n in off["notes"])
    assert off["serve"]["ttft_ms_p50"] > 0  # what can be seen is still measured
    assert outside_server.healthy()


def test_attach_refuses_what_is_not_a_max_server(outside_server: Server) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    res = run_cli("attach", nobody, "--duration", "2", timeout=120)
    assert res.returncode == 2 and "no server answers there" in res.stderr
    res = run_cli(
        "attach", f"http://127.0.0.1:{outside_server.metrics_port}", "--duration", "2", timeout=120
    )  # HTTP, but not MAX's API
    assert res.returncode == 2 and "not a MAX server" in res.stderr
    res = run_cli("attach", "ftp://somewhere", "--duration", "2", timeout=120)
    assert res.returncode == 2
    res = run_cli("attach", outside_server.url, "--slo", "ttft=fast", timeout=120)
    assert res.returncode == 2 and "slo" in res.stderr.lower()


def test_server_dying_mid_window_exits_4_with_the_report(outside_server: Server, tmp_path: Path) -> None:
    """Last in the module: it kills the module's server (which is not max_profile's to clean up)."""
    cmd = [
        sys.executable,
        "-m",
        "max_profile",
        "attach",
        outside_server.url,
        "--metrics-url",
        outside_server.metrics_url,
        "--duration",
        "60",
        "--json",
        str(tmp_path / "r.json"),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO), env=clean_child_env()
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "attached to" in line:
            break
    time.sleep(1.0)
    os.killpg(outside_server.proc.pid, signal.SIGKILL)
    outside_server.proc.wait()
    t = time.monotonic()
    rc = proc.wait(timeout=60)
    err = proc.stderr.read()
    assert rc == 4, err
    assert time.monotonic() - t < 20
    assert "stopped answering" in err and (tmp_path / "r.json").exists()
