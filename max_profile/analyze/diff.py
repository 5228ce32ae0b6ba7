"""Compare two profiling runs: comparability first, then per-token, per-family and per-kernel deltas, each tested for
noise.

Step-time distributions (host decode time per token, per-step kernel time by family, serve inter-token
latency) are compared with the two-sided Mann-Whitney U test (``scipy.stats.mannwhitneyu``): a
difference counts only when p < ``alpha`` and both runs have at least ``MIN_SAMPLES`` steps, so one
noisy step never makes a verdict. Totals without a distribution (top kernels, GPU busy) are
reported as deltas without a test. A run regresses when a significant, slower-is-worse metric got
slower by more than ``fail_above_pct``.

Two start-up profiles (cold vs warm, before / after a MAX upgrade) compare phase by phase with the compile cache's
state and what changed in the compile key; two load sweeps compare level by level (output tok/s, TTFT, ITL). Both
are single observations per run: deltas, not tests.

Equivalent by hand: two ``max-profile run --raw`` captures, then comparing their step tables.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from max_profile.analyze.account import ms_per_step_of, whole_steps
from max_profile.model import (
    KernelBreakdown,
    KernelRow,
    LoadLevel,
    PhaseBreakdown,
    RawCapture,
    Report,
    StartupProfile,
    UtilizationSection,
)
from max_profile.model.tags import TargetKind, host_ops

MIN_SAMPLES = 8
ALPHA = 0.01
CLOCK_TOLERANCE_PCT = 5.0
"""Mean SM clocks further apart than this make two runs not comparable (a throttled or clock-locked GPU)."""
SHAPE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "torch_dtype",
    "architectures",
)


class DiffLine(msgspec.Struct, frozen=True):
    metric: str
    unit: str
    a: float
    b: float
    delta: float
    delta_pct: float | None
    p_value: float | None
    """Mann-Whitney U, two-sided; None when the metric has no per-step distribution (or too few steps)."""
    significant: bool
    regression: bool
    samples: tuple[int, int] = (0, 0)
    basis: str = "host"
    """What the figure rests on: ``device`` (GPU kernel time: the same whatever else the host runs) or ``host`` (host
    clock: steps, MAX's op ranges on a CPU, client latencies, and the process's CPU time, whose worker threads spin
    less when other processes hold the cores), which another process on the cores changes."""
    judged: bool = True
    """False when the host timing of either run was flagged unreliable (other load): shown, never a verdict."""


class DiffResult(msgspec.Struct):
    a: str
    b: str
    comparable: bool
    reasons: list[str]
    lines: list[DiffLine]
    verdicts: list[str]
    regression: bool
    fail_above_pct: float
    forced: bool = False
    alpha: float = ALPHA
    host_timing_unreliable: list[str] = []
    """Why host timing is not judged (a run's own host-contention finding), empty when both runs' host timing holds."""
    outcome: str = "no regression"
    """``regression``, ``no regression`` or ``inconclusive``: a figure judged got worse past the threshold; every
    figure that could show one was judged and none did; or something could not be judged (:attr:`inconclusive`)."""
    inconclusive: list[str] = []
    """What could not be judged and what would make it judgeable (empty unless the outcome is inconclusive)."""

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)


def comparability(a: Report, b: Report) -> list[str]:
    """Why two runs should not be compared (model shape, dtype, GPU, MAX version, clocks, throttling, graphs,
    tracer)."""
    reasons = []
    ca, cb = a.capture.model_config or {}, b.capture.model_config or {}
    for key in SHAPE_KEYS:
        if key in ca and key in cb and ca[key] != cb[key]:
            reasons.append(f"model {key}: {ca[key]} vs {cb[key]}")
    ga = sorted(g.name or g.key for g in a.environment.gpus)
    gb = sorted(g.name or g.key for g in b.environment.gpus)
    if ga != gb:
        reasons.append(f"GPUs: {', '.join(ga) or 'none'} vs {', '.join(gb) or 'none'}")
    # a MAX upgrade is what a start-up diff is for
    startups = TargetKind.of(a.capture.target) is TargetKind.of(b.capture.target) is TargetKind.STARTUP
    if (
        not startups
        and a.environment.max_version
        and b.environment.max_version
        and a.environment.max_version != b.environment.max_version
    ):
        reasons.append(f"MAX version: {a.environment.max_version} vs {b.environment.max_version}")
    if (a.capture.devices or "") != (b.capture.devices or ""):
        reasons.append(f"devices: {a.capture.devices} vs {b.capture.devices}")
    if bool(a.capture.device_graph_capture) != bool(b.capture.device_graph_capture):
        reasons.append(f"device graph capture: {a.capture.device_graph_capture} vs {b.capture.device_graph_capture}")
    ka, kb = a.kernels, b.kernels
    sa = ka.source.split(" ")[0] if isinstance(ka, KernelBreakdown) else "none"
    sb = kb.source.split(" ")[0] if isinstance(kb, KernelBreakdown) else "none"
    if sa != sb:
        reasons.append(f"kernel tracer: {sa} vs {sb} (a tracer changes the timing it measures)")
    ua, ub = _clock(a), _clock(b)
    if ua and ub and abs(ua - ub) / max(ua, ub) * 100 > CLOCK_TOLERANCE_PCT:
        reasons.append(f"mean SM clock: {ua:.0f} vs {ub:.0f} MHz")
    for label, r in (("A", a), ("B", b)):
        throttled = [f for f in r.findings if f.id == "throttled" and f.severity == "warning"]
        if throttled:
            reasons.append(f"{label} was clock-throttled ({throttled[0].evidence.get('reasons')})")
    if a.serve is None and b.serve is not None or a.serve is not None and b.serve is None:
        reasons.append("one run is a max serve capture, the other is not")
    return reasons


def _clock(r: Report) -> float | None:
    u = r.utilization
    if not isinstance(u, UtilizationSection):
        return None
    clocks = [g.mean_sm_clock_mhz for g in u.gpus if g.mean_sm_clock_mhz]
    return float(np.mean(clocks)) if clocks else None


def _test(a: Sequence[float], b: Sequence[float], alpha: float) -> tuple[float | None, bool]:
    if len(a) < MIN_SAMPLES or len(b) < MIN_SAMPLES:
        return None, False
    if np.allclose(np.median(a), np.median(b)) and np.std(a) == 0 and np.std(b) == 0:
        return 1.0, False
    from scipy.stats import mannwhitneyu

    p = float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
    return p, p < alpha


def _line(
    metric: str,
    unit: str,
    a_vals: Sequence[float],
    b_vals: Sequence[float],
    fail_above_pct: float,
    alpha: float,
    higher_is_worse: bool = True,
    tested: bool = True,
) -> DiffLine:
    a_med, b_med = float(np.median(a_vals)), float(np.median(b_vals))
    delta = b_med - a_med
    pct = 100.0 * delta / a_med if a_med else None
    p, significant = _test(a_vals, b_vals, alpha) if tested else (None, False)
    worse = delta > 0 if higher_is_worse else delta < 0
    regression = bool(significant and worse and pct is not None and abs(pct) > fail_above_pct)
    return DiffLine(
        metric=metric,
        unit=unit,
        a=a_med,
        b=b_med,
        delta=delta,
        delta_pct=pct,
        p_value=p,
        significant=significant,
        regression=regression,
        samples=(len(a_vals), len(b_vals)),
    )


def _decode_ms_per_token(r: Report) -> list[float]:
    return [s.duration_ns / 1e6 / s.batch_size for s in r.steps if s.phase == "decode" and s.batch_size > 0]


def _decode_cpu_ms_per_token(r: Report) -> list[float]:
    """The profiled process's CPU time per decode token (all its threads, ``Step.cpu_ns``), where every decode step
    has it: on a CPU device the step's own work, which another process taking cores slows less than its wall time."""
    decode = [s for s in r.steps if s.phase == "decode" and s.batch_size > 0]
    if not decode or any(s.cpu_ns is None for s in decode):
        return []
    return [(s.cpu_ns or 0) / 1e6 / s.batch_size for s in decode]


def _family_per_step(r: Report, phase: str) -> dict[str, list[float]]:
    """Per family, its kernel time in each of the phase's steps recorded whole (a sampled capture's other steps were
    not recorded: counting them as 0 would halve a median)."""
    k = r.kernels
    if not isinstance(k, KernelBreakdown):
        return {}
    rows = whole_steps(k, phase)
    fams = dict.fromkeys(f for p in rows for f in p.families)  # in the order they come (a set's order varies by run)
    return {f: [p.families.get(f, 0.0) for p in rows] for f in fams}


def _step_kernel_ms(r: Report, phase: str) -> list[float]:
    """The kernel time of each of the phase's steps recorded whole."""
    k = r.kernels
    if not isinstance(k, KernelBreakdown):
        return []
    return [sum(p.families.values()) for p in whole_steps(k, phase)]


GATE_OTHER_LOAD = 0.25
"""Other processes holding at least this share of the host's cores during a capture: a gate does not judge its host
timing (the report's own host-contention verdict needs more; a gate that fails a build must not rest on less)."""


GATE_MIN_LOAD_WINDOW_S = 0.5
"""A host-load record shorter than this cannot vouch for a quiet machine: over 0.1-0.3 s two busy loops on two cores
read anywhere from 0.4 to 1.2 cores (the scheduler favours the profiled process for a moment), over 1 s 0.65-1.3."""


def host_timing_problem(label: str, r: Report) -> str | None:
    """Why run ``label``'s host timing cannot be judged: its own host-contention finding (other processes held the
    cores), other processes holding :data:`GATE_OTHER_LOAD` of the cores or more, or a host-load record too short to
    say (:data:`GATE_MIN_LOAD_WINDOW_S`); else None (a capture without a host-load record is judged)."""
    f = next((f for f in r.findings if f.id == "host-contention"), None)
    if f is not None:
        return f"{label}: {f.title}"
    load = r.capture.host_load
    if load is None:
        return None
    if load.cores and load.other_cores >= GATE_OTHER_LOAD * load.cores:
        return (
            f"{label}: other processes used {load.other_cores:.2f} of {load.cores} CPU cores during the capture "
            f"(a gate judges host timing under {100 * GATE_OTHER_LOAD:.0f} % of them)"
        )
    if load.window_s < GATE_MIN_LOAD_WINDOW_S:
        return (
            f"{label}: its host-load record covers {load.window_s:.2f} s, too short to vouch for a quiet machine "
            f"(generate for {GATE_MIN_LOAD_WINDOW_S:g} s or more)"
        )
    return None


def _kernel_basis(k: KernelBreakdown) -> str:
    """``device`` for GPU kernels, ``host`` for MAX's op ranges on a CPU (host time)."""
    return "host" if host_ops(k.source) else "device"


def diff_reports(
    a: Report,
    b: Report,
    *,
    a_label: str = "A",
    b_label: str = "B",
    fail_above_pct: float = 5.0,
    alpha: float = ALPHA,
    force: bool = False,
    a_raw: RawCapture | None = None,
    b_raw: RawCapture | None = None,
) -> DiffResult:
    """The comparison of run B against baseline A (see the module docstring)."""
    reasons = comparability(a, b)
    result = DiffResult(
        a=a_label,
        b=b_label,
        comparable=not reasons,
        reasons=reasons,
        lines=[],
        verdicts=[],
        regression=False,
        fail_above_pct=fail_above_pct,
        forced=force and bool(reasons),
        alpha=alpha,
    )
    if reasons and not force:
        result.outcome, result.inconclusive = "inconclusive", ["not comparable: " + "; ".join(reasons)]
        return result
    lines: list[DiffLine] = []
    ka, kb = a.kernels, b.kernels
    if isinstance(ka, KernelBreakdown) and isinstance(kb, KernelBreakdown):
        lines += _kernel_lines(ka, kb, a, b, fail_above_pct, alpha)
    da, db = _decode_ms_per_token(a), _decode_ms_per_token(b)
    if da and db:
        lines.append(_line("decode per token (host step time)", "ms/token", da, db, fail_above_pct, alpha))
    ca, cb = _decode_cpu_ms_per_token(a), _decode_cpu_ms_per_token(b)
    if ca and cb and a.environment.vendor == b.environment.vendor == "none":
        lines.append(_line("decode per token (process CPU time)", "ms/token", ca, cb, fail_above_pct, alpha))
    if a.serve is not None and b.serve is not None:
        itl_a = [g for r in (a_raw.requests if a_raw else []) if r.ok for g in r.itl_ms]
        itl_b = [g for r in (b_raw.requests if b_raw else []) if r.ok for g in r.itl_ms]
        if itl_a and itl_b:
            lines.append(_line("serve inter-token latency", "ms", itl_a, itl_b, fail_above_pct, alpha))
        elif a.serve.itl_ms_p50 and b.serve.itl_ms_p50:
            lines.append(
                _line(
                    "serve inter-token latency p50",
                    "ms",
                    [a.serve.itl_ms_p50],
                    [b.serve.itl_ms_p50],
                    fail_above_pct,
                    alpha,
                    tested=False,
                )
            )
        if a.serve.ttft_ms_p50 and b.serve.ttft_ms_p50:
            lines.append(
                _line(
                    "serve time to first token p50",
                    "ms",
                    [a.serve.ttft_ms_p50],
                    [b.serve.ttft_ms_p50],
                    fail_above_pct,
                    alpha,
                    tested=False,
                )
            )
    if a.load_levels and b.load_levels:
        lines += _sweep_lines(a.load_levels, b.load_levels, fail_above_pct, alpha)
    said: list[str] = []
    if a.startup is not None and b.startup is not None:
        lines += _startup_lines(a.startup, b.startup, fail_above_pct, alpha)
        said = startup_verdicts(a.startup, b.startup, a.environment.max_version, b.environment.max_version)
    unreliable = [w for w in (host_timing_problem(a_label, a), host_timing_problem(b_label, b)) if w]
    if unreliable:  # host timing is shown, never judged: the neighbours set it, not the change
        lines = [
            msgspec.structs.replace(line, significant=False, regression=False, judged=False)
            if line.basis == "host"
            else line
            for line in lines
        ]
        said.append(
            "host timing not judged (shown only): "
            + "; ".join(unreliable)
            + (
                ""
                if any(line.basis == "device" for line in lines)
                else "; no load-independent figure (GPU kernel time) to judge instead: re-run both on a quiet machine"
            )
        )
    result.lines = lines
    result.host_timing_unreliable = unreliable
    result.regression = any(line.regression for line in lines)
    result.outcome, result.inconclusive = outcome_of(lines, unreliable, fail_above_pct)
    changes = _verdicts(lines, fail_above_pct, alpha)
    result.verdicts = said + changes + ([outcome_line(result)] if result.outcome != "regression" else [])
    return result


def _worse_past(line: DiffLine, fail_above_pct: float) -> bool:
    """Whether a figure moved the worse way by more than the threshold (tested or not)."""
    if line.delta_pct is None:
        return False
    worse = line.delta_pct > 0 if not line.unit.endswith("tok/s") else line.delta_pct < 0
    return worse and abs(line.delta_pct) > fail_above_pct


def outcome_of(lines: Sequence[DiffLine], unreliable: Sequence[str], fail_above_pct: float) -> tuple[str, list[str]]:
    """Regression, no regression or inconclusive (with what could not be judged and what would judge it): a regression
    needs a judged, tested figure worse past the threshold; "no regression" needs tested figures judged and none
    worse, no host-timed figure the load kept from being judged moved past the threshold either way, and no figure
    that could not be tested (one sample each, too few steps) worse past it."""
    if any(line.regression for line in lines):
        return "regression", []
    why: list[str] = []
    judged = [line for line in lines if line.judged and line.p_value is not None]
    loaded: list[str] = []
    for line in lines:
        if line.judged and line.p_value is not None:
            continue
        # a figure the load moved is no evidence either way (a loaded baseline makes a slower run look faster): past
        # the threshold in either direction it leaves the comparison open; an untested one only when it got worse
        moved = line.delta_pct is not None and abs(line.delta_pct) > fail_above_pct
        if not line.judged and line.p_value is not None:
            if moved:
                loaded.append(f"{line.metric} {line.delta_pct:+.1f} %")
        elif not _worse_past(line, fail_above_pct):
            continue
        elif line.samples[0] <= 1 or line.samples[1] <= 1:
            why.append(f"{line.metric} {line.delta_pct:+.1f} %: one sample each, not tested (repeat each run)")
        else:
            why.append(
                f"{line.metric} {line.delta_pct:+.1f} %: too few steps to test ({line.samples[0]}/{line.samples[1]}, "
                f"{MIN_SAMPLES} needed each): generate more tokens"
            )
    if loaded:
        why.insert(
            0,
            "host time not judged under other load ("
            + "; ".join(unreliable)
            + f") moved {', '.join(loaded)}: re-run both on a quiet machine",
        )
    if not judged and not why:
        what = (
            "; ".join(unreliable) + ": re-run both on a quiet machine"
            if unreliable
            else "no figure with a per-step distribution in both runs (one sample each, or too few steps)"
        )
        why.append(f"nothing was judged: {what}")
    return ("inconclusive", why) if why else ("no regression", [])


def _kernel_lines(
    ka: KernelBreakdown, kb: KernelBreakdown, a: Report, b: Report, fail_above_pct: float, alpha: float
) -> list[DiffLine]:
    """Kernel time per recorded step by phase and family (tested), GPU busy and the decode phase's top kernels per
    recorded step (deltas): on the GPU the load-independent evidence, judged first."""
    basis = "host" if "host" in (_kernel_basis(ka), _kernel_basis(kb)) else "device"
    lines: list[DiffLine] = []
    for phase in ("decode", "prefill"):
        fa, fb = _family_per_step(a, phase), _family_per_step(b, phase)
        totals_a, totals_b = _step_kernel_ms(a, phase), _step_kernel_ms(b, phase)
        if totals_a and totals_b:
            lines.append(_line(f"{phase} kernel time per step", "ms/step", totals_a, totals_b, fail_above_pct, alpha))
        for fam in sorted(
            set(fa) | set(fb), key=lambda f: -(np.median(fb.get(f, [0.0])) + np.median(fa.get(f, [0.0])))
        ):
            va, vb = fa.get(fam, [0.0] * len(totals_a)), fb.get(fam, [0.0] * len(totals_b))
            if va and vb and (np.median(va) > 0.001 or np.median(vb) > 0.001):
                lines.append(_line(f"{phase} {fam} per step", "ms/step", va, vb, fail_above_pct, alpha))
    if ka.gpu_busy_pct is not None and kb.gpu_busy_pct is not None:
        lines.append(
            _line(
                "GPU busy",
                "%",
                [ka.gpu_busy_pct],
                [kb.gpu_busy_pct],
                fail_above_pct,
                alpha,
                higher_is_worse=False,
                tested=False,
            )
        )
    pa, pb = _phase(ka, "decode"), _phase(kb, "decode")
    top_a = {r.name: r for r in (pa.top_kernels if pa else ka.top_kernels)}
    top_b = {r.name: r for r in (pb.top_kernels if pb else kb.top_kernels)}
    for name in list(dict.fromkeys([*top_a, *top_b]))[:10]:
        per_a = _kernel_ms_per_step(pa, top_a.get(name))
        per_b = _kernel_ms_per_step(pb, top_b.get(name))
        if per_a is None or per_b is None:
            continue
        lines.append(_line(f"kernel {name}", "ms/step", [per_a], [per_b], fail_above_pct, alpha, tested=False))
    return [msgspec.structs.replace(line, basis=basis) for line in lines]


def _phase(k: KernelBreakdown, phase: str) -> PhaseBreakdown | None:
    return next((p for p in k.phases if p.phase == phase), None)


def _kernel_ms_per_step(p: PhaseBreakdown | None, row: KernelRow | None) -> float | None:
    """A top kernel's time per recorded step of the phase (0 where the phase did not run it; None without a phase)."""
    if p is None:
        return None
    if row is None:
        return 0.0
    return ms_per_step_of(p, row.total_ms)


STARTUP_MIN_PHASE_S = 0.5
"""Start-up phases shorter than this in both runs are left out of a diff."""


def _phase_seconds(a: StartupProfile, b: StartupProfile) -> dict[str, tuple[float, float]]:
    """Each phase name of either start-up (first seen first) -> its seconds in a and in b (0 where absent)."""
    names = dict.fromkeys([p.name for p in a.phases] + [p.name for p in b.phases])
    return {
        n: (sum(p.seconds for p in a.phases if p.name == n), sum(p.seconds for p in b.phases if p.name == n))
        for n in names
    }


def _startup_lines(a: StartupProfile, b: StartupProfile, fail_above_pct: float, alpha: float) -> list[DiffLine]:
    lines = [_line("start-up to first token", "s", [a.total_s], [b.total_s], fail_above_pct, alpha, tested=False)]
    for name, (sa, sb) in _phase_seconds(a, b).items():
        if max(sa, sb) >= STARTUP_MIN_PHASE_S:
            lines.append(_line(f"start-up: {name}", "s", [sa], [sb], fail_above_pct, alpha, tested=False))
    return lines


def startup_verdicts(
    a: StartupProfile, b: StartupProfile, max_a: str | None = None, max_b: str | None = None
) -> list[str]:
    """What changed between two start-ups: total, the compile cache's state, the compile key, the phase that moved
    most."""
    out = [
        f"start-up {a.total_s:.1f} s -> {b.total_s:.1f} s ({_pct(a.total_s, b.total_s)}); compile cache {a.cache} -> "
        f"{b.cache}" + (f" ({b.cache_reason})" if b.cache_reason and b.cache != "hit" else "")
    ]
    changed = [
        f"{k}: {a.compile_key.get(k, '-')} -> {b.compile_key.get(k, '-')}"
        for k in dict.fromkeys([*a.compile_key, *b.compile_key])
        if a.compile_key.get(k) != b.compile_key.get(k)
    ]
    if max_a and max_b and max_a != max_b and not any(c.startswith("max_version") for c in changed):
        changed.append(f"MAX {max_a} -> {max_b}")
    if changed:
        out.append("compile key changed: " + "; ".join(changed))
    moves = {n: sb - sa for n, (sa, sb) in _phase_seconds(a, b).items()}
    if moves:
        name, delta = max(moves.items(), key=lambda kv: abs(kv[1]))
        if abs(delta) >= STARTUP_MIN_PHASE_S:
            out.append(f"largest change: {name} {delta:+.1f} s")
    return out


def _pct(a: float, b: float) -> str:
    return f"{100.0 * (b - a) / a:+.0f} %" if a else "new"


def _sweep_lines(a: Sequence[LoadLevel], b: Sequence[LoadLevel], fail_above_pct: float, alpha: float) -> list[DiffLine]:
    """Level by level, for the concurrencies both sweeps ran: throughput (higher is better), TTFT and ITL medians. Two
    sweeps of the same levels in the same order pair by position (a level run more than once is each time its own);
    otherwise a concurrency pairs only where each sweep ran it once."""
    if [lv.concurrency for lv in a] == [lv.concurrency for lv in b]:
        pairs = list(zip(a, b, strict=True))
    else:
        once_a = {lv.concurrency: lv for lv in a if [x.concurrency for x in a].count(lv.concurrency) == 1}
        once_b = {lv.concurrency: lv for lv in b if [x.concurrency for x in b].count(lv.concurrency) == 1}
        pairs = [(once_a[c], once_b[c]) for c in once_a if c in once_b]
    lines = []
    for la, lb in pairs:
        c = la.concurrency
        lines.append(
            _line(
                f"concurrency {c}: output",
                "tok/s",
                [la.output_tok_per_s],
                [lb.output_tok_per_s],
                fail_above_pct,
                alpha,
                higher_is_worse=False,
                tested=False,
            )
        )
        for what, sa, sb in (("TTFT p50", la.ttft_ms, lb.ttft_ms), ("ITL p50", la.itl_ms, lb.itl_ms)):
            if sa.p50 is not None and sb.p50 is not None:
                lines.append(
                    _line(f"concurrency {c}: {what}", "ms", [sa.p50], [sb.p50], fail_above_pct, alpha, tested=False)
                )
    return lines


def _p_text(p: float | None) -> str:
    if p is None:
        return "no test"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def _verdicts(lines: Sequence[DiffLine], fail_above_pct: float, alpha: float) -> list[str]:
    """One line per significant change (a regression first said as ``REGRESSION``)."""
    out = []
    for line in lines:
        if not line.significant:
            continue
        pct = f"{line.delta_pct:+.1f} %" if line.delta_pct is not None else f"new in {'B' if line.a == 0 else 'A'}"
        tag = (
            "REGRESSION"
            if line.regression
            else ("slower" if line.delta > 0 else "faster")
            if line.unit.startswith(("ms", "µs"))
            else "changed"
        )
        out.append(f"{tag}: {line.metric} {pct} ({_p_text(line.p_value)}), {line.delta:+.3g} {line.unit}")
    return out


def outcome_line(result: DiffResult) -> str:
    """The outcome of a comparison that found no regression, in one line: what was judged (no regression), what could
    not be (inconclusive). A regression is said by its own ``REGRESSION`` lines."""
    if result.outcome == "inconclusive":
        return "INCONCLUSIVE: " + "; ".join(result.inconclusive)
    judged = [line.metric for line in result.lines if line.judged and line.p_value is not None]
    named = ", ".join(judged[:3]) + (f" and {len(judged) - 3} more" if len(judged) > 3 else "")
    return (
        f"no regression: {len(judged)} figure(s) judged ({named}; Mann-Whitney U at alpha {result.alpha:g}, threshold "
        f"{result.fail_above_pct:g} %)"
    )
