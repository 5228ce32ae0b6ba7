"""The steps a capture's kernels are attributed to: one interval per step, whatever the sources.

A capture can carry up to three descriptions of the same steps:

1. our phase ranges (NVTX / roctx domain ``max_profile``: ``max_profile:prefill`` ...), on the
   kernels' clock;
2. MAX's scheduler ranges ``_schedule(TextGenerationInputs(batch_size=N, batch_type=CE|TG))``
   (``max serve`` with ``MODULAR_ENABLE_PROFILING=on``), on the kernels' clock;
3. host steps from the pipeline hook (token counts, context lengths), on the host clock.

They are not added up (that counted every step twice): the step intervals come from ours if the
trace has them, else from MAX's scheduler ranges, else from the host steps (only when the kernels
are on the host clock). Host steps lend their token counts to our ranges when the two match one
to one. Nested or duplicate ranges of one kind count once (the outermost is kept).

Pure functions; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from max_profile.model import Phase, PhaseRange, RawCapture, Step
from max_profile.model.tags import StepSource

PHASE_NAMES: tuple[str, ...] = ("prefill", "decode", "mixed")
_OUR_PREFIXES = ("max_profile:", "max_profile/", ":max_profile/")


def range_label(name: str) -> str:
    """``max_profile:decode`` / ``:max_profile/decode`` / ``decode`` -> ``decode``."""
    for prefix in _OUR_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name.rsplit(":", 1)[-1] if name.startswith(":") else name


def is_our_range(r: PhaseRange) -> bool:
    """A range max_profile pushed (any label, ``drain`` included), or a bare phase name."""
    if r.domain == "max_profile" or r.name.startswith(_OUR_PREFIXES):
        return True
    return r.name in PHASE_NAMES


def is_scheduler_range(r: PhaseRange) -> bool:
    return "_schedule(" in r.name


def phase_of_range(name: str) -> Phase | None:
    """Phase named by a range: ours (``prefill``, ``max_profile:decode``) or MAX's scheduler ranges."""
    label = range_label(name)
    if label in PHASE_NAMES:
        return label  # type: ignore[return-value]
    if "batch_type=CE" in name:
        return "prefill"
    if "batch_type=TG" in name:
        return "decode"
    return None


_BATCH = re.compile(r"batch_size=(\d+)")


def batch_of_range(name: str) -> int:
    m = _BATCH.search(name)
    return int(m.group(1)) if m else 1


def drop_nested(ranges: Sequence[PhaseRange]) -> tuple[list[PhaseRange], int]:
    """Ranges in start order with those inside an earlier kept one (nested or duplicate) dropped; and how many."""
    kept: list[PhaseRange] = []
    dropped = 0
    outer_end = None
    for r in sorted(ranges, key=lambda r: (r.start_ns, -r.end_ns)):
        if outer_end is not None and r.end_ns <= outer_end:
            dropped += 1
            continue
        kept.append(r)
        outer_end = r.end_ns if outer_end is None else max(outer_end, r.end_ns)
    return kept, dropped


def align_steps_to_ranges(steps: Sequence[Step], ranges: Sequence[PhaseRange]) -> list[Step] | None:
    """Host steps moved onto the trace's clock: the k-th range of ours is the k-th step.

    None when the ranges of ours do not match the steps one to one (count and label, ``drain`` for
    the overlap pipeline's empty call).
    """
    ours = sorted((r for r in ranges if is_our_range(r)), key=lambda r: r.start_ns)
    if not ours or len(ours) != len(steps):
        return None
    out = []
    for st, r in zip(steps, ours, strict=True):
        if range_label(r.name) != (st.phase if st.batch_size else "drain"):
            return None
        out.append(msgspec.structs.replace(st, start_ns=r.start_ns, end_ns=r.end_ns))
    return out


@dataclass
class Timeline:
    """The steps kernels are attributed to, in time order (only steps that carried requests)."""

    steps: list[Step]
    source: StepSource
    """``max_profile ranges + host steps``, ``max_profile ranges``, ``MAX scheduler ranges``, ``host steps`` or
    ``none``."""
    notes: list[str] = field(default_factory=list)

    @property
    def span(self) -> tuple[int, int] | None:
        return (min(s.start_ns for s in self.steps), max(s.end_ns for s in self.steps)) if self.steps else None


def _steps_from_ranges(ranges: Sequence[PhaseRange]) -> list[Step]:
    out: list[Step] = []
    for r in ranges:
        phase = phase_of_range(r.name)
        if phase is None:
            continue
        batch = batch_of_range(r.name)
        out.append(
            Step(
                index=len(out),
                phase=phase,
                batch_size=batch,
                input_tokens=batch if phase == "decode" else 0,
                context_tokens=None,
                start_ns=r.start_ns,
                end_ns=max(r.end_ns, r.start_ns),
            )
        )
    return out


def step_timeline(host_steps: Sequence[Step], ranges: Sequence[PhaseRange], *, host_clock: bool) -> Timeline:
    """Pick the step intervals (see the module docstring). ``host_clock``: kernels share the host steps' clock."""
    notes: list[str] = []
    usable = [r for r in ranges if 0 <= r.start_ns <= r.end_ns]
    if len(usable) < len(ranges):
        notes.append(
            f"{len(ranges) - len(usable)} range(s) with invalid timestamps (negative, or ending before they start) "
            "were left out"
        )
        ranges = usable
    ours, dropped_ours = drop_nested([r for r in ranges if is_our_range(r)])
    scheduler, dropped_sched = drop_nested([r for r in ranges if is_scheduler_range(r)])
    if ours:
        if dropped_ours:
            notes.append(f"{dropped_ours} nested or duplicate max_profile range(s) counted once")
        if scheduler:
            notes.append(
                f"{len(scheduler)} MAX scheduler range(s) describe the same steps as the max_profile ranges: not "
                "counted again"
            )
        aligned = align_steps_to_ranges(host_steps, ours) if host_steps else None
        if aligned is not None:
            return Timeline([s for s in aligned if s.batch_size > 0], StepSource.OURS_AND_HOST, notes)
        if host_steps:
            notes.append(
                f"{len(ours)} max_profile ranges do not match the {len(host_steps)} host steps one to one: "
                "steps taken from the ranges (no token counts)"
            )
        return Timeline(_steps_from_ranges(ours), StepSource.OURS, notes)
    if scheduler:
        if dropped_sched:
            notes.append(f"{dropped_sched} nested or duplicate MAX scheduler range(s) counted once")
        return Timeline(_steps_from_ranges(scheduler), StepSource.SCHEDULER, notes)
    work = [s for s in host_steps if s.batch_size > 0]
    if work and host_clock:
        return Timeline(sorted(work, key=lambda s: s.start_ns), StepSource.HOST, notes)
    if work:
        notes.append(
            "host steps are on another clock than the trace and no range of ours aligns them: kernels are not split by "
            "step"
        )
    return Timeline([], StepSource.NONE, notes)


def valid_host_steps(raw: RawCapture) -> list[Step]:
    """The capture's host steps whose timestamps make sense (not negative, not ending before they start)."""
    return [s for s in raw.steps if 0 <= s.start_ns <= s.end_ns]


def capture_timeline(raw: RawCapture) -> Timeline:
    """The steps a raw capture's kernels are attributed to: what the report's breakdown and the Perfetto trace both
    use."""
    return step_timeline(valid_host_steps(raw), raw.ranges, host_clock=raw.kernel_clock == "host")
