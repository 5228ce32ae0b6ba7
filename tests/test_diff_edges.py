"""Comparing two runs at the edges: a family or kernel in one run only, a run without decode steps, kernels, GPU busy,
serve latency or a start-up, idle (batch 0) and batched decode steps, a regression of exactly the threshold, clocks
at the tolerance, levels of a sweep missing in one run, and the unit of every line."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from max_profile.analyze.diff import CLOCK_TOLERANCE_PCT, DiffLine, _p_text, _verdicts, comparability, diff_reports
from max_profile.model import KernelBreakdown, RawCapture, Report, RequestRecord, UtilizationSection

from .builders import serve_summary
from .test_diff_truth import B1, _level, _startup, a_run, line


def kernels_of(r: Report) -> KernelBreakdown:
    assert isinstance(r.kernels, KernelBreakdown)
    return r.kernels


def with_families(r: Report, change: dict[str, float | None]) -> Report:
    """The run with decode families scaled (a factor) or removed (None), and new ones added at a fixed ms per step."""
    k = kernels_of(r)
    rows = []
    for p in k.per_step:
        if p.phase != "decode":
            rows.append(p)
            continue
        fams = {f: ms for f, ms in p.families.items() if change.get(f, 1.0) is not None}
        fams = {f: ms * (change.get(f) or 1.0) if f in p.families else ms for f, ms in fams.items()}
        for f, v in change.items():
            if f not in p.families and v is not None:
                fams[f] = v
        rows.append(msgspec.structs.replace(p, families=fams))
    return msgspec.structs.replace(r, kernels=msgspec.structs.replace(k, per_step=rows))


def test_families_in_one_run_only() -> None:
    a = a_run()
    b = with_families(a, {"moe_routing": 0.5, "sampling": None})  # new in B; gone from B
    got = diff_reports(a, b)
    new = line(got.lines, "decode moe_routing per step")
    assert (new.a, new.b, new.delta_pct, new.unit) == (0.0, 0.5, None, "ms/step")  # new: no % of nothing
    assert new.significant and not new.regression  # no % to hold against the threshold
    assert "slower: decode moe_routing per step new in B (p < 0.001), +0.5 ms/step" in got.verdicts
    gone = [x for x in got.lines if x.metric == "decode sampling per step"]
    decode = [p for p in kernels_of(a).per_step if p.phase == "decode"]
    sampling = float(np.median([p.families.get("sampling", 0.0) for p in decode]))
    assert (gone[0].a, gone[0].b) == (sampling, 0.0) if sampling > 0.001 else gone == []
    # the order: by the two runs' medians together, a family of one run counting 0 in the other
    fam_lines = [x.metric for x in got.lines if x.metric.startswith("decode ") and x.metric.endswith(" per step")]
    fam_lines = [m for m in fam_lines if m != "decode kernel time per step"]
    sums = {m: line(got.lines, m).a + line(got.lines, m).b for m in fam_lines}
    assert fam_lines == sorted(fam_lines, key=lambda m: -sums[m])
    # a step that lacks a family the others have counts 0 for it there, not 1 or nothing
    k = kernels_of(a)
    first = next(i for i, p in enumerate(k.per_step) if p.phase == "decode")
    rows = list(k.per_step)
    rows[first] = msgspec.structs.replace(rows[first], families={"gemv": rows[first].families["gemv"]})
    holes = msgspec.structs.replace(a, kernels=msgspec.structs.replace(k, per_step=rows))
    att = line(diff_reports(holes, a).lines, "decode attention per step")
    values = [0.0] + [p.families["attention"] for p in k.per_step if p.phase == "decode"][1:]
    assert att.a == float(np.median(values))


def test_families_under_a_microsecond_are_left_out() -> None:
    a = with_families(a_run(), {"tiny": 0.001})  # exactly 1 µs per step in both: left out
    assert "decode tiny per step" not in [x.metric for x in diff_reports(a, a).lines]
    vanished = with_families(a_run(), {"tiny": 0.0015})
    assert "decode tiny per step" in [x.metric for x in diff_reports(vanished, a_run()).lines]  # in A only: kept


def test_runs_without_some_sections() -> None:
    a = a_run()
    no_decode = msgspec.structs.replace(a, steps=[s for s in a.steps if s.phase != "decode"])
    assert "decode per token (host step time)" not in [x.metric for x in diff_reports(no_decode, a).lines]
    k = kernels_of(a)
    prefill_only = msgspec.structs.replace(
        a, kernels=msgspec.structs.replace(k, per_step=[p for p in k.per_step if p.phase != "decode"])
    )
    assert "decode kernel time per step" not in [x.metric for x in diff_reports(a, prefill_only).lines]
    no_busy = msgspec.structs.replace(a, kernels=msgspec.structs.replace(k, gpu_busy_pct=None))
    assert "GPU busy" not in [x.metric for x in diff_reports(a, no_busy).lines]
    forced = diff_reports(a, msgspec.structs.replace(a, kernels=None), force=True)
    assert forced.forced and not [x for x in forced.lines if x.metric.startswith(("GPU busy", "kernel "))]
    served = msgspec.structs.replace(a, serve=serve_summary(itl_ms_p50=10.0, ttft_ms_p50=50.0))
    one_server = diff_reports(a, served, force=True)
    assert not [x for x in one_server.lines if x.metric.startswith("serve")]
    half = msgspec.structs.replace(a, serve=serve_summary(itl_ms_p50=None, ttft_ms_p50=None))
    assert not [x for x in diff_reports(served, half).lines if x.metric.startswith("serve")]
    raw = RawCapture.load(str(B1))
    gaps = msgspec.structs.replace(raw, requests=[RequestRecord(started_ns=0, ended_ns=1, ok=True, itl_ms=[1.0] * 9)])
    p50_only = diff_reports(served, served, a_raw=gaps)  # B's requests not given: the summaries' p50s
    assert [x.metric for x in p50_only.lines if x.metric.startswith("serve")] == [
        "serve inter-token latency p50",
        "serve time to first token p50",
    ]
    assert {x.unit for x in p50_only.lines if x.metric.startswith("serve")} == {"ms"}
    su = _startup(10.0, "hit", {})
    assert not [
        x for x in diff_reports(msgspec.structs.replace(a, startup=su), a).lines if x.metric.startswith("start")
    ]


def test_every_section_at_once_keeps_every_line() -> None:
    a = a_run()
    both = msgspec.structs.replace(
        a, load_levels=[_level(1, 100.0, 50.0, 10.0)], startup=_startup(10.0, "hit", {}, compile=2.0)
    )
    got = [x.metric for x in diff_reports(both, both).lines]
    # the load-independent evidence first (GPU kernel time), then host timing
    assert got[0] == "decode kernel time per step" and "decode per token (host step time)" in got
    assert {
        x.basis for x in diff_reports(both, both).lines if x.metric.startswith(("decode ", "prefill ", "kernel "))
    } >= {"device"}
    assert "concurrency 1: output" in got and "start-up to first token" in got and "GPU busy" in got
    units = {x.metric: x.unit for x in diff_reports(both, both).lines}
    assert units["decode per token (host step time)"] == "ms/token" and units["GPU busy"] == "%"
    assert units["decode kernel time per step"] == units["prefill kernel time per step"] == "ms/step"
    assert units["concurrency 1: output"] == "tok/s" and units["concurrency 1: TTFT p50"] == "ms"
    assert units["concurrency 1: ITL p50"] == "ms"
    assert units["start-up to first token"] == units["start-up: compile"] == "s"
    assert all(u == "ms/step" for m, u in units.items() if m.startswith("kernel "))


def test_idle_and_batched_decode_steps_per_token() -> None:
    a = a_run()
    batched = [msgspec.structs.replace(s, batch_size=4) if s.phase == "decode" else s for s in a.steps]
    idle = [msgspec.structs.replace(s, batch_size=0) if s.phase == "decode" and s.index % 2 else s for s in batched]
    b = msgspec.structs.replace(a, steps=idle)
    got = line(diff_reports(a, b).lines, "decode per token (host step time)")
    kept = [s.duration_ns / 1e6 / 4 for s in idle if s.phase == "decode" and s.batch_size > 0]
    assert got.b == float(np.median(kept)) and got.samples[1] == len(kept)


def test_top_kernels_per_decode_step_in_either_run() -> None:
    a = a_run()
    k = kernels_of(a)
    decode = next(p for p in k.phases if p.phase == "decode")
    got = diff_reports(a, a)
    top = [x for x in got.lines if x.metric.startswith("kernel ")]
    assert [x.metric for x in top] == [f"kernel {r.name}" for r in decode.top_kernels[:10]]
    # per recorded step on the ledger's scale: the kernel's share of the phase's kernel time x its kernel ms per step
    per_step = [r.total_ms / decode.kernel_ms * decode.kernel_ms_per_step for r in decode.top_kernels[:10]]
    assert [(x.a, x.b) for x in top] == [(v, v) for v in per_step]
    # a kernel in one run only counts 0 in the other; a run without a decode phase uses its capture's top kernels, per
    # one step
    gone = msgspec.structs.replace(
        k,
        phases=[
            msgspec.structs.replace(p, top_kernels=p.top_kernels[1:5]) if p.phase == "decode" else p for p in k.phases
        ],
    )
    first = diff_reports(a, msgspec.structs.replace(a, kernels=gone)).lines
    dropped = line(first, f"kernel {decode.top_kernels[0].name}")
    assert (dropped.a, dropped.b) == (per_step[0], 0.0)
    new = diff_reports(msgspec.structs.replace(a, kernels=gone), a).lines
    assert line(new, f"kernel {decode.top_kernels[0].name}").a == 0.0
    # a run without a decode phase has no time per decode step: its kernels are not compared per step (a whole
    # capture's total against one step's would read as a regression of the capture's length)
    phaseless = msgspec.structs.replace(k, phases=[p for p in k.phases if p.phase != "decode"])
    flat = diff_reports(msgspec.structs.replace(a, kernels=phaseless), a).lines
    assert not [x for x in flat if x.metric.startswith("kernel ")]
    flat_b = diff_reports(a, msgspec.structs.replace(a, kernels=phaseless)).lines
    assert not [x for x in flat_b if x.metric.startswith("kernel ")]


def test_a_regression_of_exactly_the_threshold_is_not_one() -> None:
    a = a_run()

    def constant(ms: float) -> Report:
        return msgspec.structs.replace(
            a,
            steps=[
                msgspec.structs.replace(s, end_ns=s.start_ns + int(ms * 1e6)) if s.phase == "decode" else s
                for s in a.steps
            ],
        )

    got = line(
        diff_reports(constant(2.0), constant(2.0625), fail_above_pct=3.125).lines, "decode per token (host step time)"
    )
    assert got.delta_pct == 3.125 and got.significant and not got.regression
    assert line(
        diff_reports(constant(2.0), constant(2.0625), fail_above_pct=3.12).lines, "decode per token (host step time)"
    ).regression
    refused = diff_reports(
        a, msgspec.structs.replace(a, capture=msgspec.structs.replace(a.capture, devices="cpu")), alpha=0.05
    )
    assert refused.verdicts == [] and refused.regression is False and refused.alpha == 0.05


def test_clocks_at_the_tolerance() -> None:
    a = a_run()
    u = a.utilization
    assert isinstance(u, UtilizationSection)

    def clocked(mhz: float | None) -> Report:
        return msgspec.structs.replace(
            a,
            utilization=msgspec.structs.replace(
                u, gpus=[msgspec.structs.replace(g, mean_sm_clock_mhz=mhz) for g in u.gpus]
            ),
        )

    assert CLOCK_TOLERANCE_PCT == 5.0
    assert comparability(clocked(1000.0), clocked(950.0)) == []  # exactly 5 %: comparable
    assert comparability(clocked(1000.0), clocked(950.2)) == []  # 4.98 %
    assert comparability(clocked(1000.0), clocked(949.0)) == ["mean SM clock: 1000 vs 949 MHz"]
    assert comparability(clocked(None), clocked(950.0)) == []  # a clock not read: no reason


def test_sweeps_with_levels_missing_in_one_run() -> None:
    base = msgspec.structs.replace(a_run(), steps=[], kernels=None)
    ra = msgspec.structs.replace(
        base, load_levels=[_level(1, 1.0, 5.0, 1.0), _level(4, 2.0, 6.0, 2.0), _level(16, 3.0, None, 3.0)]
    )
    rb = msgspec.structs.replace(base, load_levels=[_level(1, 1.0, 5.0, 1.0), _level(16, 3.5, 7.0, 3.0)])
    got = [x.metric for x in diff_reports(ra, rb).lines]
    assert got == [
        "concurrency 1: output",
        "concurrency 1: TTFT p50",
        "concurrency 1: ITL p50",
        "concurrency 16: output",
        "concurrency 16: ITL p50",  # A's TTFT p50 is not known there
    ]


def test_startup_phases_of_half_a_second_and_max_versions() -> None:
    a = msgspec.structs.replace(a_run(), steps=[], kernels=None)
    sa = _startup(10.0, "hit", {}, compile=0.5, load=0.49)
    sb = _startup(11.0, "hit", {}, compile=0.5, load=0.49)
    ra = msgspec.structs.replace(a, startup=sa, capture=msgspec.structs.replace(a.capture, target="startup"))
    rb = msgspec.structs.replace(
        ra, startup=sb, environment=msgspec.structs.replace(a.environment, max_version="26.8.0")
    )
    got = diff_reports(ra, rb)
    assert [x.metric for x in got.lines] == ["start-up to first token", "start-up: compile"]  # 0.5 s in: kept
    assert "compile key changed: MAX 26.7.0 -> 26.8.0" in got.verdicts


def test_verdict_and_p_value_wording_at_their_edges() -> None:
    assert _p_text(0.001) == "p = 0.001" and _p_text(0.0009) == "p < 0.001" and _p_text(None) == "no test"
    same_median = DiffLine(
        metric="m", unit="ms", a=1.0, b=1.0, delta=0.0, delta_pct=0.0, p_value=0.001, significant=True, regression=False
    )
    assert _verdicts([same_median], 5.0, 0.01) == ["faster: m +0.0 % (p = 0.001), +0 ms"]


@pytest.mark.parametrize("metric", ["serve inter-token latency"])
def test_serve_latency_lines_need_both_runs_requests(metric: str) -> None:
    a = msgspec.structs.replace(a_run(), serve=serve_summary(itl_ms_p50=10.0), steps=[], kernels=None)
    raw = RawCapture.load(str(B1))
    gaps = msgspec.structs.replace(raw, requests=[RequestRecord(started_ns=0, ended_ns=1, ok=True, itl_ms=[1.0] * 9)])
    none = msgspec.structs.replace(raw, requests=[])
    got = diff_reports(a, a, a_raw=gaps, b_raw=none)
    assert metric not in [x.metric for x in got.lines]
    both = diff_reports(a, a, a_raw=gaps, b_raw=gaps)
    assert line(both.lines, metric).unit == "ms" and line(both.lines, metric).samples == (9, 9)


def test_a_spread_sample_against_a_constant_one_is_tested() -> None:
    from scipy.stats import mannwhitneyu

    from max_profile.analyze.diff import _test

    spread, constant = [1.0, 2.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0], [2.0] * 8  # the same median, more above it
    for a, b in ((spread, constant), (constant, spread)):
        p, significant = _test(a, b, 0.01)
        assert p == float(mannwhitneyu(a, b, alternative="two-sided").pvalue) and p < 1.0 and not significant
    assert _test(constant, constant, 0.01) == (1.0, False)


def test_family_lines_ordered_by_both_runs() -> None:
    a = a_run()
    k = kernels_of(a)

    def fams(values: dict[str, float]) -> Report:
        rows = [msgspec.structs.replace(p, families=dict(values)) if p.phase == "decode" else p for p in k.per_step]
        return msgspec.structs.replace(a, kernels=msgspec.structs.replace(k, per_step=rows))

    ra = fams({"gemv": 0.5, "norm": 0.05})
    rb = fams({"gemv": 0.1, "norm": 0.3, "tiny_new": 0.002})
    got = [x.metric for x in diff_reports(ra, rb).lines if x.metric.startswith("decode ") and "per step" in x.metric]
    # by A and B together (gemv 0.6, norm 0.35, tiny_new 0.002: 0 in A), not by B alone (norm first)
    assert got == [
        "decode kernel time per step",
        "decode gemv per step",
        "decode norm per step",
        "decode tiny_new per step",
    ]
