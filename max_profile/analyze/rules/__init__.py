"""Diagnosis rules as data: every rule is a pure function of a :class:`Report` registered in :data:`RULES` with the
finding ids it may emit, what it needs (checked by the engine, which skips the rule with the reason when something is
missing) and the :class:`Thresholds` fields it decides by (``evaluate(report, Thresholds(host_bound_util_pct=30))``).

One module per family of rules: :mod:`.levers` (where the time goes, from the step ledger), :mod:`.utilization`,
:mod:`.tracing`, :mod:`.kernel_mix`, :mod:`.kv_cache`, :mod:`.serving`, :mod:`.startup`, :mod:`.nsight`.

The engine (:func:`evaluate_rules`) drops findings a better explanation superseded (:data:`SUPERSEDED_BY`), then ranks:
errors first, then warnings, then info; inside each, the findings with a lever by what fixing them buys over the capture
(ms per step x steps, most first), then the rest in rule order.
"""

from __future__ import annotations

from collections.abc import Callable

from max_profile.analyze.rules.base import NEEDS, Rule, RuleSpec, nvml_window_long_enough, unmet
from max_profile.analyze.rules.idle import rule_gpu_idle
from max_profile.analyze.rules.kernel_mix import (
    rule_communication,
    rule_moe,
    rule_quant_prep,
    rule_slow_path_kernels,
    rule_unfused,
)
from max_profile.analyze.rules.kv_cache import rule_kv_cache
from max_profile.analyze.rules.levers import (
    rule_attention,
    rule_decode_bandwidth,
    rule_gpu_bound,
    rule_healthy_decode,
    rule_matmul,
    rule_op_roofline,
    rule_outside_steps,
)
from max_profile.analyze.rules.nsight import rule_kernel_analyses
from max_profile.analyze.rules.serving import rule_latency_knee
from max_profile.analyze.rules.startup import rule_startup
from max_profile.analyze.rules.tracing import rule_graphs_hid_kernels, rule_phase_markers_missing, rule_tracer_overhead
from max_profile.analyze.rules.utilization import rule_host_contention, rule_near_oom, rule_throttled
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Finding, Report, SkippedRule

__all__ = [
    "NEEDS",
    "RULES",
    "SUPERSEDED_BY",
    "Rule",
    "RuleSpec",
    "evaluate",
    "evaluate_rules",
    "nvml_window_long_enough",
]

_PRICED_LEVER = (
    "attainable_bandwidth_pct",
    "attainable_compute_pct",
    "kernel_floor_us",
    "lever_warning_pct",
    "lever_info_pct",
    "lever_min_steps",
)
"""What a lever priced against the roofline decides by: the attainable peaks, the kernel floor, the lever's size."""

RULES: tuple[RuleSpec, ...] = (
    RuleSpec(
        "kv-cache",
        rule_kv_cache,
        ("kv-cache-broken",),
        ("steps", "step_summary"),
        (
            "kv_growth_ratio",
            "kv_min_decode_steps",
            "kv_min_context_growth",
            "kv_refeed_steps_share",
            "kv_model_refeed_corr",
            "kv_trend_corr",
            "kv_gradual_share",
            "host_load_other_cores",
            "host_load_busy_fraction",
        ),
    ),
    RuleSpec(
        "load",
        rule_outside_steps,
        ("lightly-loaded", "time-outside-steps"),
        ("load",),
        ("light_load_pct", "lever_warning_pct", "lever_info_pct", "lever_min_steps"),
    ),
    RuleSpec(
        "gpu-idle",
        rule_gpu_idle,
        ("host-bound", "graph-launch-late", "gpu-idle", "host-time-between-ops", "ops-bound"),
        ("ledger|utilization|kernels", "known_load"),
        (
            "host_bound_busy_pct",
            "host_bound_util_pct",
            "nvml_min_window_s",
            "nvml_min_samples",
            "no_phase_confidence_scale",
            "lever_warning_pct",
            "lever_info_pct",
            "lever_min_steps",
            "light_load_pct",
            "gpu_wait_min_us",
            "gpu_wait_max_ms",
            "graph_launch_late_pct",
            "graph_launch_late_share",
            "graph_launch_late_min_gaps",
        ),
    ),
    RuleSpec(
        "matmul",
        rule_matmul,
        ("matmul-slow-path", "matmul-below-roofline"),
        ("ledger", "gpu_kernels"),
        ("slow_matmul_share_pct", "slow_matmul_roofline_pct", *_PRICED_LEVER),
    ),
    RuleSpec(
        "slow-path-kernels", rule_slow_path_kernels, ("kernel-slow-path",), ("gpu_kernels",), ("slow_path_share_pct",)
    ),
    RuleSpec("attention", rule_attention, ("attention-below-roofline",), ("ledger", "gpu_kernels"), _PRICED_LEVER),
    RuleSpec(
        "op-roofline",
        rule_op_roofline,
        ("op-below-roofline",),
        ("ledger", "gpu_kernels"),
        ("slow_matmul_roofline_pct", *_PRICED_LEVER),
    ),
    RuleSpec(
        "gpu-bound",
        rule_gpu_bound,
        ("gpu-bound",),
        ("gpu_kernels",),
        ("gpu_bound_busy_pct", "no_phase_confidence_scale"),
    ),
    RuleSpec("throttled", rule_throttled, ("throttled",), ("utilization",), ("throttle_clock_pct",)),
    RuleSpec("near-oom", rule_near_oom, ("near-oom",), ("utilization",), ("near_oom_pct",)),
    RuleSpec("device-graphs", rule_graphs_hid_kernels, ("device-graphs",), ("kernels",)),
    RuleSpec(
        "tracer-overhead",
        rule_tracer_overhead,
        ("tracer-overhead",),
        ("kernels|tracer_cost",),
        ("tracer_overhead_pct", "tracer_slowdown_pct"),
    ),
    RuleSpec(
        "host-contention",
        rule_host_contention,
        ("host-contention",),
        ("host_load",),
        ("host_load_other_cores", "host_load_busy_fraction"),
    ),
    RuleSpec("phases-missing", rule_phase_markers_missing, ("phases-missing",), ("kernels",)),
    RuleSpec(
        "unfused",
        rule_unfused,
        ("unfused-attention", "unfused-norm"),
        ("kernels",),
        ("min_attention_kernels_per_step", "no_phase_confidence_scale", "unfused_norm_min_kernels"),
    ),
    RuleSpec(
        "healthy-decode",
        rule_healthy_decode,
        ("healthy-dense-decode", "healthy-batched-decode"),
        ("gpu_kernels",),
        ("healthy_gemv_share_pct", "batched_decode_min_batch", "lever_warning_pct", "no_phase_confidence_scale"),
    ),
    RuleSpec(
        "moe",
        rule_moe,
        ("moe-routing-heavy", "healthy-moe"),
        ("gpu_kernels",),
        ("routing_vs_matmul_ratio", "lever_warning_pct"),
    ),
    RuleSpec(
        "quant", rule_quant_prep, ("quant-prep-heavy", "low-bit-normal"), ("gpu_kernels",), ("quant_vs_matmul_ratio",)
    ),
    RuleSpec("decode-bandwidth", rule_decode_bandwidth, ("decode-bandwidth",), ("decode_cost", "gpu")),
    RuleSpec(
        "communication",
        rule_communication,
        ("communication-dominates", "communication-share"),
        ("multi_device",),
        ("communication_share_pct",),
    ),
    RuleSpec(
        "latency-knee",
        rule_latency_knee,
        ("latency-knee", "load-scales"),
        ("load_levels",),
        (
            "knee_min_gain",
            "knee_min_efficiency",
            "knee_itl_growth",
            "knee_batch_growth",
            "knee_kv_pressure_pct",
            "knee_itl_spike_ratio",
            "knee_gpu_saturated_pct",
            "host_bound_util_pct",
        ),
    ),
    RuleSpec(
        "startup",
        rule_startup,
        ("compile-failed", "startup-compile", "startup-weights-slow", "startup-kv-alloc", "startup-custom-import-slow"),
        ("startup",),
        (
            "startup_min_s",
            "startup_compile_share_pct",
            "weights_slow_gbps",
            "weights_min_bytes",
            "kv_alloc_share_pct",
            "custom_import_slow_s",
        ),
    ),
    RuleSpec(
        "kernel-analyses",
        rule_kernel_analyses,
        (
            "kernel-memory-bound-near-peak",
            "kernel-on-chip-bound",
            "kernel-memory-bound",
            "kernel-compute-far-from-peak",
            "kernel-latency-bound",
            "kernel-low-occupancy",
            "kernel-occupancy-limited",
        ),
        ("kernel_analyses",),
        (
            "ncu_latency_bound_pct",
            "ncu_balanced_gap_pct",
            "ncu_balanced_min_pct",
            "ncu_near_peak_dram_pct",
            "ncu_on_chip_busy_pct",
            "ncu_on_chip_dram_idle_pct",
            "ncu_compute_far_pct",
            "ncu_low_occupancy_ratio",
            "ncu_occupancy_limited_pct",
        ),
    ),
)
"""Every rule, in the order they run."""

_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}

_IDLE = frozenset({"host-bound", "graph-launch-late", "gpu-idle"})
_KERNEL_LEVERS = frozenset(
    {"matmul-slow-path", "matmul-below-roofline", "attention-below-roofline", "op-below-roofline", "kernel-slow-path"}
)

SUPERSEDED_BY: dict[str, frozenset[str]] = {
    # a decode that re-encodes the sequence, or runs attention as generic ops, is not a healthy decode
    "healthy-dense-decode": frozenset({"kv-cache-broken", "unfused-attention", "matmul-slow-path", "kernel-slow-path"}),
    "healthy-batched-decode": frozenset(
        {"kv-cache-broken", "unfused-attention", "matmul-slow-path", "kernel-slow-path"}
    ),
    "healthy-moe": frozenset({"kv-cache-broken", "unfused-attention"}),
    # its bytes-per-step model (weights + KV cache once) does not apply to a re-encoding decode
    "decode-bandwidth": frozenset({"kv-cache-broken"}),
    # utilization and idle figures measured while the tracer stalled the process say nothing about the host
    **{i: frozenset({"tracer-overhead"}) for i in _IDLE},
    # "quantization at normal cost" next to a matmul path far below its roofline reads as "all is well": the slow path
    # is the news
    "low-bit-normal": frozenset({"matmul-slow-path", "matmul-below-roofline", "op-below-roofline", "kernel-slow-path"}),
    # the ledger's matmul verdict names the same slow path with what fixing it buys
    "kernel-slow-path": frozenset({"matmul-slow-path"}),
    # a named healthy mix or a lever already says where the busy GPU's time goes
    "gpu-bound": frozenset(
        {
            "healthy-dense-decode",
            "healthy-moe",
            "moe-routing-heavy",
            "kv-cache-broken",
            "tracer-overhead",
            "healthy-batched-decode",
            *_KERNEL_LEVERS,
        }
    ),
}
"""Findings dropped when a finding that explains the same numbers better fired (each drop is listed in the report's
``rules_skipped``, with what superseded it)."""


def _tracing_share_netted(report: Report, finding: Finding) -> bool:
    """The tracer's cost was measured against an untraced window of the same server and the idle finding took the
    recording's share out of its lever (the rest of the idle is the server's own): a tracer-overhead finding does not
    drop it."""
    c = report.tracer_cost
    return c is not None and c.throughput_ratio is not None and "idle_from_recording_ms_per_step" in finding.evidence


KEPT_WHEN: dict[str, Callable[[Report, Finding], bool]] = {i: _tracing_share_netted for i in _IDLE}
"""Exceptions to :data:`SUPERSEDED_BY`: a finding kept beside its superseder when the report shows the superseder's
share was taken out of it."""


def _rank(f: Finding, order: int) -> tuple[int, int, float, int]:
    lever = f.lever
    return (
        _SEVERITY_ORDER[f.severity],
        0 if lever is not None else 1,
        -(lever.total_ms if lever is not None else 0.0),
        order,
    )


def evaluate_rules(
    report: Report, thresholds: Thresholds | None = None, rules: tuple[RuleSpec, ...] = RULES
) -> tuple[list[Finding], list[SkippedRule]]:
    """Run every rule whose needs the report meets (the others are returned as skipped, with the reason); drop findings
    a better explanation superseded; rank what remains (see the module docstring)."""
    th = thresholds or Thresholds()
    found: list[tuple[str, Finding]] = []
    skipped: list[SkippedRule] = []
    for rule in rules:
        why = unmet(report, rule.needs)
        if why is not None:
            skipped.append(SkippedRule(rule=rule.name, reason=why))
            continue
        emitted = rule.fn(report, th)
        stray = {f.id for f in emitted} - set(rule.emits)
        if stray:
            raise AssertionError(f"rule {rule.name} emitted {sorted(stray)}, not among its declared ids {rule.emits}")
        found.extend((rule.name, f) for f in emitted)
    fired = {f.id for _, f in found}
    kept: list[Finding] = []
    for name, f in found:
        by = SUPERSEDED_BY.get(f.id, frozenset()) & fired
        if by and not (f.id in KEPT_WHEN and KEPT_WHEN[f.id](report, f)):
            skipped.append(SkippedRule(rule=name, reason=f"{f.id} superseded by {', '.join(sorted(by))}: {f.title}"))
        else:
            kept.append(f)
    ranked = sorted(enumerate(kept), key=lambda item: _rank(item[1], item[0]))
    return [f for _, f in ranked], skipped


def evaluate(
    report: Report, thresholds: Thresholds | None = None, rules: tuple[RuleSpec, ...] = RULES
) -> list[Finding]:
    """The findings of :func:`evaluate_rules` (ranked), without the skipped rules."""
    return evaluate_rules(report, thresholds, rules)[0]
