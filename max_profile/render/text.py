"""Text rendering of a :class:`Report` with ``rich`` (terminal tables; plain text when piped)."""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from max_profile.model import (
    DecodeCost,
    FamilyRow,
    KernelAnalysis,
    KernelBreakdown,
    KernelRow,
    PreflightResult,
    Report,
    StartupProfile,
    StepSummary,
    Unavailable,
    UtilizationSection,
    set_text_renderer,
)
from max_profile.model.command_text import say
from max_profile.model.tags import LedgerSource, StartupSource, StepSource, TargetKind, host_ops
from max_profile.render.serve_text import (
    load_levels_section,
    replicas_section,
    serve_section,
    server_metrics_section,
    tracer_cost_line,
)
from max_profile.render.tables import (
    INNER,
    OP_COLUMNS,
    OP_ROOF_COLUMNS,
    Col,
    decode_context_text,
    figure,
    fitted_tables,
    kv_text,
    na_text,
    op_coverage_text,
    op_figures,
    op_phase_heading,
    op_roof_figures,
    recorded_share,
    steps_text,
)
from max_profile.render.terminal import DEFAULT_WIDTH, terminal_width
from max_profile.render.verdict_text import no_next_reason

"""A panel's border and padding take this many columns of the console width."""

_SEV_STYLE = {"error": "bold red", "warning": "yellow", "info": "green"}


def environment_section(report: Report) -> RenderableType:
    env = report.environment
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("vendor", f"{env.vendor} ({env.vendor_reason})")
    for g in env.gpus:
        mem = f"{g.memory_total_bytes / 2**30:.1f} GiB" if g.memory_total_bytes else "?"
        t.add_row(g.key, f"{g.name or '?'}, {mem}, max SM clock {figure(g.max_sm_clock_mhz, 'd', ' MHz')}")
    if env.driver_version:
        t.add_row("driver", env.driver_version)
    c = report.capture
    imported = (
        TargetKind.of(c.target) is TargetKind.IMPORT
    )  # a trace made elsewhere: what it does not say is unknown, not "off"
    t.add_row("MAX", env.max_version or ("unknown (imported trace)" if imported else "not installed"))
    if measured_anything(report):  # doctor captured nothing: no target or capture settings to show
        graphs = {True: "on", False: "off", None: "unknown"}[c.device_graph_capture]
        t.add_row(
            "target",
            c.target
            + (f"  model {c.model_path}" if c.model_path else "")
            + (f"  devices {c.devices}" if c.devices else ""),
        )
        profiling = f"MODULAR_ENABLE_PROFILING={c.profiling_mode or ('unknown' if imported else 'off')}"
        t.add_row("profiling", f"{profiling}, phase markers {c.phase_markers or 'none'}, device graphs {graphs}")
    if (
        measured_anything(report) and env.tools
    ):  # a capture: one line; `max-profile doctor` has the paths and install commands
        t.add_row(
            "tools",
            ", ".join(
                f"{tool.name} {'ok' if tool.usable else 'missing' if tool.path is None else 'unusable'}"
                for tool in env.tools
            )
            + "  (max-profile doctor: versions and install commands)",
        )
    else:
        gpu_tools = {"nsys", "ncu", "rocprofv3"}
        unused = [t.name for t in env.tools if t.name in gpu_tools and t.path is None] if env.vendor == "none" else []
        if unused:  # no GPU here: the GPU profilers' installs say nothing about what a capture here can record
            t.add_row(
                "GPU profilers",
                f"{', '.join(unused)}: not used without a GPU (`max-profile doctor --json` lists each with its install "
                "command)",
            )
        for tool in env.tools:
            if tool.name in unused:
                continue
            state = (tool.path + (f" ({tool.version})" if tool.version else "")) if tool.path else "missing"
            if tool.problem:
                state += f" — {tool.problem}"
            t.add_row(tool.name, state)
            if tool.install_hint:
                t.add_row("", Text(f"install: {tool.install_hint}", style="dim"))
    said = {tool.problem for tool in env.tools}
    for w in env.warnings:
        if w not in said:
            t.add_row("warning", Text(w, style="yellow"))
    return Panel(t, title="Environment", title_align="left")


def growth_text(s: StepSummary) -> str | None:
    """Decode step growth with the context, said as a trend only when it is one (two decimals; flat otherwise)."""
    g = s.decode_step_growth_ms_per_100_ctx
    if g is None:
        return None
    decode = next((p for p in s.phases if p.phase == "decode"), None)
    floor = 0.01 * decode.p50_ms if decode else 0.0
    if g <= floor:
        # a slope at or below 1 % of the step (negative: noise) is no trend
        return "decode step time flat with the context"
    return f"decode step +{g:.2f} ms per 100 context tokens"


def steps_section(report: Report, width: int = DEFAULT_WIDTH) -> RenderableType:
    s = report.step_summary
    if isinstance(s, Unavailable):
        return Panel(na_text(s.reason), title="Steps", title_align="left")
    if not isinstance(s, StepSummary):
        return Panel(na_text("no steps recorded"), title="Steps", title_align="left")
    cols = [
        Col("phase", numeric=False),
        Col("steps"),
        Col("p50 ms"),
        Col("p90 ms"),
        Col("max ms"),
        Col("total ms"),
        Col("tokens"),
    ]
    rows = [
        [
            p.phase,
            str(p.steps),
            figure(p.p50_ms, ".3f"),
            figure(p.p90_ms, ".3f"),
            figure(p.max_ms, ".3f"),
            figure(p.total_ms, ".1f"),
            str(p.tokens),
        ]
        for p in s.phases
    ]
    head = Text(
        f"TTFT {figure(s.ttft_ms, '.2f', ' ms')}   decode {figure(s.decode_tokens_per_s, '.1f', ' tok/s')}   steps "
        f"{s.steps}" + (f"   (from {s.source})" if s.source != StepSource.HOST else "")
    )
    growth = growth_text(s)
    if growth:
        head.append(f"   {growth}")
    parts: list[RenderableType] = [head, *fitted_tables(cols, rows, width - INNER)]
    if len(s.by_batch) > len(s.phases):  # several batch sizes in one phase (a server): step times by size
        bcols = [
            Col("phase", numeric=False),
            Col("batch"),
            Col("steps"),
            Col("p50 ms"),
            Col("p90 ms"),
            Col("tokens/step"),
        ]
        brows = [
            [
                b.phase,
                str(b.batch_size),
                str(b.steps),
                figure(b.p50_ms, ".3f"),
                figure(b.p90_ms, ".3f"),
                figure(b.tokens_per_step, ".1f"),
            ]
            for b in s.by_batch
        ]
        parts += fitted_tables(bcols, brows, width - INNER, title="by batch size")
    return Panel(Group(*parts), title="Steps (host)" if s.source == StepSource.HOST else "Steps", title_align="left")


def utilization_section(report: Report, width: int = DEFAULT_WIDTH) -> RenderableType:
    u = report.utilization
    if isinstance(u, Unavailable) or u is None:
        return Panel(na_text(u.reason if u else "not measured"), title="GPU utilization", title_align="left")
    assert isinstance(u, UtilizationSection)
    cols = [
        Col("gpu", numeric=False),
        Col("samples"),
        Col("util peak %"),
        Col("util mean %"),
        Col("SM activity %"),
        Col("mem peak"),
        Col("mem % total"),
        Col("SM clock mean/max MHz"),
        Col("HW throttle", numeric=False),
    ]
    rows = []
    for g in u.gpus:
        mem = f"{g.peak_memory_bytes / 2**30:.2f} GiB" if g.peak_memory_bytes is not None else "n/a"
        rows.append(
            [
                g.gpu,
                str(g.samples),
                figure(g.peak_utilization_pct, ".0f"),
                figure(g.mean_utilization_pct, ".1f"),
                figure(g.mean_sm_activity_pct, ".1f"),
                mem,
                figure(g.peak_memory_pct, ".1f"),
                f"{figure(g.mean_sm_clock_mhz, '.0f')}/{figure(g.max_sm_clock_mhz, 'd')}",
                ", ".join(g.hardware_throttle_reasons) or "none",
            ]
        )
    tables = fitted_tables(cols, rows, width - INNER)
    parts = [
        Text(
            f"{g.gpu} partitions (XCP) mean activity %: "
            + " / ".join(f"{v:.0f}" for v in g.mean_partition_activity_pct)
        )
        for g in u.gpus
        if g.mean_partition_activity_pct
    ]
    note = Text(
        f"{u.source}, every {u.interval_s:g} s; NVML utilization = time some kernel ran, not how much of the GPU it "
        "used",
        style="dim",
    )
    return Panel(Group(*tables, *parts, note), title="GPU utilization (steps' window)", title_align="left")


def _family_tables(rows: list[FamilyRow], title: str, width: int, unit: str) -> list[Table]:
    cols = [Col("family", numeric=False), Col(unit), Col("ms"), Col("share %")]
    return fitted_tables(
        cols,
        [[r.family, str(r.kernels), figure(r.total_ms, ".3f"), figure(r.share_pct, ".1f")] for r in rows],
        width,
        title=title,
    )


def _kernel_tables(rows: list[KernelRow], title: str, width: int, unit: str) -> list[Table]:
    cols = [
        Col(unit.rstrip("s"), numeric=False, wrap=True),
        Col("family", numeric=False),
        Col("count"),
        Col("ms"),
        Col("mean µs"),
        Col("share %"),
    ]
    return fitted_tables(
        cols,
        [
            [
                r.name[:160],
                r.family,
                str(r.count),
                figure(r.total_ms, ".3f"),
                figure(r.mean_us, ".2f"),
                figure(r.share_pct, ".1f"),
            ]
            for r in rows
        ],
        width,
        title=title,
    )


def _per_device_tables(k: KernelBreakdown, inner: int) -> list[Table]:
    """Each device's kernels, busy share and collectives (a multi-GPU capture)."""
    cols = [
        Col("device"),
        Col("kernels"),
        Col("kernel ms"),
        Col("GPU busy %"),
        Col("collective ms /decode step"),
        Col("collective % of decode"),
        Col("top families", numeric=False, wrap=True),
    ]
    rows = [
        [
            str(d.device),
            str(d.kernels),
            figure(d.kernel_ms, ".3f"),
            figure(d.gpu_busy_pct, ".1f"),
            figure(d.collective_ms_per_decode_step, ".4f"),
            figure(d.collective_share_of_decode_pct, ".1f"),
            ", ".join(f.family for f in d.families[:3]),
        ]
        for d in k.per_device
    ]
    return fitted_tables(cols, rows, inner, title="Per device")


def kernels_section(report: Report, width: int = DEFAULT_WIDTH) -> RenderableType | None:
    k = report.kernels
    if k is None:
        return None
    if isinstance(k, Unavailable):
        return Panel(na_text(k.reason), title="Kernels", title_align="left")
    assert isinstance(k, KernelBreakdown)
    inner = width - INNER
    ops = host_ops(k.source)
    unit = "ops" if ops else "kernels"  # MAX's op ranges on the host clock are not GPU kernels: the columns say so
    head = (
        f"{k.kernels} {'MAX ops' if ops else 'kernels'}, {k.kernel_ms:.3f} ms of "
        f"{'op time (host clock)' if ops else 'kernel time'}, source {k.source}; "
        f"steps from {k.step_source}, attribution by {k.attribution}"
    )
    if k.gpu_busy_pct is not None:
        what = "MAX ops cover" if ops else "GPU busy"
        head += (
            f"; {what} {k.gpu_busy_pct:.1f}% of the {figure(k.recorded_ms, '.3f')} ms recorded in slices of the "
            f"{figure(k.window_ms, '.3f')} ms window"
            if k.recorded_ms is not None
            else f"; {what} {k.gpu_busy_pct:.1f}% of the {figure(k.window_ms, '.3f')} ms window"
        )
        if ops:
            head += f" (the other {100 - k.gpu_busy_pct:.1f}% is host time between ops: Python, scheduling, sampling)"
    if k.unattributed_kernels and k.step_source != StepSource.NONE:
        head += f"; {k.unattributed_kernels} {unit} outside every step"
    if k.invalid_kernels:
        head += f"; {k.invalid_kernels} records with invalid timestamps dropped"
    if k.paused_kernels:
        head += f"; {k.paused_kernels} records stamped across a recording pause dropped"
    if k.tracer_overhead_pct is not None:
        head += f"; tracer callbacks {k.tracer_overhead_pct:.1f}% of the window"
    w = k.gpu_waits
    if w is not None and not ops and w.gaps:
        scope = "of the recorded slices' time" if k.recorded_ms is not None else "of the window"
        head += (
            f"; the GPU waited for work {w.waited_pct:.1f}% {scope} in {w.gaps} gaps of "
            f"{w.min_gap_us / 1e3:g}-{w.max_gap_ms:g} ms "
            f"({w.before_graph_gaps} before device-graph kernels)"
        )
    parts: list[RenderableType] = [Text(head)]
    if k.unreliable:
        parts.append(Text(f"UNRELIABLE: {k.unreliable}", style="bold yellow"))
    if k.phases:
        busy = "ops cover %" if ops else "GPU busy %"
        cols = [
            Col("phase", numeric=False),
            Col("steps recorded" if any(recorded_share(p) for p in k.phases) else "steps"),
            Col(unit),
            Col(f"{'op' if ops else 'kernel'} ms"),
            Col("ms in steps"),
            Col(busy),
            Col(f"{unit} /step"),
            Col(f"{'op' if ops else 'kernel'} ms /step"),
            Col("µs /token"),
        ]
        rows = [
            [
                p.phase,
                recorded_share(p) or str(p.steps),
                str(p.kernels),
                figure(p.kernel_ms, ".3f"),
                figure(p.wall_ms, ".3f"),
                figure(p.gpu_busy_pct, ".1f"),
                figure(p.kernels_per_step, ".1f"),
                figure(p.kernel_ms_per_step, ".4f"),
                figure(p.kernel_us_per_token, ".2f"),
            ]
            for p in k.phases
        ]
        parts += fitted_tables(cols, rows, inner)
    if k.per_device:
        parts += _per_device_tables(k, inner)
    parts += _family_tables(k.families, "Families (all phases)", inner, unit)
    for p in k.phases:
        parts += _family_tables(p.families, f"Families — {p.phase}", inner, unit)
    parts += _kernel_tables(k.top_kernels, f"Top {unit} (all phases)", inner, unit)
    for p in k.phases:
        if p.phase == "decode":
            parts += _kernel_tables(p.top_kernels, f"Top {unit} — decode", inner, unit)
    if k.unknown_kernel_names:
        parts.append(Text("unclassified (family 'other'): " + ", ".join(k.unknown_kernel_names[:10]), style="dim"))
    return Panel(Group(*parts), title="Where the time goes", title_align="left")


def decode_cost_section(c: DecodeCost | None, width: int = DEFAULT_WIDTH) -> RenderableType | None:
    """The decode step's bytes and FLOPs against the GPU's peaks (whole step, and the priced families)."""
    if c is None:
        return None
    head = Text(
        f"batch {c.batch}, {decode_context_text(c)}; per step: weights {c.weight_bytes / 1e9:.3f} GB, "
        f"{kv_text(c, 'KV cache')}, {c.flops / 1e9:.1f} GFLOP ({c.operand} operands); peaks: "
        f"{figure(c.peak_bandwidth_GBps, '.0f', ' GB/s')}, {figure(c.peak_TFLOPs, '.0f', ' TFLOP/s')} "
        f"({c.gpu or 'GPU unknown'})"
    )
    cols = [
        Col("part", numeric=False),
        Col("ms /step"),
        Col("GB /step"),
        Col("GB/s"),
        Col("% of peak BW"),
        Col("TFLOP/s"),
        Col("% of peak compute"),
    ]
    rows = [
        [
            r.family,
            figure(r.ms_per_step, ".4f"),
            figure(r.bytes_per_step / 1e9, ".4f"),
            figure(r.achieved_GBps, ".1f"),
            figure(r.pct_of_peak_bandwidth, ".1f"),
            figure(r.achieved_TFLOPs, ".2f"),
            figure(r.pct_of_peak_compute, ".1f"),
        ]
        for r in [c.step, *([c.kernels] if c.kernels else []), *c.families]
    ]
    note = Text(f"weights counted from {c.weights_basis}", style="dim")
    return Panel(
        Group(head, *fitted_tables(cols, rows, width - INNER), note),
        title="Decode step against the roofline",
        title_align="left",
    )


def analyses_section(analyses: list[KernelAnalysis]) -> RenderableType | None:
    if not analyses:
        return None
    parts: list[RenderableType] = []
    for a in analyses:
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold")
        t.add_column()
        t.add_row("kernel", f"{a.kernel_name[:100]} (launch {a.launch_id}, grid {a.grid_size}, block {a.block_size})")
        t.add_row("bound", a.bound or "n/a")
        t.add_row("duration", figure(a.duration_ns / 1e3 if a.duration_ns is not None else None, ".2f", " µs"))
        t.add_row(
            "SOL",
            f"compute {figure(a.compute_throughput_pct, '.1f', '%')}, memory "
            f"{figure(a.memory_throughput_pct, '.1f', '%')}, "
            f"DRAM {figure(a.dram_throughput_pct, '.1f', '%')}",
        )
        t.add_row("DRAM", figure(a.dram_bytes_per_s / 1e9 if a.dram_bytes_per_s else None, ".1f", " GB/s"))
        t.add_row(
            "occupancy",
            f"achieved {figure(a.achieved_occupancy_pct, '.1f', '%')} of theoretical "
            f"{figure(a.theoretical_occupancy_pct, '.1f', '%')}, limiter {a.occupancy_limiter or 'n/a'}, "
            f"{figure(a.registers_per_thread, '.0f')} regs/thread",
        )
        if a.achieved_flop_per_s is not None:
            t.add_row(
                "roofline",
                f"{a.achieved_flop_per_s / 1e12:.2f} TFLOP/s, intensity {figure(a.arithmetic_intensity, '.2f')} "
                "FLOP/byte",
            )
        for s in a.stalls[:3]:
            t.add_row("stall", f"{s.reason}: {s.cycles_per_instruction:.2f} cycles/instr — {s.meaning}")
        for r in a.ncu_rules[:4]:
            t.add_row("ncu", Text(r[:200], style="dim"))
        parts.append(t)
    return Panel(Group(*parts), title="Kernel deep dive (Nsight Compute)", title_align="left")


def preflight_section(results: list[PreflightResult]) -> RenderableType | None:
    if not results:
        return None
    parts: list[RenderableType] = []
    for r in results:
        parts.append(
            Text(
                f"{r.spec}  (MAX {r.max_version or '?'}, {r.duration_s:.1f} s)  architectures: "
                f"{', '.join(r.architectures) or 'none'}",
                style="bold",
            )
        )
        for c in r.checks:
            mark = "ok " if c.ok else {"error": "ERR", "warning": "WARN", "info": "info"}[c.severity]
            style = "green" if c.ok else _SEV_STYLE[c.severity]
            line = Text(f" {mark} ", style=style)
            line.append(f"{c.message}" + (f"  [{c.where}]" if c.where else ""))
            parts.append(line)
            if c.fix and not c.ok:
                parts.append(Text(f"      fix: {c.fix}", style="dim"))
    return Panel(Group(*parts), title="Custom architecture preflight", title_align="left")


def ledger_section(report: Report, width: int = DEFAULT_WIDTH) -> RenderableType | None:
    """Each phase's step split into kernel parts and GPU idle, against the roofline: the account every verdict reads."""
    lg = report.ledger
    if lg is None:
        return None
    if isinstance(lg, Unavailable):
        return (
            Panel(na_text(lg.reason), title="Step ledger", title_align="left")
            if report.steps or isinstance(report.kernels, KernelBreakdown)
            else None
        )
    parts: list[RenderableType] = []
    roofs = (
        f"; ideal = the roofline at {lg.attainable_bandwidth_pct:g} % of peak bandwidth"
        + (f" / {lg.attainable_compute_pct:g} % of peak compute" if lg.attainable_compute_pct else "")
        if lg.attainable_bandwidth_pct
        else ""
    )
    parts.append(Text(f"from the {lg.source}{roofs}; recoverable = actual - ideal (idle: all of it)", style="dim"))
    cols = [
        Col("part", numeric=False, wrap=True),
        Col("ms/step"),
        Col("% of step"),
        Col("ideal ms"),
        Col("recoverable ms"),
        Col("kernels/step"),
    ]
    on_gpu = lg.source == LedgerSource.KERNEL_TIMELINE and not (
        isinstance(report.kernels, KernelBreakdown) and host_ops(report.kernels.source)
    )
    for p in lg.phases:
        head = Text(f"{p.phase}: {steps_text(p.steps, p.steps_in_capture)} of {p.step_ms:.3f} ms", style="bold")
        extra = [
            f"host step p50 {p.host_step_p50_ms:.3f} ms" if p.host_step_p50_ms is not None else "",
            f"batch {p.batch}" if p.batch else "",
            f"GPU busy {p.busy_pct:.1f} %" if on_gpu else "",
            f"{p.recoverable_ms_per_step:.3f} ms per step recoverable" if p.recoverable_ms_per_step else "",
        ]
        head.append("  " + ", ".join(x for x in extra if x), style="dim")
        rows = [
            [
                r.part,
                f"{r.ms_per_step:.3f}",
                f"{r.share_pct:.1f}",
                figure(r.ideal_ms_per_step, ".3f", "") if r.ideal_ms_per_step is not None else "-",
                figure(r.recoverable_ms_per_step, ".3f") if r.recoverable_ms_per_step is not None else "-",
                figure(r.kernels_per_step, ".1f") if r.kernels_per_step is not None else "",
            ]
            for r in p.rows
        ]
        parts += [head, *fitted_tables(cols, rows, width - INNER)]
    outside = Text(
        f"outside steps: {lg.outside_steps_ms:.2f} ms ({lg.outside_steps_pct:.1f} % of the {lg.window_ms:.1f} ms "
        "observed)"
    )
    if lg.outside_kernels_ms:
        outside.append(f", {lg.outside_kernels_ms:.2f} ms of it kernels launched between steps")
    if lg.requests_in_flight_pct is not None:
        outside.append(
            f"; requests in flight {lg.requests_in_flight_pct:.0f} % of the window"
            + (f", {lg.request_rate_rps:.2f} requests/s" if lg.request_rate_rps is not None else "")
        )
    parts.append(outside)
    parts += [Text(n, style="dim") for n in lg.notes]
    return Panel(Group(*parts), title="Step ledger", title_align="left")


OPS_SHOWN = 12
"""Op rows shown per phase in the text report (all of them are in the JSON and HTML)."""


def ops_section(report: Report, width: int = DEFAULT_WIDTH) -> RenderableType | None:
    """MAX's ops and the GPU time of the kernels each launched, per phase (``--kernels ops``)."""
    ops = report.ops
    if ops is None:
        return None
    if isinstance(ops, Unavailable):
        return Panel(na_text(ops.reason), title="MAX ops on the GPU", title_align="left")
    parts: list[RenderableType] = [Text(f"{ops.source}; {ops.join}", style="dim")]
    cols = [Col(OP_COLUMNS[0], numeric=False, wrap=True), *map(Col, OP_COLUMNS[1:-1])]
    cols.append(Col(OP_COLUMNS[-1], numeric=False, wrap=True))
    for c in ops.coverage:
        if not c.kernels and not c.calls:
            continue
        head = Text(f"{op_phase_heading(c)}, ", style="bold")
        head.append(op_coverage_text(c), style="dim")
        rows = [r for r in ops.rows if r.phase == c.phase]
        table = [
            [r.op[:160], *op_figures(r), ", ".join(k[:60] for k in r.top_kernels) or "none"] for r in rows[:OPS_SHOWN]
        ]
        parts += [head, *fitted_tables(cols, table, width - INNER)]
        if len(rows) > OPS_SHOWN:
            parts.append(Text(f"... {len(rows) - OPS_SHOWN} more ops in the JSON / HTML report", style="dim"))
        priced = [g for g in ops.priced if g.phase == c.phase]
        if priced:
            parts.append(
                Text(
                    "ops against the roofline (ideal as in the step ledger; how each was priced: JSON / HTML)",
                    style="dim",
                )
            )
            roof_cols = [Col(OP_ROOF_COLUMNS[0], numeric=False), Col(OP_ROOF_COLUMNS[1], numeric=False, wrap=True)]
            roof_cols += map(Col, OP_ROOF_COLUMNS[2:])
            roof_rows = [[g.part, g.ops_text[:160], *op_roof_figures(g)] for g in priced]
            parts += fitted_tables(roof_cols, roof_rows, width - INNER)
    if ops.ops_without_kernels:
        parts.append(Text("ops that launched no kernel: " + ", ".join(ops.ops_without_kernels[:20]), style="dim"))
    return Panel(Group(*parts), title="MAX ops on the GPU", title_align="left")


def findings_section(report: Report) -> RenderableType:
    parts: list[RenderableType] = []
    if not report.findings:
        parts.append(Text("no findings", style="dim"))
    for f in report.findings:
        line = Text(f"[{f.severity}] ", style=_SEV_STYLE[f.severity])
        line.append(f"{f.title}", style="bold")
        line.append(f"  ({f.id}, confidence {f.confidence:.0%})", style="dim")
        parts.append(line)
        if f.lever is not None:
            where = f.lever.phase if f.lever.phase == "outside steps" else f"per {f.lever.phase} step"
            parts.append(
                Text(
                    f"    buys: {f.lever.ms_per_step:.3f} ms {where} ({f.lever.pct_of_step:.1f} %), "
                    f"{f.lever.total_ms:.1f} ms over the capture",
                    style="bold",
                )
            )
        ev = ", ".join(f"{k}={v}" for k, v in f.evidence.items())
        parts.append(Text(f"    evidence: {ev}", style="dim"))
        if f.next_step:
            parts.append(Text(f"    next: {f.next_step}"))
        if f.command is not None:
            parts.append(Text(f"    run: {say(f.command, report.capture.interface)}"))
    verdict = Text("Next measurement: ", style="bold")
    verdict.append(report.next_measurement or no_next_reason(report))
    parts.append(verdict)
    return Panel(Group(*parts), title="Findings", title_align="left")


def measured_anything(report: Report) -> bool:
    """Whether the report holds measurements (``doctor`` holds only the environment)."""
    return any(
        (
            report.steps,
            report.step_summary is not None,
            report.utilization is not None,
            report.kernels is not None,
            report.kernel_analyses,
            report.serve is not None,
            report.preflight,
            report.findings,
            report.startup is not None,
        )
    )


def size_text(n: int | float | None) -> str:
    """Bytes in the unit that keeps three significant figures (KB, MB, GB)."""
    if not n:
        return ""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def startup_section(st: StartupProfile | None, width: int = DEFAULT_WIDTH) -> RenderableType | None:
    """Process start to the first token, phase by phase, with the compile cache's verdict and why."""
    if st is None:
        return None
    span = (
        "from launch to /health 200 (from the server's log)"
        if st.source == StartupSource.SERVE_LOG
        else "from process start to the first token"
    )
    head = Text(f"{st.total_s:.1f} s {span}; compile cache {st.cache_reason}")
    if st.max_logged_compile_s is not None:
        head.append(
            f"\nMAX logged {st.max_logged_compile_s:.1f} s of compiling; the engine timed "
            f"{figure(st.engine_compile_s, '.1f', ' s')}" + (f"; cache folder {st.cache_dir}" if st.cache_dir else "")
        )
    cols = [
        Col("phase", numeric=False, wrap=True),
        Col("s"),
        Col("%"),
        Col("cache", numeric=False),
        Col("bytes"),
        Col("GB/s"),
    ]
    rows = [
        [
            p.name,
            f"{p.seconds:.2f}",
            f"{100 * p.seconds / st.total_s:.1f}" if st.total_s > 0 else "n/a",
            p.cache or "",
            size_text(p.bytes),
            figure(p.gb_per_s, ".2f") if p.gb_per_s else "",
        ]
        for p in st.phases
        if p.seconds >= 0.005 or p.bytes
    ]
    parts: list[RenderableType] = [head, *fitted_tables(cols, rows, width - INNER)]
    if st.failure:
        parts.append(Text(f"FAILED: {st.failure}", style="bold red"))
    if st.warm_cache_command:
        parts.append(Text(f"fill the cache for this key: {st.warm_cache_command}", style="dim"))
    return Panel(Group(*parts), title="Start-up", title_align="left")


def host_load_line(report: Report) -> RenderableType | None:
    load = report.capture.host_load
    if load is None:
        return None
    others = ", ".join(f"{p.name} {p.cores:.2f}" for p in load.busiest_others[:3])
    # two readings of one thing (the kernel's idle counter, the processes' CPU times): the larger is said, never one
    # below the other
    observed = load.observed_cores or 0.0
    busy = (
        max(load.cpu_busy_pct or 0.0, min(100.0, 100.0 * (load.own_cores + load.other_cores + observed) / load.cores))
        if load.cores
        else load.cpu_busy_pct
    )
    attached = report.serve is not None and report.serve.mode == "attach"
    server = (
        f"the attached server {observed:.2f}, "
        if load.observed_cores is not None
        else "the attached server not found on this machine (its CPU time, if it runs here, is among the others), "
        if attached
        else ""
    )
    return Text(
        f"host CPU over the window: {figure(busy, '.0f', '%')} busy of {load.cores} cores; this process tree "
        f"{load.own_cores:.2f} cores, {server}"
        f"other processes {load.other_cores:.2f}" + (f" ({others})" if others else ""),
        style="dim",
    )


def render_renderables(report: Report, width: int = DEFAULT_WIDTH) -> list[RenderableType]:
    measured = measured_anything(report)
    sections: list[RenderableType | None] = [
        environment_section(report),
        preflight_section(report.preflight),
        ledger_section(report, width),
        findings_section(report) if measured else None,
        ops_section(report, width),
        startup_section(report.startup, width),
        serve_section(report),
        server_metrics_section(report.server_metrics),
        replicas_section(report, width),
        tracer_cost_line(report),
        load_levels_section(report.load_levels, report.slo_ms, width),
        steps_section(report, width) if report.steps or report.step_summary is not None else None,
        utilization_section(report, width)
        if report.utilization is not None or (measured and report.serve is None and report.steps)
        else None,
        kernels_section(report, width),
        decode_cost_section(report.decode_cost, width)
        if report.environment.vendor != "none"
        else None,  # no peaks on a CPU: no roofline box
        analyses_section(report.kernel_analyses),
        host_load_line(report),
    ]
    if report.notes:
        sections.append(Panel(Text("\n".join(report.notes), style="dim"), title="Notes", title_align="left"))
    if report.artifacts:
        sections.append(Panel(Text("\n".join(report.artifacts)), title="Artifacts", title_align="left"))
    return [s for s in sections if s is not None]


def render_text(report: Report, width: int | None = None, color: bool = False) -> str:
    """The report as text, ``width`` columns wide (default: the terminal's, as the CLI prints it)."""
    width = width or terminal_width()
    buf = io.StringIO()
    console = Console(
        file=buf, width=width, force_terminal=color, color_system="auto" if color else None, highlight=False
    )
    for r in render_renderables(report, width):
        console.print(r)
    return buf.getvalue()


def print_report(report: Report, console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    for r in render_renderables(report, console.width):
        console.print(r)


set_text_renderer(render_text)  # str(report) renders the text report
