"""One Nsight Compute launch read into a :class:`KernelAnalysis` (``analyze.ncu``), field by field with the answers
worked out by hand: details-page labels before raw metric names, the occupancy limiter, stalls ranked and cut at six,
FLOP/s from the SASS counters and the tensor paths, and the bound at each threshold from both sides."""

from __future__ import annotations

import pytest

from max_profile.analyze.ncu import STALL_MEANINGS, achieved_flops, analyze_launch, bound_of
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import NcuLaunch

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def _launch(metrics: dict[str, float], sections: dict[str, float] | None = None, launch_id: str = "7") -> NcuLaunch:
    return NcuLaunch(
        launch_id=launch_id,
        name="gemv_split_k",
        grid="(20, 1, 1)",
        block="(256, 1, 1)",
        device="0",
        metrics=metrics,
        sections=sections or {},
        rules=[f"rule {i}" for i in range(14)],
    )


def test_labels_win_over_raw_names_and_each_field_lands() -> None:
    m = {
        "Compute (SM) Throughput": 30.0,
        "sm__throughput.avg.pct_of_peak_sustained_elapsed": 31.0,
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 88.0,
        "DRAM Throughput": 85.0,
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": 84.0,
        "dram__bytes.sum.per_second": 4.0e12,
        "Block Limit Registers": 8.0,
        "launch__occupancy_limit_shared_mem": 3.0,
        "Block Limit Warps": 8.0,
        "Block Limit SM": 32.0,
        "Duration": 12_000.0,
        "Achieved Occupancy": 41.5,
        "sm__maximum_warps_per_active_cycle_pct": 50.0,
        "launch__registers_per_thread": 64.0,
        "smsp__cycles_elapsed.avg.per_second": 1.98e9,
        "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed": 100.0,
    }
    a = analyze_launch(_launch(m))
    assert (a.kernel_name, a.launch_id, a.duration_ns) == ("gemv_split_k", 7, 12_000.0)
    assert (a.compute_throughput_pct, a.memory_throughput_pct, a.dram_throughput_pct) == (30.0, 88.0, 85.0)
    assert a.dram_bytes_per_s == 4.0e12 and a.occupancy_limiter == "shared memory"
    assert (a.achieved_occupancy_pct, a.theoretical_occupancy_pct, a.registers_per_thread) == (41.5, 50.0, 64.0)
    assert (a.block_size, a.grid_size, a.device) == ("(256, 1, 1)", "(20, 1, 1)", "0")
    assert a.achieved_flop_per_s == 2.0 * 100.0 * 1.98e9
    assert a.arithmetic_intensity == 2.0 * 100.0 * 1.98e9 / 4.0e12
    assert a.bound == "memory" and a.ncu_rules == [f"rule {i}" for i in range(12)]
    assert set(a.metrics) == {k for k in m if " " in k or k.startswith(("gpu__", "dram__", "sm__"))}


def test_sections_win_over_metrics_for_memory_figures() -> None:
    m = {"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 10.0, "dram__bytes.sum.per_second": 1.0}
    s = {"GPU Speed Of Light Throughput/Memory Throughput": 70.0, "Memory Workload Analysis/Memory Throughput": 2.0e12}
    a = analyze_launch(_launch(m, s))
    assert (a.memory_throughput_pct, a.dram_bytes_per_s) == (70.0, 2.0e12)
    only_raw = analyze_launch(_launch({"dram__bytes.sum.per_second": 3.0, "gpu__time_duration.sum": 5.0}))
    assert (only_raw.dram_bytes_per_s, only_raw.duration_ns, only_raw.memory_throughput_pct) == (3.0, 5.0, None)


def test_the_limiter_is_the_smallest_block_limit_first_named_on_a_tie() -> None:
    ties = {"Block Limit Registers": 4.0, "Block Limit Warps": 4.0, "launch__occupancy_limit_barriers": 9.0}
    assert analyze_launch(_launch(ties)).occupancy_limiter == "registers"
    assert analyze_launch(_launch({"launch__occupancy_limit_barriers": 1.0})).occupancy_limiter == "barriers"
    assert analyze_launch(_launch({})).occupancy_limiter is None


def test_stalls_ranked_without_selected_or_zero_and_cut_at_six() -> None:
    values = {
        "long_scoreboard": 9.0,
        "wait": 1.0,
        "barrier": 3.0,
        "selected": 50.0,
        "membar": 0.0,
        "gmma": 2.0,
        "math_pipe_throttle": 4.0,
        "mio_throttle": 0.5,
        "lg_throttle": 0.25,
        "no_such_reason": 5.0,
    }
    a = analyze_launch(_launch({STALL.format(k): v for k, v in values.items()}))
    assert [(s.reason, s.cycles_per_instruction) for s in a.stalls] == [
        ("long_scoreboard", 9.0),
        ("no_such_reason", 5.0),
        ("math_pipe_throttle", 4.0),
        ("barrier", 3.0),
        ("gmma", 2.0),
        ("wait", 1.0),
    ]
    assert a.stalls[0].meaning == STALL_MEANINGS["long_scoreboard"] and a.stalls[1].meaning == ""
    assert (
        analyze_launch(_launch({"smsp__average_warps_issue_stalled_x_per_issue_active.ratio.extra": 3.0})).stalls == []
    )


@pytest.mark.parametrize(("launch_id", "want"), [("7", 7), ("123456789", 123456789), ("1234567890", 0), ("7a", 0)])
def test_launch_ids(launch_id: str, want: int) -> None:
    assert analyze_launch(_launch({}, launch_id=launch_id)).launch_id == want


def test_flops_from_every_counter() -> None:
    """FP32 and FP64 add / mul count once and FMA twice, half precision twice that (two lanes), tensor paths once,
    per-instruction tensor metrics not at all; nothing without the cycle rate or without any counter."""
    rate = 2.0e9
    m = {
        "smsp__cycles_elapsed.avg.per_second": rate,
        "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum.per_cycle_elapsed": 1.0,
        "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum.per_cycle_elapsed": 2.0,
        "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed": 3.0,
        "smsp__sass_thread_inst_executed_op_dfma_pred_on.sum.per_cycle_elapsed": 4.0,
        "smsp__sass_thread_inst_executed_op_hadd_pred_on.sum.per_cycle_elapsed": 5.0,
        "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum.per_cycle_elapsed": 6.0,
        "sm__ops_path_tensor_src_bf16_dst_fp32.sum.per_second": 7.0e12,
        "sm__ops_path_tensor_op_hgmma_src_bf16.sum.per_second": 9.0e12,
    }
    per_cycle = (1 + 2 + 2 * 3) + (2 * 4) + 2.0 * (5 + 2 * 6)
    assert achieved_flops(m) == per_cycle * rate + 7.0e12
    assert achieved_flops({"smsp__cycles_elapsed.avg.per_second": rate}) is None
    assert achieved_flops({k: v for k, v in m.items() if k != "smsp__cycles_elapsed.avg.per_second"}) is None
    tensor_only = {
        "smsp__cycles_elapsed.avg.per_second": rate,
        "sm__ops_path_tensor_src_fp8_dst_fp16.sum.per_second": 1.0,
    }
    assert achieved_flops(tensor_only) == 1.0
    only_mul = {
        "smsp__cycles_elapsed.avg.per_second": rate,
        "smsp__sass_thread_inst_executed_op_dmul_pred_on.sum.per_cycle_elapsed": 0.0,
    }
    assert achieved_flops(only_mul) == 0.0  # a counter read as 0 is a measurement of no FLOPs, not none
    a = analyze_launch(
        _launch({"smsp__cycles_elapsed.avg.per_second": rate, "sm__ops_path_tensor_src_x_dst_y.sum.per_second": 4.0})
    )
    assert a.achieved_flop_per_s == 4.0 and a.arithmetic_intensity is None  # no DRAM rate: no intensity


def test_bound_at_each_threshold_from_both_sides() -> None:
    th = Thresholds()
    lat, gap, lo = th.ncu_latency_bound_pct, th.ncu_balanced_gap_pct, th.ncu_balanced_min_pct
    assert bound_of(None, None) is None
    assert (
        bound_of(lat - 0.01, None) == "latency" and bound_of(None, lat) == "memory" and bound_of(lat, None) == "compute"
    )
    assert bound_of(lo, lo + gap - 0.01) == "balanced" and bound_of(lo, lo + gap) == "memory"
    assert bound_of(lo + gap - 0.01, lo) == "balanced" and bound_of(lo + gap, lo) == "compute"
    assert bound_of(lo - 0.01, lo + 5) == "memory" and bound_of(lo + 5, lo - 0.01) == "compute"
    assert bound_of(50.0, 50.0, 40.0, 10.0, 60.0) == "memory"  # equal but under the balanced floor: memory first
    custom = Thresholds(ncu_latency_bound_pct=20.0, ncu_balanced_gap_pct=5.0, ncu_balanced_min_pct=30.0)
    assert (
        analyze_launch(
            _launch(
                {
                    "Compute (SM) Throughput": 31.0,
                    "sm__throughput.avg.pct_of_peak_sustained_elapsed": 1.0,
                    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 34.0,
                }
            ),
            custom,
        ).bound
        == "balanced"
    )
    assert (
        analyze_launch(
            _launch(
                {
                    "Compute (SM) Throughput": 31.0,
                    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 34.0,
                }
            )
        ).bound
        == "latency"
    )


LIMITS = [
    ("registers", "Block Limit Registers", "launch__occupancy_limit_registers"),
    ("shared memory", "Block Limit Shared Mem", "launch__occupancy_limit_shared_mem"),
    ("warps", "Block Limit Warps", "launch__occupancy_limit_warps"),
    ("blocks per SM", "Block Limit SM", "launch__occupancy_limit_blocks"),
    ("barriers", "Block Limit Barriers", "launch__occupancy_limit_barriers"),
]


@pytest.mark.parametrize(("limit", "label", "raw"), LIMITS)
def test_each_block_limit_is_read_by_label_and_by_raw_name(limit: str, label: str, raw: str) -> None:
    """Each limit alone, under either name, is the limiter; with both names its label's value counts (a label of 9
    against a raw 1 loses to another limit of 5)."""
    assert analyze_launch(_launch({label: 2.0})).occupancy_limiter == limit
    assert analyze_launch(_launch({raw: 2.0})).occupancy_limiter == limit
    other = next(lb for name, lb, _ in LIMITS if name != limit)
    other_name = next(name for name, lb, _ in LIMITS if lb == other)
    assert analyze_launch(_launch({label: 9.0, raw: 1.0, other: 5.0})).occupancy_limiter == other_name


def test_a_stall_of_zero_is_not_a_stall_and_dram_by_its_last_raw_name() -> None:
    a = analyze_launch(
        _launch(
            {
                STALL.format("barrier"): 0.0,
                STALL.format("wait"): 0.5,
                "dram__throughput.avg.pct_of_peak_sustained_elapsed": 61.0,
            }
        )
    )
    assert [s.reason for s in a.stalls] == ["wait"] and a.dram_throughput_pct == 61.0


def test_a_missing_side_counts_as_zero_under_a_latency_bound_below_one() -> None:
    assert bound_of(None, 0.5, 0.1, 10.0, 60.0) == "memory"
    assert bound_of(0.5, None, 0.1, 10.0, 60.0) == "compute"
