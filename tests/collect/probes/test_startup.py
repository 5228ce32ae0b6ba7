"""The start-up profile: real MAX on the CPU (live, and the recorded cold / warm / profiling-on runs of an empty cache),
MAX's log lines as it writes them, why a compile happened, compiler failures, and the diff of two start-ups."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from max_profile.analyze.diff import diff_reports, startup_verdicts
from max_profile.collect.probes.compile_key import explain_cache
from max_profile.collect.probes.startup import (
    TimedLine,
    cache_events,
    compile_failure,
    graphs_from_log,
    kv_bytes,
    parse_cache_line,
)
from max_profile.model import Report

from ...conftest import DATA, run_cli

CPU = DATA / "cpu" / "startup"


def _startup(name: str) -> dict[str, object]:
    """A saved start-up report's start-up section, read back through the package's report reader."""
    report = Report.load(str(CPU / f"startup_{name}.json"))
    assert report.startup is not None
    return msgspec.to_builtins(report.startup)  # type: ignore[no-any-return]


def _compile_s(st: dict[str, object]) -> float:
    return sum(p["seconds"] for p in st["phases"] if "compile" in p["name"])  # type: ignore[index,misc,union-attr]


def test_recorded_cpu_cold_warm_and_profiling_on() -> None:
    """tests/data/cpu/startup/README.md: an empty MODULAR_CACHE_DIR, the tiny model on this 2-core VM."""
    cold, warm, prof = _startup("cold"), _startup("warm"), _startup("profiling_on")
    assert cold["cache"] == "miss" and "was empty" in cold["cache_reason"]  # type: ignore[operator]
    assert _compile_s(cold) == pytest.approx(cold["max_logged_compile_s"], rel=0.10)
    assert warm["cache"] == "hit" and warm["total_s"] < 0.2 * cold["total_s"]  # type: ignore[operator]
    assert prof["cache"] == "miss"
    assert "MODULAR_ENABLE_PROFILING=on is a new compile key" in prof["cache_reason"]  # type: ignore[operator]
    assert prof["compile_key"]["profiling"] == "on" and warm["compile_key"]["profiling"] == "off"  # type: ignore[index]
    command = prof["warm_cache_command"]
    assert command.startswith("MODULAR_ENABLE_PROFILING=on max warm-cache --model-path")  # type: ignore[union-attr]
    assert warm["warm_cache_command"] is None  # a hit needs no warming


def test_diff_of_two_startups_says_cache_and_key() -> None:
    cold, warm, prof = (Report.load(str(CPU / f"startup_{n}.json")) for n in ("cold", "warm", "profiling_on"))
    result = diff_reports(cold, warm, a_label="cold", b_label="warm")
    assert result.comparable and not result.regression
    assert result.verdicts[0].startswith("start-up 408.7 s -> 13.6 s (-97 %); compile cache miss -> hit")
    metrics = {line.metric: line for line in result.lines}
    assert metrics["start-up to first token"].delta == pytest.approx(13.551 - 408.71)
    assert metrics["start-up: compile model"].a == pytest.approx(296.6) and metrics[
        "start-up: compile model"
    ].b == pytest.approx(1.6)
    assert any(v.startswith("largest change: compile model") for v in result.verdicts)
    again = diff_reports(warm, prof)
    assert "compile key changed: profiling: off -> on" in again.verdicts
    assert "MODULAR_ENABLE_PROFILING=on is a new compile key" in again.verdicts[0]


def test_startup_diff_across_a_max_upgrade_is_compared() -> None:
    import msgspec

    warm = Report.load(str(CPU / "startup_warm.json"))
    st = warm.startup
    assert st is not None
    newer = msgspec.structs.replace(
        warm,
        environment=msgspec.structs.replace(warm.environment, max_version="26.8.0"),
        startup=msgspec.structs.replace(st, compile_key={**st.compile_key, "max_version": "26.8.0"}),
    )
    result = diff_reports(warm, newer)
    assert result.comparable  # a MAX upgrade is what a start-up diff is for; a run diff refuses it
    assert "compile key changed: max_version: 26.7.0 -> 26.8.0" in result.verdicts
    assert startup_verdicts(st, st)[0].endswith("compile cache hit -> hit")


def test_max_log_lines_as_max_writes_them() -> None:
    """CompilationTimer's INFO lines, the KV manager's size line and the [modular-cache] lines (format of MAX 26.7)."""
    lines = [
        TimedLine(10.0, "Building, compiling, and initializing model..."),
        TimedLine(10.5, "Building model graph took 0.5 seconds"),
        TimedLine(40.5, "Compiling model took 30.0 seconds"),
        TimedLine(41.0, "Initializing model took 0.5 seconds"),
        TimedLine(41.0, "Building, compiling, and initializing model took 31.0 seconds"),
    ]
    graphs = graphs_from_log(lines)
    assert [(g.name, g.build, g.compile, g.init, g.total, g.start, g.end) for g in graphs] == [
        ("model", 0.5, 30.0, 0.5, 31.0, 10.0, 41.0)
    ]
    assert graphs_from_log(lines[:-1]) == []  # a region that never closed (the load failed inside it) is not a graph
    assert kv_bytes("Jenga KV manager: total memory = 1.50 GiB (per device)") == int(1.5 * (1 << 30))
    events = cache_events(
        [
            TimedLine(1.0, "[modular-cache] findSyncImpl: cache hit: 4096 bytes from /c/.max_cache/abc"),
            TimedLine(2.0, "[modular-cache] findSyncImpl: miss, file not found: /c/.mojo_cache/def"),
            TimedLine(3.0, "[modular-cache] insertSyncImpl: write success: /c/.max_cache/ghi"),
            TimedLine(4.0, "[modular-cache] using cache folder /c"),
            TimedLine(5.0, "unrelated"),
        ]
    )
    assert [(e.kind, e.bytes, e.graph) for e in events] == [("hit", 4096, True), ("miss", 0, False), ("write", 0, True)]
    assert parse_cache_line(4.0, "[modular-cache] using cache folder /c") is None


def test_why_a_compile_happened_from_the_ledger() -> None:
    base = {
        "model": "m1",
        "max_version": "26.7.0",
        "devices": "gpu",
        "profiling": "off",
        "device_graphs": "default",
        "max_batch_size": "default",
        "max_length": "default",
        "encoding": "default",
        "custom_code": "none",
    }
    history: list[dict[str, object]] = [{"key": base, "cache": "miss"}]
    assert "was empty" in explain_cache("miss", base, [], Path("/c"), cache_was_empty=True)
    assert (
        "MODULAR_ENABLE_PROFILING=on is a new compile key (earlier loads of this model here used off)"
        == explain_cache("miss", {**base, "profiling": "on"}, history, Path("/c"), cache_was_empty=False)
    )
    said = explain_cache(
        "miss", {**base, "max_batch_size": "32", "device_graphs": "off"}, history, Path("/c"), cache_was_empty=False
    )
    assert "--max-batch-size 32 is new (earlier: default)" in said and "device graph capture off is new" in said
    assert "not compiled into" in explain_cache(
        "miss", {**base, "model": "m2"}, history, Path("/c"), cache_was_empty=False
    )
    assert "entries were removed" in explain_cache("miss", base, history, Path("/c"), cache_was_empty=False)
    assert explain_cache("hit", base, history, Path("/c"), cache_was_empty=False).startswith("every graph came from")


def test_compiler_failure_names_the_kernel_and_the_gpu() -> None:
    text = [
        "ValueError: Failed to compile the model. Please file an issue.",
        "open-source/max/max/kernels/src/linalg/matmul/gpu/sm90/matmul.mojo:412:9: error: call expansion failed",
        "note: target is sm_90a",
    ]
    said = compile_failure(text, gpu_name="NVIDIA H200")
    assert said is not None and "matmul.mojo:412" in said and "sm_90a" in said and "call expansion failed" in said
    assert compile_failure(["all fine", "Compiling model took 3.0 seconds"]) is None


@pytest.mark.max
def test_startup_verb_on_the_tiny_model_twice(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Real MAX on the CPU: the JSON contract, and a second start-up of the same key is a hit with a smaller compile."""
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for out in (first, second):
        res = run_cli("startup", "--model-path", str(tiny_model_dir), "--devices", "cpu", "--json", str(out))
        assert res.returncode == 0, res.stderr[-2000:]
    st = json.loads(second.read_text())["startup"]
    assert {"total_s", "phases", "cache", "cache_reason"} <= set(st) and st["cache"] == "hit"
    assert all({"name", "seconds"} <= set(p) for p in st["phases"]) and any(
        "compile" in p["name"] for p in st["phases"]
    )
    assert st["total_s"] >= sum(p["seconds"] for p in st["phases"]) * 0.95
    res = run_cli("diff", str(first), str(second))
    # two start-ups are one sample each: said, judged by their own evidence (the cache's state), never "no regression"
    assert res.returncode == 5, res.stdout + res.stderr
    assert "compile cache" in res.stdout and "-> hit" in res.stdout and "INCONCLUSIVE" in res.stdout
    assert "no regression" not in res.stdout
