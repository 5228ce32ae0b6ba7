"""Mutation testing of the analysis (``max_profile/analyze``) with mutmut: which single-token changes of the code the
fast rule and capture tests notice, and a report of those they do not.

    python benchmarks/mutation.py [--max-children 2] [--module DOTTED ... | --function MODULE:FUNCTION ...]
    [--report benchmarks/mutation_report.md] [--skip-run | --recheck]

Runs ``mutmut run`` from the repository root with the ``[tool.mutmut]`` settings of pyproject.toml (the analysis
modules; the test files named there, in one process each, stopping at the first failure), then reads every mutant's
status and diff and writes a Markdown report: per module the killed, surviving and untested mutants, the score (killed
/ killed + surviving), and each survivor with its diff, classed:

  text         the change is inside a string literal only (a title, a note, an evidence label): the verdicts are the
  same arithmetic   a number, comparison or operator changed
  other        anything else

A survivor that is equivalent is argued in ``EQUIVALENT`` below (one line each); the others are what tests must kill.
``--recheck`` re-judges the stored survivors with the tests as they are now, in a copy of a run's ``mutants/`` (each
mutant's tests in a child forked from one process that imported the package and collected the tests).

Every run sets ``MAX_PROFILE_TEST_CAPTURE_CACHE=1``: tests/conftest.py decodes each recorded raw capture once, before
mutmut forks its test sessions, so a mutant's tests pay for the analysis, not for decoding the captures again
(rules.kv_cache: 578 mutants in about 8 minutes on a 2-core VM with it; rules.levers before it: 1,740 in about 70).
Not run in CI (--module for one module at a time).
``pip install mutmut==3.8.1`` (the ``mutation`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MUTMUT = [sys.executable, "-m", "mutmut"]

EQUIVALENT: dict[str, str] = {
    # mutant name: why the change cannot alter any result (kept short; reviewed with each report)
    "max_profile.analyze.rules.serving.x_rule_latency_knee__mutmut_12": (
        "zip strict=None is strict=False (levels[1:] is one shorter)"
    ),
    "max_profile.analyze.rules.serving.x_rule_latency_knee__mutmut_15": "zip without strict is strict=False",
    "max_profile.analyze.rules.serving.x_rule_latency_knee__mutmut_169": (
        "a missing KV use as 1 % or 0 % is below any pressure threshold"
    ),
    # rules.levers: a zero-length phase priced at 1 % instead of 0 % stays under lever_info_pct (5 %): no lever
    "max_profile.analyze.rules.levers.x__idle_finding__mutmut_13": "0 % or 1 % of a zero-length step: no lever",
    "max_profile.analyze.rules.levers.x__matmul_finding__mutmut_18": "a share of 0 or 1 % of no kernel time: not slow",
    "max_profile.analyze.rules.levers.x__matmul_finding__mutmut_63": "0 % or 1 % of a zero-length step: no lever",
    "max_profile.analyze.rules.levers.x__nvml_host_bound__mutmut_5": "low_util is read for its truth: None is False",
    # ops-bound is drawn off a ledger built from op ranges, so the capture has a kernel table and each phase in it
    # launched ops: the guards below cannot be reached with the verdict's own inputs
    "max_profile.analyze.rules.levers.x__ops_bound_finding__mutmut_15": "a ledger of op ranges implies a kernel table",
    **{
        f"max_profile.analyze.rules.levers.x__ops_bound_finding__mutmut_{i}": (
            "a phase of the op-range ledger has ops, so its breakdown phase exists with top rows"
        )
        for i in (23, 25)
    },
    **{
        f"max_profile.analyze.rules.levers.x__ops_bound_finding__mutmut_{i}": (
            "a phase of the op-range ledger has op rows, so a largest one"
        )
        for i in (6, 34, 76, 81)
    },
    # rules.kv_cache: the per-step series are Python numbers (ints or floats); numpy keeps ints as int64, whose ranks,
    # medians, differences and Theil-Sen slopes (computed in float) equal those of the same values as float64
    **{
        f"max_profile.analyze.rules.kv_cache.x_{fn}__mutmut_{i}": "ints and floats of the same values: same ranks, "
        "medians and slopes"
        for fn, ids in (("_corr", (3, 5, 7, 9)), ("_half_slopes", (3, 5, 7, 9)), ("rule_kv_cache", (22, 24)))
        for i in ids
    },
    "max_profile.analyze.rules.kv_cache.x__per_step_kernel_growth__mutmut_4": (
        "the correlation beside a growth of None is never read"
    ),
    "max_profile.analyze.rules.kv_cache.x_rule_kv_cache__mutmut_171": "model_refeeds is only read for its truth",
    "max_profile.analyze.rules.kv_cache.x_rule_kv_cache__mutmut_260": "time_grows is only read for its truth",
    "max_profile.analyze.rules.kv_cache.x_rule_kv_cache__mutmut_295": "time_grows is only read for its truth",
    "max_profile.analyze.rules.kv_cache.x__half_slopes__mutmut_14": (
        "1,500 evenly spread of 1,500 steps are all of them"
    ),
    "max_profile.analyze.rules.kernel_mix.x__top_kernel_command__mutmut_28": (
        "without phases the breakdown has no decode launch count: the same command"
    ),
    "max_profile.analyze.rules.kernel_mix.x__attention_presence__mutmut_19": (
        "the count beside a per-step figure of None is never read"
    ),
    # steps, utilization: series of Python numbers, never empty where they are read
    **{f"max_profile.analyze.steps.x__pct__mutmut_{i}": "every phase and batch group has steps" for i in (2, 8)},
    **{
        f"max_profile.analyze.steps.x_decode_growth__mutmut_{i}": "ints and floats of the same values: same medians"
        for i in (9, 11, 15, 17)
    },
    **{
        f"max_profile.analyze.steps.x_decode_growth__mutmut_{i}": "a context that does not rise fails the next guard"
        for i in (20, 21)
    },
    "max_profile.analyze.steps.x_decode_growth__mutmut_30": "8 points or more: a third is at least 2",
    **{
        f"max_profile.analyze.utilization.x__mean_per_partition__mutmut_{i}": "a GPU's rows come from its samples"
        for i in (3, 5, 6)
    },
    **{
        f"max_profile.analyze.utilization.x_summarize_gpus__mutmut_{i}": "ints and floats of the same values: same mean"
        for i in (7, 9, 19, 21)
    },
    # ledger: numpy's defaults are the types named (int64 for Python ints, float64 for zeros and astype(None)); the
    # zipped columns come from one array pair of equal length
    **{
        f"max_profile.analyze.ledger.x_{fn}__mutmut_{i}": "numpy's default type is the one named"
        for fn, ids in (("_coverage", (13, 15, 18, 20, 23, 25, 27)), ("_clip_to_spans", (3, 5, 8, 10)))
        for i in ids
    },
    "max_profile.analyze.ledger.x__busiest_device__mutmut_2": "astype(None) is float64",
    **{
        f"max_profile.analyze.ledger.x__coverage__mutmut_{i}": "starts and ends are one pair of equal-length arrays"
        for i in (5, 8, 9)
    },
    "max_profile.analyze.ledger.x_time_ledger__mutmut_1": "its one caller names host_ops",
    **{
        f"max_profile.analyze.ledger.x_time_ledger__mutmut_{i}": "numpy's default type is the one named"
        for i in (30, 32, 35, 37, 101, 103, 124, 126, 147, 149, 151, 153, 172, 197)
    },
    **{
        f"max_profile.analyze.ledger.x_time_ledger__mutmut_{i}": "only the families counted are read, all in range"
        for i in (217, 222)
    },
    **{
        f"max_profile.analyze.ledger.x_time_ledger__mutmut_{i}": "the idle fields are replaced before any read"
        for i in (255, 256, 264, 265)
    },
    "max_profile.analyze.ledger.x_time_ledger__mutmut_121": "an unattributed kernel's phase is only read as < 0",
    **{
        f"max_profile.analyze.ledger.x_with_load__mutmut_{i}": "shares and weights: one list each of the same windows"
        for i in (33, 36, 37, 49, 52, 53)
    },
    "max_profile.analyze.ledger.x_with_load__mutmut_16": "a sum of zero-length windows weighs zero: 0 / 1 or 0 / 2",
    **{f"max_profile.analyze.ledger.x__coverage__mutmut_{i}": "np.zeros is float64" for i in (45, 47)},
    "max_profile.analyze.ledger.x__median__mutmut_2": "a phase of the ledger has steps that fed requests",
    "max_profile.analyze.ledger.x_build_ledger__mutmut_114": "a priced row's ideal is at least its launch floor, > 0",
    **{
        f"max_profile.analyze.ledger.x_build_ledger__mutmut_{i}": "whole nanoseconds have 6 decimals of ms"
        for i in (190, 197, 215)
    },
    "max_profile.analyze.ledger.x_build_ledger__mutmut_167": "a phase's steps fed requests: its median batch is > 0",
    "max_profile.analyze.ledger.x_build_ledger__mutmut_134": "time_ledger keeps a phase only with steps that fed "
    "requests: its median batch is > 0",
    **{
        f"max_profile.analyze.ledger.x_build_ledger__mutmut_{i}": "a sum of row figures already at 6 decimals"
        for i in (153, 158)
    },
    "max_profile.analyze.ledger.x_build_ledger__mutmut_81": "a priced row's ideal is at least its launch floor, > 0",
    "max_profile.analyze.ledger.x_phase_step_cost__mutmut_39": "decode's tokens per step is its batch, what step_cost "
    "takes new_tokens=None for",
    **{
        f"max_profile.analyze.ops.x_op_of_kernels__mutmut_{i}": "innermost op ranges of a thread do not overlap (a "
        "range holding another is dropped when recorded): no two share a start, no ties to order"
        for i in (27, 29)
    },
    **{
        f"max_profile.analyze.rules.kernel_mix.x_rule_unfused__mutmut_{i}": "0 or 1, None or 1 and 1 or 1 are all 1"
        for i in (119, 123)
    },
    "max_profile.analyze.rules.kernel_mix.x_rule_unfused__mutmut_121": "attention_stand_ins picks its phase among the "
    "coverage's: next() always finds it",
    "max_profile.analyze.rules.kernel_mix.x_rule_unfused__mutmut_27": "with no kernel time every family's time is 0: 0 "
    "over 1 or over 2",
    "max_profile.analyze.ledger.x_build_ledger__mutmut_64": "without a config or weights step_cost has no size: None",
    **{
        f"max_profile.analyze.ledger.x_time_ledger__mutmut_{i}": "a gap of no length adds nothing to any sum"
        for i in (308, 329)
    },
    "max_profile.analyze.ledger.x_time_ledger__mutmut_328": "indexing with None adds an axis: the same sums",
    **{f"max_profile.analyze.ledger.x_time_ledger__mutmut_{i}": "np.zeros is float64" for i in (333, 335)},
    "max_profile.analyze.ledger.x__rows__mutmut_61": "roofline = launch floor: the same ideal, either bound named",
    "max_profile.analyze.ledger.x__coverage__mutmut_39": "at a span's start the spans before it sum to the same length",
    **{
        f"max_profile.analyze.ledger.x__rows__mutmut_{i}": "a row has busy or idle time: its phase's step is not 0 ms"
        for i in (118, 127, 197, 206)
    },
    **{
        f"max_profile.analyze.ledger.x__rows__mutmut_{i}": "every part with busy time has its families and kernel count"
        for i in (35, 37, 38, 87, 89, 130, 132, 139, 141, 142)
    },
    "max_profile.analyze.ledger.x_build_ledger__mutmut_1": "its one caller names host_ops",
    "max_profile.analyze.ledger.x_time_ledger__mutmut_131": "a table with kernels has names",
    "max_profile.analyze.ledger.x_time_ledger__mutmut_207": "the scale multiplies sums of zero-length kernels",
    "max_profile.analyze.ledger.x_time_ledger__mutmut_290": "a kept kernel starts before its span's end",
    **{
        f"max_profile.analyze.ledger.x_time_ledger__mutmut_{i}": "kernels starting at the same ns: either order is "
        "the same timeline"
        for i in (268, 270)
    },
    "max_profile.analyze.ledger.x_roofs_for__mutmut_21": "1e-12 of a peak does not move 2 decimals of TB/s",
    "max_profile.analyze.ledger.x_roofs_for__mutmut_25": "1e-12 of a peak does not move whole TFLOP/s",
    "max_profile.analyze.ledger.x_server_ledger__mutmut_117": "a window of whole ns has 6 decimals of ms",
    # breakdown: numpy's defaults are the types named (int64 for Python ints, float64 for zeros and astype(None), bool
    # for a list of bools); guards a table without kernels or a capture without steps passes through unchanged
    **{
        f"max_profile.analyze.breakdown.x_{fn}__mutmut_{i}": "numpy's default type is the one named"
        for fn, ids in (
            ("_busy_in_slices", (5, 7, 10, 12)),
            ("breakdown_from_totals", (5, 7, 10, 12, 16, 18)),
            ("build_breakdown", (22, 24, 32, 61, 63, 66, 68, 79, 81, 174, 176, 200, 202)),
            ("gpu_waits", (49, 51, 71, 73)),
            ("interval_index", (27, 29)),
            ("_with_launches_before", (7, 9)),
        )
        for i in ids
    },
    **{
        f"max_profile.analyze.breakdown.xǁ_Namesǁ__init____mutmut_{i}": "numpy's default type is the one named"
        for i in (4, 6, 18, 20)
    },
    **{
        f"max_profile.analyze.breakdown.x_interval_index__mutmut_{i}": "np.full of -1 is int64 without a dtype"
        for i in (5, 8)
    },
    **{
        f"max_profile.analyze.ops.x_{fn}__mutmut_{i}": "numpy's default type is the one named (np.full of -1: int64; "
        "str() of a numpy string is the str)"
        for fn, ids in (
            ("_phase_of", (9, 11, 14, 16, 26, 28)),
            ("op_of_kernels", (4, 7)),
            ("op_breakdown", (33, 37, 39, 42, 44)),
        )
        for i in ids
    },
    **{
        f"max_profile.analyze.timeline.x_align_steps_to_ranges__mutmut_{i}": "the lengths are checked equal just before"
        for i in (14, 17, 18)
    },
    **{
        f"max_profile.analyze.timeline.x_range_label__mutmut_{i}": "a name starting with ':' splits into two at most "
        "at its last ':': every split's last part is the same"
        for i in (7, 10, 11)
    },
    "max_profile.analyze.timeline.x_drop_nested__mutmut_21": "a kept range ends after every earlier one: the max is "
    "its end",
    "max_profile.analyze.timeline.x_step_timeline__mutmut_24": "no host steps do not match ranges: None either way",
    "max_profile.analyze.ncu.x_achieved_flops__mutmut_8": "found is read for its truth: None is False",
    "max_profile.analyze.ops.x_op_breakdown__mutmut_13": "selecting every kernel of a valid table is the table",
    "max_profile.analyze.ops.x_op_of_kernels__mutmut_80": "best and best_idx are set together: both None or neither",
    "max_profile.analyze.ops.x_op_breakdown__mutmut_159": "an op without GPU time sorts after every op with some, by "
    "name, at -0 or -1 alike",
    **{
        f"max_profile.analyze.ops.x_op_label__mutmut_{i}": "the token pattern holds the part found: it always matches"
        for i in (26, 29, 30)
    },
    "max_profile.analyze.breakdown.x_interval_index__mutmut_22": "a time before every interval keeps index -1 either "
    "way",
    **{
        f"max_profile.analyze.breakdown.x_build_breakdown__mutmut_{i}": "no kernel: each branch gives nothing (an "
        "empty array, no device, no launch)"
        for i in (38, 46, 71, 183, 327, 355)
    },
    **{
        f"max_profile.analyze.breakdown.x_breakdown_from_totals__mutmut_{i}": "with no totals both give an empty array"
        for i in (22, 30)
    },
    "max_profile.analyze.breakdown.x_build_breakdown__mutmut_13": "across_pauses of no slices marks nothing",
    "max_profile.analyze.breakdown.x_build_breakdown__mutmut_306": "no steps: no per-step rows either way",
    "max_profile.analyze.breakdown.x_build_breakdown__mutmut_441": "no steps: every kernel's step is -1 either way",
    "max_profile.analyze.breakdown.x_build_breakdown__mutmut_180": "no steps: no kernel reads a phase code",
    "max_profile.analyze.breakdown.x_build_breakdown__mutmut_186": "a phase is matched by ==: None and -1 match none",
    "max_profile.analyze.breakdown.x_build_breakdown__mutmut_198": "-2 and -1 both mean no phase",
    **{
        f"max_profile.analyze.breakdown.x_build_breakdown__mutmut_{i}": "clipping at a bound a kernel does not pass "
        "is the identity"
        for i in (143, 144, 146, 150)
    },
    "max_profile.analyze.breakdown.x__busy_in_slices__mutmut_2": "no slice: nothing recorded, the share is None",
    "max_profile.analyze.breakdown.x__busy_in_slices__mutmut_38": "an interval of no length adds nothing to a union",
    "max_profile.analyze.breakdown.x__busy_pct__mutmut_7": "a union clipped to the window is at most the window",
    **{
        f"max_profile.analyze.breakdown.x_{fn}__mutmut_{i}": "a row is read only where its count is > 0, inside both "
        "arrays; the counts' float type gives the same ints"
        for fn, ids in (("_family_rows", (5, 23)), ("_kernel_rows", (5, 11, 23)), ("_unknown_names", (14,)))
        for i in ids
    },
    **{
        f"max_profile.analyze.breakdown.x__per_step__mutmut_{i}": "whole nanoseconds have 6 decimals of ms"
        for i in (54, 62)
    },
    "max_profile.analyze.breakdown.x__with_launches_before__mutmut_13": "a table of no names has no rows",
    **{
        f"max_profile.analyze.breakdown.x__with_launches_before__mutmut_{i}": "a phase's top row comes from its own "
        "kernels: its pattern matches one there"
        for i in (17, 18)
    },
    **{
        f"max_profile.analyze.breakdown.x_gpu_waits__mutmut_{i}": "equal starts: either order gives the same gaps "
        "past the running end"
        for i in (38, 40)
    },
    "max_profile.analyze.breakdown.x_gpu_waits__mutmut_7": "an empty window holds no kernel start: None",
    **{
        f"max_profile.analyze.breakdown.x_union_ns__mutmut_{i}": "sorting sorted starts (or equal ones, either "
        "order) gives the same union"
        for i in (4, 5, 8, 10, 15, 17)
    },
    **{
        f"max_profile.analyze.breakdown.xǁ_Namesǁ__init____mutmut_{i}": "an empty name list is indexed by no kernel"
        for i in (13, 25)
    },
    # analyze.load
    "max_profile.analyze.load.x_server_metrics__mutmut_20": "the loop above returned for a missing scrape: both set",
    **{
        f"max_profile.analyze.load.x_server_metrics__mutmut_{i}": "a suffix of None or '' is no suffix (if suffix:)"
        for i in (35, 173, 180, 244)
    },
    **{
        f"max_profile.analyze.load.x__delta__mutmut_{i}": "a missing label as None or '' groups the same; both say all"
        for i in (20, 22, 24)
    },
    **{
        f"max_profile.analyze.load.x_{fn}__mutmut_{i}": "Python numbers: float64 either way (ints: same percentiles)"
        for fn, ids in (("latency", (10, 12)), ("histogram", (4, 6)))
        for i in ids
    },
    "max_profile.analyze.load.x_histogram__mutmut_27": "clipping at the data's own minimum changes nothing",
    "max_profile.analyze.load.x__decode_step_ms__mutmut_14": "no step: a nan median scales by min(1, nan) = 1 anyway",
    **{
        f"max_profile.analyze.load.x_tracer_cost__mutmut_{i}": "no objectives as {} or None: no goodput either way"
        for i in (17, 21)
    },
    "max_profile.analyze.load.x_tracing_cost_statement__mutmut_110": "a scale above 1 is never shown (>= 0.999)",
    "max_profile.analyze.load.x_tracing_cost_statement__mutmut_112": "a scale of 2 is not shown either (>= 0.999)",
    "max_profile.analyze.load.x_tracing_cost_statement__mutmut_117": "a scale of exactly 0.999 does not occur",
    **{
        f"max_profile.analyze.load.x_in_flight__mutmut_{i}": "merged_spans drops the empty and negative spans these add"
        for i in (18, 19, 20, 25)
    },
    # analyze.commands
    "max_profile.analyze.commands.x_python__mutmut_33": "str(None) names no backend either: auto",
    "max_profile.analyze.commands.x__row_in__mutmut_3": "no phase asked: no phase of the breakdown is named None",
    "max_profile.analyze.commands.x__row_in__mutmut_19": "no phase row: 0 or 1 steps give no step to skip into",
    "max_profile.analyze.commands.x_launch_skip_for__mutmut_17": "no steps: min(2, max(-1, 0)) is 0 steps in anyway",
    # analyze.diff: a line of one value per run (the totals, sweep levels, start-up phases, serve p50s) is under
    # MIN_SAMPLES, so it is never tested, never significant, never a regression, whatever its flags say
    **{
        f"max_profile.analyze.diff.x_{fn}__mutmut_{i}": "one value per run: never tested, significant or a regression"
        for fn, ids in (
            (
                "diff_reports",
                (175, 176, 177, 178, 185, 186, 191, 192, 249, 250, 251, 258, 261)
                + (295, 296, 297, 304, 309, 316, 317, 318, 325, 330, 336, 337, 350, 351),
            ),
            ("_startup_lines", (6, 7, 8, 15, 20, 35, 36, 37, 44, 47)),
            ("_sweep_lines", (13, 14, 15, 16, 23, 24, 27, 28, 43, 44, 45, 52, 55)),
            ("_line", (18, 28, 31, 32)),
        )
        for i in ids
    },
    "max_profile.analyze.diff.x__line__mutmut_29": "a zero delta is 0 %, above no threshold",
    **{
        f"max_profile.analyze.diff.x_comparability__mutmut_{i}": "a tracer's source is words split by single spaces"
        for i in (54, 62)
    },
    **{
        f"max_profile.analyze.diff.x__test__mutmut_{i}": "equal constant samples: Mann-Whitney's p is 1.0 as well"
        for i in (15, 18)
    },
    "max_profile.analyze.diff.x__test__mutmut_28": "two-sided is mannwhitneyu's default alternative",
    "max_profile.analyze.diff.x__test__mutmut_31": "a p-value equal to alpha to the last bit does not occur",
    **{
        f"max_profile.analyze.diff.x_diff_reports__mutmut_{i}": "zip over the equal-length step lists of one run"
        for i in (80, 82, 83, 88, 90, 91)
    },
    **{
        f"max_profile.analyze.diff.x_diff_reports__mutmut_{i}": "no families: zip() of nothing is [] anyway"
        for i in (78, 86)
    },
    **{
        f"max_profile.analyze.diff.x_diff_reports__mutmut_{i}": "no decode phase: None, 0 or 1 steps all become 1"
        for i in (210, 216, 221, 227)
    },
    "max_profile.analyze.diff.x_diff_reports__mutmut_331": "a sweep against an empty one has no common level",
    "max_profile.analyze.diff.x__clock__mutmut_5": "no clock read: a nan mean is no reason either (nan > 5 is False)",
    # analyze.roofline
    **{
        f"max_profile.analyze.roofline.x__by_name__mutmut_{i}": "no GPU name holds two table fragments of one length"
        for i in (10, 12)
    },
    "max_profile.analyze.roofline.x_peak_flops__mutmut_15": "every GPU of the table has a bf16 peak",
    **{
        f"max_profile.analyze.roofline.x_weight_operand__mutmut_{i}": "str(None) is 'none': no fp8 either way"
        for i in (29, 31, 41, 43)
    },
    "max_profile.analyze.roofline.x__config_weights__mutmut_86": "no experts: 0 expert elements either way",
    "max_profile.analyze.roofline.x_decode_roofline__mutmut_44": "'' and None are both no kernel time",
    **{
        f"max_profile.analyze.roofline.x_activation_bytes__mutmut_{i}": "no table dtype lies between 2 and 3 bytes"
        for i in (21, 22)
    },
    **{f"max_profile.analyze.roofline.x__shape__mutmut_{i}": "heads defaults to 1: never 0" for i in (49, 51)},
    **{
        f"max_profile.analyze.roofline.x_decode_roofline__mutmut_{i}": "the datasheet peaks are whole GB/s and TFLOP/s"
        for i in (194, 196, 198, 199, 203, 205, 207, 208)
    },
    # analyze.op_roofline
    "max_profile.analyze.op_roofline.x_split_weight_ops__mutmut_3": "one op is one group either way",
    "max_profile.analyze.op_roofline.x__group__mutmut_39": "roofline equal to the floor: the same ideal either way",
    "max_profile.analyze.op_roofline.x_price_ops__mutmut_6": "no model description: no step cost, nothing priced",
    "max_profile.analyze.op_roofline.x_price_ops__mutmut_93": "a KV cache of exactly one byte does not occur",
    # analyze.rules (the engine)
    "max_profile.analyze.rules.x__rank__mutmut_11": "findings without a lever rank apart (second key): the third ties",
    "max_profile.analyze.rules.x_evaluate_rules__mutmut_44": "a stable sort of findings in rule order: ties stay in it",
    "max_profile.analyze.rules.x__rank__mutmut_6": "1 or 2 for no lever: either sorts after a lever's 0",
    # rules.levers: the op verdict's helpers, called only with an op table and its rows
    "max_profile.analyze.rules.levers.x__op_top_kernel__mutmut_4": "called only with an op table (the rule checks)",
    "max_profile.analyze.rules.levers.x__op_top_kernel__mutmut_16": "only the first top kernel is read",
    "max_profile.analyze.rules.levers.x__idle_finding__mutmut_20": "a 0 ms step: 0 % or 1 % is no lever either way",
    # analyze.report
    "max_profile.analyze.report.x_decode_cost_of__mutmut_20": "'' and None are both no family times",
    "max_profile.analyze.report.x_build_report__mutmut_77": "1 ns more of a sampling interval moves no recorded sample",
    "max_profile.analyze.report.x_build_report__mutmut_103": "a window's seconds at 2 decimals: 1e9 + 1 does not show",
    "max_profile.analyze.report.x_build_report__mutmut_146": "a longest gap 1 ns per ms longer moves no recorded gap",
}


RESULTS = REPO / "benchmarks" / "mutation_results.json"
RUNS = REPO / "benchmarks" / "mutation_runs.json"
"""One entry per run: when, which modules, which test files judged them (the report lists them: a module's figures are
from its last run)."""


def log_run(modules: list[str]) -> None:
    import datetime
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
    runs = json.loads(RUNS.read_text()) if RUNS.exists() else []
    modules = modules or ["all"]
    runs.append(
        {
            "date": datetime.date.today().isoformat(),
            "modules": modules,
            "tests": config["pytest_add_cli_args_test_selection"],
        }
    )
    RUNS.write_text(json.dumps(runs, indent=1) + "\n")


def function_pattern(spec: str) -> str:
    """``MODULE:FUNCTION`` (``*`` for every function of the module itself, not of its submodules) as mutmut's name
    pattern for that function's mutants."""
    module, _, function = spec.partition(":")
    return f"{module}.x_{function or '*'}__mutmut_*"


def run(max_children: int, modules: list[str], functions: Sequence[str] = ()) -> int:
    """A fresh run: mutmut keeps a mutant's result from an earlier run (a test added since never gets to kill it) unless
    the mutant is named, so the previous ``mutants/`` folder goes first. ``functions``: only those functions' mutants
    (``MODULE:FUNCTION``), e.g. the functions a change touched since the module ran."""
    shutil.rmtree(REPO / "mutants", ignore_errors=True)
    names = [f"{m}.*" for m in modules] + [function_pattern(f) for f in functions]
    return subprocess.call([*MUTMUT, "run", "--max-children", str(max_children), *names], cwd=REPO)


def merge_results(modules: list[str]) -> dict[str, dict[str, str]]:
    """Fold this run's statuses (and each survivor's diff) into ``mutation_results.json``: a module run replaces that
    module's earlier results, so runs of one module at a time add up to a report of all of them. A mutant this run did
    not reach ('not checked': a run stopped early) keeps its earlier result. A stored mutant of a module that ran which
    this run's tree no longer holds is dropped: its function changed and mutmut numbered its mutants anew (a stale
    survivor would be listed beside its renumbered twin)."""
    fresh = statuses()
    ran = {module_of(n) for n, st in fresh.items() if st != "not checked"}
    if modules:
        ran &= set(modules)
    diffs = {n: diff_of(n) for n, st in fresh.items() if st == "survived" and module_of(n) in ran}

    def fold(stored: dict[str, dict[str, str]]) -> None:
        gone = [n for n in stored if n not in fresh and (module_of(n) in ran or stored[n]["status"] == "not checked")]
        for name in gone:  # a function changed or removed since: a mutant not run of it is of no code either
            del stored[name]
        for name, st in fresh.items():
            if st == "not checked" and name in stored:
                continue  # this run stopped before it: the earlier result stands
            if module_of(name) in ran or name not in stored:
                entry = {"status": st}
                if st == "survived":
                    entry["diff"] = diffs.get(name) or diff_of(name)
                stored[name] = entry

    return update_results(fold)


def update_results(change: Callable[[dict[str, dict[str, str]]], None]) -> dict[str, dict[str, str]]:
    """Read, change and write ``mutation_results.json`` under a lock: a recheck of a copy and a run may both fold
    their results in."""
    import fcntl

    with open(RESULTS.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stored: dict[str, dict[str, str]] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        change(stored)
        RESULTS.write_text(json.dumps(dict(sorted(stored.items())), indent=0) + "\n")
    return stored


def recheck(modules: list[str], max_children: int, root: Path = REPO) -> dict[str, dict[str, str]]:
    """Re-judge the stored survivors (and mutants no test reached or no run got to) of ``modules`` with the tests as
    they are now (tests written to kill them), in the ``mutants/`` folder of the last run: the current tests are copied
    in, and each survivor is switched on by mutmut's own ``MUTANT_UNDER_TEST`` while the ``[tool.mutmut]`` test
    selection runs (fastest files first, stopping at the first failure). A mutmut run would regenerate the mutants of
    any source changed since and lose the run's results; this keeps them. ``max_children`` survivors are judged at a
    time. ``root``: the folder holding that ``mutants/`` (a copy, so a run in progress keeps its own); a survivor whose
    diff there is not the stored one (its function changed since: mutmut numbers a function's mutants in order) is left
    as it was and listed."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
    mutants = root / "mutants"
    if not mutants.is_dir():
        raise SystemExit("no mutants/ folder: run the modules first (without --recheck)")
    stats = json.loads((mutants / "mutmut-stats.json").read_text())
    changed = tests_changed_since(stats["git_commit"])  # their tests are not in mutmut's stats: all of them run
    shutil.copytree(REPO / "tests", mutants / "tests", dirs_exist_ok=True)
    stored: dict[str, dict[str, str]] = json.loads(RESULTS.read_text())
    names = [
        n
        for n, e in stored.items()
        # no tests: a test file added since may reach it now; not checked: a run stopped before it
        if e["status"] in ("survived", "no tests", "not checked")
        and (not modules or module_of(n) in modules)
        and n not in EQUIVALENT
        # not scored: no test is asked to read a title letter by letter (a mutant never run has no stored diff yet)
        and kind_of(e.get("diff") or diff_of(n, root)) != "text"
    ]
    covering: dict[str, list[str]] = stats["tests_by_mangled_function_name"]
    duration: dict[str, float] = stats["duration_by_test"]
    selected = set(config["pytest_add_cli_args_test_selection"])
    fast = [t for t in FAST_FIRST if t in selected] + [t for t in changed if t in selected and t not in FAST_FIRST]

    moved = [n for n in names if "diff" in stored[n] and diff_of(n, root) != stored[n]["diff"]]
    for name in moved:
        print(f"{name}: not the stored mutant (its function changed since): not judged", flush=True)
    names = [n for n in names if n not in moved]

    def tests_for(name: str) -> list[str]:
        """The fast field-by-field files and the selected files changed since the run first, then the tests mutmut saw
        reach the mutated function, quickest first (as mutmut itself selects them)."""
        tests = sorted(covering.get(name.rsplit("__mutmut_", 1)[0], []), key=lambda t: duration.get(t, 0.0))
        return [*config["pytest_add_cli_args"], *fast, *tests]

    for i, (name, rc) in enumerate(judge_forked(mutants, names, tests_for, fast, max_children), 1):
        if rc != 0:
            stored = update_results(partial(set_status, name, "killed" if rc > 0 else "timeout"))
        elif stored[name]["status"] == "no tests":  # reached now, and it survives: listed with its diff
            stored = update_results(partial(set_survivor, name, diff_of(name, root)))
        print(f"{i}/{len(names)} {name}: {'killed' if rc else 'survived'}", flush=True)
    return stored


def judge_forked(
    mutants: Path, names: list[str], args_for: Callable[[str], list[str]], warm: list[str], max_children: int
) -> Iterator[tuple[str, int]]:
    """Run each mutant's tests in a child forked from this process once it has imported the mutated package and
    collected ``warm`` (mutmut's own fork server does the same): a child pays for its tests, not for importing numpy,
    MAX's model and 30 test modules again. ``args_for("")`` (no mutant's own tests) must pass with no mutant switched
    on first. Yields (mutant, exit status): 0 survived, > 0 killed, < 0 timed out."""
    import signal

    import pytest  # imported here: from mutants/, which goes first on the path

    os.chdir(mutants)
    sys.path.insert(0, str(mutants))
    with open(os.devnull, "w") as quiet:
        saved = os.dup(1), os.dup(2)
        os.dup2(quiet.fileno(), 1), os.dup2(quiet.fileno(), 2)
        try:
            collected = int(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *warm]))
        finally:
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
    # every mutant would count as killed by tests that fail without one (tests newer than the mutants/ tree's code)
    if collected != 0:
        raise SystemExit(
            f"the tests do not collect against {mutants} (exit {collected}): tests newer than its code? "
            "Copy the current unmutated modules into it, or start a new run"
        )

    def fork_tests(name: str, alarm_s: int = 0) -> int:
        """A child that switches mutant ``name`` on ("" for none), runs its tests quietly and leaves without cleanup
        (killed after ``alarm_s`` seconds when given); its pid."""
        pid = os.fork()
        if pid == 0:
            os.environ["MUTANT_UNDER_TEST"] = name
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 1), os.dup2(fd, 2)
            if alarm_s:
                signal.alarm(alarm_s)
            os._exit(min(int(pytest.main(args_for(name))), 100))
        return pid

    # no mutant switched on: the warm tests (the fast files) must pass
    if os.waitstatus_to_exitcode(os.waitpid(fork_tests(""), 0)[1]) != 0:
        raise SystemExit(f"{' '.join(args_for(''))} fails in {mutants} with no mutant switched on: nothing judged")
    running: dict[int, str] = {}
    todo = list(names)
    while todo or running:
        while todo and len(running) < max_children:
            name = todo.pop(0)
            running[fork_tests(name, alarm_s=900)] = name  # a mutant that hangs the tests is caught
        pid, status = os.wait()
        name = running.pop(pid)
        yield name, (-1 if os.WIFSIGNALED(status) else os.waitstatus_to_exitcode(status))


def set_status(name: str, status: str, results: dict[str, dict[str, str]]) -> None:
    results[name] = {"status": status}


def set_survivor(name: str, diff: str, results: dict[str, dict[str, str]]) -> None:
    results[name] = {"status": "survived", "diff": diff}


def tests_changed_since(commit: str) -> list[str]:
    """Test files changed or added since ``commit`` (the one mutmut's stats were collected at), committed or not."""
    git = ["git", "-C", str(REPO)]
    changed = subprocess.run([*git, "diff", "--name-only", commit, "--", "tests"], capture_output=True, text=True)
    new = subprocess.run([*git, "ls-files", "--others", "--exclude-standard", "tests"], capture_output=True, text=True)
    return sorted({*changed.stdout.split(), *new.stdout.split()})


FAST_FIRST = (
    "tests/analyze/rules/test_levers.py",
    "tests/analyze/rules/test_kv_cache.py",
    "tests/analyze/test_ledger.py",
    "tests/analyze/rules/test_startup.py",
    "tests/analyze/test_steps.py",
    "tests/analyze/test_utilization.py",
    "tests/analyze/rules/test_tracing.py",
    "tests/analyze/rules/test_state.py",
    "tests/analyze/rules/test_nsight.py",
    "tests/analyze/rules/test_kernel_mix.py",
    "tests/analyze/test_load.py",
    "tests/analyze/rules/test_attention_lever.py",
    "tests/analyze/test_breakdown.py",
    "tests/analyze/test_breakdown.py",
    "tests/gpu/test_ops_vs_default.py",
    "tests/analyze/test_ops.py",
    "tests/analyze/test_timeline.py",
    "tests/analyze/test_ncu.py",
    "tests/analyze/test_op_roofline.py",
    "tests/analyze/test_roofline.py",
    "tests/analyze/test_load.py",
    "tests/analyze/test_diff.py",
    "tests/analyze/test_commands.py",
    "tests/analyze/test_report.py",
    "tests/analyze/test_load.py",
    "tests/analyze/test_diff.py",
    "tests/analyze/rules/test_op_finding.py",
    "tests/render/test_golden_findings.py",
    "tests/analyze/rules/test_idle.py",
)
"""Test files a recheck runs first: they pin the rules' figures field by field in seconds."""


def statuses() -> dict[str, str]:
    out = subprocess.run([*MUTMUT, "results", "--all", "true"], cwd=REPO, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        if ": " in line:
            name, status = line.strip().rsplit(": ", 1)
            found[name] = status
    return found


def diff_of(name: str, root: Path = REPO) -> str:
    out = subprocess.run([*MUTMUT, "show", name], cwd=root, capture_output=True, text=True).stdout
    return "\n".join(
        line for line in out.splitlines() if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))
    )


_STRING = re.compile(r"""(?:[rbfu]{0,2})("([^"\\]|\\.)*"|'([^'\\]|\\.)*')""")


def kind_of(diff: str) -> str:
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-")]
    added = [line[1:] for line in diff.splitlines() if line.startswith("+")]
    if len(removed) == len(added) and all(
        _STRING.sub('""', a) == _STRING.sub('""', b) for a, b in zip(removed, added, strict=True)
    ):
        return "text"
    if any(re.search(r"[\d<>=+\-*/%]", a) for a in added):
        return "arithmetic"
    return "other"


def module_of(name: str) -> str:
    return name.split(".x_")[0].split(".xǁ")[0]


def report(path: Path, results: dict[str, dict[str, str]]) -> None:
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    survivors: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for name, entry in sorted(results.items()):
        st = entry["status"]
        mod = module_of(name)
        by_module[mod]["killed" if st == "timeout" else st] += 1  # a mutant that hangs the tests is caught
        if st == "survived":
            diff = entry.get("diff", "")
            kind = "equivalent" if name in EQUIVALENT else kind_of(diff)
            by_module[mod]["survived " + kind] += 1
            survivors[mod].append((name, kind, diff))
    lines = [
        "# Mutation testing of max_profile/analyze (mutmut 3.8.1)",
        "",
        "Written by `python benchmarks/mutation.py`. Score = killed / (killed + survived, not counting `text` "
        "survivors: a change",
        "inside a string literal only, the same verdicts) and equivalent ones argued below.",
        "",
        "A mutant `not run` is one this run did not reach (a run of some modules, or a run stopped early): its "
        "module's score",
        "is of the mutants that ran, fastest tests first, so a partial figure leans high.",
        "",
        "| module | mutants run | killed | survived (text) | survived (other) | no tests | not run | score |",
        "|---|---|---|---|---|---|---|---|",
    ]
    total = Counter[str]()
    for mod, c in sorted(by_module.items()):
        total.update(c)
        judged = c["killed"] + c["survived"] - c["survived text"] - c["survived equivalent"]
        score = f"{100 * c['killed'] / judged:.1f} %" if judged else "-"
        lines.append(
            f"| {mod} | {sum(v for k, v in c.items() if ' ' not in k)} | {c['killed']} | {c['survived text']} | "
            f"{c['survived'] - c['survived text'] - c['survived equivalent']} | {c['no tests']} | {c['not checked']} | "
            f"{score} |"
        )
    judged = total["killed"] + total["survived"] - total["survived text"] - total["survived equivalent"]
    if RUNS.exists():
        lines += ["", "Runs (a module's figures are from its last run, judged by that run's tests):", ""]
        for r in json.loads(RUNS.read_text()):
            mods = ", ".join(m.removeprefix("max_profile.analyze.") for m in r["modules"])
            tests = ", ".join(t.removeprefix("tests/") for t in r["tests"])
            lines.append(f"- {r['date']}: {mods}; judged by {tests}")
    lines += [
        "",
        f"**All: {total['killed']} killed of {judged} judged mutants: {100 * total['killed'] / judged:.1f} %** "
        f"({total['survived text']} text-only survivors, {total['survived equivalent']} argued equivalent, "
        f"{total['no tests']} in code the "
        f"selected tests do not reach, {total['not checked']} not run).",
        "",
    ]
    for mod, items in sorted(survivors.items()):
        rest = [x for x in items if x[1] != "text"]
        if not rest:
            continue
        lines += [f"## {mod}", ""]
        for name, kind, diff in rest:
            why = EQUIVALENT.get(name)
            lines += [
                f"- `{name.rsplit('.', 1)[-1]}` ({kind}){': ' + why if why else ''}",
                "",
                "```diff",
                diff,
                "```",
                "",
            ]
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}: {total['killed']} killed, {judged} judged ({100 * total['killed'] / judged:.1f} %)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-children", type=int, default=2)
    ap.add_argument("--report", default=str(REPO / "benchmarks" / "mutation_report.md"))
    ap.add_argument(
        "--skip-run", action="store_true", help="only write the report from the stored results (mutation_results.json)"
    )
    ap.add_argument(
        "--module",
        action="append",
        default=[],
        metavar="DOTTED",
        help="mutate only this module (e.g. max_profile.analyze.rules.serving; repeatable); default: all of "
        "[tool.mutmut]",
    )
    ap.add_argument(
        "--function",
        action="append",
        default=[],
        metavar="MODULE:FUNCTION",
        help="mutate only this function (e.g. max_profile.analyze.rules.levers:rule_op_roofline; FUNCTION * for every "
        "function of the module itself; repeatable): the functions a change touched since their module ran",
    )
    ap.add_argument(
        "--root",
        default=str(REPO),
        help="--recheck in the mutants/ folder under this folder (with its pyproject.toml): a copy of a run's, so the "
        "run can go on",
    )
    ap.add_argument(
        "--recheck",
        action="store_true",
        help="re-judge the stored survivors of --module (all: every module) with the current tests, in the last run's "
        "mutants/ folder",
    )
    args = ap.parse_args()
    os.environ["MAX_PROFILE_TEST_CAPTURE_CACHE"] = "1"  # tests/conftest.py: the recorded captures decoded once, forked
    if args.recheck:
        results = recheck(args.module, args.max_children, Path(args.root))
        log_run([f"recheck of the survivors of {m}" for m in args.module] or ["recheck of all survivors"])
    elif not args.skip_run:
        run(args.max_children, args.module, args.function)
        touched = sorted({*args.module, *(f.partition(":")[0] for f in args.function)})
        results = merge_results(touched)
        log_run([*args.module, *(f"{f} (that function)" for f in args.function)])
    else:
        results = json.loads(RESULTS.read_text())
    report(Path(args.report), results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
