"""The start-up rule field by field: each of its five findings with every field written out, and each threshold at its
exact value from both sides (the boundaries the mutation run found unpinned)."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from max_profile.analyze.rules.startup import rule_startup
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Finding, PreflightResult, StartupPhase, StartupProfile
from max_profile.model.command_text import cli

from ...analyze.rules.test_state import _base

TH = Thresholds()


def startup(st: StartupProfile, preflight: list[PreflightResult] | None = None, th: Thresholds = TH) -> list[Finding]:
    return rule_startup(msgspec.structs.replace(_base(), startup=st, preflight=preflight or []), th)


def only(findings: list[Finding], fid: str) -> Finding:
    found = [f for f in findings if f.id == fid]
    assert len(found) == 1, [f.id for f in findings]
    return found[0]


FAILURE = "kernel.mojo:12: error: no sm_90a target; hint two; install a newer MAX: pip install -U modular"


def test_compile_failed_every_field() -> None:
    long = FAILURE + " " + "x" * 500
    f = only(startup(StartupProfile(total_s=3.5, phases=[], cache="miss", failure=long)), "compile-failed")
    assert (f.severity, f.confidence) == ("error", 0.9)
    assert f.title == "MAX failed to compile the model: kernel.mojo:12: error: no sm_90a target"
    assert f.evidence == {"failure": long[:400], "after_s": 3.5, "cache": "miss"}
    assert len(str(f.evidence["failure"])) == 400
    assert f.next_step == long.split("; ")[-1] and f.next_step.startswith("install a newer MAX")
    # a message without "; " has no separate advice
    plain = only(startup(StartupProfile(total_s=3.5, phases=[], failure="it broke")), "compile-failed")
    assert plain.next_step is None and plain.title == "MAX failed to compile the model: it broke"
    # a short start-up ends the rule after the failure: nothing else is judged
    assert [x.id for x in startup(StartupProfile(total_s=3.5, phases=[], failure="it broke"))] == ["compile-failed"]


def compile_run(total: float, compile_s: float, cache: str = "miss", command: str | None = "max warm-cache --model m"):
    return StartupProfile(
        total_s=total,
        phases=[
            StartupPhase(name="compile graph A", seconds=compile_s * 0.25),
            StartupPhase(name="compile graph B", seconds=compile_s * 0.75),
            StartupPhase(name="warm-up", seconds=1.0),
        ],
        cache=cache,
        cache_reason="r" * 350,
        max_logged_compile_s=12.345,
        warm_cache_command=command,
    )


def test_startup_compile_every_field() -> None:
    f = only(startup(compile_run(40.0, 30.123456)), "startup-compile")
    assert (f.severity, f.confidence) == ("warning", 0.85)
    assert f.evidence == {
        "startup_s": 40.0,
        "compile_s": 30.12,
        "cache": "miss",
        "cache_reason": "r" * 300,
        "max_logged_compile_s": 12.345,
    }
    assert f.title == "Start-up is compile-dominated: 30 of 40 s compiling (cache miss)"
    assert f.command is not None and cli(f.command) == "max warm-cache --model m"
    assert "compile cache" in (f.next_step or "")
    assert only(startup(compile_run(40.0, 30.0, command=None)), "startup-compile").command is None
    assert not startup(compile_run(40.0, 30.0, cache="hit"))
    assert only(startup(compile_run(40.0, 30.0, cache="partial")), "startup-compile")


def test_startup_compile_share_and_minimum_length_at_their_exact_values() -> None:
    share = TH.startup_compile_share_pct / 100
    assert startup(compile_run(40.0, share * 40.0))  # exactly the share: compile-dominated
    assert not startup(compile_run(40.0, share * 40.0 - 0.01))
    at_min = compile_run(TH.startup_min_s, TH.startup_min_s)
    assert startup(at_min)  # exactly the minimum start-up length is judged
    assert not startup(compile_run(TH.startup_min_s - 0.01, TH.startup_min_s - 0.01))
    # another share, the rule's own arithmetic: 40 % of 100 s, not 40/101
    th = dataclasses.replace(TH, startup_compile_share_pct=40.0)
    assert startup(compile_run(100.0, 40.0), th=th) and not startup(compile_run(100.0, 39.7), th=th)


def weights_run(gbps: float, nbytes: int, name: str = "weights loaded to the device") -> StartupProfile:
    return StartupProfile(
        total_s=60.0,
        phases=[
            StartupPhase(name="tokenizer", seconds=1.0, bytes=nbytes, gb_per_s=0.01),  # bytes, but not the weights
            StartupPhase(name=name, seconds=41.7, bytes=nbytes, gb_per_s=gbps),
        ],
        cache="hit",
    )


def test_startup_weights_slow_every_field() -> None:
    f = only(startup(weights_run(0.4567, 19_045_000_000)), "startup-weights-slow")
    assert (f.severity, f.confidence) == ("warning", 0.6)
    assert f.title == (
        "Weights moved at 0.46 GB/s (19.0 GB in 42 s, weights loaded to the device): far below a local SSD"
    )
    assert f.evidence == {
        "phase": "weights loaded to the device",
        "weights_bytes": 19_045_000_000,
        "seconds": 41.7,
        "gb_per_s": 0.4567,
        "threshold_gbps": TH.weights_slow_gbps,
    }
    assert f.next_step is not None and f.next_step.startswith("The weights are read from their files")


def test_startup_weights_slow_edges() -> None:
    assert not startup(weights_run(TH.weights_slow_gbps, 1 << 34))  # exactly the threshold: not slow
    assert startup(weights_run(TH.weights_slow_gbps - 0.001, 1 << 34))
    assert not startup(weights_run(0.1, TH.weights_min_bytes - 1))  # too little to judge
    assert startup(weights_run(0.1, TH.weights_min_bytes))
    # a phase named for weights without a rate, and a phase with a rate not named for weights: no verdict
    no_rate = StartupProfile(
        total_s=60.0,
        phases=[
            StartupPhase(name="weights", seconds=40.0, bytes=1 << 34, gb_per_s=None),
            StartupPhase(name="graph capture", seconds=5.0, bytes=1 << 34, gb_per_s=0.1),
        ],
    )
    assert not startup(no_rate)
    no_bytes = StartupProfile(total_s=60.0, phases=[StartupPhase(name="weights", seconds=40.0, bytes=0, gb_per_s=0.1)])
    assert not startup(no_bytes)
    # the first weights phase with bytes and a rate is judged, not an earlier one without bytes
    later = StartupProfile(
        total_s=60.0,
        phases=[
            StartupPhase(name="weights index", seconds=1.0, bytes=None, gb_per_s=None),
            StartupPhase(name="weights", seconds=40.0, bytes=1 << 34, gb_per_s=0.2),
        ],
    )
    assert only(startup(later), "startup-weights-slow").evidence["phase"] == "weights"


def kv_run(kv_s: float, total: float = 50.0) -> StartupProfile:
    return StartupProfile(
        total_s=total,
        phases=[StartupPhase(name="KV cache allocation (paged, 90 % of free memory)", seconds=kv_s, bytes=123456789)],
    )


def test_startup_kv_alloc_every_field_and_its_boundary() -> None:
    f = only(startup(kv_run(20.6)), "startup-kv-alloc")
    assert (f.severity, f.confidence) == ("warning", 0.6)
    assert f.evidence == {"seconds": 20.6, "bytes": 123456789, "startup_s": 50.0}
    assert f.title == "KV-cache allocation takes 21 of 50 s of start-up"
    assert f.next_step == (
        "Allocate less up front: --device-memory-utilization or a smaller --max-batch-size / --max-length."
    )
    exact = TH.kv_alloc_share_pct / 100 * 50.0
    assert startup(kv_run(exact)) and not startup(kv_run(exact - 0.01))
    th = dataclasses.replace(TH, kv_alloc_share_pct=40.0)  # 40 % of 100 s is 40 s, not 40/101 of it
    assert startup(kv_run(40.0, total=100.0), th=th) and not startup(kv_run(39.7, total=100.0), th=th)


PREFLIGHT_PHASE = "custom-architecture preflight (a child imports the package)"


def test_startup_custom_import_slow_every_field() -> None:
    st = StartupProfile(total_s=80.0, phases=[StartupPhase(name=PREFLIGHT_PHASE, seconds=31.25)])
    pre = [PreflightResult(spec="my_pkg", max_version="26.7.0", checks=[], package_import_s=12.3456)]
    f = only(startup(st, pre), "startup-custom-import-slow")
    assert (f.severity, f.confidence) == ("warning", 0.6)
    assert f.evidence == {
        "where": "my_pkg: its import in the preflight child, MAX already imported",
        "seconds": 12.35,
        "preflight_child_s": 31.25,
    }
    assert f.title == "The custom architecture's own import takes 12 s (MAX's import not counted)"
    assert f.next_step is not None and f.next_step.startswith("Keep import time free of work")
    # without the preflight phase in the start-up: no child time to give
    bare = only(startup(StartupProfile(total_s=80.0, phases=[]), pre), "startup-custom-import-slow")
    assert bare.evidence["preflight_child_s"] is None


def test_startup_custom_import_slow_boundary_and_the_load_phase() -> None:
    def pre(s: float | None) -> list[PreflightResult]:
        return [PreflightResult(spec="p", max_version=None, checks=[], package_import_s=s)]

    st = StartupProfile(total_s=80.0, phases=[])
    assert startup(st, pre(TH.custom_import_slow_s))  # exactly the threshold: slow
    assert not startup(st, pre(TH.custom_import_slow_s - 0.01))
    # the load's own import of the package (MAX's architecture lookup) counts only when a preflight ran
    load = StartupProfile(total_s=80.0, phases=[StartupPhase(name="custom architectures imported", seconds=14.0)])
    assert not startup(load)
    f = only(startup(load, pre(None)), "startup-custom-import-slow")
    assert f.evidence["where"] == "custom architectures imported" and f.evidence["seconds"] == 14.0


@pytest.mark.parametrize("total", [9.99, 10.0])
def test_a_failure_is_reported_whatever_the_start_up_length(total: float) -> None:
    found = startup(StartupProfile(total_s=total, phases=[], failure="boom; fix it"))
    assert only(found, "compile-failed").next_step == "fix it"
