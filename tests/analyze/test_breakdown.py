"""The kernel breakdown (``analyze.breakdown.build_breakdown``) of timelines drawn by hand, every figure against its
plain-Python truth: each phase's kernels, kernel and wall time, busy share, per-step and per-token figures; the window
and the busy share of the capture with kernels running past it; the steps' own rows; per-device tables; the unknown
names; each top kernel's launches before the phase and launch shape. Mutation testing found these figures unpinned:
any capture's numbers could change and the rules' tests still pass (benchmarks/mutation_report.md).

Families and top kernels from per-name totals (nsys stats, rocprofv3 stats: no timeline), against a truth summed
here by plain Python: builds of one kernel (hash suffixes) merged under its base name, shares of the whole, the top N
by time, mean duration per launch, unknown names listed by time."""

from __future__ import annotations

from collections import defaultdict

import msgspec
import numpy as np
import pytest

from max_profile.analyze.breakdown import breakdown_from_totals, build_breakdown
from max_profile.analyze.families import base_name, classify_kernel
from max_profile.model import KernelTable, KernelTotal, Step


def exact(x: float) -> object:
    """Equal to the last bits a different order of the same operations may change (1e-12): 1e6 against 1000001 in a
    divisor is a difference of 1e-6, which pytest.approx's default tolerance lets through."""
    return pytest.approx(x, rel=1e-12, abs=0)


GEMV, NORM, ODD, ALLREDUCE = "gemv_split_k_bf16", "rms_norm_fused", "zzq_fooz", "ncclAllReduce_sum_bf16"


def _table(rows: list[tuple[str, int, int, int]], launch: list[int] | None = None) -> KernelTable:
    """Kernels as (name, start, end, device); launch times where given (-1: unknown)."""
    names = sorted({r[0] for r in rows})
    return KernelTable(
        names=names,
        name_idx=np.array([names.index(r[0]) for r in rows], dtype=np.int32),
        start_ns=np.array([r[1] for r in rows], dtype=np.int64),
        end_ns=np.array([r[2] for r in rows], dtype=np.int64),
        device=np.array([r[3] for r in rows], dtype=np.int32),
        launch_ns=None if launch is None else np.array(launch, dtype=np.int64),
        grid=np.array([[4 + (r[1] % 2), 1, 1] for r in rows], dtype=np.int32),
        block=np.array([[256, 1, 1] for _ in rows], dtype=np.int32),
    )


def _steps() -> list[Step]:
    """A prefill of 7 tokens [0, 1000), decode steps of batch 2 [1000, 1600) and [1600, 2000), given out of order (the
    decode steps fed 3 tokens each, as a speculative decoder would: a decode step's tokens are its batch)."""
    return [
        Step(index=1, phase="decode", batch_size=2, input_tokens=3, context_tokens=7, start_ns=1000, end_ns=1600),
        Step(index=0, phase="prefill", batch_size=1, input_tokens=7, context_tokens=0, start_ns=0, end_ns=1000),
        Step(index=2, phase="decode", batch_size=2, input_tokens=3, context_tokens=9, start_ns=1600, end_ns=2000),
    ]


ROWS = [
    (GEMV, 100, 400, 0),  # prefill
    (NORM, 300, 500, 0),  # prefill, overlaps the gemv: busy is the union
    (GEMV, 1100, 1300, 0),  # decode step 1
    (ODD, 1350, 1400, 0),  # decode step 1, a name no family knows
    (GEMV, 1700, 1900, 0),  # decode step 2
    (GEMV, 2500, 2600, 0),  # launched after every step: unattributed
]


def test_each_phase_figure_from_the_timeline() -> None:
    b = build_breakdown(_table(ROWS), source="test", steps=_steps(), step_source="hook")
    prefill, decode = (next(p for p in b.phases if p.phase == ph) for ph in ("prefill", "decode"))
    assert [p.phase for p in b.phases] == ["prefill", "decode"]
    assert (prefill.steps, prefill.kernels, prefill.kernel_ms, prefill.wall_ms) == (1, 2, 500 / 1e6, 1000 / 1e6)
    assert prefill.gpu_busy_pct == exact(100 * 400 / 1000)  # [100, 500) of [0, 1000)
    assert prefill.kernels_per_step == 2.0 and prefill.kernel_ms_per_step == 500 / 1e6
    assert prefill.kernel_us_per_token == exact(500 / 1e3 / 7)  # prefill: the tokens fed
    assert (decode.steps, decode.kernels, decode.kernel_ms, decode.wall_ms) == (2, 3, 450 / 1e6, 1000 / 1e6)
    assert decode.gpu_busy_pct == exact(100 * 450 / 1000)
    assert decode.kernels_per_step == 1.5 and decode.kernel_ms_per_step == exact(450 / 1e6 / 2)
    assert decode.kernel_us_per_token == exact(450 / 1e3 / 4)  # decode: the batch, 2 per step
    assert {f.family: f.total_ms for f in decode.families} == {"gemv": exact(400 / 1e6), "other": exact(50 / 1e6)}
    # the whole capture: window from the first kernel / step to the last end, busy the union over it
    assert b.kernels == 6 and b.kernel_ms == exact(1050 / 1e6)
    assert b.window_ms == exact(2600 / 1e6) and b.recorded_ms is None
    assert b.gpu_busy_pct == exact(100 * (400 + 200 + 50 + 200 + 100) / 2600)
    assert b.unattributed_kernels == 1 and b.step_source == "hook" and b.attribution == "start time (no launch records)"
    assert b.unknown_kernel_names == [ODD]


def test_steps_rows_in_time_order() -> None:
    b = build_breakdown(_table(ROWS), source="test", steps=_steps())
    assert [(s.index, s.phase, s.kernels) for s in b.per_step] == [
        (0, "prefill", 2),
        (1, "decode", 2),
        (2, "decode", 1),
    ]
    assert [s.kernel_ms for s in b.per_step] == [round(500 / 1e6, 6), round(250 / 1e6, 6), round(200 / 1e6, 6)]
    assert b.per_step[1].families == {"gemv": round(200 / 1e6, 6), "other": round(50 / 1e6, 6)}


def test_a_window_shorter_than_the_kernels_clips_the_busy_share() -> None:
    """Kernels that run past a given window count only inside it; the phase figures keep their whole durations."""
    b = build_breakdown(_table(ROWS), source="test", steps=_steps(), window=(200, 2000))
    assert b.window_ms == exact(1800 / 1e6)
    # [200, 500) + [1100, 1300) + [1350, 1400) + [1700, 1900); the kernel at 2500 lies past the window
    assert b.gpu_busy_pct == exact(100 * (300 + 200 + 50 + 200) / 1800)
    inside = build_breakdown(_table(ROWS[:5]), source="test", steps=_steps(), window=(100, 1900))
    assert inside.gpu_busy_pct == exact(100 * (400 + 200 + 50 + 200) / 1800)
    start_before = build_breakdown(_table(ROWS[:5]), source="test", steps=_steps(), window=(101, 1900))
    assert start_before.gpu_busy_pct == exact(100 * (399 + 200 + 50 + 200) / 1799)
    end_after = build_breakdown(_table(ROWS[:5]), source="test", steps=_steps(), window=(100, 1899))
    assert end_after.gpu_busy_pct == exact(100 * (400 + 200 + 50 + 199) / 1799)


def test_without_steps_every_kernel_is_unattributed_and_the_window_is_the_kernels() -> None:
    b = build_breakdown(_table(ROWS), source="test")
    assert b.phases == [] and b.per_step == [] and b.unattributed_kernels == 6 and b.attribution == "none"
    assert b.window_ms == exact(2500 / 1e6) and b.step_source == "none"
    empty = build_breakdown(_table([]), source="test")
    assert (empty.kernels, empty.window_ms, empty.gpu_busy_pct, empty.devices) == (0, None, None, [])


def test_launch_times_place_kernels_in_the_step_that_launched_them() -> None:
    """A kernel launched inside step 1 that runs after it belongs to step 1; one with no launch record to where it
    started; the launches of a name before the phase's first are counted, with the most common launch shape."""
    launch = [0, 250, 1500, 1340, 1650, 1990]  # the gemv of [1700, 1900) launched in step 2; [2500, 2600) at 1990
    b = build_breakdown(_table(ROWS, launch=launch), source="test", steps=_steps())
    assert b.attribution == "launch time (any thread)" and b.unattributed_kernels == 0
    decode = next(p for p in b.phases if p.phase == "decode")
    assert decode.kernels == 4 and decode.kernel_ms == exact(550 / 1e6)
    gemv = next(r for r in decode.top_kernels if r.name == GEMV)
    assert gemv.launches_before == 1  # the prefill's gemv, launched at 0 (a launch time of 0 is a known one)
    assert gemv.launch_shape == "grid 4x1x1 block 256x1x1"  # starts 1100, 1700, 2500: even, grid 4
    partly = build_breakdown(_table(ROWS, launch=[-1, 250, 1500, 1340, 1650, 1990]), source="test", steps=_steps())
    assert partly.attribution == "launch time (any thread), else start time"


def test_a_top_kernel_not_launched_in_the_phase_keeps_no_launch_figures() -> None:
    b = build_breakdown(_table(ROWS), source="test", steps=_steps(), top=3)
    prefill = next(p for p in b.phases if p.phase == "prefill")
    assert {r.name for r in prefill.top_kernels} == {GEMV, NORM}
    norm = next(r for r in prefill.top_kernels if r.name == NORM)
    assert norm.launches_before == 0 and norm.launch_shape == "grid 4x1x1 block 256x1x1"
    no_shapes = msgspec.structs.replace(_table(ROWS), block=None)
    nb = build_breakdown(no_shapes, source="test", steps=_steps())
    assert all(r.launch_shape is None for p in nb.phases for r in p.top_kernels)


def test_per_device_tables_over_the_window() -> None:
    """Two GPUs: each one's kernels, time, busy share of the window, and collective time per decode step and share of
    its decode kernel time."""
    rows = [*ROWS[:5], (ALLREDUCE, 1200, 1250, 1), (GEMV, 1100, 1200, 1), (ALLREDUCE, 1800, 1900, 1)]
    b = build_breakdown(_table(rows), source="test", steps=_steps())
    assert b.devices == [0, 1] and [d.device for d in b.per_device] == [0, 1]
    d0, d1 = b.per_device
    window = 2000
    assert (d0.kernels, d0.kernel_ms) == (5, exact(950 / 1e6))
    assert d0.gpu_busy_pct == exact(100 * 850 / window)
    assert d0.collective_ms_per_decode_step == 0.0 and d0.collective_share_of_decode_pct == 0.0
    assert (d1.kernels, d1.kernel_ms) == (3, exact(250 / 1e6))
    assert d1.gpu_busy_pct == exact(100 * 250 / window)
    assert d1.collective_ms_per_decode_step == exact(150 / 1e6 / 2)
    assert d1.collective_share_of_decode_pct == exact(100 * 150 / 250)
    only_prefill = build_breakdown(_table(rows), source="test", steps=[s for s in _steps() if s.phase == "prefill"])
    assert all(d.collective_ms_per_decode_step is None for d in only_prefill.per_device)
    assert only_prefill.per_device[1].collective_share_of_decode_pct is None
    one = build_breakdown(_table(ROWS), source="test", steps=_steps())
    assert one.per_device == [] and one.devices == [0]


def test_busy_shares_are_capped_at_100() -> None:
    """Kernels overlapping on one GPU over a step count once (the union), so no share passes 100 %."""
    rows = [(GEMV, 0, 1000, 0), (NORM, 0, 1000, 0), (GEMV, 1000, 2000, 0), (GEMV, 1000, 2000, 1)]
    b = build_breakdown(_table(rows), source="test", steps=_steps())
    assert b.gpu_busy_pct == 100.0
    assert all(p.gpu_busy_pct == 100.0 for p in b.phases)
    assert all(d.gpu_busy_pct is not None and d.gpu_busy_pct <= 100.0 for d in b.per_device)


def test_unknown_names_are_the_25_longest_others() -> None:
    rows = [(f"odd_kernel_{i:02d}", 10 * i, 10 * i + 1 + i, 0) for i in range(30)]
    b = build_breakdown(_table(rows), source="test")
    assert b.unknown_kernel_names == [f"odd_kernel_{i:02d}" for i in range(29, 4, -1)]
    assert build_breakdown(_table(ROWS[:3]), source="test").unknown_kernel_names == []


def test_a_phase_whose_kernels_run_past_its_steps_is_busy_100_at_most() -> None:
    """Kernels launched in a step may end after it: the phase's busy share is capped at 100 % of its steps' wall."""
    rows = [(GEMV, 0, 1500, 0), (GEMV, 1000, 1100, 0)]
    b = build_breakdown(_table(rows), source="test", steps=_steps())
    prefill = next(p for p in b.phases if p.phase == "prefill")
    assert prefill.gpu_busy_pct == 100.0 and prefill.kernel_ms == 1500 / 1e6
    decode = next(p for p in b.phases if p.phase == "decode")
    assert decode.gpu_busy_pct == exact(10.0)  # [1000, 1100) of 1,000 ns


def test_windows_of_zero_and_one_nanosecond() -> None:
    """A capture of one kernel of no length has no window and no busy share; one of 1 ns is busy all of it."""
    none = build_breakdown(_table([(GEMV, 500, 500, 0)]), source="test")
    assert (none.kernels, none.window_ms, none.gpu_busy_pct) == (1, None, None)
    one = build_breakdown(_table([(GEMV, 500, 501, 0)]), source="test")
    assert (one.window_ms, one.gpu_busy_pct) == (1 / 1e6, 100.0)


def test_kernels_of_equal_time_keep_their_name_order() -> None:
    """Ties in the top-kernel table (and the unknown names) keep the order of the names in the trace, whatever their
    number: a report must not reorder them from one run of the analysis to the next. 40 kernels of three lengths (an
    unstable sort reorders these ties); the truth is Python's stable sort."""
    lengths = [10 * (1 + (i * 7 + i // 3) % 3) for i in range(40)]
    names = [f"qqq_blob_{i:02d}" for i in range(40)]
    rows = [(n, 100 * i, 100 * i + length, 0) for i, (n, length) in enumerate(zip(names, lengths, strict=True))]
    truth = [names[i] for i in sorted(range(40), key=lambda i: -lengths[i])]
    b = build_breakdown(_table(rows), source="test", top=40)
    assert [r.name for r in b.top_kernels] == truth
    assert b.unknown_kernel_names == truth[:25]
    assert np.argsort(-np.array(lengths, dtype=float)).tolist() != sorted(range(40), key=lambda i: -lengths[i])


def _gaps_table(
    starts_ends: list[tuple[int, int]], device: list[int] | None = None, graph: list[int] | None = None
) -> KernelTable:
    t = _table([(GEMV, a, b, (device or [0] * len(starts_ends))[i]) for i, (a, b) in enumerate(starts_ends)])
    return t if graph is None else msgspec.structs.replace(t, graph_id=np.array(graph, dtype=np.int64))


def test_gpu_waits_at_their_bounds() -> None:
    """Gaps between the merged kernel intervals: one of exactly the shortest counted, one of exactly the longest not
    counted but 'longer', one past it 'longer' too; a gap ending at a kernel of graph 1 is before a graph; every figure
    from the gaps by hand."""
    from max_profile.analyze.breakdown import gpu_waits

    lo, hi = 100, 1000
    # kernels: [0,100) | gap 100 (= lo) | [200,300) | gap 999 | [1299,1400) graph 1 | gap 1000 (= hi) | [2400,2500)
    # | gap 1001 | [3501,3600) | gap 99 (< lo) | [3699,3700)
    spans = [(0, 100), (200, 300), (1299, 1400), (2400, 2500), (3501, 3600), (3699, 3700)]
    w = gpu_waits(_gaps_table(spans, graph=[0, 0, 1, 0, 0, 0]), (0, 4000), lo, hi)
    assert w is not None
    assert (w.min_gap_us, w.max_gap_ms) == (lo / 1e3, hi / 1e6)
    assert (w.gaps, w.waited_ms, w.waited_pct) == (2, (100 + 999) / 1e6, exact(100 * 1099 / 4000))
    assert (w.before_graph_gaps, w.before_graph_ms, w.before_graph_pct) == (1, 999 / 1e6, exact(100 * 999 / 4000))
    assert (w.longer_gaps, w.longer_ms) == (2, (1000 + 1001) / 1e6)
    assert w.gap_p50_us == exact((100 + 999) / 2 / 1e3)
    none_counted = gpu_waits(_gaps_table([(0, 100), (150, 200)]), (0, 300), lo, hi)
    assert none_counted is not None and none_counted.gaps == 0 and none_counted.gap_p50_us is None


def test_gpu_waits_need_two_kernels_of_one_device_in_a_window() -> None:
    from max_profile.analyze.breakdown import gpu_waits

    two = _gaps_table([(0, 100), (300, 400)])
    assert gpu_waits(two, (0, 500), 100, 1000) is not None  # two kernels are enough
    assert gpu_waits(_gaps_table([(0, 100)]), (0, 500), 100, 1000) is None
    assert gpu_waits(two, None, 100, 1000) is None
    assert gpu_waits(two, (500, 500), 100, 1000) is None and gpu_waits(two, (500, 499), 100, 1000) is None
    assert gpu_waits(two, (0, 300), 100, 1000) is None  # a kernel starting at the window's end is outside it
    # the device with the most kernels: device 1 holds three, its one gap of 200 ns counted; device 0's 500 ns not
    devs = _gaps_table([(0, 100), (600, 700), (0, 100), (300, 400), (400, 450)], device=[0, 0, 1, 1, 1])
    w = gpu_waits(devs, (0, 800), 100, 1000)
    assert w is not None and (w.gaps, w.waited_ms) == (1, 200 / 1e6)


def test_gpu_waits_in_a_sampled_recording_count_only_gaps_inside_a_slice() -> None:
    from max_profile.analyze.breakdown import gpu_waits

    spans = [(0, 100), (300, 400), (1200, 1300), (1500, 1600)]  # slices [0, 1000) and [1100, 2000)
    w = gpu_waits(_gaps_table(spans), (0, 2000), 100, 1000, recorded=[(0, 1000), (1100, 2000)])
    assert w is not None and (w.gaps, w.waited_ms) == (2, 400 / 1e6)  # 200 + 200; the 800 ns across the pause not
    assert w.waited_pct == exact(100 * 400 / 1900) and w.longer_gaps == 0


def test_union_and_interval_lookup_edges() -> None:
    """The union of intervals given out of order, with equal starts and nested ones; a time on an interval's end is in
    it, one before every interval or in a gap in none (-1)."""
    from max_profile.analyze.breakdown import interval_index, union_ns

    s = np.array([500, 0, 0, 100, 450], dtype=np.int64)
    e = np.array([600, 50, 200, 150, 520], dtype=np.int64)
    assert union_ns(s, e) == 200 + 150  # [0, 200) with [0, 50) and [100, 150) inside; [450, 520) and [500, 600) overlap
    assert union_ns(s[:1], e[:1]) == 100 and union_ns(s[:0], e[:0]) == 0
    sorted_equal = np.array([0, 0, 10], dtype=np.int64)
    assert union_ns(sorted_equal, np.array([5, 20, 15], dtype=np.int64)) == 20
    starts, ends = np.array([0, 100], dtype=np.int64), np.array([50, 150], dtype=np.int64)
    t = np.array([-1, 0, 50, 51, 100, 150, 151], dtype=np.int64)
    assert interval_index(starts, ends, t).tolist() == [-1, 0, 0, -1, 1, 1, -1]
    assert interval_index(starts[:0], ends[:0], t).tolist() == [-1] * 7


def test_no_kernels_in_steps_and_steps_of_no_length() -> None:
    """Steps without a kernel: each phase has 0 kernels and 0 % busy over its steps, the capture 0 % over the steps'
    window; steps of no length have no wall time and no busy share."""
    b = build_breakdown(_table([]), source="test", steps=_steps(), step_source="hook")
    assert [(p.phase, p.kernels, p.kernel_ms, p.gpu_busy_pct) for p in b.phases] == [
        ("prefill", 0, 0.0, 0.0),
        ("decode", 0, 0.0, 0.0),
    ]
    assert (b.window_ms, b.gpu_busy_pct, b.per_step[0].kernels) == (2000 / 1e6, 0.0, 0)
    flat = [Step(index=0, phase="decode", batch_size=1, input_tokens=1, context_tokens=1, start_ns=50, end_ns=50)]
    z = build_breakdown(_table([(GEMV, 50, 60, 0)]), source="test", steps=flat)
    assert (z.phases[0].kernels, z.phases[0].wall_ms, z.phases[0].gpu_busy_pct) == (1, None, None)


def test_step_source_and_graph_figures() -> None:
    """The step source is said only with steps; a kernel of graph 1 is a graph kernel; graphs said to be on without a
    kernel from inside one make the attribution unreliable unless launches were recorded (a launch at 0 ns counts)."""
    assert build_breakdown(_table(ROWS), source="test", step_source="hook").step_source == "none"
    assert build_breakdown(_table(ROWS), source="test").unreliable is None  # no graph launches by default
    in_graph = msgspec.structs.replace(_table(ROWS), graph_id=np.array([1, 0, 0, 0, 0, 0], dtype=np.int64))
    assert build_breakdown(in_graph, source="test").graph_kernels == 1
    assert build_breakdown(_table(ROWS), source="test", graph_launches=3).unreliable is not None
    assert build_breakdown(_table([]), source="test", device_graph_capture=True).unreliable is not None
    launched_at_0 = _table(ROWS, launch=[0, -1, -1, -1, -1, -1])
    assert build_breakdown(launched_at_0, source="test", device_graph_capture=True).unreliable is None


def test_top_limits_every_table() -> None:
    b = build_breakdown(_table(ROWS), source="test", steps=_steps(), top=1)
    assert [r.name for r in b.top_kernels] == [GEMV]
    assert all(len(p.top_kernels) == 1 for p in b.phases)


def test_unattributed_kernels_stay_out_of_every_phase() -> None:
    """A kernel launched outside every step counts in no phase, the mixed one included."""
    steps = [
        *_steps(),
        Step(index=3, phase="mixed", batch_size=2, input_tokens=9, context_tokens=11, start_ns=2000, end_ns=2400),
    ]
    b = build_breakdown(_table(ROWS), source="test", steps=steps)
    mixed = next(p for p in b.phases if p.phase == "mixed")
    assert (mixed.kernels, mixed.kernel_ms, b.unattributed_kernels) == (0, 0.0, 1)


def test_a_long_kernel_in_a_step_row() -> None:
    """The per-step rows keep microseconds exactly (rounded to 1e-6 ms): a kernel of 1 ms is 1.0 ms."""
    b = build_breakdown(
        _table([(GEMV, 1000, 1_001_000, 0)]),
        source="test",
        steps=[
            Step(index=0, phase="decode", batch_size=1, input_tokens=1, context_tokens=1, start_ns=0, end_ns=2_000_000)
        ],
    )
    assert b.per_step[0].kernel_ms == 1.0 and b.per_step[0].families == {"gemv": 1.0}


def test_per_step_rows_stop_at_their_limit() -> None:
    """Past PER_STEP_LIMIT steps the rows stop; a kernel in the first step past it is in no row."""
    from max_profile.analyze.breakdown import PER_STEP_LIMIT

    steps = [
        Step(
            index=i, phase="decode", batch_size=1, input_tokens=1, context_tokens=i, start_ns=10 * i, end_ns=10 * i + 10
        )
        for i in range(PER_STEP_LIMIT + 1)
    ]
    last = 10 * PER_STEP_LIMIT
    b = build_breakdown(_table([(GEMV, 0, 5, 0), (GEMV, last, last + 5, 0)]), source="test", steps=steps)
    assert len(b.per_step) == PER_STEP_LIMIT and sum(s.kernels for s in b.per_step) == 1


def test_a_kernel_wholly_before_the_window_adds_nothing() -> None:
    b = build_breakdown(_table([(GEMV, 50, 80, 0), (GEMV, 150, 250, 0)]), source="test", window=(100, 300))
    assert b.gpu_busy_pct == exact(100 * 100 / 200)


def test_a_sampled_recording_busy_and_waits_over_its_slices() -> None:
    """Recorded slices [0, 1000) and [2000, 3000) of a window [0, 3000) without a window given: busy over the slices'
    2,000 ns, each kernel clipped to the slice it started in (one starting before the first slice left out), the gap
    across the pause not a wait, per-device busy over the slices too; a device whose kernels run past the last slice
    (up to the window's end nothing is cut) is capped at 100 %."""
    rows = [
        (GEMV, 100, 400, 0),
        (GEMV, 600, 900, 0),
        (GEMV, 2100, 2300, 0),
        (GEMV, 2500, 2600, 0),
        (GEMV, 0, 1000, 1),
        (GEMV, 900, 1400, 1),
    ]
    recorded = [(0, 1000), (2000, 3000)]
    steps = [Step(index=0, phase="decode", batch_size=1, input_tokens=1, context_tokens=1, start_ns=0, end_ns=3000)]
    b = build_breakdown(_table(rows), source="test", steps=steps, recorded=recorded, wait_gap_ns=(100, 1000))
    assert b.recorded_ms == 2000 / 1e6 and b.window_ms == 3000 / 1e6
    assert b.gpu_busy_pct == exact(100 * (1000 + 300) / 2000)  # device 1 fills the first slice; [2100, 2600) gaps
    d0, d1 = b.per_device
    assert d0.gpu_busy_pct == exact(100 * 900 / 2000) and d1.gpu_busy_pct == exact(100 * 1400 / 2000)
    past = [*rows[:4], (GEMV, 0, 1500, 1), (GEMV, 2000, 4000, 1)]
    capped = build_breakdown(_table(past), source="test", steps=steps, window=(0, 3000), recorded=recorded)
    assert capped.per_device[1].gpu_busy_pct == 100.0  # 3,500 ns of kernels over 2,000 recorded
    assert b.gpu_waits is not None and (b.gpu_waits.gaps, b.gpu_waits.waited_ms) == (2, 400 / 1e6)
    assert b.gpu_waits.waited_pct == exact(100 * 400 / 2000) and b.gpu_waits.longer_gaps == 0  # the pause: no gap
    early = build_breakdown(
        _table([(GEMV, 500, 2800, 0), (GEMV, 1100, 1200, 0)]),
        source="test",
        window=(1000, 3000),
        recorded=[(1000, 2000), (2500, 3000)],
    )
    assert early.gpu_busy_pct == exact(100 * 100 / 1500)  # the kernel from 500 started before every slice: left out
    outside = build_breakdown(_table(rows), source="test", window=(0, 3000), recorded=[(5000, 6000), (7000, 8000)])
    assert outside.recorded_ms == 0.0 and outside.gpu_busy_pct is None
    assert all(d.gpu_busy_pct is None for d in outside.per_device)


def test_one_nanosecond_window_on_two_devices() -> None:
    b = build_breakdown(_table([(GEMV, 0, 1, 0), (GEMV, 0, 1, 1)]), source="test")
    assert [d.gpu_busy_pct for d in b.per_device] == [100.0, 100.0]


def test_an_unknown_kernel_of_one_nanosecond_is_named() -> None:
    assert build_breakdown(_table([(ODD, 0, 1, 0)]), source="test").unknown_kernel_names == [ODD]


def test_union_of_unsorted_intervals() -> None:
    from max_profile.analyze.breakdown import union_ns

    assert union_ns(np.array([100, 0], dtype=np.int64), np.array([150, 200], dtype=np.int64)) == 200
    assert union_ns(np.array([0, 500, 100], dtype=np.int64), np.array([200, 600, 700], dtype=np.int64)) == 700


TOTALS = [
    KernelTotal(name="gemv_split_k_bf16_128_0123456789abcdef", count=700, total_ns=31_234_567),
    KernelTotal(name="gemv_split_k_bf16_128_fedcba9876543210", count=300, total_ns=12_345_678),  # another build
    KernelTotal(name="sm90_mha_depth128_0123456789abcdef", count=640, total_ns=9_876_543),
    KernelTotal(name="rms_norm_fused_residual_0123456789abcdef", count=1300, total_ns=2_345_678),
    KernelTotal(name="my_custom_thing", count=7, total_ns=1_111_111),
    KernelTotal(name="another_unknown_op", count=3, total_ns=2_222_222),
    KernelTotal(name="zero_time_unknown", count=2, total_ns=0),
]


def test_breakdown_from_totals_every_figure() -> None:
    k = breakdown_from_totals(TOTALS, source="nsys stats")
    total_ns = sum(t.total_ns for t in TOTALS)
    assert (k.source, k.attribution, k.phases) == ("nsys stats", "totals only", [])
    assert k.kernels == sum(t.count for t in TOTALS) and k.kernel_ms == pytest.approx(total_ns / 1e6, rel=1e-12)
    fam_ns: dict[str, float] = defaultdict(float)
    fam_n: dict[str, int] = defaultdict(int)
    for t in TOTALS:
        fam_ns[classify_kernel(t.name)] += t.total_ns
        fam_n[classify_kernel(t.name)] += t.count
    want = sorted(fam_ns, key=lambda f: -fam_ns[f])
    assert [r.family for r in k.families] == want
    for r in k.families:
        assert r.kernels == fam_n[r.family]
        assert r.total_ms == pytest.approx(fam_ns[r.family] / 1e6, rel=1e-12)
        assert r.share_pct == pytest.approx(100 * fam_ns[r.family] / total_ns, rel=1e-12)
    base_ns: dict[str, float] = defaultdict(float)
    base_n: dict[str, int] = defaultdict(int)
    for t in TOTALS:
        base_ns[base_name(t.name)] += t.total_ns
        base_n[base_name(t.name)] += t.count
    assert [r.name for r in k.top_kernels] == sorted(base_ns, key=lambda b: -base_ns[b])
    gemv = k.top_kernels[0]
    assert gemv.name == "gemv_split_k_bf16_128" and gemv.count == 1000 and gemv.family == "gemv"
    for r in k.top_kernels:
        assert r.count == base_n[r.name]
        assert r.total_ms == pytest.approx(base_ns[r.name] / 1e6, rel=1e-12)
        assert r.mean_us == pytest.approx(base_ns[r.name] / base_n[r.name] / 1e3, rel=1e-12)
        assert r.share_pct == pytest.approx(100 * base_ns[r.name] / total_ns, rel=1e-12)
    assert k.unknown_kernel_names == ["another_unknown_op", "my_custom_thing"]  # by time; none of no time


def test_top_n_and_empty_totals() -> None:
    k = breakdown_from_totals(TOTALS, source="rocprofv3 stats", top=2)
    assert [r.name for r in k.top_kernels] == ["gemv_split_k_bf16_128", "mha_depth128"]
    empty = breakdown_from_totals([], source="nsys stats")
    assert (empty.kernels, empty.kernel_ms, empty.families, empty.top_kernels, empty.unknown_kernel_names) == (
        0,
        0.0,
        [],
        [],
        [],
    )
    nothing = breakdown_from_totals([KernelTotal(name="gemv_x", count=4, total_ns=0)], source="nsys stats")
    assert [(r.family, r.kernels, r.share_pct) for r in nothing.families] == [("gemv", 4, 0.0)]
    assert [(r.count, r.share_pct) for r in nothing.top_kernels] == [(4, 0.0)]
