"""What tracing cost against no profiler and untraced windows (issue 34; tests/data/h200/session22/README.md): two H100
leases (the H200 stopped answering), MAX 26.7, the 3B shape. Data integrity of the committed measurements: the figures
the README states, recomputed from each round and window the benchmarks wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .h200_data import acceptance_rows, against_none, paired_steps

S22 = Path(__file__).parent / "data" / "h200" / "session22"


def _doc(name: str) -> dict[str, Any]:
    return json.loads((S22 / name).read_text())  # type: ignore[no-any-return]


def test_the_steps_that_ran_and_the_card() -> None:
    rows = acceptance_rows(S22 / "lease1" / "acceptance.tsv")
    assert [(r[0], r[1]) for r in rows] == [
        ("make_m3b", "0"),
        ("serve_ab_3b", "0"),
        ("overhead_3b_eager", "0"),
        ("make_mops", "0"),
        ("serve_ops_custom", "3"),
        ("kernel_ops_custom", "1"),
    ]
    assert "NVIDIA H100 80GB HBM3" in (S22 / "lease1" / "nvidia-smi.csv").read_text()
    refusal = (S22 / "lease1" / "serve_ops_custom.stderr.txt").read_text()
    assert "nvtxRangeStartEx" in refusal and "pip install 'nvidia-nvtx-cu12==12.1.105'" in refusal


@pytest.mark.parametrize(
    ("arm", "expected"),
    [("hook", (0.9884, 0.9811, 0.9872)), ("sampler", (0.9841, 0.9858, 0.9765)), ("cupti", (0.9580, 0.9530, 0.9575))],
)
def test_eager_against_no_profiler_over_21_rounds(arm: str, expected: tuple[float, float, float]) -> None:
    doc = _doc("lease1/overhead_3b_eager.json")
    assert doc["repeats"] == 21 and doc["tokens"] == 256 and doc["batch"] == 1 and doc["device_graph_capture"] is False
    assert against_none([doc], arm) == pytest.approx(expected, abs=5e-5)
    if arm == "cupti":
        said = " ".join(doc["notes"]["cupti"])
        assert "CUPTI recorded 17 of 257 steps" in said and "4 pause / resume calls took 0.85 ms" in said
        assert sum(s < 1 for s in paired_steps([doc], "cupti")) == 14


@pytest.mark.parametrize(
    ("lease", "variant", "ratios"),
    [
        ("lease1", "default", [1.0081, 1.0176, 0.9808]),
        ("lease1", "steps", [1.0069, 1.0255, 0.9953]),
        ("lease1", "share=0.001", [0.9974, 1.0068, 1.0006]),
        ("lease2", "default", [0.9430, 1.2063, 0.9678]),
        ("lease2", "full", [0.9276, 0.9508, 0.9510]),
    ],
)
def test_served_rounds_as_the_readme_states(lease: str, variant: str, ratios: list[float]) -> None:
    """Each round's ratio recomputed from its windows: the variant's tok/s over the round's untraced window's."""
    doc = _doc(f"{lease}/serve_ab_3b.json")
    windows = doc["windows"]
    per_round = len(doc["variants"]) + 1
    got = []
    for k in range(doc["rounds"]):
        chunk = windows[k * per_round : (k + 1) * per_round]
        untraced = next(w["tok_s"] for w in chunk if w["variant"] is None)
        got.append(next(w["tok_s"] for w in chunk if w["variant"] == variant) / untraced)
    assert got == pytest.approx(ratios, abs=5e-5) and doc["variants"][variant]["ratios"] == pytest.approx(got)


def test_lease1_recorded_only_its_first_default_window() -> None:
    """Window 2 kept six slices' worth (311,464) but counted them in the wrong slices; windows 5 and 12 held none."""
    windows = {w["window"]: w for w in _doc("lease1/serve_ab_3b.json")["windows"]}
    assert [i for i, w in windows.items() if w["variant"] == "default"] == [2, 5, 12]
    assert windows[2]["worker_kernels"] == 311_464 and windows[2]["kernels"] == 259_602
    assert windows[2]["worker_per_slice"] == [51_862, 248_742, 10_860, 0, 0, 0]
    assert windows[5]["kernels"] == windows[12]["kernels"] == 0
    untraced_steps = [w["server_tg_ms"] for w in windows.values() if w["variant"] is None]
    assert min(untraced_steps) < windows[2]["server_tg_ms"] < max(untraced_steps)


def test_lease2_recorded_every_window_evenly() -> None:
    windows = _doc("lease2/serve_ab_3b.json")["windows"]
    default = [w for w in windows if w["variant"] == "default"]
    full = [w for w in windows if w["variant"] == "full"]
    assert all(151_000 < w["kernels"] < 179_000 for w in default)
    assert all(567_000 < w["kernels"] < 681_000 for w in full)
    for w in default:
        per_slice = w["worker_per_slice"]
        assert len(per_slice) == 6 and min(per_slice) > 0.5 * max(per_slice)
    assert all(w["worker_dropped"] == 0 for w in default + full)
