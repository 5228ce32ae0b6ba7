"""The KV-cache rule field by field: every figure of ``kv-cache-broken`` recomputed here from the generated steps and
kernels by plain Python (medians, average ranks, pairwise slopes, cosines), not by the rule's own numpy path; the
helpers at their edges (series of 1, 2, 4 and 5 steps, constant series, halves over 1,500 steps); and the rule's
signals at their thresholds both ways."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Sequence

import msgspec
import pytest

from max_profile.analyze.report import build_report
from max_profile.analyze.rules.kv_cache import _corr, _half_slopes, rule_kv_cache
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Capture, Finding, HostLoad, KernelRecord, RawCapture, Report, Step

from ...analyze.rules.test_rules import GPU_ENV

TH = Thresholds()

GEMV, GEMM, MHA = "gemv_split_k_bf16_0123456789abcdef", "gemm_bf16_tn_0123456789abcdef", "sm90_mha_depth128_abcdef"


# ---- truths, computed without the rule's code ------------------------------------------------------------------------


def running_median_5(values: Sequence[float]) -> list[float]:
    """The median of each value and its two neighbours either side, the ends repeated (as the rule documents)."""
    padded = [values[0]] * 2 + list(values) + [values[-1]] * 2
    return [statistics.median(padded[i : i + 5]) for i in range(len(values))]


def average_ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    return cov / math.sqrt(va * vb)


def steadiness(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation of x and y, y first smoothed by a running median of 5 (from 5 values up); 0.0 for
    fewer than 2 values or a constant series."""
    if len(x) < 2:
        return 0.0
    smooth = running_median_5(y) if len(x) >= 5 else list(y)
    ra, rb = average_ranks(x), average_ranks(smooth)
    if len(set(ra)) == 1 or len(set(rb)) == 1:
        return 0.0
    return pearson(ra, rb)


def theil_sen(x: Sequence[float], y: Sequence[float]) -> float:
    """The median of the slopes of every pair with distinct x."""
    slopes = [(y[j] - y[i]) / (x[j] - x[i]) for i in range(len(x)) for j in range(len(x)) if x[j] > x[i]]
    return statistics.median(slopes) if slopes else 0.0


def theil_sen_fast(x: Sequence[float], y: Sequence[float]) -> float:
    """:func:`theil_sen` for thousands of points: the same median of pairwise slopes, the pairs formed by numpy."""
    import numpy as np

    ax, ay = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    dx, dy = ax[None, :] - ax[:, None], ay[None, :] - ay[:, None]
    return float(np.median(dy[dx > 0] / dx[dx > 0]))


def thirds(values: Sequence[float]) -> tuple[float, float]:
    third = max(len(values) // 3, 1)
    return statistics.median(values[:third]), statistics.median(values[-third:])


# ---- a capture with known figures ---------------------------------------------------------------------------------


class Decode(msgspec.Struct):
    """One decode step as generated: wall ms, context before it, tokens the scheduler and the model fed per request,
    its kernels (name, ms)."""

    ms: float
    context: int
    fed: int = 1
    batch: int = 1
    model_fed: int | None = None
    kernels: list[tuple[str, float]] = []
    fed_total: int | None = None
    """The step's input tokens over all its requests, when not ``fed`` x ``batch``."""
    model_total: int | None = None
    cpu_ms: float | None = None


def capture(
    decode: list[Decode],
    prefill: list[tuple[str, float]],
    *,
    extra: Sequence[Step] = (),
    on_cpu: bool = False,
    kernel_source: str = "synthetic",
    with_prefill: bool = True,
) -> RawCapture:
    """A prefill step then ``decode`` steps back to back; each step's kernels run in turn from 1 µs into it."""
    steps, kernels = [], []
    t = 1_000_000
    rows = [(Decode(ms=5.0, context=0, fed=16, kernels=prefill), "prefill")] if with_prefill else []
    rows += [(d, "decode") for d in decode]
    for i, (d, phase) in enumerate(rows):
        dur = round(d.ms * 1e6)
        steps.append(
            Step(
                index=i,
                phase=phase,
                batch_size=d.batch,
                input_tokens=d.fed * d.batch if d.fed_total is None else d.fed_total,
                context_tokens=d.context,
                start_ns=t,
                end_ns=t + dur,
                output_tokens=d.batch,
                model_input_tokens=d.model_total if d.model_fed is None else d.model_fed * d.batch,
                cpu_ns=None if d.cpu_ms is None else round(d.cpu_ms * 1e6),
            )
        )
        k_t = t + 1000
        for name, kms in d.kernels:
            kd = round(kms * 1e6)
            kernels.append(KernelRecord(name=name, start_ns=k_t, end_ns=k_t + kd, launch_ns=t + 10))
            k_t += kd
        t += dur + 1000
    return RawCapture(
        environment=msgspec.structs.replace(GPU_ENV, vendor="none", gpus=[]) if on_cpu else GPU_ENV,
        capture=Capture(started_unix_s=0.0),
        steps=steps + list(extra),
        kernels=kernels,
        kernel_source=kernel_source,
    )


def kv_finding(report: Report) -> Finding:
    found = [f for f in report.findings if f.id == "kv-cache-broken"]
    assert len(found) == 1, [f.id for f in report.findings]
    return found[0]


def irregular(rng: random.Random, lo: float, hi: float) -> float:
    """A value in whole nanoseconds (exact in the capture) with digits past every rounding."""
    return round(rng.uniform(lo, hi), 6)


def growing_run(n: int = 48, seed: int = 5) -> tuple[list[Decode], list[tuple[str, float]]]:
    """Decode steps whose wall time and kernel time rise with the sequence (a re-encoding decode), with jitter, a gemm
    and attention beside the gemv; the model's own input grows while the scheduler feeds one token."""
    rng = random.Random(seed)
    decode = []
    for i in range(n):
        gemv, gemm = irregular(rng, 0.2, 0.3), 0.05 + 0.01 * i + irregular(rng, 0.0, 0.01)
        decode.append(
            Decode(
                ms=1.0 + 0.05 * i + irregular(rng, 0.0, 0.2),
                context=37 + i,
                model_fed=38 + i,
                kernels=[(GEMV, gemv), (GEMM, gemm), (MHA, irregular(rng, 0.01, 0.02))],
            )
        )
    prefill = [(GEMM, 2.345678), (MHA, 0.456789), (GEMV, 0.012345)]
    return decode, prefill


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_every_figure_of_the_finding_recomputed_from_the_generated_steps() -> None:
    decode, prefill = growing_run()
    # a decode step that fed no request (batch 0) is not a step of the trend: it would divide by zero if counted
    idle = Step(index=99, phase="decode", batch_size=0, input_tokens=0, context_tokens=0, start_ns=10, end_ns=20)
    report = build_report(capture(decode, prefill, extra=[idle]))
    assert [f.family for f in report.kernels.phases[0].families] == ["gemm", "attention", "gemv"]  # type: ignore[union-attr]
    ev = kv_finding(report).evidence

    ms = [round(d.ms * 1e6) / 1e6 for d in decode]
    seq = [d.context + d.fed for d in decode]
    kernel_ms = [sum(round(k * 1e6) for _, k in d.kernels) / 1e6 for d in decode]
    first, last = thirds(ms)
    k_first, k_last = thirds(kernel_ms)
    mf_first, mf_last = thirds([d.model_fed for d in decode])  # type: ignore[misc]
    families = ("gemv", "gemm", "attention")
    pre = [prefill[2][1], prefill[0][1], prefill[1][1]]
    dec = [sum(round(d.kernels[i][1] * 1e6) for d in decode) / 1e6 for i in range(3)]
    half = len(decode) // 2
    expected = {
        "decode_steps": len(decode),
        "step_time": "wall time per step",
        "sequence_from": seq[0],
        "sequence_to": seq[-1],
        "first_third_median_ms": round(first, 3),
        "last_third_median_ms": round(last, 3),
        "growth_ratio": round(last / first, 2),
        "time_vs_sequence_correlation": round(steadiness(seq, ms), 3),
        "growth_ms_per_100_tokens": round(report.step_summary.decode_step_growth_ms_per_100_ctx, 4),  # type: ignore[union-attr]
        "decode_input_tokens_per_request_first": 1.0,
        "decode_input_tokens_per_request_last": 1.0,
        "decode_kernel_ms_growth_ratio": round(k_last / k_first, 2),
        "kernel_time_vs_sequence_correlation": round(steadiness(seq, kernel_ms), 3),
        "model_input_tokens_per_request_first": round(mf_first, 1),
        "model_input_tokens_per_request_last": round(mf_last, 1),
        "decode_top_family": families[max(range(3), key=lambda i: dec[i])],
        "decode_vs_prefill_mix_similarity": round(cosine(pre, dec), 3),
        "decode_gemm_share_pct": round(100 * dec[1] / sum(dec), 1),
        "growth_ms_per_token_first_half": round(theil_sen(seq[:half], ms[:half]), 5),
        "growth_ms_per_token_second_half": round(theil_sen(seq[half:], ms[half:]), 5),
        "signals": "step time, kernel time, model re-encodes the sequence",
    }
    assert ev == expected
    # the figures are irregular enough that each rounding shows: one more digit would change every one of them
    for raw_figure, digits in ((first, 3), (last, 3), (last / first, 2), (k_last / k_first, 2)):
        assert round(raw_figure, digits) != round(raw_figure, digits + 1), raw_figure


def test_scheduler_refeeds_with_flat_time_say_so_with_zero_growth() -> None:
    """The scheduler feeds the whole sequence again, step times flat to the nanosecond: the figures say no growth
    (0.0, not a default of 1), the fed tokens' medians, and the signal."""
    n = 36
    decode = [Decode(ms=2.0, context=0, fed=20 + 3 * i, batch=2, kernels=[(GEMV, 0.5)]) for i in range(n)]
    report = build_report(capture(decode, [(GEMM, 1.0)]))
    f = kv_finding(report)
    fed_first, fed_last = thirds([20 + 3 * i for i in range(n)])
    assert f.evidence["decode_input_tokens_per_request_first"] == fed_first == 36.5
    assert f.evidence["decode_input_tokens_per_request_last"] == fed_last == 108.5
    assert f.evidence["growth_ratio"] == 1.0 and f.evidence["growth_ms_per_100_tokens"] == 0.0
    assert f.evidence["time_vs_sequence_correlation"] == 0.0  # a constant series does not rise
    assert f.evidence["signals"] == "re-fed tokens" and f.confidence == 0.95
    assert f.title.startswith("Decode work grows with the sequence")
    assert f.severity == "error"


def test_batch_divides_the_fed_tokens_per_request() -> None:
    """Two requests fed 1 token each: 1 per request, not 2 (or 4): no re-feed."""
    n = 36
    decode = [Decode(ms=2.0, context=10 + i, batch=2, model_fed=1, kernels=[(GEMV, 0.5)]) for i in range(n)]
    assert "kv-cache-broken" not in {f.id for f in build_report(capture(decode, [(GEMM, 1.0)])).findings}


def model_refeed(fed_from: int, *, step: int = 1, n: int = 36, twos: int | None = None) -> Report:
    """The scheduler feeds 1 token per request (2 requests); the model's own input per request starts at
    ``fed_from`` and rises by ``step`` a step; ``twos``: that many steps of 2 model tokens, the rest of 1."""
    rows = []
    for i in range(n):
        own = fed_from + step * i if twos is None else (2 if i < twos else 1)
        rows.append(Decode(ms=2.0, context=10 + i, batch=2, model_fed=own, kernels=[(GEMV, 0.5)]))
    return build_report(capture(rows, [(GEMM, 1.0)]))


def test_model_refeed_title_and_figures() -> None:
    f = kv_finding(model_refeed(5))
    assert f.title.startswith("The model re-encodes the whole sequence at every decode step")
    assert f.evidence["signals"] == "model re-encodes the sequence" and f.confidence == 0.95
    assert f.evidence["model_input_tokens_per_request_first"] == 10.5  # medians of 5..16 and 29..40 per request
    assert f.evidence["model_input_tokens_per_request_last"] == 34.5


def test_model_refeed_edges() -> None:
    """Model input of exactly 2 tokens counts as re-fed (>= 2); a rise of exactly half the minimum context growth
    counts; the share of re-fed steps at exactly kv_refeed_steps_share counts."""
    n = 36
    half_growth = TH.kv_min_context_growth / 2
    assert half_growth == int(half_growth)
    third = n // 3
    # the first-third median 2, the last-third median 2 + half_growth: a rise of exactly half the context growth
    rows = [2] * third + [2 + int(half_growth) * i // (n - third) for i in range(n - third)]
    rows[-third:] = [2 + int(half_growth)] * third
    exact = [Decode(ms=2.0, context=10 + i, batch=2, model_fed=m, kernels=[(GEMV, 0.5)]) for i, m in enumerate(rows)]
    report = build_report(capture(exact, [(GEMM, 1.0)]))
    assert kv_finding(report).evidence["signals"] == "model re-encodes the sequence"
    short = [
        msgspec.structs.replace(d, model_fed=(d.model_fed or 0) - 1 if i >= n - third else d.model_fed)
        for i, d in enumerate(exact)
    ]
    assert "kv-cache-broken" not in {f.id for f in build_report(capture(short, [(GEMM, 1.0)])).findings}


def test_per_step_kernel_growth_and_its_edges() -> None:
    """The kernel growth ratio and its correlation against plain-Python truths; no figure under the minimum of steps;
    a sampled recording reads only the steps it recorded whole, paired with their own sequence lengths."""
    from max_profile.analyze.rules.kv_cache import _per_step_kernel_growth

    decode, prefill = growing_run(n=36)
    raw = capture(decode, prefill)
    report = build_report(raw)
    growth, corr = _per_step_kernel_growth(report, TH.kv_min_decode_steps)
    kernel_ms = [sum(round(k * 1e6) for _, k in d.kernels) / 1e6 for d in decode]
    k_first, k_last = thirds(kernel_ms)
    assert growth == pytest.approx(k_last / k_first, rel=1e-12)
    assert corr == pytest.approx(steadiness([d.context + 1 for d in decode], kernel_ms), rel=1e-12)
    # one step fewer than the rule needs: no growth figure; exactly the minimum: one
    assert _per_step_kernel_growth(report, len(decode) + 1) == (None, 0.0)
    assert _per_step_kernel_growth(report, len(decode))[0] == growth
    # a recording of the second half of the decode steps only: the figures of those steps, never zeros for the others
    work = sorted((s for s in raw.steps if s.batch_size > 0), key=lambda s: s.start_ns)
    half = [s for s in work if s.phase == "decode"][len(decode) // 2 :]
    span = (half[0].start_ns, half[-1].end_ns)
    asked = raw.kernels.attribution_time()
    sampled = msgspec.structs.replace(
        raw,
        kernels=raw.kernels.select((asked >= span[0]) & (asked <= span[1])),  # what a recorder keeps
        recorded_spans=[span],
        window_ns=(work[0].start_ns, work[-1].end_ns),
    )
    part = build_report(sampled)
    recorded = kernel_ms[len(decode) // 2 :]
    p_first, p_last = thirds(recorded)
    g, c = _per_step_kernel_growth(part, len(recorded))
    assert g == pytest.approx(p_last / p_first, rel=1e-12)
    assert c == pytest.approx(steadiness([d.context + 1 for d in decode[len(decode) // 2 :]], recorded), rel=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 11])
def test_steadiness_matches_its_definition_on_short_and_long_series(n: int) -> None:
    rng = random.Random(n)
    for _ in range(20):
        x = [rng.randint(0, 6) for _ in range(n)]
        y = [rng.choice([0.0, 1.5, 2.25, 3.0, -1.0]) + rng.random() * rng.randint(0, 1) for _ in range(n)]
        assert _corr(x, y) == pytest.approx(steadiness(x, y), abs=1e-12), (x, y)
    # a falling series after a rising x: the smoothing repeats the end values (a pad of zeros would not)
    if n >= 5:
        falling = [float(n - i) for i in range(n)]
        assert _corr(list(range(n)), falling) == pytest.approx(-1.0)


def test_steadiness_of_constant_and_tiny_series_is_zero() -> None:
    assert _corr([1], [2.0]) == 0.0
    assert _corr([1, 2], [3.0, 3.0]) == 0.0  # y constant
    assert _corr([4, 4], [1.0, 2.0]) == 0.0  # x constant
    assert _corr([1, 2], [1.0, 2.0]) == pytest.approx(1.0)
    assert _corr([1, 2, 3, 4], [1.0, 2.0, 3.0, 100.0]) == pytest.approx(1.0)


@pytest.mark.parametrize("n", [2, 3, 9, 40])
def test_half_slopes_are_theil_sen_of_each_half(n: int) -> None:
    rng = random.Random(n)
    x = sorted(rng.randint(0, 3 * n) for _ in range(n))
    y = [0.1 * v + rng.uniform(-2, 2) for v in x]
    mid = n // 2
    first, second = _half_slopes(x, y)
    assert first == pytest.approx(theil_sen(x[:mid], y[:mid]), abs=1e-12)
    assert second == pytest.approx(theil_sen(x[mid:], y[mid:]), abs=1e-12)


def test_half_slopes_of_a_flat_or_single_point_half_are_zero() -> None:
    assert _half_slopes([5, 5, 5, 5], [1.0, 2.0, 3.0, 4.0]) == (0.0, 0.0)  # no two distinct x: no slope
    assert _half_slopes([1, 2, 3], [1.0, 5.0, 9.0]) == (0.0, 4.0)  # a first half of one step
    assert _half_slopes([1, 2, 3, 4], [0.0, 1.0, 3.0, 3.5]) == (1.0, 0.5)


def test_half_slopes_of_long_halves_keep_1500_evenly_spread_steps() -> None:
    """Halves of 2,999 steps: every other step is kept (indices 0, 2, ..., 2998: 1,500 of them), exact in floating
    point, and the slope is that subset's Theil-Sen slope, not the whole half's."""
    rng = random.Random(11)
    n = 2 * 2999
    x = list(range(n))
    y = [0.001 * i * i * (1 if i % 2 else 3) + rng.uniform(0, 5) for i in range(n)]
    first, second = _half_slopes(x, y)
    assert first == pytest.approx(theil_sen_fast(x[:2999:2], y[:2999:2]), rel=1e-12)
    assert second == pytest.approx(theil_sen_fast(x[2999::2], y[2999::2]), rel=1e-12)


def test_rule_thresholds_on_the_step_time_at_their_exact_values() -> None:
    """A growth ratio of exactly kv_growth_ratio with a correlation of 1 fires; the rule's own figures decide."""
    n = 36
    third = n // 3
    # first third at 1 ms, the middle rising, the last third at exactly ratio x 1 ms: medians 1 and ratio
    ratio = TH.kv_growth_ratio
    ms = [1.0] * third + [1.0 + (ratio - 1.0) * (i + 1) / (n - 2 * third + 1) for i in range(n - 2 * third)]
    ms += [ratio] * third
    # strictly rising within the thirds too (by nanoseconds), so the rank correlation is 1
    ms = [m + 1e-6 * i for i, m in enumerate(ms)]
    first, last = thirds([round(m * 1e6) / 1e6 for m in ms])
    rows = [Decode(ms=m, context=10 + 4 * i, kernels=[(GEMV, 0.5)]) for i, m in enumerate(ms)]
    report = build_report(capture(rows, [(GEMM, 1.0)]))
    got = rule_kv_cache(report, dataclasses.replace(TH, kv_growth_ratio=last / first))
    assert got and "step time" in str(got[0].evidence["signals"])
    above = rule_kv_cache(report, dataclasses.replace(TH, kv_growth_ratio=last / first + 1e-9))
    assert not above
    corr = float(got[0].evidence["time_vs_sequence_correlation"])  # type: ignore[arg-type]
    assert corr == 1.0
    at_corr = rule_kv_cache(report, dataclasses.replace(TH, kv_trend_corr=1.0))
    assert at_corr


def test_host_contention_turns_the_step_time_signal_off_and_says_why() -> None:
    decode, prefill = growing_run()
    plain = [msgspec.structs.replace(d, model_fed=None, kernels=[(GEMV, 0.25)]) for d in decode]
    raw = capture(plain, prefill)
    busy = HostLoad(window_s=1.0, cores=2, cpu_busy_pct=100.0, own_cores=1.0, other_cores=1.0)
    contended = msgspec.structs.replace(raw, capture=msgspec.structs.replace(raw.capture, host_load=busy))
    assert "kv-cache-broken" in {f.id for f in build_report(raw).findings}
    assert rule_kv_cache(build_report(contended), TH) == []


# ---- each signal, its confidence and title; the edges the mutation run found unpinned ------------------------------


def time_only(n: int = 40, first_ms: float = 1.2, step_ms: float = 0.05, kernels: bool = True) -> list[Decode]:
    """Step time rising steadily with the sequence; the kernels (if any) flat: the step-time signal alone."""
    return [
        Decode(ms=first_ms + step_ms * i, context=20 + i, kernels=[(GEMV, 0.3)] if kernels else []) for i in range(n)
    ]


def test_confidence_and_title_follow_the_signals() -> None:
    with_kernels = kv_finding(build_report(capture(time_only(), [(GEMM, 1.0)])))
    assert with_kernels.evidence["signals"] == "step time"
    assert with_kernels.confidence == 0.85  # a kernel table to read, though it did not grow
    assert with_kernels.title.startswith("Decode work grows with the sequence")
    without = kv_finding(build_report(capture(time_only(kernels=False), [])))
    assert without.evidence["signals"] == "step time" and without.confidence == 0.7
    assert "decode_kernel_ms_growth_ratio" not in without.evidence
    decode, prefill = growing_run()
    both = kv_finding(build_report(capture(decode, prefill)))
    assert both.confidence == 0.95
    assert both.title.startswith("The model re-encodes the whole sequence at every decode step")


def test_a_first_third_under_1_ms_still_gives_its_ratio() -> None:
    f = kv_finding(build_report(capture(time_only(first_ms=0.4, step_ms=0.04), [(GEMM, 1.0)])))
    first, last = thirds([round((0.4 + 0.04 * i) * 1e6) / 1e6 for i in range(40)])
    assert f.evidence["growth_ratio"] == round(last / first, 2) and "step time" in str(f.evidence["signals"])


def refed(n: int, fed: list[int], ms: list[float] | None = None, batch: int = 1) -> list[Decode]:
    return [
        Decode(ms=(ms or [2.0] * n)[i], context=10 + i, fed=fed[i], batch=batch, kernels=[(GEMV, 0.3)])
        for i in range(n)
    ]


def test_a_zero_first_third_gives_a_zero_ratio() -> None:
    """Steps of no length first (a clock that did not move), the scheduler re-feeding: growth ratio 0.0, not 1."""
    n = 36
    fed = [20 + 3 * i for i in range(n)]
    rows = refed(n, fed, ms=[0.0] * 12 + [2.0] * 24)
    f = kv_finding(build_report(capture(rows, [(GEMM, 1.0)])))
    assert f.evidence["growth_ratio"] == 0.0 and f.evidence["signals"] == "re-fed tokens"


def test_fed_tokens_per_request_to_one_decimal() -> None:
    """Three requests a step, 7 + 9 i tokens among them: per request (7 + 9 i) / 3, a third of a token."""
    n = 36
    rows = [
        Decode(ms=2.0, context=0, batch=3, fed_total=7 + 9 * i, model_total=8 + 9 * i, kernels=[(GEMV, 0.3)])
        for i in range(n)
    ]
    f = kv_finding(build_report(capture(rows, [(GEMM, 1.0)])))
    per = [(7 + 9 * i) / 3 for i in range(n)]
    model = [(8 + 9 * i) / 3 for i in range(n)]
    fed_first, fed_last = thirds(per)
    mf_first, mf_last = thirds(model)
    assert f.evidence["decode_input_tokens_per_request_first"] == round(fed_first, 1) != round(fed_first, 2)
    assert f.evidence["decode_input_tokens_per_request_last"] == round(fed_last, 1) != round(fed_last, 2)
    assert f.evidence["model_input_tokens_per_request_first"] == round(mf_first, 1) != round(mf_first, 2)
    assert f.evidence["model_input_tokens_per_request_last"] == round(mf_last, 1) != round(mf_last, 2)


def test_refeed_edges_at_exact_values() -> None:
    """Steps fed exactly 2 tokens count as re-fed; exactly kv_refeed_steps_share of the steps re-fed counts; a rise of
    exactly half the minimum context growth counts, a rise of three quarters of that does not."""
    n, third = 39, 13
    half = TH.kv_min_context_growth // 2
    assert half * 2 == TH.kv_min_context_growth
    twos = [2] * third + [2] * third + [2 + half] * third  # first-third median 2, last 2 + half: exactly the rise
    assert kv_finding(build_report(capture(refed(n, twos), [(GEMM, 1.0)]))).evidence["signals"] == "re-fed tokens"
    short = [2] * (2 * third) + [2 + half - 1] * third
    assert "kv-cache-broken" not in {f.id for f in build_report(capture(refed(n, short), [(GEMM, 1.0)])).findings}
    three_quarters = [2] * (2 * third) + [2 + (3 * half) // 4] * third  # above a third of the growth, below a half
    assert "kv-cache-broken" not in {
        f.id for f in build_report(capture(refed(n, three_quarters), [(GEMM, 1.0)])).findings
    }
    # exactly the share of re-fed steps (4 of 40 fed 1, 36 of 40 at 2 or more: 0.9)
    m = 40
    share = [2] * 13 + [1] * 4 + [2] * 10 + [2 + half] * 13
    assert sum(x >= 2 for x in share) / m == TH.kv_refeed_steps_share
    assert kv_finding(build_report(capture(refed(m, share), [(GEMM, 1.0)])))
    fewer = [2] * 13 + [1] * 5 + [2] * 9 + [2 + half] * 13
    assert "kv-cache-broken" not in {f.id for f in build_report(capture(refed(m, fewer), [(GEMM, 1.0)])).findings}


def model_rows(own: list[int]) -> list[Decode]:
    return [Decode(ms=2.0, context=10 + i, batch=1, model_fed=m, kernels=[(GEMV, 0.3)]) for i, m in enumerate(own)]


def test_model_refeed_share_and_correlation_at_exact_values() -> None:
    n, third = 40, 13
    half = TH.kv_min_context_growth // 2
    own = [2] * 13 + [1] * 4 + [2 + i // 3 for i in range(10)] + [2 + half + i for i in range(13)]
    assert sum(x >= 2 for x in own) / n == TH.kv_refeed_steps_share
    report = build_report(capture(model_rows(own), [(GEMM, 1.0)]))
    seq = [10 + i + 1 for i in range(n)]
    corr = _corr(seq, own)  # the rule's own figure to the last bit (its truth: test_steadiness_matches_...)
    assert corr == pytest.approx(steadiness(seq, own), abs=1e-12)
    at = dataclasses.replace(TH, kv_model_refeed_corr=corr)
    found = rule_kv_cache(report, at)
    assert found and found[0].evidence["signals"] == "model re-encodes the sequence"
    assert not rule_kv_cache(report, dataclasses.replace(TH, kv_model_refeed_corr=corr + 1e-9))
    fewer = own[:]
    fewer[20] = 1
    assert not rule_kv_cache(build_report(capture(model_rows(fewer), [(GEMM, 1.0)])), at)
    assert third == n // 3


def test_kernel_growth_and_its_correlation_at_exact_values() -> None:
    """Flat step times, kernel time rising: the kernel signal fires at exactly its ratio and correlation."""
    n = 36
    kms = [0.2 + 0.01 * i + (0.003 if i % 4 == 1 else 0.0) for i in range(n)]
    rows = [Decode(ms=2.0, context=20 + i, kernels=[(GEMV, k)]) for i, k in enumerate(kms)]
    report = build_report(capture(rows, [(GEMM, 1.0)]))
    exact = [round(k * 1e6) / 1e6 for k in kms]
    k_first, k_last = thirds(exact)
    ratio, corr = k_last / k_first, _corr([20 + i + 1 for i in range(n)], exact)
    assert corr == pytest.approx(steadiness([20 + i + 1 for i in range(n)], exact), abs=1e-12)
    at = dataclasses.replace(TH, kv_growth_ratio=ratio, kv_trend_corr=corr)
    found = rule_kv_cache(report, at)
    assert found and found[0].evidence["signals"] == "kernel time" and found[0].confidence == 0.85
    assert not rule_kv_cache(report, dataclasses.replace(at, kv_growth_ratio=ratio * (1 + 1e-9)))
    assert not rule_kv_cache(report, dataclasses.replace(at, kv_trend_corr=corr + 1e-9))


def test_op_ranges_on_a_cpu_are_evidence_not_a_trigger() -> None:
    """MAX's op ranges (nvtx-log) growing on a CPU with flat CPU step time: evidence only. The same op times read as GPU
    kernels (a GPU capture) trigger."""
    n = 36
    rows = [Decode(ms=2.0, cpu_ms=2.0, context=20 + i, kernels=[("mo.matmul", 0.2 + 0.02 * i)]) for i in range(n)]
    cpu = build_report(capture(rows, [("mo.matmul", 1.0)], on_cpu=True, kernel_source="nvtx-log"))
    assert "kv-cache-broken" not in {f.id for f in cpu.findings}
    assert kv_finding(build_report(capture(rows, [(GEMM, 1.0)]))).evidence["signals"] == "kernel time"
    gpu_ops = build_report(capture(rows, [("mo.matmul", 1.0)], kernel_source="nvtx-log"))  # a GPU, op ranges
    assert kv_finding(gpu_ops).evidence["signals"] == "kernel time"
    # GPU kernels in a capture whose steps carry CPU time (read on a host without a GPU library): they trigger
    gpu_on_cpu_host = build_report(capture(rows, [(GEMM, 1.0)], on_cpu=True))
    assert kv_finding(gpu_on_cpu_host).evidence["signals"] == "kernel time"


def test_the_sequence_must_grow_by_the_minimum_context() -> None:
    """A range of exactly kv_min_context_growth tokens is judged, one less is not, wherever the sequence starts."""
    growth = TH.kv_min_context_growth
    n = 36

    def run(start: int, span: int) -> Report:
        fed = [20 + 3 * i for i in range(n)]  # the scheduler re-feeds: fires whenever the range is judged
        rows = [
            Decode(ms=2.0, context=start + round(span * i / (n - 1)) - fed[i], fed=fed[i], kernels=[(GEMV, 0.3)])
            for i in range(n)
        ]
        return build_report(capture(rows, [(GEMM, 1.0)]))

    assert "kv-cache-broken" in {f.id for f in run(500, growth).findings}
    assert "kv-cache-broken" not in {f.id for f in run(500, growth - 1).findings}


def test_step_time_not_judged_says_why_when_another_signal_fires() -> None:
    n = 64
    fed = [20 + 3 * i for i in range(n)]
    jump = [2.0 + (2.0 if i >= n // 2 else 0.0) + 0.01 * (i % 3) for i in range(n)]
    f = kv_finding(build_report(capture(refed(n, fed, ms=jump), [(GEMM, 1.0)])))
    assert str(f.evidence["step_time_not_judged"]).startswith("the step time rose in one jump")
    assert f.evidence["signals"] == "re-fed tokens"
    rising = [1.0 + 0.05 * i for i in range(n)]
    raw = capture(refed(n, fed, ms=rising), [(GEMM, 1.0)])
    busy = HostLoad(window_s=1.0, cores=2, cpu_busy_pct=100.0, own_cores=1.0, other_cores=1.0)
    contended = msgspec.structs.replace(raw, capture=msgspec.structs.replace(raw.capture, host_load=busy))
    g = kv_finding(build_report(contended))
    assert g.evidence["step_time_not_judged"] == "other processes held the host's cores during the capture"
    assert g.evidence["signals"] == "re-fed tokens"


def test_the_gradual_share_at_its_exact_value() -> None:
    """One jump halfway, each half flat to the nanosecond: each half's slope is exactly 0. With kv_gradual_share 0 that
    is not below the share (growth judged); any share above 0 calls it a jump."""
    n = 64
    ms = [2.0 + (2.0 if i >= n // 2 else 0.0) for i in range(n)]
    rows = [Decode(ms=m, context=20 + i, kernels=[(GEMV, 0.3)]) for i, m in enumerate(ms)]
    report = build_report(capture(rows, [(GEMM, 1.0)]))
    at_zero = rule_kv_cache(report, dataclasses.replace(TH, kv_gradual_share=0.0))
    assert at_zero and at_zero[0].evidence["signals"] == "step time"
    assert at_zero[0].evidence["growth_ms_per_token_first_half"] == 0.0
    assert at_zero[0].evidence["growth_ms_per_token_second_half"] == 0.0
    assert not rule_kv_cache(report, dataclasses.replace(TH, kv_gradual_share=1e-9))


def test_short_runs_under_a_lowered_minimum_use_thirds_of_one_step() -> None:
    """Four decode steps (the minimum lowered to 4): thirds of one step each, first 1 ms and last 4 ms."""
    th = dataclasses.replace(TH, kv_min_decode_steps=4, kv_min_context_growth=2)
    rows = [
        Decode(ms=m, context=20 + i, kernels=[(GEMV, k)])
        for i, (m, k) in enumerate([(1.0, 0.1), (1.5, 0.3), (3.0, 0.35), (4.0, 0.4)])
    ]
    f = rule_kv_cache(build_report(capture(rows, [(GEMM, 1.0)])), th)[0]
    assert f.evidence["first_third_median_ms"] == 1.0 and f.evidence["last_third_median_ms"] == 4.0
    assert f.evidence["growth_ratio"] == 4.0 and f.evidence["decode_kernel_ms_growth_ratio"] == 4.0


def test_mix_evidence_without_prefill_or_decode_kernels_and_of_small_or_one_sided_mixes() -> None:
    n = 36
    fed = [20 + 3 * i for i in range(n)]
    no_prefill = kv_finding(build_report(capture(refed(n, fed), [])))
    assert "decode_top_family" not in no_prefill.evidence
    no_prefill_step = kv_finding(build_report(capture(refed(n, fed), [], with_prefill=False)))
    assert "decode_top_family" not in no_prefill_step.evidence
    # prefill kernels of no length: no similarity to give (a zero vector), the decode's own figures still
    zero = kv_finding(build_report(capture(refed(n, fed), [(GEMM, 0.0)])))
    assert "decode_vs_prefill_mix_similarity" not in zero.evidence and zero.evidence["decode_top_family"] == "gemv"
    assert zero.evidence["decode_gemm_share_pct"] == 0.0
    zero_decode = [msgspec.structs.replace(d, kernels=[(GEMV, 0.0)]) for d in refed(n, fed)]
    nothing = kv_finding(build_report(capture(zero_decode, [(GEMM, 1.0)])))
    assert (
        "decode_gemm_share_pct" not in nothing.evidence and "decode_vs_prefill_mix_similarity" not in nothing.evidence
    )
    assert nothing.evidence["decode_top_family"] == "gemv"
    no_decode_kernels = [msgspec.structs.replace(d, kernels=[]) for d in refed(n, fed)]
    no_decode = kv_finding(build_report(capture(no_decode_kernels, [(GEMM, 1.0)])))
    assert "decode_top_family" not in no_decode.evidence
    # tiny kernel times (a norm under 1): the similarity and the gemm share are still given; a family only in decode
    # counts in the cosine (the union of both phases' families)
    tiny = [
        msgspec.structs.replace(d, kernels=[(GEMV, 0.0002), ("topk_topp_sampling_kernel", 0.0001)])
        for d in refed(n, fed)
    ]
    f = kv_finding(build_report(capture(tiny, [(GEMM, 0.0004), (GEMV, 0.0001)])))
    dec_gemv, dec_sampling = 0.0002 * n, 0.0001 * n
    pre = [0.0004, 0.0001, 0.0]  # gemm, gemv, sampling
    dec = [0.0, dec_gemv, dec_sampling]
    assert f.evidence["decode_vs_prefill_mix_similarity"] == round(cosine(pre, dec), 3)
    assert f.evidence["decode_gemm_share_pct"] == 0.0
    assert f.evidence["decode_top_family"] == "gemv"


def test_a_half_of_1501_steps_keeps_1500_evenly_spread() -> None:
    """One step over the bound: 1,500 of the 1,501 kept, at floor(i x 1500 / 1499) (exact: no index lies within
    rounding of an integer but the ends), and the slope is that subset's."""
    rng = random.Random(5)
    n = 2 * 1501
    x = list(range(n))
    y = [0.002 * i * i * (1 if i % 3 else 2) + rng.uniform(0, 9) for i in range(n)]
    kept = [i * 1500 // 1499 for i in range(1500)]

    def kept_slope(xs: list[int], ys: list[float]) -> float:
        return theil_sen_fast([xs[i] for i in kept], [ys[i] for i in kept])

    first, second = _half_slopes(x, y)
    assert first == pytest.approx(kept_slope(x[:1501], y[:1501]), rel=1e-12)
    assert second == pytest.approx(kept_slope(x[1501:], y[1501:]), rel=1e-12)
    assert first != pytest.approx(theil_sen(x[:1501:7], y[:1501:7]), rel=1e-6)  # not some other subset


def test_the_whole_run_slope_divides_by_the_thirds_sequence_rise() -> None:
    """Four steps (minimums lowered): the sequence rises by 1 token between the first and last thirds, the step time by
    2 ms: 2 ms per token overall, while each half is flat (a jump). The scheduler re-feeds, so the finding says so."""
    th = dataclasses.replace(TH, kv_min_decode_steps=4, kv_min_context_growth=1)
    rows = [Decode(ms=m, context=18, fed=f, kernels=[(GEMV, 0.3)]) for m, f in ((1.0, 2), (1.0, 2), (3.0, 3), (3.0, 3))]
    f = rule_kv_cache(build_report(capture(rows, [(GEMM, 1.0)])), th)[0]
    assert f.evidence["step_time_not_judged"] == (
        "the step time rose in one jump, not step by step with the sequence "
        "(robust slope per half 0.0000 / 0.0000 ms per token against 2.0000 overall)"
    )
    assert f.evidence["signals"] == "re-fed tokens"
