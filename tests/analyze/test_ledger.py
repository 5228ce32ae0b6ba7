"""The step ledger and the verdicts read off it: parts that add up (checked against a count made here from the raw
records), levers ranked by what they buy, severity by size with its boundary pinned, no contradictions, load before any
load verdict, and next commands that reproduce the capture (parsed with the CLI's own parser).

The step ledger's helpers at their edges, each against a truth computed here: the covered length before a time
(brute force over merged intervals), the roofs of a GPU with and without a compute peak, the server-metrics ledger
field by field with figures whose every rounding shows."""

from __future__ import annotations

import random
import re
import shlex
from pathlib import Path

import msgspec
import numpy as np
import pytest

from max_profile.analyze.breakdown import coverage_before as _coverage
from max_profile.analyze.families import classify_kernel
from max_profile.analyze.ledger import roofs_for, server_ledger
from max_profile.analyze.report import build_report
from max_profile.analyze.roofline import PEAK_DENSE_FLOPS, PEAK_DRAM_BYTES_PER_S
from max_profile.analyze.steps import PhaseShape
from max_profile.analyze.thresholds import Thresholds
from max_profile.flags import build_parser
from max_profile.model import (
    Capture,
    Command,
    KernelRecord,
    KernelTable,
    LoadWindow,
    RawCapture,
    Report,
    RequestRecord,
    ServerMetrics,
    Step,
    StepLedger,
    Unavailable,
    UtilizationSample,
    Workload,
)
from max_profile.model.command_text import cli

from ..analyze.rules.test_rules import GPU_ENV, finding, ids

H200 = Path(__file__).parents[1] / "data" / "gpu"
RUN_FIXTURES = [
    "h200_llama5b_every_verb/run_b32_raw.json.gz",
    "h200_llama5b_every_verb/run_b1_raw.json.gz",
    "h200_llama5b_every_verb/run_fp8_raw.json.gz",
    "h200_llama5b_fp8_batch32_serve/run_b32_raw.json.gz",
    "h200_llama5b_fp8_batch32_serve/run_fp8_raw.json.gz",
    "h200_llama5b_serve_steps_startup/run_b1_raw.json.gz",
    "h200_llama5b_serve_steps_startup/demo_raw.json.gz",
    "h200_llama1.75b_custom_architectures/arch_a_raw.json.gz",
    "h200_llama1.75b_custom_architectures/arch_b_raw.json.gz",
    "h200_llama1.75b_custom_architectures/arch_c_raw.json.gz",
    "h200_llama180m_host_bound/small_cupti_raw.json.gz",
    "h200_llama7b_gemv_decode/big_cupti_raw.json.gz",
]


def _raw(name: str) -> RawCapture:
    return RawCapture.load(str(H200 / name))


@pytest.fixture(scope="module")
def reports() -> dict[str, tuple[RawCapture, Report]]:
    out = {}
    for name in RUN_FIXTURES:
        raw = _raw(name)
        out[name] = (raw, build_report(raw))
    return out


# ---------------------------------------------------------------------------------------------
# The account adds up


def test_parts_add_up_to_the_step_and_the_window(reports: dict[str, tuple[RawCapture, Report]]) -> None:
    for name, (_raw_capture, report) in reports.items():
        lg = report.ledger
        assert isinstance(lg, StepLedger), (name, lg)
        for p in lg.phases:
            assert sum(r.ms_per_step for r in p.rows) == pytest.approx(p.step_ms, rel=1e-3), (name, p.phase)
            for r in p.rows:
                if r.ideal_ms_per_step is not None and r.recoverable_ms_per_step is not None:
                    assert r.recoverable_ms_per_step == pytest.approx(
                        max(r.ms_per_step - r.ideal_ms_per_step, 0.0), abs=1e-5
                    )
        # each phase's time (busy + idle inside its steps) and the time outside steps fill the window, nothing twice
        accounted = sum(sum(r.ms_per_step for r in p.rows) * p.steps for p in lg.phases) + lg.outside_steps_ms
        assert accounted == pytest.approx(lg.window_ms, rel=2e-3), name


def _decode_idle_independently(raw: RawCapture) -> float:
    """GPU idle inside the decode steps per step, counted here: the window reaches to the end of the steps' kernels, the
    gaps between merged kernel intervals are intersected with the decode steps' intervals, summed."""
    k = raw.kernels
    steps = sorted((s for s in raw.steps if s.batch_size > 0), key=lambda s: s.start_ns)
    start, end = np.sort(k.start_ns), k.end_ns[np.argsort(k.start_ns)]
    gaps, reach = [], int(start[0])
    for a, b in zip(start.tolist(), end.tolist(), strict=True):
        if a > reach:
            gaps.append((reach, a))
        reach = max(reach, b)
    decode = [(s.start_ns, s.end_ns) for s in steps if s.phase == "decode"]
    idle = 0
    for g0, g1 in gaps:
        for s0, s1 in decode:
            idle += max(0, min(g1, s1) - max(g0, s0))
    return idle / 1e6 / len(decode)


@pytest.mark.parametrize(
    "name",
    [
        "h200_llama5b_serve_steps_startup/demo_raw.json.gz",
        "h200_llama1.75b_custom_architectures/arch_a_raw.json.gz",
        "h200_llama5b_every_verb/run_b1_raw.json.gz",
    ],
)
def test_decode_idle_matches_a_count_from_the_raw_records(
    reports: dict[str, tuple[RawCapture, Report]], name: str
) -> None:
    raw, report = reports[name]
    lg = report.ledger
    assert isinstance(lg, StepLedger)
    decode = next(p for p in lg.phases if p.phase == "decode")
    idle = sum(r.ms_per_step for r in decode.rows if r.kind == "idle")
    assert idle == pytest.approx(_decode_idle_independently(raw), rel=0.01, abs=2e-4)


# ---------------------------------------------------------------------------------------------
# Levers: ranked, sized, never contradicted


def _lever_ids(report: Report) -> list[str]:
    return [f.id for f in report.findings if f.lever is not None]


def test_findings_are_ranked_by_what_fixing_them_buys(reports: dict[str, tuple[RawCapture, Report]]) -> None:
    order = {"error": 0, "warning": 1, "info": 2}
    for name, (_raw_capture, report) in reports.items():
        keys = [
            (order[f.severity], 0 if f.lever else 1, -(f.lever.total_ms if f.lever else 0)) for f in report.findings
        ]
        assert keys[: len(keys)] == sorted(keys), name
        for f in report.findings:
            if f.lever is not None and f.id != "lightly-loaded":
                assert f.lever.ms_per_step > 0 and f.lever.total_ms >= f.lever.ms_per_step - 1e-9, (name, f.id)


def test_no_two_findings_contradict(reports: dict[str, tuple[RawCapture, Report]]) -> None:
    healthy = {"healthy-dense-decode", "healthy-batched-decode", "healthy-moe"}
    for name, (_raw_capture, report) in reports.items():
        found = ids(report)
        decode_warnings = [
            f for f in report.findings if f.severity == "warning" and f.lever is not None and f.lever.phase == "decode"
        ]
        assert not (found & healthy and decode_warnings), (name, found)
        assert not {"host-bound", "gpu-bound"} <= found, name
        assert not {"lightly-loaded", "host-bound"} <= found and not {"lightly-loaded", "gpu-idle"} <= found, name
        assert not ({"matmul-slow-path", "low-bit-normal"} <= found), name


def _idle_capture(busy_ms: float, idle_ms: float, steps: int = 40, graphs: bool = False) -> RawCapture:
    """Decode steps of ``busy_ms`` kernel time followed by ``idle_ms`` of GPU idle inside the step (one gemv per
    step)."""
    out, kernels = [], []
    t = 1_000_000
    for i in range(steps + 1):
        phase = "prefill" if i == 0 else "decode"
        dur = int((busy_ms + idle_ms) * 1e6)
        out.append(
            Step(
                index=i,
                phase=phase,
                batch_size=1,
                input_tokens=16 if i == 0 else 1,
                context_tokens=0 if i == 0 else 16 + i,
                start_ns=t,
                end_ns=t + dur,
                output_tokens=1,
            )
        )
        k0 = t + int(idle_ms * 1e6)  # the host prepares, then launches: the gap ends at the step's kernels
        k1 = k0 + int(0.9 * busy_ms * 1e6)
        kernels.append(
            KernelRecord(
                name="gemv_split_k_bf16_128_0123456789abcdef",
                start_ns=k0,
                end_ns=k1,
                launch_ns=t + 10,
                graph_id=7 if graphs else None,
            )
        )
        kernels.append(
            KernelRecord(
                name="sm90_mha_depth128_0123456789abcdef",
                start_ns=k1,
                end_ns=k0 + int(busy_ms * 1e6),
                launch_ns=t + 20,
                graph_id=7 if graphs else None,
            )
        )
        t += dur
    return RawCapture(
        environment=GPU_ENV,
        capture=Capture(started_unix_s=0.0, target="OverlapTextGenerationPipeline"),
        steps=out,
        kernels=kernels,
        kernel_source="synthetic",
        utilization_unavailable=Unavailable("test: no samples"),
    )


def test_idle_lever_severity_boundary_at_lever_warning_pct() -> None:
    """GPU idle of 14 % of the decode step is an info lever, 16 % a warning (Thresholds.lever_warning_pct = 15); both
    name the time in ms; a busy share under 40 % is host-bound, and graph-kernel gaps are a late graph launch."""
    just_under = build_report(_idle_capture(0.86, 0.14))
    f = finding(just_under, "gpu-idle")
    assert f.severity == "info" and f.lever is not None and f.lever.ms_per_step == pytest.approx(0.14, abs=1e-3)
    assert f.lever.pct_of_step == pytest.approx(14.0, abs=0.2)
    over = build_report(_idle_capture(0.84, 0.16))
    assert finding(over, "gpu-idle").severity == "warning"
    assert (
        finding(
            build_report(_idle_capture(0.84, 0.16), thresholds=Thresholds(lever_warning_pct=17)), "gpu-idle"
        ).severity
        == "info"
    )
    assert "gpu-idle" not in ids(build_report(_idle_capture(0.96, 0.04)))  # under lever_info_pct (5 %): ledger only
    host = finding(build_report(_idle_capture(0.39, 0.61)), "host-bound")  # busy 39 % < host_bound_busy_pct 40
    assert host.severity == "warning" and host.evidence["gpu_busy_pct"] == pytest.approx(39.0, abs=0.2)
    assert "host-bound" not in ids(build_report(_idle_capture(0.41, 0.59)))  # busy 41 %: idle, not host-bound
    assert finding(build_report(_idle_capture(0.41, 0.59)), "gpu-idle").severity == "warning"
    late = finding(build_report(_idle_capture(0.8, 0.2, graphs=True)), "graph-launch-late")
    assert late.evidence["idle_before_graph_launch_ms_per_step"] == pytest.approx(0.2, abs=1e-3)


def test_one_step_phases_get_info_levers_only() -> None:
    """The single prefill step of a generation idles 70 % here: a one-off (TTFT), not a pattern: info, ranked by its
    total."""
    raw = _idle_capture(0.8, 0.1)
    shift = int(1.1e6)  # the prefill step grows from 0.9 to 2.0 ms: everything after it moves on
    steps = [raw.steps[0]] + [
        msgspec.structs.replace(s, start_ns=s.start_ns + shift, end_ns=s.end_ns + shift) for s in raw.steps[1:]
    ]
    steps[0] = msgspec.structs.replace(steps[0], end_ns=steps[0].start_ns + int(2.0e6))
    kernels = raw.kernels.records()
    kernels = kernels[:2] + [
        msgspec.structs.replace(
            k, start_ns=k.start_ns + shift, end_ns=k.end_ns + shift, launch_ns=(k.launch_ns or 0) + shift
        )
        for k in kernels[2:]
    ]
    kernels[0] = msgspec.structs.replace(
        kernels[0], start_ns=steps[0].start_ns + int(1.4e6), end_ns=steps[0].start_ns + int(1.9e6)
    )
    kernels[1] = msgspec.structs.replace(
        kernels[1], start_ns=steps[0].start_ns + int(1.9e6), end_ns=steps[0].start_ns + int(2.0e6)
    )
    report = build_report(msgspec.structs.replace(raw, steps=steps, kernels=kernels))
    f = finding(report, "host-bound", phase="prefill")
    assert f.severity == "info" and f.lever is not None and f.lever.total_ms == pytest.approx(1.4, abs=0.01)


def test_healthy_only_where_no_lever_at_warning_size_remains() -> None:
    assert "healthy-dense-decode" in ids(build_report(_idle_capture(0.96, 0.04)))
    assert "healthy-dense-decode" not in ids(build_report(_idle_capture(0.84, 0.16)))


# ---------------------------------------------------------------------------------------------
# Load first


def _samples(pct: float, seconds: float, start_ns: int) -> list[UtilizationSample]:
    return [
        UtilizationSample(
            t_ns=start_ns + int(i * 0.1e9), gpu="nv0", utilization_pct=pct, memory_used_bytes=1, memory_total_bytes=10
        )
        for i in range(int(seconds * 10))
    ]


def _attach_window(requests: int, request_s: float, window_s: float = 10.0) -> RawCapture:
    """An attach-style capture: NVML at 2.8 % over a 10 s window, ``requests`` sequential streams of ``request_s``
    each."""
    w0 = 10_000_000_000
    recs = [
        RequestRecord(
            started_ns=w0 + int(i * request_s * 1e9),
            ended_ns=w0 + int((i + 1) * request_s * 1e9) - 1,
            ok=True,
            tokens=64,
            ttft_ms=20.0,
            itl_ms=[3.0] * 63,
        )
        for i in range(requests)
    ]
    window = LoadWindow(concurrency=1, window_ns=(w0, w0 + int(window_s * 1e9)), requests=recs)
    return RawCapture(
        environment=GPU_ENV,
        capture=Capture(started_unix_s=0.0, target="attach http://127.0.0.1:8000"),
        samples=_samples(2.8, window_s, w0),
        load_windows=[window],
        window_ns=window.window_ns,
        requests=recs,
    )


def test_an_idle_server_is_lightly_loaded_not_host_bound() -> None:
    """An idle server: 3 probe requests in 10 s (in flight 6 % of the window), NVML 2.8 %: lightly loaded, with the
    request rate and in-flight share; no host-bound verdict. The same NVML reading with requests in flight all the time
    is host-bound, and the boundary is Thresholds.light_load_pct (50 %)."""
    idle = build_report(_attach_window(3, 0.2))
    f = finding(idle, "lightly-loaded", phase=None)
    assert f.evidence["loaded_pct"] == pytest.approx(6.0, abs=0.1) and f.evidence["requests_per_s"] == pytest.approx(
        0.3, abs=0.01
    )
    assert "host-bound" not in ids(idle) and f.severity == "info"
    busy = build_report(_attach_window(50, 0.2))
    assert "host-bound" in ids(busy) and "lightly-loaded" not in ids(busy)
    assert "lightly-loaded" in ids(build_report(_attach_window(24, 0.2)))  # 48 %
    assert "lightly-loaded" not in ids(build_report(_attach_window(26, 0.2)))  # 52 %


def test_a_run_mostly_outside_steps_is_lightly_loaded() -> None:
    """A generation loop that spends 70 % of the window between steps: lightly loaded, no idle verdict on its steps."""
    raw = _idle_capture(0.5, 0.5, steps=20)
    steps = [
        msgspec.structs.replace(s, start_ns=s.start_ns + i * 2_300_000, end_ns=s.end_ns + i * 2_300_000)
        for i, s in enumerate(raw.steps)
    ]
    kernels = [
        msgspec.structs.replace(
            k,
            start_ns=k.start_ns + i * 2_300_000,
            end_ns=k.end_ns + i * 2_300_000,
            launch_ns=(k.launch_ns or 0) + i * 2_300_000,
        )
        for i, k in enumerate(raw.kernels.records())
    ]
    report = build_report(msgspec.structs.replace(raw, steps=steps, kernels=kernels))
    lg = report.ledger
    assert isinstance(lg, StepLedger) and lg.outside_steps_pct > 50
    assert "lightly-loaded" in ids(report) and not ({"host-bound", "gpu-idle", "graph-launch-late"} & ids(report))


# ---------------------------------------------------------------------------------------------
# Slow paths by the roofline, and without a config by the kernel's own evidence


def test_fp8_trace_without_its_config_still_names_the_naive_fallback() -> None:
    """The H200 block-scaled FP8 run with its config and weights taken away (as an nsys / Kineto import arrives): the
    naive kernels are matmuls (gemm, not grouped_matmul: no experts), 99 % of decode; named as the fallback from their
    share, launch shape and name, a warning; no "low-bit weights at normal cost"."""
    raw = _raw("h200_llama5b_every_verb/run_fp8_raw.json.gz")
    bare = msgspec.structs.replace(
        raw,
        capture=msgspec.structs.replace(
            raw.capture, model_config=None, model_weights=None, model_path=None, target="import:capture.sqlite"
        ),
    )
    report = build_report(bare)
    f = finding(report, "matmul-slow-path")
    assert f.severity == "warning" and "naive FP8" in f.title and "not priced" in f.title
    assert (
        f.evidence["top_matmul_launch_shape"] == "grid 1x256x1 block 16x16x1"
        and float(f.evidence["share_of_kernel_time_pct"] or 0) > 95
    )  # type: ignore[arg-type]
    families = {r.family for r in report.kernels.families}  # type: ignore[union-attr]
    assert "low-bit-normal" not in ids(report) and "grouped_matmul" not in families


def test_grouped_matmul_is_for_groups_of_experts() -> None:
    assert classify_kernel("linalg_fp8_quantization_naive_6A6A6A6A_a2eaa9af27c8da6d") == "gemm"
    assert classify_kernel("grouped_matmul_kernel_sm90_bf16_0123456789abcdef") == "grouped_matmul"
    assert classify_kernel("fused_moe_kernel") == "grouped_matmul"


# ---------------------------------------------------------------------------------------------
# Next commands reproduce the capture


def _parse(cmd: Command) -> tuple[str, object]:
    line = cli(cmd).split("   # ")[0]
    words = shlex.split(line)
    assert words[0] == "max-profile"
    return words[1], build_parser().parse_args(words[1:])


def _commands(report: Report) -> list[Command]:
    cmds = [f.command for f in report.findings if f.command is not None]
    shells = [c for c in cmds if c.verb == "shell"]
    for c in shells:  # py-spy around a max-profile run: the run itself must parse
        inner = str(c.args["line"]).split(" -- ", 1)
        if len(inner) == 2 and inner[1].startswith("max-profile "):
            words = shlex.split(inner[1])
            cmds.append(Command(verb=words[1], args={}, positional=[], comment="parsed: " + inner[1]))
    if report.next_command is not None:
        cmds.append(report.next_command)
    return [c for c in cmds if c.verb != "shell"]


def _reproduces(report: Report, cmd: Command) -> None:
    if cmd.comment and cmd.comment.startswith("parsed: "):
        words = shlex.split(cmd.comment.removeprefix("parsed: ").split("   # ")[0])
        verb, args = words[1], build_parser().parse_args(words[1:])
    else:
        verb, args = _parse(cmd)
    c, w = report.capture, report.capture.workload or Workload()
    devices = getattr(args, "devices", None) or "gpu"
    assert args.model_path == c.model_path and devices == (c.devices or "gpu")  # type: ignore[attr-defined]
    if verb in ("run", "kernel", "kernels"):
        decode = [s for s in report.steps if s.phase == "decode" and s.batch_size > 0]
        median_batch = int(np.median([s.batch_size for s in decode]))
        assert args.batch_size == (w.batch_size or median_batch)  # type: ignore[attr-defined]
        assert args.max_new_tokens == (w.max_new_tokens or len(decode))  # type: ignore[attr-defined]
        assert (args.custom_architectures or []) == list(w.custom_architectures)  # type: ignore[attr-defined]
        if w.prompt:
            assert args.prompt == w.prompt  # type: ignore[attr-defined]
    if verb in ("run", "kernels") and c.device_graph_capture is not None:
        assert args.device_graph_capture is c.device_graph_capture  # type: ignore[attr-defined]


def _launches_land_in(raw: RawCapture, report: Report, cmd: Command, phase: str) -> None:
    """Replay ncu's selection on the capture's own launches: kernels whose name the regex matches, in launch order,
    skip K, take N; each must be one the steps of ``phase`` launched."""
    _verb, args = _parse(cmd)
    pattern = re.compile(args.name)  # type: ignore[attr-defined]
    k = raw.kernels
    t = k.attribution_time()
    matched = np.array([bool(pattern.search(n)) for n in k.names])[k.name_idx]
    order = np.argsort(t[matched], kind="stable")
    picked = t[matched][order][args.launch_skip : args.launch_skip + args.launches]  # type: ignore[attr-defined]
    assert len(picked) == args.launches  # type: ignore[attr-defined]
    steps = [s for s in raw.steps if s.batch_size > 0 and s.phase == phase]
    for when in picked.tolist():
        assert any(s.start_ns <= when <= s.end_ns for s in steps), (cmd, when)


def test_every_suggested_command_reproduces_the_capture(reports: dict[str, tuple[RawCapture, Report]]) -> None:
    seen = 0
    for _raw_capture, report in reports.values():
        for cmd in _commands(report):
            _reproduces(report, cmd)
            seen += 1
    assert seen >= 10


def test_a_deep_dive_lands_in_the_phase_its_finding_is_about(reports: dict[str, tuple[RawCapture, Report]]) -> None:
    """The H200 batch-32 run: the matmul lever's deep dive keeps the batch and skips the prefill
    launches of the same kernel (97 here) plus two decode steps: every profiled launch is a decode launch."""
    raw, report = reports["h200_llama5b_every_verb/run_b32_raw.json.gz"]
    f = finding(report, "matmul-below-roofline")
    assert f.command is not None and f.command.verb == "kernel" and f.command.args["batch_size"] == 32
    assert f.command.args["launch_skip"] == 97 + 2 * 97
    _launches_land_in(raw, report, f.command, "decode")
    pre = finding(report, "matmul-below-roofline", phase="prefill")
    assert pre.command is not None
    _launches_land_in(raw, report, pre.command, "prefill")
    for name in (
        "h200_llama5b_every_verb/run_fp8_raw.json.gz",
        "h200_llama1.75b_custom_architectures/arch_b_raw.json.gz",
        "h200_llama7b_gemv_decode/big_cupti_raw.json.gz",
    ):
        raw, report = reports[name]
        for f in report.findings:
            if f.command is not None and f.command.verb == "kernel" and f.lever is not None:
                _launches_land_in(raw, report, f.command, f.lever.phase)


# ---------------------------------------------------------------------------------------------
# Without a kernel timeline: the server's own batch metrics (attach, serve --mode utilization)


def test_server_metrics_ledger_on_a_recorded_cpu_sweep() -> None:
    """`serve --concurrency 1,2` on the CPU (tests/data/cpu): no kernels, the server's CE / TG batch counts and mean
    execution times are the steps; requests in flight and the request rate come from the client's records."""
    raw = RawCapture.load(str(Path(__file__).parents[1] / "data" / "cpu" / "serve_sweep_c1_c2_raw.json.gz"))
    report = build_report(raw)
    lg = report.ledger
    m = report.server_metrics
    assert isinstance(lg, StepLedger) and lg.source == "server metrics" and m is not None
    phases = {p.phase: p for p in lg.phases}
    assert (phases["prefill"].steps, phases["decode"].steps) == (round(m.batches["CE"]), round(m.batches["TG"]))
    assert phases["prefill"].step_ms == pytest.approx(m.batch_execution_ms_mean["CE"]) and phases[
        "decode"
    ].step_ms == pytest.approx(m.batch_execution_ms_mean["TG"])
    assert phases["decode"].batch == round(m.batch_size_mean or 0) and phases["prefill"].batch is None
    w0, w1 = raw.load_windows[-1].window_ns
    inside = m.batches["CE"] * m.batch_execution_ms_mean["CE"] + m.batches["TG"] * m.batch_execution_ms_mean["TG"]
    assert lg.window_ms == pytest.approx((w1 - w0) / 1e6) and lg.outside_steps_ms == pytest.approx(
        max((w1 - w0) / 1e6 - inside, 0.0), abs=1e-3
    )
    spans = sorted(
        (max(r.started_ns, w0), min(r.ended_ns, w1))
        for r in raw.load_windows[-1].requests
        if r.ended_ns >= w0 and r.started_ns <= w1
    )
    covered, reach = 0, w0
    for a, b in spans:
        covered += max(0, b - max(a, reach))
        reach = max(reach, b)
    assert lg.requests_in_flight_pct == pytest.approx(100 * covered / (w1 - w0), abs=0.01)
    done = sum(1 for r in raw.load_windows[-1].requests if r.ok and w0 <= r.ended_ns <= w1)
    assert lg.request_rate_rps == pytest.approx(done / ((w1 - w0) / 1e9), rel=1e-3)
    for p in lg.phases:
        assert (
            [r.share_pct for r in p.rows] == [100.0] and p.busy_pct == 100.0 and "not priced" in (p.rows[0].basis or "")
        )


def test_server_metrics_ledger_of_an_idle_window() -> None:
    """Synthetic metrics: 10 TG batches of 5 ms and 2 CE batches of 20 ms in a 1 s window: 90 ms inside batches, 910 ms
    (91 %) outside them; a server without batch metrics gives no ledger."""
    from max_profile.analyze.ledger import server_ledger
    from max_profile.model import LoadWindow, ServerMetrics

    window = LoadWindow(concurrency=1, window_ns=(0, 1_000_000_000), requests=[])
    m = ServerMetrics(
        url="u",
        window_s=1.0,
        batches={"CE": 2.0, "TG": 10.0},
        batch_execution_ms_mean={"CE": 20.0, "TG": 5.0},
        batch_size_mean=3.0,
    )
    lg = server_ledger(m, window)
    assert (
        lg is not None
        and lg.window_ms == pytest.approx(1000.0)
        and lg.outside_steps_ms == pytest.approx(910.0)
        and lg.outside_steps_pct == 91.0
    )
    assert [(p.phase, p.steps, p.step_ms, p.batch) for p in lg.phases] == [
        ("prefill", 2, 20.0, None),
        ("decode", 10, 5.0, 3),
    ]
    # no request of ours in the window: its in-flight share is not known (the server's batches say its load)
    assert lg.requests_in_flight_pct is None and lg.request_rate_rps is None
    assert server_ledger(msgspec.structs.replace(m, batches={}), window) is None
    assert server_ledger(msgspec.structs.replace(m, unavailable="refused"), window) is None
    only_tg = server_ledger(msgspec.structs.replace(m, batches={"TG": 10.0}), window)
    assert (
        only_tg is not None
        and [p.phase for p in only_tg.phases] == ["decode"]
        and only_tg.outside_steps_ms == pytest.approx(950.0)
    )


def test_host_ops_on_a_cpu_name_the_time_between_ops() -> None:
    """MAX's op ranges on a CPU: ops cover 20 % of each 1 ms step; the other 80 % (0.8 ms) is host time between ops, an
    info finding with its lever; at 42 % coverage the other verdict (ops-bound), at 38 % again this one (the host-bound
    threshold, 40 %, is the boundary): every phase gets exactly one of the two."""
    from max_profile.model import Environment

    from ..analyze.rules.test_rules import synthetic

    def ops(cover: float, th: Thresholds | None = None) -> Report:
        raw = synthetic([1.0] * 41, [[("matmulmo.matmul", 0.9 * cover), ("mo.mha.ragged.paged", 0.1 * cover)]] * 41)
        return build_report(
            msgspec.structs.replace(
                raw,
                environment=Environment(vendor="none", vendor_reason="test"),
                kernel_source="nvtx-log (MAX op ranges, host time)",
            ),
            thresholds=th,
        )

    report = ops(0.2)
    lg = report.ledger
    assert isinstance(lg, StepLedger) and lg.source == "op ranges (host)"
    f = finding(report, "host-time-between-ops")
    assert f.severity == "info" and f.lever is not None
    assert f.lever.ms_per_step == pytest.approx(0.8, abs=0.002) and f.lever.pct_of_step == pytest.approx(80.0, abs=0.3)
    assert f.evidence["ops_cover_pct"] == pytest.approx(20.0, abs=0.3) and f.evidence[
        "between_ops_ms_per_step"
    ] == pytest.approx(0.8, abs=0.002)
    assert "80 %" in f.title and f.command is not None and "--kernels off" in str(f.command.args["line"])
    assert "host-time-between-ops" not in ids(ops(0.42)) and "host-time-between-ops" in ids(ops(0.38))
    for cover in (0.05, 0.38, 0.42, 0.95):  # one verdict on every phase, whichever side of the threshold
        verdicts = [f for f in ops(cover).findings if f.id in ("host-time-between-ops", "ops-bound")]
        assert sorted(str(f.evidence["phase"]) for f in verdicts) == sorted(p.phase for p in lg.phases), cover
        assert all(f.id == ("ops-bound" if cover > 0.4 else "host-time-between-ops") for f in verdicts), cover
    assert "host-time-between-ops" in ids(ops(0.395)) and "ops-bound" not in ids(ops(0.395))  # 39.5 % is under 40
    at_threshold = ops(0.5, Thresholds(host_bound_busy_pct=50.0))  # 50 % cover exactly (0.5 ms of 1 ms): ops-bound
    assert "ops-bound" in ids(at_threshold) and "host-time-between-ops" not in ids(at_threshold)
    bound = finding(ops(0.42), "ops-bound")
    assert bound.evidence["ops_cover_pct"] == pytest.approx(42.0, abs=0.3) and "42 %" in bound.title
    assert bound.evidence["top_part"] == "matmul: gemm" and "matmul: gemm first" in bound.title
    assert all(
        r.ideal_ms_per_step is None for p in lg.phases for r in p.rows if r.kind == "kernels"
    )  # nothing priced on a CPU


def test_ops_bound_names_the_largest_part_and_op_of_each_phase() -> None:
    """Ops covering 60 % of each 1 ms step (a matmul op 54 %, attention 6 %): per phase one ops-bound verdict, every
    figure from the step's own account: cover, step, the largest part and its op; no lever (nothing priced on a CPU:
    what fixing it buys is not known) and no command (the op table is the next read)."""
    from ..analyze.rules.test_finding_ids import _ops_on_cpu

    report = _ops_on_cpu(0.6)
    bound = sorted((f for f in report.findings if f.id == "ops-bound"), key=lambda f: str(f.evidence["phase"]))
    assert [f.evidence["phase"] for f in bound] == ["decode", "prefill"]
    for f, steps in zip(bound, (40, 1), strict=True):
        assert f.evidence == {
            "phase": f.evidence["phase"],
            "steps": steps,
            "ops_cover_pct": pytest.approx(60.0, abs=0.05),
            "step_ms": pytest.approx(1.0, abs=1e-4),
            "top_part": "matmul: gemm",
            "top_part_ms_per_step": pytest.approx(0.54, abs=1e-4),
            "top_op": "matmulmo.matmul",
            "threshold_pct": 40.0,
        }
        assert f.severity == "info" and f.confidence == 0.7 and f.lever is None and f.command is None
        assert "The op table says which ops take the time" in (f.next_step or "")
    assert bound[0].title == (
        "MAX's ops ran 60 % of each decode step (1.00 ms): the ops' own work sets the speed, matmul: gemm first "
        "(54 % of the step)"
    )
    assert bound[1].title.startswith("MAX's ops ran 60 % of the prefill step (1.00 ms)")


# ---------------------------------------------------------------------------------------------
# The account on a timeline drawn by hand (µs): every part known


def _hand_timeline(second_device: bool = False) -> RawCapture:
    """A prefill step 0-10,000 µs (gemm 2,000-8,000, norm 8,000-9,000) and three decode steps of 2,000 µs with 500 µs
    between them; each decode step launches a graph gemv 500 µs in (1,000 µs) and a graph attention after it (200 µs);
    a sampling kernel launched between the first two decode steps runs 12,200-12,300. The account, by hand:

    prefill: gemm 6.0 + norm 1.0 ms busy; idle 2.0 ms before the gemm (between launches) and 1.0 ms before the first
    decode graph kernel (the gap ends at a graph kernel); decode per step: gemv 1.0 + attention 0.2 ms, idle before
    graph kernels 1.8 ms and between launches 0.6 ms over the three steps (the gap after the first step ends at the
    sampling kernel); outside the steps: 0.9 ms idle + 0.1 ms of the sampling kernel, of a 17 ms window."""
    us = 1_000
    steps = [
        Step(
            index=0,
            phase="prefill",
            batch_size=1,
            input_tokens=20,
            context_tokens=0,
            start_ns=0,
            end_ns=10_000 * us,
            output_tokens=1,
        )
    ]
    kernels = [
        KernelRecord(
            name="sm90_matmul_bfloat16_0123456789abcdef",
            start_ns=2_000 * us,
            end_ns=8_000 * us,
            launch_ns=100 * us,
            graph_id=0,
        ),
        KernelRecord(
            name="rms_norm_fused_residual_0123456789abcdef",
            start_ns=8_000 * us,
            end_ns=9_000 * us,
            launch_ns=200 * us,
            graph_id=0,
        ),
    ]
    for i, start in enumerate((10_000, 12_500, 15_000)):
        steps.append(
            Step(
                index=i + 1,
                phase="decode",
                batch_size=1,
                input_tokens=1,
                context_tokens=20 + i,
                start_ns=start * us,
                end_ns=(start + 2_000) * us,
                output_tokens=1,
            )
        )
        kernels.append(
            KernelRecord(
                name="gemv_split_k_bf16_0123456789abcdef",
                start_ns=(start + 500) * us,
                end_ns=(start + 1_500) * us,
                launch_ns=(start + 10) * us,
                graph_id=1,
            )
        )
        kernels.append(
            KernelRecord(
                name="sm90_mha_depth128_0123456789abcdef",
                start_ns=(start + 1_500) * us,
                end_ns=(start + 1_700) * us,
                launch_ns=(start + 20) * us,
                graph_id=1,
            )
        )
    kernels.append(
        KernelRecord(
            name="topk_topp_sampling_0123456789abcdef",
            start_ns=12_200 * us,
            end_ns=12_300 * us,
            launch_ns=12_150 * us,
            graph_id=0,
        )
    )
    if second_device:
        kernels.append(
            KernelRecord(
                name="gemv_split_k_bf16_0123456789abcdef",
                start_ns=3_000 * us,
                end_ns=3_100 * us,
                launch_ns=150 * us,
                device=1,
                graph_id=0,
            )
        )
    from max_profile.model import Capture

    return RawCapture(
        environment=GPU_ENV,
        capture=Capture(started_unix_s=0.0),
        steps=steps,
        kernels=kernels,
        kernel_source="synthetic",
        utilization_unavailable=Unavailable("test: no samples"),
    )


def _rows(p: object) -> dict[str, float]:
    return {r.part: round(r.ms_per_step, 6) for r in p.rows}  # type: ignore[attr-defined]


def test_a_timeline_drawn_by_hand_is_accounted_exactly() -> None:
    report = build_report(_hand_timeline())
    lg = report.ledger
    assert isinstance(lg, StepLedger) and lg.source == "kernel timeline" and lg.device == 0 and lg.notes == []
    pre, dec = lg.phases
    assert (pre.phase, pre.steps, pre.step_ms, pre.batch, pre.tokens_per_step) == ("prefill", 1, 10.0, 1, 20.0)
    assert _rows(pre) == {
        "matmul: gemm": 6.0,
        "norm": 1.0,
        "GPU idle: waiting for a device-graph launch": 1.0,
        "GPU idle: between launches": 2.0,
    }
    assert (dec.phase, dec.steps, dec.step_ms, dec.batch, dec.tokens_per_step) == ("decode", 3, 2.0, 1, 1.0)
    assert _rows(dec) == {
        "matmul: gemv": 1.0,
        "attention": 0.2,
        "GPU idle: waiting for a device-graph launch": 0.6,
        "GPU idle: between launches": 0.2,
    }
    assert pre.busy_pct == 70.0 and dec.busy_pct == 60.0
    assert pre.host_step_p50_ms == 10.0 and dec.host_step_p50_ms == 2.0
    assert [r.kernels_per_step for r in dec.rows if r.kind == "kernels"] == [1.0, 1.0]
    assert [r.share_pct for r in dec.rows] == [50.0, 10.0, 30.0, 10.0]
    assert (
        lg.window_ms == 17.0
        and lg.outside_steps_ms == pytest.approx(1.0)
        and lg.outside_kernels_ms == pytest.approx(0.1)
    )
    assert lg.outside_steps_pct == pytest.approx(100 / 17, abs=0.01)
    # nothing priced (no model config): recoverable is the idle time alone, no ideal for the phase
    assert (
        pre.ideal_ms_per_step is None
        and pre.recoverable_ms_per_step == pytest.approx(3.0)
        and dec.recoverable_ms_per_step == pytest.approx(0.8)
    )
    assert all(
        r.ideal_ms_per_step is None and r.recoverable_ms_per_step is None
        for p in lg.phases
        for r in p.rows
        if r.kind == "kernels"
    )
    assert all(
        r.ideal_ms_per_step == 0.0 and r.recoverable_ms_per_step == r.ms_per_step
        for p in lg.phases
        for r in p.rows
        if r.kind == "idle"
    )
    assert lg.attainable_bandwidth_pct is None and lg.requests_in_flight_pct is None


def test_the_busiest_device_is_accounted_and_said() -> None:
    lg = build_report(_hand_timeline(second_device=True)).ledger
    assert (
        isinstance(lg, StepLedger)
        and lg.device == 0
        and lg.notes == ["the timeline of device 0 is accounted (the busiest of 2)"]
    )
    assert _rows(lg.phases[0])["matmul: gemm"] == 6.0  # device 1's kernel is not in device 0's account


def test_a_sampled_recording_accounts_only_its_slices() -> None:
    """Kernels recorded only in slices 10,000-12,000 and 15,000-17,000 µs (the first and last decode steps): two decode
    steps observed, each the same 2.0 ms account; the prefill and the time between steps were not observed."""
    raw = _hand_timeline()
    raw.recorded_spans = [(10_000_000, 12_000_000), (15_000_000, 17_000_000)]
    keep = [k for k in raw.kernels.records() if any(a <= k.start_ns < b for a, b in raw.recorded_spans)]
    raw = msgspec.structs.replace(raw, kernels=keep)
    raw.recorded_spans = [(10_000_000, 12_000_000), (15_000_000, 17_000_000)]
    lg = build_report(raw).ledger
    assert isinstance(lg, StepLedger) and [p.phase for p in lg.phases] == ["decode"]
    dec = lg.phases[0]
    assert dec.steps == 2 and dec.step_ms == 2.0 and lg.window_ms == 4.0 and lg.outside_steps_ms == 0.0
    assert _rows(dec) == {
        "matmul: gemv": 1.0,
        "attention": 0.2,
        "GPU idle: waiting for a device-graph launch": 0.5,
        "GPU idle: between launches": 0.3,
    }


def test_a_phase_ideal_sums_priced_ideals_and_unpriced_actuals(reports: dict[str, tuple[RawCapture, Report]]) -> None:
    for name, (_raw_capture, report) in reports.items():
        lg = report.ledger
        assert isinstance(lg, StepLedger)
        for p in lg.phases:
            kernels = [r for r in p.rows if r.kind == "kernels"]
            priced = [r for r in kernels if r.ideal_ms_per_step is not None]
            if priced:
                expected = sum(r.ideal_ms_per_step or 0.0 for r in priced) + sum(
                    r.ms_per_step for r in kernels if r.ideal_ms_per_step is None
                )
                assert p.ideal_ms_per_step == pytest.approx(expected, abs=1e-5), name
            else:
                assert p.ideal_ms_per_step is None, name
            assert p.recoverable_ms_per_step == pytest.approx(
                sum(r.recoverable_ms_per_step or 0.0 for r in p.rows), abs=1e-5
            ), name
            assert p.busy_pct == pytest.approx(100 * sum(r.ms_per_step for r in kernels) / p.step_ms, abs=0.01), name


@pytest.mark.parametrize("name", ["demo_ops_quiet_raw.json.gz", "demo_ops_loaded_raw.json.gz"])
def test_real_cpu_demos_get_one_verdict_per_phase_from_their_op_ranges(name: str) -> None:
    """`max-profile demo` on this project's CPU VM, quiet and beside four busy loops (tests/data/cpu/README.md): the
    prefill step is ops-bound, each decode step host time between ops, each figure the ledger's."""
    from max_profile.model import RawCapture

    report = build_report(RawCapture.load(str(Path(__file__).parents[1] / "data" / "cpu" / name)))
    lg = report.ledger
    assert isinstance(lg, StepLedger) and lg.source == "op ranges (host)"
    verdicts = {str(f.evidence["phase"]): f for f in report.findings if f.id in ("ops-bound", "host-time-between-ops")}
    assert {ph: f.id for ph, f in verdicts.items()} == {"prefill": "ops-bound", "decode": "host-time-between-ops"}
    for p in lg.phases:
        between = sum(r.ms_per_step for r in p.rows if r.kind == "idle")
        cover = 100 - 100 * between / p.step_ms
        assert verdicts[p.phase].evidence["ops_cover_pct"] == round(cover, 1)
    top = max((r for r in lg.phases[0].rows if r.kind == "kernels"), key=lambda r: r.ms_per_step)
    assert verdicts["prefill"].evidence["top_part"] == top.part == "matmul: gemm"
    assert ("host-contention" in {f.id for f in report.findings}) == ("loaded" in name)


TH = Thresholds()


def covered_before(intervals: list[tuple[int, int]], t: int) -> int:
    """How many integer nanoseconds in [0, t) lie in at least one interval (each [a, b))."""
    return sum(1 for x in range(t) if any(a <= x < b for a, b in intervals))


@pytest.mark.parametrize("seed", range(6))
def test_coverage_counts_each_covered_nanosecond_once(seed: int) -> None:
    rng = random.Random(seed)
    intervals = []
    for _ in range(rng.randint(1, 6)):
        a = rng.randint(0, 80)
        intervals.append((a, a + rng.randint(0, 25)))
    f = _coverage(
        np.array([a for a, _ in intervals], dtype=np.int64), np.array([b for _, b in intervals], dtype=np.int64)
    )
    times = np.arange(0, 120, dtype=np.int64)
    got = f(times)
    assert got.dtype == np.float64 and got.shape == times.shape
    assert got.tolist() == [covered_before(intervals, int(t)) for t in times]


def test_coverage_of_no_interval_is_zero_everywhere() -> None:
    f = _coverage(np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    got = f(np.array([[5, 7], [9, 11]], dtype=np.int64))
    assert got.shape == (2, 2) and got.dtype == np.float64 and not got.any()


def test_roofs_of_a_gpu_with_both_peaks_for_either_operand() -> None:
    for operand in ("bf16", "fp8"):
        roofs = roofs_for("NVIDIA H200", operand, TH)
        assert roofs is not None
        bw, fl = PEAK_DRAM_BYTES_PER_S["H200"], PEAK_DENSE_FLOPS["H200"][operand]
        assert roofs.bandwidth == pytest.approx(bw * TH.attainable_bandwidth_pct / 100, rel=1e-12)
        assert roofs.compute == pytest.approx(fl * TH.attainable_compute_pct / 100, rel=1e-12)
        assert roofs.basis == (
            f"{TH.attainable_bandwidth_pct:g} % of 4.80 TB/s, {TH.attainable_compute_pct:g} % of "
            f"{round(fl / 1e12)} {operand} TFLOP/s"
        )
    # an operand the GPU has no peak for: its bf16 peak
    a100 = roofs_for("NVIDIA A100-SXM4-80GB", "fp8", TH)
    assert a100 is not None and a100.compute == pytest.approx(312e12 * TH.attainable_compute_pct / 100, rel=1e-12)


def test_roofs_of_a_gpu_without_a_compute_peak_price_bytes_only() -> None:
    no_compute = [
        g
        for g in PEAK_DRAM_BYTES_PER_S
        if g not in PEAK_DENSE_FLOPS and not any(g.startswith(k) or k.startswith(g) for k in PEAK_DENSE_FLOPS)
    ]
    assert no_compute, "the tables list a GPU with a bandwidth and no compute peak"
    roofs = roofs_for(f"NVIDIA {no_compute[0]}", "bf16", TH)
    assert roofs is not None and roofs.compute is None
    assert roofs.basis == f"{TH.attainable_bandwidth_pct:g} % of {PEAK_DRAM_BYTES_PER_S[no_compute[0]] / 1e12:.2f} TB/s"
    assert roofs_for("Some Unknown GPU", "bf16", TH) is None


def metrics(ce: float, tg: float, ce_ms: float, tg_ms: float, batch: float | None = 2.6) -> ServerMetrics:
    return ServerMetrics(
        url="u",
        window_s=1.0,
        batches={"CE": ce, "TG": tg},
        batch_execution_ms_mean={"CE": ce_ms, "TG": tg_ms},
        batch_size_mean=batch,
    )


def test_server_ledger_field_by_field() -> None:
    """Irregular figures (7 decimals and more), so each rounding of the ledger shows."""
    window = LoadWindow(concurrency=1, window_ns=(1_000, 1_000 + 987_654_321), requests=[])
    ce_ms, tg_ms = 21.123456789, 5.987654321
    lg = server_ledger(metrics(3.0, 41.0, ce_ms, tg_ms), window)
    assert lg is not None and lg.source == "server metrics"
    observed = 987.654321
    outside = observed - (3 * ce_ms + 41 * tg_ms)
    assert lg.window_ms == round(observed, 6)
    assert lg.outside_steps_ms == round(outside, 6) and lg.outside_steps_ms != round(outside, 7)
    assert lg.outside_steps_pct == round(100 * outside / observed, 2) != round(100 * outside / observed, 3)
    want = [("prefill", 3, round(ce_ms, 6), None), ("decode", 41, round(tg_ms, 6), 3)]
    assert [(p.phase, p.steps, p.step_ms, p.batch) for p in lg.phases] == want
    for p, mean in zip(lg.phases, (ce_ms, tg_ms), strict=True):
        assert p.step_ms != round(mean, 7) and p.busy_pct == 100.0 and p.host_step_p50_ms is None
        assert p.tokens_per_step is None
        (row,) = p.rows
        assert (row.part, row.kind, row.ms_per_step, row.share_pct) == (
            "batch execution (kernels and host work, server metrics)",
            "kernels",
            round(mean, 6),
            100.0,
        )
        assert row.basis == "not priced: the server's metrics give batch times, not kernels"
        assert row.ideal_ms_per_step is None


def test_server_ledger_of_a_window_of_no_length() -> None:
    """A window that closed as it opened: it is counted as 1e-9 ms long (not 1 ms), so everything is inside steps."""
    window = LoadWindow(concurrency=1, window_ns=(5_000, 5_000), requests=[])
    lg = server_ledger(metrics(1.0, 1.0, 0.25, 0.5), window)
    assert lg is not None and lg.window_ms == 0.0 and lg.outside_steps_ms == 0.0 and lg.outside_steps_pct == 0.0
    half_ms = LoadWindow(concurrency=1, window_ns=(0, 900_000), requests=[])  # 0.9 ms, 0.75 ms inside batches
    lg = server_ledger(metrics(1.0, 1.0, 0.25, 0.5), half_ms)
    assert (
        lg is not None
        and lg.outside_steps_ms == pytest.approx(0.15)
        and lg.outside_steps_pct == pytest.approx(100 * 0.15 / 0.9, abs=0.005)
    )


def test_server_ledger_rounds_batch_counts_and_size() -> None:
    lg = server_ledger(metrics(2.6, 9.4, 10.0, 2.0, batch=3.5), LoadWindow(1, (0, 10**9), []))
    assert lg is not None and [(p.steps, p.batch) for p in lg.phases] == [(3, None), (9, 4)]
    no_size = server_ledger(metrics(2.0, 9.0, 10.0, 2.0, batch=None), LoadWindow(1, (0, 10**9), []))
    assert no_size is not None and [p.batch for p in no_size.phases] == [None, None]
    none_ce = server_ledger(
        msgspec.structs.replace(metrics(0.0, 5.0, 10.0, 2.0), batch_execution_ms_mean={"TG": 2.0}),
        LoadWindow(1, (0, 10**9), []),
    )
    assert none_ce is not None and [p.phase for p in none_ce.phases] == ["decode"]


def test_clip_to_spans_keeps_what_starts_at_a_span_start_and_drops_what_clips_to_nothing() -> None:
    from max_profile.analyze.ledger import _clip_to_spans

    spans = [(100, 200), (300, 400)]
    start = np.array([100, 150, 199, 250, 300, 390, 50, 400], dtype=np.int64)
    end = np.array([120, 260, 199, 270, 310, 500, 60, 420], dtype=np.int64)
    s, e, keep = _clip_to_spans(start, end, spans)

    def truth(a: int, b: int) -> tuple[int, int, bool]:
        """Clipped to the span whose start is at or before a (none: not kept); kept when a length remains."""
        owner = [sp for sp in spans if sp[0] <= a]
        if not owner:
            return a, b, False
        lo, hi = owner[-1]
        cs, ce = max(a, lo), min(b, hi)
        return cs, ce, ce > cs

    expected = [truth(int(a), int(b)) for a, b in zip(start, end, strict=True)]
    assert list(zip(s.tolist(), e.tolist(), keep.tolist(), strict=True))[:6] == expected[:6]
    assert keep.tolist() == [x[2] for x in expected]
    assert keep.tolist() == [True, True, False, False, True, True, False, False]


def test_the_busiest_device_is_the_one_with_the_most_kernel_time_not_the_most_kernels() -> None:
    from max_profile.analyze.ledger import _busiest_device
    from max_profile.model import KernelTable

    # device 1: ten kernels of 1 ns late in the run; device 3 (the second of the two ids): two of 50 ns early in it
    starts = [1_000_000 + 10 * i for i in range(10)] + [0, 100]
    table = KernelTable(
        names=["k"],
        name_idx=np.zeros(12, dtype=np.int32),
        start_ns=np.array(starts, dtype=np.int64),
        end_ns=np.array([s + 1 for s in starts[:10]] + [50, 150], dtype=np.int64),
        device=np.array([1] * 10 + [3, 3], dtype=np.int32),
    )
    assert _busiest_device(table) == 3


def test_time_ledger_needs_kernels_and_steps_that_fed_requests() -> None:
    from max_profile.analyze.ledger import time_ledger

    steps = decode_steps((0, 1000), (2000, 3000))
    assert time_ledger(table_of(), steps, window=None) is None
    table = table_of((100, 600), (2100, 2600))
    got = time_ledger(table, steps, window=None)
    assert got is not None and got[0]["decode"].steps == 2.0
    # a step that fed no request (batch 0) is not a step of the ledger: still two decode steps, the same busy time
    idle = Step(index=2, phase="decode", batch_size=0, input_tokens=0, context_tokens=0, start_ns=3500, end_ns=4500)
    with_idle = time_ledger(table, [*steps, idle], window=None)
    assert with_idle is not None and with_idle[0]["decode"].steps == 2.0
    assert with_idle[0]["decode"].busy_ns == got[0]["decode"].busy_ns
    only_idle = time_ledger(table, [idle], window=None)
    assert only_idle is None


def table_of(*kernels: tuple[int, int], launch: list[int] | None = None) -> KernelTable:
    """gemv kernels [start, end) on device 0, launched at ``launch`` (default: as they start)."""
    return KernelTable(
        names=["gemv_split_k"],
        name_idx=np.zeros(len(kernels), dtype=np.int32),
        start_ns=np.array([a for a, _ in kernels], dtype=np.int64),
        end_ns=np.array([b for _, b in kernels], dtype=np.int64),
        device=np.zeros(len(kernels), dtype=np.int32),
        launch_ns=None if launch is None else np.array(launch, dtype=np.int64),
    )


def decode_steps(*spans: tuple[int, int]) -> list[Step]:
    return [
        Step(index=i, phase="decode", batch_size=1, input_tokens=1, context_tokens=9 + i, start_ns=a, end_ns=b)
        for i, (a, b) in enumerate(spans)
    ]


def test_a_sampled_recording_counts_the_steps_that_launched_a_recorded_kernel() -> None:
    """In a sampled recording a step counts whole when a recorded kernel was launched in it (a GPU step launches kernels
    every time), not at all when none was: however its host time falls against the slices, which run on the GPU's
    clock (a step of no length, one cut by a slice's edge, one in a pause). Without a sampled recording a step counts
    by the share of it inside the window."""
    from max_profile.analyze.ledger import time_ledger

    recorded = [(0, 1000), (2000, 3000)]
    for at, launches, counted in (
        (500, 500, 1.0),  # no length, launched its kernel
        (1500, None, 0.0),  # in the pause, nothing launched
        (900, 950, 1.0),  # half inside a slice: its kernel was recorded
        (1990, None, 0.0),  # ends in a slice, launched nothing recorded
    ):
        kernels = [(100, 600)] + ([(launches + 10, launches + 60)] if launches is not None else [])
        starts = [100] + ([launches] if launches is not None else [])
        table = table_of(*kernels, launch=starts)
        steps = decode_steps((0, 400), (at, at if launches == at else at + 200))
        got = time_ledger(table, steps, window=(0, 3000), recorded=recorded)
        assert got is not None
        assert got[0]["decode"].steps == 1.0 + counted, at
    whole = time_ledger(table_of((100, 600)), decode_steps((0, 400), (2900, 3300)), window=(0, 3000))
    assert whole is not None and whole[0]["decode"].steps == 1.25  # a window, not slices: 100 of its 400 ns


def test_a_kernel_that_starts_a_span_leaves_no_idle_before_it() -> None:
    from max_profile.analyze.ledger import time_ledger

    got = time_ledger(table_of((0, 600)), decode_steps((0, 1000)), window=(0, 1000))
    assert got is not None
    decode = got[0]["decode"]
    assert decode.busy_ns == {"matmul": 600.0} and decode.idle_before_graph_ns + decode.idle_other_ns == 400.0
    one = time_ledger(table_of((10, 11)), decode_steps((0, 1000)), window=(0, 1000))
    assert one is not None and one[0]["decode"].busy_ns == {"matmul": 1.0}  # one kernel of 1 ns: 1 ns busy


def test_kernels_stamped_across_a_pause_of_a_sampled_recording_are_left_out() -> None:
    """CUPTI stamps a kernel running as the recorder paused with the time it resumed: past the middle of the pause
    after its slice it is dropped; after the last slice the pause runs to the window's end."""
    from max_profile.analyze.ledger import time_ledger

    recorded = [(0, 1000), (3000, 4000)]
    steps = decode_steps((0, 1000), (3000, 4000))
    kept = table_of((100, 600), (3100, 3600))
    base = time_ledger(kept, steps, window=(0, 5000), recorded=recorded)
    assert base is not None
    assert base[0]["decode"].busy_ns == {"matmul": 1000.0}
    stamped = table_of((100, 600), (900, 2900), (3100, 3600), (3700, 4900))  # past 2000 and past 4500
    got = time_ledger(stamped, steps, window=(0, 5000), recorded=recorded)
    assert got is not None and got[0] == base[0] and got[1:4] == base[1:4]
    within = table_of((100, 600), (900, 1900), (3100, 3600), (3700, 4400))  # before the middles: kept, clipped
    kept_too = time_ledger(within, steps, window=(0, 5000), recorded=recorded)
    assert kept_too is not None and kept_too[0]["decode"].busy_ns == {"matmul": 1000.0 + 100 + 300}
    no_window = time_ledger(stamped, steps, window=None, recorded=recorded)
    assert no_window is not None  # the last slice's pause then has no end: only the first long kernel is cut


def test_a_given_window_stretches_to_the_kernels_of_its_first_and_last_steps() -> None:
    """The overlap pipeline returns before its last step's kernels end: the window reaches to the end of the kernels the
    steps launched (the first step's too)."""
    from max_profile.analyze.ledger import time_ledger

    table = table_of((200, 1500), launch=[100])  # launched in step 0, ending after the window
    got = time_ledger(table, decode_steps((0, 1000)), window=(50, 1000))
    assert got is not None and got[3] == 1500.0 - 50.0


# ---- the whole ledger of a small capture, every figure recomputed here ----------------------------------------------

CFG: dict[str, object] = {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 32000,
    "intermediate_size": 8192,
    "torch_dtype": "bfloat16",
}
GEMM_K, GEMV_K, MHA_K, NORM_K = (
    "gemm_bf16_tn_abcdef0123456789",
    "gemv_split_k_bf16_abcdef012345",
    "sm90_mha_d128",
    "rms_norm_k",
)


def small_capture() -> tuple[KernelTable, list[Step]]:
    """A prefill step of 2 ms (a gemm of 1.2 ms, attention 0.3 ms) and three decode steps of 1 ms at batch 2 (a gemv of
    0.45 ms, 40 attention kernels of 1 µs, a norm of 0.05 ms), 0.1 ms apart."""
    names = [GEMM_K, GEMV_K, MHA_K, NORM_K]
    rows: list[tuple[int, int, int]] = []  # name index, start, end
    steps = [
        Step(index=0, phase="prefill", batch_size=1, input_tokens=37, context_tokens=0, start_ns=0, end_ns=2_000_000)
    ]
    rows += [(0, 10_000, 1_210_000), (2, 1_210_000, 1_510_000)]
    t = 2_100_000
    for i in range(3):
        steps.append(
            Step(
                index=1 + i,
                phase="decode",
                batch_size=2,
                input_tokens=6,  # the scheduler feeds 3 a request (a draft): tokens per step is still the batch
                context_tokens=74 + 2 * i,
                start_ns=t,
                end_ns=t + 1_003_000 + (1 if i == 2 else 0),  # the last step 1 ns longer
            )
        )
        rows.append((1, t + 5_000, t + 455_000 + (2 if i == 0 else 0)))  # 2 ns more once: 2/3 ns per step
        rows += [(2, t + 460_000 + 2_000 * j, t + 461_000 + 2_000 * j) for j in range(40)]
        rows.append((3, t + 600_000, t + 650_000))
        t += 1_103_000
    table = KernelTable(
        names=names,
        name_idx=np.array([r[0] for r in rows], dtype=np.int32),
        start_ns=np.array([r[1] for r in rows], dtype=np.int64),
        end_ns=np.array([r[2] for r in rows], dtype=np.int64),
        device=np.zeros(len(rows), dtype=np.int32),
    )
    return table, steps


def test_the_ledger_of_a_small_capture_every_figure() -> None:
    from max_profile.analyze.ledger import IDLE_BETWEEN_LAUNCHES, build_ledger
    from max_profile.analyze.roofline import step_cost

    table, steps = small_capture()
    lg = build_ledger(table, steps, window=None, model_config=CFG, weights=None, gpu="NVIDIA H200", th=TH)
    assert lg is not None
    roofs = roofs_for("NVIDIA H200", "bf16", TH)
    assert roofs is not None
    assert (lg.attainable_bandwidth_pct, lg.attainable_compute_pct) == (
        TH.attainable_bandwidth_pct,
        TH.attainable_compute_pct,
    )
    observed = 2_100_000 + 3 * 1_103_000 - 100_000 + 1  # from the first step's start to the last one's end
    outside = 2 * 100_000 + 100_000  # the gaps between the steps
    assert lg.window_ms == observed / 1e6 and lg.outside_steps_ms == outside / 1e6
    assert lg.outside_steps_pct == round(100 * outside / observed, 2) and lg.outside_kernels_ms == 0.0

    def ideal(cost: dict[str, float], part: str, kernels_per_step: float) -> tuple[float, str]:
        b, f = (
            (cost["weight_bytes"], cost["matmul_flops"])
            if part == "matmul"
            else (cost["kv_bytes"], cost["attention_flops"])
        )
        roof = 1e3 * max(b / roofs.bandwidth, f / roofs.compute)  # type: ignore[operator]
        floor = kernels_per_step * TH.kernel_floor_us / 1e3
        if roof >= floor:
            return roof, f"{b / 1e9:.3g} GB, {f / 1e12:.3g} TFLOP at {roofs.basis}"
        return floor, (
            f"{kernels_per_step:.0f} kernels at {TH.kernel_floor_us:g} µs each (the roofline's {roof * 1e3:.1f} µs is "
            "below that floor)"
        )

    # prefill: one step, 37 tokens over no context
    pre_cost = step_cost(CFG, None, batch=1, context_tokens=0.0, new_tokens=37.0)
    dec_cost = step_cost(CFG, None, batch=2, context_tokens=76.0)
    assert pre_cost is not None and dec_cost is not None
    expect = {
        "prefill": (1, 2.0, [("matmul", 1.2, 1.0), ("attention", 0.3, 1.0)], 0.5, pre_cost, 1, 37.0),
        "decode": (
            3,
            1.003,
            [("matmul", 0.45, 1.0), ("norm", 0.05, 1.0), ("attention", 0.04, 40.0)],
            0.463,
            dec_cost,
            2,
            2,
        ),
    }
    assert [p.phase for p in lg.phases] == ["prefill", "decode"]
    for p in lg.phases:
        n, step_ms, parts, idle_ms, cost, batch, tokens = expect[p.phase]
        assert (p.steps, p.step_ms, p.batch, p.tokens_per_step) == (n, step_ms, batch, tokens)
        assert p.host_step_p50_ms == step_ms
        busy = sum(ms for _, ms, _ in parts)
        assert p.busy_pct == round(100 * busy / step_ms, 2)
        kernel_rows = [r for r in p.rows if r.kind == "kernels"]
        assert [r.part.split(":")[0] for r in kernel_rows] == [name for name, _, _ in parts]
        total_ideal, total_recoverable = 0.0, 0.0
        for r, (name, ms, per_step) in zip(kernel_rows, parts, strict=True):
            assert r.ms_per_step == pytest.approx(ms, abs=1e-6) and r.kernels_per_step == per_step
            assert r.share_pct == round(100 * r.ms_per_step / step_ms, 2)
            if name in ("matmul", "attention"):
                want, basis = ideal(cost, name, per_step)
                assert r.ideal_ms_per_step == round(want, 6) and r.basis == basis
                assert r.recoverable_ms_per_step == round(max(r.ms_per_step - want, 0.0), 6)
                total_ideal += want
            else:
                assert r.ideal_ms_per_step is None and r.recoverable_ms_per_step is None and r.basis is None
                total_ideal += r.ms_per_step
            total_recoverable += r.recoverable_ms_per_step or 0.0
        matmul = kernel_rows[0]
        assert matmul.part == "matmul: " + " + ".join(matmul.families) and matmul.families == (
            ["gemm"] if p.phase == "prefill" else ["gemv"]
        )
        (idle,) = [r for r in p.rows if r.kind == "idle"]
        assert idle.part == IDLE_BETWEEN_LAUNCHES and idle.ms_per_step == pytest.approx(idle_ms, abs=1e-6)
        assert idle.ideal_ms_per_step == 0.0 and idle.recoverable_ms_per_step == idle.ms_per_step
        assert idle.share_pct == round(100 * idle.ms_per_step / step_ms, 2)
        total_recoverable += idle.ms_per_step
        assert p.ideal_ms_per_step == pytest.approx(total_ideal, abs=2e-6)
        assert p.recoverable_ms_per_step == pytest.approx(total_recoverable, abs=2e-6)
    decode = lg.phases[1]
    matmul_ms, idle_ms = 1_350_002 / 3 / 1e6, (3 * 463_000 - 1) / 3 / 1e6
    step_ms = 3_009_001 / 3 / 1e6
    assert decode.step_ms == round(step_ms, 6) != round(step_ms, 7)
    assert decode.rows[0].ms_per_step == round(matmul_ms, 6) != round(matmul_ms, 7)
    idle_row = next(r for r in decode.rows if r.kind == "idle")
    assert idle_row.ms_per_step == round(idle_ms, 6) != round(idle_ms, 7)
    assert idle_row.recoverable_ms_per_step == round(idle_ms, 6)
    share = 100 * decode.rows[0].ms_per_step / decode.step_ms
    assert decode.rows[0].share_pct == round(share, 2) != round(share, 3)
    assert decode.busy_pct == round(100 * 0.54 / 1.003, 2) != round(100 * 0.54 / 1.003, 3)
    kernel_rows = [r for r in decode.rows if r.kind == "kernels"]
    ideal_sum = sum(r.ms_per_step if r.ideal_ms_per_step is None else r.ideal_ms_per_step for r in kernel_rows)
    assert decode.ideal_ms_per_step == round(ideal_sum, 6)
    recoverable_sum = sum(r.recoverable_ms_per_step or 0.0 for r in decode.rows)
    assert decode.recoverable_ms_per_step == round(recoverable_sum, 6)
    decode_attention = next(r for r in lg.phases[1].rows if r.part == "attention")
    assert "kernels at" in (decode_attention.basis or "")  # 40 launches of 1 µs: the launch floor, not the roofline


def test_the_ledger_without_a_config_or_known_peaks_says_why_it_does_not_price() -> None:
    from max_profile.analyze.ledger import HOST_BETWEEN_OPS, build_ledger

    table, steps = small_capture()
    bare = build_ledger(table, steps, window=None, model_config=None, weights=None, gpu="NVIDIA H200", th=TH)
    assert bare is not None and bare.attainable_bandwidth_pct is None and bare.attainable_compute_pct is None
    for p in bare.phases:
        assert p.ideal_ms_per_step is None
        for r in p.rows:
            want = "not priced: no model config or weights" if r.part.split(":")[0] in ("matmul", "attention") else None
            assert r.basis == want if r.kind == "kernels" else r.basis is None
    unknown = build_ledger(table, steps, window=None, model_config=CFG, weights=None, gpu="Some GPU", th=TH)
    assert unknown is not None and unknown.attainable_bandwidth_pct is None
    for p in unknown.phases:
        for r in p.rows:
            if r.kind == "kernels" and r.part.split(":")[0] in ("matmul", "attention"):
                assert r.basis == "not priced: the device's peaks are not known" and r.ideal_ms_per_step is None
    # op ranges on the host: the idle is host time between ops, nothing priced even with a config
    ops = build_ledger(
        table, steps, window=None, model_config=CFG, weights=None, gpu="NVIDIA H200", th=TH, host_ops=True
    )
    assert ops is not None and ops.source == "op ranges (host)" and ops.attainable_bandwidth_pct is None
    assert [r.part for r in ops.phases[1].rows if r.kind == "idle"] == [HOST_BETWEEN_OPS]
    assert all(p.ideal_ms_per_step is None for p in ops.phases)


def test_a_ledger_of_batch_0_steps_only_or_a_phase_without_steps_fed() -> None:
    from max_profile.analyze.ledger import build_ledger

    table, steps = small_capture()
    drained = [
        *steps,
        *(
            Step(
                index=9 + j,
                phase="decode",
                batch_size=0,
                input_tokens=0,
                context_tokens=0,
                start_ns=5_500_000 + 200_000 * j,
                end_ns=5_600_000 + 200_000 * j,
            )
            for j in range(4)
        ),  # four drain calls against three steps that fed requests: the batch's median would be 0
    ]
    lg = build_ledger(table, drained, window=None, model_config=CFG, weights=None, gpu="NVIDIA H200", th=TH)
    ref = build_ledger(table, steps, window=None, model_config=CFG, weights=None, gpu="NVIDIA H200", th=TH)
    assert lg is not None and ref is not None
    assert [(p.batch, p.tokens_per_step, p.host_step_p50_ms, p.ideal_ms_per_step) for p in lg.phases] == [
        (p.batch, p.tokens_per_step, p.host_step_p50_ms, p.ideal_ms_per_step) for p in ref.phases
    ]


def test_with_load_weighs_each_window_by_its_length() -> None:
    from max_profile.analyze.ledger import build_ledger, with_load
    from max_profile.analyze.load import in_flight
    from max_profile.model import RequestRecord

    table, steps = small_capture()
    lg = build_ledger(table, steps, window=None, model_config=None, weights=None, gpu=None, th=TH)
    assert lg is not None

    def req(a: int, b: int) -> RequestRecord:
        return RequestRecord(started_ns=a, ended_ns=b, ok=True, tokens=3)

    w1 = LoadWindow(concurrency=1, window_ns=(10**12, 10**12 + 3_000), requests=[req(10**12, 10**12 + 1_000)])
    w2 = LoadWindow(
        concurrency=1, window_ns=(10**12 + 5_000, 10**12 + 6_000), requests=[req(10**12 + 5_000, 10**12 + 5_700)]
    )
    ref = LoadWindow(concurrency=1, window_ns=(0, 10**9), requests=[], reference=True)
    loaded = with_load(lg, [ref, w1, w2])
    (s1, r1), (s2, r2) = in_flight(w1.requests, w1.window_ns), in_flight(w2.requests, w2.window_ns)
    assert loaded.requests_in_flight_pct == round((s1 * 3_000 + s2 * 1_000) / 4_000, 2)
    assert loaded.requests_in_flight_pct != round((s1 * 3_000 + s2 * 1_000) / 4_000, 3)
    assert loaded.request_rate_rps == round((r1 * 3_000 + r2 * 1_000) / 4_000, 4)
    assert with_load(lg, [ref]) is lg
    # a window without requests of ours (attach without --probe) says nothing of the server's own traffic
    empty = LoadWindow(concurrency=1, window_ns=(7, 7), requests=[])
    assert with_load(lg, [empty]) is lg


def test_rows_of_a_step_of_no_length_and_an_idle_of_one_nanosecond() -> None:
    from max_profile.analyze.ledger import IDLE_BETWEEN_LAUNCHES, build_ledger

    # a decode step of no length whose one kernel also has none: a phase of 0 ms with no rows, busy 0.0 (no division)
    steps = decode_steps((1000, 1000))
    lg = build_ledger(table_of((1000, 1000)), steps, window=(0, 2000), model_config=None, weights=None, gpu=None, th=TH)
    assert lg is not None
    (p,) = lg.phases
    assert p.step_ms == 0.0 and p.busy_pct == 0.0 and p.rows == []
    # one nanosecond of idle in a step is still a row of the ledger
    one = build_ledger(
        table_of((0, 999)), decode_steps((0, 1000)), window=None, model_config=None, weights=None, gpu=None, th=TH
    )
    assert one is not None
    idle = [r for r in one.phases[0].rows if r.kind == "idle"]
    assert [(r.part, r.ms_per_step) for r in idle] == [(IDLE_BETWEEN_LAUNCHES, 1e-06)]


def test_op_ranges_on_the_host_fold_every_gap_into_host_time() -> None:
    """Kernels in device graphs leave idle before a graph launch on a GPU; read as host op ranges, every gap is host
    time between ops (one row), whatever graph ids the records carry."""
    from max_profile.analyze.ledger import HOST_BETWEEN_OPS, IDLE_BEFORE_GRAPH, build_ledger

    table, steps = small_capture()
    graphs = msgspec.structs.replace(table, graph_id=np.where(table.name_idx == 1, 7, 0).astype(np.int64))
    gpu = build_ledger(graphs, steps, window=None, model_config=None, weights=None, gpu=None, th=TH)
    ops = build_ledger(graphs, steps, window=None, model_config=None, weights=None, gpu=None, th=TH, host_ops=True)
    assert gpu is not None and ops is not None
    assert IDLE_BEFORE_GRAPH in [r.part for r in gpu.phases[1].rows]
    idle = [r for r in ops.phases[1].rows if r.kind == "idle"]
    assert [r.part for r in idle] == [HOST_BETWEEN_OPS]
    assert idle[0].ms_per_step == pytest.approx(
        sum(r.ms_per_step for r in gpu.phases[1].rows if r.kind == "idle"), abs=2e-6
    )


def test_a_slice_without_kernels_is_idle_between_launches_and_later_slices_count() -> None:
    """A sampled recording: the step spans two slices and only the second holds kernels; the first slice is all idle,
    not waiting for a graph, and the second slice's gaps are counted too."""
    from max_profile.analyze.ledger import time_ledger

    graph = msgspec.structs.replace(table_of((2100, 2600)), graph_id=np.array([5], dtype=np.int64))
    got = time_ledger(graph, decode_steps((0, 3000)), window=(0, 3000), recorded=[(0, 1000), (2000, 3000)])
    assert got is not None
    decode = got[0]["decode"]
    assert decode.idle_other_ns == 1000.0 + 400.0  # the first slice whole, the second's tail after the kernel
    assert decode.idle_before_graph_ns == 100.0  # the second slice's start until the graph kernel


def test_kernels_between_steps_count_outside_to_the_nanosecond() -> None:
    """Two decode steps 5 ms apart with a 1.5 ms kernel launched between them: 5 ms outside the steps, 1.5 ms of it
    kernels, each figure exact at 6 decimals of ms (whole nanoseconds)."""
    from max_profile.analyze.ledger import build_ledger

    table = table_of((100, 900_100), (3_000_000, 4_500_000), (6_000_100, 6_900_100))
    steps = decode_steps((0, 1_000_000), (6_000_000, 7_000_000))
    lg = build_ledger(table, steps, window=None, model_config=None, weights=None, gpu=None, th=TH)
    assert lg is not None
    assert (lg.window_ms, lg.outside_steps_ms, lg.outside_kernels_ms) == (7.0, 5.0, 1.5)
    assert lg.outside_steps_pct == round(100 * 5 / 7, 2) == 71.43


def test_a_window_of_no_length_has_nothing_outside_its_steps() -> None:
    from max_profile.analyze.ledger import build_ledger

    lg = build_ledger(
        table_of((1000, 1000)),
        decode_steps((1000, 1000)),
        window=None,
        model_config=None,
        weights=None,
        gpu=None,
        th=TH,
    )
    assert lg is not None and lg.window_ms == 0.0
    assert (lg.outside_steps_ms, lg.outside_steps_pct, lg.outside_kernels_ms) == (0.0, 0.0, 0.0)


def test_fp8_weights_price_the_ledger_at_the_fp8_peak_without_a_quantization_config() -> None:
    """The stored weights' dtype names the matmul operand where config.json says nothing of FP8."""
    from max_profile.analyze.ledger import build_ledger
    from max_profile.model import ModelWeights

    table, steps = small_capture()
    fp8 = ModelWeights(source="test", groups={}, dtypes={"F8_E4M3": 1000, "F32": 10}, tied_embeddings=False)
    lg = build_ledger(table, steps, window=None, model_config=CFG, weights=fp8, gpu="NVIDIA H200", th=TH)
    bf16 = build_ledger(table, steps, window=None, model_config=CFG, weights=None, gpu="NVIDIA H200", th=TH)
    assert lg is not None and bf16 is not None
    fp8_roofs, bf16_roofs = roofs_for("NVIDIA H200", "fp8", TH), roofs_for("NVIDIA H200", "bf16", TH)
    assert fp8_roofs is not None and bf16_roofs is not None
    prefill_matmul = next(r for r in lg.phases[0].rows if r.part.startswith("matmul"))
    assert prefill_matmul.basis is not None and prefill_matmul.basis.endswith(fp8_roofs.basis)
    assert next(r for r in bf16.phases[0].rows if r.part.startswith("matmul")).basis.endswith(bf16_roofs.basis)  # type: ignore[union-attr]


def test_phase_step_cost_of_steps_without_a_context_and_of_a_phase_that_fed_nothing() -> None:
    """Steps that carry no context length (MAX's spans, an importer that does not know it): the KV cache's bytes are
    unknown (None), never priced as zero, while the weights are priced as for any context; steps that say 0 cached
    tokens are priced at 0. A phase none of whose steps fed requests has no batch and no cost."""
    from max_profile.analyze.ledger import phase_step_cost
    from max_profile.analyze.roofline import step_cost

    steps = [
        Step(
            index=i,
            phase="decode",
            batch_size=2,
            input_tokens=2,
            context_tokens=None,
            start_ns=10 * i,
            end_ns=10 * i + 5,
        )
        for i in range(3)
    ]
    sel, shape, cost = phase_step_cost(steps, "decode", CFG, None)
    assert (len(sel), shape.batch_figure, shape.tokens, shape.context_tokens) == (3, 2, 2, None)
    known = step_cost(CFG, None, batch=2, context_tokens=0.0)
    assert cost is not None and known is not None
    assert cost["kv_bytes"] is None and {k: v for k, v in cost.items() if k != "kv_bytes"} == {
        k: v for k, v in known.items() if k != "kv_bytes"
    }
    zero = [msgspec.structs.replace(s, context_tokens=0) for s in steps]
    assert phase_step_cost(zero, "decode", CFG, None)[2] == known
    drained = [msgspec.structs.replace(s, batch_size=0) for s in steps]
    assert phase_step_cost(drained, "decode", CFG, None)[1:] == (PhaseShape(0, None, None, None), None)
    assert phase_step_cost(steps, "decode", {}, None)[2] is None
