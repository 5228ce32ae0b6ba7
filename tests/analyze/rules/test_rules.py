"""Each diagnosis rule: one case where it fires, one where it must not; findings carry evidence."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from max_profile.analyze.report import build_report
from max_profile.analyze.rules import RULES, evaluate
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import (
    Capture,
    Environment,
    Finding,
    GpuInfo,
    KernelBreakdown,
    KernelRecord,
    KernelTable,
    RawCapture,
    Report,
    Step,
    Unavailable,
    UtilizationSample,
)

DATA = Path(__file__).parents[2] / "data"
H200 = DATA / "gpu"
GPU_ENV = Environment(
    vendor="nvidia",
    vendor_reason="test",
    gpus=[GpuInfo(key="nv0", name="NVIDIA H200", memory_total_bytes=150754820096)],
)


def big() -> RawCapture:
    return RawCapture.load(str(H200 / "h200_llama7b_gemv_decode/big_cupti_raw.json.gz"))


def ids(report: Report) -> set[str]:
    return {f.id for f in report.findings}


def finding(report: Report, fid: str, phase: str | None = "decode") -> Finding:
    """The finding ``fid`` about ``phase`` (the phase of its lever or evidence; None: the first with that id)."""
    for f in report.findings:
        if f.id == fid and (phase is None or (f.lever.phase if f.lever else f.evidence.get("phase", phase)) == phase):
            return f
    raise AssertionError(
        f"no {fid} finding about {phase}: {[(x.id, x.lever.phase if x.lever else None) for x in report.findings]}"
    )


def synthetic(
    step_ms: list[float],
    kernels_per_step: list[list[tuple[str, float]]],
    *,
    ctx0: int = 16,
    samples: list[UtilizationSample] | None = None,
) -> RawCapture:
    steps, kernels = [], []
    t = 1_000_000
    for i, (ms, ks) in enumerate(zip(step_ms, kernels_per_step, strict=True)):
        dur = int(ms * 1e6)
        phase = "prefill" if i == 0 else "decode"
        steps.append(
            Step(
                index=i,
                phase=phase,
                batch_size=1,
                input_tokens=ctx0 if i == 0 else 1,
                context_tokens=0 if i == 0 else ctx0 + i - 1,
                start_ns=t,
                end_ns=t + dur,
                output_tokens=1,
            )
        )
        k_t = t + 1000
        for name, kms in ks:
            kd = int(kms * 1e6)
            kernels.append(KernelRecord(name=name, start_ns=k_t, end_ns=k_t + kd, launch_ns=t + 10))
            k_t += kd
        t += dur + 1000
    return RawCapture(
        environment=GPU_ENV,
        capture=Capture(started_unix_s=0.0),
        steps=steps,
        kernels=kernels,
        samples=samples or [],
        kernel_source="synthetic",
        utilization_unavailable=None if samples else Unavailable("test: no samples"),
    )


DENSE = [
    ("gemv_split_k_bf16_128_0123456789abcdef", 0.7),
    ("sm90_mha_depth128_0123456789abcdef", 0.1),
    ("rms_norm_fused_residual_0123456789abcdef", 0.05),
]


def test_every_rule_is_registered_once_with_real_thresholds() -> None:
    import dataclasses

    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    ids = [i for r in RULES for i in r.emits]
    assert len(ids) == len(set(ids)), "two rules declare the same finding id"
    fields = {f.name for f in dataclasses.fields(Thresholds)}
    for r in RULES:
        assert set(r.thresholds) <= fields, (r.name, set(r.thresholds) - fields)


def test_a_rule_emitting_an_undeclared_id_is_refused() -> None:
    from max_profile.analyze.rules import RuleSpec

    rogue = RuleSpec(
        "rogue",
        lambda report, th: [Finding(id="made-up", severity="info", title="t", evidence={"x": 1}, confidence=0.5)],
        ("other",),
        (),
    )
    with pytest.raises(AssertionError, match="made-up"):
        evaluate(build_report(big()), rules=(rogue,))


def test_build_report_takes_a_rule_subset_and_thresholds() -> None:
    raw = big()
    only = tuple(r for r in RULES if r.name == "healthy-decode")
    assert {f.id for f in build_report(raw, rules=only).findings} <= set(only[0].emits)
    assert build_report(raw, rules=()).findings == []


def test_no_finding_without_evidence() -> None:
    for report in (
        build_report(big()),
        build_report(RawCapture.load(str(H200 / "h200_llama180m_host_bound/small_cupti_raw.json.gz"))),
    ):
        assert report.findings
        for f in report.findings:
            assert f.evidence and 0 < f.confidence <= 1


def test_kv_cache_broken_fires_on_growing_decode() -> None:
    n = 64
    grow = synthetic(
        [5.0] + [1.0 + 0.05 * i for i in range(n)],
        [DENSE] + [[(DENSE[0][0], 0.5 + 0.05 * i)] + DENSE[1:] for i in range(n)],
    )
    r = build_report(grow)
    f = next(f for f in r.findings if f.id == "kv-cache-broken")
    assert (
        f.severity == "error" and f.evidence["growth_ratio"] > 1.6 and f.evidence["decode_kernel_ms_growth_ratio"] > 1.6
    )
    assert r.findings[0].id == "kv-cache-broken"  # errors first
    assert r.next_measurement is None


def test_kv_cache_step_time_signal_survives_a_few_delayed_steps() -> None:
    """Four steps the OS held up 40 ms (a busy 2-core VM) drop Pearson's r of a doubling decode to ~0.3;
    the rank correlation the rule uses keeps the step-time signal, and a flat decode with the same stalls stays
    silent."""
    n = 64
    times = [1.0 + 0.05 * i for i in range(n)]
    flat = [1.0 + 0.01 * (i % 3) for i in range(n)]
    for i in (5, 9, 14, 20):
        times[i] += 40.0
        flat[i + 40] += 40.0
    r = build_report(synthetic([5.0] + times, [DENSE] * (n + 1)))
    f = next(f for f in r.findings if f.id == "kv-cache-broken")
    assert f.evidence["signals"] == "step time" and f.evidence["time_vs_sequence_correlation"] >= 0.8
    assert "kv-cache-broken" not in ids(build_report(synthetic([5.0] + flat, [DENSE] * (n + 1))))


def test_kv_cache_rule_silent_on_flat_decode() -> None:
    flat = synthetic([5.0] + [1.0 + 0.01 * (i % 3) for i in range(64)], [DENSE] * 65)
    assert "kv-cache-broken" not in ids(build_report(flat))
    assert "kv-cache-broken" not in ids(build_report(big()))


def _refed(inputs_per_step: list[int], ctx0: int = 16) -> RawCapture:
    raw = synthetic([5.0] + [1.0] * len(inputs_per_step), [DENSE] * (len(inputs_per_step) + 1), ctx0=ctx0)
    steps = [raw.steps[0]] + [
        msgspec.structs.replace(s, input_tokens=n, context_tokens=0)
        for s, n in zip(raw.steps[1:], inputs_per_step, strict=True)
    ]
    return msgspec.structs.replace(raw, steps=steps)


def test_kv_cache_broken_fires_on_refed_sequence_with_flat_times() -> None:
    # Decode steps that feed the whole sequence again (MAX sees nothing cached), even before time grows.
    r = build_report(_refed([17 + i for i in range(64)]))
    f = next(f for f in r.findings if f.id == "kv-cache-broken")
    assert f.evidence["signals"] == "re-fed tokens" and f.evidence["decode_input_tokens_per_request_last"] > 60


def test_kv_cache_rule_silent_on_speculative_decoding() -> None:
    # Speculative decoding feeds a constant 1 + draft tokens per request: not a re-feed.
    raw = _refed([4] * 64)
    steps = [raw.steps[0]] + [
        msgspec.structs.replace(s, context_tokens=16 + 3 * i) for i, s in enumerate(raw.steps[1:])
    ]
    assert "kv-cache-broken" not in ids(build_report(msgspec.structs.replace(raw, steps=steps)))


def test_kv_cache_on_a_cpu_judges_the_steps_cpu_time_not_their_wall_time() -> None:
    """On a CPU device another process taking cores mid-run makes the later steps' wall time grow with the sequence (the
    suite's second worker once did: a correct architecture judged broken); the step's own CPU time does not grow, and
    that is what the rule reads there. A decode whose work grows shows it in CPU time too."""
    n = 64
    wall = [1.0 + 0.05 * i for i in range(n)]  # doubling wall time: contention arriving during the run
    raw = synthetic([5.0] + wall, [[]] * (n + 1))
    cpu_env = msgspec.structs.replace(raw.environment, vendor="none", gpus=[])
    flat_cpu = [raw.steps[0]] + [
        msgspec.structs.replace(st, cpu_ns=int(2e6) + 1000 * (i % 3)) for i, st in enumerate(raw.steps[1:])
    ]
    quiet_work = msgspec.structs.replace(raw, environment=cpu_env, steps=flat_cpu)
    assert "kv-cache-broken" not in ids(build_report(quiet_work))
    assert "kv-cache-broken" in ids(
        build_report(msgspec.structs.replace(quiet_work, environment=raw.environment))
    )  # GPU: wall time
    growing_cpu = [raw.steps[0]] + [
        msgspec.structs.replace(st, cpu_ns=int(2e6 * (1.0 + 0.05 * i))) for i, st in enumerate(raw.steps[1:])
    ]
    f = next(
        f
        for f in build_report(msgspec.structs.replace(quiet_work, steps=growing_cpu)).findings
        if f.id == "kv-cache-broken"
    )
    assert (
        f.evidence["signals"] == "step time"
        and "CPU time" in str(f.evidence["step_time"])
        and float(f.evidence["growth_ratio"] or 0) > 1.6
    )


def test_kv_cache_step_time_that_jumps_once_is_not_growth() -> None:
    """CI once judged a correct architecture broken on its CPU: the step's CPU time rose partway through the run (the
    suite's other worker starting a heavy test) and ranked as a trend. A level shift leaves one half of the decode flat
    (robust slope ~0); re-encoding grows in both halves, linear or quadratic."""
    n = 64
    raw = synthetic([5.0] + [1.0] * n, [[]] * (n + 1))
    cpu_env = msgspec.structs.replace(raw.environment, vendor="none", gpus=[])

    def cpu_run(ms: list[float]) -> RawCapture:
        steps = [raw.steps[0]] + [
            msgspec.structs.replace(st, cpu_ns=int(m * 1e6)) for st, m in zip(raw.steps[1:], ms, strict=True)
        ]
        return msgspec.structs.replace(raw, environment=cpu_env, steps=steps)

    wobble = [0.01 * (i % 3) for i in range(n)]
    for at in (n // 3, n // 2, 2 * n // 3):
        jump = [2.0 + w + (2.0 if i >= at else 0.0) for i, w in enumerate(wobble)]
        report = build_report(cpu_run(jump))
        assert "kv-cache-broken" not in ids(report), at
    linear = [2.0 + w + 0.05 * i for i, w in enumerate(wobble)]
    quadratic = [2.0 + w + 0.0012 * i * i for i, w in enumerate(wobble)]
    for ms in (linear, quadratic):
        f = next(f for f in build_report(cpu_run(ms)).findings if f.id == "kv-cache-broken")
        assert (
            f.evidence["signals"] == "step time"
            and min(
                float(f.evidence["growth_ms_per_token_first_half"] or 0),
                float(f.evidence["growth_ms_per_token_second_half"] or 0),
            )
            > 0
        )


def test_kv_cache_step_time_not_judged_while_other_processes_held_the_cores() -> None:
    """A rising step time under recorded contention is not a cache verdict (host-contention reports the load); the
    load-independent signals (re-fed tokens) still are."""
    from max_profile.model import BusyProcess, HostLoad

    n = 64
    raw = synthetic([5.0] + [1.0 + 0.05 * i for i in range(n)], [[]] * (n + 1))
    busy = HostLoad(
        window_s=1.0,
        cores=2,
        cpu_busy_pct=100.0,
        own_cores=0.9,
        other_cores=1.1,
        load_avg_1m=3.0,
        busiest_others=[BusyProcess(pid=4242, name="python", cores=1.0)],
    )
    contended = msgspec.structs.replace(raw, capture=msgspec.structs.replace(raw.capture, host_load=busy))
    found = ids(build_report(contended))
    assert "kv-cache-broken" not in found and "host-contention" in found
    assert "kv-cache-broken" in ids(build_report(raw))  # the same steps on a quiet host
    refed = _refed([17 + i for i in range(64)])
    f = next(
        f
        for f in build_report(
            msgspec.structs.replace(refed, capture=msgspec.structs.replace(refed.capture, host_load=busy))
        ).findings
        if f.id == "kv-cache-broken"
    )
    assert f.evidence["signals"] == "re-fed tokens"


def test_kv_cache_rule_needs_enough_steps() -> None:
    short = synthetic([5.0] + [1.0 + 0.2 * i for i in range(10)], [DENSE] * 11)
    assert "kv-cache-broken" not in ids(build_report(short))


def test_unfused_attention() -> None:
    raw = big()
    assert "unfused-attention" not in ids(build_report(raw))
    no_attn = msgspec.structs.replace(
        raw, kernels=KernelTable.from_records([k for k in raw.kernels.records() if "mha" not in k.name])
    )
    f = next(f for f in build_report(no_attn).findings if f.id == "unfused-attention")
    assert f.evidence["attention_share_pct"] == 0.0


def test_healthy_dense_decode_needs_gemv_on_top() -> None:
    raw = big()
    assert "healthy-dense-decode" in ids(build_report(raw))
    no_gemv = msgspec.structs.replace(
        raw, kernels=KernelTable.from_records([k for k in raw.kernels.records() if "gemv" not in k.name])
    )
    assert "healthy-dense-decode" not in ids(build_report(no_gemv))


def _samples(util: float, used_frac: float, reasons: list[str], every_ms: float = 1.0) -> list[UtilizationSample]:
    total = 100 * 2**30
    return [
        UtilizationSample(
            t_ns=1_000_000 + int(i * every_ms * 1e6),
            gpu="nv0",
            utilization_pct=util,
            memory_used_bytes=int(total * used_frac),
            memory_total_bytes=total,
            sm_clock_mhz=1500,
            max_sm_clock_mhz=1980,
            throttle_reasons=reasons,
        )
        for i in range(40)
    ]


def test_throttle_rule_ignores_gpu_idle() -> None:
    steps = [DENSE] * 40
    hot = synthetic([1.0] * 40, steps, samples=_samples(90, 0.5, ["gpu_idle", "hw_thermal_slowdown"]))
    f = next(f for f in build_report(hot).findings if f.id == "throttled")
    assert f.evidence["reasons"] == "hw_thermal_slowdown"
    idle = synthetic([1.0] * 40, steps, samples=_samples(90, 0.5, ["gpu_idle"]))
    assert "throttled" not in ids(build_report(idle))


def test_near_oom() -> None:
    full = synthetic([1.0] * 40, [DENSE] * 40, samples=_samples(90, 0.985, []))
    assert "near-oom" in ids(build_report(full))
    half = synthetic([1.0] * 40, [DENSE] * 40, samples=_samples(90, 0.5, []))
    assert "near-oom" not in ids(build_report(half))


def test_host_bound_from_utilization_when_no_kernels() -> None:
    """NVML judges a window of at least 2 s with at least 10 samples (40 steps of 60 ms, a sample every 60 ms here)."""
    low = synthetic([60.0] * 40, [[]] * 40, samples=_samples(5, 0.2, [], every_ms=60.0))
    low = msgspec.structs.replace(low, kernels=[])
    f = next(f for f in build_report(low).findings if f.id == "host-bound")
    assert f.evidence["mean_utilization_pct"] == 5.0
    busy = msgspec.structs.replace(low, samples=_samples(95, 0.2, [], every_ms=60.0))
    assert "host-bound" not in ids(build_report(busy))
    short = synthetic(
        [1.0] * 40, [[]] * 40, samples=_samples(5, 0.2, [])
    )  # the same reading over 0.04 s: no verdict, a note
    report = build_report(msgspec.structs.replace(short, kernels=[]))
    assert "host-bound" not in ids(report) and any("no verdict is drawn from it" in n for n in report.notes)


def test_device_graphs_unreliable_only_where_kernels_stay_hidden() -> None:
    raw = big()
    assert "device-graphs" not in ids(build_report(raw))
    # each kernel of the graphs recorded (graph ids set, as the C CUPTI recorder does): per-step numbers hold
    seen = msgspec.structs.replace(
        raw,
        graph_launches=64,
        kernels=KernelTable.from_records([msgspec.structs.replace(k, graph_id=7) for k in raw.kernels.records()]),
    )
    seen.capture.device_graph_capture = True
    r = build_report(seen)
    assert "device-graphs" not in ids(r) and "healthy-dense-decode" in ids(r)
    assert isinstance(r.kernels, KernelBreakdown) and r.kernels.graph_kernels == 19580 and r.kernels.unreliable is None
    assert any("ran inside device graphs" in n for n in r.notes)
    # graphs launched but no kernel record from inside one: the tracer saw replays only
    hidden = msgspec.structs.replace(raw, graph_launches=64)
    r = build_report(hidden)
    assert "device-graphs" in ids(r)
    assert "--no-device-graph-capture" in (r.next_measurement or "")
    assert "healthy-dense-decode" not in ids(r)  # no verdict on per-kernel numbers that cannot be trusted


def test_phases_missing_when_trace_has_no_ranges() -> None:
    raw = big()
    bare = msgspec.structs.replace(raw, steps=[])
    assert "phases-missing" in ids(build_report(bare))
    assert "phases-missing" not in ids(build_report(raw))


def test_moe_routing_rivals_matmuls_or_not() -> None:
    heavy = [
        ("grouped_matmul_sm90_0123456789abcdef", 0.4),
        ("moe_create_indices_0123456789abcdef", 0.2),
        ("gather_r2_0123456789abcdef", 0.1),
        DENSE[1],
    ]
    light = [("grouped_matmul_sm90_0123456789abcdef", 0.8), ("moe_create_indices_0123456789abcdef", 0.05), DENSE[1]]
    assert "moe-routing-heavy" in ids(build_report(synthetic([1.0] * 10, [heavy] * 10)))
    r = build_report(synthetic([1.0] * 10, [light] * 10))
    assert "healthy-moe" in ids(r) and "moe-routing-heavy" not in ids(r)
    assert not ({"healthy-moe", "moe-routing-heavy"} & ids(build_report(big())))


def test_quant_prep_vs_matmul() -> None:
    slow = [("quantize_dynamic_fp8_0123456789abcdef", 0.6), ("block_scaled_matmul_0123456789abcdef", 0.3), DENSE[1]]
    fine = [("quantize_dynamic_fp8_0123456789abcdef", 0.05), ("block_scaled_matmul_0123456789abcdef", 0.6), DENSE[1]]
    assert "quant-prep-heavy" in ids(build_report(synthetic([1.0] * 10, [slow] * 10)))
    r = build_report(synthetic([1.0] * 10, [fine] * 10))
    assert "low-bit-normal" in ids(r) and "quant-prep-heavy" not in ids(r)


def test_decode_bandwidth_against_known_gpu_peak() -> None:
    f = next(f for f in build_report(big()).findings if f.id.startswith("decode-bandwidth"))
    assert f.id == "decode-bandwidth" and f.evidence["peak_GBps"] == 4800.0
    assert f.evidence["bytes_per_step"] == pytest.approx(13.97e9, rel=0.01)


def test_thresholds_are_overridable() -> None:
    report = build_report(RawCapture.load(str(H200 / "h200_llama180m_host_bound/small_cupti_raw.json.gz")))
    assert "host-bound" in {f.id for f in evaluate(report)}
    assert "host-bound" not in {
        f.id for f in evaluate(report, Thresholds(host_bound_util_pct=1.0, host_bound_busy_pct=1.0))
    }


def test_tracer_overhead_supersedes_host_bound() -> None:
    """Low utilization measured while an in-process tracer stalled the process is the tracer's doing."""
    low = synthetic([1.0] * 40, [[]] * 40, samples=_samples(5, 0.2, []))
    low = msgspec.structs.replace(low, kernels=KernelTable.from_records(big().kernels.records()[:50]))
    assert "host-bound" in ids(build_report(low)) and "tracer-overhead" not in ids(build_report(low))
    window_s = (low.steps[-1].end_ns - low.steps[0].start_ns) / 1e9
    slowed = build_report(msgspec.structs.replace(low, tracer_callback_s=0.387 * window_s))
    found = {f.id: f for f in slowed.findings}
    assert "tracer-overhead" in found and "host-bound" not in found
    assert found["tracer-overhead"].evidence["tracer_callbacks_pct_of_window"] == 38.7
    said = slowed.next_measurement or ""
    if low.capture.model_path:
        assert said.startswith("max-profile run --model-path") and said.endswith("--kernels off")
    else:  # the capture names no model: asked for in a comment, never a placeholder argument
        assert said.startswith("max-profile run ") and "--kernels off" in said and "MODEL_PATH" not in said
        assert said.endswith("# add --model-path DIR: the capture does not name its model")
    light = build_report(msgspec.structs.replace(low, tracer_callback_s=0.01 * window_s))
    assert "tracer-overhead" not in ids(light) and "host-bound" in ids(light)


def test_tracer_overhead_measured_against_the_reference_window_beats_the_callback_share() -> None:
    """serve kernels mode measures the recorder's cost against an untraced window of the same server: that number
    decides, whatever share of the window the callbacks took. Numbers: H200, serve_ab windows 4 (untraced,
    328.5 tok/s, decode step 2.901 ms) and 5 (recorded, 309.7 tok/s, 3.077 ms), m24 at concurrency 1."""
    from max_profile.model import TracerCost

    low = synthetic([1.0] * 40, [[]] * 40, samples=_samples(5, 0.2, []))
    low = msgspec.structs.replace(low, kernels=KernelTable.from_records(big().kernels.records()[:50]))
    window_s = (low.steps[-1].end_ns - low.steps[0].start_ns) / 1e9
    base = build_report(msgspec.structs.replace(low, tracer_callback_s=0.001 * window_s))
    assert "tracer-overhead" not in ids(base)
    measured = TracerCost(
        concurrency=1,
        reference_tok_s=328.5,
        traced_tok_s=309.7,
        throughput_ratio=round(309.7 / 328.5, 4),
        reference_decode_step_ms=2.901,
        traced_decode_step_ms=3.077,
        reference_itl_p50_ms=2.858,
        traced_itl_p50_ms=2.959,
    )
    found = {f.id: f for f in evaluate(msgspec.structs.replace(base, tracer_cost=measured))}
    f = found["tracer-overhead"]
    assert "5.7 %" in f.title and "2.90 → 3.08 ms" in f.title and f.evidence["decode_step_change_pct"] == 6.1
    assert f.evidence["recorded_tok_s"] == 309.7 and f.evidence["untraced_tok_s"] == 328.5
    # a cost under the threshold: no finding, even where the callbacks' share alone would have given one
    heavy = build_report(msgspec.structs.replace(low, tracer_callback_s=0.387 * window_s))
    assert "tracer-overhead" in ids(heavy)
    cheap = msgspec.structs.replace(measured, traced_tok_s=325.0, throughput_ratio=round(325.0 / 328.5, 4))
    assert "tracer-overhead" not in {f.id for f in evaluate(msgspec.structs.replace(heavy, tracer_cost=cheap))}
    assert "tracer-overhead" in {
        f.id for f in evaluate(msgspec.structs.replace(heavy, tracer_cost=cheap), Thresholds(tracer_slowdown_pct=1.0))
    }


def test_cpu_sweep_knee_names_the_batch_limit() -> None:
    """`serve --concurrency 1,2 --slo ttft=500,itl=100` on the CPU (tests/data/cpu): the tiny model's server kept one
    request per batch, so the second level queued (TTFT p90 25 -> 76 ms) for +3 % throughput."""
    report = build_report(RawCapture.load(str(DATA / "cpu" / "serve_sweep_c1_c2_raw.json.gz")))
    doc = json.loads(report.to_json())
    assert [lv["concurrency"] for lv in doc["load_levels"]] == [1, 2]
    assert {"concurrency", "requests", "output_tok_per_s", "ttft_ms", "itl_ms", "goodput_rps"} <= set(
        doc["load_levels"][0]
    )
    knee = next(f for f in report.findings if f.id == "latency-knee")
    assert knee.evidence["cause"] == "batch-limit" and knee.evidence["knee_concurrency"] == 2
    assert knee.evidence["batch_size_mean"] == 1.0 and knee.evidence["throughput_gain_pct"] == 3.0
