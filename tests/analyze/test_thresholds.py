"""Every number in ``Thresholds`` pinned from both sides: generated captures whose measured value sits just on either
side of the default, with the verdict each side must give (a default moved past either value fails a test); the
thresholds that price rather than decide (the attainable roofs, the kernel floor, the confidence scale) are pinned by
the exact figure they produce. Real captures near a boundary are asserted where they exist (arch (a) at 38.4 % busy:
test_gpu_captures)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import msgspec
import pytest

from max_profile.analyze.commands import next_command
from max_profile.analyze.ncu import bound_of
from max_profile.analyze.report import build_report
from max_profile.analyze.rules import evaluate
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import (
    KernelRecord,
    LoadLevel,
    RawCapture,
    Report,
    ServerMetrics,
    StartupPhase,
    Step,
    StepLedger,
    TracerCost,
    UtilizationSample,
)

from ..analyze.rules.test_finding_ids import (
    _analysis,
    _attach_window,
    _batched,
    _outside,
    _preflight,
    _startup,
    callbacks,
    others,
    real,
)
from ..analyze.rules.test_rules import DENSE, GPU_ENV, synthetic
from ..analyze.test_ledger import _idle_capture
from ..builders import load_level
from ..collect.readers.test_multi_device import split_with_allreduce

TH = Thresholds()

Case = tuple[Callable[[float], Report], Callable[[Report], bool], float, float]
"""(a capture whose measured value is x, whether the verdict shows, x where it must show, x where it must not)."""


def ids(report: Report) -> set[str]:
    return {f.id for f in report.findings}


def has(fid: str, phase: str | None = None, severity: str | None = None) -> Callable[[Report], bool]:
    def check(report: Report) -> bool:
        return any(
            f.id == fid
            and (phase is None or (f.lever is not None and f.lever.phase == phase))
            and (severity is None or f.severity == severity)
            for f in report.findings
        )

    return check


# --- builders: each takes the measured value the threshold compares with ----------------------------------------


def idle_share(pct: float, steps: int = 40, graphs: bool = False) -> Report:
    return build_report(_idle_capture(1 - pct / 100, pct / 100, steps=steps, graphs=graphs))


def busy_share(pct: float) -> Report:
    return idle_share(100 - pct)


def nvml(util: float, seconds: float = 3.0, samples: int | None = None) -> Report:
    """A capture with no kernels, NVML reading ``util`` over ``seconds`` of steps, ``samples`` samples over it."""
    n_steps = 40
    step_ms = seconds * 1e3 / n_steps
    n = samples if samples is not None else int(seconds * 10)
    every = seconds * 1e3 / n
    s = [
        UtilizationSample(
            t_ns=1_000_000 + int((i + 0.5) * every * 1e6),
            gpu="nv0",
            utilization_pct=util,
            memory_used_bytes=1,
            memory_total_bytes=10,
        )
        for i in range(n)
    ]
    raw = synthetic([step_ms] * n_steps, [[]] * n_steps, samples=s)
    return build_report(msgspec.structs.replace(raw, kernels=[]))


def memory_pct(pct: float) -> Report:
    total = 100 * 2**30
    s = [
        UtilizationSample(
            t_ns=1_000_000 + i * 1_000_000,
            gpu="nv0",
            utilization_pct=90,
            memory_used_bytes=int(total * pct / 100),
            memory_total_bytes=total,
        )
        for i in range(40)
    ]
    return build_report(synthetic([1.0] * 40, [DENSE] * 40, samples=s))


def clock_pct(pct: float) -> Report:
    s = [
        UtilizationSample(
            t_ns=1_000_000 + i * 1_000_000,
            gpu="nv0",
            utilization_pct=90,
            memory_used_bytes=1,
            memory_total_bytes=10,
            sm_clock_mhz=int(round(2000 * pct / 100)),
            max_sm_clock_mhz=2000,
            throttle_reasons=["sw_power_cap"],
        )
        for i in range(40)
    ]
    return build_report(synthetic([1.0] * 40, [DENSE] * 40, samples=s))


def slowdown(pct: float) -> Report:
    cost = TracerCost(
        concurrency=1, reference_tok_s=100.0, traced_tok_s=100.0 - pct, throughput_ratio=round((100.0 - pct) / 100.0, 4)
    )
    return _report_with(real("h200_llama5b_every_verb/run_b1_raw.json.gz"), tracer_cost=cost)


def _report_with(report: Report, **fields: object) -> Report:
    out = msgspec.structs.replace(report, **fields)
    out.findings = evaluate(out)
    out.next_command = next_command(out)
    return out


def graph_waits(gap_us: float = 500.0, gaps: int = 30, busy_ms: float = 1.0, n_kernels: int = 200) -> Report:
    """A trace without steps: graph kernels of ``busy_ms``, ``gaps`` of them preceded by a wait of ``gap_us``."""
    ks, t = [], 1_000_000
    for i in range(n_kernels):
        if 0 < i <= gaps:
            t += int(gap_us * 1e3)
        ks.append(
            KernelRecord(
                name="gemv_split_k_bf16_128_0123456789abcdef", start_ns=t, end_ns=t + int(busy_ms * 1e6), graph_id=3
            )
        )
        t += int(busy_ms * 1e6)
    raw = RawCapture(
        environment=GPU_ENV,
        capture=msgspec.structs.replace(real("h200_llama5b_every_verb/run_b1_raw.json.gz").capture),
        kernels=ks,
        kernel_source="synthetic",
    )
    raw.capture.model_config = None
    raw.capture.model_weights = None
    return build_report(raw)


def graph_column(n: int) -> Report:
    """A trace that records graph membership, ``n`` kernels and none in a graph: device graphs were off, when n is
    enough."""
    ks = [
        KernelRecord(
            name="gemv_split_k_bf16_128_0123456789abcdef",
            start_ns=1_000_000 + i * 10_000,
            end_ns=1_000_000 + i * 10_000 + 5_000,
            graph_id=0,
        )
        for i in range(n)
    ]
    ks.append(
        KernelRecord(name="gemv_split_k_bf16_128_0123456789abcdef", start_ns=10**9, end_ns=10**9 + 5_000, graph_id=None)
    )
    raw = RawCapture(
        environment=GPU_ENV,
        capture=real("h200_llama5b_every_verb/run_b1_raw.json.gz").capture,
        kernels=ks[:-1],
        kernel_source="synthetic",
    )
    return build_report(raw)


def mix(families: list[tuple[str, float]], steps: int = 10) -> Report:
    return build_report(synthetic([1.0] * steps, [families] * steps))


def gemv_share(pct: float) -> Report:
    rest = (100 - pct) / 3
    return mix(
        [
            ("gemv_split_k_bf16_128_0123456789abcdef", pct / 100 * 0.9),
            ("rms_norm_fused_residual_0123456789abcdef", rest / 100 * 0.9),
            ("sm90_mha_depth128_0123456789abcdef", rest / 100 * 0.9),
            ("elementwise_add_0123456789abcdef", rest / 100 * 0.9),
        ],
        steps=41,
    )


def attention_per_step(every: int) -> Report:
    """Attention kernels in one decode step of every ``every`` (per step: 1 / every)."""
    kernels = [
        [("gemv_split_k_bf16_128_0123456789abcdef", 0.7)]
        + ([("sm90_mha_depth128_0123456789abcdef", 0.1)] if i % every == 0 else [])
        for i in range(41)
    ]
    return build_report(synthetic([1.0] * 41, kernels))


def unfused_norm(kernels: int) -> Report:
    per = [("gemv_split_k_bf16_128_0123456789abcdef", 0.5), ("sm90_mha_depth128_0123456789abcdef", 0.1)]
    steps = kernels // 2
    raw = synthetic([1.0] * steps, [per] * steps)
    return build_report(raw)


def ratio_mix(first: str, second: str, ratio: float) -> Report:
    return mix([(second, 0.5), (first, 0.5 * ratio), ("sm90_mha_depth128_0123456789abcdef", 0.05)])


def routing(ratio: float) -> Report:
    return ratio_mix("moe_create_indices_0123456789abcdef", "grouped_matmul_sm90_0123456789abcdef", ratio)


def quant(ratio: float) -> Report:
    return ratio_mix("quantize_dynamic_fp8_0123456789abcdef", "block_scaled_matmul_0123456789abcdef", ratio)


def collectives(pct: float) -> Report:
    # 3.8141 ms of decode kernels per step per device in the big capture: a share of pct needs a / (3.8141 + a) = pct
    allreduce_ms = 3.8141 * pct / (100 - pct)
    return build_report(split_with_allreduce(allreduce_ms * 1e3))


def outside(pct: float) -> Report:
    """Decode steps of 1 ms (GPU busy 96 %) with a gap between them: the window ``pct`` % outside the steps."""
    return _outside(pct / (100 - pct) * 1.0)


def in_flight(pct: float) -> Report:
    return build_report(_attach_window(int(round(pct / 2)), 0.2))


def matmul_roof(roof_pct: float) -> Report:
    """Batch 32, 10.47 GB of weights: matmuls taking ideal / roof_pct of the time (2.5667 ms ideal)."""
    return _batched(10.47e9 / (0.85 * 4.8e12) * 1e3 / (roof_pct / 100))


def matmul_share(share_pct: float) -> Report:
    """A decode whose matmuls run at 10 % of their roofline and take ``share_pct`` of its kernel time."""
    from ..analyze.test_roofline import M24, M24_WEIGHTS, _decode_capture

    mm = 10.47e9 / (0.85 * 4.8e12) * 1e3 / 0.10
    other = mm * (100 - share_pct) / share_pct
    kernels = [
        ("sm90_matmul_bfloat16_bfloat16_bfloat16_True_0123456789abcdef", mm),
        ("rms_norm_fused_residual_gpu_0123456789abcdef", other * 0.5),
        ("sm90_mha_depth128_bfloat16_0123456789abcdef", other * 0.5),
    ]
    return build_report(_decode_capture(1, 100, mm + other + 0.01, kernels, M24, M24_WEIGHTS))


def slow_path_share(share_pct: float) -> Report:
    """A decode in which a kernel naming itself a fallback takes ``share_pct`` of the kernel time (the rest gemv)."""
    return gemv_mix(
        [
            ("naive_blockwise_scaled_fp8_matmul_0123456789abcdef", share_pct / 100 * 0.9),
            ("gemv_split_k_bf16_128_0123456789abcdef", (100 - share_pct) / 100 * 0.9),
        ]
    )


def gemv_mix(kernels: list[tuple[str, float]]) -> Report:
    return mix(kernels, steps=41)


def batched(batch: float) -> Report:
    from ..analyze.test_roofline import M24, M24_WEIGHTS, _decode_capture

    kernels = [
        ("gemv_split_k_bfloat16_0123456789abcdef", 2.6),
        ("sm90_mha_depth128_bfloat16_0123456789abcdef", 0.1),
        ("rms_norm_fused_residual_gpu_0123456789abcdef", 0.05),
    ]
    return build_report(_decode_capture(int(batch), 100, 2.8, kernels, M24, M24_WEIGHTS))


def levels(
    gain: float = 0.5,
    growth_c: float = 4.0,
    itl_growth: float = 1.0,
    ttft_growth: float = 1.0,
    batch_growth: float = 2.0,
    kv_pct: float = 10.0,
    spike: float = 1.5,
    ce: float = 0.0,
    gpu: float | None = None,
) -> Report:
    def srv(b: float, kv: float) -> ServerMetrics:
        return ServerMetrics(
            url="u",
            window_s=10.0,
            batch_size_mean=b,
            kv_cache_used_pct=kv,
            batches={"CE": ce, "TG": 100.0},
            batch_execution_ms_mean={"CE": 5.0, "TG": 3.0},
            preemptions=0.0,
        )

    def level(c: int, tok: float, itl: float, ttft: float, s: ServerMetrics, g: float | None, p99: float) -> LoadLevel:
        return load_level(c, tok, itl=itl, itl_p99=p99, ttft=ttft, gpu=g, server=s)

    a = level(1, 300.0, 3.0, 20.0, srv(1.0, 5.0), None, 3.0)
    b = level(
        int(growth_c),
        300.0 * (1 + gain),
        3.0 * itl_growth,
        20.0 * ttft_growth,
        srv(batch_growth, kv_pct),
        gpu,
        3.0 * itl_growth * spike,
    )
    return _report_with(real("h200_llama5b_every_verb/run_b1_raw.json.gz"), load_levels=[a, b])


def knee_cause(report: Report) -> str:
    f = next((f for f in report.findings if f.id == "latency-knee"), None)
    return str(f.evidence["cause"]) if f else "none"


def kv_growth(ratio: float, steps: int = 64, context_step: int = 1) -> Report:
    """Decode steps whose time grows linearly from 1 ms to ``ratio`` ms-ish (last third / first third medians)."""
    n = steps
    # linear t_i = 1 + k i; medians of the thirds at i ~ n/6 and 5n/6: ratio = (1 + k 5n/6) / (1 + k n/6)
    k = (ratio - 1) / (5 * n / 6 - ratio * n / 6)
    times = [1.0 + k * i for i in range(n)]
    kernels = [DENSE] + [[(DENSE[0][0], 0.5)] + DENSE[1:] for _ in range(n)]
    raw = synthetic([5.0] + times, kernels)
    steps_ = [raw.steps[0]] + [
        msgspec.structs.replace(s, context_tokens=16 + i * context_step) for i, s in enumerate(raw.steps[1:])
    ]
    return build_report(msgspec.structs.replace(raw, steps=steps_))


def kernel_growth(ratio: float, n: int = 64) -> Report:
    """Flat step times, decode kernel time growing (last / first third medians ~ ratio): the kernel-time signal
    alone."""
    k = (ratio - 1) / (5 * n / 6 - ratio * n / 6)
    kernels = [DENSE] + [[(DENSE[0][0], 0.3 * (1.0 + k * i))] + DENSE[1:] for i in range(n)]
    return build_report(synthetic([5.0] + [2.0] * n, kernels))


def refeed(corr_noise: float) -> Report:
    """The model's own input grows with the sequence while the scheduler feeds one token; ``corr_noise`` scrambles the
    growth so its rank correlation with the sequence drops."""
    import random

    n = 64
    rng = random.Random(7)
    raw = synthetic([5.0] + [1.0] * n, [DENSE] * (n + 1))
    grow = [16 + i for i in range(n)]
    noisy = [g if rng.random() > corr_noise else rng.randint(16, 16 + n) for g in grow]
    steps = [raw.steps[0]] + [
        msgspec.structs.replace(s, model_input_tokens=noisy[i]) for i, s in enumerate(raw.steps[1:])
    ]
    return build_report(msgspec.structs.replace(raw, steps=steps))


def noisy_growth(seed: float) -> Report:
    """Step times rising 1 -> 5 ms over 64 decode steps under uniform noise of 6 ms (seeded): last / first third 1.8x,
    but the rank correlation with the sequence only ~0.6 (seed 13: 0.64; seed 4: 0.59, with a flat second half)."""
    import random

    rng = random.Random(int(seed))
    n = 64
    times = [1.0 + 4.0 * i / n + rng.uniform(0, 6.0) for i in range(n)]
    return build_report(synthetic([5.0] + times, [DENSE] * (n + 1)))


def jump_and_slope(jump: float) -> Report:
    """A mild steady rise (0.4 ms over 64 steps) plus one jump of ``jump`` ms halfway: the larger the jump, the smaller
    each half's own slope against the whole run's rise."""
    n = 64
    times = [1.0 + 0.4 * i / n + (jump if i >= n // 2 else 0.0) for i in range(n)]
    return build_report(synthetic([5.0] + times, [DENSE] * (n + 1)))


def graph_share(before_pct: float) -> Report:
    """Decode steps of 1 ms, idle 0.2 ms of each: ``before_pct`` % of it before the step's graph kernel (the gemv), the
    rest before an eager kernel launched after it (between launches)."""
    from max_profile.model import Capture

    before, after = 0.2 * before_pct / 100, 0.2 * (1 - before_pct / 100)
    steps, kernels, t = [], [], 1_000_000
    for i in range(41):
        steps.append(
            Step(
                index=i,
                phase="prefill" if i == 0 else "decode",
                batch_size=1,
                input_tokens=16 if i == 0 else 1,
                context_tokens=0 if i == 0 else 16 + i,
                start_ns=t,
                end_ns=t + 1_000_000,
                output_tokens=1,
            )
        )
        g0 = t + int(before * 1e6)
        kernels.append(
            KernelRecord(
                name="gemv_split_k_bf16_0123456789abcdef",
                start_ns=g0,
                end_ns=g0 + 700_000,
                launch_ns=t + 10,
                graph_id=1,
            )
        )
        e0 = g0 + 700_000 + int(after * 1e6)
        kernels.append(
            KernelRecord(
                name="sm90_mha_depth128_0123456789abcdef",
                start_ns=e0,
                end_ns=e0 + 100_000,
                launch_ns=t + 20,
                graph_id=0,
            )
        )
        t += 1_000_000
    return build_report(
        RawCapture(
            environment=GPU_ENV,
            capture=Capture(started_unix_s=0.0),
            steps=steps,
            kernels=kernels,
            kernel_source="synthetic",
        )
    )


def refeed_share(pct: float) -> Report:
    """The scheduler feeds a growing sequence again (flat step times) in ``pct`` % of the decode steps, one token in
    the rest."""
    n = 64
    raw = synthetic([5.0] + [1.0] * n, [DENSE] * (n + 1))
    refed = int(round(n * pct / 100))
    steps = [raw.steps[0]] + [
        msgspec.structs.replace(s, input_tokens=(16 + i) if i >= n - refed else 1, context_tokens=0)
        for i, s in enumerate(raw.steps[1:])
    ]
    return build_report(msgspec.structs.replace(raw, steps=steps))


def ncu_bound(compute: float, memory: float) -> str | None:
    return bound_of(compute, memory, TH.ncu_latency_bound_pct, TH.ncu_balanced_gap_pct, TH.ncu_balanced_min_pct)


def suspicious(share: float) -> Report:
    """A decode whose top kernel is a non-matmul one taking ``share`` % of the kernel time: gemv at 34 % (under the
    healthy share, so no healthy verdict stops the plan), the rest split in three families each under 25 %."""
    rest = (100 - 34 - share) / 3 / 100
    ks = [
        ("custom_softmax_kernel_0123456789abcdef", share / 100 * 0.9),
        ("gemv_split_k_bf16_128_0123456789abcdef", 0.34 * 0.9),
        ("sm90_mha_depth128_0123456789abcdef", rest * 0.9),
        ("rms_norm_fused_residual_0123456789abcdef", rest * 0.9),
        ("elementwise_add_0123456789abcdef", rest * 0.9),
    ]
    return build_report(synthetic([1.0] * 41, [ks] * 41))


def next_is_kernel(report: Report) -> bool:
    return report.next_command is not None and report.next_command.verb == "kernel"


CASES: dict[str, Case] = {
    "host_bound_busy_pct": (busy_share, has("host-bound", "decode"), 39.5, 40.5),
    "host_bound_util_pct": (nvml, has("host-bound"), 39.5, 40.5),
    "nvml_min_window_s": (lambda s: nvml(10.0, seconds=s, samples=30), has("host-bound"), 2.05, 1.95),
    "nvml_min_samples": (lambda n: nvml(10.0, seconds=3.0, samples=int(n)), has("host-bound"), 10, 9),
    "near_oom_pct": (memory_pct, has("near-oom"), 97.1, 96.9),
    "throttle_clock_pct": (clock_pct, has("throttled", severity="warning"), 96.9, 97.1),
    "host_load_other_cores": (others, has("host-contention"), 0.76, 0.74),
    "host_load_busy_fraction": (lambda own: others(0.8, own=own), has("host-contention"), 0.91, 0.89),
    "tracer_overhead_pct": (callbacks, has("tracer-overhead"), 5.1, 4.9),
    "tracer_slowdown_pct": (slowdown, has("tracer-overhead"), 3.05, 2.95),
    "gpu_wait_min_us": (
        lambda us: graph_waits(gap_us=us, gaps=60, busy_ms=0.2, n_kernels=100),
        has("graph-launch-late"),
        101,
        99,
    ),
    "gpu_wait_max_ms": (lambda ms: graph_waits(gap_us=ms * 1e3), has("graph-launch-late"), 4.9, 5.1),
    "graph_launch_late_pct": (
        lambda pct: graph_waits(gap_us=pct / 100 * 200 * 1.0e3 / 30 / (1 - pct / 100)),
        has("graph-launch-late"),
        2.05,
        1.95,
    ),
    "graph_launch_late_min_gaps": (lambda n: graph_waits(gaps=int(n)), has("graph-launch-late"), 20, 19),
    "graphs_off_min_kernels": (
        lambda n: graph_column(int(n)),
        lambda r: r.capture.device_graph_capture is False,
        100,
        99,
    ),
    "gpu_bound_busy_pct": (
        lambda pct: build_report(
            synthetic(
                [1.0] * 41,
                [
                    [
                        ("rms_norm_fused_residual_0123456789abcdef", 0.9 * pct / 100),
                        ("sm90_mha_depth128_0123456789abcdef", 0.1 * pct / 100),
                    ]
                ]
                * 41,
            )
        ),
        has("gpu-bound"),
        85.5,
        84.5,
    ),
    "healthy_gemv_share_pct": (gemv_share, has("healthy-dense-decode"), 35.5, 34.5),
    "min_attention_kernels_per_step": (
        lambda every: attention_per_step(int(every)),
        lambda r: "unfused-attention" not in ids(r),
        2,
        3,
    ),
    "unfused_norm_min_kernels": (lambda n: unfused_norm(int(n)), has("unfused-norm"), 52, 50),
    "routing_vs_matmul_ratio": (routing, has("moe-routing-heavy"), 0.51, 0.49),
    "quant_vs_matmul_ratio": (quant, has("quant-prep-heavy"), 1.02, 0.98),
    "communication_share_pct": (collectives, has("communication-dominates"), 30.5, 29.5),
    "slow_matmul_roofline_pct": (matmul_roof, has("matmul-slow-path", "decode"), 24.5, 25.5),
    "slow_matmul_share_pct": (matmul_share, has("matmul-slow-path", "decode"), 51.0, 49.0),
    "slow_path_share_pct": (slow_path_share, has("kernel-slow-path"), 15.5, 14.5),
    "batched_decode_min_batch": (batched, has("healthy-batched-decode"), 2, 1),
    "lever_warning_pct": (idle_share, has("gpu-idle", "decode", "warning"), 15.5, 14.5),
    "lever_info_pct": (idle_share, has("gpu-idle", "decode"), 5.5, 4.5),
    "graph_launch_late_share": (graph_share, has("graph-launch-late", "decode"), 52.0, 48.0),
    "kv_refeed_steps_share": (refeed_share, has("kv-cache-broken"), 91.0, 89.0),
    "lever_min_steps": (lambda n: idle_share(20.0, steps=int(n)), has("gpu-idle", "decode", "warning"), 3, 2),
    "light_load_pct": (in_flight, has("lightly-loaded"), 48.0, 52.0),
    "kv_growth_ratio": (kv_growth, has("kv-cache-broken"), 1.65, 1.55),
    "kv_min_decode_steps": (lambda n: kv_growth(3.0, steps=int(n), context_step=2), has("kv-cache-broken"), 32, 31),
    "kv_min_context_growth": (lambda n: kv_growth(3.0, steps=40, context_step=int(n)), has("kv-cache-broken"), 1, 0),
    "kv_model_refeed_corr": (refeed, has("kv-cache-broken"), 0.58, 0.60),  # rank correlations 0.906 and 0.855
    # the shape of growth: seed 13 fires from a trend threshold of 0.5 down, never at 0.8 (a 0.8 -> 0.3 change fires it)
    "kv_trend_corr": (lambda seed: noisy_growth(seed) if seed else kv_growth(1.8), has("kv-cache-broken"), 0, 13),
    "kv_gradual_share": (jump_and_slope, has("kv-cache-broken"), 0.8, 1.0),  # fires from 0.25 down / from 0.2 down
    "knee_min_gain": (lambda g: levels(gain=g, growth_c=1.2), lambda r: "latency-knee" in ids(r), 0.14, 0.16),
    "knee_min_efficiency": (
        lambda e: levels(gain=4 * e - 1, itl_growth=2.0),
        lambda r: "latency-knee" in ids(r),
        0.49,
        0.51,
    ),
    "knee_itl_growth": (lambda g: levels(gain=0.9, itl_growth=g), lambda r: "latency-knee" in ids(r), 1.51, 1.49),
    "knee_kv_pressure_pct": (
        lambda kv: levels(gain=0.1, kv_pct=kv),
        lambda r: knee_cause(r) == "kv-cache-pressure",
        90.5,
        89.5,
    ),
    "knee_batch_growth": (
        lambda g: levels(gain=0.1, batch_growth=g),
        lambda r: knee_cause(r) == "batch-limit",
        1.14,
        1.16,
    ),
    "knee_itl_spike_ratio": (
        lambda s: levels(gain=0.1, spike=s, ce=5.0),
        lambda r: knee_cause(r) == "prefill-interference",
        3.05,
        2.95,
    ),
    "knee_gpu_saturated_pct": (
        lambda g: levels(gain=0.1, gpu=g),
        lambda r: knee_cause(r) == "gpu-saturated",
        90.5,
        89.5,
    ),
    "startup_compile_share_pct": (
        lambda pct: _startup(cache="miss", phases=[StartupPhase(name="compile model", seconds=pct)]),
        has("startup-compile"),
        50.5,
        49.5,
    ),
    "startup_min_s": (
        lambda s: _startup(total_s=s, cache="miss", phases=[StartupPhase(name="compile model", seconds=s * 0.9)]),
        has("startup-compile"),
        10.1,
        9.9,
    ),
    "weights_slow_gbps": (
        lambda g: _startup(phases=[StartupPhase(name="weights to device", seconds=4.0, bytes=4 << 30, gb_per_s=g)]),
        has("startup-weights-slow"),
        0.99,
        1.01,
    ),
    "weights_min_bytes": (
        lambda b: _startup(phases=[StartupPhase(name="weights to device", seconds=4.0, bytes=int(b), gb_per_s=0.5)]),
        has("startup-weights-slow"),
        1 << 30,
        (1 << 30) - 1,
    ),
    "kv_alloc_share_pct": (
        lambda pct: _startup(phases=[StartupPhase(name="KV cache allocation and pipeline setup", seconds=pct)]),
        has("startup-kv-alloc"),
        30.5,
        29.5,
    ),
    "custom_import_slow_s": (_preflight, has("startup-custom-import-slow"), 10.1, 9.9),
    "ncu_near_peak_dram_pct": (
        lambda d: _analysis(dram_throughput_pct=d),
        has("kernel-memory-bound-near-peak"),
        70.5,
        69.5,
    ),
    "ncu_on_chip_busy_pct": (
        lambda b: _analysis(dram_throughput_pct=5.0, metrics={"L1/TEX Cache Throughput": b}),
        has("kernel-on-chip-bound"),
        80.5,
        79.5,
    ),
    "ncu_on_chip_dram_idle_pct": (
        lambda d: _analysis(dram_throughput_pct=d, metrics={"L1/TEX Cache Throughput": 90.0}),
        has("kernel-on-chip-bound"),
        9.5,
        10.5,
    ),
    "ncu_compute_far_pct": (
        lambda c: _analysis(bound="compute", compute_throughput_pct=c),
        has("kernel-compute-far-from-peak"),
        59.5,
        60.5,
    ),
    "ncu_low_occupancy_ratio": (
        lambda r: _analysis(achieved_occupancy_pct=50.0 * r, theoretical_occupancy_pct=50.0),
        has("kernel-low-occupancy"),
        0.49,
        0.51,
    ),
    "ncu_occupancy_limited_pct": (
        lambda p: _analysis(achieved_occupancy_pct=p * 0.9, theoretical_occupancy_pct=p, occupancy_limiter="registers"),
        has("kernel-occupancy-limited"),
        49.5,
        50.5,
    ),
    "plan_suspicious_share_pct": (suspicious, next_is_kernel, 26.0, 24.0),
}

BOUND_CASES: dict[str, tuple[tuple[float, float], str, tuple[float, float], str]] = {
    # Nsight Compute's bound from its Speed Of Light percentages: (compute, memory) on either side and the bound each
    # gives
    "ncu_latency_bound_pct": ((39.5, 39.0), "latency", (40.5, 39.0), "compute"),
    "ncu_balanced_gap_pct": ((70.0, 79.5), "balanced", (70.0, 80.5), "memory"),
    "ncu_balanced_min_pct": ((60.5, 61.0), "balanced", (59.5, 61.0), "memory"),
}


def test_every_threshold_is_pinned() -> None:
    exact = {"attainable_bandwidth_pct", "attainable_compute_pct", "kernel_floor_us", "no_phase_confidence_scale"}
    names = {f.name for f in dataclasses.fields(Thresholds)}
    assert names == set(CASES) | set(BOUND_CASES) | exact, (
        names - set(CASES) - set(BOUND_CASES) - exact,
        set(CASES) - names,
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_threshold_boundary_both_sides(name: str) -> None:
    build, shows, fires_at, quiet_at = CASES[name]
    assert shows(build(fires_at)), (name, fires_at, sorted(ids(build(fires_at))))
    assert not shows(build(quiet_at)), (name, quiet_at, sorted(ids(build(quiet_at))))


@pytest.mark.parametrize("name", sorted(BOUND_CASES))
def test_ncu_bound_boundaries(name: str) -> None:
    (c1, m1), b1, (c2, m2), b2 = BOUND_CASES[name]
    assert ncu_bound(c1, m1) == b1 and ncu_bound(c2, m2) == b2


def test_pricing_thresholds_give_exact_ideals() -> None:
    """The attainable roofs and the kernel floor price the ledger's ideals exactly: a moved default moves these
    figures."""
    report = real("h200_llama5b_every_verb/run_b32_raw.json.gz")
    lg = report.ledger
    assert isinstance(lg, StepLedger)
    decode = next(p for p in lg.phases if p.phase == "decode")
    matmul = next(r for r in decode.rows if r.part.startswith("matmul"))
    weights = 10.47e9
    weight_bytes = report.decode_cost.weight_bytes  # type: ignore[union-attr]
    assert matmul.ideal_ms_per_step == pytest.approx(weight_bytes / (0.85 * 4.8e12) * 1e3, rel=1e-6)
    assert matmul.ideal_ms_per_step == pytest.approx(weights / (0.85 * 4.8e12) * 1e3, rel=0.01)
    prefill = next(p for p in lg.phases if p.phase == "prefill")
    compute_bound = next(r for r in prefill.rows if r.part.startswith("matmul"))
    assert "TFLOP" in (compute_bound.basis or "")
    tflop = float((compute_bound.basis or "").split(" GB, ")[1].split(" TFLOP")[0])
    assert compute_bound.ideal_ms_per_step == pytest.approx(
        tflop * 1e12 / (0.80 * 989e12) * 1e3, rel=2e-3
    )  # 12.4 TFLOP: compute-bound
    b1 = real("h200_llama5b_every_verb/run_b1_raw.json.gz").ledger
    assert isinstance(b1, StepLedger)
    attention = next(r for r in next(p for p in b1.phases if p.phase == "decode").rows if r.part == "attention")
    assert attention.ideal_ms_per_step == pytest.approx(
        (attention.kernels_per_step or 0) * 2.0e-3, rel=1e-3
    )  # below the floor: 2 us a kernel
    assert "at 2 µs each" in (attention.basis or "")


def test_no_phase_confidence_scale_is_applied_exactly() -> None:
    raw = RawCapture.load(
        str(
            __import__("pathlib").Path(__file__).parents[1]
            / "data"
            / "gpu"
            / "h200_llama7b_gemv_decode"
            / "big_cupti_raw.json.gz"
        )
    )
    bare = build_report(msgspec.structs.replace(raw, steps=[]))
    f = next(f for f in bare.findings if f.id == "healthy-dense-decode")
    assert f.confidence == pytest.approx(0.8 * 0.75)


def test_noisy_growth_fires_once_the_trend_threshold_drops() -> None:
    """The quiet case of kv_trend_corr is a real boundary: the same noisy growth is judged broken at a threshold of
    0.5."""
    assert "kv-cache-broken" in ids(build_report(_raw_of(13), thresholds=Thresholds(kv_trend_corr=0.5)))
    assert "kv-cache-broken" not in ids(build_report(_raw_of(13)))


def _raw_of(seed: int) -> RawCapture:
    import random

    rng = random.Random(seed)
    n = 64
    times = [1.0 + 4.0 * i / n + rng.uniform(0, 6.0) for i in range(n)]
    return synthetic([5.0] + times, [DENSE] * (n + 1))


def test_kv_trend_and_gradual_share_judge_shape_not_level() -> None:
    """kv_trend_corr (0.8): a doubling decode whose order is scrambled enough to drop its rank correlation under 0.8 is
    not growth; kv_gradual_share (0.25): one jump in the middle is not growth, steady growth is (test_rules holds both
    cases on more shapes)."""
    steady = kv_growth(2.0)
    assert "kv-cache-broken" in ids(steady)
    f = next(f for f in steady.findings if f.id == "kv-cache-broken")
    assert f.evidence["time_vs_sequence_correlation"] >= 0.8
    assert "kv-cache-broken" not in ids(build_report(synthetic([5.0] + [1.0] * 32 + [2.0] * 32, [DENSE] * 65)))
    # the same times in a shuffled order: the step times rise, but not with the sequence
    import random

    times = [1.0 + (1.0 / 64) * i for i in range(64)]
    random.Random(3).shuffle(times)
    assert "kv-cache-broken" not in ids(build_report(synthetic([5.0] + times, [DENSE] * 65)))
    _ = Step  # the model record the builders above make
