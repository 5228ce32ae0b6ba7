"""The load-sweep verdict (rules/serving.py: latency-knee / load-scales) on levels drawn by hand: where the knee is,
each cause at its exact boundary (thresholds chosen so the boundary values are exact in binary floating point), and the
evidence and advice each cause carries. Mutation testing found these branches reached by no test that could tell them
apart (benchmarks/mutation.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pytest

from max_profile.analyze.rules.serving import rule_latency_knee
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Finding, LoadLevel, Report, ServerMetrics, find_impossible_number

from ...builders import load_level

# boundaries exact in binary: 1.25 = 5/4, 0.25 = 1/4
TH = Thresholds(
    knee_min_gain=0.25,
    knee_min_efficiency=0.5,
    knee_itl_growth=1.5,
    knee_batch_growth=1.25,
    knee_kv_pressure_pct=90.0,
    knee_itl_spike_ratio=3.0,
    knee_gpu_saturated_pct=90.0,
    host_bound_util_pct=40.0,
)


def server(
    batch: float | None = 4.0,
    kv: float | None = 10.0,
    preemptions: float | None = 0.0,
    ce: float | None = 0.0,
    unavailable: str | None = None,
) -> ServerMetrics:
    batches = {"TG": 100.0} if ce is None else {"CE": ce, "TG": 100.0}
    return ServerMetrics(
        url="u",
        window_s=10.0,
        batch_size_mean=batch,
        kv_cache_used_pct=kv,
        preemptions=preemptions,
        requests_queued=7.0,
        batches=batches,
        batch_execution_ms_mean={"CE": 12.5, "TG": 3.25},
        unavailable=unavailable,
    )


def level(
    c: int,
    tok: float,
    itl: float | None = 4.0,
    itl_p99: float | None = 4.0,
    ttft: float | None = 20.0,
    gpu: float | None = None,
    srv: ServerMetrics | None = None,
) -> LoadLevel:
    return load_level(c, tok, itl=itl, itl_p99=itl_p99, ttft=ttft, gpu=gpu, server=srv)


def judge(*levels: LoadLevel, th: Thresholds = TH) -> list[Finding]:
    return rule_latency_knee(cast(Report, SimpleNamespace(load_levels=list(levels))), th)


def knee(*levels: LoadLevel) -> Finding:
    found = judge(*levels)
    assert [f.id for f in found] == ["latency-knee"], found
    return found[0]


def flat_pair(cur_srv: ServerMetrics | None = None, gpu: float | None = None, itl_p99: float | None = 4.0) -> Finding:
    """Concurrency 1 -> 2, throughput +6.25 % (below the 25 % minimum gain): a knee; the cause is what is varied."""
    return knee(level(1, 100.0, srv=server(batch=4.0)), level(2, 106.25, itl_p99=itl_p99, gpu=gpu, srv=cur_srv))


def test_fewer_than_two_levels_say_nothing() -> None:
    assert judge() == [] and judge(level(4, 100.0)) == []


def test_a_sweep_that_scales_says_so_with_its_levels_and_best() -> None:
    found = judge(level(4, 400.0), level(1, 100.0), level(2, 200.0))  # unsorted: sorted by concurrency first
    assert [(f.id, f.severity, f.confidence) for f in found] == [("load-scales", "info", 0.6)]
    assert found[0].evidence == {"levels": "1,2,4", "best_output_tok_per_s": 400.0}
    assert "100 -> 400 output tok/s from concurrency 1 to 4" in found[0].title


def test_the_knee_is_the_first_pair_that_stops_scaling_in_concurrency_order() -> None:
    f = knee(level(8, 410.0), level(1, 100.0), level(4, 400.0), level(2, 200.0))
    assert (f.evidence["previous_concurrency"], f.evidence["knee_concurrency"]) == (4, 8)


@pytest.mark.parametrize(("tok", "is_knee"), [(125.0, False), (124.0, True)], ids=["gain-at-minimum", "gain-below"])
def test_gain_boundary(tok: float, is_knee: bool) -> None:
    # concurrency 1 -> 1 (a repeat level): efficiency is 1 + gain, never low; only the gain decides
    assert [f.id for f in judge(level(1, 100.0), level(1, tok))] == (["latency-knee"] if is_knee else ["load-scales"])


@pytest.mark.parametrize(
    ("tok", "itl", "ttft", "is_knee"),
    [
        (200.0, 6.0, 20.0, False),  # efficiency exactly 0.5 (2x throughput for 4x concurrency): not below it
        (196.0, 6.0, 20.0, True),  # efficiency below, ITL x1.5 exactly: latency climbs
        (196.0, 5.9, 20.0, False),  # efficiency below, ITL x1.475: latency does not climb enough
        (196.0, 4.0, 30.0, True),  # TTFT p90 x1.5 exactly is latency climbing too
        (196.0, None, 30.0, True),  # no ITL at one level: growth 1.0, TTFT decides
        (196.0, 6.0, None, True),  # no TTFT: ITL decides
        (196.0, None, None, False),  # neither: latency is not seen climbing
    ],
    ids=[
        "efficiency-at-minimum",
        "itl-at-growth",
        "itl-below-growth",
        "ttft-at-growth",
        "no-itl",
        "no-ttft",
        "no-latency",
    ],
)
def test_efficiency_and_latency_growth_boundary(
    tok: float, itl: float | None, ttft: float | None, is_knee: bool
) -> None:
    before = level(1, 100.0, itl=4.0 if itl is not None else None, ttft=20.0 if ttft is not None else None)
    found = judge(before, level(4, tok, itl=itl, itl_p99=itl, ttft=ttft))
    assert [f.id for f in found] == (["latency-knee"] if is_knee else ["load-scales"])


def test_a_level_with_no_throughput_before_it_is_no_gain() -> None:
    f = knee(level(1, 0.0), level(2, 50.0))
    assert f.evidence["throughput_gain_pct"] == 0.0
    assert [f.id for f in judge(level(1, 0.5), level(2, 1.0))] == ["load-scales"]  # under 1 tok/s is still a throughput


@pytest.mark.parametrize("missing", ["before", "at-knee"])
def test_a_latency_missing_at_one_level_is_no_growth(missing: str) -> None:
    before = level(1, 100.0, itl=None if missing == "before" else 4.0, ttft=None if missing == "before" else 20.0)
    after = level(4, 196.0, itl=None if missing == "at-knee" else 8.0, ttft=None if missing == "at-knee" else 40.0)
    assert [f.id for f in judge(before, after)] == ["load-scales"]


def test_knee_evidence_and_title_carry_the_pair_and_the_server_window() -> None:
    f = flat_pair(server(batch=4.5, kv=50.0, ce=3.0))
    ev = f.evidence
    assert ev["throughput_gain_pct"] == 6.2  # round(6.25, 1): to one decimal, not an integer
    assert (ev["output_tok_per_s_before"], ev["output_tok_per_s_at_knee"]) == (100.0, 106.25)
    assert (ev["itl_p50_ms_before"], ev["itl_p50_ms_at_knee"], ev["itl_p99_ms_at_knee"], ev["ttft_p90_ms_at_knee"]) == (
        4.0,
        4.0,
        4.0,
        20.0,
    )
    assert (
        ev["batch_size_mean"],
        ev["batch_size_mean_before"],
        ev["requests_queued"],
        ev["kv_cache_used_pct"],
        ev["preemptions"],
    ) == (4.5, 4.0, 7.0, 50.0, 0.0)
    assert (ev["ce_batches"], ev["ce_batch_ms_mean"], ev["tg_batch_ms_mean"]) == (3.0, 12.5, 3.25)
    assert f.title.startswith("Latency bends at concurrency 2 (throughput +6% over 1, ITL p50 x1.00): ")


def test_a_server_window_that_could_not_be_read_adds_no_server_evidence() -> None:
    f = flat_pair(server(unavailable="connection refused"))
    assert "batch_size_mean" not in f.evidence and "ce_batches" not in f.evidence


def _cause(f: Finding) -> tuple[Any, str, float]:
    return f.evidence["cause"], f.severity, f.confidence


@pytest.mark.parametrize(
    ("srv", "cause"),
    [
        (server(kv=90.0), "kv-cache-pressure"),  # at the pressure threshold
        (server(batch=8.0, kv=89.5), "unknown"),
        (server(kv=None, preemptions=1.0), "kv-cache-pressure"),  # one preemption is pressure
        (server(batch=8.0, kv=None, preemptions=None), "unknown"),
        (server(batch=5.0), "unknown"),  # batch grew by exactly the growth factor: not stuck
        (server(batch=4.5), "batch-limit"),  # grew by less
        (server(batch=None), "unknown"),
    ],
    ids=["kv-at", "kv-below", "preemption", "no-kv-metrics", "batch-grew", "batch-stuck", "no-batch-metric"],
)
def test_server_side_causes_at_their_boundaries(srv: ServerMetrics, cause: str) -> None:
    f = flat_pair(srv)
    assert _cause(f) == (cause, "warning", 0.7 if cause != "unknown" else 0.5)


def test_kv_pressure_comes_before_a_stuck_batch_and_says_what_to_change() -> None:
    f = flat_pair(server(batch=4.0, kv=95.0, preemptions=2.0))
    assert f.evidence["cause"] == "kv-cache-pressure"
    assert "KV cache 95% used, 2 preemptions in the window" in f.title
    assert f.next_step is not None and "--device-memory-utilization" in f.next_step


def test_a_stuck_batch_says_the_batch_and_the_ttft() -> None:
    f = flat_pair(server(batch=4.5))
    assert (
        "the batch stayed at 4.5 requests (was 4.0) while concurrency went 1 -> 2" in f.title
        and "TTFT p90 20 -> 20 ms" in f.title
    )
    assert f.next_step is not None and "--max-batch-size" in f.next_step


@pytest.mark.parametrize(
    ("p99", "ce", "cause"),
    [
        (12.0, 1.0, "prefill-interference"),  # ITL p99 exactly 3x its p50, one prefill batch in the window
        (11.9, 1.0, "unknown"),
        (12.0, 0.0, "unknown"),  # no prefill batch: the spikes are not prefill's
        (12.0, None, "unknown"),  # the server does not say its prefill batches
        (None, 1.0, "unknown"),  # no ITL p99: no spike measured
    ],
    ids=["spike-at", "spike-below", "no-ce", "ce-missing", "no-p99"],
)
def test_prefill_interference_boundary(p99: float | None, ce: float | None, cause: str) -> None:
    f = flat_pair(server(batch=8.0, ce=ce), itl_p99=p99)
    assert f.evidence["cause"] == cause
    if cause == "prefill-interference":
        assert "ITL p99 is 3.0x its p50 with 1 prefill (CE) batches of 12.5 ms mean" in f.title
        assert f.next_step is not None and "--max-batch-input-tokens" in f.next_step


@pytest.mark.parametrize(
    ("gpu", "cause", "severity"),
    [
        (90.0, "gpu-saturated", "info"),  # at the saturation threshold: the GPU's capacity, healthy
        (89.5, "unknown", "warning"),
        (40.0, "unknown", "warning"),  # at the host-bound threshold: not below it
        (39.5, "host-bound", "warning"),
        (None, "unknown", "warning"),
    ],
    ids=["saturated-at", "saturated-below", "host-at", "host-below", "no-gpu-figure"],
)
def test_gpu_side_causes_at_their_boundaries(gpu: float | None, cause: str, severity: str) -> None:
    f = flat_pair(None, gpu=gpu)  # no server metrics: only the GPU figure speaks
    assert _cause(f) == (cause, severity, 0.7 if cause != "unknown" else 0.5)
    advice = {"gpu-saturated": "Healthy", "host-bound": "py-spy", "unknown": "Read the server's metrics"}[cause]
    assert f.next_step is not None and advice in f.next_step
    if cause == "unknown":
        assert f.title.endswith("the server's metrics do not say why")


def test_a_throughput_that_fell_is_evidence_a_report_can_be_read_back_with() -> None:
    """Changes between two measurements may be negative: the report reader must not call them damaged (a served window
    whose recorded decode step came out 0.2 % faster than the untraced one made a report that could not be loaded)."""
    f = knee(level(1, 100.0), level(2, 80.0))
    assert f.evidence["throughput_gain_pct"] == -20.0
    assert find_impossible_number(msgspec.to_builtins({"findings": [f]})) is None
    assert find_impossible_number({"evidence": {"decode_step_change_pct": -0.2}}) is None
    assert (
        find_impossible_number({"evidence": {"decode_step_ms": -0.2}}) == "decode_step_ms = -0.2"
    )  # a time still may not
