"""Seeing and comparing runs: the Perfetto trace (parsed back with perfetto's own protos), the HTML page, `diff`
with its noise-aware test and exit codes, and the pytest plugin — on real H200 captures."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import msgspec
import numpy as np
import pytest

from max_profile.analyze.breakdown import valid_kernels
from max_profile.analyze.report import build_report
from max_profile.model import RawCapture
from max_profile.render.html import SECTIONS, render_html
from max_profile.render.perfetto import (
    COUNTER_TRACK_BASE,
    GPU_TRACK_BASE,
    STEPS_TRACK,
    THREAD_TRACK_BASE,
    build_perfetto,
)

from ..conftest import DATA, run_cli

H200 = DATA / "gpu"
TRACING = H200 / "h200_llama5b_cupti_recorder"


def _parse(data: bytes):  # type: ignore[no-untyped-def]
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    return pb.Trace.FromString(data)


def test_perfetto_trace_holds_every_kernel_step_launch_and_sample() -> None:
    raw = RawCapture.load(str(TRACING / "run_cupti_raw.json.gz"))
    trace = _parse(build_perfetto(raw))
    events = [p for p in trace.packet if p.HasField("track_event")]
    kinds = Counter((p.track_event.type, p.track_event.track_uuid // 1_000_000) for p in events)
    n = len(raw.kernels)
    assert kinds[(1, GPU_TRACK_BASE // 1_000_000)] == kinds[(2, GPU_TRACK_BASE // 1_000_000)] == n == 5586
    assert kinds[(3, THREAD_TRACK_BASE // 1_000_000)] == n  # one launch instant per kernel
    work = [s for s in raw.steps if s.batch_size]
    steps = [p for p in events if p.track_event.track_uuid == STEPS_TRACK and p.track_event.type == 1]
    assert len(steps) == len(work) == 65
    counters = [p for p in events if p.track_event.track_uuid >= COUNTER_TRACK_BASE]
    assert len(counters) == 3 * len(raw.samples)
    interned = next(p for p in trace.packet if p.HasField("interned_data")).interned_data
    names = {e.iid: e.name for e in interned.event_names}
    cats = {e.iid: e.name for e in interned.event_categories}
    begins = [
        p.track_event
        for p in events
        if p.track_event.type == 1
        and p.track_event.track_uuid >= GPU_TRACK_BASE
        and p.track_event.track_uuid < THREAD_TRACK_BASE
    ]
    assert Counter(names[b.name_iid] for b in begins) == Counter(raw.kernels.name_of(i) for i in range(n))
    assert {cats[b.category_iids[0]] for b in begins} >= {"gemv", "gemm", "attention", "norm"}
    # flows: every launch instant starts the arrow its kernel ends
    starts = {f for p in events if p.track_event.type == 3 for f in p.track_event.flow_ids}
    ends = {f for b in begins for f in b.terminating_flow_ids}
    assert starts == ends and len(ends) == n
    grid = [a for b in begins for a in b.debug_annotations if a.name_iid == 1]
    assert len(grid) == n
    ts = [
        p.timestamp
        for p in trace.packet
        if p.HasField("track_event") and GPU_TRACK_BASE <= p.track_event.track_uuid < COUNTER_TRACK_BASE
    ]
    assert ts == sorted(ts)


def test_perfetto_of_a_trace_clock_import_has_no_host_counters(tmp_path: Path) -> None:
    db = tmp_path / "small.sqlite"
    db.write_bytes(gzip.decompress((H200 / "h200_llama180m_host_bound/small_nsys.sqlite.gz").read_bytes()))
    res = run_cli("report", str(db), "--perfetto", str(tmp_path / "t.pftrace"), timeout=120)
    assert res.returncode == 0, res.stderr
    trace = _parse((tmp_path / "t.pftrace").read_bytes())
    begins = [p for p in trace.packet if p.HasField("track_event") and p.track_event.type == 1]
    assert sum(1 for p in begins if p.track_event.track_uuid == STEPS_TRACK) == 41  # our ranges are the steps
    assert sum(1 for p in begins if GPU_TRACK_BASE <= p.track_event.track_uuid < THREAD_TRACK_BASE) == 2046


def test_perfetto_of_a_serve_sweep_has_load_windows_and_non_overlapping_request_lanes() -> None:
    from max_profile.render.perfetto import LOAD_TRACK, REQUEST_TRACK_BASE, request_lanes

    raw = RawCapture.load(str(DATA / "cpu" / "serve_sweep_c1_c2_raw.json.gz"))
    trace = _parse(build_perfetto(raw))
    events = [p for p in trace.packet if p.HasField("track_event")]
    load = [p for p in events if p.track_event.track_uuid == LOAD_TRACK and p.track_event.type == 1]
    assert len(load) == len(raw.load_windows) == 2
    requests = [p for p in events if p.track_event.track_uuid >= REQUEST_TRACK_BASE and p.track_event.type == 1]
    assert len(requests) == len(raw.requests) > 0
    lanes = request_lanes(raw.requests)
    assert max(lanes) + 1 == 2  # concurrency 2 at most: two lanes
    for lane in set(lanes):
        spans = sorted((r.started_ns, r.ended_ns) for r, n in zip(raw.requests, lanes, strict=True) if n == lane)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), "requests overlap on one lane"


def test_invalid_kernels_stay_out_of_the_trace() -> None:
    raw = RawCapture.load(str(H200 / "h200_llama7b_gemv_decode/big_cupti_raw.json.gz"))
    trace = _parse(build_perfetto(raw))
    begins = sum(
        1
        for p in trace.packet
        if p.HasField("track_event")
        and p.track_event.type == 1
        and p.track_event.track_uuid >= GPU_TRACK_BASE
        and p.track_event.track_uuid < THREAD_TRACK_BASE
    )
    assert begins == int(valid_kernels(raw.kernels).sum()) == 19580


@pytest.mark.parametrize(
    "name",
    [
        "h200_llama1.75b_custom_architectures/arch_b_raw.json.gz",
        "h200_llama5b_cupti_recorder/serve_util_raw.json.gz",
        "h200_llama5b_cupti_recorder/run_graphs_raw.json.gz",
    ],
)
def test_html_sections_and_no_network(name: str) -> None:
    page = render_html(build_report(RawCapture.load(str(H200 / name))))
    for section in SECTIONS:
        assert f'id="{section}"' in page
    # the verdicts open the page (the first screen), before the summary cards and the ledger
    assert page.index('id="verdicts"') < page.index('id="summary"') < page.index('id="ledger"')
    assert "<script src=" not in page and "cdn." not in page.split("/* BEGIN bokeh.min.js */")[0]
    assert len(page) < 5_000_000


def test_html_plots_each_amd_partition() -> None:
    """Samples with per-partition (XCP) activity (amdsmi on a partitioned Instinct GPU) get a dashed line each."""
    raw = RawCapture.load(str(TRACING / "serve_util_raw.json.gz"))
    raw.samples = [
        msgspec.structs.replace(s, partition_activity_pct=[s.utilization_pct, s.utilization_pct / 2])
        for s in raw.samples
    ]
    page = render_html(build_report(raw))
    gpu = raw.samples[0].gpu
    assert f"{gpu} partition (XCP) 0" in page and f"{gpu} partition (XCP) 1" in page
    assert "partition (XCP)" not in render_html(build_report(RawCapture.load(str(TRACING / "serve_util_raw.json.gz"))))


def test_html_and_outputs_refuse_a_missing_folder(tmp_path: Path) -> None:
    res = run_cli(
        "report",
        str(H200 / "h200_llama1.75b_custom_architectures/arch_a_raw.json.gz"),
        "--html",
        str(tmp_path / "no" / "r.html"),
        timeout=120,
    )
    said = " ".join(res.stderr.split())  # the error wraps at the terminal's width, wherever the temp path ends
    assert res.returncode == 2 and "does not exist" in said and res.stderr.count("max-profile: error:") == 1
    assert not (tmp_path / "no").exists()
    ok = run_cli(
        "report",
        str(H200 / "h200_llama1.75b_custom_architectures/arch_a_raw.json.gz"),
        "--html",
        str(tmp_path / "r.html"),
        timeout=120,
    )
    assert ok.returncode == 0 and (tmp_path / "r.html").stat().st_size > 1_000_000
    assert not list(tmp_path.glob(".*.tmp"))


def _scaled(raw: RawCapture, factor: float, seed: int) -> RawCapture:
    """The same capture with decode steps (and the kernels they launched) slower by ``factor``, and a little noise."""
    rng = np.random.default_rng(seed)
    steps = []
    for s in raw.steps:
        d = s.duration_ns * (factor if s.phase == "decode" else 1.0) * rng.uniform(0.995, 1.005)
        steps.append(msgspec.structs.replace(s, end_ns=s.start_ns + int(d)))
    t = raw.kernels
    dur = (t.end_ns - t.start_ns) * factor
    kernels = msgspec.structs.replace(t, end_ns=np.where(t.start_ns >= 0, t.start_ns + dur.astype(np.int64), t.end_ns))
    return msgspec.structs.replace(raw, steps=steps, kernels=kernels)


def test_diff_exit_codes_and_verdicts(tmp_path: Path) -> None:
    base = RawCapture.load(str(H200 / "h200_llama1.75b_custom_architectures/arch_a_raw.json.gz"))
    base.save(str(tmp_path / "a.json.gz"))
    _scaled(base, 1.0, 1).save(str(tmp_path / "same.json.gz"))
    _scaled(base, 1.15, 2).save(str(tmp_path / "slow.json.gz"))
    same = run_cli(
        "diff",
        str(tmp_path / "a.json.gz"),
        str(tmp_path / "same.json.gz"),
        "--json",
        str(tmp_path / "same.json"),
        timeout=120,
    )
    assert same.returncode == 0, same.stdout + same.stderr
    assert json.loads((tmp_path / "same.json").read_text())["regression"] is False
    slow = run_cli(
        "diff",
        str(tmp_path / "a.json.gz"),
        str(tmp_path / "slow.json.gz"),
        "--html",
        str(tmp_path / "d.html"),
        timeout=120,
    )
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert "REGRESSION: decode per token (host step time) +14.9 % (p < 0.001)" in slow.stdout
    assert (tmp_path / "d.html").exists()
    lenient = run_cli(
        "diff", str(tmp_path / "a.json.gz"), str(tmp_path / "slow.json.gz"), "--fail-above", "20", timeout=120
    )
    assert lenient.returncode == 0, lenient.stdout  # significant, but under the threshold


def test_diff_refuses_unrelated_runs_and_bad_files(tmp_path: Path) -> None:
    res = run_cli(
        "diff",
        str(H200 / "h200_llama180m_host_bound/small_cupti_raw.json.gz"),
        str(H200 / "h200_llama7b_gemv_decode/big_cupti_raw.json.gz"),
        timeout=120,
    )
    assert res.returncode == 2 and "not comparable" in res.stderr and "num_hidden_layers" in res.stderr
    forced = run_cli(
        "diff",
        str(H200 / "h200_llama180m_host_bound/small_cupti_raw.json.gz"),
        str(H200 / "h200_llama7b_gemv_decode/big_cupti_raw.json.gz"),
        "--force",
        timeout=120,
    )
    assert forced.returncode == 1 and "REGRESSION" in forced.stdout  # 32 layers are slower than 4
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes((H200 / "h200_llama180m_host_bound/small_cupti_raw.json.gz").read_bytes()[:3000])
    bad = run_cli("diff", str(H200 / "h200_llama180m_host_bound/small_cupti_raw.json.gz"), str(cut), timeout=120)
    assert bad.returncode == 2 and "truncated or corrupt gzip" in bad.stderr and "Traceback" not in bad.stderr


def test_one_noisy_step_is_no_verdict() -> None:
    from max_profile.analyze.diff import diff_reports

    base = RawCapture.load(str(H200 / "h200_llama1.75b_custom_architectures/arch_a_raw.json.gz"))
    noisy = _scaled(base, 1.0, 3)
    worst = max(
        range(len(noisy.steps)), key=lambda i: noisy.steps[i].duration_ns if noisy.steps[i].phase == "decode" else 0
    )
    steps = list(noisy.steps)
    steps[worst] = msgspec.structs.replace(
        steps[worst], end_ns=steps[worst].start_ns + 50 * steps[worst].duration_ns
    )  # one 50x step
    result = diff_reports(build_report(base), build_report(msgspec.structs.replace(noisy, steps=steps)))
    assert not result.regression and result.outcome == "no regression"
    assert result.verdicts == [result.verdicts[-1]] and result.verdicts[0].startswith("no regression: ")


def test_pytest_plugin_gate(pytester: pytest.Pytester, tmp_path: Path) -> None:
    base = RawCapture.load(str(H200 / "h200_llama1.75b_custom_architectures/arch_a_raw.json.gz"))
    _scaled(base, 1.0, 4).save(str(tmp_path / "now_same.json.gz"))
    _scaled(base, 1.2, 5).save(str(tmp_path / "now_slow.json.gz"))
    pytester.makepyfile(
        test_gate=f"""
        from max_profile.model import RawCapture
        def test_same(max_profile):
            max_profile.check(RawCapture.load({str(tmp_path / "now_same.json.gz")!r}),
                              {str(tmp_path / "baseline.json.gz")!r})
        def test_slow(max_profile):
            max_profile.check(RawCapture.load({str(tmp_path / "now_slow.json.gz")!r}),
                              {str(tmp_path / "baseline.json.gz")!r})
    """
    )
    first = pytester.runpytest("-k", "test_same", "-W", "ignore")
    first.assert_outcomes(passed=1)  # no baseline yet: written
    assert (tmp_path / "baseline.json.gz").exists()
    second = pytester.runpytest("-W", "ignore")
    second.assert_outcomes(passed=1, failed=1)
    second.stdout.fnmatch_lines(["*significant regression against*", "*REGRESSION: decode per token*"])
    updated = pytester.runpytest("--max-profile-update-baselines", "-W", "ignore")
    updated.assert_outcomes(passed=2)
