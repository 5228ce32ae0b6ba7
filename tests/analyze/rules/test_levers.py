"""The levers' verdicts at their thresholds, on real H200 captures (the naive FP8 fallback, bf16 at batch 1
and 32; a sampled CUPTI recording), their ledger rows varied where a threshold sits (mutants of
``analyze/rules/levers.py`` survived the first run). Every figure asserted is recomputed here from the ledger or the
kernel breakdown."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest

from max_profile.analyze.families import slow_path
from max_profile.analyze.ledger import MATMUL_PART
from max_profile.analyze.report import build_report
from max_profile.analyze.rules.levers import _kernel_ms, _matmul_finding, _part
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import KernelBreakdown, LedgerRow, PhaseLedger, RawCapture, Report, StepLedger

S7 = Path(__file__).parents[2] / "data" / "gpu" / "h200_llama5b_every_verb"
S13 = Path(__file__).parents[2] / "data" / "gpu" / "h200_llama3b_sampled_recording"
H200 = Path(__file__).parents[2] / "data" / "gpu"
TH = Thresholds()


@pytest.fixture(scope="module")
def fp8() -> Report:
    return build_report(RawCapture.load(str(S7 / "run_fp8_raw.json.gz")))


@pytest.fixture(scope="module")
def b32() -> Report:
    return build_report(RawCapture.load(str(S7 / "run_b32_raw.json.gz")))


def _decode(report: Report) -> tuple[PhaseLedger, LedgerRow]:
    assert report.ledger is not None and not isinstance(report.ledger, str)
    p = next(p for p in report.ledger.phases if p.phase == "decode")  # type: ignore[union-attr]
    row = _part(p, MATMUL_PART)
    assert row is not None
    return p, row


def test_an_unpriced_slow_path_is_named_from_a_share_at_the_threshold(fp8: Report) -> None:
    """No model config (the row not priced): the naive FP8 kernel names the path once the matmuls hold
    ``slow_matmul_share_pct`` of the kernel time (at it exactly: named; just over it: nothing); its lever is all of the
    matmul time, an upper bound said so."""
    p, row = _decode(fp8)
    unpriced = msgspec.structs.replace(row, ideal_ms_per_step=None, recoverable_ms_per_step=None)
    share = 100 * row.ms_per_step / _kernel_ms(p)
    f = _matmul_finding(fp8, p, unpriced, Thresholds(slow_matmul_share_pct=share))
    assert f is not None and f.id == "matmul-slow-path" and f.confidence == 0.85
    named = slow_path(str(f.evidence["top_matmul_kernel"]))
    assert named is not None and f.evidence["kernel_names_it"] == named[0]
    assert (
        f.evidence["lever_basis"] == "the slow path's own time (not priced: no model config or weights; an upper bound)"
    )
    assert f.lever is not None and f.lever.ms_per_step == round(row.ms_per_step, 4)
    pct = 100 * row.ms_per_step / p.step_ms
    assert f.title == (
        f"Decode matmuls run through {named[0]}: {share:.0f} % of its kernel time (not priced: no model config); "
        f"fixing it buys {row.ms_per_step:.2f} ms of each {p.step_ms:.2f} ms step ({pct:.0f} %)"
    )
    assert _matmul_finding(fp8, p, unpriced, Thresholds(slow_matmul_share_pct=math.nextafter(share, 100.0))) is None


def test_a_priced_matmul_far_below_its_roofline_at_both_thresholds(b32: Report) -> None:
    """bf16 at batch 32 (no kernel name says slow path): at 54 % of its roofline and 90 % of the kernel time. Slow path
    only with the roofline share under ``slow_matmul_roofline_pct`` (at it exactly: below-roofline) and the kernel share
    at ``slow_matmul_share_pct`` or more (at it exactly: slow)."""
    p, row = _decode(b32)
    assert row.ideal_ms_per_step is not None and row.recoverable_ms_per_step is not None
    share = 100 * row.ms_per_step / _kernel_ms(p)
    roof = 100 * row.ideal_ms_per_step / row.ms_per_step
    pct = 100 * row.recoverable_ms_per_step / p.step_ms
    at_roof = _matmul_finding(b32, p, row, Thresholds(slow_matmul_share_pct=share, slow_matmul_roofline_pct=roof))
    assert at_roof is not None and at_roof.id == "matmul-below-roofline"
    slow = _matmul_finding(
        b32, p, row, Thresholds(slow_matmul_share_pct=share, slow_matmul_roofline_pct=math.nextafter(roof, 100.0))
    )
    assert slow is not None and slow.id == "matmul-slow-path" and slow.confidence == 0.7
    assert "kernel_names_it" not in slow.evidence and "lever_basis" not in slow.evidence
    assert slow.title == (
        f"Decode matmuls run through a matmul path far below its roofline: {share:.0f} % of its kernel time at "
        f"{roof:.0f} % of its attainable roofline; fixing it buys {row.recoverable_ms_per_step:.2f} ms of each "
        f"{p.step_ms:.2f} ms step ({pct:.0f} %)"
    )
    under_share = _matmul_finding(
        b32, p, row, Thresholds(slow_matmul_share_pct=math.nextafter(share, 100.0), slow_matmul_roofline_pct=100.0)
    )
    assert under_share is not None and under_share.id == "matmul-below-roofline"


def test_a_long_kernel_name_is_cut_to_100_characters_in_the_evidence(b32: Report) -> None:
    p, row = _decode(b32)
    k = b32.kernels
    assert isinstance(k, KernelBreakdown)
    long = "matmul_bfloat16_" + "x" * 140
    phases = [
        msgspec.structs.replace(
            ph,
            top_kernels=[
                msgspec.structs.replace(r, name=long) if r.family in row.families else r for r in ph.top_kernels
            ],
        )
        for ph in k.phases
    ]
    report = msgspec.structs.replace(b32, kernels=msgspec.structs.replace(k, phases=phases))
    f = _matmul_finding(report, p, row, Thresholds())
    assert f is not None and f.evidence["top_matmul_kernel"] == long[:100]


def test_the_top_kernel_and_its_launch_shape_fall_back_and_miss_cleanly(b32: Report) -> None:
    """The phase's top kernel of some families (the capture's when the trace has no such phase), None where no kernel of
    them ran; its launch shape from the phase's rows, None without a phase, a name or a row of that name."""
    from max_profile.analyze.rules.levers import _launch_shape, _top_kernel

    k = b32.kernels
    assert isinstance(k, KernelBreakdown)
    decode = next(p for p in k.phases if p.phase == "decode")
    gemm = next(r for r in decode.top_kernels if r.family == "gemm")
    assert _top_kernel(k, "decode", ["gemm"]) == gemm.name and _top_kernel(k, "decode", ["no-such-family"]) is None
    no_phases = msgspec.structs.replace(k, phases=[])
    assert _top_kernel(no_phases, "decode", ["gemm"]) == next(r.name for r in k.top_kernels if r.family == "gemm")
    assert _top_kernel(None, "decode", ["gemm"]) is None
    assert gemm.launch_shape and _launch_shape(k, "decode", gemm.name) == gemm.launch_shape
    assert _launch_shape(k, "decode", "no_such_kernel") is None and _launch_shape(k, "decode", None) is None
    assert _launch_shape(no_phases, "decode", gemm.name) is None and _launch_shape(None, "decode", gemm.name) is None


def test_gpu_bound_reads_the_decode_busy_share_off_the_step_ledger() -> None:
    """A sampled recording (a quarter of the steps recorded): the ledger's decode steps are 94.3 % busy, and the
    breakdown's decode phase reads the same (it once spread the recorded kernels over the unrecorded steps too: 26.8
    %). Without a ledger the verdict falls back to the phase's share, without phases to the capture's, its confidence
    scaled down."""
    from max_profile.analyze.rules.base import phase_of
    from max_profile.analyze.rules.levers import rule_gpu_bound

    report = build_report(RawCapture.load(str(S13 / "run_b64_3b_sampled_raw.json.gz")))
    th = Thresholds()
    assert isinstance(report.kernels, KernelBreakdown) and report.ledger is not None
    dl = next(p for p in report.ledger.phases if p.phase == "decode")  # type: ignore[union-attr]
    d = phase_of(report.kernels, "decode")
    assert d is not None and d.gpu_busy_pct == dl.busy_pct and th.gpu_bound_busy_pct <= dl.busy_pct
    assert (d.steps, d.steps_in_capture) == (dl.steps, dl.steps_in_capture) == (32, 128)
    [f] = rule_gpu_bound(report, th)
    assert f.evidence == {
        "gpu_busy_pct": round(dl.busy_pct, 1),
        "scope": "decode",
        "top_family": report.kernels.families[0].family,
        "threshold_pct": th.gpu_bound_busy_pct,
    }
    assert f.confidence == 0.8 and f.severity == "info"
    assert (
        f.title
        == f"GPU-bound: kernels ran {dl.busy_pct:.0f}% of the decode steps; the kernel mix is where the time goes"
    )
    assert rule_gpu_bound(report, Thresholds(gpu_bound_busy_pct=math.nextafter(dl.busy_pct, 100.0))) == []
    no_ledger = msgspec.structs.replace(
        report,
        ledger=None,
        kernels=msgspec.structs.replace(report.kernels, phases=[msgspec.structs.replace(d, gpu_busy_pct=26.8)]),
    )
    assert rule_gpu_bound(no_ledger, th) == []  # the phase's own 26.8 %
    at_phase = rule_gpu_bound(no_ledger, Thresholds(gpu_bound_busy_pct=26.8))
    assert [x.evidence["gpu_busy_pct"] for x in at_phase] == [26.8]
    no_phases = msgspec.structs.replace(no_ledger, kernels=msgspec.structs.replace(report.kernels, phases=[]))
    busy = report.kernels.gpu_busy_pct
    assert busy is not None
    [c] = rule_gpu_bound(no_phases, Thresholds(gpu_bound_busy_pct=busy))
    assert c.evidence["scope"] == "capture" and c.evidence["gpu_busy_pct"] == round(busy, 1)
    assert c.confidence == round(0.8 * th.no_phase_confidence_scale, 2)
    assert "capture window (no phase ranges: whole capture)" in c.title
    unreliable = msgspec.structs.replace(report, kernels=msgspec.structs.replace(report.kernels, unreliable=True))
    assert rule_gpu_bound(unreliable, th) == []


def test_idle_verdicts_at_the_host_bound_and_graph_share_thresholds() -> None:
    """The decode phase of a real batch-64 capture (79.3 % busy, idle 0.663 ms before graph launches and
    0.434 ms between launches per 5.3 ms step), its idle rows set to 0.25 ms each: at ``host_bound_busy_pct`` equal to
    its busy share it is not host-bound; with the idle before graphs exactly ``graph_launch_late_share`` of all the
    idle, the graph is late (at it: late; the rest: idle between launches); two steps are 'each', one is 'the'."""
    from max_profile.analyze.rules.idle import _idle_finding

    report = build_report(
        RawCapture.load(
            str(Path(__file__).parents[2] / "data" / "gpu" / "h200_llama3b_batch64_ledger" / "run_b64_3b_raw.json.gz")
        )
    )
    assert report.ledger is not None
    p = next(p for p in report.ledger.phases if p.phase == "decode")  # type: ignore[union-attr]
    rows = [msgspec.structs.replace(r, ms_per_step=0.25) if r.kind == "idle" else r for r in p.rows]
    assert sum(r.kind == "idle" for r in rows) == 2
    p = msgspec.structs.replace(p, rows=rows)
    at_busy = Thresholds(host_bound_busy_pct=p.busy_pct, graph_launch_late_share=0.5)
    late = _idle_finding(report, p, at_busy)
    assert late is not None and late.id == "graph-launch-late"
    assert late.evidence["idle_ms_per_step"] == 0.5 and late.evidence["idle_before_graph_launch_ms_per_step"] == 0.25
    host = _idle_finding(report, p, Thresholds(host_bound_busy_pct=math.nextafter(p.busy_pct, 100.0)))
    assert host is not None and host.id == "host-bound"
    between = _idle_finding(report, p, Thresholds(graph_launch_late_share=math.nextafter(0.5, 1.0)))
    assert between is not None and between.id == "gpu-idle"
    two = _idle_finding(report, msgspec.structs.replace(p, steps=2), at_busy)
    one = _idle_finding(report, msgspec.structs.replace(p, steps=1), at_busy)
    assert two is not None and "of each decode step" in two.title
    assert one is not None and "of the decode step" in one.title


def test_time_outside_steps_every_figure_from_the_ledger() -> None:
    """Decode steps of 1 ms with 0.25 ms of nothing between each two (generated, truth known): the ledger says 7.5 ms
    of a 38.5 ms window passed outside the 31 steps; the lever prices it per step, its command profiles the host."""
    from max_profile.analyze.rules.base import lever_severity
    from max_profile.analyze.rules.levers import rule_outside_steps
    from max_profile.model import Lever

    from ...analyze.rules.test_finding_ids import _outside

    report = _outside(0.25)
    lg = report.ledger
    assert isinstance(lg, StepLedger) and lg.outside_steps_ms == pytest.approx(7.5) and lg.window_ms == 38.5
    steps = sum(p.steps for p in lg.phases)
    pct, per_step = lg.outside_steps_pct, lg.outside_steps_ms / steps
    assert steps == 31 and round(per_step, 4) != round(per_step, 5) and round(pct, 1) != round(pct, 2)
    th = Thresholds()
    [f] = rule_outside_steps(report, th)
    assert f.id == "time-outside-steps" and f.severity == lever_severity(pct, steps, th) == "warning"
    assert f.confidence == 0.7
    assert f.lever == Lever(
        phase="outside steps",
        part="time between steps",
        ms_per_step=round(per_step, 4),
        pct_of_step=round(pct, 1),
        total_ms=round(lg.outside_steps_ms, 3),
    )
    assert f.evidence == {
        "outside_steps_ms": lg.outside_steps_ms,
        "outside_steps_pct": pct,
        "kernels_launched_outside_ms": lg.outside_kernels_ms,
        "steps": steps,
        "window_ms": lg.window_ms,
    }
    assert (
        f.title
        == f"{pct:.0f} % of the window (7.5 ms, {per_step:.2f} ms per step) passed between steps, where no step ran"
    )
    assert (f.next_step or "").startswith("Between two executes the host runs the generation loop")
    assert f.command is not None and f.command.verb == "shell"
    assert "py-spy record -o host.svg -- max-profile run" in str(f.command.args["line"])
    assert "--kernels off" in str(f.command.args["line"])


def test_lightly_loaded_at_its_threshold_and_its_command_only_for_attach() -> None:
    """An idle attach window (4 % in flight): lightly loaded under ``light_load_pct``, not at it; its
    figures from the window; the attach sweep as its command. A generation mostly between steps is lightly loaded
    too, with no attach command."""
    from max_profile.analyze.rules.base import load_share
    from max_profile.analyze.rules.levers import rule_outside_steps

    from ...analyze.rules.test_finding_ids import _outside, real

    idle = real("h200_llama3b_batch64_ledger/attach_idle_3b_raw.json.gz")
    share, what = load_share(idle)
    assert share is not None and what == "requests in flight" and idle.window_load is not None
    [f] = rule_outside_steps(idle, Thresholds())
    assert f.id == "lightly-loaded" and f.confidence == 0.8 and f.severity == "info"
    rate = idle.window_load.request_rate_rps
    assert rate is not None
    assert f.evidence["loaded_pct"] == round(share, 1) and f.evidence["requests_per_s"] == rate
    assert f.title.startswith(
        f"Lightly loaded: requests in flight only {share:.0f} % of the window, {rate:.2f} requests/s"
    )
    # the server's own URL and its metrics URL (not the default port here): the command runs as printed
    assert f.command is not None and f.command.verb == "attach"
    assert f.command.positional == ["http://127.0.0.1:8123"]
    assert f.command.args == {"metrics_url": "http://127.0.0.1:8124/metrics", "concurrency": "1,4,16"}
    assert rule_outside_steps(idle, Thresholds(light_load_pct=share)) == []
    gen = _outside(3.0)
    [g] = rule_outside_steps(gen, Thresholds())
    assert g.id == "lightly-loaded" and g.command is None and g.evidence["measured_as"] == "steps running"
    assert isinstance(gen.ledger, StepLedger) and g.evidence["outside_steps_pct"] == gen.ledger.outside_steps_pct


def test_healthy_decode_every_figure_and_each_threshold() -> None:
    """Batch 1 on the H200 : decode is gemv-bound with no lever at warning size, so healthy-dense-decode, its
    figures read off the ledger and the decode phase; withheld once the largest lever reaches ``lever_warning_pct``;
    not named below ``healthy_gemv_share_pct``; at ``batched_decode_min_batch`` 1 the batched verdict instead, which
    needs a ledger."""
    from max_profile.analyze.rules.base import phase_of, worst_lever_pct
    from max_profile.analyze.rules.levers import rule_healthy_decode

    report = build_report(RawCapture.load(str(S7 / "run_b1_raw.json.gz")))
    th = Thresholds()
    p, _ = _decode(report)
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    d = phase_of(k, "decode")
    assert d is not None and p.ideal_ms_per_step
    fam = d.families
    gemv = next(r for r in fam if r.family == "gemv")
    worst = worst_lever_pct(p)
    [f] = rule_healthy_decode(report, th)
    assert f.id == "healthy-dense-decode" and f.confidence == 0.8 and len(fam) >= 4
    assert f.evidence == {
        "top_family": "gemv",
        "top_family_share_pct": round(fam[0].share_pct, 1),
        "top_families": ",".join(r.family for r in fam[:4]),
        "largest_lever_pct_of_step": round(worst, 1),
        "decode_step_ms": round(p.step_ms, 4),
        "recoverable_ms_per_step": round(p.recoverable_ms_per_step, 4),
        "batch": 1,
        "pct_of_ideal_step": round(100 * p.ideal_ms_per_step / p.step_ms, 1),
        "gemv_share_pct": round(gemv.share_pct, 1),
        "decode_kernel_us_per_token": round(d.kernel_us_per_token or 0, 2),
    }
    assert f.title == (
        "Healthy dense decode: matrix-vector products dominate (memory-bound), then "
        + f"{fam[1].family}, {fam[2].family}"
    )
    assert rule_healthy_decode(report, Thresholds(lever_warning_pct=worst)) == []
    assert rule_healthy_decode(report, Thresholds(lever_warning_pct=math.nextafter(worst, 100.0)))
    assert rule_healthy_decode(report, Thresholds(healthy_gemv_share_pct=gemv.share_pct))
    assert rule_healthy_decode(report, Thresholds(healthy_gemv_share_pct=math.nextafter(gemv.share_pct, 100.0))) == []
    [b] = rule_healthy_decode(report, Thresholds(batched_decode_min_batch=1))
    batched_evidence = {
        key: v for key, v in f.evidence.items() if key not in ("gemv_share_pct", "decode_kernel_us_per_token")
    }
    assert b.id == "healthy-batched-decode" and b.confidence == 0.75 and b.evidence == batched_evidence
    assert b.title == (
        "Healthy batched decode: 1 requests per step, matrix products (gemv) dominate and every part is within 15 % of "
        "the step of its roofline"
    )
    no_ledger = msgspec.structs.replace(report, ledger=None)
    assert rule_healthy_decode(no_ledger, Thresholds(batched_decode_min_batch=1)) == []  # batched needs the ledger


def test_the_host_command_of_a_serve_capture_reruns_that_server_untraced_under_py_spy() -> None:
    """A real serve capture (`serve --mode kernels` at concurrency 4): the GPU-idle verdict's command runs
    the same server in utilization mode (no tracer), confirmed, under py-spy following its worker processes."""
    from max_profile.flags import build_parser

    from ...analyze.rules.test_finding_ids import real

    report = real("h200_llama3b_batch64_ledger/serve_kernels_3b_raw.json.gz")
    [f] = [f for f in report.findings if f.id == "gpu-idle"]
    assert f.command is not None and f.command.verb == "shell"
    assert f.command.comment == "where the server's host time goes per step"
    line = str(f.command.args["line"])
    prefix = "pip install py-spy && py-spy record --subprocesses -o host.svg -- "
    assert line.startswith(prefix)
    words = line.removeprefix(prefix).split()
    assert words[:2] == ["max-profile", "serve"]
    args = build_parser().parse_args(words[1:])
    assert (args.model_path, args.devices, args.mode, args.yes) == ("/tmp/m3b", "gpu", "utilization", True)
    assert args.concurrency == [4] and args.extra == []
    assert line.removeprefix(prefix) == (
        "max-profile serve --model-path /tmp/m3b --devices gpu --concurrency 4 --mode utilization --yes"
    )  # the mode said, not left to the parser's default


def test_a_phase_of_zero_length_draws_no_lever_and_no_division_by_zero() -> None:
    """A phase whose steps took no time (a capture cut at a step's edge): no idle or matmul lever is priced, the CPU
    verdict still reads 0 % between ops, nothing divides by zero."""
    from max_profile.analyze.rules.idle import _host_ops_finding, _idle_finding

    report = build_report(RawCapture.load(str(S7 / "run_b32_raw.json.gz")))
    p, row = _decode(report)
    empty = msgspec.structs.replace(
        p, step_ms=0.0, rows=[msgspec.structs.replace(r, ms_per_step=0.0, recoverable_ms_per_step=0.0) for r in p.rows]
    )
    zero_row = msgspec.structs.replace(row, ms_per_step=0.0, recoverable_ms_per_step=0.0)
    assert _idle_finding(report, empty, Thresholds()) is None
    assert _matmul_finding(report, empty, zero_row, Thresholds()) is None
    assert _host_ops_finding(report, empty, Thresholds()).evidence["ops_cover_pct"] == 100.0


def test_edges_a_matmul_part_without_a_top_kernel_a_phase_without_host_steps_two_steps_of_ops(b32: Report) -> None:
    """The breakdown's top-kernel lists hold no matmul kernel (they are cut at the top few): the matmul lever stands,
    with no kernel named, no slow path, no deep-dive command. A phase without host step times says None. Two steps
    of ops are 'each' step."""
    from max_profile.analyze.rules.idle import _idle_finding, _ops_bound_finding

    from ...analyze.rules.test_finding_ids import _ops_on_cpu

    p, row = _decode(b32)
    k = b32.kernels
    assert isinstance(k, KernelBreakdown)
    matmul = set(row.families)
    phases = [
        msgspec.structs.replace(ph, top_kernels=[r for r in ph.top_kernels if r.family not in matmul])
        for ph in k.phases
    ]
    tops = [r for r in k.top_kernels if r.family not in matmul]
    bare = msgspec.structs.replace(b32, kernels=msgspec.structs.replace(k, phases=phases, top_kernels=tops))
    f = _matmul_finding(bare, p, row, Thresholds())
    assert f is not None and f.id == "matmul-below-roofline" and f.evidence["top_matmul_kernel"] is None
    assert f.command is None and "kernel_names_it" not in f.evidence
    b64 = build_report(
        RawCapture.load(
            str(Path(__file__).parents[2] / "data" / "gpu" / "h200_llama3b_batch64_ledger" / "run_b64_3b_raw.json.gz")
        )
    )
    p64, _ = _decode(b64)
    idle = _idle_finding(b64, msgspec.structs.replace(p64, host_step_p50_ms=None), Thresholds())
    assert idle is not None and idle.evidence["host_step_p50_ms"] is None
    ops = _ops_on_cpu(0.6)
    assert ops.ledger is not None
    decode = next(ph for ph in ops.ledger.phases if ph.phase == "decode")  # type: ignore[union-attr]
    two = _ops_bound_finding(ops, msgspec.structs.replace(decode, steps=2), 60.0, Thresholds())
    assert "of each decode step" in two.title


def test_gpu_bound_without_a_decode_phase_without_family_rows_or_gpu_kernels() -> None:
    """Edges of the same capture: a ledger and a breakdown with prefill only give no verdict, even at a threshold of 0
    (no decode to judge, and the capture's share is not read where phases exist); a breakdown without family rows names
    no top family; MAX's op ranges on the host are not GPU kernels; the capture scope's confidence rounds to 2
    decimals."""
    from max_profile.analyze.rules.levers import rule_gpu_bound

    report = build_report(RawCapture.load(str(S13 / "run_b64_3b_sampled_raw.json.gz")))
    k, lg = report.kernels, report.ledger
    assert isinstance(k, KernelBreakdown) and isinstance(lg, StepLedger)
    prefill_only = msgspec.structs.replace(
        report,
        ledger=msgspec.structs.replace(lg, phases=[p for p in lg.phases if p.phase == "prefill"]),
        kernels=msgspec.structs.replace(k, phases=[p for p in k.phases if p.phase == "prefill"]),
    )
    assert rule_gpu_bound(prefill_only, Thresholds(gpu_bound_busy_pct=0.0)) == []
    flat = msgspec.structs.replace(report, ledger=None, kernels=msgspec.structs.replace(k, phases=[], families=[]))
    [f] = rule_gpu_bound(flat, Thresholds(gpu_bound_busy_pct=0.0, no_phase_confidence_scale=0.333))
    assert f.evidence["top_family"] is None and f.confidence == round(0.8 * 0.333, 2) == 0.27
    host = msgspec.structs.replace(report, kernels=msgspec.structs.replace(k, source="nvtx-log (MAX op ranges)"))
    assert rule_gpu_bound(host, Thresholds(gpu_bound_busy_pct=0.0)) == []


def test_healthy_dense_decode_every_field_and_its_edges() -> None:
    """A batch-1 run on the H200 (a healthy dense decode), its decode ledger phase given figures whose every rounding
    shows: the evidence field by field; the batch read off the ledger, else the decode cost; a ledger without decode;
    a phase without a per-token figure; the capture scope's confidence to 2 decimals."""
    from max_profile.analyze.rules.base import phase_of, worst_lever_pct
    from max_profile.analyze.rules.levers import rule_healthy_decode

    base = build_report(RawCapture.load(str(H200 / "h200_llama5b_every_verb" / "run_b1_raw.json.gz")))
    k, lg, cost = base.kernels, base.ledger, base.decode_cost
    assert isinstance(k, KernelBreakdown) and isinstance(lg, StepLedger) and cost is not None
    d = phase_of(k, "decode")
    assert d is not None and d.kernel_us_per_token is not None
    dl = msgspec.structs.replace(
        next(p for p in lg.phases if p.phase == "decode"), step_ms=2.3, recoverable_ms_per_step=0.123456
    )
    k = msgspec.structs.replace(
        k,
        phases=[
            p if p.phase != "decode" else msgspec.structs.replace(p, kernel_us_per_token=2931.1237) for p in k.phases
        ],
    )
    report = msgspec.structs.replace(
        base,
        kernels=k,
        ledger=msgspec.structs.replace(lg, phases=[p if p.phase != "decode" else dl for p in lg.phases]),
    )
    worst = worst_lever_pct(dl)
    assert round(worst, 1) != round(worst)  # the data tells one decimal from none
    [f] = rule_healthy_decode(report, TH)
    fam = d.families
    gemv = next(r for r in fam if r.family == "gemv")
    assert f.evidence == {
        "top_family": "gemv",
        "top_family_share_pct": round(fam[0].share_pct, 1),
        "top_families": ",".join(r.family for r in fam[:4]),
        "largest_lever_pct_of_step": round(worst, 1),
        "decode_step_ms": 2.3,
        "recoverable_ms_per_step": 0.1235,
        "batch": 1,
        "pct_of_ideal_step": round(100 * (dl.ideal_ms_per_step or 0) / 2.3, 1),
        "gemv_share_pct": round(gemv.share_pct, 1),
        "decode_kernel_us_per_token": 2931.12,
    }
    assert f.confidence == 0.8
    # the ledger's batch, not the decode cost's
    batched_cost = msgspec.structs.replace(report, decode_cost=msgspec.structs.replace(cost, batch=64))
    assert [x.id for x in rule_healthy_decode(batched_cost, TH)] == ["healthy-dense-decode"]
    # without a ledger the decode cost's batch: 64 needs a ledger to call a batched decode healthy
    assert rule_healthy_decode(msgspec.structs.replace(batched_cost, ledger=None), TH) == []
    # a ledger without a decode phase: the breakdown's decode is still read
    no_decode = msgspec.structs.replace(
        report, ledger=msgspec.structs.replace(lg, phases=[p for p in lg.phases if p.phase != "decode"])
    )
    [g] = rule_healthy_decode(no_decode, TH)
    assert "largest_lever_pct_of_step" not in g.evidence
    # a decode phase without a per-token figure
    no_rate = msgspec.structs.replace(
        report,
        kernels=msgspec.structs.replace(
            k,
            phases=[
                p if p.phase != "decode" else msgspec.structs.replace(p, kernel_us_per_token=None) for p in k.phases
            ],
        ),
    )
    assert rule_healthy_decode(no_rate, TH)[0].evidence["decode_kernel_us_per_token"] == 0
    flat = msgspec.structs.replace(base, ledger=None, kernels=msgspec.structs.replace(k, phases=[]))
    [c] = rule_healthy_decode(flat, Thresholds(no_phase_confidence_scale=0.333))
    assert c.confidence == round(0.8 * 0.333, 2) == 0.27


def test_decode_bandwidth_needs_a_decode_cost_with_a_peak_to_compare() -> None:
    from max_profile.analyze.rules.levers import rule_decode_bandwidth

    base = build_report(RawCapture.load(str(H200 / "h200_llama5b_every_verb" / "run_b1_raw.json.gz")))
    cost = base.decode_cost
    assert cost is not None and cost.step.pct_of_peak_bandwidth is not None
    assert [f.id for f in rule_decode_bandwidth(base, TH)] == ["decode-bandwidth"]
    unknown_peak = msgspec.structs.replace(
        base,
        decode_cost=msgspec.structs.replace(cost, step=msgspec.structs.replace(cost.step, pct_of_peak_bandwidth=None)),
    )
    assert rule_decode_bandwidth(unknown_peak, TH) == []
    assert rule_decode_bandwidth(msgspec.structs.replace(base, decode_cost=None), TH) == []
