"""benchmarks/untraced_overhead.py's step accounting: which steps a sampled recording recorded or paused (the
recorder's own StepSlices), and the per-state step summary that says where a sampled arm's cost falls."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import untraced_overhead as bench  # noqa: E402


def test_step_labels_follow_the_recorder_slices() -> None:
    """A sixteenth over 258 steps: the first slice (8 steps and the step the pause comes after), 119 paused, the
    second slice at step 128, then paused after a resume; 17 of the 257 steps after the prefill recorded, as the
    recorder's note on the GPU said ("CUPTI recorded 17 of 257 steps")."""
    labels = bench.step_labels(0.0625, 258)
    runs = [(k, len(list(g))) for k, g in itertools.groupby(labels)]
    assert runs == [
        ("recorded", 9),
        ("paused, before any resume", 119),
        ("recorded", 9),
        ("paused, after a resume", 119),
        ("recorded", 2),
    ]
    from max_profile.collect.live.recorders import StepSlices

    slices = StepSlices(0.0625, 8)
    slices.opened(0)
    for i in range(257):
        toggle = slices.step_done(i)
        if toggle:
            slices.toggled(toggle, i, i)
    assert slices.steps_recorded == 17
    assert [k for k, _ in itertools.groupby(bench.step_labels(0.001, 258))] == ["recorded", "paused, before any resume"]


def test_segment_summary_puts_the_cost_where_the_steps_were_slower(capsys: pytest.CaptureFixture[str]) -> None:
    """Steps after a resume 10 % slower than untraced, the rest equal: only that run's ratio moves, each run named by
    its work steps (the prefill, step 0, has no step time)."""
    n = 257
    labels = bench.step_labels(0.0625, n + 1)[1:]
    base = [{"steps_ms": [2.0] * n}, {"steps_ms": [3.0] * n}]
    slow = [{"steps_ms": [(2.2 if lab == "paused, after a resume" else 2.0) * k for lab in labels]} for k in (1.0, 1.5)]
    bench.print_segment_summary({"none": base, "cupti": slow, "hook": base})
    out = capsys.readouterr().out
    assert "hook" not in out  # no CUPTI: no recorder states
    assert "recorded 1-8 (2.500 ms, paired to none 1.0000)" in out
    assert "paused, before any resume 9-127 (2.500 ms, paired to none 1.0000)" in out
    assert "recorded 128-136 (2.500 ms, paired to none 1.0000)" in out
    assert "paused, after a resume 137-255 (2.750 ms, paired to none 0.9091)" in out
    assert out.rstrip().endswith("recorded 256-257 (2.500 ms, paired to none 1.0000)")


def test_the_experiment_arms_record_as_the_default_with_one_thing_changed() -> None:
    """The arms queued for the next eager A/B: ``cupti-flush`` and ``cupti-sampled-no-launches`` record the default
    sixteenth (their steps summarised by the same recorder states), one with a flush at each pause (a recorder option
    the C recorder knows), the other without launch-call records."""
    from max_profile.collect.live.cupti_native import RECORDING_OPTIONS
    from max_profile.defaults import DEFAULT_KERNEL_SHARE

    for arm in ("cupti-flush", "cupti-sampled-no-launches"):
        assert arm in bench.ALL_ARMS and bench.arm_share(arm) == DEFAULT_KERNEL_SHARE
    assert bench.RECORDER_OPTIONS["cupti-flush"] == ("flush-at-pause",)
    assert all(o in RECORDING_OPTIONS for opts in bench.RECORDER_OPTIONS.values() for o in opts)
    assert "cupti-sampled-no-launches" not in bench.RECORDER_OPTIONS and bench.arm_share("cupti-no-launches") is None
