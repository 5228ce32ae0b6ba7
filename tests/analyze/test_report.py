"""``build_report``'s own decisions, one at a time: which steps it keeps, what it notes and in what words, where the
ledger comes from (a kernel timeline, the server's metrics, or why neither), the device-graph state read off the trace,
the decode cost model's inputs, the tracer's share of the window.

Synthetic captures with a known truth (tests/analyze/rules/test_rules.py's generator: steps and the kernels inside
them), changed one
field at a time; the real captures only where a field exists nowhere else."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from max_profile.analyze.report import build_report, decode_cost_of, observed_device_graphs, tracer_overhead_pct
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import (
    KernelBreakdown,
    KernelTotal,
    LoadWindow,
    RawCapture,
    Report,
    RequestRecord,
    ServeRun,
    StepLedger,
    Unavailable,
    UtilizationSection,
)
from max_profile.render.tables import decode_context_text, kv_text

from ..analyze.rules.test_rules import DENSE, _samples, synthetic

H200 = Path(__file__).parents[1] / "data" / "gpu"


def capture(n: int = 12, step_ms: float = 1.0) -> RawCapture:
    return synthetic([step_ms] * n, [DENSE] * n)


def notes(r: Report) -> str:
    return "\n".join(r.notes)


def test_tracer_share_of_the_window() -> None:
    assert tracer_overhead_pct(0.05, (0, 2_000_000_000)) == 2.5
    assert tracer_overhead_pct(None, (0, 1)) is None
    assert tracer_overhead_pct(0.1, None) is None
    assert tracer_overhead_pct(0.1, (5, 5)) is None and tracer_overhead_pct(0.1, (6, 5)) is None
    raw = msgspec.structs.replace(capture(), tracer_callback_s=0.002, window_ns=(0, 400_000_000))
    k = build_report(raw).kernels
    assert isinstance(k, KernelBreakdown) and k.tracer_overhead_pct == 0.5


def test_device_graphs_read_off_the_trace() -> None:
    raw = capture()
    k = build_report(raw).kernels
    assert isinstance(k, KernelBreakdown)
    assert observed_device_graphs(raw, k) == (None, "")  # no graph column: cannot tell
    assert observed_device_graphs(raw, None) == (None, "")
    launches = msgspec.structs.replace(raw, graph_launches=1234)
    assert observed_device_graphs(launches, None) == (True, "1,234 graph launches")
    in_graphs = msgspec.structs.replace(k, graph_kernels=30)
    assert observed_device_graphs(raw, in_graphs) == (True, f"30 of {k.kernels:,} kernels inside graphs")
    # a tracer that records graph membership: many kernels, none in a graph, says off; few say nothing
    column = msgspec.structs.replace(
        raw, kernels=msgspec.structs.replace(raw.kernels, graph_id=np.zeros(len(raw.kernels), dtype=np.int64))
    )
    assert column.kernels.graph_id is not None
    assert observed_device_graphs(column, k, min_kernels=k.kernels) == (
        False,
        f"{k.kernels:,} kernels, none inside a graph",
    )
    assert observed_device_graphs(column, k, min_kernels=k.kernels + 1) == (None, "")
    # the capture said graphs were on; the trace says off: noted, and the capture corrected
    said_on = msgspec.structs.replace(
        column, capture=msgspec.structs.replace(column.capture, device_graph_capture=True)
    )
    r = build_report(said_on, thresholds=Thresholds(graphs_off_min_kernels=1))
    assert r.capture.device_graph_capture is False
    assert (
        f"device graphs off, from what ran ({k.kernels:,} kernels, none inside a graph); the capture's settings said on"
        in notes(r)
    )
    left = build_report(
        msgspec.structs.replace(launches, capture=msgspec.structs.replace(raw.capture, device_graph_capture=None))
    )
    assert left.capture.device_graph_capture is True
    assert "device graphs on, from what ran (1,234 graph launches); the capture's settings said left to MAX" in notes(
        left
    )
    agreed = build_report(
        msgspec.structs.replace(launches, capture=msgspec.structs.replace(raw.capture, device_graph_capture=True))
    )
    assert "device graphs on, from what ran" not in notes(agreed)


def test_steps_kept_and_the_invalid_ones_noted() -> None:
    raw = capture()
    bad = [msgspec.structs.replace(s, end_ns=s.start_ns - 1) if s.index in (3, 4) else s for s in raw.steps]
    r = build_report(msgspec.structs.replace(raw, steps=bad))
    assert "2 host step(s) with invalid timestamps (negative, or ending before they start) were left out" in notes(r)
    assert len(r.steps) == len(raw.steps) - 2
    idle = [msgspec.structs.replace(s, batch_size=0) for s in raw.steps]
    r0 = build_report(msgspec.structs.replace(raw, steps=idle))
    assert isinstance(r0.step_summary, Unavailable)
    assert r0.step_summary.reason == "no pipeline step ran inside the profiled block"
    assert r0.steps == idle
    assert build_report(raw).step_summary.source == "host steps"  # type: ignore[union-attr]


def test_utilization_window_and_its_short_window_note() -> None:
    raw = synthetic([1.0] * 12, [DENSE] * 12, samples=_samples(50.0, 0.5, [], every_ms=0.5))
    r = build_report(raw)
    u = r.utilization
    assert isinstance(u, UtilizationSection)
    first = min(s.start_ns for s in raw.steps)
    last = max(s.end_ns for s in raw.steps)
    assert u.window_ns == (first, last)
    span = (last - first) / 1e9
    assert f"GPU utilization over a {span:.2f} s window (" in notes(r)
    assert "NVML averages over up to 1 s" in notes(r)
    gone = build_report(msgspec.structs.replace(raw, utilization_unavailable=Unavailable("pynvml missing")))
    assert gone.utilization == Unavailable("pynvml missing")


def test_kernel_notes_word_for_word() -> None:
    raw = capture()
    k = build_report(raw).kernels
    assert isinstance(k, KernelBreakdown)
    n = len(raw.kernels)
    bad = raw.kernels.select(np.ones(n, dtype=bool))
    bad = msgspec.structs.replace(bad, end_ns=bad.end_ns.copy())
    bad.end_ns[:2] = bad.start_ns[:2] - 1
    r = build_report(msgspec.structs.replace(raw, kernels=bad))
    assert (
        f"2 of {n} kernel records had invalid timestamps (negative, or ending before they start) and were dropped"
        in notes(r)
    )
    graphs = msgspec.structs.replace(raw.kernels, graph_id=np.where(np.arange(n) < 5, 7, -1).astype(np.int64))
    rg = build_report(msgspec.structs.replace(raw, kernels=graphs))
    kg = rg.kernels
    assert isinstance(kg, KernelBreakdown)
    if kg.graph_kernels:
        assert (
            f"{kg.graph_kernels} of {kg.kernels} kernels ran inside device graphs: each recorded, tied to the step"
            in notes(rg)
        )
    totals = msgspec.structs.replace(
        raw,
        kernels=msgspec.structs.replace(raw.kernels).select(np.zeros(n, dtype=bool)),
        kernel_totals=[KernelTotal(name="gemv_x", count=10, total_ns=5_000_000)],
        kernel_source=None,
    )
    kt = build_report(totals).kernels
    assert isinstance(kt, KernelBreakdown) and kt.source == "kernel totals" and kt.kernels == 10
    unavailable = build_report(msgspec.structs.replace(raw, kernels_unavailable=Unavailable("no CUPTI")))
    assert unavailable.kernels == Unavailable("no CUPTI")


def test_sampled_recording_is_noted_with_its_share() -> None:
    r = build_report(RawCapture.load(str(H200 / "h200_llama3b_batch64_quarter_recorded" / "run_b64_3b_raw.json.gz")))
    k = r.kernels
    assert isinstance(k, KernelBreakdown)
    assert k.recorded_ms is not None and k.window_ms  # 26 % of the steps recorded, in slices of 8
    said = (
        f"kernels were recorded in slices: {k.recorded_ms / 1e3:.1f} s of the {k.window_ms / 1e3:.1f} s window "
        f"({100 * k.recorded_ms / k.window_ms:.0f} %; the recorder paused in between, to keep its cost low)"
    )
    assert said in notes(r)
    assert r.notes[0].startswith("tracing cost")  # what tracing cost leads the notes


def test_where_the_ledger_comes_from() -> None:
    raw = capture()
    r = build_report(raw)
    assert isinstance(r.ledger, StepLedger) and r.ledger.source == "kernel timeline"
    no_steps = build_report(msgspec.structs.replace(raw, steps=[]))
    assert no_steps.ledger == Unavailable(
        "no steps: the capture has no pipeline steps, phase ranges or scheduler ranges to account"
    )
    nothing = build_report(msgspec.structs.replace(raw, steps=[], kernels_unavailable=Unavailable("no CUPTI")))
    assert nothing.ledger == Unavailable("no steps and no kernel timeline")
    no_kernels = build_report(msgspec.structs.replace(raw, kernels_unavailable=Unavailable("no CUPTI")))
    assert no_kernels.ledger == Unavailable("no kernel timeline to account the steps with (no CUPTI)")
    unreliable_k = msgspec.structs.replace(r.kernels, unreliable=True)  # type: ignore[type-var]
    from max_profile.analyze.report import ledger_of
    from max_profile.analyze.timeline import capture_timeline

    hidden = msgspec.structs.replace(r, kernels=unreliable_k)
    assert ledger_of(raw, hidden, capture_timeline(raw).steps, None, Thresholds()) == Unavailable(
        "device graphs hid the kernels: no per-step account of their time"
    )


def test_a_serve_window_where_every_request_failed() -> None:
    raw = capture()
    failed = [RequestRecord(started_ns=0, ended_ns=10, ok=False, error="HTTP 503: not ready")]
    serve = msgspec.structs.replace(
        raw,
        kernels=raw.kernels.select(np.zeros(len(raw.kernels), dtype=bool)),
        serve=ServeRun(mode="utilization", port=8000),
        requests=failed,
        window_ns=(0, 100),
    )
    r = build_report(serve)
    assert r.kernels == Unavailable("no request completed in the window: HTTP 503: not ready")
    assert r.serve is not None and r.serve.failed_requests == 1


def test_load_windows_make_levels_and_the_reference_is_only_a_yardstick() -> None:
    raw = capture()
    reqs = [RequestRecord(started_ns=0, ended_ns=10**9, ok=True, tokens=10, ttft_ms=5.0, itl_ms=[1.0])]
    one = msgspec.structs.replace(raw, load_windows=[LoadWindow(concurrency=2, window_ns=(0, 10**9), requests=reqs)])
    r1 = build_report(one)
    assert r1.window_load is not None and r1.window_load.concurrency == 2 and r1.load_levels == []
    ref = LoadWindow(concurrency=2, window_ns=(0, 10**9), requests=reqs, reference=True, traced=False)
    two = msgspec.structs.replace(
        raw,
        load_windows=[
            ref,
            LoadWindow(concurrency=2, window_ns=(0, 10**9), requests=reqs, traced=True),
            LoadWindow(concurrency=4, window_ns=(10**9, 2 * 10**9), requests=reqs, traced=True),
        ],
        slo_ms={"ttft": 10.0},
    )
    r2 = build_report(two)
    assert [lv.concurrency for lv in r2.load_levels] == [2, 4]  # the reference window is no level
    assert r2.window_load is not None and r2.window_load.concurrency == 4 and r2.slo_ms == {"ttft": 10.0}
    assert r2.tracer_cost is not None and r2.tracer_cost.concurrency == 2


def test_the_decode_cost_models_inputs() -> None:
    r = build_report(RawCapture.load(str(H200 / "h200_llama5b_every_verb" / "run_b32_raw.json.gz")))
    cost = decode_cost_of(r)
    assert cost is not None
    decode = [s for s in r.steps if s.phase == "decode" and s.batch_size > 0]
    assert cost.batch == int(np.median([s.batch_size for s in decode]))
    assert cost.context_tokens == round(float(np.median([s.context_tokens or 0 for s in decode])), 1)
    assert cost.step.ms_per_step == round(float(np.median([s.duration_ns / 1e6 for s in decode])), 6)
    k = r.kernels
    assert isinstance(k, KernelBreakdown)
    d = next(p for p in k.phases if p.phase == "decode")
    assert cost.kernels is not None
    # per step on the ledger's scale: the decode kernels' busy time per recorded step, split by family share
    lg = r.ledger
    assert isinstance(lg, StepLedger)
    ldec = next(p for p in lg.phases if p.phase == "decode")
    assert cost.kernels.ms_per_step == pytest.approx(
        sum(row.ms_per_step for row in ldec.rows if row.kind == "kernels"), abs=1e-6
    )
    attention = next(f for f in cost.families if f.family == "attention")
    total = next(f.total_ms for f in d.families if f.family == "attention")
    assert attention.ms_per_step == pytest.approx(total / d.kernel_ms * d.kernel_ms_per_step, abs=1e-6)
    nvtx = msgspec.structs.replace(r, kernels=msgspec.structs.replace(k, source="nvtx-log (MAX op ranges, host time)"))
    assert decode_cost_of(nvtx).kernels is None  # type: ignore[union-attr]  # host op time is no kernel time
    assert decode_cost_of(msgspec.structs.replace(r, steps=[s for s in r.steps if s.phase != "decode"])) is None
    bare = msgspec.structs.replace(r, capture=msgspec.structs.replace(r.capture, model_config=None, model_weights=None))
    assert decode_cost_of(bare) is None


def test_a_trace_clock_ledger_keeps_the_trace_window() -> None:
    raw = capture()
    first, last = min(s.start_ns for s in raw.steps), max(s.end_ns for s in raw.steps)
    host = build_report(raw).ledger
    assert isinstance(host, StepLedger) and host.window_ms == (last - first) / 1e6
    wide = (first - 5_000_000, last + 5_000_000)
    trace = msgspec.structs.replace(
        raw, kernel_clock="trace", trace_window_ns=wide, recorded_spans=[(first, first + 1_000_000)]
    )
    from max_profile.analyze.report import ledger_of

    lg = ledger_of(trace, build_report(raw), list(raw.steps), (first, last), Thresholds())
    # the trace's own window (10 ms wider), and no host-clock slices applied to it
    assert isinstance(lg, StepLedger) and lg.window_ms == (wide[1] - wide[0]) / 1e6


def test_report_fields_carried_over_and_said() -> None:
    from max_profile.model import PreflightResult

    raw = capture()
    check = PreflightResult(spec="custom_archs/llama_custom", max_version="26.7.0", checks=[])
    r = build_report(msgspec.structs.replace(raw, preflight=[check]), tool_version="9.9")
    assert r.tool_version == "9.9" and r.preflight == [check]
    assert "host step(s) with invalid timestamps" not in notes(r)  # none left out: nothing said
    served = build_report(msgspec.structs.replace(raw, serve=ServeRun(mode="kernels", port=1)))
    assert served.step_summary.source == "model worker steps"  # type: ignore[union-attr]
    raw_sampled = msgspec.structs.replace(
        synthetic([1.0] * 12, [DENSE] * 12, samples=_samples(50.0, 0.5, [])), sample_source="pynvml (1 s)"
    )
    sampled = build_report(raw_sampled)
    assert isinstance(sampled.utilization, UtilizationSection) and sampled.utilization.source == "pynvml (1 s)"


def test_the_decode_cost_model_without_a_decode_phase_or_context() -> None:
    r = build_report(RawCapture.load(str(H200 / "h200_llama5b_every_verb" / "run_b32_raw.json.gz")))
    k = r.kernels
    assert isinstance(k, KernelBreakdown)
    no_phase = msgspec.structs.replace(
        r, kernels=msgspec.structs.replace(k, phases=[p for p in k.phases if p.phase != "decode"])
    )
    cost = decode_cost_of(no_phase)
    assert cost is not None and cost.kernels is None and cost.families == []
    no_steps = msgspec.structs.replace(
        r, kernels=msgspec.structs.replace(k, phases=[msgspec.structs.replace(p, steps=0) for p in k.phases])
    )
    assert decode_cost_of(no_steps).kernels is None  # type: ignore[union-attr]
    decode = [s for s in r.steps if s.phase == "decode"]
    idle = [msgspec.structs.replace(s, batch_size=0, index=10_000 + i) for i, s in enumerate(decode * 2)]
    padded = msgspec.structs.replace(r, steps=[*r.steps, *idle])
    assert decode_cost_of(padded).batch == decode_cost_of(r).batch  # type: ignore[union-attr]  # idle steps left out
    # steps that carry no context length: the KV cache's bytes unknown, never priced as zero
    unknown = msgspec.structs.replace(r, steps=[msgspec.structs.replace(s, context_tokens=None) for s in r.steps])
    blind = decode_cost_of(unknown)
    seen = decode_cost_of(r)
    assert blind is not None and seen is not None and seen.kv_bytes
    assert blind.context_tokens is None and blind.kv_bytes is None
    assert blind.weight_bytes == seen.weight_bytes and not any(f.family == "attention" for f in blind.families)
    assert "unknown" in decode_context_text(blind) and kv_text(blind, "KV") == "KV unknown"


def test_breakdown_inputs_from_the_capture_and_the_thresholds() -> None:
    raw = capture()
    # graph capture on, no launch records and no kernel of a graph: the tracer saw replays only
    blind = msgspec.structs.replace(
        raw,
        kernels=msgspec.structs.replace(raw.kernels, launch_ns=None, launch_tid=None),
        capture=msgspec.structs.replace(raw.capture, device_graph_capture=True),
    )
    k = build_report(blind).kernels
    assert isinstance(k, KernelBreakdown) and k.unreliable is not None
    waits = build_report(raw).kernels
    strict = build_report(raw, thresholds=Thresholds(gpu_wait_min_us=500.0)).kernels
    assert isinstance(waits, KernelBreakdown) and isinstance(strict, KernelBreakdown)
    assert waits.gpu_waits is not None and strict.gpu_waits is not None
    assert waits.gpu_waits.gaps > 0 and strict.gpu_waits.gaps == 0 and strict.gpu_waits.min_gap_us == 500.0
    first, last = min(s.start_ns for s in raw.steps), max(s.end_ns for s in raw.steps)
    wide = (first - 5_000_000, last + 5_000_000)
    trace = build_report(
        msgspec.structs.replace(
            raw, kernel_clock="trace", trace_window_ns=wide, recorded_spans=[(first, first + 10**6)]
        )
    ).kernels  # host-clock slices say nothing of a trace-clock recording
    assert isinstance(trace, KernelBreakdown) and trace.window_ms == (wide[1] - wide[0]) / 1e6
    assert trace.recorded_ms is None


def test_samples_without_a_window_and_load_levels_with_their_samples() -> None:
    raw = synthetic([1.0] * 3, [DENSE] * 3, samples=_samples(50.0, 0.5, [])[:2])
    idle = build_report(
        msgspec.structs.replace(raw, steps=[msgspec.structs.replace(s, batch_size=0) for s in raw.steps])
    )
    assert "GPU utilization over a 0.00 s window (" in notes(idle)
    reqs = [RequestRecord(started_ns=0, ended_ns=10**9, ok=True, tokens=10, ttft_ms=5.0, itl_ms=[1.0])]
    window = LoadWindow(concurrency=1, window_ns=(0, 10**9), requests=reqs)
    level = build_report(msgspec.structs.replace(raw, load_windows=[window])).window_load
    assert level is not None and level.goodput_rps is None  # no objectives: no goodput
    assert level.gpu_utilization_pct == 50.0  # the capture's samples inside the window


def test_the_callers_thresholds_reach_the_kernel_analyses_and_the_plan() -> None:
    import max_profile

    ncu = max_profile.load(str(H200 / "h200_llama180m_host_bound/small_ncu_gemv_raw.csv.gz"))
    assert isinstance(ncu, RawCapture)
    assert build_report(ncu).kernel_analyses[0].bound == "memory"  # 53 % of memory, 20 % of compute
    assert build_report(ncu, thresholds=Thresholds(ncu_latency_bound_pct=99.0)).kernel_analyses[0].bound == "latency"
    norms = [
        ("rms_norm_fused_residual_0123456789abcdef", 0.5),
        ("gemv_split_k_bf16_128_0123456789abcdef", 0.45),
        ("sm90_mha_depth128_0123456789abcdef", 0.04),
    ]
    busy = synthetic([1.0] * 20, [norms] * 20)
    planned = build_report(busy).next_command  # a norm at half the decode kernel time: one Nsight Compute run
    assert planned is not None and planned.verb == "kernel" and planned.positional == ["rms_norm_fused_residual"]
    assert build_report(busy, thresholds=Thresholds(plan_suspicious_share_pct=60.0)).next_command is None


def test_a_serve_window_is_the_clients_summary_window() -> None:
    raw = capture()
    reqs = [RequestRecord(started_ns=0, ended_ns=3 * 10**9, ok=True, tokens=30, ttft_ms=5.0, itl_ms=[1.0])]
    served = build_report(
        msgspec.structs.replace(
            raw, serve=ServeRun(mode="utilization", port=1), requests=reqs, window_ns=(10**9, 2 * 10**9)
        )
    )
    # the request ran 0-3 s: a third of it, and of its 30 tokens, lies inside the 1-2 s window; it ended outside it, so
    # it is not counted as one of the window's requests
    assert served.serve is not None and served.serve.window_s == 1.0 and served.serve.output_tok_per_s == 30 / 3
    assert served.serve.requests == 0


def test_the_next_measurement_in_the_captures_interface_and_its_samples_kept() -> None:
    norms = [
        ("rms_norm_fused_residual_0123456789abcdef", 0.5),
        ("gemv_split_k_bf16_128_0123456789abcdef", 0.45),
        ("sm90_mha_depth128_0123456789abcdef", 0.04),
    ]
    busy = synthetic([1.0] * 20, [norms] * 20)
    py = build_report(msgspec.structs.replace(busy, capture=msgspec.structs.replace(busy.capture, interface="python")))
    assert (py.next_measurement or "").startswith("from max_profile.ncu_run import KernelRun, profile_kernel")
    sampled = synthetic([1.0] * 12, [DENSE] * 12, samples=_samples(50.0, 0.5, []))
    u = build_report(sampled).utilization
    assert isinstance(u, UtilizationSection) and u.samples == sampled.samples
