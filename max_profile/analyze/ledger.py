"""The step ledger: one account of where a capture's time went, that every verdict about time reads.

For each phase (prefill, decode, mixed) the step's time is split into parts that add up:

* the phase's **kernels**, by family (the matmul families together: they read the same weights), as time on the GPU —
  each kernel belongs to the step that launched it (the breakdown's launch-time attribution), overlapping kernels
  counted once;
* the **GPU idle inside its steps**: gaps on the GPU timeline while the host was inside one of the phase's steps,
  split into those that end at a device-graph kernel (the host launched the step's graph late) and the rest (between
  eager launches, host syncs, Python);
* apart from the phases, the time **outside every step** (no step running: the generation loop, a server without
  requests), with the kernels launched there.

Each kernel part is priced by the bytes-and-FLOPs model (:mod:`~max_profile.analyze.roofline`): its ideal is the time
it needs at the attainable share of the GPU's peaks (``Thresholds.attainable_*``), its recoverable time the rest.
Idle and outside time are recoverable whole. Equivalent by hand: the CUDA GPU trace row of ``nsys`` over the phase's
NVTX ranges, summed by kernel name and gap, against ``bytes / peak`` from ``ncu --metrics dram__bytes.sum``.

Pure functions over numpy columns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from max_profile.analyze.breakdown import (
    PHASES,
    coverage_before,
    in_start_order,
    kept_columns,
    observed_shares,
    recorded_in_window,
    step_index_of,
    steps_launching,
    union_ns,
    valid_kernels,
)
from max_profile.analyze.families import FAMILIES, classify_kernel
from max_profile.analyze.load import ended_inside, in_flight
from max_profile.analyze.roofline import MATMUL_FAMILIES, peak_bandwidth, peak_flops, step_cost, weight_operand
from max_profile.analyze.steps import PhaseShape, phase_shape
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import (
    KernelTable,
    LedgerRow,
    LoadWindow,
    ModelWeights,
    Phase,
    PhaseLedger,
    ServerMetrics,
    Step,
    StepLedger,
)
from max_profile.model.tags import LedgerSource

IDLE_BEFORE_GRAPH = "GPU idle: waiting for a device-graph launch"
IDLE_BETWEEN_LAUNCHES = "GPU idle: between launches"
HOST_BETWEEN_OPS = "host time between MAX's ops"
MATMUL_PART = "matmul"
ATTENTION_PART = "attention"


@dataclass(frozen=True)
class _Timed:
    """Per phase: busy time by part, idle time by kind, steps counted."""

    busy_ns: dict[str, float]
    kernels: dict[str, int]
    families: dict[str, list[str]]
    idle_before_graph_ns: float
    idle_other_ns: float
    steps: float
    """Steps observed (a sampled recording: the share of each step inside the recorded slices, summed)."""


def part_of_family(family: str) -> str:
    """The ledger part a kernel family falls in: the matmul families share one (they read the same weights)."""
    return MATMUL_PART if family in MATMUL_FAMILIES else family


def _clip_to_spans(
    start: np.ndarray, end: np.ndarray, spans: Sequence[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each interval clipped to the observed span it starts in (a sampled recording's slice, or the window); the mask of
    those that keep a length. A kept interval starts inside its span, so only its end is clipped: the starts are the
    column itself, and so are the ends where none runs past its span (one window: the usual case)."""
    a = np.array([x for x, _ in spans], dtype=np.int64)
    b = np.array([y for _, y in spans], dtype=np.int64)
    k = np.searchsorted(a, start, side="right") - 1
    inside = k >= 0
    np.maximum(k, 0, out=k)
    span_end = b[k]
    del k
    e = end if bool((end <= span_end).all()) else np.minimum(end, span_end)
    return start, e, np.greater(e, start, out=inside, where=inside)


def _busiest_device(table: KernelTable) -> int:
    dur = (table.end_ns - table.start_ns).astype(np.float64)
    devices, inverse = np.unique(table.device, return_inverse=True)
    return int(devices[int(np.argmax(np.bincount(inverse, weights=dur)))])


def _idle_gaps(
    s: np.ndarray, e: np.ndarray, keep: np.ndarray, graph_id: np.ndarray | None, spans: Sequence[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The GPU's idle time: the gaps of the merged busy timeline inside each observed span, as (start, end, whether
    the kernel after the gap ran in a device graph)."""
    ks, ke = kept_columns(keep, s, e)
    graph = kept_columns(keep, graph_id)[0] > 0 if graph_id is not None else np.zeros(ks.size, dtype=bool)
    ks, ke, graph = in_start_order(ks, ke, graph)
    gap_start: list[np.ndarray] = []
    gap_end: list[np.ndarray] = []
    gap_graph: list[np.ndarray] = []
    bounds = np.searchsorted(ks, np.array([x for span in spans for x in span], dtype=np.int64), side="left")
    for (a, b), lo, hi in zip(spans, bounds[0::2], bounds[1::2], strict=True):
        cs, ce, cg = ks[lo:hi], ke[lo:hi], graph[lo:hi]  # the kernels starting in [a, b): ks is sorted
        if not cs.size:
            gap_start.append(np.array([a]))
            gap_end.append(np.array([b]))
            gap_graph.append(np.array([False]))
            continue
        # a gap before each kernel that starts after everything before it ended, and one after the last: the end of
        # the busy run before kernel i is the running maximum of the ends before it
        prev_end = np.empty(cs.size, dtype=np.int64)
        prev_end[0] = a
        np.maximum.accumulate(ce[:-1], out=prev_end[1:])
        last_end = max(int(prev_end[-1]), int(ce[-1]))
        g = cs > prev_end
        n = int(np.count_nonzero(g))
        starts, ends, graphs = np.empty(n + 1, dtype=np.int64), np.empty(n + 1, dtype=np.int64), np.empty(n + 1, bool)
        np.compress(g, prev_end, out=starts[:n])
        del prev_end
        np.compress(g, cs, out=ends[:n])
        np.compress(g, cg, out=graphs[:n])
        starts[n], ends[n], graphs[n] = min(last_end, b), b, False
        gap_start.append(starts)
        gap_end.append(ends)
        gap_graph.append(graphs)
    if len(gap_start) == 1:
        g0, g1, gg = gap_start[0], gap_end[0], gap_graph[0]
    else:
        g0, g1, gg = np.concatenate(gap_start), np.concatenate(gap_end), np.concatenate(gap_graph)
    ok = g1 > g0
    if not ok.all():
        g0, g1, gg = g0[ok], g1[ok], gg[ok]
    return g0, g1, gg


def _ledger_window(
    window: tuple[int, int] | None,
    table: KernelTable,
    t_attr: np.ndarray,
    step_start: np.ndarray,
    step_end: np.ndarray,
    attributed: np.ndarray,
) -> tuple[int, int]:
    """The window the ledger accounts: the capture's, reaching to the end of its steps' work (the overlap pipeline
    returns before its last steps' kernels end; a sampled recording's last step's kernels ran past the host's window),
    else the kernels' and steps' span."""
    if window is None:
        return (int(min(t_attr.min(), step_start.min())), int(max(table.end_ns.max(), step_end.max())))
    if not attributed.any():
        return window
    return (min(window[0], int(table.start_ns[attributed].min())), max(window[1], int(table.end_ns[attributed].max())))


_GAP_BLOCK = 1 << 18
"""Gaps accounted per block in :func:`_idle_by_phase`: the block's temporaries, not the whole trace's, are held."""


def _idle_by_phase(
    gaps: tuple[np.ndarray, np.ndarray, np.ndarray], covers: dict[Phase, Callable[[np.ndarray], np.ndarray]]
) -> tuple[dict[Phase, float], dict[Phase, float], float]:
    """The GPU idle time inside each phase's steps (ns): before a device-graph kernel and other, and the idle time
    outside every step. ``covers``: per phase, the length of its steps lying before a time
    (:func:`~max_profile.analyze.breakdown.coverage_before`).

    The gaps go a block at a time (a million kernels can leave a million gaps): every length here is a whole number of
    nanoseconds, so the sums are the same in any order."""
    g0, g1, gg = gaps
    before_graph = dict.fromkeys(covers, 0.0)
    other = dict.fromkeys(covers, 0.0)
    outside_idle = 0.0
    for lo in range(0, g0.size, _GAP_BLOCK):
        a, b, graph = g0[lo : lo + _GAP_BLOCK], g1[lo : lo + _GAP_BLOCK], gg[lo : lo + _GAP_BLOCK]
        inside_any = np.zeros(a.shape, dtype=np.float64)
        for phase, cover in covers.items():
            inside = cover(b)
            inside -= cover(a)
            inside_any += inside
            before_graph[phase] += float(inside[graph].sum())
            other[phase] += float(inside[~graph].sum())
        outside_idle += float(np.maximum((b - a) - inside_any, 0.0).sum())
    return before_graph, other, outside_idle


def time_ledger(
    table: KernelTable,
    steps: Sequence[Step],
    *,
    window: tuple[int, int] | None,
    recorded: Sequence[tuple[int, int]] = (),
    host_ops: bool = False,
) -> tuple[dict[Phase, _Timed], float, float, float, int, list[str]] | None:
    """The time parts of each phase, from the kernel timeline (see the module docstring).

    Returns (per phase, outside-steps idle ns, outside-steps kernel ns, observed ns, device, notes); None without
    kernels or steps. ``host_ops``: the "kernels" are MAX's op ranges on the host (a CPU): idle is host time between
    ops.
    """
    notes: list[str] = []
    table = table.select(valid_kernels(table))
    work = sorted((s for s in steps if s.batch_size > 0), key=lambda s: s.start_ns)
    if not len(table) or not work:
        return None
    if recorded:
        across = table.across_pauses(recorded, window[1] if window else None)
        if across.any():
            table = table.select(~across)
    step_start = np.array([s.start_ns for s in work], dtype=np.int64)
    step_end = np.array([s.end_ns for s in work], dtype=np.int64)
    t_attr = table.attribution_time()
    step_of = step_index_of(step_start, step_end, t_attr)
    attributed = step_of >= 0
    window = _ledger_window(window, table, t_attr, step_start, step_end, attributed)
    del t_attr, attributed  # a million kernels: 9 MB not held through the rest
    spans = recorded_in_window(window, recorded) if recorded else [window]
    if not spans:
        return None
    observed = float(sum(b - a for a, b in spans))
    devices = np.unique(table.device)
    device = _busiest_device(table)
    if devices.size > 1:
        notes.append(f"the timeline of device {device} is accounted (the busiest of {devices.size})")
        on_device = table.device == device
        table, step_of = table.select(on_device), step_of[on_device]
    phase_codes = np.array([PHASES.index(s.phase) for s in work], dtype=np.int32)
    kernel_phase = np.where(step_of >= 0, phase_codes[np.maximum(step_of, 0)], -1)
    names_family = np.array([FAMILIES.index(classify_kernel(n)) for n in table.names] or [0], dtype=np.int32)
    fam = names_family[table.name_idx]
    s, e, keep = _clip_to_spans(table.start_ns, table.end_ns, spans)

    out: dict[Phase, _Timed] = {}
    # a step counts by the share of it that was observed (all of it, unless the recording was sampled)
    launched = steps_launching(step_of, len(work)) if recorded else None
    del step_of  # kernel_phase says the rest
    observed_share = observed_shares(step_start, step_end, spans, launched)
    for code, phase in enumerate(PHASES):
        n_steps = float(observed_share[phase_codes == code].sum())
        if n_steps <= 0:
            continue
        m = keep & (kernel_phase == code)
        ps, pe = s[m], e[m]
        busy = float(union_ns(ps, pe))
        dur = np.subtract(pe, ps, out=pe).astype(np.float64)  # pe is this loop's own copy
        del ps, pe
        summed = float(dur.sum())
        scale = busy / summed if summed > 0 else 0.0  # overlapping kernels (streams) counted once
        busy_by: dict[str, float] = {}
        kernels_by: dict[str, int] = {}
        families_by: dict[str, list[str]] = {}
        fam_m = fam[m]
        fam_sums = np.bincount(fam_m, weights=dur, minlength=len(FAMILIES))
        fam_counts = np.bincount(fam_m, minlength=len(FAMILIES))
        del fam_m, dur
        for i in np.nonzero(fam_counts)[0]:
            family = FAMILIES[int(i)]
            part = part_of_family(family)
            busy_by[part] = busy_by.get(part, 0.0) + float(fam_sums[i]) * scale
            kernels_by[part] = kernels_by.get(part, 0) + int(fam_counts[i])
            families_by.setdefault(part, []).append(family)
        out[phase] = _Timed(busy_by, kernels_by, families_by, 0.0, 0.0, n_steps)
    m = keep & (kernel_phase < 0)
    outside_kernels = float(union_ns(s[m], e[m]))
    del fam, kernel_phase, m  # the per-kernel columns the gaps below do not need: not held through them

    covers = {
        phase: coverage_before(*kept_columns(phase_codes == code, step_start, step_end))
        for code, phase in enumerate(PHASES)
        if phase in out
    }
    before_graph, other, outside_idle = _idle_by_phase(_idle_gaps(s, e, keep, table.graph_id, spans), covers)
    for phase, t in list(out.items()):
        out[phase] = _Timed(t.busy_ns, t.kernels, t.families, before_graph[phase], other[phase], t.steps)
    if host_ops:
        out = {
            p: _Timed(t.busy_ns, t.kernels, t.families, 0.0, t.idle_before_graph_ns + t.idle_other_ns, t.steps)
            for p, t in out.items()
        }
    return out, outside_idle, outside_kernels, observed, device, notes


@dataclass(frozen=True)
class Roofs:
    """The attainable bandwidth (bytes/s) and compute (FLOP/s) an ideal is priced at, and how they were chosen."""

    bandwidth: float
    compute: float | None
    basis: str


def roofs_for(gpu: str | None, operand: str, th: Thresholds) -> Roofs | None:
    """The GPU's datasheet peaks times the attainable shares (None: the GPU's peaks are not known)."""
    bw, fl = peak_bandwidth(gpu), peak_flops(gpu, operand)
    if bw is None:
        return None
    bw_a = bw * th.attainable_bandwidth_pct / 100
    fl_a = fl * th.attainable_compute_pct / 100 if fl else None
    basis = f"{th.attainable_bandwidth_pct:g} % of {bw / 1e12:.2f} TB/s" + (
        f", {th.attainable_compute_pct:g} % of {fl / 1e12:.0f} {operand} TFLOP/s" if fl else ""
    )
    return Roofs(bw_a, fl_a, basis)


def ideal_ms(bytes_: float, flops: float, roofs: Roofs) -> float:
    """Milliseconds to move ``bytes_`` and compute ``flops`` at the attainable roofs (the slower of the two)."""
    t = bytes_ / roofs.bandwidth
    if roofs.compute:
        t = max(t, flops / roofs.compute)
    return 1e3 * t


def _rows(
    t: _Timed, step_ms: float, cost: dict[str, float] | None, roofs: Roofs | None, host_ops: bool, floor_us: float
) -> list[LedgerRow]:
    rows: list[LedgerRow] = []
    n = t.steps
    for part, ns in sorted(t.busy_ns.items(), key=lambda kv: -kv[1]):
        ms = ns / 1e6 / n
        ideal = basis = None
        if cost is not None and part == ATTENTION_PART and cost["kv_bytes"] is None:
            basis = "not priced: the steps carry no context lengths (the KV cache's bytes are unknown)"
        elif cost is not None and roofs is not None and part in (MATMUL_PART, ATTENTION_PART):
            b, f = (
                (cost["weight_bytes"], cost["matmul_flops"])
                if part == MATMUL_PART
                else (cost["kv_bytes"], cost["attention_flops"])
            )
            per_step = t.kernels.get(part, 0) / n
            roof, floor = ideal_ms(b, f, roofs), per_step * floor_us / 1e3
            ideal = max(roof, floor)
            basis = (
                f"{b / 1e9:.3g} GB, {f / 1e12:.3g} TFLOP at {roofs.basis}"
                if roof >= floor
                else f"{per_step:.0f} kernels at {floor_us:g} µs each (the roofline's {roof * 1e3:.1f} µs is below "
                "that floor)"
            )
        elif cost is None and part in (MATMUL_PART, ATTENTION_PART):
            basis = "not priced: no model config or weights"
        elif roofs is None and part in (MATMUL_PART, ATTENTION_PART):
            basis = "not priced: the device's peaks are not known"
        label = ("matmul: " + " + ".join(t.families.get(part, []))) if part == MATMUL_PART else part
        rows.append(
            LedgerRow(
                part=label,
                kind="kernels",
                ms_per_step=round(ms, 6),
                share_pct=round(100 * ms / step_ms, 2) if step_ms else 0.0,
                families=list(t.families.get(part, [])),
                kernels_per_step=round(t.kernels.get(part, 0) / n, 2),
                ideal_ms_per_step=round(ideal, 6) if ideal is not None else None,
                recoverable_ms_per_step=round(max(ms - ideal, 0.0), 6) if ideal is not None else None,
                basis=basis,
            )
        )
    idle = (
        (IDLE_BEFORE_GRAPH, t.idle_before_graph_ns),
        (HOST_BETWEEN_OPS if host_ops else IDLE_BETWEEN_LAUNCHES, t.idle_other_ns),
    )
    for label, ns in idle:
        if ns <= 0:
            continue
        ms = ns / 1e6 / n
        rows.append(
            LedgerRow(
                part=label,
                kind="idle",
                ms_per_step=round(ms, 6),
                share_pct=round(100 * ms / step_ms, 2) if step_ms else 0.0,
                ideal_ms_per_step=0.0,
                recoverable_ms_per_step=round(ms, 6),
            )
        )
    return rows


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


def phase_step_cost(
    steps: Sequence[Step], phase: Phase, cfg: dict[str, Any], weights: ModelWeights | None
) -> tuple[list[Step], PhaseShape, dict[str, Any] | None]:
    """A phase's working steps, their shape (:func:`~max_profile.analyze.steps.phase_shape`: the one batch, tokens and
    context figure) and the bytes-and-FLOPs model of that step (:func:`~max_profile.analyze.roofline.step_cost`; None
    without a model description). Where the steps carry no context lengths the KV cache's bytes are unknown:
    ``kv_bytes`` is None, never zero."""
    sel = [s for s in steps if s.phase == phase and s.batch_size > 0]
    shape = phase_shape(sel, phase)
    cost = None
    if (cfg or weights) and shape.batch_figure:
        cost = step_cost(
            cfg,
            weights,
            batch=shape.batch_figure,
            context_tokens=shape.context_tokens or 0.0,
            new_tokens=shape.tokens if phase != "decode" else None,
        )
        if cost is not None and shape.context_tokens is None:
            cost = {**cost, "kv_bytes": None}
    return sel, shape, cost


def build_ledger(
    table: KernelTable,
    steps: Sequence[Step],
    *,
    window: tuple[int, int] | None,
    recorded: Sequence[tuple[int, int]] = (),
    model_config: dict[str, object] | None,
    weights: ModelWeights | None,
    gpu: str | None,
    th: Thresholds,
    host_ops: bool = False,
    source: LedgerSource = LedgerSource.KERNEL_TIMELINE,
) -> StepLedger | None:
    """The step ledger of a capture with kernels and steps on one clock (see the module docstring); None without
    both."""
    timed = time_ledger(table, steps, window=window, recorded=recorded, host_ops=host_ops)
    if timed is None:
        return None
    per_phase, outside_idle, outside_kernels, observed, device, notes = timed
    cfg = dict(model_config or {})
    roofs = roofs_for(gpu, weight_operand(cfg, weights), th) if (cfg or weights) and not host_ops else None
    phases: list[PhaseLedger] = []
    for phase in PHASES:
        t = per_phase.get(phase)
        if t is None:
            continue
        sel, shape, cost = phase_step_cost(steps, phase, cfg, weights)
        total_ns = sum(t.busy_ns.values()) + t.idle_before_graph_ns + t.idle_other_ns
        step_ms = total_ns / 1e6 / t.steps
        rows = _rows(t, step_ms, cost, roofs, host_ops, th.kernel_floor_us)
        priced = [r for r in rows if r.ideal_ms_per_step is not None and r.kind == "kernels"]
        ideal = sum(r.ideal_ms_per_step or 0.0 for r in priced) + sum(
            r.ms_per_step for r in rows if r.kind == "kernels" and r.ideal_ms_per_step is None
        )
        recoverable = sum(r.recoverable_ms_per_step or 0.0 for r in rows)
        busy_ms = sum(r.ms_per_step for r in rows if r.kind == "kernels")
        phases.append(
            PhaseLedger(
                phase=phase,
                steps=max(int(round(t.steps)), 1),
                step_ms=round(step_ms, 6),
                host_step_p50_ms=_median([s.duration_ns / 1e6 for s in sel]),
                batch=shape.batch_figure,
                tokens_per_step=shape.tokens,
                rows=rows,
                busy_pct=round(100 * busy_ms / step_ms, 2) if step_ms else 0.0,
                ideal_ms_per_step=round(ideal, 6) if priced else None,
                recoverable_ms_per_step=round(recoverable, 6),
                steps_in_capture=len(sel),
                kernels_per_step=round(sum(t.kernels.values()) / t.steps, 4),
            )
        )
    outside = outside_idle + outside_kernels
    return StepLedger(
        source=source if not host_ops else LedgerSource.OP_RANGES,
        window_ms=round(observed / 1e6, 6),
        phases=phases,
        outside_steps_ms=round(outside / 1e6, 6),
        outside_steps_pct=round(100 * outside / observed, 2) if observed else 0.0,
        outside_kernels_ms=round(outside_kernels / 1e6, 6),
        device=device,
        attainable_bandwidth_pct=th.attainable_bandwidth_pct if roofs else None,
        attainable_compute_pct=th.attainable_compute_pct if roofs and roofs.compute else None,
        notes=notes,
    )


def with_load(ledger: StepLedger, windows: Sequence[LoadWindow]) -> StepLedger:
    """The ledger with the load of the serve / attach windows it covers (requests in flight, request rate): of the
    windows with requests of ours (an attach window without them says nothing of the server's own traffic)."""
    measured = [w for w in windows if not w.reference and w.requests]
    if not measured:
        return ledger
    shares = [in_flight(w.requests, w.window_ns) for w in measured]
    weights = [w.window_ns[1] - w.window_ns[0] for w in measured]
    total = sum(weights) or 1
    return msgspec.structs.replace(
        ledger,
        requests_in_flight_pct=round(sum(s[0] * w for s, w in zip(shares, weights, strict=True)) / total, 2),
        request_rate_rps=round(sum(s[1] * w for s, w in zip(shares, weights, strict=True)) / total, 4),
    )


def server_ledger(server: ServerMetrics, window: LoadWindow) -> StepLedger | None:
    """A ledger from the server's own metrics when no kernel timeline exists (``attach``): each batch type's mean
    execution time as its step, the rest of the window outside steps. Batch execution holds kernels and host work
    alike."""
    if server.unavailable or not server.batches:
        return None
    batch = int(round(server.batch_size_mean)) if server.batch_size_mean else None
    passes = [
        (phase, server.batches.get(batch_type) or 0.0, server.batch_execution_ms_mean.get(batch_type), size)
        for batch_type, phase, size in (("CE", "prefill", None), ("TG", "decode", batch))
    ]
    return _pass_ledger(
        passes,
        [window.window_ns],
        LedgerSource.SERVER_METRICS,
        "batch execution (kernels and host work, server metrics)",
        "not priced: the server's metrics give batch times, not kernels",
        [window],
    )


def spans_ledger(
    steps: Sequence[Step], spans: Sequence[tuple[int, int]], windows: list[LoadWindow]
) -> StepLedger | None:
    """A ledger from MAX's own ``max.batch`` spans of one server (no kernel timeline): each phase's passes that ended
    inside the measured ``spans`` (a sweep's levels, not the pauses between them) at their mean wall time, the rest of
    those spans outside them. A pass holds its kernels and host work alike."""
    inside = [s for s in steps if ended_inside(s.end_ns, spans)]
    passes = []
    for phase in ("prefill", "decode"):
        mine = [s for s in inside if s.phase == phase or (phase == "prefill" and s.phase == "mixed")]
        mean = sum(s.duration_ns for s in mine) / len(mine) / 1e6 if mine else None
        passes.append((phase, float(len(mine)), mean, phase_shape(mine, "decode").batch_figure))
    return _pass_ledger(
        passes,
        spans,
        LedgerSource.SPANS,
        "forward pass (kernels and host work, MAX's max.batch spans)",
        "not priced: the spans time each pass, not its kernels",
        windows,
    )


def _pass_ledger(
    passes: Sequence[tuple[str, float, float | None, int | None]],
    spans: Sequence[tuple[int, int]],
    source: LedgerSource,
    part: str,
    basis: str,
    windows: list[LoadWindow],
) -> StepLedger | None:
    """(phase, passes, mean ms, batch) per phase as a ledger of passes with no kernels, the rest of the measured
    ``spans`` outside."""
    observed_ms = max(sum(b - a for a, b in spans) / 1e6, 1e-9)
    phases: list[PhaseLedger] = []
    inside_ms = 0.0
    for phase, count, mean, batch in passes:
        if not count or mean is None:
            continue
        inside_ms += count * mean
        row = LedgerRow(part=part, kind="kernels", ms_per_step=round(mean, 6), share_pct=100.0, basis=basis)
        phases.append(
            PhaseLedger(
                phase=phase,  # type: ignore[arg-type]
                steps=int(round(count)),
                step_ms=round(mean, 6),
                host_step_p50_ms=None,  # type: ignore[arg-type]
                batch=batch,
                tokens_per_step=None,
                rows=[row],
                busy_pct=100.0,
            )
        )
    if not phases:
        return None
    outside = max(observed_ms - inside_ms, 0.0)
    return with_load(
        StepLedger(
            source=source,
            window_ms=round(observed_ms, 6),
            phases=phases,
            outside_steps_ms=round(outside, 6),
            outside_steps_pct=round(100 * outside / observed_ms, 2),
        ),
        windows,
    )
