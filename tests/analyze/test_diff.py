"""Comparing two runs, figure by figure: comparability, each distribution's median delta and Mann-Whitney p-value
(recomputed here with scipy on the same samples), what counts as a regression, and every verdict line.

A is a real H200 run (batch 1, 64 decode steps, CUPTI); B is A with one thing changed at a time, so the
expected delta is known.

Comparing two runs at the edges: a family or kernel in one run only, a run without decode steps, kernels, GPU busy,
serve latency or a start-up, idle (batch 0) and batched decode steps, a regression of exactly the threshold, clocks
at the tolerance, levels of a sweep missing in one run, and the unit of every line."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from max_profile.analyze.diff import (
    ALPHA,
    CLOCK_TOLERANCE_PCT,
    MIN_SAMPLES,
    STARTUP_MIN_PHASE_S,
    DiffLine,
    _p_text,
    _verdicts,
    comparability,
    diff_reports,
    startup_verdicts,
)
from max_profile.model import (
    Finding,
    GpuInfo,
    KernelBreakdown,
    LoadLevel,
    RawCapture,
    Report,
    RequestRecord,
    StartupPhase,
    StartupProfile,
    UtilizationSection,
)

from ..analyze.rules.test_serving import level
from ..builders import built_report, serve_summary

B1 = Path(__file__).parents[1] / "data" / "gpu" / "h200_llama5b_every_verb" / "run_b1_raw.json.gz"


def a_run() -> Report:
    # without its start-up section (tested on its own below): the lines and verdicts of the steps and kernels
    return msgspec.structs.replace(built_report(B1), startup=None)


def slower_decode(r: Report, factor: float, every: int = 1) -> Report:
    """The run with every ``every``-th decode step ``factor`` times longer (its end moved)."""
    steps = [
        msgspec.structs.replace(s, end_ns=s.start_ns + int((s.end_ns - s.start_ns) * factor))
        if s.phase == "decode" and s.index % every == 0
        else s
        for s in r.steps
    ]
    return msgspec.structs.replace(r, steps=steps)


def per_token(r: Report) -> list[float]:
    return [s.duration_ns / 1e6 / s.batch_size for s in r.steps if s.phase == "decode" and s.batch_size > 0]


def line(result_lines: list[DiffLine], metric: str) -> DiffLine:
    return next(x for x in result_lines if x.metric == metric)


def test_a_slower_decode_is_a_significant_regression_with_its_numbers() -> None:
    a = a_run()
    b = slower_decode(a, 1.10)
    got = diff_reports(a, b, a_label="base", b_label="new")
    assert (got.a, got.b, got.comparable, got.reasons, got.forced, got.fail_above_pct) == (
        "base",
        "new",
        True,
        [],
        False,
        5.0,
    )
    d = line(got.lines, "decode per token (host step time)")
    va, vb = per_token(a), per_token(b)
    assert d.unit == "ms/token" and d.samples == (len(va), len(vb))
    assert d.a == float(np.median(va)) and d.b == float(np.median(vb))
    assert d.delta == d.b - d.a and d.delta_pct == 100 * d.delta / d.a
    assert d.p_value == float(mannwhitneyu(va, vb, alternative="two-sided").pvalue)
    assert d.significant and d.regression and got.regression
    assert got.verdicts[0] == (
        f"REGRESSION: decode per token (host step time) {d.delta_pct:+.1f} % (p < 0.001), {d.delta:+.3g} ms/token"
    )
    # the same slowdown under a higher threshold: significant, slower, not a regression
    lenient = diff_reports(a, b, fail_above_pct=20.0)
    d20 = line(lenient.lines, "decode per token (host step time)")
    assert d20.significant and not d20.regression and not lenient.regression
    assert lenient.verdicts[0].startswith("slower: decode per token (host step time) +")
    faster = diff_reports(b, a)
    assert line(faster.lines, "decode per token (host step time)").delta < 0
    assert faster.verdicts[0].startswith("faster: decode per token") and not faster.regression


def test_the_same_run_changes_nothing() -> None:
    a = a_run()
    got = diff_reports(a, a)
    assert not got.regression and all(not x.significant for x in got.lines)
    judged = [x.metric for x in got.lines if x.judged and x.p_value is not None]
    assert got.outcome == "no regression" and len(judged) >= 2 and not got.inconclusive
    assert got.verdicts == [
        f"no regression: {len(judged)} figure(s) judged ({', '.join(judged[:3])}"
        + (f" and {len(judged) - 3} more" if len(judged) > 3 else "")
        + f"; Mann-Whitney U at alpha {ALPHA:g}, threshold 5 %)"
    ]
    d = line(got.lines, "decode per token (host step time)")
    assert d.delta == 0.0 and d.p_value == float(mannwhitneyu(per_token(a), per_token(a)).pvalue)
    # a stricter alpha, a threshold of 2.5 %: said as given
    assert (
        diff_reports(a, a, alpha=0.05, fail_above_pct=2.5)
        .verdicts[-1]
        .endswith("Mann-Whitney U at alpha 0.05, threshold 2.5 %)")
    )
    # the JSON written by `max-profile diff --json`: the result, field by field
    written = msgspec.json.decode(got.to_json())
    assert written["verdicts"] == got.verdicts and written["regression"] is False
    assert written["outcome"] == "no regression"
    assert [(x["metric"], x["a"], x["b"]) for x in written["lines"]] == [(x.metric, x.a, x.b) for x in got.lines]


def test_few_steps_or_constant_samples_are_no_test() -> None:
    a = a_run()
    decode = [s for s in a.steps if s.phase == "decode"]
    few = msgspec.structs.replace(a, steps=[s for s in a.steps if s.phase != "decode"] + decode[: MIN_SAMPLES - 1])
    got = line(diff_reports(few, slower_decode(a, 2.0)).lines, "decode per token (host step time)")
    assert got.p_value is None and not got.significant and got.samples == (MIN_SAMPLES - 1, len(decode))
    enough = msgspec.structs.replace(a, steps=[s for s in a.steps if s.phase != "decode"] + decode[:MIN_SAMPLES])
    assert line(diff_reports(enough, enough).lines, "decode per token (host step time)").p_value is not None

    def constant(r: Report, ns: int) -> Report:
        return msgspec.structs.replace(
            r, steps=[msgspec.structs.replace(s, end_ns=s.start_ns + ns) if s.phase == "decode" else s for s in r.steps]
        )

    same = line(diff_reports(constant(a, 2_000_000), constant(a, 2_000_000)).lines, "decode per token (host step time)")
    assert same.p_value == 1.0 and not same.significant  # identical and constant: no difference to test
    moved = line(
        diff_reports(constant(a, 2_000_000), constant(a, 3_000_000)).lines, "decode per token (host step time)"
    )
    assert moved.significant and moved.delta_pct == 50.0


def test_kernel_lines_per_phase_and_family() -> None:
    a = a_run()
    k = a.kernels
    assert isinstance(k, KernelBreakdown)
    slower = [
        msgspec.structs.replace(
            p,
            families={f: ms * (1.5 if f == "gemv" else 1.0) for f, ms in p.families.items()},
            kernel_ms=p.kernel_ms + 0.5 * p.families.get("gemv", 0.0),
        )
        if p.phase == "decode"
        else p
        for p in k.per_step
    ]
    b = msgspec.structs.replace(a, kernels=msgspec.structs.replace(k, per_step=slower, gpu_busy_pct=90.0))
    got = diff_reports(a, b)
    metrics = [x.metric for x in got.lines]
    decode_rows = [p for p in k.per_step if p.phase == "decode"]
    gemv_a = [p.families.get("gemv", 0.0) for p in decode_rows]
    g = line(got.lines, "decode gemv per step")
    assert g.a == float(np.median(gemv_a)) and g.b == float(np.median([1.5 * v for v in gemv_a]))
    assert g.regression and g.unit == "ms/step"
    total = line(got.lines, "decode kernel time per step")
    assert total.a == float(np.median([sum(p.families.values()) for p in decode_rows]))
    # the families in order of their medians (both runs together), those under 1 µs per step left out
    fams = {f for p in decode_rows for f in p.families}
    med = {f: float(np.median([p.families.get(f, 0.0) for p in decode_rows])) for f in fams}
    shown = [
        m.removeprefix("decode ").removesuffix(" per step")
        for m in metrics
        if m.startswith("decode ") and not m.startswith("decode per token")
    ]
    assert shown[0] == "kernel time"
    expected = sorted(fams, key=lambda f: -(med[f] * (2.5 if f == "gemv" else 2.0)))
    assert shown[1:] == [f for f in expected if med[f] * (1.5 if f == "gemv" else 1.0) > 0.001 or med[f] > 0.001]
    assert "prefill kernel time per step" in metrics  # one prefill step: a line without a test
    assert line(got.lines, "prefill kernel time per step").p_value is None
    busy = line(got.lines, "GPU busy")
    assert (busy.a, busy.b, busy.unit, busy.p_value) == (k.gpu_busy_pct, 90.0, "%", None)
    assert not busy.significant and not busy.regression  # a total without a distribution: a delta, not a test
    top = [x for x in got.lines if x.metric.startswith("kernel ")]
    decode = next(p for p in k.phases if p.phase == "decode")
    assert len(top) == min(10, len(decode.top_kernels))
    assert top[0].metric == f"kernel {decode.top_kernels[0].name}"
    assert top[0].a == decode.top_kernels[0].total_ms / decode.kernel_ms * decode.kernel_ms_per_step
    verdict = next(v for v in got.verdicts if "decode gemv per step" in v)
    assert verdict.startswith("REGRESSION: decode gemv per step +50.0 %")
    assert "changed:" not in " ".join(got.verdicts)


def test_comparability_reasons_and_force() -> None:
    a = a_run()
    cfg = dict(a.capture.model_config or {})

    def cap(**fields: object) -> Report:
        return msgspec.structs.replace(a, capture=msgspec.structs.replace(a.capture, **fields))

    def env(**fields: object) -> Report:
        return msgspec.structs.replace(a, environment=msgspec.structs.replace(a.environment, **fields))

    assert comparability(a, a) == []
    bigger = cap(model_config={**cfg, "hidden_size": 8192})
    assert comparability(a, bigger) == ["model hidden_size: 4096 vs 8192"]
    assert comparability(a, cap(model_config={k: v for k, v in cfg.items() if k != "hidden_size"})) == []
    assert comparability(a, cap(model_config={**cfg, "rope_theta": 1.0})) == []  # not a shape key
    h100 = env(gpus=[GpuInfo(key="nv0", name="NVIDIA H100")])
    assert comparability(a, h100) == ["GPUs: NVIDIA H200 vs NVIDIA H100"]
    assert comparability(a, env(gpus=[])) == ["GPUs: NVIDIA H200 vs none"]
    assert comparability(a, env(gpus=[GpuInfo(key="nv0", name=None)])) == ["GPUs: NVIDIA H200 vs nv0"]
    assert comparability(a, env(max_version="26.8.0")) == ["MAX version: 26.7.0 vs 26.8.0"]
    assert comparability(a, env(max_version=None)) == []
    assert comparability(a, cap(devices="gpu:0,1")) == ["devices: gpu vs gpu:0,1"]
    assert comparability(a, cap(device_graph_capture=False)) == ["device graph capture: True vs False"]
    assert comparability(a, cap(device_graph_capture=None)) == ["device graph capture: True vs None"]
    k = a.kernels
    assert isinstance(k, KernelBreakdown)
    nsys = msgspec.structs.replace(a, kernels=msgspec.structs.replace(k, source="nsys sqlite"))
    assert comparability(a, nsys) == ["kernel tracer: cupti vs nsys (a tracer changes the timing it measures)"]
    assert comparability(a, msgspec.structs.replace(a, kernels=None)) == [
        "kernel tracer: cupti vs none (a tracer changes the timing it measures)"
    ]
    u = a.utilization
    assert isinstance(u, UtilizationSection)
    slow_clock = msgspec.structs.replace(
        u, gpus=[msgspec.structs.replace(g, mean_sm_clock_mhz=1980 * 0.94) for g in u.gpus]
    )
    assert comparability(a, msgspec.structs.replace(a, utilization=slow_clock)) == [
        f"mean SM clock: 1980 vs {1980 * 0.94:.0f} MHz"
    ]
    near = msgspec.structs.replace(u, gpus=[msgspec.structs.replace(g, mean_sm_clock_mhz=1980 * 0.96) for g in u.gpus])
    assert comparability(a, msgspec.structs.replace(a, utilization=near)) == []  # within 5 %
    throttled = Finding(
        id="throttled", severity="warning", title="t", evidence={"reasons": "hw_thermal_slowdown"}, confidence=0.9
    )
    hot = msgspec.structs.replace(a, findings=[throttled])
    assert comparability(hot, a) == ["A was clock-throttled (hw_thermal_slowdown)"]
    info = msgspec.structs.replace(throttled, severity="info")
    assert comparability(a, msgspec.structs.replace(a, findings=[info])) == []
    # a start-up diff across MAX versions is what it is for
    su = cap(target="startup")
    assert (
        comparability(
            su, msgspec.structs.replace(su, environment=msgspec.structs.replace(a.environment, max_version="26.8.0"))
        )
        == []
    )
    # refused unless forced; forced, the lines are there and the result says so
    refused = diff_reports(a, bigger)
    assert not refused.comparable and refused.lines == [] and not refused.forced and not refused.regression
    forced = diff_reports(a, bigger, force=True)
    assert forced.forced and not forced.comparable and forced.lines
    assert not diff_reports(a, a, force=True).forced  # nothing to force


def _startup(total: float, cache: str, key: dict[str, str], **phases: float) -> StartupProfile:
    return StartupProfile(
        total_s=total,
        phases=[StartupPhase(name=n.replace("_", " "), seconds=s) for n, s in phases.items()],
        cache=cache,
        cache_reason="miss: profiling is new" if cache != "hit" else "hit",
        compile_key=key,
    )


def test_startup_lines_and_verdicts() -> None:
    a = _startup(40.0, "hit", {"profiling": "off", "max_version": "26.7.0"}, compile=2.0, weights=10.0, tiny=0.2)
    b = _startup(100.0, "miss", {"profiling": "on", "max_version": "26.7.0"}, compile=62.0, weights=9.7, tiny=0.4)
    assert startup_verdicts(a, b) == [
        "start-up 40.0 s -> 100.0 s (+150 %); compile cache hit -> miss (miss: profiling is new)",
        "compile key changed: profiling: off -> on",
        "largest change: compile +60.0 s",
    ]
    same = startup_verdicts(a, a)
    assert same == ["start-up 40.0 s -> 40.0 s (+0 %); compile cache hit -> hit"]  # no key change, no move
    assert startup_verdicts(a, a, "26.7.0", "26.8.0")[1] == "compile key changed: MAX 26.7.0 -> 26.8.0"
    versioned = _startup(40.0, "hit", {"profiling": "off", "max_version": "26.8.0"})
    assert startup_verdicts(a, versioned, "26.7.0", "26.8.0")[1] == "compile key changed: max_version: 26.7.0 -> 26.8.0"
    zero = _startup(0.0, "hit", {})
    assert startup_verdicts(zero, a)[0].startswith("start-up 0.0 s -> 40.0 s (new)")
    small = _startup(40.1, "hit", {"profiling": "off", "max_version": "26.7.0"}, compile=2.4, weights=10.0, tiny=0.2)
    assert startup_verdicts(a, small)[-1] == "start-up 40.0 s -> 40.1 s (+0 %); compile cache hit -> hit"  # < 0.5 s
    new_phase = _startup(41.0, "hit", {}, compile=2.0, weights=10.0, tiny=0.2, warmup=STARTUP_MIN_PHASE_S)
    assert startup_verdicts(a, new_phase)[-1] == "largest change: warmup +0.5 s"
    # as lines of a diff: the total, then each phase of either run that took 0.5 s or more in one of them
    ra = msgspec.structs.replace(a_run(), startup=a, steps=[], kernels=None)
    rb = msgspec.structs.replace(a_run(), startup=b, steps=[], kernels=None)
    got = diff_reports(ra, rb)
    assert [x.metric for x in got.lines if x.metric.startswith("start-up")] == [
        "start-up to first token",
        "start-up: compile",
        "start-up: weights",
    ]
    assert line(got.lines, "start-up: compile").delta == 60.0 and line(
        got.lines, "start-up: weights"
    ).delta == pytest.approx(-0.3)
    assert got.verdicts[:3] == startup_verdicts(a, b, "26.7.0", "26.7.0")


def _level(c: int, tok: float, ttft: float | None, itl: float | None) -> LoadLevel:
    """One level of a sweep with these medians (tests/analyze/rules/test_serving.py's builder)."""
    return level(c, tok, itl=itl, itl_p99=itl, ttft=ttft)


def test_load_sweeps_compare_level_by_level() -> None:
    base = msgspec.structs.replace(a_run(), steps=[], kernels=None)
    ra = msgspec.structs.replace(base, load_levels=[_level(1, 100.0, 50.0, 10.0), _level(4, 300.0, 80.0, None)])
    rb = msgspec.structs.replace(base, load_levels=[_level(1, 90.0, 55.0, 11.0), _level(16, 500.0, 90.0, 20.0)])
    got = diff_reports(ra, rb)
    assert [x.metric for x in got.lines] == [
        "concurrency 1: output",
        "concurrency 1: TTFT p50",
        "concurrency 1: ITL p50",
    ]  # only the levels both swept
    out = line(got.lines, "concurrency 1: output")
    assert (out.unit, out.delta, out.delta_pct, out.p_value) == ("tok/s", -10.0, -10.0, None)
    assert not out.regression  # a single observation per run: a delta, never a verdict
    assert line(got.lines, "concurrency 1: TTFT p50").delta == 5.0


def test_serve_latency_from_the_raw_requests_else_the_summaries() -> None:
    a = a_run()

    def requests(gaps: list[float]) -> RawCapture:
        raw = RawCapture.load(str(B1))
        return msgspec.structs.replace(
            raw, requests=[RequestRecord(started_ns=0, ended_ns=1, ok=True, tokens=len(gaps) + 1, itl_ms=gaps)]
        )

    def served(itl: float | None, ttft: float | None) -> Report:
        s = serve_summary(output_tokens=9, ttft_ms_p50=ttft, itl_ms_p50=itl)
        return msgspec.structs.replace(a, serve=s, steps=[], kernels=None)

    ra, rb = served(10.0, 50.0), served(12.0, 60.0)
    rng = np.random.default_rng(7)
    ga, gb = list(rng.normal(10.0, 0.5, 40)), list(rng.normal(12.0, 0.5, 40))
    got = diff_reports(ra, rb, a_raw=requests(ga), b_raw=requests(gb))
    itl = line(got.lines, "serve inter-token latency")
    assert itl.a == float(np.median(ga)) and itl.samples == (40, 40) and itl.significant and itl.regression
    ttft = line(got.lines, "serve time to first token p50")
    assert (ttft.a, ttft.b, ttft.p_value) == (50.0, 60.0, None)
    no_raw = diff_reports(ra, rb)
    p50 = line(no_raw.lines, "serve inter-token latency p50")
    assert (p50.a, p50.b, p50.p_value, p50.significant) == (10.0, 12.0, None, False)
    bare = diff_reports(served(None, None), served(None, None))
    assert [x.metric for x in bare.lines if x.metric.startswith("serve")] == []
    assert "one run is a max serve capture, the other is not" in comparability(ra, a)


def test_verdict_wording() -> None:
    from max_profile.analyze.diff import _verdicts

    def dl(metric: str, unit: str, a: float, b: float, p: float | None, regression: bool = False) -> DiffLine:
        return DiffLine(
            metric=metric,
            unit=unit,
            a=a,
            b=b,
            delta=b - a,
            delta_pct=100 * (b - a) / a if a else None,
            p_value=p,
            significant=p is not None,
            regression=regression,
        )

    got = _verdicts(
        [
            dl("x", "ms/step", 1.0, 2.0, 0.0005, regression=True),
            dl("y", "µs", 2.0, 1.0, 0.004),
            dl("z", "%", 50.0, 40.0, 0.002),
            dl("new", "ms", 0.0, 3.0, 0.003),
            dl("quiet", "ms", 1.0, 5.0, None),
        ],
        5.0,
        0.01,
    )
    assert got == [
        "REGRESSION: x +100.0 % (p < 0.001), +1 ms/step",
        "faster: y -50.0 % (p = 0.004), -1 µs",
        "changed: z -20.0 % (p = 0.002), -10 %",
        "slower: new new in B (p = 0.003), +3 ms",
    ]


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


# --- three outcomes: what a gate could judge, on a CPU capture's steps --------------------------------------------

QUIET_CPU = Path(__file__).parents[1] / "data" / "cpu" / "demo_ops_quiet_raw.json.gz"


def _cpu_run(wall: float = 1.0, cpu: float = 1.0, sleep_ms: float = 0.0, others: float = 0.0) -> RawCapture:
    """The quiet CPU capture with every decode step's wall time scaled (and ``sleep_ms`` added), its process CPU time
    scaled, and ``others`` cores of other processes on its host-load record (two busy loops: about 1.5 of 2); each
    step's noise kept (steps scaled one by one)."""
    raw = RawCapture.load(str(QUIET_CPU))
    steps = []
    for s in raw.steps:
        if s.phase == "decode":
            dur = int(s.duration_ns * wall + sleep_ms * 1e6)
            s = msgspec.structs.replace(s, end_ns=s.start_ns + dur, cpu_ns=int((s.cpu_ns or 0) * cpu))
        steps.append(s)
    load = raw.capture.host_load
    assert load is not None
    loaded = msgspec.structs.replace(load, other_cores=others, window_s=max(load.window_s, 1.0))
    return msgspec.structs.replace(raw, steps=steps, capture=msgspec.structs.replace(raw.capture, host_load=loaded))


def _outcome(a: RawCapture, b: RawCapture) -> tuple[str, dict[str, DiffLine]]:
    from max_profile.analyze.report import build_report

    got = diff_reports(build_report(a), build_report(b), a_raw=a, b_raw=b)
    assert got.verdicts and not any("no significant change" in v for v in got.verdicts)
    return got.outcome, {x.metric: x for x in got.lines}


def test_beside_busy_loops_nothing_host_timed_is_judged_and_the_gate_says_inconclusive() -> None:
    """Beside two busy loops (B's host-load record: 1.5 of 2 cores to other processes) neither the step's wall time nor
    the process's CPU time is judged (MAX's CPU runtime spins its worker threads less when the cores are taken: its CPU
    time per token moved -57 % to +11 % over 20 unchanged runs beside busy loops): the same work, more work per step and
    a sleep in the step are all inconclusive, never "no regression". On a quiet machine the sleep and the extra work
    are regressions."""
    base = _cpu_run()
    host, cpu = "decode per token (host step time)", "decode per token (process CPU time)"
    for b in (
        _cpu_run(wall=1.4, others=1.5),
        _cpu_run(wall=1.7, cpu=1.2, others=1.5),
        _cpu_run(sleep_ms=2.0, others=1.5),
    ):
        outcome, lines = _outcome(base, b)
        assert outcome == "inconclusive" and not lines[host].judged and not lines[cpu].judged
        assert not lines[host].regression and not lines[cpu].regression
    quiet_sleep, lines = _outcome(base, _cpu_run(sleep_ms=2.0))
    assert quiet_sleep == "regression" and lines[host].regression and lines[host].judged
    quiet_burn, lines = _outcome(base, _cpu_run(wall=1.2, cpu=1.2))
    assert quiet_burn == "regression" and lines[cpu].regression and lines[cpu].judged


def test_a_baseline_taken_under_load_leaves_host_time_unjudged_both_ways() -> None:
    """A baseline recorded beside busy loops against a quiet run that is 10 % slower in fact: the baseline's inflated
    host times would read the slower run as faster. Host time is judged only when both records vouch for a quiet
    machine; moved by the load past the threshold, it leaves the comparison open (inconclusive, never "no
    regression")."""
    loaded_baseline = _cpu_run(wall=1.5, others=1.5)
    slower = _cpu_run(wall=1.1, cpu=1.1)
    outcome, lines = _outcome(loaded_baseline, slower)
    host = lines["decode per token (host step time)"]
    assert host.delta < 0 and not host.judged and not host.significant  # "faster" would be the load's doing
    assert outcome == "inconclusive"


def test_nothing_judged_and_one_sample_each_are_inconclusive() -> None:
    """Two start-ups (one observation each) say "one sample each"; two runs with too few steps say how many more."""
    a = msgspec.structs.replace(a_run(), steps=[], kernels=None)
    cold = StartupProfile(total_s=289.2, phases=[StartupPhase(name="compile", seconds=280.0)], cache="miss")
    warm = StartupProfile(total_s=10.0, phases=[StartupPhase(name="compile", seconds=1.0)], cache="hit")
    got = diff_reports(msgspec.structs.replace(a, startup=warm), msgspec.structs.replace(a, startup=cold))
    assert got.outcome == "inconclusive" and any("one sample each" in w for w in got.inconclusive)
    assert got.verdicts[-1].startswith("INCONCLUSIVE: ") and "hit -> miss" in got.verdicts[0]
    same = diff_reports(msgspec.structs.replace(a, startup=warm), msgspec.structs.replace(a, startup=warm))
    assert same.outcome == "inconclusive" and same.inconclusive[0].startswith("nothing was judged")
