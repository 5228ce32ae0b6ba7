"""Every view from the one account: the kernel breakdown's per-phase figures as the step ledger gives them.

The ledger (:mod:`~max_profile.analyze.ledger`) is the one account of a phase's step: its recorded steps, its time
(kernel busy time plus GPU idle inside the steps), its busy share, its kernels per step. The breakdown's phase rows,
and through them every view that shows a per-phase, per-step or per-token figure (text, HTML, JSON, OTel / Prometheus
metrics, ``diff``, serve summaries, finding evidence), read those numbers from here instead of computing them a second
time, so no two parts of one report can disagree. The breakdown keeps what the ledger does not hold: families and top
kernels by name (totals and shares of the recorded kernels).

Pure functions of the model.
"""

from __future__ import annotations

import msgspec

from max_profile.model import KernelBreakdown, PhaseBreakdown, PhaseLedger, Report, Step, StepKernels, StepLedger
from max_profile.model.tags import LedgerSource

ACCOUNTED_SOURCES = (LedgerSource.KERNEL_TIMELINE, LedgerSource.OP_RANGES)
"""Ledgers built from the same records as the breakdown (a server-metrics ledger holds batch times, not kernels)."""


def phase_from_ledger(p: PhaseBreakdown, lp: PhaseLedger) -> PhaseBreakdown:
    """The phase's row with the ledger's steps, time, busy share and per-step figures."""
    kernel_ms = sum(r.ms_per_step for r in lp.rows if r.kind == "kernels")
    tokens = p.tokens_per_step
    return msgspec.structs.replace(
        p,
        steps=lp.steps,
        wall_ms=round(lp.step_ms * lp.steps, 6),
        gpu_busy_pct=lp.busy_pct,
        kernels_per_step=lp.kernels_per_step if lp.kernels_per_step is not None else p.kernels_per_step,
        kernel_ms_per_step=round(kernel_ms, 6),
        kernel_us_per_token=round(1e3 * kernel_ms / tokens, 4) if tokens else None,
    )


def breakdown_from_ledger(k: KernelBreakdown, lg: StepLedger) -> KernelBreakdown:
    """The breakdown with each phase's figures read off the ledger (phases the ledger does not hold keep their own)."""
    if lg.source not in ACCOUNTED_SOURCES:
        return k
    by_phase = {p.phase: p for p in lg.phases}
    phases = [phase_from_ledger(p, by_phase[p.phase]) if p.phase in by_phase else p for p in k.phases]
    return msgspec.structs.replace(k, phases=phases)


WHOLE_STEP = 0.99
"""A step counts as recorded whole when at least this share of it lies inside the recorded slices."""


def whole_steps(k: KernelBreakdown, phase: str) -> list[StepKernels]:
    """The phase's steps recorded whole, in time order: the per-step distribution a comparison or a trend reads (a
    step cut by a slice's edge holds part of its kernels)."""
    return [s for s in k.per_step if s.phase == phase and s.observed >= WHOLE_STEP]


def paired_steps(report: Report, phase: str) -> list[tuple[Step, StepKernels]]:
    """The phase's whole recorded steps with the report's step each one is (its index among the working steps in time
    order); empty when the breakdown's steps are not the report's (steps from a trace's ranges on another clock)."""
    k = report.kernels
    if not isinstance(k, KernelBreakdown):
        return []
    work = sorted((s for s in report.steps if s.batch_size > 0), key=lambda s: s.start_ns)
    rows = whole_steps(k, phase)
    if any(r.index >= len(work) or work[r.index].phase != r.phase for r in rows):
        return []
    return [(work[r.index], r) for r in rows]


def ms_per_step_of(p: PhaseBreakdown, total_ms: float) -> float | None:
    """A part of the phase's kernel time (a family's, a kernel's: ``total_ms`` over the recorded kernels) per recorded
    step, on the ledger's scale: its share of the phase's kernel time times the phase's kernel ms per step."""
    if not p.kernel_ms or p.kernel_ms_per_step is None:
        return None
    return total_ms / p.kernel_ms * p.kernel_ms_per_step
