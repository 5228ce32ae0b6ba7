"""Every finding id, both ways: present on a capture that must trigger it, absent on a close one that must not.

Real captures (tests/data) where one shows the case, generated data with a known truth where none does. The table must
name every id the registered rules can emit: a new id without both cases fails here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from max_profile.analyze.report import build_report
from max_profile.analyze.rules import RULES, evaluate
from max_profile.model import (
    Environment,
    HostLoad,
    KernelAnalysis,
    LatencyStats,
    LoadLevel,
    OpBreakdown,
    PreflightResult,
    RawCapture,
    Report,
    ServerMetrics,
    StartupPhase,
    StartupProfile,
)

from ...analyze.rules.test_rules import DENSE, _samples, big, synthetic
from ...analyze.test_ledger import _attach_window, _idle_capture
from ...collect.readers.test_multi_device import split_with_allreduce

DATA = Path(__file__).parents[2] / "data"
H200 = DATA / "gpu"
CPU_ENV = Environment(vendor="none", vendor_reason="test: no GPU")

_cache: dict[str, Report] = {}


@pytest.fixture(autouse=True, scope="session")
def _reports_built_in_this_session() -> None:
    """Reports are cached per test session, never across: a mutation-testing run forks sessions from one process, and a
    report built by the unmutated code would hide a mutant."""
    _cache.clear()


def real(name: str) -> Report:
    if name not in _cache:
        _cache[name] = build_report(RawCapture.load(str(H200 / name)))
    return _cache[name]


def _with(report: Report, **fields: object) -> Report:
    """The report with sections replaced, its findings evaluated again (the rules read only the report)."""
    out = msgspec.structs.replace(report, **fields)
    out.findings = evaluate(out)
    return out


# --- generated captures -----------------------------------------------------------------------------------------


def _ops_on_cpu(cover: float) -> Report:
    """MAX's op ranges on a CPU covering ``cover`` of each 1 ms decode step (the rest: host work between ops)."""
    ops = [("matmulmo.matmul", 0.9 * cover), ("mo.mha.ragged.paged", 0.1 * cover)]
    raw = synthetic([1.0] * 41, [ops] * 41)
    return build_report(
        msgspec.structs.replace(raw, environment=CPU_ENV, kernel_source="nvtx-log (MAX op ranges, host time)")
    )


def _outside(gap_ms: float) -> Report:
    """Decode steps of 1 ms (GPU busy 96 %) with ``gap_ms`` of nothing between them."""
    raw = _idle_capture(0.96, 0.04, steps=30)
    shift = int(gap_ms * 1e6)
    steps = [
        msgspec.structs.replace(s, start_ns=s.start_ns + i * shift, end_ns=s.end_ns + i * shift)
        for i, s in enumerate(raw.steps)
    ]
    kernels = [
        msgspec.structs.replace(
            k,
            start_ns=k.start_ns + (i // 2) * shift,
            end_ns=k.end_ns + (i // 2) * shift,
            launch_ns=(k.launch_ns or 0) + (i // 2) * shift,
        )
        for i, k in enumerate(raw.kernels.records())
    ]
    return build_report(msgspec.structs.replace(raw, steps=steps, kernels=kernels))


def _norms_only(busy: float) -> Report:
    """A decode of norm and attention kernels (no matmul), busy ``busy`` of each step: no healthy mix to name."""
    ks = [("rms_norm_fused_residual_0123456789abcdef", 0.9 * busy), ("sm90_mha_depth128_0123456789abcdef", 0.1 * busy)]
    return build_report(synthetic([1.0] * 41, [ks] * 41))


def _unfused_norm(with_norm: bool) -> Report:
    ks = [("gemv_split_k_bf16_128_0123456789abcdef", 0.7), ("sm90_mha_depth128_0123456789abcdef", 0.1)]
    if with_norm:
        ks.append(("rms_norm_fused_residual_0123456789abcdef", 0.05))
    else:
        ks += [("elementwise_add_0123456789abcdef", 0.01)]
    return build_report(synthetic([1.0] * 41, [ks] * 41))


def _startup(**kw: object) -> Report:
    base = {"total_s": 100.0, "phases": [StartupPhase(name="compile model", seconds=20.0)], "cache": "hit"}
    base.update(kw)
    return _with(real("h200_llama5b_every_verb/run_b1_raw.json.gz"), startup=StartupProfile(**base))  # type: ignore[arg-type]


def _analysis(**kw: object) -> Report:
    base = {
        "kernel_name": "k",
        "launch_id": 1,
        "compute_throughput_pct": 30.0,
        "memory_throughput_pct": 85.0,
        "dram_throughput_pct": 85.0,
        "achieved_occupancy_pct": 40.0,
        "theoretical_occupancy_pct": 50.0,
        "bound": "memory",
    }
    base.update(kw)
    analysis = KernelAnalysis(**base)  # type: ignore[arg-type]
    return _with(real("h200_llama5b_every_verb/run_b1_raw.json.gz"), kernel_analyses=[analysis])


def _level(
    c: int, tok_s: float, itl: float, gpu: float | None = None, server: ServerMetrics | None = None
) -> LoadLevel:
    return LoadLevel(
        concurrency=c,
        window_s=10.0,
        requests=10 * c,
        completed=10 * c,
        failed=0,
        output_tokens=int(tok_s * 10),
        output_tok_per_s=tok_s,
        request_rate_rps=float(c),
        ttft_ms=LatencyStats(p50=20.0, p90=25.0, p99=30.0, samples=10),
        itl_ms=LatencyStats(p50=itl, p90=itl * 1.2, p99=itl * 1.5, samples=100),
        gpu_utilization_pct=gpu,
        server=server,
    )


def _sweep(scaling: bool) -> Report:
    levels = [_level(1, 300.0, 3.0), _level(4, 1100.0 if scaling else 330.0, 3.3 if scaling else 9.0, gpu=95.0)]
    return _with(real("h200_llama5b_every_verb/run_b1_raw.json.gz"), load_levels=levels)


def _preflight(import_s: float) -> Report:
    st = StartupProfile(
        total_s=60.0,
        phases=[StartupPhase(name="custom-architecture preflight (a child imports the package)", seconds=20.0)],
    )
    return _with(
        real("h200_llama5b_every_verb/run_b1_raw.json.gz"),
        startup=st,
        preflight=[PreflightResult(spec="pkg", max_version="26.7.0", checks=[], package_import_s=import_s)],
    )


def _samples_report(util: float, used: float, reasons: list[str]) -> Report:
    return build_report(synthetic([1.0] * 40, [DENSE] * 40, samples=_samples(util, used, reasons)))


def others(cores: float, own: float = 1.0) -> Report:
    """Other processes using ``cores`` of a 2-core host beside our ``own``."""
    raw = _idle_capture(0.96, 0.04)
    raw.capture.host_load = HostLoad(
        window_s=1.0, cores=2, cpu_busy_pct=100 * (own + cores) / 2, own_cores=own, other_cores=cores
    )
    return build_report(raw)


def callbacks(pct: float) -> Report:
    """The kernel recorder's callbacks took ``pct`` % of the window."""
    raw = _idle_capture(0.96, 0.04)
    window_s = (raw.steps[-1].end_ns - raw.steps[0].start_ns) / 1e9
    return build_report(msgspec.structs.replace(raw, tracer_callback_s=pct / 100 * window_s))


def _graphs(hidden: bool) -> Report:
    raw = big()
    if hidden:
        return build_report(msgspec.structs.replace(raw, graph_launches=64))
    return build_report(raw)


def _kv(growing: bool) -> Report:
    n = 64
    if growing:
        return build_report(
            synthetic(
                [5.0] + [1.0 + 0.05 * i for i in range(n)],
                [DENSE] + [[(DENSE[0][0], 0.5 + 0.05 * i)] + DENSE[1:] for i in range(n)],
            )
        )
    return build_report(synthetic([5.0] + [1.0] * n, [DENSE] * (n + 1)))


def _mix(kernels: list[tuple[str, float]]) -> Report:
    return build_report(synthetic([1.0] * 10, [kernels] * 10))


def _phases(bare: bool) -> Report:
    raw = big()
    return build_report(msgspec.structs.replace(raw, steps=[]) if bare else raw)


def _fp8_without_config() -> Report:
    raw = RawCapture.load(str(H200 / "h200_llama5b_every_verb/run_fp8_raw.json.gz"))
    return build_report(
        msgspec.structs.replace(
            raw, capture=msgspec.structs.replace(raw.capture, model_config=None, model_weights=None)
        )
    )


def _fp8_import(steps: bool) -> Report:
    """The FP8 capture as an imported trace would be: no model config, and without steps (a Kineto trace) or with."""
    raw = RawCapture.load(str(H200 / "h200_llama5b_every_verb/run_fp8_raw.json.gz"))
    capture = msgspec.structs.replace(raw.capture, model_config=None, model_weights=None)
    return build_report(msgspec.structs.replace(raw, capture=capture, steps=raw.steps if steps else []))


GROUPED = "grouped_matmul_sm90_0123456789abcdef"
ROUTE = "moe_create_indices_0123456789abcdef"
QUANT = "quantize_dynamic_fp8_0123456789abcdef"
BLOCK = "block_scaled_matmul_0123456789abcdef"

CASES: dict[str, tuple[Callable[[], Report], Callable[[], Report]]] = {
    # id: (a capture that must show it, a close one that must not)
    "kv-cache-broken": (
        lambda: real("h200_llama1.75b_custom_architectures/arch_c_raw.json.gz"),
        lambda: real("h200_llama1.75b_custom_architectures/arch_a_raw.json.gz"),
    ),
    "lightly-loaded": (
        lambda: real("h200_llama3b_batch64_ledger/attach_idle_3b_raw.json.gz"),
        lambda: build_report(_attach_window(26, 0.2)),
    ),
    "time-outside-steps": (lambda: _outside(0.25), lambda: _outside(0.02)),
    "host-bound": (
        lambda: real("h200_llama5b_serve_steps_startup/demo_raw.json.gz"),
        lambda: real("h200_llama5b_every_verb/run_b1_raw.json.gz"),
    ),
    "graph-launch-late": (
        lambda: real("h200_llama3b_batch64_ledger/run_b64_3b_raw.json.gz"),
        lambda: real("h200_llama5b_every_verb/run_b32_raw.json.gz"),
    ),
    "gpu-idle": (
        lambda: build_report(_idle_capture(0.8, 0.2)),
        lambda: build_report(_idle_capture(0.8, 0.2, graphs=True)),
    ),
    "host-time-between-ops": (lambda: _ops_on_cpu(0.2), lambda: _ops_on_cpu(0.6)),
    "ops-bound": (lambda: _ops_on_cpu(0.6), lambda: _ops_on_cpu(0.2)),
    "matmul-slow-path": (
        lambda: real("h200_llama5b_every_verb/run_fp8_raw.json.gz"),
        lambda: real("h200_llama5b_every_verb/run_b32_raw.json.gz"),
    ),
    "matmul-below-roofline": (lambda: real("h200_llama5b_every_verb/run_b32_raw.json.gz"), lambda: _batched(2.7)),
    # a trace without steps: only the kernels' names say the matmuls took the fallback; with steps the ledger's
    # matmul-slow-path says it, with its lever
    "kernel-slow-path": (lambda: _fp8_import(steps=False), lambda: _fp8_import(steps=True)),
    "attention-below-roofline": (
        lambda: real("h200_llama3b_batch64_ledger/run_b64_3b_raw.json.gz"),
        lambda: real("h200_llama5b_every_verb/run_b32_raw.json.gz"),
    ),
    "op-below-roofline": (lambda: real(OPS_A), lambda: _ops_at_their_roofline(real(OPS_A))),
    "gpu-bound": (lambda: _norms_only(0.9), lambda: _norms_only(0.8)),
    "throttled": (
        lambda: _samples_report(90, 0.5, ["hw_thermal_slowdown"]),
        lambda: _samples_report(90, 0.5, ["gpu_idle"]),
    ),
    "near-oom": (lambda: _samples_report(90, 0.98, []), lambda: _samples_report(90, 0.96, [])),
    "device-graphs": (lambda: _graphs(hidden=True), lambda: _graphs(hidden=False)),
    "tracer-overhead": (lambda: callbacks(6.0), lambda: callbacks(4.0)),
    "host-contention": (lambda: others(1.0), lambda: others(0.5)),
    "phases-missing": (lambda: _phases(bare=True), lambda: _phases(bare=False)),
    "unfused-attention": (
        lambda: real("h200_llama1.75b_custom_architectures/arch_b_raw.json.gz"),
        lambda: real("h200_llama1.75b_custom_architectures/arch_a_raw.json.gz"),
    ),
    "unfused-norm": (lambda: _unfused_norm(False), lambda: _unfused_norm(True)),
    "healthy-dense-decode": (
        lambda: real("h200_llama5b_every_verb/run_b1_raw.json.gz"),
        lambda: real("h200_llama5b_every_verb/run_b32_raw.json.gz"),
    ),
    "healthy-batched-decode": (lambda: _batched(2.7), lambda: _batched(4.0)),
    "moe-routing-heavy": (
        lambda: _mix([(GROUPED, 0.4), (ROUTE, 0.2), ("gather_r2_0123456789abcdef", 0.1), DENSE[1]]),
        lambda: _mix([(GROUPED, 0.8), (ROUTE, 0.05), DENSE[1]]),
    ),
    "healthy-moe": (
        lambda: _mix([(GROUPED, 0.8), (ROUTE, 0.05), DENSE[1]]),
        lambda: _mix([(GROUPED, 0.4), (ROUTE, 0.2), ("gather_r2_0123456789abcdef", 0.1), DENSE[1]]),
    ),
    "quant-prep-heavy": (
        lambda: _mix([(QUANT, 0.6), (BLOCK, 0.3), DENSE[1]]),
        lambda: _mix([(QUANT, 0.05), (BLOCK, 0.6), DENSE[1]]),
    ),
    "low-bit-normal": (
        lambda: _mix([(QUANT, 0.05), (BLOCK, 0.6), DENSE[1]]),
        lambda: _mix([(QUANT, 0.6), (BLOCK, 0.3), DENSE[1]]),
    ),
    "decode-bandwidth": (lambda: real("h200_llama5b_every_verb/run_b1_raw.json.gz"), lambda: _kv(growing=True)),
    "communication-dominates": (
        lambda: build_report(split_with_allreduce(3000)),
        lambda: build_report(split_with_allreduce(200)),
    ),
    "communication-share": (
        lambda: build_report(split_with_allreduce(200)),
        lambda: build_report(split_with_allreduce(3000)),
    ),
    "latency-knee": (lambda: _sweep(scaling=False), lambda: _sweep(scaling=True)),
    "load-scales": (lambda: _sweep(scaling=True), lambda: _sweep(scaling=False)),
    "compile-failed": (lambda: _startup(failure="kernel.mojo:12: error; a MAX compiler failure"), lambda: _startup()),
    "startup-compile": (
        lambda: _startup(cache="miss", phases=[StartupPhase(name="compile model", seconds=60.0)]),
        lambda: _startup(cache="miss", phases=[StartupPhase(name="compile model", seconds=40.0)]),
    ),
    "startup-weights-slow": (
        lambda: _startup(phases=[StartupPhase(name="weights to device", seconds=8.0, bytes=4 << 30, gb_per_s=0.54)]),
        lambda: _startup(phases=[StartupPhase(name="weights to device", seconds=2.0, bytes=4 << 30, gb_per_s=2.1)]),
    ),
    "startup-kv-alloc": (
        lambda: _startup(phases=[StartupPhase(name="KV cache allocation and pipeline setup", seconds=35.0)]),
        lambda: _startup(phases=[StartupPhase(name="KV cache allocation and pipeline setup", seconds=25.0)]),
    ),
    "startup-custom-import-slow": (lambda: _preflight(12.0), lambda: _preflight(8.0)),
    "kernel-memory-bound-near-peak": (
        lambda: _analysis(dram_throughput_pct=75.0),
        lambda: _analysis(dram_throughput_pct=65.0),
    ),
    "kernel-on-chip-bound": (
        lambda: _analysis(dram_throughput_pct=5.0, metrics={"L1/TEX Cache Throughput": 85.0}),
        lambda: _analysis(dram_throughput_pct=5.0, metrics={"L1/TEX Cache Throughput": 75.0}),
    ),
    "kernel-memory-bound": (lambda: _analysis(dram_throughput_pct=50.0), lambda: _analysis(dram_throughput_pct=75.0)),
    "kernel-compute-far-from-peak": (
        lambda: _analysis(bound="compute", compute_throughput_pct=55.0),
        lambda: _analysis(bound="compute", compute_throughput_pct=65.0),
    ),
    "kernel-latency-bound": (lambda: _analysis(bound="latency"), lambda: _analysis(bound="balanced")),
    "kernel-low-occupancy": (
        lambda: _analysis(achieved_occupancy_pct=24.0, theoretical_occupancy_pct=50.0),
        lambda: _analysis(achieved_occupancy_pct=26.0, theoretical_occupancy_pct=50.0),
    ),
    "kernel-occupancy-limited": (
        lambda: _analysis(achieved_occupancy_pct=40.0, theoretical_occupancy_pct=45.0, occupancy_limiter="registers"),
        lambda: _analysis(achieved_occupancy_pct=40.0, theoretical_occupancy_pct=55.0, occupancy_limiter="registers"),
    ),
}


OPS_A = "h200_llama_custom_ops_vs_default/ops_a_raw.json.gz"
"""``--kernels ops`` on the H200: its prefill's layer matmul op runs at 32 % of its roofline (0.53 of 8.18 ms)."""


def _ops_at_their_roofline(report: Report) -> Report:
    """The same ops capture with every priced op group at its ideal: nothing left to gain."""
    ops = report.ops
    assert isinstance(ops, OpBreakdown) and ops.priced
    at_roof = [
        msgspec.structs.replace(g, ms_per_step=g.ideal_ms_per_step, recoverable_ms_per_step=0.0, pct_of_roofline=100.0)
        for g in ops.priced
    ]
    return _with(report, ops=msgspec.structs.replace(ops, priced=at_roof))


def _batched(matmul_ms: float) -> Report:
    from ...analyze.test_roofline import M24, M24_WEIGHTS, _decode_capture

    kernels = [
        ("sm90_matmul_bfloat16_bfloat16_bfloat16_True_0123456789abcdef", matmul_ms),
        ("sm90_mha_depth128_bfloat16_0123456789abcdef", 0.3),
        ("rms_norm_fused_residual_gpu_0123456789abcdef", 0.2),
    ]
    return build_report(_decode_capture(32, 100, matmul_ms + 0.55, kernels, M24, M24_WEIGHTS))


def test_the_table_names_every_finding_id() -> None:
    emitted = {i for r in RULES for i in r.emits}
    assert set(CASES) == emitted, (emitted - set(CASES), set(CASES) - emitted)


@pytest.mark.parametrize("fid", sorted(CASES))
def test_each_finding_id_both_ways(fid: str) -> None:
    fires, quiet = CASES[fid]
    present = {f.id for f in fires().findings}
    assert fid in present, (fid, sorted(present))
    absent = {f.id for f in quiet().findings}
    assert fid not in absent, (fid, sorted(absent))


def test_cpu_reports_keep_gpu_verdicts_out() -> None:
    """On a CPU (no GPU): no bandwidth or host-bound verdict, whatever the op ranges cover."""
    report = _ops_on_cpu(0.2)
    assert not {"host-bound", "decode-bandwidth", "gpu-bound", "gpu-idle", "graph-launch-late"} & {
        f.id for f in report.findings
    }


def test_fp8_without_config_names_the_fallback_from_its_kernels() -> None:
    report = _fp8_without_config()
    assert "matmul-slow-path" in {f.id for f in report.findings}
    assert report.decode_cost is None  # nothing priced: the name, the share and the launch shape are the evidence
