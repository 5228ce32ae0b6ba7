"""Where the GPU time goes: kernels tied to steps and phases, aggregated by family and name.

Attribution (one rule for every source): a kernel belongs to the step whose interval holds the
moment it was asked for — the start of its launch call on any thread of the process, or its own
start when the trace has no launch record for it. MAX launches from runtime worker threads, not
the thread that holds the phase ranges, so thread matching would drop those kernels. Records
with invalid timestamps (negative, or ending before they start: CUPTI hands out zero timestamps
now and then) are dropped and counted. The steps themselves come from
:func:`max_profile.analyze.timeline.step_timeline`.

Without any step, the whole-capture figures still stand: families, top kernels, and GPU busy
over the capture window (union of kernel intervals / window).

Pure functions over numpy columns: a million kernels take well under a second.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec
import numpy as np

from max_profile.analyze.families import FAMILIES, base_name, classify_kernel, distinctive_regex
from max_profile.model import (
    DeviceBreakdown,
    FamilyRow,
    GpuWaits,
    KernelBreakdown,
    KernelRow,
    KernelTable,
    KernelTotal,
    Phase,
    PhaseBreakdown,
    Step,
    StepKernels,
    merged_spans,
)
from max_profile.model.tags import StepSource

PHASES: tuple[Phase, ...] = ("prefill", "mixed", "decode", "unknown")
TOP_N = 15
PER_STEP_LIMIT = 4096
"""Steps whose per-step figures are kept in the report (the first ones, in time order)."""


def valid_kernels(table: KernelTable) -> np.ndarray:
    """Mask of records with usable timestamps: start >= 0 and end >= start."""
    return (table.start_ns >= 0) & (table.end_ns >= table.start_ns)


def in_start_order(start: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """``start`` and the columns beside it in start order (ties kept in order); the arrays themselves when they are in
    that order already (a trace usually is: no sort and no copy of a million kernels)."""
    if start.size < 2 or not bool((start[1:] < start[:-1]).any()):
        return (start, *columns)
    order = np.argsort(start, kind="stable")
    return tuple(c[order] for c in (start, *columns))


def kept_columns(mask: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """The entries of each column that ``mask`` keeps; the columns themselves, not copies, when it keeps every entry (a
    million kernels in one window: no 8 MB copy per column)."""
    if bool(mask.all()):
        return columns
    return tuple(column[mask] for column in columns)


def union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Total length of the union of intervals (busy time, overlapping kernels counted once)."""
    if start.size == 0:
        return 0
    start, end = in_start_order(start, end)
    run_end = np.maximum.accumulate(end)  # a block of overlapping intervals ends at its running maximum end
    new_block = np.empty(start.size, dtype=bool)
    new_block[0] = True
    np.greater(start[1:], run_end[:-1], out=new_block[1:])
    last_of_block = np.empty(start.size, dtype=bool)
    last_of_block[:-1] = new_block[1:]
    last_of_block[-1] = True
    return int((run_end[last_of_block] - start[new_block]).sum())


def interval_index(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the interval (sorted by start, none overlapping) containing each t (ends included), -1 if none."""
    if starts.size == 0:
        return np.full(t.shape, -1, dtype=np.int64)
    idx = np.searchsorted(starts, t, side="right")
    idx -= 1
    inside = t <= ends[np.maximum(idx, 0)]
    inside &= idx >= 0
    idx[~inside] = -1
    return idx


def step_index_of(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the step (sorted by start) whose interval holds each time ``t`` (ends included), -1 for none: how a
    kernel is tied to the step that asked for it (``t``: its launch time, else its start)."""
    return interval_index(starts, ends, t)


def _family_rows(fam_idx: np.ndarray, dur: np.ndarray, counts_override: np.ndarray | None = None) -> list[FamilyRow]:
    total = float(dur.sum())
    counts = (
        np.bincount(fam_idx, weights=counts_override, minlength=len(FAMILIES))
        if counts_override is not None
        else np.bincount(fam_idx, minlength=len(FAMILIES))
    )
    sums = np.bincount(fam_idx, weights=dur, minlength=len(FAMILIES))
    rows = [
        FamilyRow(
            family=FAMILIES[i],
            kernels=int(counts[i]),
            total_ms=float(sums[i]) / 1e6,
            share_pct=100.0 * float(sums[i]) / total if total else 0.0,
        )
        for i in range(len(FAMILIES))
        if counts[i]
    ]
    rows.sort(key=lambda r: -r.total_ms)
    return rows


def _kernel_rows(
    base_idx: np.ndarray,
    bases: list[str],
    base_fam: list[str],
    dur: np.ndarray,
    top: int,
    counts_override: np.ndarray | None = None,
) -> list[KernelRow]:
    total = float(dur.sum())
    counts = (
        np.bincount(base_idx, weights=counts_override, minlength=len(bases))
        if counts_override is not None
        else np.bincount(base_idx, minlength=len(bases))
    )
    sums = np.bincount(base_idx, weights=dur, minlength=len(bases))
    order = np.argsort(-sums, kind="stable")[:top]
    return [
        KernelRow(
            name=bases[i],
            family=base_fam[i],
            count=int(counts[i]),
            total_ms=float(sums[i]) / 1e6,
            mean_us=float(sums[i]) / counts[i] / 1e3,
            share_pct=100.0 * float(sums[i]) / total if total else 0.0,
        )
        for i in order
        if counts[i]
    ]


class _Names:
    """Per distinct name: base name index, family index (classified once per name)."""

    def __init__(self, names: Sequence[str]) -> None:
        base_index: dict[str, int] = {}
        self.to_base = np.array(
            [base_index.setdefault(base_name(nm), len(base_index)) for nm in names] or [0], dtype=np.int32
        )
        self.bases = list(base_index)
        self.family = np.array([FAMILIES.index(classify_kernel(nm)) for nm in names] or [0], dtype=np.int32)
        self.base_family = [""] * len(self.bases)
        for i in range(len(names)):
            self.base_family[self.to_base[i]] = FAMILIES[self.family[i]]


def _unknown_names(fam_idx: np.ndarray, base_idx: np.ndarray, dur: np.ndarray, names: _Names) -> list[str]:
    other = fam_idx == FAMILIES.index("other")
    if not other.any():
        return []
    sums = np.bincount(base_idx[other], weights=dur[other], minlength=len(names.bases))
    return [names.bases[i] for i in np.argsort(-sums, kind="stable")[:25] if sums[i] > 0]


def recorded_in_window(window: tuple[int, int], recorded: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The recorded slices clipped to the window, in time order (empty slices dropped, overlapping ones merged: the
    slices of several recording processes)."""
    return merged_spans((max(a, window[0]), min(b, window[1])) for a, b in recorded)


def coverage_before(starts: np.ndarray, ends: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """f(t): the length of the (merged) intervals lying before t: the part of [a, b] they cover is f(b) - f(a)."""
    spans = merged_spans(zip(starts.tolist(), ends.tolist(), strict=True))
    if not spans:
        return lambda t: np.zeros(t.shape, dtype=np.float64)
    a = np.array([x for x, _ in spans], dtype=np.int64)
    b = np.array([y for _, y in spans], dtype=np.int64)
    before = np.concatenate([[0], np.cumsum(b - a)]).astype(np.float64)  # length of the spans wholly before span i

    length = (b - a).astype(np.float64)

    def f(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(a, t, side="right")
        i -= 1
        np.maximum(i, 0, out=i)  # the span starting at or before t (else the first)
        into = a[i]
        np.subtract(t, into, out=into)  # how far into span i t lies
        # clipped to the span: before the first span t - a[0] < 0 gives 0 (and before[0] is 0); one column at a time,
        # so a million gaps hold a few arrays, not a dozen
        covered = length[i]
        np.minimum(covered, into, out=covered)
        del into
        np.maximum(covered, 0, out=covered)
        covered += before[i]
        return covered

    return f


def observed_shares(
    step_start: np.ndarray,
    step_end: np.ndarray,
    spans: Sequence[tuple[int, int]] | None,
    launched: np.ndarray | None = None,
) -> np.ndarray:
    """How much of each step was recorded: what every per-step figure divides by (a sampled capture's steps outside
    its slices were not recorded).

    Without ``launched``, the share of each step inside ``spans`` (the observed window; None: every step whole); a step
    of no length counts whole when it starts inside a span. With ``launched`` (a sampled recording: whether each step
    launched a recorded kernel), a step counts whole when it did and not at all when it did not: a GPU step launches
    kernels every time, and a slice's span, which runs on the GPU's clock from its first recorded kernel's start to its
    last one's end, cuts the host's steps wrongly at both ends (the first step's launches came before its kernels ran;
    the next step's host time lies inside the last kernels' tail, its launches in the pause). Read by their spans, the
    same generation recorded in slices counted 3 % more steps than it recorded, or 5 % fewer. A step cut by a
    time-sliced recording (a server's) counts whole: two of a slice's hundreds of steps."""
    if spans is None:
        return np.ones(step_start.shape, dtype=np.float64)
    if launched is not None:
        return launched.astype(np.float64)
    seen = coverage_before(
        np.array([a for a, _ in spans], dtype=np.int64), np.array([b for _, b in spans], dtype=np.int64)
    )
    return np.where(
        step_end > step_start,
        (seen(step_end) - seen(step_start)) / np.maximum(step_end - step_start, 1),
        ((seen(step_start + 1) - seen(step_start)) > 0).astype(np.float64),
    )


def steps_launching(step_of: np.ndarray, steps: int) -> np.ndarray:
    """Per step: whether any kernel was tied to it (``step_of``: each kernel's step index, -1 for none)."""
    return np.bincount(step_of[step_of >= 0], minlength=steps)[:steps] > 0


LOST_RECORDS_RATIO = 0.2
"""A recorded slice whose kernels per working step fall below this share of the median slice's lost its records."""


class LostSlices(NamedTuple):
    """What :func:`slices_without_records` found."""

    spans: list[tuple[int, int]]
    """The recorded slices that lost their records (clipped to the window, merged)."""
    kernels_per_step: float
    """The median kernels per step of those slices (0 when none)."""
    typical: float
    """The median kernels per step of the judged slices (0 when none was judged)."""
    slices: int
    """The recorded slices inside the window."""
    kernels: np.ndarray
    """Mask over the table: the kernels asked for inside a lost slice."""


def slices_without_records(
    table: KernelTable,
    steps: Sequence[Step],
    recorded: Sequence[tuple[int, int]],
    window: tuple[int, int] | None,
    min_steps: int = 3,
) -> LostSlices:
    """The recorded slices of a sampled recording that held working steps but almost no kernel records: each of at
    least ``min_steps`` steps, and kernels per step (by :meth:`KernelTable.attribution_time`) under
    ``LOST_RECORDS_RATIO`` of the median of such slices (judged with three or more). A GPU step launches its kernels
    every time, so such a slice lost its records (served windows of ~230k kernels have come back with 0 or 10k and none
    of their device graphs'), and its busy and idle shares would blame the host."""
    in_lost = np.zeros(len(table), dtype=bool)
    if not recorded or window is None:
        return LostSlices([], 0.0, 0.0, 0, in_lost)
    slices = recorded_in_window(window, recorded)
    begins = np.sort(np.array([s.start_ns for s in steps if s.batch_size > 0], dtype=np.int64))
    asked = table.attribution_time() if len(table) else np.zeros(0, dtype=np.int64)
    t = np.sort(asked)
    rated: list[tuple[tuple[int, int], float]] = []
    for a, b in slices:
        n_steps = int(np.searchsorted(begins, b) - np.searchsorted(begins, a))
        if n_steps >= min_steps:
            rated.append(((a, b), float(np.searchsorted(t, b) - np.searchsorted(t, a)) / n_steps))
    if len(rated) < 3:
        return LostSlices([], 0.0, 0.0, len(slices), in_lost)
    typical = float(np.median([r for _, r in rated]))
    lost = [(span, r) for span, r in rated if r < LOST_RECORDS_RATIO * typical]
    for (a, b), _ in lost:
        in_lost |= (asked >= a) & (asked < b)
    rate = float(np.median([r for _, r in lost])) if lost else 0.0
    return LostSlices([span for span, _ in lost], rate, typical, len(slices), in_lost)


def gpu_waits(
    table: KernelTable,
    window: tuple[int, int] | None,
    min_gap_ns: int,
    max_gap_ns: int,
    recorded: Sequence[tuple[int, int]] = (),
) -> GpuWaits | None:
    """The GPU's waits for work in the window (see :class:`GpuWaits`): on the device with the most kernels, the gaps of
    ``min_gap_ns`` up to ``max_gap_ns`` between the merged kernel intervals, and those ending at a kernel of a device
    graph.
    ``recorded``: the slices kernels were recorded in (a sampled recording): only gaps inside one slice count, and
    shares are of the slices' time."""
    if len(table) < 2 or window is None or window[1] <= window[0]:
        return None
    slices = recorded_in_window(window, recorded) if recorded else [window]
    if not slices:
        return None
    devices, counts = np.unique(table.device, return_counts=True)
    inside = (
        (table.device == devices[int(np.argmax(counts))]) & (table.start_ns >= window[0]) & (table.start_ns < window[1])
    )
    if int(inside.sum()) < 2:
        return None
    start, end = kept_columns(inside, table.start_ns, table.end_ns)
    graph_ids = (
        kept_columns(inside, table.graph_id)[0] if table.graph_id is not None else np.zeros(start.size, dtype=np.int64)
    )
    start, end, graph = in_start_order(start, end, graph_ids)
    gap = np.maximum.accumulate(end[:-1])  # where the busy run before each next kernel ends
    np.subtract(start[1:], gap, out=gap)
    same_slice = np.ones(gap.size, dtype=bool)
    if recorded:  # a gap from one slice into the next is the recording's pause, not the GPU waiting
        slice_of = np.searchsorted(np.array([a for a, _ in slices], dtype=np.int64), start, side="right")
        same_slice = slice_of[1:] == slice_of[:-1]
    counted = (gap >= min_gap_ns) & (gap < max_gap_ns) & same_slice
    before_graph = counted & (graph[1:] > 0)
    longer = (gap >= max_gap_ns) & same_slice
    span = sum(b - a for a, b in slices)
    waits = gap[counted]
    waited = float(waits.sum())  # integer nanoseconds: exact in any order
    before_graph_ns = float(gap[before_graph].sum())
    longer_ns = float(gap[longer].sum())
    del gap
    return GpuWaits(
        min_gap_us=min_gap_ns / 1e3,
        max_gap_ms=max_gap_ns / 1e6,
        gaps=int(waits.size),
        waited_ms=waited / 1e6,
        waited_pct=100.0 * waited / span,
        before_graph_gaps=int(before_graph.sum()),
        before_graph_ms=before_graph_ns / 1e6,
        before_graph_pct=100.0 * before_graph_ns / span,
        gap_p50_us=float(np.median(waits, overwrite_input=True)) / 1e3 if waits.size else None,
        longer_gaps=int(longer.sum()),
        longer_ms=longer_ns / 1e6,
    )


def _window_and_busy(
    table: KernelTable,
    t_attr: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    window: tuple[int, int] | None,
    recorded: Sequence[tuple[int, int]],
) -> tuple[tuple[int, int] | None, int, int | None, int]:
    """(window, its length, the recorded slices' length or None, the GPU's busy time in it): the window defaults to
    the first launch or step start through the last kernel or step end."""
    n = len(table)
    lo_candidates = [int(t_attr.min())] if n else []
    hi_candidates = [int(table.end_ns.max())] if n else []
    if starts.size:
        lo_candidates.append(int(starts.min()))
        hi_candidates.append(int(ends.max()))
    if window is None and lo_candidates:
        window = (min(lo_candidates), max(hi_candidates))
    window_ns = (window[1] - window[0]) if window else 0
    recorded_ns = sum(b - a for a, b in recorded_in_window(window, recorded)) if window and recorded else None
    busy_all = 0
    if n and window is not None and recorded_ns is not None:  # sampled: each kernel clipped to the slice it started in
        busy_all = _busy_in_slices(table, recorded_in_window(window, recorded))
    elif n and window is not None:  # kernels clipped to the window (the last step's kernels may run past it)
        outside = int(table.start_ns.min()) < window[0] or int(table.end_ns.max()) > window[1]
        s, e = (
            (np.clip(table.start_ns, window[0], window[1]), np.clip(table.end_ns, window[0], window[1]))
            if outside
            else (table.start_ns, table.end_ns)
        )
        busy_all = union_ns(s, e)

    return window, window_ns, recorded_ns, busy_all


def _phase_rows(
    table: KernelTable,
    ordered: Sequence[Step],
    kernel_phase: np.ndarray,
    share: np.ndarray,
    observed: list[tuple[int, int]] | None,
    names: _Names,
    fam_idx: np.ndarray,
    base_idx: np.ndarray,
    dur: np.ndarray,
    t_attr: np.ndarray,
    top: int,
) -> list[PhaseBreakdown]:
    """One row per phase: its kernels, their time per observed step and per token, families and top kernels."""
    starts = np.array([s.start_ns for s in ordered], dtype=np.int64)
    ends = np.array([s.end_ns for s in ordered], dtype=np.int64)
    phases: list[PhaseBreakdown] = []
    for code, phase in enumerate(PHASES):
        sel = np.array([i for i, s in enumerate(ordered) if s.phase == phase], dtype=np.int64)
        if not sel.size:
            continue
        mask = kernel_phase == code
        seen = share[sel]
        n_seen = float(seen.sum())
        wall_ns = float((seen * (ends[sel] - starts[sel])).sum())
        busy = (
            _busy_in_slices(table.select(mask), observed)
            if observed is not None
            else union_ns(table.start_ns[mask], table.end_ns[mask])
        )
        k_ns = float(dur[mask].sum())
        per_step_tokens = np.array(
            [ordered[i].batch_size if phase == "decode" else ordered[i].input_tokens for i in sel], dtype=np.float64
        )
        tokens = float((seen * per_step_tokens).sum())
        phases.append(
            PhaseBreakdown(
                phase=phase,
                steps=max(int(round(n_seen)), 1) if n_seen > 0 else 0,
                kernels=int(mask.sum()),
                kernel_ms=k_ns / 1e6,
                wall_ms=wall_ns / 1e6 if wall_ns else None,
                gpu_busy_pct=min(100.0, 100.0 * busy / wall_ns) if wall_ns else None,
                kernels_per_step=float(mask.sum()) / n_seen if n_seen > 0 else None,
                kernel_ms_per_step=k_ns / 1e6 / n_seen if n_seen > 0 else None,
                kernel_us_per_token=k_ns / 1e3 / tokens if tokens else None,
                families=_family_rows(fam_idx[mask], dur[mask]),
                top_kernels=_with_launches_before(
                    _kernel_rows(base_idx[mask], names.bases, names.base_family, dur[mask], top), table, t_attr, mask
                ),
                steps_in_capture=int(sel.size),
                tokens_per_step=round(tokens / n_seen, 4) if n_seen > 0 else None,
            )
        )

    return phases


def _graphs_hid_kernels(
    table: KernelTable, graph_kernels: int, graph_launches: int, device_graph_capture: bool | None
) -> str | None:
    """Why per-step figures are unreliable when device graphs ran and no kernel record came from inside one."""
    n = len(table)
    unreliable = None
    launches_recorded = table.launch_ns is not None and bool((table.launch_ns >= 0).any()) if n else False
    # graphs replayed (graph launches recorded), or graph capture on where the tracer does not say what launched:
    # and still no kernel record from inside a graph
    if not graph_kernels and (graph_launches or (device_graph_capture and not launches_recorded)):
        # graphs ran but no kernel record says it ran inside one: the tracer saw graph replays, not their kernels
        unreliable = (
            "device graphs ran (graph launches or replays recorded, or capture on) and the trace holds no kernel of a "
            "graph: kernels ran as graph replays the tracer did not open, so per-step attribution and per-kernel "
            "counts are unreliable; record with max_profile's CUPTI recorder (it records each kernel of a graph) or "
            "nsys --cuda-graph-trace=node, or re-run with --no-device-graph-capture"
        )
    return unreliable


def build_breakdown(
    table: KernelTable,
    *,
    source: str,
    steps: Sequence[Step] = (),
    step_source: StepSource = StepSource.NONE,
    window: tuple[int, int] | None = None,
    top: int = TOP_N,
    device_graph_capture: bool | None = None,
    graph_launches: int = 0,
    wait_gap_ns: tuple[int, int] = (100_000, 5_000_000),
    recorded: Sequence[tuple[int, int]] = (),
) -> KernelBreakdown:
    """Aggregate kernels by family and name: overall, per phase, per step and per device.

    ``steps`` are the timeline's steps on the kernels' clock (requests only, any order);
    ``window`` is the capture window on that clock (default: from the first launch or step start
    to the last kernel end or step end); ``wait_gap_ns`` the shortest and the longest gap counted as the GPU waiting
    for the host (:func:`gpu_waits`); ``recorded`` the slices of the window kernels were recorded in when the recording
    was sampled (busy and wait shares are then of their time).
    """
    valid = valid_kernels(table)
    invalid = int((~valid).sum())
    if invalid:
        table = table.select(valid)
    across = table.across_pauses(recorded, window[1] if window else None) if recorded else None
    paused = int(across.sum()) if across is not None else 0  # a capture whose recorder did not drop them itself
    if across is not None and paused:
        table = table.select(~across)
    del across
    n = len(table)
    dur = (table.end_ns - table.start_ns).astype(np.float64)
    names = _Names(table.names)
    fam_idx = names.family[table.name_idx] if n else np.zeros(0, dtype=np.int32)
    base_idx = names.to_base[table.name_idx] if n else np.zeros(0, dtype=np.int32)
    t_attr = table.attribution_time()

    ordered = sorted(steps, key=lambda s: s.start_ns)
    starts = np.array([s.start_ns for s in ordered], dtype=np.int64)
    ends = np.array([s.end_ns for s in ordered], dtype=np.int64)
    # the step of each kernel as int32 (a step count fits): a million kernels hold 4 MB, not 8
    step_of = interval_index(starts, ends, t_attr).astype(np.int32) if n else np.zeros(0, dtype=np.int32)
    attribution = _attribution(table, bool(ordered))

    window, window_ns, recorded_ns, busy_all = _window_and_busy(table, t_attr, starts, ends, window, recorded)

    phase_codes = np.array([PHASES.index(s.phase) for s in ordered] or [0], dtype=np.int32)
    kernel_phase = np.where(step_of >= 0, phase_codes[np.maximum(step_of, 0)], -1) if n else np.zeros(0, dtype=np.int32)
    observed = recorded_in_window(window, recorded) if window is not None and recorded_ns is not None else None
    share = observed_shares(
        starts,
        ends,
        observed if observed is not None else ([window] if window else None),
        steps_launching(step_of, len(ordered)) if observed is not None and n else None,
    )

    phases = _phase_rows(table, ordered, kernel_phase, share, observed, names, fam_idx, base_idx, dur, t_attr, top)

    per_step = _per_step(ordered, step_of, fam_idx, dur, share) if ordered else []
    graph_kernels = int((table.graph_id > 0).sum()) if n and table.graph_id is not None else 0
    unreliable = _graphs_hid_kernels(table, graph_kernels, graph_launches, device_graph_capture)
    devices = sorted(int(d) for d in np.unique(table.device)) if n else []
    return KernelBreakdown(
        source=source,
        kernels=n,
        kernel_ms=float(dur.sum()) / 1e6,
        attribution=attribution,
        families=_family_rows(fam_idx, dur),
        top_kernels=_kernel_rows(base_idx, names.bases, names.base_family, dur, top),
        phases=phases,
        step_source=step_source if ordered else StepSource.NONE,
        window_ms=window_ns / 1e6 if window_ns > 0 else None,
        recorded_ms=recorded_ns / 1e6 if recorded_ns is not None else None,
        gpu_busy_pct=_busy_pct(busy_all, recorded_ns if recorded_ns is not None else window_ns),
        unattributed_kernels=int((step_of < 0).sum()) if ordered else n,
        invalid_kernels=invalid,
        paused_kernels=paused,
        unknown_kernel_names=_unknown_names(fam_idx, base_idx, dur, names),
        devices=devices,
        unreliable=unreliable,
        per_step=per_step,
        graph_kernels=graph_kernels,
        per_device=_per_device(
            table, fam_idx, dur, kernel_phase, ordered, share, recorded_ns if recorded_ns is not None else window_ns
        )
        if len(devices) > 1
        else [],
        gpu_waits=gpu_waits(table, window, *wait_gap_ns, recorded=recorded),
    )


def _with_launches_before(
    rows: list[KernelRow], table: KernelTable, t_attr: np.ndarray, in_phase: np.ndarray
) -> list[KernelRow]:
    """Each row with the launches its name filter matched before the phase's first launch of it (launch order).

    Column-wise: each name's first launch in the phase comes from one pass; the launches before it are outside the
    phase (inside it none of its names launched earlier), counted on the out-of-phase launches in launch order, so a row
    reads only the launches before its phase's first."""
    if not rows:
        return rows
    never = np.iinfo(np.int64).max
    first_by_name = np.full(len(table.names), never, dtype=np.int64)
    np.minimum.at(first_by_name, table.name_idx[in_phase], t_attr[in_phase])
    outside = ~in_phase
    t_out, names_out = in_start_order(t_attr[outside], table.name_idx[outside])
    out = []
    for row in rows:
        pattern = re.compile(distinctive_regex(row.name))
        matched = np.array([bool(pattern.search(n)) for n in table.names] or [False], dtype=bool)
        first = int(first_by_name[matched].min()) if matched.any() else never
        if first == never:
            out.append(row)
            continue
        before = int(matched[names_out[: int(np.searchsorted(t_out, first, side="left"))]].sum())
        shape = _launch_shape(table, matched[table.name_idx] & in_phase) if table.grid is not None else None
        out.append(msgspec.structs.replace(row, launches_before=before, launch_shape=shape))
    return out


def _launch_shape(table: KernelTable, mask: np.ndarray) -> str | None:
    """The most common ``grid XxYxZ block XxYxZ`` of the masked launches (None when the trace has no shapes)."""
    if table.grid is None or table.block is None or not mask.any():
        return None
    shapes, counts = np.unique(
        np.concatenate([table.grid[mask], table.block[mask]], axis=1), axis=0, return_counts=True
    )
    g = shapes[int(np.argmax(counts))]
    if not g.any():
        return None
    return f"grid {g[0]}x{g[1]}x{g[2]} block {g[3]}x{g[4]}x{g[5]}"


def _busy_in_slices(table: KernelTable, slices: Sequence[tuple[int, int]]) -> int:
    """The union of kernel intervals, each clipped to the recorded slice it started in (kernels outside every slice
    left out)."""
    if not slices:
        return 0
    a = np.array([x for x, _ in slices], dtype=np.int64)
    b = np.array([y for _, y in slices], dtype=np.int64)
    k = np.searchsorted(a, table.start_ns, side="right") - 1
    ok = k >= 0
    s = np.maximum(table.start_ns[ok], a[k[ok]])
    e = np.minimum(table.end_ns[ok], b[k[ok]])
    keep = e > s
    return union_ns(s[keep], e[keep])


def _busy_pct(busy_ns: int, over_ns: int) -> float | None:
    return min(100.0, 100.0 * busy_ns / over_ns) if over_ns > 0 else None


def _attribution(table: KernelTable, has_steps: bool) -> str:
    if not has_steps:
        return "none"
    if table.launch_ns is None or not len(table):
        return "start time (no launch records)"
    known = table.launch_ns >= 0
    if known.all():
        return "launch time (any thread)"
    if not known.any():
        return "start time (no launch records)"
    return "launch time (any thread), else start time"


def _per_step(
    ordered: Sequence[Step], step_of: np.ndarray, fam_idx: np.ndarray, dur: np.ndarray, share: np.ndarray
) -> list[StepKernels]:
    """What each recorded step asked of the GPU (steps outside a sampled recording's slices are left out: they were not
    recorded), the first :data:`PER_STEP_LIMIT` of them."""
    kept = np.nonzero(share > 0)[0][:PER_STEP_LIMIT]
    if not kept.size:
        return []
    n_steps = int(kept[-1]) + 1
    sel = (step_of >= 0) & (step_of < n_steps)
    f = len(FAMILIES)
    step_sel = step_of[sel]
    counts = np.bincount(step_sel, minlength=n_steps)
    flat = np.multiply(step_sel, f, out=step_sel)  # (step, family) as one index, in place: one column held, not three
    flat += fam_idx[sel]
    sums = np.bincount(flat, weights=dur[sel], minlength=n_steps * f).reshape(n_steps, f)
    del flat, step_sel
    # one conversion to Python numbers for every kept step (not one numpy call per step and family): the same values
    kept_sums = sums[kept]
    totals, rows = kept_sums.sum(axis=1).tolist(), kept_sums.tolist()
    n_kernels, observed = counts[kept].tolist(), share[kept].tolist()
    return [
        StepKernels(
            index=i,
            phase=ordered[i].phase,
            kernels=n_kernels[k],
            kernel_ms=round(totals[k] / 1e6, 6),
            families={FAMILIES[j]: round(ns / 1e6, 6) for j, ns in enumerate(rows[k]) if ns},
            observed=round(observed[k], 4),
        )
        for k, i in enumerate(kept.tolist())
    ]


def _per_device(
    table: KernelTable,
    fam_idx: np.ndarray,
    dur: np.ndarray,
    kernel_phase: np.ndarray,
    ordered: Sequence[Step],
    share: np.ndarray,
    window_ns: int,
) -> list[DeviceBreakdown]:
    """Per-GPU tables: kernels, busy fraction over the window (its recorded slices), families, collective time per
    recorded decode step."""
    decode_code = PHASES.index("decode")
    decode_steps = float(sum(share[i] for i, s in enumerate(ordered) if s.phase == "decode"))
    coll = FAMILIES.index("collective")
    out = []
    for dev in sorted(int(d) for d in np.unique(table.device)):
        m = table.device == dev
        dm = m & (kernel_phase == decode_code)
        dec_ms = float(dur[dm].sum()) / 1e6
        coll_ms = float(dur[dm & (fam_idx == coll)].sum()) / 1e6
        out.append(
            DeviceBreakdown(
                device=dev,
                kernels=int(m.sum()),
                kernel_ms=float(dur[m].sum()) / 1e6,
                gpu_busy_pct=min(100.0, 100.0 * union_ns(table.start_ns[m], table.end_ns[m]) / window_ns)
                if window_ns > 0
                else None,
                collective_ms_per_decode_step=coll_ms / decode_steps if decode_steps else None,
                collective_share_of_decode_pct=100.0 * coll_ms / dec_ms if dec_ms else None,
                families=_family_rows(fam_idx[m], dur[m]),
            )
        )
    return out


def breakdown_from_totals(totals: Sequence[KernelTotal], *, source: str, top: int = TOP_N) -> KernelBreakdown:
    """Families and top kernels from per-name totals (no timeline: no phases, no busy figure)."""
    names = _Names([t.name for t in totals])
    idx = np.arange(len(totals), dtype=np.int64)
    dur = np.array([float(t.total_ns) for t in totals], dtype=np.float64)
    counts = np.array([float(t.count) for t in totals], dtype=np.float64)
    fam_idx = names.family[idx] if len(totals) else np.zeros(0, dtype=np.int32)
    base_idx = names.to_base[idx] if len(totals) else np.zeros(0, dtype=np.int32)
    return KernelBreakdown(
        source=source,
        kernels=int(counts.sum()),
        kernel_ms=float(dur.sum()) / 1e6,
        attribution="totals only",
        families=_family_rows(fam_idx, dur, counts),
        top_kernels=_kernel_rows(base_idx, names.bases, names.base_family, dur, top, counts),
        phases=[],
        unknown_kernel_names=_unknown_names(fam_idx, base_idx, dur, names),
    )
