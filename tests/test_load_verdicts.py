"""The load verdict field by field: a lightly loaded window (its share, what measured it, the request rate from the
ledger before the window's own, the busiest GPU's mean utilization), and the time outside the steps when the ledger
has no window or no steps."""

from __future__ import annotations

import msgspec

from max_profile.analyze.rules.levers import rule_outside_steps
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import LatencyStats, LoadLevel, Report, StepLedger, UtilizationSection

from .test_state_rules import _base, gpu

TH = Thresholds()


def light(
    outside_pct: float = 83.25, rate: float | None = 1.23456, means: tuple[float | None, ...] = (None, 33.333)
) -> Report:
    base = _base()
    lg = base.ledger
    assert isinstance(lg, StepLedger)
    ledger = msgspec.structs.replace(
        lg, outside_steps_pct=outside_pct, requests_in_flight_pct=None, request_rate_rps=rate
    )
    u = UtilizationSection(
        source="test",
        interval_s=0.1,
        gpus=[gpu(f"nv{i}", mean_utilization_pct=m) for i, m in enumerate(means)],
        samples=[],
    )
    return msgspec.structs.replace(base, ledger=ledger, utilization=u)


def level(rate: float) -> LoadLevel:
    stats = LatencyStats(p50=20.0, p90=25.0, p99=30.0, samples=10)
    return LoadLevel(
        concurrency=1,
        window_s=10.0,
        requests=10,
        completed=10,
        failed=0,
        output_tokens=640,
        output_tok_per_s=64.0,
        request_rate_rps=rate,
        ttft_ms=stats,
        itl_ms=stats,
    )


def test_lightly_loaded_every_field() -> None:
    (f,) = rule_outside_steps(light(), TH)
    assert (f.id, f.severity, f.confidence) == ("lightly-loaded", "info", 0.8)
    assert f.evidence == {
        "loaded_pct": 16.8,
        "measured_as": "steps running",
        "threshold_pct": TH.light_load_pct,
        "requests_per_s": 1.23456,
        "outside_steps_pct": 83.25,
        "mean_gpu_utilization_pct": 33.3,
    }
    assert f.title.startswith("Lightly loaded: steps running only 17 % of the window, 1.23 requests/s: ")
    assert f.command is None  # not an attach capture


def test_lightly_loaded_takes_the_window_s_rate_when_the_ledger_has_none() -> None:
    report = msgspec.structs.replace(light(rate=None), window_load=level(0.75))
    (f,) = rule_outside_steps(report, TH)
    assert f.evidence["requests_per_s"] == 0.75 and f.evidence["output_tok_per_s"] == 64.0
    both = msgspec.structs.replace(light(rate=2.5), window_load=level(0.75))
    assert rule_outside_steps(both, TH)[0].evidence["requests_per_s"] == 2.5
    (g,) = rule_outside_steps(light(rate=None), TH)
    assert "requests_per_s" not in g.evidence
    assert g.title.startswith("Lightly loaded: steps running only 17 % of the window: GPU utilization")
    (h,) = rule_outside_steps(light(means=(None,)), TH)
    assert h.evidence["mean_gpu_utilization_pct"] == 0.0


def test_outside_steps_needs_steps_and_a_window() -> None:
    base = light(outside_pct=40.0)  # 60 % loaded: not light
    lg = base.ledger
    assert isinstance(lg, StepLedger)
    no_window = msgspec.structs.replace(base, ledger=msgspec.structs.replace(lg, window_ms=0.0))
    assert rule_outside_steps(no_window, TH) == []
    found = rule_outside_steps(base, TH)
    assert found and found[0].id == "time-outside-steps"
