"""GPU sample summaries against a truth computed here: per GPU the peak and mean of each reading that was given (None
readings left out, not counted as 0), the first memory total, the hardware throttle reasons only, partition columns
averaged over the samples that have them; the window's edges (one sample interval of slack, the nearest sample per GPU
for a window shorter than an interval)."""

from __future__ import annotations

import random
import statistics

import pytest

from max_profile.analyze.utilization import HARDWARE_THROTTLE_REASONS, summarize_gpus, window_samples
from max_profile.model import UtilizationSample


def samples(seed: int) -> list[UtilizationSample]:
    rng = random.Random(seed)
    out = []
    for i in range(40):
        gpu = ("nv1", "nv0")[i % 2]
        maybe = rng.random() < 0.2
        out.append(
            UtilizationSample(
                t_ns=1_000 * i,
                gpu=gpu,
                utilization_pct=None if maybe else rng.choice([0.0, 37.5, 99.0, rng.uniform(0, 100)]),
                memory_used_bytes=None if rng.random() < 0.2 else rng.randint(1, 80) * 10**9 + 7,
                memory_total_bytes=None if i < 4 else (141 * 10**9 if gpu == "nv0" else 80 * 10**9),
                sm_clock_mhz=None if rng.random() < 0.2 else rng.randint(900, 1980),
                max_sm_clock_mhz=None if rng.random() < 0.3 else rng.choice([1980, 1755]),
                throttle_reasons=rng.sample(
                    ["gpu_idle", "sw_power_cap", "hw_slowdown", "applications_clocks_setting", "sync_boost"], 2
                ),
                sm_activity_pct=None if rng.random() < 0.3 else rng.uniform(0, 100),
                partition_activity_pct=[rng.uniform(0, 100) for _ in range(rng.choice([0, 2, 4]))],
            )
        )
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_per_gpu_summary_field_by_field(seed: int) -> None:
    given = samples(seed)
    rows = summarize_gpus(given)
    assert [r.gpu for r in rows] == ["nv0", "nv1"]
    for r in rows:
        sel = [s for s in given if s.gpu == r.gpu]
        util = [s.utilization_pct for s in sel if s.utilization_pct is not None]
        mem = [s.memory_used_bytes for s in sel if s.memory_used_bytes is not None]
        total = next(s.memory_total_bytes for s in sel if s.memory_total_bytes)
        clocks = [s.sm_clock_mhz for s in sel if s.sm_clock_mhz is not None]
        sm = [s.sm_activity_pct for s in sel if s.sm_activity_pct is not None]
        assert r.samples == len(sel)
        assert r.peak_utilization_pct == max(util)
        assert r.mean_utilization_pct == pytest.approx(statistics.fmean(util), rel=1e-12)
        assert r.peak_memory_bytes == max(mem) and r.memory_total_bytes == total
        assert r.peak_memory_pct == pytest.approx(100 * max(mem) / total, rel=1e-12)
        assert r.mean_sm_clock_mhz == pytest.approx(statistics.fmean(clocks), rel=1e-12)
        assert r.max_sm_clock_mhz == max(s.max_sm_clock_mhz for s in sel if s.max_sm_clock_mhz)
        reasons = {x for s in sel for x in s.throttle_reasons} & HARDWARE_THROTTLE_REASONS
        assert r.hardware_throttle_reasons == sorted(reasons) and "gpu_idle" not in r.hardware_throttle_reasons
        assert r.mean_sm_activity_pct == pytest.approx(statistics.fmean(sm), rel=1e-12)
        width = max(len(s.partition_activity_pct) for s in sel)
        columns = [
            [s.partition_activity_pct[i] for s in sel if len(s.partition_activity_pct) > i] for i in range(width)
        ]
        assert r.mean_partition_activity_pct == pytest.approx([statistics.fmean(c) for c in columns], rel=1e-12)


def test_a_gpu_that_gave_no_readings_has_none_not_zero() -> None:
    bare = [
        UtilizationSample(t_ns=i, gpu="nv0", utilization_pct=None, memory_used_bytes=None, memory_total_bytes=None)
        for i in range(3)
    ]
    (r,) = summarize_gpus(bare)
    assert r.samples == 3
    assert (r.peak_utilization_pct, r.mean_utilization_pct, r.peak_memory_bytes, r.memory_total_bytes) == (None,) * 4
    assert (r.peak_memory_pct, r.mean_sm_clock_mhz, r.max_sm_clock_mhz, r.mean_sm_activity_pct) == (None,) * 4
    assert r.hardware_throttle_reasons == [] and r.mean_partition_activity_pct == []
    # memory used but no total: no share; a total of 0 is no total
    used = [UtilizationSample(t_ns=0, gpu="nv0", utilization_pct=0.0, memory_used_bytes=5, memory_total_bytes=0)]
    (u,) = summarize_gpus(used)
    assert u.peak_memory_bytes == 5 and u.peak_memory_pct is None and u.memory_total_bytes is None
    assert u.peak_utilization_pct == 0.0 and u.mean_utilization_pct == 0.0


def at(t: int, gpu: str = "nv0") -> UtilizationSample:
    return UtilizationSample(t_ns=t, gpu=gpu, utilization_pct=50.0, memory_used_bytes=1, memory_total_bytes=2)


def test_window_keeps_one_interval_of_slack_each_side() -> None:
    given = [at(t) for t in (0, 100, 199, 200, 300, 400, 500, 501, 600)]
    kept = window_samples(given, (300, 400), interval_ns=100)
    assert [s.t_ns for s in kept] == [200, 300, 400, 500]  # 199 and 501 lie just outside
    assert [s.t_ns for s in window_samples(given, (300, 400))] == [300, 400]
    assert window_samples(given, None) == given and window_samples(given, None) is not given


def test_a_window_between_samples_keeps_the_nearest_sample_of_each_gpu() -> None:
    given = [at(0), at(1000), at(2000), at(800, "nv1"), at(1700, "nv1"), at(5000, "nv1")]
    kept = window_samples(given, (1300, 1500), interval_ns=100)  # nothing within 1200-1600
    assert sorted((s.gpu, s.t_ns) for s in kept) == [("nv0", 1000), ("nv1", 1700)]  # mid 1400: 400 and 300 away
    tie = window_samples([at(1000), at(1800)], (1300, 1500), interval_ns=0)  # both 400 from the middle: the first
    assert [s.t_ns for s in tie] == [1000]
    assert window_samples([], (1300, 1500), interval_ns=10) == []


def test_window_without_slack_and_the_middle_in_whole_nanoseconds() -> None:
    given = [at(t) for t in (299, 300, 400, 401)]
    assert [s.t_ns for s in window_samples(given, (300, 400))] == [300, 400]  # no slack unless one is given
    # middle 1400 (whole ns): 1000 is 400 away, 1801 is 401: the nearer one, whichever came first
    assert [s.t_ns for s in window_samples([at(1801), at(1000)], (1300, 1501), interval_ns=0)] == [1000]
