"""Host step statistics: TTFT, per-phase step time percentiles, decode throughput, growth.

Pure functions of :class:`Step` lists. Equivalent to what ``max generate`` prints as
"Time to first token" and "Eval throughput (token-generation)", but per step and per phase.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from max_profile.model import BatchStats, Phase, PhaseStats, Step, StepSummary
from max_profile.model.tags import StepSource


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else 0.0


def active_steps(steps: Sequence[Step]) -> list[Step]:
    """Steps that carried requests (the overlap pipeline's empty drain call is left out)."""
    return [s for s in steps if s.batch_size > 0]


@dataclass(frozen=True)
class PhaseShape:
    """What one phase's passes carried: the one batch, tokens and context figure every view of a report reads (the
    ledger, the decode roofline, the replica table, finding evidence).

    Each is the median over the phase's passes that carried requests: ``batch`` requests, ``tokens`` new tokens
    (decode: the batch) and ``context_tokens`` cached tokens summed over the batch, None where the passes do not say
    (MAX's ``max.batch`` spans give no context lengths: the KV cache's bytes are then unknown, never zero)."""

    steps: int
    batch: float | None
    tokens: float | None
    context_tokens: float | None

    @property
    def batch_figure(self) -> int | None:
        """The batch as printed and priced: the median rounded to whole requests."""
        return int(round(self.batch)) if self.batch else None


def phase_shape(steps: Sequence[Step], phase: Phase) -> PhaseShape:
    """The :class:`PhaseShape` of ``phase``'s passes among ``steps`` (those of that phase only: a mixed pass is not a
    prefill or a decode pass here)."""
    sel = [s for s in steps if s.phase == phase and s.batch_size > 0]
    if not sel:
        return PhaseShape(0, None, None, None)
    batch = float(np.median([s.batch_size for s in sel]))
    tokens = batch if phase == "decode" else float(np.median([float(s.input_tokens) for s in sel]))
    known = [float(s.context_tokens) for s in sel if s.context_tokens is not None]
    return PhaseShape(len(sel), batch, tokens, float(np.median(known)) if known else None)


def summarize_steps(
    steps: Sequence[Step], source: StepSource = StepSource.HOST, traced: Sequence[tuple[int, int]] = ()
) -> StepSummary:
    """Summary of one run's steps; raises ValueError when no step carried a request.

    ``source``: ``host steps`` (the pipeline hook: TTFT as the host saw it), ``model worker steps`` (a server's batches:
    no TTFT, requests come and go) or the trace ranges the steps came from (no TTFT: ranges do not say when the first
    token reached the caller). ``traced``: the slices a sampled kernel recording traced (see :func:`decode_growth`)."""
    work = active_steps(steps)
    if not work:
        raise ValueError("no pipeline step ran inside the profiled block")
    phases: list[PhaseStats] = []
    order: tuple[Phase, ...] = ("prefill", "mixed", "decode", "unknown")
    for phase in order:
        sel = [s for s in work if s.phase == phase]
        if not sel:
            continue
        ms = np.array([s.duration_ns / 1e6 for s in sel])
        tokens = sum(s.input_tokens for s in sel) if phase in ("prefill", "mixed") else sum(s.batch_size for s in sel)
        phases.append(
            PhaseStats(
                phase=phase,
                steps=len(sel),
                total_ms=float(ms.sum()),
                p50_ms=_pct(ms, 50),
                p90_ms=_pct(ms, 90),
                max_ms=float(ms.max()),
                tokens=int(tokens),
            )
        )
    first = work[0]
    ttft_ms: float | None = None
    prefill_steps = [s for s in work if s.phase in ("prefill", "mixed")]
    if prefill_steps and source == StepSource.HOST:
        # Time to first token as the host sees it: from the first prefill step's start to the
        # end of the step that returned the first token (the overlap pipeline returns a step's
        # tokens from the following call).
        first_out = next((s for s in steps if s.output_tokens > 0), None)
        end = first_out.end_ns if first_out else prefill_steps[0].end_ns
        ttft_ms = (end - first.start_ns) / 1e6
    decode = [s for s in work if s.phase == "decode"]
    tps: float | None = None
    if decode:
        total_s = sum(s.duration_ns for s in decode) / 1e9
        tps = sum(s.batch_size for s in decode) / total_s if total_s > 0 else None
    return StepSummary(
        steps=len(work),
        ttft_ms=ttft_ms,
        phases=phases,
        decode_tokens_per_s=tps,
        decode_step_growth_ms_per_100_ctx=decode_growth(decode, traced),
        source=source,
        by_batch=by_batch(work),
    )


def by_batch(steps: Sequence[Step]) -> list[BatchStats]:
    """Step-time percentiles per phase and batch size (a server runs many sizes: decode steps at 1, 2, 3...
    requests)."""
    groups: dict[tuple[Phase, int], list[Step]] = {}
    for s in steps:
        groups.setdefault((s.phase, s.batch_size), []).append(s)
    order: tuple[Phase, ...] = ("prefill", "mixed", "decode", "unknown")
    out = []
    for (phase, size), sel in sorted(groups.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        ms = np.array([s.duration_ns / 1e6 for s in sel])
        tokens = float(np.mean([s.batch_size if phase == "decode" else s.input_tokens for s in sel]))
        out.append(
            BatchStats(
                phase=phase,
                batch_size=size,
                steps=len(sel),
                p50_ms=_pct(ms, 50),
                p90_ms=_pct(ms, 90),
                tokens_per_step=round(tokens, 2),
            )
        )
    return out


GROWTH_MIN_STEPS = 8
"""Decode steps a step-vs-context slope needs (of one batch size)."""
GROWTH_MIN_SPAN = 16
"""Context tokens between the first and last third's medians a slope needs: closer, its run-to-run noise is the
slope."""


def decode_growth(decode: Sequence[Step], traced: Sequence[tuple[int, int]] = ()) -> float | None:
    """Slope of decode step time against context length (ms per 100 context tokens), from steps that support one.

    A working KV cache keeps decode steps nearly flat; re-encoding the whole sequence every step makes them grow about
    linearly with the context. The fit uses the steps of the most common batch size only (a bigger batch is a longer
    step at any context), and, where a sampled kernel recording traced some steps (``traced``: its slices), the
    untraced ones when there are enough (a traced step is slower whatever its context). Those steps are ordered by
    sequence length; the slope is between the medians (time and length) of the first and last thirds, robust to
    spikes. None with fewer than :data:`GROWTH_MIN_STEPS` such steps or a length span under :data:`GROWTH_MIN_SPAN`
    tokens between the thirds (a server's requests at similar lengths: no slope to read)."""
    pts = [s for s in decode if s.sequence_tokens is not None]
    if traced:
        untraced = [s for s in pts if not any(a <= s.start_ns < b for a, b in traced)]
        if len(untraced) >= GROWTH_MIN_STEPS:
            pts = untraced
    if not pts:
        return None
    sizes = [s.batch_size for s in pts]
    common = max(set(sizes), key=sizes.count)
    pts = [s for s in pts if s.batch_size == common]
    if len(pts) < GROWTH_MIN_STEPS:
        return None
    x = np.array([s.sequence_tokens for s in pts], dtype=float)
    y = np.array([s.duration_ns / 1e6 for s in pts], dtype=float)
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    k = max(len(x) // 3, 1)
    dx = float(np.median(x[-k:]) - np.median(x[:k]))
    if dx < GROWTH_MIN_SPAN:
        return None
    return float((np.median(y[-k:]) - np.median(y[:k])) / dx * 100.0)
