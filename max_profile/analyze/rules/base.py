"""What every rule shares: the :class:`RuleSpec` a rule is registered with, the named requirements (``needs``) the
engine checks before running a rule (and gives as the reason when it skips one), and the report accessors rules read
with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from max_profile.analyze.load import load_share
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import (
    Finding,
    KernelBreakdown,
    Lever,
    PhaseBreakdown,
    PhaseLedger,
    Report,
    StepLedger,
    StepSummary,
    Unavailable,
    UtilizationSection,
)
from max_profile.model.serialization import Severity
from max_profile.model.tags import LedgerSource, TargetKind, host_ops

Rule = Callable[[Report, Thresholds], list[Finding]]


@dataclass(frozen=True)
class RuleSpec:
    """One diagnosis rule: its name, the function, the finding ids it may emit, what it needs (names of :data:`NEEDS`;
    ``a|b`` is either) and the :class:`Thresholds` fields it decides by. The engine runs it only when every need is met,
    and otherwise records it as skipped with the first unmet need's reason."""

    name: str
    fn: Rule
    emits: tuple[str, ...]
    needs: tuple[str, ...]
    thresholds: tuple[str, ...] = ()


def util(report: Report) -> UtilizationSection | None:
    return report.utilization if isinstance(report.utilization, UtilizationSection) else None


def kern(report: Report) -> KernelBreakdown | None:
    return report.kernels if isinstance(report.kernels, KernelBreakdown) else None


def step_summary(report: Report) -> StepSummary | None:
    return report.step_summary if isinstance(report.step_summary, StepSummary) else None


def ledger(report: Report) -> StepLedger | None:
    return report.ledger if isinstance(report.ledger, StepLedger) else None


def phase_of(k: KernelBreakdown, name: str) -> PhaseBreakdown | None:
    return next((p for p in k.phases if p.phase == name), None)


def ledger_phase(report: Report, name: str) -> PhaseLedger | None:
    lg = ledger(report)
    return next((p for p in lg.phases if p.phase == name), None) if lg else None


def fam_ms(rows: list, family: str) -> float:  # type: ignore[type-arg]
    return sum(r.total_ms for r in rows if r.family == family)


def gpu_kernels(k: KernelBreakdown) -> bool:
    """Kernels recorded on a GPU (not MAX's op ranges on the host)."""
    return not host_ops(k.source)


def timeline_ledger(report: Report) -> StepLedger | None:
    """The ledger when it comes from a GPU kernel timeline (not the server's batch times, not host op ranges)."""
    lg = ledger(report)
    return lg if lg is not None and lg.source == LedgerSource.KERNEL_TIMELINE else None


def nvml_window_long_enough(u: UtilizationSection, th: Thresholds) -> bool:
    """Whether NVML's utilization can speak for the window: NVML averages "some kernel ran" over its own sample period
    (1/6 s to 1 s, by GPU), so a window shorter than a few of those reads the idle time before the work (an H200 read 0
    % for a 0.19 s GPU-bound decode that ran at 77 % of peak bandwidth, and 90 % once the same decode ran 3 s)."""
    if u.window_ns is None:
        return max((g.samples for g in u.gpus), default=0) >= th.nvml_min_samples
    return (u.window_ns[1] - u.window_ns[0]) / 1e9 >= th.nvml_min_window_s and max(
        (g.samples for g in u.gpus), default=0
    ) >= th.nvml_min_samples


def host_contended(report: Report, th: Thresholds) -> bool:
    """Whether other processes held enough of the host's cores during the capture that its timing figures are not
    reliable."""
    load = report.capture.host_load
    return (
        load is not None
        and load.other_cores >= th.host_load_other_cores
        and (load.own_cores + load.other_cores) >= th.host_load_busy_fraction * load.cores
    )


def lightly_loaded(report: Report, th: Thresholds) -> bool:
    share, _ = load_share(report)
    return share is not None and share < th.light_load_pct


def lever_severity(pct_of_step: float, steps: int, th: Thresholds) -> Severity | None:
    """``warning`` for a lever of ``lever_warning_pct`` of the step or more (over ``lever_min_steps`` steps at least:
    one step is a one-off, not a pattern), ``info`` from ``lever_info_pct``, None below."""
    if pct_of_step >= th.lever_warning_pct and steps >= th.lever_min_steps:
        return "warning"
    if pct_of_step >= th.lever_info_pct:
        return "info"
    return None


def phase_lever(p: PhaseLedger, part: str, ms_per_step: float) -> Lever:
    return Lever(
        phase=p.phase,
        part=part,
        ms_per_step=round(ms_per_step, 4),
        pct_of_step=round(100 * ms_per_step / p.step_ms, 1) if p.step_ms else 0.0,
        total_ms=round(ms_per_step * p.steps, 4),
    )


def worst_lever_pct(p: PhaseLedger) -> float:
    """The largest single lever of a phase in % of its step: a priced part's recoverable time, or all the GPU idle."""
    parts = [r.recoverable_ms_per_step or 0.0 for r in p.rows if r.kind == "kernels"]
    idle = sum(r.ms_per_step for r in p.rows if r.kind == "idle")
    return 100 * max([*parts, idle, 0.0]) / p.step_ms if p.step_ms else 0.0


def attention_presence(k: KernelBreakdown) -> tuple[float | None, str, int]:
    """(attention kernels per recorded decode step, or per capture when no phases; the scope; attention kernels
    counted)."""
    d = phase_of(k, "decode")
    if d is not None and d.steps:
        n = sum(r.kernels for r in d.families if r.family == "attention")
        return n / d.steps, "decode", n
    if k.phases:
        return None, "", 0
    n = sum(r.kernels for r in k.families if r.family == "attention")
    return float(n), "capture", n


def attention_unfused(report: Report, th: Thresholds) -> bool:
    """No fused attention kernel in a decoder's trace (matmuls present, attention kernels per decode step under
    ``min_attention_kernels_per_step``): what unfused-attention says."""
    k = kern(report)
    if not k or k.unreliable or not k.kernels:
        return False
    if not any(r.family in ("gemm", "gemv", "grouped_matmul") for r in k.families):
        return False
    per_step, _, _ = attention_presence(k)
    return per_step is not None and per_step < th.min_attention_kernels_per_step


def _unavailable_reason(value: object, what: str) -> str:
    return value.reason if isinstance(value, Unavailable) else f"no {what} in this capture"


NEEDS: dict[str, Callable[[Report], str | None]] = {
    "kernels": lambda r: (
        None if isinstance(r.kernels, KernelBreakdown) else _unavailable_reason(r.kernels, "kernel breakdown")
    ),
    "gpu_kernels": lambda r: (
        None
        if isinstance(r.kernels, KernelBreakdown) and gpu_kernels(r.kernels)
        else "no GPU kernels (MAX's op ranges on the host, or no kernel trace)"
    ),
    "ledger": lambda r: None if isinstance(r.ledger, StepLedger) else _unavailable_reason(r.ledger, "step ledger"),
    "utilization": lambda r: (
        None if isinstance(r.utilization, UtilizationSection) else _unavailable_reason(r.utilization, "GPU utilization")
    ),
    "steps": lambda r: None if r.steps else "no pipeline steps",
    "step_summary": lambda r: (
        None if isinstance(r.step_summary, StepSummary) else _unavailable_reason(r.step_summary, "step summary")
    ),
    "decode_cost": lambda r: (
        None
        if r.decode_cost is not None
        else "no decode cost model (needs decode steps and the model's config.json or weights)"
    ),
    "load_levels": lambda r: None if len(r.load_levels) >= 2 else "no load sweep (one concurrency level or none)",
    "load": lambda r: (
        None if r.window_load is not None or isinstance(r.ledger, StepLedger) else "no load window and no step ledger"
    ),
    "startup": lambda r: (
        None if r.startup is not None else "no start-up profile (run, demo, startup, serve record one)"
    ),
    "kernel_analyses": lambda r: None if r.kernel_analyses else "no Nsight Compute analysis (max-profile kernel)",
    "tracer_cost": lambda r: None if r.tracer_cost is not None else "no untraced reference window",
    "host_load": lambda r: None if r.capture.host_load is not None else "the host's load was not recorded",
    "known_load": lambda r: (
        None
        if TargetKind.of(r.capture.target) is not TargetKind.ATTACH or load_share(r)[0] is not None
        else "the attached server's load over the window is not known (no server metrics, no requests of ours: "
        "--probe or --concurrency): an idle or host-bound verdict needs load"
    ),
    "gpu": lambda r: None if r.environment.vendor != "none" else "no GPU on this machine",
    "multi_device": lambda r: (
        None if isinstance(r.kernels, KernelBreakdown) and len(r.kernels.per_device) >= 2 else "one device"
    ),
}
"""Each named requirement: None when the report meets it, else the reason a rule that needs it is skipped."""


def unmet(report: Report, needs: tuple[str, ...]) -> str | None:
    """The reason the first unmet need gives (``a|b``: either), None when all are met."""
    for need in needs:
        reasons = [NEEDS[n](report) for n in need.split("|")]
        if all(reasons):
            return "; ".join(str(x) for x in reasons)
    return None
