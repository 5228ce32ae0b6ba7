"""What tracing cost on a steady H100 lease (issue 34; tests/data/h200/session26/README.md): the H200 was not given,
MAX 26.7. ``serve --mode kernels``'s recording against untraced windows of one server (3B shape), and the 5.2B model
in-process against the pipeline with no max_profile code (6 of 11 rounds: the device time ran out). Data integrity of
the committed measurements: the figures the README states, recomputed from each window and printed round."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import serve_ab as bench  # noqa: E402

from .h200_data import acceptance_rows, launch_joins_undone, tok_s_ratios  # noqa: E402

S26 = Path(__file__).parent / "data" / "h200" / "session26"

ROUND = re.compile(r"round\s+(\d+): none ([\d.]+), sampler ([\d.]+), cupti ([\d.]+)")
STEPS = re.compile(r"step p50 / stalls / outside the steps ms: (.*)")
ARM_STEPS = re.compile(r"(\w+) ([\d.]+) / ([\d.]+) / ([\d.]+)")


def _served() -> dict[str, Any]:
    return json.loads((S26 / "serve_ab_3b.json").read_text())  # type: ignore[no-any-return]


def _m24_rounds() -> tuple[list[dict[str, float]], list[dict[str, tuple[float, float, float]]]]:
    """The 5.2B run's printed rounds: tokens/s per arm, and per arm (step p50 ms, stalled ms, ms outside the steps)."""
    text = (S26 / "overhead_m24_graphs.partial.stdout.txt").read_text()
    tok_s = [{"none": float(m[2]), "sampler": float(m[3]), "cupti": float(m[4])} for m in ROUND.finditer(text)]
    steps = [
        {a: (float(p50), float(stall), float(out)) for a, p50, stall, out in ARM_STEPS.findall(m[1])}
        for m in STEPS.finditer(text)
    ]
    return tok_s, steps


def test_the_steps_that_ran_and_the_card() -> None:
    rows = acceptance_rows(S26 / "acceptance.tsv")
    assert [(r[0], r[1]) for r in rows] == [("make_m3b", "0"), ("serve_ab_3b", "0"), ("make_m24", "0")]
    assert "--pairs 5" in rows[1][4] and "--variants default " in rows[1][4]
    assert "NVIDIA H100 80GB HBM3, 580.159.04" in (S26 / "nvidia-smi.csv").read_text()
    assert "go: m24 done" not in (S26 / "go.log.txt").read_text()  # cut inside the 5.2B run


def test_served_ratios_recomputed_from_the_windows() -> None:
    """Five bracketed rounds of the default recording, each against the mean of the untraced windows either side:
    0.9954-1.0019, median 0.9973."""
    doc = _served()
    order = [w["variant"] for w in doc["windows"]]
    assert order == bench.rounds_of(["default"], 5) and doc["order_kind"] == "bracketed"
    tok_s = [w["tok_s"] for w in doc["windows"]]
    ratios = bench.ratios_by_round(tok_s, order, "default")
    assert ratios == pytest.approx(doc["variants"]["default"]["ratios"], rel=1e-12)
    assert ratios == pytest.approx([0.9954, 0.9964, 0.9973, 1.0019, 0.9988], abs=5e-5)
    assert statistics.median(ratios) == pytest.approx(0.9973, abs=5e-5) and min(ratios) > 0.99
    assert doc["plans"]["default"]["share"] == 0.25 and doc["plans"]["default"]["slice_s"] == 0.5


def test_served_every_round_recorded_on_a_steady_server() -> None:
    doc = _served()
    recorded = [w for w in doc["windows"] if w["traced"]]
    assert len(recorded) == 5
    assert [w["kernels"] for w in recorded] == [258528, 260930, 261456, 261485, 261186]
    assert all(w["recorded_s"] == pytest.approx(2.50, abs=0.005) for w in recorded)
    assert all(len(w["worker_per_slice"]) == 6 and min(w["worker_per_slice"]) >= 48672 for w in recorded)
    assert all(w["worker_per_slice"] == w["worker_per_slice_by_start"] for w in recorded)
    assert all(0.005 <= w["callback_s"] < 0.0065 for w in recorded)
    untraced = [w["tok_s"] for w in doc["windows"] if not w["traced"]]
    assert (min(untraced), max(untraced)) == pytest.approx((390.0, 392.7), abs=0.05)
    assert doc["untraced_spread_pct"] == pytest.approx(0.7, abs=0.05)
    assert doc["resolution"]["untraced_step_pct"] == pytest.approx(0.55, abs=0.005)
    assert doc["resolution"]["window_noise_pct"] == pytest.approx(0.14, abs=0.005)
    steps = [w["server_tg_ms"] for w in doc["windows"]]
    assert (min(steps), max(steps)) == pytest.approx((2.444, 2.461), abs=5e-4)


def test_served_wrong_launch_joins_only_in_the_first_recording() -> None:
    """CUPTI 13.0's wrong correlation ids: 153,454 kernels in the server's first recording session, none later (session
    23's grew from none to 182,064 over three)."""
    assert [launch_joins_undone(w) for w in _served()["windows"] if w["traced"]] == [153454, 0, 0, 0, 0]


def test_m24_against_no_profiler_over_six_rounds() -> None:
    tok_s, steps = _m24_rounds()
    assert len(tok_s) == len(steps) == 6  # of 11: the lease ran out
    none = [r["none"] for r in tok_s]
    for arm, expected in (("sampler", (0.9998, 0.9998)), ("cupti", (0.9982, 0.9982))):
        assert tok_s_ratios(none, [r[arm] for r in tok_s]) == pytest.approx(expected, abs=5e-5)
    assert (min(none), max(none)) == (254.4, 254.5)
    assert (min(r["cupti"] for r in tok_s), max(r["cupti"] for r in tok_s)) == (253.9, 254.1)
    p50s = [s[a][0] for s in steps for a in ("none", "sampler", "cupti")]
    assert (min(p50s), max(p50s)) == (3.909, 3.915)
    assert all(s[a][1] == 0.0 for s in steps for a in s)  # no step stalled


def test_m24_cost_per_generation_mostly_outside_the_steps() -> None:
    """The default's cost per 256-token generation (~1,006 ms): about 1.8 ms, of which about 1.6 ms outside the steps
    (the prefill, the recording's start and stop), medians over the rounds of the per-round differences."""
    tok_s, steps = _m24_rounds()
    extra_ms = statistics.median(1000 * 256 * (1 / r["cupti"] - 1 / r["none"]) for r in tok_s)
    outside_ms = statistics.median(s["cupti"][2] - s["none"][2] for s in steps)
    generation_ms = 1000 * 256 / statistics.median(r["none"] for r in tok_s)
    assert generation_ms == pytest.approx(1006, abs=1)
    assert extra_ms == pytest.approx(1.8, abs=0.1)
    assert outside_ms == pytest.approx(1.6, abs=0.05)
