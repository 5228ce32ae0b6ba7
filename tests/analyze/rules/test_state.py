"""The rules about the machine's state, field by field: throttling (warning when the clock dropped, info when it held),
memory near full, other processes on the host's cores; and the shared helpers the rules read (host contention, the
NVML window, lever severity, load share) at their exact thresholds from both sides."""

from __future__ import annotations

import dataclasses
from functools import cache

import msgspec
import pytest

from max_profile.analyze.report import build_report
from max_profile.analyze.rules.base import (
    host_contended,
    kern,
    ledger_phase,
    lever_severity,
    lightly_loaded,
    load_share,
    nvml_window_long_enough,
    step_summary,
    worst_lever_pct,
)
from max_profile.analyze.rules.utilization import rule_host_contention, rule_near_oom, rule_throttled
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import BusyProcess, GpuUtilization, HostLoad, Report, StepLedger, UtilizationSection

from ...analyze.rules.test_rules import DENSE, synthetic

TH = Thresholds()


@cache
def _base() -> Report:
    return build_report(synthetic([1.0] * 5, [DENSE] * 5))


def gpu(name: str = "nv0", **kw: object) -> GpuUtilization:
    fields: dict[str, object] = {
        "gpu": name,
        "samples": 30,
        "peak_utilization_pct": 90.0,
        "mean_utilization_pct": 80.0,
        "peak_memory_bytes": 100,
        "memory_total_bytes": 141,
        "peak_memory_pct": 70.9,
        "mean_sm_clock_mhz": 1900.0,
        "max_sm_clock_mhz": 1980,
        "hardware_throttle_reasons": [],
    }
    fields.update(kw)
    return GpuUtilization(**fields)  # type: ignore[arg-type]


def with_gpus(*gpus: GpuUtilization, window_ns: tuple[int, int] | None = (0, 10**10)) -> Report:
    section = UtilizationSection(source="test", interval_s=0.1, gpus=list(gpus), samples=[], window_ns=window_ns)
    return msgspec.structs.replace(_base(), utilization=section)


def test_throttled_with_the_clock_dropped_every_field() -> None:
    g = gpu(hardware_throttle_reasons=["hw_slowdown", "sw_power_cap"], mean_sm_clock_mhz=1234.56)
    (f,) = rule_throttled(with_gpus(gpu("nv1"), g), TH)
    pct = 100.0 * 1234.56 / 1980
    assert (f.id, f.severity, f.confidence) == ("throttled", "warning", 0.9)
    assert f.title == "nv0 was clock-throttled: the numbers are not representative"
    assert f.evidence == {
        "gpu": "nv0",
        "reasons": "hw_slowdown,sw_power_cap",
        "mean_sm_clock_mhz": 1234.56,
        "max_sm_clock_mhz": 1980,
        "clock_pct_of_max": round(pct, 1),
    }
    assert f.next_step == (
        "Check cooling / power limits (nvidia-smi -q -d PERFORMANCE) and re-run when the GPU is not throttled."
    )


def test_throttled_with_the_clock_held_is_info() -> None:
    g = gpu(hardware_throttle_reasons=["sw_power_cap"], mean_sm_clock_mhz=1974.06)
    (f,) = rule_throttled(with_gpus(g), TH)
    assert (f.severity, f.confidence) == ("info", 0.5)
    assert f.title == "nv0 reported throttle reasons but ran at 99.7 % of its max SM clock"
    assert f.next_step == "None needed: the clock held; watch it if later runs slow down."
    assert f.evidence["clock_pct_of_max"] == 99.7


def test_throttled_edges() -> None:
    exact = gpu(
        hardware_throttle_reasons=["hw_slowdown"],
        mean_sm_clock_mhz=TH.throttle_clock_pct / 100 * 2000,
        max_sm_clock_mhz=2000,
    )
    assert rule_throttled(with_gpus(exact), TH)[0].severity == "info"  # exactly the threshold: the clock held
    below = gpu(
        hardware_throttle_reasons=["hw_slowdown"],
        mean_sm_clock_mhz=TH.throttle_clock_pct / 100 * 2000 - 1,
        max_sm_clock_mhz=2000,
    )
    assert rule_throttled(with_gpus(below), TH)[0].severity == "warning"
    for unknown in ({"mean_sm_clock_mhz": None}, {"max_sm_clock_mhz": None}):
        (f,) = rule_throttled(with_gpus(gpu(hardware_throttle_reasons=["hw_slowdown"], **unknown)), TH)
        assert f.severity == "warning" and f.evidence["clock_pct_of_max"] is None  # no clock: not known to have held
    # a GPU without reasons before one with them: each GPU judged, none skipped
    found = rule_throttled(with_gpus(gpu("nv0"), gpu("nv1", hardware_throttle_reasons=["hw_slowdown"])), TH)
    assert [f.evidence["gpu"] for f in found] == ["nv1"]
    assert rule_throttled(_base(), TH) == []  # no samples


def test_near_oom_every_field_and_its_threshold() -> None:
    g = gpu(peak_memory_pct=97.25, peak_memory_bytes=137_000_000_000, memory_total_bytes=140_870_000_000)
    (f,) = rule_near_oom(with_gpus(gpu("nv1"), g), TH)
    assert (f.id, f.severity, f.confidence) == ("near-oom", "warning", 0.8)
    assert f.title == "nv0 memory is nearly full (97.2% of total)"
    assert f.evidence == {
        "gpu": "nv0",
        "peak_memory_bytes": 137_000_000_000,
        "memory_total_bytes": 140_870_000_000,
        "threshold_pct": TH.near_oom_pct,
    }
    assert f.next_step is not None and f.next_step.startswith("The KV cache or batch size may be the constraint")
    assert rule_near_oom(with_gpus(gpu(peak_memory_pct=TH.near_oom_pct)), TH)
    assert not rule_near_oom(with_gpus(gpu(peak_memory_pct=TH.near_oom_pct - 0.01)), TH)
    assert rule_near_oom(_base(), TH) == []


def loaded(other: float, own: float = 0.5, cores: int = 2, busiest: int = 5) -> Report:
    load = HostLoad(
        window_s=12.5,
        cores=cores,
        cpu_busy_pct=97.5,
        own_cores=own,
        other_cores=other,
        load_avg_1m=3.25,
        busiest_others=[BusyProcess(pid=100 + i, name=f"p{i}", cores=0.5 - 0.1 * i) for i in range(busiest)],
    )
    return msgspec.structs.replace(_base(), capture=msgspec.structs.replace(_base().capture, host_load=load))


def test_host_contention_every_field() -> None:
    (f,) = rule_host_contention(loaded(1.5), TH)
    assert (f.id, f.severity, f.confidence) == ("host-contention", "warning", 0.7)
    assert f.title == "Other processes used 1.5 of 2 CPU cores during the capture: its timing figures are not reliable"
    assert f.evidence == {
        "cores": 2,
        "profiled_process_cores": 0.5,
        "other_processes_cores": 1.5,
        "cpu_busy_pct": 97.5,
        "load_avg_1m": 3.25,
        "busiest_others_cores": "p0 (pid 100) 0.50, p1 (pid 101) 0.40, p2 (pid 102) 0.30",
        "window_s": 12.5,
    }
    assert f.next_step is not None and f.next_step.startswith("Re-run on a quiet machine")


def test_host_contention_thresholds_at_their_exact_values() -> None:
    other = TH.host_load_other_cores
    busy = TH.host_load_busy_fraction * 2
    assert host_contended(loaded(other, own=busy - other), TH)  # both exactly at their thresholds
    assert not host_contended(loaded(other - 0.01, own=busy), TH)
    assert not host_contended(loaded(other, own=busy - other - 0.01), TH)
    assert not host_contended(_base(), TH)  # no host load recorded


def test_nvml_window_long_enough_at_its_exact_values() -> None:
    th = TH
    n = th.nvml_min_samples
    long_ns = int(th.nvml_min_window_s * 1e9)

    def long_enough(samples: int | None, window: tuple[int, int] | None, t: Thresholds = th) -> bool:
        gpus = () if samples is None else (gpu(samples=samples),)
        u = with_gpus(*gpus, window_ns=window).utilization
        assert isinstance(u, UtilizationSection)
        return nvml_window_long_enough(u, t)

    far = 10**12  # a window late on the clock: its length, not its end, is what counts
    assert long_enough(n, (far, far + long_ns))  # exactly the length and exactly the samples
    assert not long_enough(n, (far, far + long_ns - 1))
    assert not long_enough(n - 1, (far, far + long_ns))
    assert not long_enough(None, (far, far + long_ns), dataclasses.replace(th, nvml_min_samples=1))
    assert long_enough(None, (far, far + long_ns), dataclasses.replace(th, nvml_min_samples=0))
    # no window: the samples alone decide
    assert long_enough(n, None) and not long_enough(n - 1, None)
    assert not long_enough(None, None, dataclasses.replace(th, nvml_min_samples=1))
    assert long_enough(None, None, dataclasses.replace(th, nvml_min_samples=0))


def test_lever_severity_at_its_exact_values() -> None:
    n = TH.lever_min_steps
    assert lever_severity(TH.lever_warning_pct, n, TH) == "warning"
    assert lever_severity(TH.lever_warning_pct - 0.01, n, TH) == "info"
    assert lever_severity(TH.lever_warning_pct, n - 1, TH) == "info"  # too few steps to warn
    assert lever_severity(TH.lever_info_pct, n, TH) == "info"
    assert lever_severity(TH.lever_info_pct - 0.01, n, TH) is None


def test_load_share_and_light_load() -> None:
    base = _base()
    lg = base.ledger
    assert isinstance(lg, StepLedger)
    steps = msgspec.structs.replace(lg, outside_steps_pct=37.25, requests_in_flight_pct=None)
    assert load_share(msgspec.structs.replace(base, ledger=steps)) == (100.0 - 37.25, "steps running")
    server = msgspec.structs.replace(steps, source="server metrics")
    assert load_share(msgspec.structs.replace(base, ledger=server)) == (100.0 - 37.25, "batches executing")
    at = msgspec.structs.replace(steps, outside_steps_pct=100.0 - TH.light_load_pct)
    assert not lightly_loaded(msgspec.structs.replace(base, ledger=at), TH)  # exactly the threshold: not light
    under = msgspec.structs.replace(steps, outside_steps_pct=100.0 - TH.light_load_pct + 0.5)
    assert lightly_loaded(msgspec.structs.replace(base, ledger=under), TH)


def test_the_typed_accessors_give_none_for_what_was_not_measured() -> None:
    from max_profile.model import Unavailable

    base = _base()
    gone = msgspec.structs.replace(
        base, kernels=Unavailable("off"), step_summary=Unavailable("off"), ledger=Unavailable("off")
    )
    assert kern(gone) is None and step_summary(gone) is None and ledger_phase(gone, "decode") is None
    assert kern(base) is base.kernels and step_summary(base) is base.step_summary
    lg = base.ledger
    assert isinstance(lg, StepLedger)
    decode = ledger_phase(base, "decode")
    assert decode is not None and decode.phase == "decode"
    assert ledger_phase(base, "prefill") is not None and ledger_phase(base, "prefill").phase == "prefill"  # type: ignore[union-attr]
    assert ledger_phase(base, "mixed") is None


def test_worst_lever_pct_and_phase_lever_of_a_phase() -> None:
    from max_profile.analyze.rules.base import phase_lever
    from max_profile.model import LedgerRow

    base = _base()
    lg = base.ledger
    assert isinstance(lg, StepLedger)
    p = next(x for x in lg.phases if x.phase == "decode")
    rows = [
        LedgerRow(part="matmul", kind="kernels", ms_per_step=0.5, share_pct=50.0, recoverable_ms_per_step=0.1234),
        LedgerRow(part="attention", kind="kernels", ms_per_step=0.2, share_pct=20.0, recoverable_ms_per_step=None),
        LedgerRow(part="GPU idle before graphs", kind="idle", ms_per_step=0.05, share_pct=5.0),
        LedgerRow(part="GPU idle between launches", kind="idle", ms_per_step=0.0625, share_pct=6.25),
    ]
    phase = msgspec.structs.replace(p, rows=rows, step_ms=0.8)
    assert worst_lever_pct(phase) == pytest.approx(100 * 0.1234 / 0.8, rel=1e-12)  # 0.1234 > 0.05 + 0.0625
    idle_heavy = msgspec.structs.replace(
        phase, rows=[*rows[:2], rows[2], msgspec.structs.replace(rows[3], ms_per_step=0.1)]
    )
    assert worst_lever_pct(idle_heavy) == pytest.approx(100 * 0.15 / 0.8, rel=1e-12)
    assert worst_lever_pct(msgspec.structs.replace(phase, step_ms=0.0)) == 0.0
    lever = phase_lever(phase, "matmul", 0.123456)
    assert (lever.phase, lever.part, lever.ms_per_step, lever.pct_of_step) == ("decode", "matmul", 0.1235, 15.4)
    assert phase_lever(msgspec.structs.replace(phase, step_ms=0.0), "matmul", 0.1).pct_of_step == 0.0


def test_findings_are_ranked_by_severity_then_what_fixing_them_buys() -> None:
    """The engine's ranking, on findings a registered rule returns in the worst order: errors, then warnings, then
    info; inside each, the findings with a lever by the ms they buy over the capture, most first, then those without
    one in rule order."""
    from max_profile.analyze.rules import RuleSpec, evaluate_rules
    from max_profile.model import Finding, Lever

    def f(fid: str, severity: str, total_ms: float | None) -> Finding:
        lever = (
            Lever(phase="decode", part="x", ms_per_step=1.0, pct_of_step=1.0, total_ms=total_ms)
            if total_ms is not None
            else None
        )
        return Finding(id=fid, severity=severity, title=fid, evidence={}, confidence=0.5, lever=lever)  # type: ignore[arg-type]

    emitted = [
        f("info-no-lever-1", "info", None),
        f("info-small", "info", 2.0),
        f("warning-no-lever", "warning", None),
        f("info-no-lever-2", "info", None),
        f("info-big", "info", 50.0),
        f("warning-lever", "warning", 0.5),
        f("error", "error", None),
        f("info-zero-lever", "info", 0.0),  # a lever that buys nothing still ranks above no lever
    ]
    rule = RuleSpec("test", lambda report, th: list(emitted), tuple(x.id for x in emitted), ())
    from max_profile.model import Capture, Environment

    empty = Report(environment=Environment(vendor="none", vendor_reason="test"), capture=Capture(started_unix_s=0.0))
    found, skipped = evaluate_rules(empty, rules=(rule,))
    assert skipped == []
    assert [x.id for x in found] == [
        "error",
        "warning-lever",
        "warning-no-lever",
        "info-big",
        "info-small",
        "info-zero-lever",
        "info-no-lever-1",
        "info-no-lever-2",
    ]
