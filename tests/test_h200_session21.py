"""What tracing cost against no profiler, in-process and served (issue 34; tests/data/h200/session21/README.md): an H100
lease (the H200 was not lent), MAX 26.7, the 3B shape with graphs on and eager, the 5.2B model, and serve's recorder
A/B on one server. Data integrity of the committed measurements: the figures the README states, recomputed from each
round the benchmarks wrote (no package code judged here, except the reading of serve's windows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .h200_data import acceptance_rows, against_none

S21 = Path(__file__).parent / "data" / "h200" / "session21"


def _doc(name: str) -> dict[str, Any]:
    return json.loads((S21 / name).read_text())  # type: ignore[no-any-return]


def test_every_step_ran_and_the_card_is_named() -> None:
    rows = acceptance_rows(S21 / "acceptance.tsv")
    assert [r[0] for r in rows] == [
        "make_m3b",
        "overhead_3b_graphs",
        "overhead_3b_eager",
        "serve_ab_3b",
        "make_m24",
        "overhead_m24_graphs",
        "overhead_3b_graphs",
        "serve_ab_3b",
    ]
    assert all(r[1] == "0" for r in rows)
    assert "NVIDIA H100 80GB HBM3" in (S21 / "nvidia-smi.csv").read_text()


@pytest.mark.parametrize(
    ("files", "rounds", "arm", "expected"),
    [
        (["overhead_3b_graphs.json"], 11, "cupti", (0.9894, 0.9883, 1.0000)),
        (["overhead_3b_graphs_r2.json"], 15, "cupti", (1.0286, 1.0083, 0.9980)),
        (["overhead_3b_graphs.json", "overhead_3b_graphs_r2.json"], 26, "cupti", (1.0180, 0.9921, 0.9998)),
        (["overhead_3b_eager.json"], 11, "cupti", (0.9492, 0.9696, 0.9765)),
        (["overhead_3b_eager.json"], 11, "hook", (0.9924, 0.9471, 0.9665)),
        (["overhead_m24_graphs.json"], 11, "cupti", (0.9910, 1.0066, 1.0003)),
    ],
)
def test_in_process_figures_as_the_readme_states(
    files: list[str], rounds: int, arm: str, expected: tuple[float, float, float]
) -> None:
    docs = [_doc(f) for f in files]
    assert sum(d["repeats"] for d in docs) == rounds and all(d["tokens"] == 256 and d["batch"] == 1 for d in docs)
    assert all(d["device_graph_capture"] is ("eager" not in f) for d, f in zip(docs, files, strict=True))
    assert against_none(docs, arm) == pytest.approx(expected, abs=5e-5)


def test_with_graphs_the_sixteenth_leaves_every_step_as_untraced() -> None:
    """The step, not the stalls: every arm's decode step p50 inside 2.46-2.53 ms (3B) and 3.90-3.92 ms (5.2B), rounded,
    in every round; the sixteenth recorded 17 of 257 steps with 4 pause / resume calls."""
    for name, (low, high) in {
        "overhead_3b_graphs.json": (2.455, 2.535),
        "overhead_3b_graphs_r2.json": (2.455, 2.535),
        "overhead_m24_graphs.json": (3.895, 3.925),
    }.items():
        doc = _doc(name)
        for arm, rows in doc["steps"].items():
            assert all(low <= r["p50_ms"] <= high for r in rows), (name, arm)
        said = " ".join(doc["notes"]["cupti"])
        assert "CUPTI recorded 17 of 257 steps" in said and "4 pause / resume calls" in said


def test_served_rounds_as_the_readme_states() -> None:
    """Per round recorded / untraced for each variant, and the windows that lost their kernels: the last default
    window of server 1 (none in the window), server 2's windows 9 and 11 (about 10k, none inside a device graph),
    while CUPTI's callbacks in them took as long as in whole windows."""
    one, two = _doc("serve_ab_3b.json"), _doc("serve_ab_3b_r2.json")
    ratios = {
        (n, v): [round(r, 4) for r in d["variants"][v]["ratios"]]
        for n, d in ((1, one), (2, two))
        for v in ("default", "share=0.0625")
    }
    assert ratios == {
        (1, "default"): [0.9935, 0.9567, 0.9976],
        (1, "share=0.0625"): [0.9608, 0.9753, 1.0102],
        (2, "default"): [0.9917, 0.9057, 0.9781, 0.9234],
        (2, "share=0.0625"): [0.9230, 0.9459, 0.9934, 0.9415],
    }
    assert round(one["variants"]["default"]["median_ratio"], 4) == 0.9935
    assert round(two["variants"]["default"]["median_ratio"], 4) == 0.9507
    kernels = {(n, w["window"]): w["kernels"] for n, d in ((1, one), (2, two)) for w in d["windows"] if w["traced"]}
    whole = [k for (n, i), k in kernels.items() if (n, i) not in {(1, 9), (2, 9), (2, 11)}]
    assert kernels[(1, 9)] == 0 and kernels[(2, 9)] == 10610 and kernels[(2, 11)] == 10428
    assert min(whole) > 36_000
    lost = [w for w in two["windows"] if w["window"] in (9, 11)]
    assert all(w["gpu_waits_before_graphs"] == 0 and w["callback_s"] > 0.004 for w in lost)  # records arrived
    assert one["windows"][8]["callback_s"] == 0.0  # server 1's lost window: none reached the worker
    untraced_step = [w["server_tg_ms"] for w in two["windows"] if not w["traced"]]
    assert untraced_step[0] < 2.74 and max(untraced_step) > 3.06  # server 2 drifted
