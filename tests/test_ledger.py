"""The step ledger and the verdicts read off it: parts that add up (checked against a count made here from the raw
records), levers ranked by what they buy, severity by size with its boundary pinned, no contradictions, load before any
load verdict, and next commands that reproduce the capture (parsed with the CLI's own parser)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import msgspec
import numpy as np
import pytest

from max_profile.analyze.commands import cli
from max_profile.analyze.families import classify_kernel
from max_profile.analyze.report import build_report
from max_profile.analyze.thresholds import Thresholds
from max_profile.flags import build_parser
from max_profile.model import (
    Capture,
    Command,
    KernelRecord,
    LoadWindow,
    RawCapture,
    Report,
    RequestRecord,
    Step,
    StepLedger,
    Unavailable,
    UtilizationSample,
    Workload,
)

from .test_rules import GPU_ENV, finding, ids

H200 = Path(__file__).parent / "data" / "gpu"
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
    raw = RawCapture.load(str(Path(__file__).parent / "data" / "cpu" / "serve_sweep_c1_c2_raw.json.gz"))
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

    from .test_rules import synthetic

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
    from .test_finding_ids import _ops_on_cpu

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

    report = build_report(RawCapture.load(str(Path(__file__).parent / "data" / "cpu" / name)))
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
