"""Recorded slices that lost their kernel records (H100: served windows whose ~230k kernels came back as 0
or 10k, none of their device graphs') are found by their kernels per step and left out of the accounts, so the GPU's
work is not put on the host. Checked on a real sampled serve capture (H200) with one slice's graph kernels
taken out, as the H100 lost them."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from max_profile.analyze.breakdown import build_breakdown, slices_without_records
from max_profile.analyze.report import build_report
from max_profile.model import KernelBreakdown, KernelRecord, KernelTable, RawCapture, Step

SERVED = Path(__file__).parents[2] / "data" / "gpu" / "h200_llama3b_batch64_ledger" / "serve_kernels_3b_raw.json.gz"
MS = 1_000_000


def _steps(begin_ms: float, n: int, every_ms: float = 2.5, batch: int = 1) -> list[Step]:
    return [
        Step(
            index=i,
            phase="decode",
            start_ns=int((begin_ms + i * every_ms) * MS),
            end_ns=int((begin_ms + (i + 1) * every_ms) * MS),
            batch_size=batch,
            input_tokens=0,
            context_tokens=None,
        )
        for i in range(n)
    ]


def _kernels(begin_ms: float, n: int, every_ms: float) -> list[KernelRecord]:
    return [
        KernelRecord(
            name="gemv", start_ns=int((begin_ms + i * every_ms) * MS), end_ns=int((begin_ms + i * every_ms) * MS) + 1000
        )
        for i in range(n)
    ]


def test_a_slice_with_steps_and_a_twentieth_of_the_kernels_is_lost() -> None:
    """Four 100 ms slices of 40 decode steps: three with 250 kernels per step, one with 10 (the graph kernels gone);
    an idle slice (no steps) and a short one (2 steps) are not judged; fewer than three judged slices judge none."""
    slices = [(0, 100 * MS), (200 * MS, 300 * MS), (400 * MS, 500 * MS), (600 * MS, 700 * MS), (800 * MS, 900 * MS)]
    steps = [*_steps(0, 40), *_steps(200, 40), *_steps(400, 40), *_steps(600, 40), *_steps(800, 2, every_ms=2.5)]
    recs = [
        *_kernels(0, 10_000, 0.01),
        *_kernels(200, 400, 0.25),
        *_kernels(400, 10_000, 0.01),
        *_kernels(600, 10_000, 0.01),
    ]
    table = KernelTable.from_records(recs)
    lost = slices_without_records(table, steps, [*slices, (1000 * MS, 1100 * MS)], (0, 1100 * MS))
    assert lost.spans == [(200 * MS, 300 * MS)] and lost.slices == 6
    assert lost.kernels_per_step == pytest.approx(10.0) and lost.typical == pytest.approx(250.0)
    assert int(lost.kernels.sum()) == 400 and not lost.kernels[:10_000].any()  # the lost slice's 400 kernels only
    # a slice with half the median's kernels per step is a busier or lighter mix, not lost records
    half = KernelTable.from_records(
        [*_kernels(0, 10_000, 0.01), *_kernels(200, 5000, 0.02), *_kernels(400, 10_000, 0.01)]
    )
    assert slices_without_records(half, steps, slices[:3], (0, 500 * MS)).spans == []
    # two judged slices: no median to judge by
    assert slices_without_records(table, steps, slices[:2], (0, 300 * MS)).spans == []
    unsampled = slices_without_records(table, steps, [], (0, 300 * MS))  # not sampled: nothing judged
    assert unsampled.spans == [] and unsampled.slices == 0 and not unsampled.kernels.any()


def test_a_served_capture_that_lost_one_slice_reads_as_the_whole_one() -> None:
    raw = RawCapture.load(str(SERVED))
    assert raw.kernel_clock == "host" and len(raw.recorded_spans) == 5
    a, b = sorted(raw.recorded_spans)[2]
    t = raw.kernels.attribution_time()
    graph = raw.kernels.graph_id
    assert graph is not None
    gone = (t >= a) & (t < b) & (graph > 0)
    assert int(gone.sum()) > 30_000
    damaged = msgspec.structs.replace(raw, kernels=raw.kernels.select(~gone))
    whole, hurt = build_report(raw), build_report(damaged)
    assert isinstance(whole.kernels, KernelBreakdown) and isinstance(hurt.kernels, KernelBreakdown)
    # left unguarded, the lost slice reads as an idle GPU: busy 92.9 % falls to about 75 %
    unguarded = build_breakdown(
        damaged.kernels, source="cupti", steps=hurt.steps, window=damaged.window_ns, recorded=damaged.recorded_spans
    )
    assert whole.kernels.gpu_busy_pct > 90 and unguarded.gpu_busy_pct < 80
    # guarded: said, and the busy share, the verdicts and the decode step's account as from the whole capture
    said = [n for n in hurt.notes if "records were lost there" in n]
    assert len(said) == 1 and said[0].startswith("1 of 5 recorded slices held steps but almost no kernel records")
    assert hurt.kernels.gpu_busy_pct == pytest.approx(whole.kernels.gpu_busy_pct, abs=1.0)
    assert [(f.id, f.severity) for f in hurt.findings] == [(f.id, f.severity) for f in whole.findings]
    assert not any("records were lost" in n for n in whole.notes)
    assert np.isclose(hurt.kernels.recorded_ms or 0, 0.8 * (whole.kernels.recorded_ms or 0), rtol=0.02)
