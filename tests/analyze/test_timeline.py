"""Which steps a capture's kernels are tied to (``analyze.timeline``), case by case with exact answers: range labels and
phases of every naming scheme, nested and duplicate ranges counted once, host steps aligned to our ranges one to one
(and the three ways that fails), MAX's scheduler ranges, host steps on the host clock only, invalid timestamps, and
each note word for word."""

from __future__ import annotations

import pytest

from max_profile.analyze.timeline import (
    align_steps_to_ranges,
    batch_of_range,
    drop_nested,
    is_our_range,
    is_scheduler_range,
    phase_of_range,
    range_label,
    step_timeline,
)
from max_profile.model import PhaseRange, Step

SCHED_TG = "_schedule(TextGenerationInputs(batch_size=4, batch_type=TG))"
SCHED_CE = "_schedule(TextGenerationInputs(batch_size=2, batch_type=CE))"


def _step(i: int, phase: str, start: int, end: int, batch: int = 1) -> Step:
    return Step(
        index=i,
        phase=phase,  # type: ignore[arg-type]
        batch_size=batch,
        input_tokens=7 if phase == "prefill" else batch,
        context_tokens=i,
        start_ns=start,
        end_ns=end,
    )


@pytest.mark.parametrize(
    ("name", "label", "phase"),
    [
        ("max_profile:decode", "decode", "decode"),
        ("max_profile/prefill", "prefill", "prefill"),
        (":max_profile/mixed", "mixed", "mixed"),
        (":other:decode", "decode", "decode"),  # a leading colon: the last part
        ("decode", "decode", "decode"),
        ("max_profile:drain", "drain", None),
        ("a:decode", "a:decode", None),  # no leading colon: the whole name
        (SCHED_TG, SCHED_TG, "decode"),
        (SCHED_CE, SCHED_CE, "prefill"),
    ],
)
def test_labels_and_phases(name: str, label: str, phase: str | None) -> None:
    assert range_label(name) == label and phase_of_range(name) == phase


def test_which_ranges_are_ours_or_the_schedulers_and_their_batch() -> None:
    assert is_our_range(PhaseRange("anything", 0, 1, domain="max_profile"))
    assert is_our_range(PhaseRange(":max_profile/drain", 0, 1)) and is_our_range(PhaseRange("prefill", 0, 1))
    assert not is_our_range(PhaseRange("drain", 0, 1)) and not is_our_range(PhaseRange(SCHED_TG, 0, 1))
    assert is_scheduler_range(PhaseRange(SCHED_CE, 0, 1)) and not is_scheduler_range(PhaseRange("decode", 0, 1))
    assert (batch_of_range(SCHED_TG), batch_of_range(SCHED_CE), batch_of_range("decode")) == (4, 2, 1)
    assert batch_of_range("_schedule(batch_size=128)") == 128


def test_nested_and_duplicate_ranges_count_once() -> None:
    """The outermost of ranges sharing a start is kept (ties by end, longest first); a range ending exactly at the kept
    one's end is inside it; one that ends after it is kept, and a later range inside either is dropped."""
    rs = [
        PhaseRange("decode", 100, 150),  # nested in [100, 200)
        PhaseRange("decode", 100, 200),
        PhaseRange("decode", 150, 200),  # ends where the kept one ends: inside
        PhaseRange("decode", 180, 260),  # overlaps past it: kept
        PhaseRange("decode", 210, 250),  # inside [180, 260)
        PhaseRange("decode", 300, 310),
    ]
    kept, dropped = drop_nested(rs)
    assert [(r.start_ns, r.end_ns) for r in kept] == [(100, 200), (180, 260), (300, 310)] and dropped == 3
    assert drop_nested([]) == ([], 0)


def test_host_steps_move_onto_our_ranges_one_to_one() -> None:
    steps = [_step(0, "prefill", 1, 2), _step(1, "decode", 3, 4), _step(2, "decode", 5, 6, batch=0)]
    ranges = [
        PhaseRange("max_profile:decode", 300, 400),
        PhaseRange("max_profile:prefill", 100, 200),
        PhaseRange("max_profile:drain", 500, 520),
    ]
    aligned = align_steps_to_ranges(steps, ranges)
    assert aligned is not None
    assert [(s.phase, s.start_ns, s.end_ns, s.input_tokens) for s in aligned] == [
        ("prefill", 100, 200, 7),
        ("decode", 300, 400, 1),
        ("decode", 500, 520, 0),
    ]
    assert align_steps_to_ranges(steps[:2], ranges) is None  # counts differ
    swapped = [PhaseRange("max_profile:decode", 100, 200), PhaseRange("max_profile:prefill", 300, 400)]
    assert align_steps_to_ranges(steps[:2], swapped) is None  # labels differ
    assert align_steps_to_ranges(steps[:2], [PhaseRange(SCHED_CE, 0, 1), PhaseRange(SCHED_TG, 2, 3)]) is None
    assert align_steps_to_ranges([], []) is None


def test_our_ranges_with_host_steps_give_the_aligned_work_steps() -> None:
    """Our ranges and host steps one to one: the steps that fed requests on the trace's clock (the drain left out);
    MAX's scheduler ranges of the same steps are said and not counted again; a nested range of ours is said."""
    steps = [_step(0, "prefill", 1, 2), _step(1, "decode", 3, 4), _step(2, "decode", 5, 6, batch=0)]
    ranges = [
        PhaseRange("max_profile:prefill", 100, 200),
        PhaseRange("max_profile:prefill", 110, 190),
        PhaseRange("max_profile:decode", 300, 400),
        PhaseRange("max_profile:drain", 500, 520),
        PhaseRange(SCHED_TG, 310, 390),
    ]
    tl = step_timeline(steps, ranges, host_clock=False)
    assert tl.source == "max_profile ranges + host steps"
    assert [(s.phase, s.start_ns, s.end_ns) for s in tl.steps] == [("prefill", 100, 200), ("decode", 300, 400)]
    assert tl.notes == [
        "1 nested or duplicate max_profile range(s) counted once",
        "1 MAX scheduler range(s) describe the same steps as the max_profile ranges: not counted again",
    ]
    assert tl.span == (100, 400)


def test_our_ranges_that_do_not_match_the_host_steps() -> None:
    """Steps from our ranges alone: the batch from the name (1), decode's tokens its batch, prefill's none, a range of
    no phase left out; the mismatch said with both counts."""
    ranges = [
        PhaseRange("max_profile:prefill", 100, 200),
        PhaseRange("max_profile:decode", 300, 400),
        PhaseRange("max_profile:drain", 500, 520),
    ]
    tl = step_timeline([_step(0, "prefill", 1, 2)], ranges, host_clock=True)
    assert tl.source == "max_profile ranges"
    assert [(s.index, s.phase, s.batch_size, s.input_tokens, s.context_tokens) for s in tl.steps] == [
        (0, "prefill", 1, 0, None),
        (1, "decode", 1, 1, None),
    ]
    assert tl.notes == [
        "3 max_profile ranges do not match the 1 host steps one to one: steps taken from the ranges (no token counts)"
    ]
    alone = step_timeline([], ranges, host_clock=True)
    assert alone.source == "max_profile ranges" and alone.notes == [] and len(alone.steps) == 2


def test_scheduler_ranges_when_none_of_ours() -> None:
    ranges = [PhaseRange(SCHED_CE, 100, 200), PhaseRange(SCHED_TG, 300, 400), PhaseRange(SCHED_TG, 300, 400)]
    tl = step_timeline([_step(0, "decode", 1, 2)], ranges, host_clock=True)
    assert tl.source == "MAX scheduler ranges"
    assert [(s.phase, s.batch_size, s.input_tokens) for s in tl.steps] == [("prefill", 2, 0), ("decode", 4, 4)]
    assert tl.notes == ["1 nested or duplicate MAX scheduler range(s) counted once"]


def test_host_steps_only_on_the_host_clock() -> None:
    steps = [_step(1, "decode", 300, 400), _step(0, "prefill", 100, 200), _step(2, "decode", 500, 600, batch=0)]
    tl = step_timeline(steps, [], host_clock=True)
    assert tl.source == "host steps" and [s.index for s in tl.steps] == [0, 1] and tl.notes == []
    other = step_timeline(steps, [], host_clock=False)
    assert (other.source, other.steps, other.span) == ("none", [], None)
    assert other.notes == [
        "host steps are on another clock than the trace and no range of ours aligns them: kernels are not split by step"
    ]
    idle = step_timeline([_step(0, "decode", 1, 2, batch=0)], [], host_clock=False)
    assert (idle.source, idle.notes) == ("none", [])


def test_ranges_with_invalid_timestamps_are_left_out_and_said() -> None:
    """A negative start or an end before the start is dropped; a range of no length is kept (its step too)."""
    ranges = [
        PhaseRange("max_profile:decode", -5, 10),
        PhaseRange("max_profile:decode", 50, 40),
        PhaseRange("max_profile:decode", 0, 0),
        PhaseRange("max_profile:decode", 100, 200),
    ]
    tl = step_timeline([], ranges, host_clock=True)
    assert [(s.start_ns, s.end_ns) for s in tl.steps] == [(0, 0), (100, 200)]
    assert tl.notes == ["2 range(s) with invalid timestamps (negative, or ending before they start) were left out"]


def test_a_range_of_no_phase_between_steps_is_skipped_not_the_end() -> None:
    ranges = [
        PhaseRange("max_profile:prefill", 100, 200),
        PhaseRange("max_profile:warmup", 250, 260),
        PhaseRange("max_profile:decode", 300, 400),
    ]
    tl = step_timeline([], ranges, host_clock=True)
    assert [(s.index, s.phase) for s in tl.steps] == [(0, "prefill"), (1, "decode")]


def test_host_steps_keep_the_notes_about_invalid_ranges() -> None:
    """Ranges that are all invalid leave the host steps as the timeline; the note about them stays."""
    tl = step_timeline([_step(0, "decode", 100, 200)], [PhaseRange("max_profile:decode", 50, 40)], host_clock=True)
    assert tl.source == "host steps"
    assert tl.notes == ["1 range(s) with invalid timestamps (negative, or ending before they start) were left out"]
