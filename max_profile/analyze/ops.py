"""MAX's ops joined to the GPU kernels they launched (``--kernels ops``).

With ``MODULAR_ENABLE_PROFILING=on`` MAX opens an NVTX range around each op it runs (``matmulmo.matmul``,
``flash_attention``, ``rms_norm_fused_residual``...); on a GPU that range is the host launching the op's kernels. CUPTI
records each kernel with the driver call that launched it (time and thread). A kernel belongs to the innermost op range
that holds its launch call on the launching thread.

The two recorders name threads differently (the NVTX log: Linux thread ids; CUPTI: ``pthread_self``), so each CUPTI
thread is matched to the op thread that holds most of its launches; the match rate is said. Equivalent tool:
``nsys stats --report nvtx_kern_sum`` on an nsys capture of the same run.
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from max_profile.analyze.breakdown import PHASES, interval_index, step_index_of, valid_kernels
from max_profile.analyze.families import base_name
from max_profile.model import KernelTable, OpBreakdown, OpCoverage, OpRow, RawCapture, Step, Unavailable
from max_profile.model.serialization import Phase

ATTENTION_PARTS = re.compile(r"batched_matmul|\bbmm\b|softmax|kv_cache_gather_rows", re.IGNORECASE)
"""Op names of attention written out of generic ops: the batched matmuls (Q K^T, P V), the softmax, the KV rows gathered
back out of the paged cache (seen on the H200: ``batched_matmul``, ``Prologue(... reduce.softmax ...)``,
``elementwise(kv_cache_gather_rows_ragged)``)."""
OPS_MODE_DECODE_STEP_MS = (4.749, 1.845)
"""The decode host step (p50, ms) of one model in ``--kernels ops`` and in MAX's default run (device graphs on), on an
H200 (tests/data/gpu/h200_llama_custom_ops_vs_default: 8-layer bf16 Llama, hidden 2048, batch 1): 2.57x, with the same
kernel time per step (0.42 / 0.43 ms) and 86 op calls per step. No per-op rate is drawn from it: the unfused-attention
architecture makes 203 op calls per decode step in a 5.1 ms step, which 86 calls in 2.9 ms extra would overshoot."""
UNATTRIBUTED = "(no op range)"
"""The row of kernels launched outside every op range."""
TOP_KERNELS = 3


def op_of_kernels(kernels: KernelTable, ops: KernelTable) -> tuple[np.ndarray, str]:
    """Per kernel: the index (into ``ops``) of the op range its launch call lies in, -1 for none; and how the join went.

    Each CUPTI launch thread is matched to the op thread holding most of its launches (none: no match)."""
    out = np.full(len(kernels), -1, dtype=np.int64)
    if kernels.launch_ns is None or kernels.launch_tid is None or ops.launch_tid is None or not len(ops):
        return out, "no launch records or no op ranges: nothing joined"
    launch, ktid = kernels.launch_ns, kernels.launch_tid
    by_thread: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for tid in np.unique(ops.launch_tid):
        rows = np.flatnonzero(ops.launch_tid == tid)
        order = rows[np.argsort(ops.start_ns[rows], kind="stable")]
        by_thread[int(tid)] = (ops.start_ns[order], ops.end_ns[order], order)
    matched, launching = 0, 0
    pairs = []
    for tid in np.unique(ktid[launch >= 0]):
        rows = np.flatnonzero((ktid == tid) & (launch >= 0))
        launching += 1
        best, best_hits, best_idx = None, 0, None
        for op_tid, (st, en, order) in by_thread.items():
            idx = interval_index(st, en, launch[rows])  # innermost ranges: none overlap
            hits = int((idx >= 0).sum())
            if hits > best_hits:
                best, best_hits, best_idx = op_tid, hits, np.where(idx >= 0, order[np.maximum(idx, 0)], -1)
        if best is not None and best_idx is not None:
            out[rows] = best_idx
            matched += 1
            pairs.append(f"{int(tid)}->{best}")
    how = (
        f"each kernel's launch call inside the innermost op range on its thread; {matched} of {launching} launching "
        f"thread(s) matched to op threads by their launches ({', '.join(pairs[:4])})"
    )
    return out, how


def _phase_of(steps: list[Step], t: np.ndarray) -> np.ndarray:
    """Per time: the index into PHASES of the phase of the step holding it (``unknown`` for none)."""
    ordered = sorted(steps, key=lambda s: s.start_ns)
    starts = np.array([s.start_ns for s in ordered], dtype=np.int64)
    ends = np.array([s.end_ns for s in ordered], dtype=np.int64)
    step = step_index_of(starts, ends, t)
    codes = np.array([PHASES.index(s.phase) for s in ordered] + [PHASES.index("unknown")], dtype=np.int64)
    return codes[np.where(step >= 0, step, len(ordered))]


def op_breakdown(raw: RawCapture) -> OpBreakdown | Unavailable | None:
    """The per-op table of a capture that recorded op ranges beside its kernels; None when it did not."""
    ops, kernels = raw.op_ranges, raw.kernels
    if not len(ops):
        return None
    if not len(kernels) or kernels.launch_ns is None:
        return Unavailable("op ranges were recorded but no kernels with their launch calls: nothing to join them to")
    keep = valid_kernels(kernels)
    kernels = kernels.select(keep) if not keep.all() else kernels
    op_idx, how = op_of_kernels(kernels, ops)
    when = kernels.attribution_time()
    k_phase = _phase_of(raw.steps, when)
    o_phase = _phase_of(raw.steps, ops.start_ns)
    dur = (kernels.end_ns - kernels.start_ns).astype(np.float64)
    op_names = np.array(ops.names, dtype=object)[ops.name_idx]
    k_names = np.array(kernels.names, dtype=object)[kernels.name_idx]
    rows: list[OpRow] = []
    coverage: list[OpCoverage] = []
    launched_by_range = np.bincount(op_idx[op_idx >= 0], minlength=len(ops))
    for code, phase in enumerate(PHASES):
        in_k = k_phase == code
        in_o = o_phase == code
        if not in_k.any() and not in_o.any():
            continue
        total = float(dur[in_k].sum())
        attributed = float(dur[in_k & (op_idx >= 0)].sum())
        coverage.append(
            OpCoverage(
                phase=phase,
                steps=sum(1 for s in raw.steps if s.phase == phase),
                kernels=int(in_k.sum()),
                kernel_ms=total / 1e6,
                attributed_ms=attributed / 1e6,
                attributed_pct=100.0 * attributed / total if total else 0.0,
                calls=int(in_o.sum()),
                calls_without_kernels=int((in_o & (launched_by_range == 0)).sum()),
            )
        )
        gpu: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        by_kernel: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for i in np.flatnonzero(in_k):
            name = str(op_names[op_idx[i]]) if op_idx[i] >= 0 else UNATTRIBUTED
            gpu[name] += float(dur[i])
            count[name] += 1
            by_kernel[name][base_name(str(k_names[i]))] += float(dur[i])
        calls: dict[str, int] = defaultdict(int)
        host: dict[str, float] = defaultdict(float)
        for j in np.flatnonzero(in_o):
            calls[str(op_names[j])] += 1
            host[str(op_names[j])] += float(ops.end_ns[j] - ops.start_ns[j])
        for name in sorted(set(gpu) | set(calls), key=lambda n: (-gpu.get(n, 0.0), n)):
            top = sorted(by_kernel[name].items(), key=lambda kv: -kv[1])[:TOP_KERNELS]
            rows.append(
                OpRow(
                    op=name,
                    phase=phase,
                    calls=calls.get(name, 0),
                    kernels=count.get(name, 0),
                    gpu_ms=gpu.get(name, 0.0) / 1e6,
                    share_pct=100.0 * gpu.get(name, 0.0) / total if total else 0.0,
                    host_ms=host.get(name, 0.0) / 1e6,
                    top_kernels=[k for k, _ in top],
                )
            )
    launched_names = {str(op_names[j]) for j in np.flatnonzero(launched_by_range > 0)}
    silent = sorted({str(n) for n in op_names} - launched_names)
    if raw.graph_launches:
        how += (
            f"; {raw.graph_launches} device-graph launches: the kernels of a graph replay carry no op range (record "
            "ops with device graphs off)"
        )
    return OpBreakdown(
        source=f"{raw.kernel_source or 'kernels'} + MAX op ranges (NVTX log)",
        join=how,
        coverage=coverage,
        rows=rows,
        ops_without_kernels=silent,
    )


def op_label(name: str) -> str:
    """A short name for an op: the attention part inside a fused composition (``reduce.softmax``), the op inside
    ``elementwise(...)``, else the name cut at 60 characters."""
    part = ATTENTION_PARTS.search(name)
    if part and name.startswith(("Prologue(", "Epilogue(", "elementwise(")):
        token = re.search(r"[\w.]*" + re.escape(part.group(0)) + r"[\w.]*", name)
        return token.group(0) if token else part.group(0)
    inner = re.fullmatch(r"elementwise\(([\w.]+)\)", name)
    return inner.group(1) if inner else name[:60]


def attention_stand_ins(ops: OpBreakdown) -> tuple[Phase, list[OpRow]]:
    """The ops that do attention's work outside a fused attention kernel, in decode (else the phase with the most
    kernel time), most GPU time first."""
    phases = {c.phase: c for c in ops.coverage}
    phase: Phase = "decode" if "decode" in phases else max(phases.values(), key=lambda c: c.kernel_ms).phase
    rows = [r for r in ops.rows if r.phase == phase and r.kernels and ATTENTION_PARTS.search(r.op)]
    return phase, sorted(rows, key=lambda r: -r.gpu_ms)


def ops_calls_per_step(ops: OpBreakdown | Unavailable | None, phase: str) -> float | None:
    """MAX op calls (ranges) per step of ``phase`` in a capture with op ranges joined to GPU kernels; None without
    them or without steps in that phase."""
    if not isinstance(ops, OpBreakdown):
        return None
    c = next((c for c in ops.coverage if c.phase == phase), None)
    if c is None or c.steps <= 0:
        return None
    return c.calls / c.steps
