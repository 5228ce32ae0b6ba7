"""Every view from the one account: on every recorded capture (CPU, GPU, imported traces; sampled and full), each view's
per-phase figures are the step ledger's, the levers of a phase never sum past its step, ``diff`` of a capture with
itself is exactly zero with no verdict, and nothing prints NaN or infinity. Then the cases that once slipped past the
suite: a recording of a share of the steps, a tied embedding, a Kineto launch time, kernels starting at one instant."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import msgspec
import numpy as np
import pytest

import max_profile
from max_profile.analyze.account import WHOLE_STEP
from max_profile.analyze.diff import diff_reports
from max_profile.analyze.report import build_report
from max_profile.collect.live.recorders import launched_within, spans_of_recorded_work
from max_profile.errors import MaxProfileError
from max_profile.model import KernelBreakdown, KernelTable, RawCapture, Report, Step, StepLedger
from max_profile.render.telemetry import report_metrics
from max_profile.render.text import render_text

from ..conftest import DATA

NOT_CAPTURES = (".md", ".txt", ".tsv", ".log", ".npz", ".csv", ".csv.gz")


def _raw_captures() -> list[Path]:
    """Every saved raw capture (named ``*_raw.json*``, as the recordings are) and every trace under tests/data, told
    apart by name and by the format's first bytes: nothing is decoded while the tests are collected (decoding every
    file costs ~12 s in each process that collects the suite). Saved reports carry their own figures and are left
    out."""
    from max_profile.collect.readers.sources import detect_format

    out = []
    for path in sorted(p for p in DATA.rglob("*") if p.is_file() and not p.name.endswith(NOT_CAPTURES)):
        if path.name == "golden_reports.json.gz":
            continue
        try:
            source = detect_format(str(path))
        except MaxProfileError:
            continue
        if "_raw.json" in path.name or (source.describe and not source.saved):  # a named trace format, not a guess
            out.append(path)
    return out


CAPTURES = _raw_captures()
_built: dict[Path, tuple[RawCapture, Report]] = {}


def built(path: Path) -> tuple[RawCapture, Report]:
    if path not in _built:
        raw = max_profile.load(str(path))
        assert isinstance(raw, RawCapture)
        _built[path] = (raw, build_report(raw))
    return _built[path]


def test_the_captures_cover_sampled_full_imported_and_cpu() -> None:
    raws = [r for r in (built(p)[0] for p in CAPTURES) if len(r.kernels)]
    assert len(raws) >= 30
    assert sum(bool(r.recorded_spans) for r in raws) >= 4  # sampled recordings
    assert sum(r.kernel_clock == "trace" for r in raws) >= 2  # imported traces (nsys)
    assert sum(r.environment.vendor == "none" for r in raws) >= 2  # MAX's op ranges on a CPU


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(DATA)))
def test_every_view_reads_the_ledger(path: Path) -> None:
    raw, report = built(path)
    k, lg = report.kernels, report.ledger
    if not isinstance(k, KernelBreakdown) or not isinstance(lg, StepLedger) or lg.source == "server metrics":
        pytest.skip("no kernel ledger to hold the views to")
    metrics = {(s.name, attrs.get("phase")): values[0] for s in report_metrics(report) for attrs, values in s.points}
    for lp in lg.phases:
        bp = next(p for p in k.phases if p.phase == lp.phase)
        kernel_ms = sum(r.ms_per_step for r in lp.rows if r.kind == "kernels")
        # the breakdown's row: the ledger's steps, busy share, kernel time and kernels per recorded step
        assert bp.steps == lp.steps and bp.steps_in_capture == lp.steps_in_capture
        assert bp.gpu_busy_pct == lp.busy_pct
        assert bp.kernel_ms_per_step == pytest.approx(kernel_ms, abs=1e-6)
        assert bp.kernels_per_step == lp.kernels_per_step
        assert bp.wall_ms == pytest.approx(lp.step_ms * lp.steps, abs=1e-5)
        if bp.tokens_per_step:
            assert bp.kernel_us_per_token == pytest.approx(1e3 * kernel_ms / bp.tokens_per_step, rel=1e-3)
        # a sampled recording's per-step list holds its recorded steps: their observed shares sum to its steps
        listed = [s for s in k.per_step if s.phase == lp.phase]
        if len(k.per_step) < 4096:
            assert round(sum(s.observed for s in listed)) == lp.steps
        # the metrics exported (Prometheus / OTel) are the same numbers
        assert metrics[("maxserve.gpu.busy", lp.phase)] == lp.busy_pct
        assert metrics[("maxserve.kernel.time_per_step", lp.phase)] == bp.kernel_ms_per_step
        # the levers of a phase never sum past its step: the same time is never two levers
        levers = [f.lever.ms_per_step for f in report.findings if f.lever is not None and f.lever.phase == lp.phase]
        assert sum(levers) <= lp.step_ms * 1.0001, (lp.phase, [f.id for f in report.findings if f.lever])


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(DATA)))
def test_a_capture_against_itself_is_no_change_and_no_view_prints_nan(path: Path) -> None:
    raw, report = built(path)
    same = diff_reports(report, report, a_raw=raw, b_raw=raw)
    assert same.comparable and not same.regression
    assert all(line.delta == 0 and not line.significant for line in same.lines)
    assert [v for v in same.verdicts if v.startswith(("REGRESSION", "slower", "faster", "changed"))] == []
    text = render_text(report)
    assert not re.search(r"\bnan\b|\binf\b", text, re.IGNORECASE), text
    doc = json.loads(report.to_json())
    floats = [x for x in _numbers(doc) if isinstance(x, float)]
    assert all(math.isfinite(x) for x in floats)


def _numbers(doc: object) -> list[object]:
    if isinstance(doc, dict):
        return [x for v in doc.values() for x in _numbers(v)]
    if isinstance(doc, list):
        return [x for v in doc for x in _numbers(v)]
    return [doc]


def _sampled(raw: RawCapture, slice_steps: int = 8, share: float = 1 / 16) -> RawCapture:
    """The full recording cut as the default recorder records: the first ``slice_steps`` work steps, then a pause of
    fifteen times as many, then the next slice...; only the kernels launched inside a slice kept."""
    work = sorted((s for s in raw.steps if s.batch_size > 0), key=lambda s: s.start_ns)
    period = round(slice_steps / share)
    spans = [(work[i].start_ns, work[min(i + slice_steps, len(work)) - 1].end_ns) for i in range(0, len(work), period)]
    window = (work[0].start_ns, max(work[-1].end_ns, int(raw.kernels.end_ns.max())))
    if spans[-1][1] == work[-1].end_ns:  # a slice still open at the end closes with the recording (after the GPU)
        spans[-1] = (spans[-1][0], window[1])
    kept = launched_within(raw.kernels, spans)
    recorded = spans_of_recorded_work(kept, spans, window[1])  # as the recorder hands them to the analysis
    return msgspec.structs.replace(raw, kernels=kept, recorded_spans=recorded, window_ns=window)


FULL = DATA / "gpu" / "h200_llama3b_sampled_recording" / "run_b64_3b_all_raw.json.gz"
"""A batch-64 decode of a 3B-shaped model with every step recorded (128 decode steps, device graphs on)."""


@pytest.mark.parametrize(("share", "recorded", "busy_points"), [(1 / 16, 8, 8.0), (1 / 4, 32, 2.0)])
def test_a_share_of_the_steps_reads_as_the_whole_recording(share: float, recorded: int, busy_points: float) -> None:
    """The same generation recorded whole and cut as the recorder records a share of its steps: the per-step figures
    of the decode phase stay within a few per cent of the whole recording's (the truth), none divided by the steps not
    recorded. (The sixteenth's busy share is that of its 8 steps, 7 of them the first decode steps: 88 %, not 94 %.)"""
    full = build_report(RawCapture.load(str(FULL)))
    part = build_report(_sampled(RawCapture.load(str(FULL)), share=share))
    fk, pk = full.kernels, part.kernels
    assert isinstance(fk, KernelBreakdown) and isinstance(pk, KernelBreakdown)
    fd = next(p for p in fk.phases if p.phase == "decode")
    pd = next(p for p in pk.phases if p.phase == "decode")
    assert (fd.steps, fd.steps_in_capture) == (128, 128)
    assert (pd.steps, pd.steps_in_capture) == (recorded, 128)
    assert pd.kernels_per_step == fd.kernels_per_step == 266.0  # every decode step launches 266 kernels
    assert pd.kernel_ms_per_step == pytest.approx(fd.kernel_ms_per_step, rel=0.05)
    assert pd.kernel_us_per_token == pytest.approx(fd.kernel_us_per_token, rel=0.05)
    assert pd.gpu_busy_pct == pytest.approx(fd.gpu_busy_pct, abs=busy_points)
    # diff of the two: the kernel time per step did not change
    result = diff_reports(full, part)
    decode = next(line for line in result.lines if line.metric == "decode kernel time per step")
    assert abs(decode.delta_pct or 0.0) < 5 and not decode.regression
    assert decode.samples[1] == sum(1 for s in pk.per_step if s.phase == "decode" and s.observed >= WHOLE_STEP)


# ------------------------------------------------------------------------------------------------------------------
# Cases that passed the whole suite while wrong


def test_a_tied_embedding_is_read_once_per_step() -> None:
    """Tied embeddings: the output projection reads the embedding table, so a decode step reads the layers and that
    table once (never the table again as an lm_head); untied: the layers, the lm_head, and no table."""
    from max_profile.analyze.roofline import step_cost
    from max_profile.model import ModelWeights, WeightGroup

    cfg = {
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "intermediate_size": 4096,
        "vocab_size": 32000,
        "torch_dtype": "bfloat16",
    }
    layers = WeightGroup(bytes=50_000_000, elements=25_000_000, tensors=18)
    table = WeightGroup(bytes=65_536_000, elements=32_768_000, tensors=1)
    head = WeightGroup(bytes=70_000_000, elements=35_000_000, tensors=1)
    tied = ModelWeights(
        source="t", groups={"layers": layers, "embedding": table}, dtypes={"BF16": 1}, tied_embeddings=True
    )
    untied = ModelWeights(
        source="u",
        groups={"layers": layers, "embedding": table, "lm_head": head},
        dtypes={"BF16": 1},
        tied_embeddings=False,
    )
    a = step_cost(cfg, tied, batch=1, context_tokens=100)
    b = step_cost(cfg, untied, batch=1, context_tokens=100)
    assert a is not None and b is not None
    assert a["weight_bytes"] == 50_000_000 + 65_536_000
    assert b["weight_bytes"] == 50_000_000 + 70_000_000
    assert a["matmul_flops"] == 2.0 * (25_000_000 + 32_768_000)
    assert b["matmul_flops"] == 2.0 * (25_000_000 + 35_000_000)
    assert a["embedding_bytes"] == b["embedding_bytes"] == 65_536_000 / 32_768_000 * 1024  # one row gathered


def test_a_kineto_kernel_is_asked_for_at_the_start_of_its_launch_call(tmp_path: Path) -> None:
    """A launch call's start is when the kernel was asked for (the step that holds it owns the kernel); its end can lie
    in the next step."""
    events = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 100.0, "dur": 40.0, "tid": 7,
         "args": {"correlation": 11}},
        {"ph": "X", "cat": "kernel", "name": "gemv_split_k_0123456789abcdef", "ts": 150.0, "dur": 20.0, "pid": 0,
         "tid": 7, "args": {"correlation": 11, "device": 0, "stream": 7}},
    ]  # fmt: skip
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    raw = max_profile.load(str(path))
    assert isinstance(raw, RawCapture) and raw.kernels.launch_ns is not None
    assert int(raw.kernels.start_ns[0] - raw.kernels.launch_ns[0]) == 50_000  # 150 us - 100 us, not 150 - 140
    assert list(raw.kernels.launch_tid or []) == [7]


def test_kernels_starting_at_one_instant_keep_their_recorded_order() -> None:
    """Each gap before a pair of kernels that start at the same nanosecond (an eager kernel recorded first, a
    device-graph kernel second) ends at the first recorded: idle between launches, none before a graph. A sort that
    does not keep the recorded order of equal starts moves part of it to "before graph"."""
    from max_profile.analyze.ledger import IDLE_BEFORE_GRAPH, IDLE_BETWEEN_LAUNCHES, build_ledger
    from max_profile.analyze.thresholds import Thresholds

    n = 3000
    pairs = np.random.default_rng(7).permutation(n)  # records come in the recorder's order, not sorted by start
    starts = np.repeat(pairs.astype(np.int64) * 10_000, 2)  # a pair every 10 us
    ends = starts + 4_000
    graph = np.tile(np.array([0, 1], dtype=np.int64), n)  # the eager one recorded first in each pair
    table = KernelTable(
        names=["elementwise_0123456789abcdef", "gemv_split_k_0123456789abcdef"],
        name_idx=np.tile(np.array([0, 1], dtype=np.int32), n),
        start_ns=starts,
        end_ns=ends,
        device=np.zeros(2 * n, dtype=np.int32),
        launch_ns=starts - 1_000,
        graph_id=graph,
    )
    steps = [Step(index=0, phase="decode", batch_size=1, input_tokens=1, context_tokens=10, start_ns=-1_000,
                  end_ns=n * 10_000)]  # fmt: skip
    lg = build_ledger(table, steps, window=None, model_config=None, weights=None, gpu=None, th=Thresholds())
    assert lg is not None
    rows = {r.part: r.ms_per_step for r in lg.phases[0].rows if r.kind == "idle"}
    assert IDLE_BEFORE_GRAPH not in rows
    # 6 us after each pair, and the 1 us from the step's start to the first pair
    assert rows[IDLE_BETWEEN_LAUNCHES] == pytest.approx((n * 6_000 + 1_000) / 1e6, abs=1e-9)


# ------------------------------------------------------------------------------------------------------------------
# Load verdicts need load; printed commands run as printed

ATTACH = DATA / "gpu" / "h200_llama3b_batch64_ledger" / "attach_idle_3b_raw.json.gz"
"""``attach`` with ``--probe`` on an idle H200 server (3 requests of ours in 10 s; its metrics port unreadable)."""


def _metrics(t_ns: int, batches: int, exec_ms: float, requests: int) -> object:
    from max_profile.model import MetricPoint, MetricsScrape

    points = [
        MetricPoint("maxserve_request_count_total", {}, float(requests)),
        MetricPoint("maxserve_batch_execution_time_milliseconds_count", {"batch_type": "TG"}, float(batches)),
        MetricPoint("maxserve_batch_execution_time_milliseconds_sum", {"batch_type": "TG"}, batches * exec_ms),
        MetricPoint("maxserve_batch_execution_time_milliseconds_count", {"batch_type": "CE"}, float(requests)),
        MetricPoint("maxserve_batch_execution_time_milliseconds_sum", {"batch_type": "CE"}, requests * 20.0),
    ]
    return MetricsScrape(t_ns=t_ns, url="http://127.0.0.1:8124/metrics", points=points)


def _attach_without_probe(metrics: bool, batches: int = 0) -> Report:
    """The idle attach window with no request of ours; the server's metrics unreadable, or read with ``batches``
    decode batches of 2 ms in the window."""
    raw = RawCapture.load(str(ATTACH))
    w = raw.load_windows[0]
    before = _metrics(w.window_ns[0], 1000, 2.0, 10) if metrics else w.metrics_before
    after = _metrics(w.window_ns[1], 1000 + batches, 2.0, 10 + batches // 64) if metrics else w.metrics_after
    window = msgspec.structs.replace(w, requests=[], metrics_before=before, metrics_after=after)
    return build_report(msgspec.structs.replace(raw, load_windows=[window], requests=[]))


def test_an_idle_attached_server_is_never_host_bound() -> None:
    """Without --probe, on an idle GPU server: its metrics say it ran no batch (lightly loaded, the sweep to run next,
    with the server's own URL and metrics URL), or they cannot be read (the idle verdicts are skipped with the reason,
    and the next command is the same window with a few requests of ours). Never host-bound, never a NaN."""
    idle = _attach_without_probe(metrics=True)
    ids = [f.id for f in idle.findings]
    assert "host-bound" not in ids and "lightly-loaded" in ids
    (light,) = [f for f in idle.findings if f.id == "lightly-loaded"]
    assert light.evidence["loaded_pct"] == 0.0 and light.evidence["measured_as"] == "batches executing (server metrics)"
    assert idle.next_measurement == (
        "max-profile attach http://127.0.0.1:8123 --metrics-url http://127.0.0.1:8124/metrics --concurrency 1,4,16"
    )
    text = render_text(idle)
    assert "nan" not in text.lower() and "CE 0," in text and "TG 0 " in text
    unknown = _attach_without_probe(metrics=False)
    assert "host-bound" not in [f.id for f in unknown.findings]
    (skipped,) = [s for s in unknown.rules_skipped if s.rule == "gpu-idle"]
    assert "load over the window is not known" in skipped.reason
    assert unknown.next_measurement is not None and unknown.next_measurement.startswith(
        "max-profile attach http://127.0.0.1:8123 --metrics-url http://127.0.0.1:8124/metrics --probe"
    )
    # a busy server's metrics: 4,500 decode batches of 2 ms in the 10 s window is load (90 %), not lightly loaded
    busy = _attach_without_probe(metrics=True, batches=4500)
    assert "lightly-loaded" not in [f.id for f in busy.findings]


def test_printed_commands_name_the_programs_of_this_environment() -> None:
    """A report made where ``max-profile``, ``max`` and ``pip`` are scripts of a virtual environment not on PATH prints
    them by their paths (the README's set-up runs ``.venv/bin/max-profile``)."""
    from max_profile.model.command_text import cli

    raw = RawCapture.load(str(DATA / "gpu" / "h200_llama5b_serve_steps_startup" / "demo_raw.json.gz"))
    bin_dir = "/opt/venv with space/bin"
    env = msgspec.structs.replace(
        raw.environment, programs={"max-profile": f"{bin_dir}/max-profile", "pip": f"{bin_dir}/pip"}
    )
    report = build_report(msgspec.structs.replace(raw, environment=env))
    host = next(f for f in report.findings if f.id == "host-bound" and f.command is not None)
    assert host.command is not None
    line = cli(host.command)
    assert line.startswith(f"'{bin_dir}/pip' install py-spy && '{bin_dir}/py-spy' record -o host.svg -- ")
    assert f"-- '{bin_dir}/max-profile' run --model-path" in line and "--native" not in line
    plain = build_report(raw)
    plain_host = next(f for f in plain.findings if f.id == "host-bound" and f.command is not None)
    assert plain_host.command is not None
    assert cli(plain_host.command).startswith("pip install py-spy && py-spy record -o host.svg -- max-profile run")


def test_the_programs_here_are_the_scripts_beside_this_interpreter() -> None:
    import shutil
    import sys

    from max_profile.collect.probes.environment import programs_here
    from max_profile.util.procs import max_command

    here = Path(sys.executable).parent
    found = programs_here()
    for name in ("max-profile", "max", "pip"):
        script = here / name
        expected = script.is_file() and shutil.which(name) != str(script)
        assert (name in found) == expected and (not expected or found[name] == str(script))
    cmd = max_command()
    assert cmd[0] == str(here / "max") if (here / "max").exists() else cmd[0] in (shutil.which("max"), sys.executable)


def test_a_start_up_counts_from_the_command_when_the_process_ran_another_program_first() -> None:
    from max_profile.collect.probes.startup import EXEC_GAP_S, process_start

    assert process_start(1000.0, 1000.4) == 1000.0  # the interpreter's own start: the process's creation
    assert process_start(1000.0, 1000.0 + EXEC_GAP_S + 361) == 1000.0 + EXEC_GAP_S + 361  # a shell ran pip first
    assert process_start(1000.0, None) == 1000.0  # a user's own program: its process
    assert process_start(None, 5.0) == 5.0


def test_serve_idle_is_a_lever_net_of_the_recordings_measured_share() -> None:
    """A served decode step idle 1.87 of 5.44 ms recorded, the server's own step 5.11 ms untraced: the recording's
    0.33 ms comes off, the 1.54 ms the untraced server idles too is the lever, beside the tracer's own finding."""
    from max_profile.analyze.rules import evaluate_rules
    from max_profile.analyze.thresholds import Thresholds
    from max_profile.model import LedgerRow, PhaseLedger, TracerCost

    raw, report = built(DATA / "gpu" / "h200_llama3b_batch64_ledger" / "serve_kernels_3b_raw.json.gz")
    assert isinstance(report.ledger, StepLedger)
    rows = [
        LedgerRow(part="matmul: gemm", kind="kernels", ms_per_step=3.57, share_pct=65.6, families=["gemm"]),
        LedgerRow(part="GPU idle: between launches", kind="idle", ms_per_step=1.87, share_pct=34.4),
    ]
    decode = PhaseLedger(phase="decode", steps=600, step_ms=5.44, host_step_p50_ms=5.4, batch=1,
                         tokens_per_step=1.0, rows=rows, busy_pct=65.6)  # fmt: skip
    cost = TracerCost(
        concurrency=1,
        reference_tok_s=190.0,
        traced_tok_s=175.6,
        throughput_ratio=0.924,
        throughput_ratio_noise=0.009,
        reference_decode_step_ms=5.11,
        traced_decode_step_ms=5.44,
    )
    served = msgspec.structs.replace(
        report, ledger=msgspec.structs.replace(report.ledger, phases=[decode]), tracer_cost=cost
    )
    found, skipped = evaluate_rules(served, Thresholds())
    ids = [f.id for f in found]
    assert "tracer-overhead" in ids
    (idle,) = [f for f in found if f.id == "gpu-idle"]
    assert idle.lever is not None and idle.lever.ms_per_step == pytest.approx(1.54)
    assert idle.evidence["idle_from_recording_ms_per_step"] == pytest.approx(0.33)
    assert "0.33 ms of that was the recording's own" in idle.title
    # the same capture without the measured reference: the tracer finding explains the idle, and says it dropped it
    unmeasured = msgspec.structs.replace(served, tracer_cost=None)
    k = unmeasured.kernels
    assert isinstance(k, KernelBreakdown)
    traced = msgspec.structs.replace(unmeasured, kernels=msgspec.structs.replace(k, tracer_overhead_pct=9.0))
    found2, skipped2 = evaluate_rules(traced, Thresholds())
    assert "gpu-idle" not in [f.id for f in found2]
    assert any(s.rule == "gpu-idle" and s.reason.startswith("gpu-idle superseded by tracer-overhead") for s in skipped2)


def test_a_gate_never_fails_on_host_timing_a_run_says_was_under_load() -> None:
    """B's decode steps 30 % slower with other processes holding the cores: shown, not judged, and said; with the GPU's
    kernel time unchanged the gate passes. On a quiet machine the same slowdown fails it."""
    from max_profile.model import HostLoad

    quiet_load = HostLoad(window_s=2.0, cores=16, cpu_busy_pct=8.0, own_cores=1.0, other_cores=0.2)
    recorded = RawCapture.load(str(DATA / "gpu" / "h200_llama5b_every_verb" / "run_b1_raw.json.gz"))
    raw = msgspec.structs.replace(recorded, capture=msgspec.structs.replace(recorded.capture, host_load=quiet_load))
    slow = msgspec.structs.replace(
        raw,
        steps=[
            msgspec.structs.replace(s, end_ns=s.start_ns + int(1.3 * s.duration_ns)) if s.phase == "decode" else s
            for s in raw.steps
        ],
    )
    a = build_report(raw)
    quiet = diff_reports(a, build_report(slow))
    assert quiet.regression and any(
        v.startswith("REGRESSION: decode per token (host step time)") for v in quiet.verdicts
    )
    busy = HostLoad(window_s=1.0, cores=16, cpu_busy_pct=60.0, own_cores=1.0, other_cores=4.5)
    loaded = build_report(msgspec.structs.replace(slow, capture=msgspec.structs.replace(slow.capture, host_load=busy)))
    result = diff_reports(a, loaded, b_label="B")
    assert not result.regression
    host = next(x for x in result.lines if x.metric == "decode per token (host step time)")
    assert host.delta_pct is not None and host.delta_pct > 25 and not host.judged and not host.significant
    kernel = next(x for x in result.lines if x.metric == "decode kernel time per step")
    assert kernel.judged and kernel.basis == "device" and kernel.delta == 0
    assert result.host_timing_unreliable == [
        "B: other processes used 4.50 of 16 CPU cores during the capture (a gate judges host timing under 25 % of them)"
    ]
    assert any(
        v.startswith("host timing not judged (shown only): B: other processes used 4.50") for v in result.verdicts
    )
