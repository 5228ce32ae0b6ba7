"""Host step statistics against a truth computed here by plain Python: percentiles by linear interpolation between
order statistics (numpy's default, written out), tokens per phase, TTFT through the overlap pipeline's one-step delay,
decode throughput and the growth slope from the thirds' medians; every edge of each (no decode, 7 and 8 decode steps,
a constant or falling sequence, steps of no length, steps that fed no request)."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

import pytest

from max_profile.analyze.steps import active_steps, by_batch, decode_growth, summarize_steps
from max_profile.model import Step

ORDER = ("prefill", "mixed", "decode", "unknown")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between the order statistics at rank q/100 x (n - 1); 0.0 for no values."""
    if not values:
        return 0.0
    v = sorted(values)
    rank = q / 100 * (len(v) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def make_steps(seed: int) -> list[Step]:
    """A served mix: prefill and mixed steps of several sizes, decode at batch 1-3 over a growing context, one
    unknown step, an empty drain call (batch 0) and an overlap pipeline whose first call returns no token."""
    rng = random.Random(seed)
    steps: list[Step] = []
    t = 1_000_000
    plan = (
        [("prefill", 2, 0)] * 2
        + [("mixed", 3, 0)] * 2
        + [("decode", rng.randint(1, 3), 1) for _ in range(23)]
        + [("unknown", 1, 1), ("decode", 0, 0)]
    )
    context = 40
    for i, (phase, batch, _) in enumerate(plan):
        dur = rng.randint(700_000, 3_000_000) + (40_000 * i if phase == "decode" else 0)
        fed = batch * rng.randint(5, 60) if phase in ("prefill", "mixed") else batch
        steps.append(
            Step(
                index=i,
                phase=phase,  # type: ignore[arg-type]
                batch_size=batch,
                input_tokens=fed,
                context_tokens=context,
                start_ns=t,
                end_ns=t + dur,
                output_tokens=0 if i == 0 else batch,  # the first call returns its token from the next one
            )
        )
        context += 3
        t += dur + rng.randint(1_000, 90_000)
    return steps


def growth_truth(decode: Sequence[Step]) -> float | None:
    """The slope by hand: the most common batch size's steps, ordered by sequence length, first vs last third's
    medians, at least 8 steps and 16 tokens between the thirds."""
    sizes = [s.batch_size for s in decode]
    common = max(set(sizes), key=sizes.count) if sizes else 0
    pts = sorted(
        ((s.context_tokens + s.input_tokens, (s.end_ns - s.start_ns) / 1e6) for s in decode if s.batch_size == common),
        key=lambda p: p[0],
    )
    if len(pts) < 8:
        return None
    x, y = [p[0] for p in pts], [p[1] for p in pts]
    k = max(len(x) // 3, 1)
    dx = statistics.median(x[-k:]) - statistics.median(x[:k])
    if dx < 16:
        return None
    return (statistics.median(y[-k:]) - statistics.median(y[:k])) / dx * 100.0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_summary_field_by_field(seed: int) -> None:
    steps = make_steps(seed)
    summary = summarize_steps(steps)
    work = [s for s in steps if s.batch_size > 0]
    assert active_steps(steps) == work and summary.steps == len(work) == len(steps) - 1
    assert [p.phase for p in summary.phases] == ["prefill", "mixed", "decode", "unknown"]
    for p in summary.phases:
        sel = [s for s in work if s.phase == p.phase]
        ms = [(s.end_ns - s.start_ns) / 1e6 for s in sel]
        tokens = sum(s.input_tokens if p.phase in ("prefill", "mixed") else s.batch_size for s in sel)
        assert (p.steps, p.tokens) == (len(sel), tokens)
        assert p.total_ms == pytest.approx(sum(ms), rel=1e-12)
        assert p.p50_ms == pytest.approx(percentile(ms, 50), rel=1e-12)
        assert p.p90_ms == pytest.approx(percentile(ms, 90), rel=1e-12)
        assert p.max_ms == max(ms)
    # TTFT: from the first step's start to the end of the first call that returned a token (the second)
    assert summary.ttft_ms == pytest.approx((steps[1].end_ns - steps[0].start_ns) / 1e6, rel=1e-12)
    decode = [s for s in work if s.phase == "decode"]
    tps = sum(s.batch_size for s in decode) / (sum(s.end_ns - s.start_ns for s in decode) / 1e9)
    assert summary.decode_tokens_per_s == pytest.approx(tps, rel=1e-12)
    assert summary.decode_step_growth_ms_per_100_ctx == pytest.approx(growth_truth(decode), rel=1e-12)
    assert summary.source == "host steps"
    assert summary.by_batch == by_batch(work)


@pytest.mark.parametrize("seed", [1, 2])
def test_by_batch_field_by_field(seed: int) -> None:
    steps = active_steps(make_steps(seed))
    rows = by_batch(steps)
    keys = sorted({(s.phase, s.batch_size) for s in steps}, key=lambda k: (ORDER.index(k[0]), k[1]))
    assert [(r.phase, r.batch_size) for r in rows] == keys
    for r in rows:
        sel = [s for s in steps if (s.phase, s.batch_size) == (r.phase, r.batch_size)]
        ms = [(s.end_ns - s.start_ns) / 1e6 for s in sel]
        tokens = statistics.fmean(s.batch_size if r.phase == "decode" else s.input_tokens for s in sel)
        assert r.steps == len(sel)
        assert r.p50_ms == pytest.approx(percentile(ms, 50), rel=1e-12)
        assert r.p90_ms == pytest.approx(percentile(ms, 90), rel=1e-12)
        assert r.tokens_per_step == round(tokens, 2)


def test_by_batch_rounds_tokens_to_two_decimals() -> None:
    steps = [
        Step(
            index=i, phase="prefill", batch_size=3, input_tokens=n, context_tokens=0, start_ns=i * 10, end_ns=i * 10 + 5
        )
        for i, n in enumerate((10, 11, 11))
    ]
    (row,) = by_batch(steps)
    assert row.tokens_per_step == 10.67 and (row.p50_ms, row.p90_ms) == (5e-6, 5e-6)


def decode_run(n: int, context: Sequence[int] | None = None, ms: Sequence[float] | None = None) -> list[Step]:
    out, t = [], 0
    for i in range(n):
        dur = round((ms[i] if ms else 1.0 + 0.01 * i) * 1e6)
        out.append(
            Step(
                index=i,
                phase="decode",
                batch_size=1,
                input_tokens=1,
                context_tokens=context[i] if context else 10 + i,
                start_ns=t,
                end_ns=t + dur,
                output_tokens=1,
            )
        )
        t += dur
    return out


def test_decode_growth_edges() -> None:
    assert decode_growth(decode_run(7, context=[10 * i for i in range(7)])) is None  # under 8 steps: no slope
    eight = decode_run(8, context=[10 * i for i in range(8)])
    assert decode_growth(eight) == pytest.approx(growth_truth(eight), rel=1e-12)
    assert decode_growth(decode_run(9, context=[50] * 9)) is None  # one context length: no slope
    # a context falling with time is still a context: the steps are read by their length, not their order
    falling = decode_run(9, context=[90 - 10 * i for i in range(9)], ms=[3.0 - 0.1 * i for i in range(9)])
    assert decode_growth(falling) == pytest.approx(1.0, rel=1e-9)  # 0.1 ms per 10 tokens: 1 ms per 100
    # a context that only the middle step moves: the thirds' medians equal, no span
    flat_ends = decode_run(9, context=[10, 10, 10, 10, 99, 10, 10, 10, 10])
    assert decode_growth(flat_ends) is None
    rising = decode_run(30, ms=[2.0 + 0.1 * i for i in range(30)])
    assert decode_growth(rising) == pytest.approx(10.0, rel=1e-9)  # 0.1 ms per token: 10 ms per 100


def test_a_span_of_a_few_tokens_gives_no_slope() -> None:
    """A server's requests at similar lengths: the time noise over a span of 1 token read as 200 ms per 100 tokens."""
    one_token = decode_run(
        9, context=[10, 10, 10, 10, 10, 11, 11, 11, 11], ms=[1.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0]
    )
    assert decode_growth(one_token) is None
    just_enough = decode_run(9, context=[10, 10, 10, 18, 18, 18, 26, 26, 26], ms=[1.0] * 3 + [1.5] * 3 + [2.0] * 3)
    assert decode_growth(just_enough) == pytest.approx(100 * 1.0 / 16)


def test_growth_reads_one_batch_size_and_the_untraced_steps() -> None:
    """Steps of another batch size are longer at any context, and traced steps slower whatever their context: neither
    enters the slope."""
    flat = decode_run(24, context=[10 + 4 * i for i in range(24)], ms=[2.0] * 24)
    bigger = [
        msgspec_replace(s, batch_size=4, start_ns=s.start_ns + 10**9, end_ns=s.end_ns + 10**9 + 10**6)
        for s in flat[-6:]
    ]
    assert decode_growth(flat + bigger) == pytest.approx(0.0)
    # the first 8 steps traced (a sampled recording's first slice) and 1 ms slower
    traced_span = (flat[0].start_ns, flat[7].end_ns)
    slow_first = [msgspec_replace(s, end_ns=s.end_ns + 10**6) if i < 8 else s for i, s in enumerate(flat)]
    assert decode_growth(slow_first) < 0  # read together: a falling slope that is the tracer's
    assert decode_growth(slow_first, traced=[traced_span]) == pytest.approx(0.0)
    # fewer than 8 steps untraced: the slope is fitted on every step (traced too), never on the few untraced ones
    rising = decode_run(24, context=[10 + 4 * i for i in range(24)], ms=[2.0 + 0.1 * i for i in range(24)])
    few_untraced = (rising[0].start_ns, rising[-6].end_ns)  # 19 traced, 5 not
    assert decode_growth(rising, traced=[few_untraced]) == pytest.approx(growth_truth(rising), rel=1e-12)


def test_a_server_s_steps_have_no_ttft_and_a_decode_of_no_length_no_throughput() -> None:
    steps = make_steps(4)
    assert summarize_steps(steps, source="model worker steps").ttft_ms is None
    assert summarize_steps(steps, source="model worker steps").source == "model worker steps"
    zero = [
        Step(index=0, phase="prefill", batch_size=1, input_tokens=9, context_tokens=0, start_ns=0, end_ns=500),
        Step(index=1, phase="decode", batch_size=1, input_tokens=1, context_tokens=9, start_ns=600, end_ns=600),
    ]
    s = summarize_steps(zero)
    assert s.decode_tokens_per_s is None
    # no call returned a token: TTFT ends with the first prefill step
    assert s.ttft_ms == pytest.approx(500 / 1e6)
    decode_only = summarize_steps(decode_run(3))
    assert decode_only.ttft_ms is None and [p.phase for p in decode_only.phases] == ["decode"]
    with pytest.raises(ValueError, match="no pipeline step ran"):
        summarize_steps([msgspec_replace(zero[0], batch_size=0)])


def msgspec_replace(step: Step, **kw: object) -> Step:
    import msgspec

    return msgspec.structs.replace(step, **kw)


PREFILL = Step(index=0, phase="prefill", batch_size=1, input_tokens=9, context_tokens=0, start_ns=0, end_ns=500)
"""A prefill of 9 tokens that returned no token (output_tokens 0: the overlap pipeline's first call)."""


def test_decode_tokens_are_the_batch_not_the_tokens_fed_and_a_rise_of_one_token_counts() -> None:
    steps = decode_run(9)
    drafts = [msgspec_replace(s, input_tokens=4) for s in steps]  # a draft of 3 tokens fed with each request
    s = summarize_steps(drafts)
    assert s.phases[0].tokens == 9 and by_batch(drafts)[0].tokens_per_step == 1.0
    prefill_only = summarize_steps([PREFILL])
    assert prefill_only.decode_tokens_per_s is None and prefill_only.decode_step_growth_ms_per_100_ctx is None


def test_ttft_ends_with_the_first_call_that_returned_a_token() -> None:
    decode = msgspec_replace(
        PREFILL, index=1, phase="decode", input_tokens=1, context_tokens=9, start_ns=600, end_ns=900, output_tokens=1
    )
    assert summarize_steps([PREFILL, decode]).ttft_ms == pytest.approx(900 / 1e6)
