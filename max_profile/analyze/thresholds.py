"""Every number a verdict rests on, named and documented in one place: ``Thresholds`` (pass another to
:func:`~max_profile.analyze.report.build_report` or :func:`~max_profile.analyze.rules.evaluate`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    host_bound_util_pct: float = 40.0
    """Mean NVML utilization below this while steps ran → host-bound."""
    host_bound_busy_pct: float = 40.0
    """Decode GPU busy fraction (union of kernel time / wall time) below this → host-bound."""
    nvml_min_window_s: float = 2.0
    """NVML utilization judges a window only when it is at least this long (NVML averages over up to 1 s) ..."""
    nvml_min_samples: int = 10
    """... and has at least this many samples."""
    near_oom_pct: float = 97.0
    """Peak memory use above this % of total → close to out-of-memory."""
    healthy_gemv_share_pct: float = 35.0
    """Decode: matvec share at least this (and the top family) → healthy memory-bound decode."""
    routing_vs_matmul_ratio: float = 0.5
    """MoE: routing + gather time at least this × grouped-matmul time → routing rivals the experts."""
    quant_vs_matmul_ratio: float = 1.0
    """Low-bit: quantize / scale-layout time above this × matmul time → quant prep too long."""
    kv_growth_ratio: float = 1.6
    """Decode: last-third median step time / first-third median above this (and linear growth) → KV cache broken."""
    kv_min_decode_steps: int = 32
    """Decode steps needed before judging step-time growth."""
    kv_min_context_growth: int = 32
    """Context tokens the decode must grow by before judging step-time growth."""
    communication_share_pct: float = 30.0
    """Multi-GPU: collectives above this % of a device's decode kernel time → communication dominates."""
    min_attention_kernels_per_step: float = 0.5
    """Attention kernels per decode step below this (none, in practice) in a decoder with matmuls → attention is not
    fused. Judged by presence, never by share: a slow matmul drives attention's share of time to ~0 with attention
    fused."""
    slow_matmul_share_pct: float = 50.0
    """Matmul families at least this share of decode kernel time ..."""
    slow_path_share_pct: float = 15.0
    """Kernels that name themselves a slow path (naive / fallback / reference) at least this share of kernel time →
    kernel-slow-path (judged by name, without steps or a model config)."""
    slow_matmul_roofline_pct: float = 25.0
    """... reading the weights below this % of peak bandwidth and computing below this % of peak FLOP/s → far below the
    roofline."""
    batched_decode_min_batch: int = 2
    """Decode batches of at least this many requests are GEMM-shaped (judged as batched decode)."""
    tracer_overhead_pct: float = 5.0
    """In-process tracer callbacks above this % of the capture window → timing figures are distorted."""
    gpu_wait_min_us: float = 100.0
    """A gap between kernels at least this long is the GPU waiting for work (launch latency is a few µs) ..."""
    gpu_wait_max_ms: float = 5.0
    """... and under this long (longer: a server waiting for requests, a pause between steps; counted apart)."""
    graph_launch_late_pct: float = 2.0
    """Such waits that end at a device graph's kernel, this % of the capture window or more ..."""
    graph_launch_late_min_gaps: int = 20
    """... in at least this many gaps (one slow turn is not a pattern) → the host launched graphs late."""
    tracer_slowdown_pct: float = 3.0
    """Recorded throughput this % or more below the untraced reference window of the same server (serve kernels mode)
    → throughput and step times are the recorded ones (measured cost; it takes precedence over the callback share)."""
    throttle_clock_pct: float = 97.0
    """A throttle reason with the mean SM clock below this % of its max → throttled (warning); at or above → info
    only."""
    gpu_bound_busy_pct: float = 85.0
    """GPU busy (union of kernel time over the window) at or above this → GPU-bound."""
    kv_refeed_steps_share: float = 0.9
    """Decode steps feeding 2 or more tokens per request, at least this share of them → the sequence is fed again (with
    growth); speculative decoding feeds a constant 1 + draft tokens and does not grow."""
    kv_model_refeed_corr: float = 0.9
    """Model input tokens per request growing with the sequence at this correlation or more → the model re-encodes
    it."""
    no_phase_confidence_scale: float = 0.75
    """Confidence of a verdict drawn from a whole capture without phase ranges, relative to the per-phase one."""
    host_load_other_cores: float = 0.75
    """Other processes using at least this many cores' worth of CPU during the window ..."""
    host_load_busy_fraction: float = 0.85
    """... while the profiled tree and the others together used this share of all cores or more → timing figures
    unreliable."""
    knee_min_gain: float = 0.15
    """A sweep level whose output tok/s grew by less than this share over the level before (concurrency up) →
    throughput stopped scaling ..."""
    knee_min_efficiency: float = 0.5
    """... or whose throughput grew by less than this share of the concurrency's growth (x4 concurrency, under x2
    tok/s) ..."""
    knee_itl_growth: float = 1.5
    """... while its ITL p50 or TTFT p90 grew by this factor or more: latency bends there."""
    knee_batch_growth: float = 1.15
    """Batch size (server metrics) growing by less than this factor while concurrency rose → the batch limit is
    reached."""
    knee_kv_pressure_pct: float = 90.0
    """KV-cache use at or above this % at the knee (or any preemption) → KV-cache pressure."""
    knee_itl_spike_ratio: float = 3.0
    """ITL p99 / p50 at or above this with prefill (CE) batches in the window → prefill interference."""
    knee_gpu_saturated_pct: float = 90.0
    """NVML utilization at or above this at the knee → the GPU is saturated (the knee is its capacity)."""
    startup_compile_share_pct: float = 50.0
    """Compile phases at least this share of start-up (and the cache missed) → start-up is compile-dominated."""
    startup_min_s: float = 10.0
    """Start-ups shorter than this get no start-up verdict but a compile failure."""
    weights_slow_gbps: float = 1.0
    """Weights read before the first graph slower than this (GB/s, for at least ``weights_min_bytes``) → far below a
    local SSD."""
    weights_min_bytes: int = 1 << 30
    kv_alloc_share_pct: float = 30.0
    """KV-cache allocation at least this share of start-up → it dominates."""
    custom_import_slow_s: float = 10.0
    """Custom-architecture preflight / import longer than this → slow import."""
    unfused_norm_min_kernels: int = 50
    """Kernels a capture needs before a missing norm kernel is worth saying."""
    kv_trend_corr: float = 0.8
    """Step or kernel time must rise with the sequence at this rank correlation or more to count as growth."""
    kv_gradual_share: float = 0.25
    """Step time counts as growth only where each half of the decode rises too, at this share of the whole run's rise
    per token or more (robust slope): re-encoding grows every step, a neighbour starting mid-run makes one level
    shift."""
    graphs_off_min_kernels: int = 100
    """Kernels a graph-aware trace needs, none of them in a graph, before it says device graphs were off."""
    attainable_bandwidth_pct: float = 85.0
    """The share of the datasheet DRAM bandwidth a part's ideal time assumes (the H200 here: MAX's gemv_split_k at
    82-86 % of 4.8 TB/s in Nsight Compute and in decode steps; no kernel reaches 100 %)."""
    attainable_compute_pct: float = 80.0
    """The share of the datasheet dense tensor-core FLOP/s an ideal assumes (the H200 here: 769-798 of 989 bf16 TFLOP/s
    on an 8192^3 product, 78-81 %)."""
    lever_warning_pct: float = 15.0
    """A lever (recoverable time of one ledger part) of at least this % of its phase's step → a warning; a phase with
    one gets no "healthy" verdict."""
    graph_launch_late_share: float = 0.5
    """Of a step's GPU idle, this share or more before device-graph kernels → the host launched the step's graph late
    (graph-launch-late); less → idle between launches (gpu-idle)."""
    lever_min_steps: int = 3
    """A phase with fewer steps (a generation's one prefill) gets at most info-level levers: one step is a one-off."""
    kernel_floor_us: float = 2.0
    """The shortest time a kernel that does real work takes (launch to end): a part's ideal is never below its kernels
    per step times this (the H200 here: 5th percentile of the m24 decode's kernels 2.0 µs, norms 2.8-3.3 µs)."""
    lever_info_pct: float = 5.0
    """A lever of at least this % of the step (and under ``lever_warning_pct``) → an info finding; smaller ones stay in
    the ledger table only."""
    light_load_pct: float = 50.0
    """Requests in flight (serve / attach), or steps running (run), under this % of the window → lightly loaded: no
    host-bound / idle-GPU verdict, which needs load."""
    plan_suspicious_share_pct: float = 25.0
    """A non-matmul kernel above this share of decode kernel time is worth one Nsight Compute deep dive."""
    ncu_latency_bound_pct: float = 40.0
    """Nsight Compute: both compute and memory throughput below this % of peak → latency-bound."""
    ncu_balanced_gap_pct: float = 10.0
    """Nsight Compute: compute and memory throughput within this many points of each other ..."""
    ncu_balanced_min_pct: float = 60.0
    """... and both at least this % of peak → balanced (neither bound dominates)."""
    ncu_compute_far_pct: float = 60.0
    """Nsight Compute: compute-bound below this % of peak compute throughput → far from peak."""
    ncu_low_occupancy_ratio: float = 0.5
    """Nsight Compute: achieved occupancy under this share of the theoretical → low occupancy."""
    ncu_occupancy_limited_pct: float = 50.0
    """Nsight Compute: theoretical occupancy below this % with a named limiter → occupancy-limited."""
    ncu_near_peak_dram_pct: float = 70.0
    """Nsight Compute: memory-bound at or above this % of peak DRAM bandwidth → near the roofline."""
    ncu_on_chip_busy_pct: float = 80.0
    """Nsight Compute: L1/TEX throughput at or above this ..."""
    ncu_on_chip_dram_idle_pct: float = 10.0
    """... with DRAM below this → bound on chip (re-reads, no tiling), not by device memory."""
