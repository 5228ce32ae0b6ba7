"""The KV-cache rule: decode work growing with the sequence at every step (a missing or unused KV cache, O(n²)
re-prefill)."""

from __future__ import annotations

import numpy as np

from max_profile.analyze.account import paired_steps, whole_steps
from max_profile.analyze.rules.base import fam_ms, gpu_kernels, host_contended, kern, phase_of, step_summary
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Finding, Report, Step


def _model_refeeds(
    steps: list[Step], seq: np.ndarray, third: int, th: Thresholds, evidence: dict[str, float | int | str | None]
) -> bool:
    """Whether the model's own input grows with the sequence while the scheduler feeds one token per request (an
    architecture re-encoding behind the scheduler's back); its figures go into ``evidence``."""
    model_fed = [st.model_input_tokens / st.batch_size for st in steps if st.model_input_tokens is not None]
    if len(model_fed) != len(steps):
        return False
    mf = np.array(model_fed)
    mf_first, mf_last = float(np.median(mf[:third])), float(np.median(mf[-third:]))
    evidence["model_input_tokens_per_request_first"] = round(mf_first, 1)
    evidence["model_input_tokens_per_request_last"] = round(mf_last, 1)
    return (
        bool((mf >= 2).mean() >= th.kv_refeed_steps_share)
        and mf_last >= mf_first + th.kv_min_context_growth / 2
        and _corr(seq, mf) >= th.kv_model_refeed_corr
    )


def _grows_step_by_step(
    seq: np.ndarray,
    ms: np.ndarray,
    first: float,
    last: float,
    third: int,
    th: Thresholds,
    evidence: dict[str, float | int | str | None],
) -> bool:
    """Whether a step time that grew did so step by step with the sequence (not in one jump: another process taking
    cores partway, a clock change)."""
    halves = _half_slopes(seq, ms)
    whole = (last - first) / max(float(np.median(seq[-third:])) - float(np.median(seq[:third])), 1.0)
    evidence["growth_ms_per_token_first_half"] = round(halves[0], 5)
    evidence["growth_ms_per_token_second_half"] = round(halves[1], 5)
    if min(halves) < th.kv_gradual_share * whole:
        evidence["step_time_not_judged"] = (
            "the step time rose in one jump, not step by step with the sequence "
            f"(robust slope per half {halves[0]:.4f} / {halves[1]:.4f} ms per token against {whole:.4f} overall)"
        )
        return False
    return True


def _kv_verdict(
    time_grows: bool,
    kernels_grow: bool,
    refeeds: bool,
    model_refeeds: bool,
    kernels_timed: bool,
    evidence: dict[str, float | int | str | None],
) -> tuple[str, float]:
    """(title, confidence) from which signals fired (token counts are surer than times); the signals go into
    ``evidence``."""
    signals = [
        name
        for name, on in (
            ("step time", time_grows),
            ("kernel time", kernels_grow),
            ("re-fed tokens", refeeds),
            ("model re-encodes the sequence", model_refeeds),
        )
        if on
    ]
    evidence["signals"] = ", ".join(signals)
    confidence = 0.95 if refeeds or model_refeeds else 0.85 if kernels_grow or kernels_timed else 0.7
    title = "Decode work grows with the sequence at every step: the KV cache is missing or not used (O(n²) re-prefill)"
    if model_refeeds and not refeeds:
        title = (
            "The model re-encodes the whole sequence at every decode step while the scheduler feeds one token: "
            "the KV cache is not used (O(n²) re-prefill)"
        )
    return title, confidence


def rule_kv_cache(report: Report, th: Thresholds) -> list[Finding]:
    """Decode work growing ~linearly with the sequence: the KV cache is missing or not used.

    Signals, any of which fires:

    * step time grows with the sequence length (and correlates with it);
    * kernel time per decode step grows the same way (what the GPU computes, not the host);
    * the scheduler feeds the whole sequence again (input tokens per request > 1 and growing;
      speculative decoding feeds a constant 1 + draft tokens);
    * the model computes more tokens than the scheduler fed: tokens in the model's own input
      tensor per request grow with the sequence while the scheduler feeds 1 (an architecture that
      re-encodes behind the scheduler's back).

    A prefill-like kernel mix in decode is reported as evidence.
    """
    steps = sorted(
        (s for s in report.steps if s.phase == "decode" and s.batch_size > 0 and s.sequence_tokens is not None),
        key=lambda s: s.start_ns,
    )
    s = step_summary(report)
    if len(steps) < th.kv_min_decode_steps or not s:
        return []
    seq = np.array([st.sequence_tokens for st in steps], dtype=float)
    # on a CPU device the step's own CPU time, not its wall time: another process taking cores mid-run slows the later
    # steps' wall time (a trend with the sequence) but not the work they do; on a GPU the step's wall time is the
    # measure
    on_cpu = report.environment.vendor == "none" and all(st.cpu_ns is not None for st in steps)
    ms = np.array([(st.cpu_ns if on_cpu else st.duration_ns) / 1e6 for st in steps])  # type: ignore[operator]
    fed = np.array([st.input_tokens / st.batch_size for st in steps])
    if seq.max() - seq.min() < th.kv_min_context_growth:
        return []
    third = max(len(ms) // 3, 1)
    first, last = float(np.median(ms[:third])), float(np.median(ms[-third:]))
    ratio = last / first if first > 0 else 0.0
    corr = _corr(seq, ms)
    fed_first, fed_last = float(np.median(fed[:third])), float(np.median(fed[-third:]))
    evidence: dict[str, float | int | str | None] = {
        "decode_steps": len(steps),
        "step_time": "process CPU time per step (load-independent)" if on_cpu else "wall time per step",
        "sequence_from": int(seq.min()),
        "sequence_to": int(seq.max()),
        "first_third_median_ms": round(first, 3),
        "last_third_median_ms": round(last, 3),
        "growth_ratio": round(ratio, 2),
        "time_vs_sequence_correlation": round(corr, 3),
        "growth_ms_per_100_tokens": round(s.decode_step_growth_ms_per_100_ctx or 0.0, 4),
        "decode_input_tokens_per_request_first": round(fed_first, 1),
        "decode_input_tokens_per_request_last": round(fed_last, 1),
    }
    kernel_growth, kernel_corr = _per_step_kernel_growth(report, th.kv_min_decode_steps)
    if kernel_growth is not None:
        evidence["decode_kernel_ms_growth_ratio"] = round(kernel_growth, 2)
        evidence["kernel_time_vs_sequence_correlation"] = round(kernel_corr, 3)
    model_refeeds = _model_refeeds(steps, seq, third, th, evidence)
    evidence.update(_decode_vs_prefill_mix(report))
    time_grows = ratio >= th.kv_growth_ratio and corr >= th.kv_trend_corr
    if time_grows:
        time_grows = _grows_step_by_step(seq, ms, first, last, third, th, evidence)
    # MAX's op ranges on a CPU are host wall time (load-dependent): evidence there, a trigger only for GPU kernels
    kernels_grow = (
        kernel_growth is not None
        and kernel_growth >= th.kv_growth_ratio
        and kernel_corr >= th.kv_trend_corr
        and not (on_cpu and not _gpu_kernels_of(report))
    )
    refeeds = (
        bool((fed >= 2).mean() >= th.kv_refeed_steps_share) and fed_last >= fed_first + th.kv_min_context_growth / 2
    )
    if time_grows and host_contended(report, th):
        # other processes held the cores: a step time rising through the run says more about them than about the cache
        # (host-contention says so); token counts and GPU kernel times still judge
        time_grows = False
        evidence["step_time_not_judged"] = "other processes held the host's cores during the capture"
    if not (time_grows or kernels_grow or refeeds or model_refeeds):
        return []
    title, confidence = _kv_verdict(
        time_grows, kernels_grow, refeeds, model_refeeds, kernel_growth is not None, evidence
    )
    return [
        Finding(
            id="kv-cache-broken",
            severity="error",
            title=title,
            evidence=evidence,
            confidence=confidence,
            next_step="A correctness bug, not only slowness: check the architecture writes K/V into MAX's KV cache and "
            "attends over it in decode (paged attention), instead of re-encoding the whole sequence.",
        )
    ]


def _half_slopes(seq: object, ms: object) -> tuple[float, float]:
    """Theil-Sen slope (ms per token) of step time against the sequence in each half of the decode: the median of the
    pairwise slopes, which one jump in level (a step function) leaves near 0 where steady growth keeps it."""
    import numpy as np
    from scipy.stats import theilslopes

    x, y = np.asarray(seq, dtype=float), np.asarray(ms, dtype=float)
    mid = x.size // 2
    out = []
    for a, b in ((x[:mid], y[:mid]), (x[mid:], y[mid:])):
        if a.size > 1500:  # every pair of 1,500 steps is ~1.1 M slopes: enough, and bounded
            pick = np.linspace(0, a.size - 1, 1500).astype(int)
            a, b = a[pick], b[pick]
        out.append(float(theilslopes(b, a)[0]) if a.size >= 2 and np.ptp(a) > 0 else 0.0)
    return out[0], out[1]


def _gpu_kernels_of(report: Report) -> bool:
    k = kern(report)
    return bool(k and gpu_kernels(k))


def _corr(x: object, y: object) -> float:
    """How steadily y rises with x: Spearman's rank correlation of x and y after a running median of 5 over y.

    x and y are per-step series in time order. Steps the OS delayed (a busy 2-core VM, a noisy
    neighbour) wreck Pearson's r (four 40 ms stalls in 64 doubling decode steps: r = -0.18); the
    running median drops isolated stalls and ranks ignore how large the rest are, so one noisy step
    neither makes nor breaks a verdict. 0.0 when either series is constant.
    """
    import numpy as np
    from scipy.stats import rankdata  # ties share their mean rank

    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.size >= 5:
        b = np.median(np.lib.stride_tricks.sliding_window_view(np.pad(b, 2, mode="edge"), 5), axis=1)
    if a.size < 2:
        return 0.0
    ra, rb = rankdata(a), rankdata(b)
    if ra.std() == 0 or rb.std() == 0:  # ranks of equal values are exactly equal (a float std of them need not be 0)
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def _decode_vs_prefill_mix(report: Report) -> dict[str, float | int | str | None]:
    """How much decode's kernel mix looks like prefill's (cosine similarity of family time shares).

    Healthy decode on a GPU is matrix-vector work (gemv) while prefill is matrix-matrix (gemm);
    a decode that re-encodes the sequence runs the prefill mix again. On a CPU both phases run
    the same ops, so this is evidence, not a trigger.
    """
    k = kern(report)
    if not k:
        return {}
    pre, dec = phase_of(k, "prefill"), phase_of(k, "decode")
    if not pre or not dec or not pre.families or not dec.families:
        return {}
    import numpy as np

    fams = sorted({r.family for r in pre.families} | {r.family for r in dec.families})
    a = np.array([fam_ms(pre.families, f) for f in fams])
    b = np.array([fam_ms(dec.families, f) for f in fams])
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    out: dict[str, float | int | str | None] = {"decode_top_family": dec.families[0].family}
    if norm > 0:
        out["decode_vs_prefill_mix_similarity"] = round(float(a @ b) / norm, 3)
    total = float(b.sum())
    if total > 0:
        out["decode_gemm_share_pct"] = round(100.0 * fam_ms(dec.families, "gemm") / total, 1)
    return out


def _per_step_kernel_growth(report: Report, min_steps: int) -> tuple[float | None, float]:
    """Decode kernel time per step: last-third / first-third median over the decode steps recorded whole, and its
    correlation with their sequence lengths (steps paired by index: :func:`~max_profile.analyze.account.paired_steps`).
    """
    k = kern(report)
    if not k:
        return None, 0.0
    per = [p.kernel_ms for p in whole_steps(k, "decode")]
    if len(per) < min_steps:
        return None, 0.0
    import numpy as np

    third = max(len(per) // 3, 1)
    a, b = float(np.median(per[:third])), float(np.median(per[-third:]))
    pairs = paired_steps(report, "decode")
    corr = _corr([st.sequence_tokens for st, _ in pairs], [r.kernel_ms for _, r in pairs]) if pairs else 0.0
    return (b / a if a > 0 else None), corr
