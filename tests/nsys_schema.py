"""Generated nsys-schema SQLite exports (tables and columns as ``nsys export --type sqlite`` 2025.3 writes
them, ../shared/research/formats.md §1), with the exact expected breakdown beside each.

Not a fake of nsys itself: a trace in its export format whose truth is known, so attribution can be
checked to the nanosecond. Each step is one range; its kernels are launched (``cuLaunchKernelEx``)
from the thread that holds the ranges or from a runtime worker thread, and run after their launch —
the last ones past the end of their step, as in MAX's overlap pipeline.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
    shortName INTEGER NOT NULL,
    registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL,
    blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, graphNodeId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL,
    globalTid INTEGER,
    correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
    category INTEGER, color INTEGER,
    text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER);
CREATE TABLE TARGET_INFO_GPU (id INTEGER PRIMARY KEY, name TEXT);
CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PRODUCT_VERSION', 'generated (max_profile tests)');
INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H200');
"""

DECODE_MIX = (
    ("gemv_split_k_bfloat16_bfloat16_bfloat16_128_41f3d61e", 21_000),
    ("sm90_mha_depth128_bfloat16_bfloat16_nqh16_nkvh4_0a1b2c3d", 6_000),
    ("rms_norm_fused_residual_gpu_block_bfloat16_False_b4dff138", 2_500),
    ("mogg_foreach_r2_w8_b256_gs_False_5e6f7a8b", 1_500),
)
PREFILL_MIX = (
    ("sm90_matmul_bfloat16_bfloat16_bfloat16_True_77aa88bb", 90_000),
    ("sm90_mha_depth128_bfloat16_bfloat16_nqh16_nkvh4_0a1b2c3d", 12_000),
    ("rms_norm_fused_residual_gpu_block_bfloat16_False_b4dff138", 4_000),
)


@dataclass
class Expected:
    """The truth of a generated trace, per phase: steps, kernels and kernel time (ns)."""

    steps: dict[str, int] = field(default_factory=dict)
    kernels: dict[str, int] = field(default_factory=dict)
    kernel_ns: dict[str, int] = field(default_factory=dict)
    wall_ns: dict[str, int] = field(default_factory=dict)
    worker_launches: int = 0
    main_launches: int = 0
    between_steps: int = 0
    """Kernels launched between two steps (no step holds their launch): unattributed."""


def make_nsys_sqlite(
    path: Path,
    *,
    decode_steps: int = 24,
    worker_fraction: float = 1.0,
    ours: bool = True,
    scheduler: bool = False,
    duplicate_ours: bool = False,
    repeat: int = 6,
    seed: int = 0,
    boundary_launches: bool = False,
) -> Expected:
    """Write a trace of one prefill and ``decode_steps`` decode steps; return what a correct breakdown must say.

    ``worker_fraction`` of the launches come from a runtime worker thread, the rest from the thread that
    holds the ranges. ``ours``: ``max_profile`` domain push/pop ranges; ``scheduler``: MAX's
    ``_schedule(...)`` start/end ranges around the same steps (both: the normal MAX case with profiling
    on). ``duplicate_ours`` pushes every range of ours twice, nested. ``boundary_launches``: each step's last launch
    call starts 1 µs before the step ends and returns after it (its start decides: this step), and one more kernel is
    launched in the gap after each step (no step holds it: unattributed, never the step before).
    """
    rng = random.Random(seed)
    names = sorted({n for n, _ in DECODE_MIX + PREFILL_MIX})
    sid = {n: i + 1 for i, n in enumerate(names)}
    launch_id, prefill_id, decode_id = len(sid) + 1, len(sid) + 2, len(sid) + 3
    pid = 4242
    main_tid, worker_tid = (pid << 24) | 4242, (pid << 24) | 4300
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    con.executemany(
        "INSERT INTO StringIds VALUES (?, ?)",
        [(i, n) for n, i in sid.items()]
        + [(launch_id, "cuLaunchKernelEx"), (prefill_id, "prefill"), (decode_id, "decode")],
    )
    if ours:
        con.execute(
            "INSERT INTO NVTX_EVENTS VALUES (0, NULL, 75, NULL, NULL, NULL, 'max_profile', ?, NULL, NULL, 1)",
            (main_tid,),
        )
    exp = Expected()
    kernels, launches, ranges = [], [], []
    t, corr, k_t = 1_000_000_000, 0, 0
    plan = [("prefill", PREFILL_MIX)] + [("decode", DECODE_MIX)] * decode_steps
    for phase, mix in plan:
        start = t
        launch_t = t + 30_000
        for _ in range(repeat):
            for name, dur in mix:
                corr += 1
                worker = rng.random() < worker_fraction
                tid = worker_tid if worker else main_tid
                exp.worker_launches += worker
                exp.main_launches += not worker
                launches.append((launch_t, launch_t + 2_000, 1, tid, corr, launch_id, 0))
                k_t = max(k_t, launch_t + 8_000)
                kernels.append(
                    (k_t, k_t + dur, 0, 1, 13, corr, pid << 24, sid[name], sid[name], 40, 1, 1024, 1, 128, 1, 1, None)
                )
                exp.kernels[phase] = exp.kernels.get(phase, 0) + 1
                exp.kernel_ns[phase] = exp.kernel_ns.get(phase, 0) + dur
                launch_t += 3_000
                k_t += dur + 200
        end = launch_t + 20_000  # the step's host time ends; its last kernels still run on the GPU
        if (
            boundary_launches
        ):  # a launch call that starts inside the step and returns after its end: it belongs to this step
            corr += 1
            launches.append((end - 1_000, end + 4_000, 1, worker_tid, corr, launch_id, 0))
            k_t = max(k_t, end + 8_000)
            kernels.append(
                (
                    k_t,
                    k_t + 1_000,
                    0,
                    1,
                    13,
                    corr,
                    pid << 24,
                    sid[mix[-1][0]],
                    sid[mix[-1][0]],
                    40,
                    1,
                    1024,
                    1,
                    128,
                    1,
                    1,
                    None,
                )
            )
            exp.kernels[phase] = exp.kernels.get(phase, 0) + 1
            exp.kernel_ns[phase] = exp.kernel_ns.get(phase, 0) + 1_000
            k_t += 1_200
        exp.steps[phase] = exp.steps.get(phase, 0) + 1
        exp.wall_ns[phase] = exp.wall_ns.get(phase, 0) + (end - start)
        text_id = prefill_id if phase == "prefill" else decode_id
        if ours:
            ranges.append((start, end, 59, None, None, None, None, main_tid, None, text_id, 1))
            if duplicate_ours:
                ranges.append((start + 100, end - 100, 59, None, None, None, None, main_tid, None, text_id, 1))
        if scheduler:
            kind = "CE" if phase == "prefill" else "TG"
            ranges.append(
                (
                    start - 5_000,
                    end + 5_000,
                    60,
                    None,
                    4,
                    None,
                    f"_schedule(TextGenerationInputs(batch_size=1, batch_type={kind}))",
                    main_tid,
                    None,
                    None,
                    0,
                )
            )
        # the host moves on while the GPU queue drains: the next step starts before these kernels end
        t = end + rng.randrange(12_000, 20_000)
        if boundary_launches:  # launched in the gap between this step and the next: no step's
            corr += 1
            launches.append((end + 6_000, end + 7_000, 1, worker_tid, corr, launch_id, 0))
            k_t = max(k_t, end + 9_000)
            kernels.append(
                (
                    k_t,
                    k_t + 500,
                    0,
                    1,
                    13,
                    corr,
                    pid << 24,
                    sid[mix[0][0]],
                    sid[mix[0][0]],
                    40,
                    1,
                    1024,
                    1,
                    128,
                    1,
                    1,
                    None,
                )
            )
            exp.between_steps += 1
            k_t += 700
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (" + ",".join("?" * 17) + ")", kernels)
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?)", launches)
    con.executemany("INSERT INTO NVTX_EVENTS VALUES (?,?,?,?,?,?,?,?,?,?,?)", ranges)
    con.commit()
    con.close()
    return exp
