"""Where the GPU time goes: kernels tied to steps and phases, aggregated by family and name.

Attribution, in order of preference:

* ``host-steps`` — our own step records (in-process CUPTI / NVTX log): a kernel belongs to the
  step whose host interval contains its *launch* (or its start, when the launch is unknown).
* ``launch-thread`` — phase ranges with thread ids (nsys): the launching API call must lie
  inside a range on the same thread (nsys's own rule, ``nvtx_kern_sum``).
* ``time-overlap`` — ranges without thread match (MAX may launch from worker threads): the
  launch (or start) time inside a range on any thread.

Pure functions over arrays; vectorized with numpy so a million kernels take about a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from max_profile.analyze.families import FAMILIES, base_name, classify_kernel
from max_profile.model import (
    DeviceBreakdown,
    FamilyRow,
    KernelBreakdown,
    KernelRecord,
    KernelRow,
    Phase,
    PhaseBreakdown,
    PhaseRange,
    Step,
)

PHASES: tuple[Phase, ...] = ("prefill", "mixed", "decode", "unknown")
TOP_N = 15
PER_STEP_LIMIT = 512


@dataclass
class KernelArrays:
    """Column form of a kernel list (what collectors for big traces produce directly)."""

    names: list[str]
    name_idx: np.ndarray  # int32 index into names, per kernel
    start: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns
    launch: np.ndarray  # int64 ns, -1 when unknown
    tid: np.ndarray  # int64, -1 when unknown
    device: np.ndarray  # int32
    graph: np.ndarray  # bool: kernel ran inside a device graph

    @classmethod
    def from_records(cls, kernels: Sequence[KernelRecord]) -> KernelArrays:
        index: dict[str, int] = {}
        name_idx = np.fromiter((index.setdefault(k.name, len(index)) for k in kernels), dtype=np.int32, count=len(kernels))
        return cls(
            names=list(index),
            name_idx=name_idx,
            start=np.fromiter((k.start_ns for k in kernels), dtype=np.int64, count=len(kernels)),
            end=np.fromiter((k.end_ns for k in kernels), dtype=np.int64, count=len(kernels)),
            launch=np.fromiter((k.launch_ns if k.launch_ns is not None else -1 for k in kernels), dtype=np.int64, count=len(kernels)),
            tid=np.fromiter((k.launch_tid if k.launch_tid is not None else -1 for k in kernels), dtype=np.int64, count=len(kernels)),
            device=np.fromiter((k.device for k in kernels), dtype=np.int32, count=len(kernels)),
            graph=np.fromiter((bool(k.graph_id) for k in kernels), dtype=bool, count=len(kernels)),
        )

    def __len__(self) -> int:
        return int(self.start.size)


def _intervals_index(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the interval containing each t (intervals sorted, non-overlapping), -1 if none."""
    if starts.size == 0:
        return np.full(t.shape, -1, dtype=np.int64)
    idx = np.searchsorted(starts, t, side="right") - 1
    ok = idx >= 0
    inside = np.zeros(t.shape, dtype=bool)
    inside[ok] = t[ok] <= ends[idx[ok]]
    return np.where(inside, idx, -1)


def _union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Total length of the union of intervals (busy time, overlapping kernels counted once)."""
    if start.size == 0:
        return 0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    run_end = np.maximum.accumulate(e)
    # a new block starts where start > max end so far of previous intervals
    new_block = np.empty(s.size, dtype=bool)
    new_block[0] = True
    new_block[1:] = s[1:] > run_end[:-1]
    block_id = np.cumsum(new_block) - 1
    block_start = s[new_block]
    block_end = np.zeros(block_start.size, dtype=np.int64)
    np.maximum.at(block_end, block_id, e)
    return int((block_end - block_start).sum())


def _family_rows(fam_idx: np.ndarray, dur: np.ndarray) -> list[FamilyRow]:
    total = float(dur.sum())
    counts = np.bincount(fam_idx, minlength=len(FAMILIES))
    sums = np.bincount(fam_idx, weights=dur, minlength=len(FAMILIES))
    rows = [
        FamilyRow(family=FAMILIES[i], kernels=int(counts[i]), total_ms=float(sums[i]) / 1e6, share_pct=100.0 * float(sums[i]) / total if total else 0.0)
        for i in range(len(FAMILIES))
        if counts[i]
    ]
    rows.sort(key=lambda r: -r.total_ms)
    return rows


def _kernel_rows(base_idx: np.ndarray, bases: list[str], base_fam: list[str], dur: np.ndarray, top: int) -> list[KernelRow]:
    total = float(dur.sum())
    counts = np.bincount(base_idx, minlength=len(bases))
    sums = np.bincount(base_idx, weights=dur, minlength=len(bases))
    order = np.argsort(-sums)[:top]
    return [
        KernelRow(
            name=bases[i],
            family=base_fam[i],
            count=int(counts[i]),
            total_ms=float(sums[i]) / 1e6,
            mean_us=float(sums[i]) / counts[i] / 1e3,
            share_pct=100.0 * float(sums[i]) / total if total else 0.0,
        )
        for i in order
        if counts[i]
    ]


def build_breakdown(
    kernels: KernelArrays | Sequence[KernelRecord],
    *,
    source: str,
    steps: Sequence[Step] = (),
    ranges: Sequence[PhaseRange] = (),
    top: int = TOP_N,
    device_graph_capture: bool | None = None,
    graph_launches: int = 0,
) -> KernelBreakdown:
    """Aggregate kernels by family and name, overall and per phase.

    ``steps`` (host step records) are preferred for attribution; else ``ranges`` (phase
    ranges from a trace: names ``prefill`` / ``decode`` / ``mixed``, or MAX's scheduler
    ranges ``_schedule(TextGenerationInputs(... batch_type=CE|TG))``).
    """
    arr = kernels if isinstance(kernels, KernelArrays) else KernelArrays.from_records(kernels)
    n = len(arr)
    dur = (arr.end - arr.start).astype(np.float64)
    # name -> base name -> family, computed once per unique name
    bases_of_names = [base_name(nm) for nm in arr.names]
    base_index: dict[str, int] = {}
    name_to_base = np.array([base_index.setdefault(b, len(base_index)) for b in bases_of_names] or [0], dtype=np.int32)
    bases = list(base_index)
    fam_of_name = np.array([FAMILIES.index(classify_kernel(nm)) for nm in arr.names] or [0], dtype=np.int32)
    base_fam = [""] * len(bases)
    for i in range(len(arr.names)):
        base_fam[name_to_base[i]] = FAMILIES[fam_of_name[i]]
    fam_idx = fam_of_name[arr.name_idx] if n else np.zeros(0, dtype=np.int32)
    base_idx = name_to_base[arr.name_idx] if n else np.zeros(0, dtype=np.int32)
    t_attr = np.where(arr.launch >= 0, arr.launch, arr.start)

    # ---- attribution to intervals (steps or ranges) -------------------------------------
    interval_phase: list[Phase] = []
    interval_tokens: list[int] = []
    attribution = "none"
    if steps:
        st = sorted((s for s in steps if s.batch_size > 0), key=lambda s: s.start_ns)
        starts = np.array([s.start_ns for s in st], dtype=np.int64)
        ends = np.array([s.end_ns for s in st], dtype=np.int64)
        interval_phase = [s.phase for s in st]
        interval_tokens = [s.input_tokens if s.phase != "decode" else s.batch_size for s in st]
        step_of = _intervals_index(starts, ends, t_attr)
        attribution = "host-steps"
    elif ranges:
        rs = sorted((r for r in ranges if phase_of_range(r.name) is not None), key=lambda r: r.start_ns)
        starts = np.array([r.start_ns for r in rs], dtype=np.int64)
        ends = np.array([r.end_ns for r in rs], dtype=np.int64)
        interval_phase = [phase_of_range(r.name) or "unknown" for r in rs]
        interval_tokens = [batch_of_range(r.name) if p == "decode" else 0 for r, p in zip(rs, interval_phase, strict=True)]
        step_of = _intervals_index(starts, ends, t_attr)
        attribution = "time-overlap"
        tids = np.array([r.tid if r.tid is not None else -1 for r in rs], dtype=np.int64)
        if rs and (arr.tid >= 0).any() and (tids >= 0).any():
            ok = step_of >= 0
            same = np.zeros(n, dtype=bool)
            same[ok] = (tids[step_of[ok]] == arr.tid[ok]) | (arr.tid[ok] < 0)
            if same[ok].mean() > 0.5 if ok.any() else False:
                step_of = np.where(same, step_of, -1)
                attribution = "launch-thread"
    else:
        starts = ends = np.zeros(0, dtype=np.int64)
        step_of = np.full(n, -1, dtype=np.int64)

    phase_codes = np.array([PHASES.index(p) for p in interval_phase] or [0], dtype=np.int32)
    kernel_phase = np.where(step_of >= 0, phase_codes[np.maximum(step_of, 0)], -1) if n else np.zeros(0, dtype=np.int32)

    phases: list[PhaseBreakdown] = []
    for code, phase in enumerate(PHASES):
        sel_steps = [i for i, p in enumerate(interval_phase) if p == phase]
        if not sel_steps:
            continue
        mask = kernel_phase == code
        wall_ns = int(sum(int(ends[i] - starts[i]) for i in sel_steps))
        busy = _union_ns(arr.start[mask], arr.end[mask])
        k_ns = float(dur[mask].sum())
        tokens = sum(interval_tokens[i] for i in sel_steps)
        phases.append(
            PhaseBreakdown(
                phase=phase,
                steps=len(sel_steps),
                kernels=int(mask.sum()),
                kernel_ms=k_ns / 1e6,
                wall_ms=wall_ns / 1e6 if wall_ns else None,
                gpu_busy_pct=min(100.0, 100.0 * busy / wall_ns) if wall_ns else None,
                kernels_per_step=float(mask.sum()) / len(sel_steps),
                kernel_ms_per_step=k_ns / 1e6 / len(sel_steps),
                kernel_us_per_token=k_ns / 1e3 / tokens if tokens else None,
                families=_family_rows(fam_idx[mask], dur[mask]),
                top_kernels=_kernel_rows(base_idx[mask], bases, base_fam, dur[mask], top),
            )
        )

    per_step: list[dict[str, float]] = []
    decode_ids = [i for i, p in enumerate(interval_phase) if p == "decode"][:PER_STEP_LIMIT]
    if decode_ids and n:
        sel = np.isin(step_of, decode_ids)
        sums = np.zeros((len(interval_phase), len(FAMILIES)))
        np.add.at(sums, (step_of[sel], fam_idx[sel]), dur[sel])
        for i in decode_ids:
            per_step.append({FAMILIES[f]: round(float(sums[i, f]) / 1e6, 6) for f in np.nonzero(sums[i])[0]})

    other_code = FAMILIES.index("other")
    other_mask = fam_idx == other_code
    unknown = []
    if other_mask.any():
        sums_other = np.bincount(base_idx[other_mask], weights=dur[other_mask], minlength=len(bases))
        unknown = [bases[i] for i in np.argsort(-sums_other)[:25] if sums_other[i] > 0]

    per_device = _per_device(arr, fam_idx, dur, kernel_phase, interval_phase, starts, ends) if n and np.unique(arr.device).size > 1 else []

    unreliable = None
    graph_share = float(arr.graph.mean()) if n else 0.0
    if device_graph_capture or graph_share > 0.2 or (graph_launches and n and graph_launches * 5 > n):
        unreliable = (
            "device graph capture was on: kernels ran as graph replays, so per-step attribution and per-kernel "
            "counts are unreliable; re-run with --no-device-graph-capture (max serve / max generate) to see each kernel"
        )
    return KernelBreakdown(
        source=source,
        kernels=n,
        kernel_ms=float(dur.sum()) / 1e6,
        attribution=attribution,
        families=_family_rows(fam_idx, dur),
        top_kernels=_kernel_rows(base_idx, bases, base_fam, dur, top),
        phases=phases,
        unknown_kernel_names=unknown,
        devices=sorted(int(d) for d in np.unique(arr.device)) if n else [],
        unreliable=unreliable,
        per_step_families=per_step,
        per_device=per_device,
    )


def _per_device(
    arr: KernelArrays,
    fam_idx: np.ndarray,
    dur: np.ndarray,
    kernel_phase: np.ndarray,
    interval_phase: list[Phase],
    starts: np.ndarray,
    ends: np.ndarray,
) -> list[DeviceBreakdown]:
    """Per-GPU tables: kernels, busy fraction, families, collective time per decode step."""
    wall = int((ends - starts).sum()) if starts.size else 0
    decode_code = PHASES.index("decode")
    decode_steps = sum(1 for p in interval_phase if p == "decode")
    coll = FAMILIES.index("collective")
    out = []
    for dev in sorted(int(d) for d in np.unique(arr.device)):
        m = arr.device == dev
        dm = m & (kernel_phase == decode_code)
        dec_ms = float(dur[dm].sum()) / 1e6
        coll_ms = float(dur[dm & (fam_idx == coll)].sum()) / 1e6
        out.append(
            DeviceBreakdown(
                device=dev,
                kernels=int(m.sum()),
                kernel_ms=float(dur[m].sum()) / 1e6,
                gpu_busy_pct=min(100.0, 100.0 * _union_ns(arr.start[m], arr.end[m]) / wall) if wall else None,
                collective_ms_per_decode_step=coll_ms / decode_steps if decode_steps else None,
                collective_share_of_decode_pct=100.0 * coll_ms / dec_ms if dec_ms else None,
                families=_family_rows(fam_idx[m], dur[m]),
            )
        )
    return out


def phase_of_range(name: str) -> Phase | None:
    """Phase named by a range: ours (``prefill``, ``max_profile:decode``) or MAX's scheduler ranges."""
    text = name.rsplit(":", 1)[-1] if name.startswith(("max_profile:", ":")) else name
    text = text.rsplit("/", 1)[-1] if text.startswith("max_profile/") else text
    if text in ("prefill", "decode", "mixed"):
        return text  # type: ignore[return-value]
    if "batch_type=CE" in name:
        return "prefill"
    if "batch_type=TG" in name:
        return "decode"
    return None


def batch_of_range(name: str) -> int:
    import re

    m = re.search(r"batch_size=(\d+)", name)
    return int(m.group(1)) if m else 1
