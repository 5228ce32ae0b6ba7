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

from .conftest import DATA

NOT_CAPTURES = (".md", ".txt", ".tsv", ".log", ".npz", ".csv", ".csv.gz")


def _raw_captures() -> list[Path]:
    """Every raw capture and trace under tests/data with a kernel timeline (saved reports carry their own figures)."""
    out = []
    for path in sorted(p for p in DATA.rglob("*") if p.is_file() and not p.name.endswith(NOT_CAPTURES)):
        if path.name == "golden_reports.json.gz":
            continue
        try:
            loaded = max_profile.load(str(path))
        except MaxProfileError:
            continue
        if isinstance(loaded, RawCapture) and len(loaded.kernels):
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
    raws = [built(p)[0] for p in CAPTURES]
    assert len(CAPTURES) >= 30
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


FULL = DATA / "h200" / "session13" / "run_b64_3b_all_raw.json.gz"
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
