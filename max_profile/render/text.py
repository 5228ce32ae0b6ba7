"""Text rendering of a :class:`Report` with ``rich`` (terminal tables; plain text when piped)."""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from max_profile.analyze.commands import say
from max_profile.analyze.diff import DiffResult
from max_profile.analyze.plan import no_next_reason
from max_profile.model import (
    DecodeCost,
    FamilyRow,
    KernelAnalysis,
    KernelBreakdown,
    KernelRow,
    LoadLevel,
    PreflightResult,
    Report,
    ServerMetrics,
    StartupProfile,
    StepSummary,
    Unavailable,
    UtilizationSection,
)
from max_profile.render.tables import Col, fitted_tables

DEFAULT_WIDTH = 120
INNER = 4
"""A panel's border and padding take this many columns of the console width."""

_SEV_STYLE = {"error": "bold red", "warning": "yellow", "info": "green"}


def _na(reason: str) -> Text:
    return Text(f"not available: {reason}", style="dim")


def _f(v: float | int | None, fmt: str = ".2f", unit: str = "") -> str:
    if v is None:
        return "n/a"
    return f"{v:{fmt}}{unit}"


def environment_section(report: Report) -> RenderableType:
    env = report.environment
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("vendor", f"{env.vendor} ({env.vendor_reason})")
    for g in env.gpus:
        mem = f"{g.memory_total_bytes / 2**30:.1f} GiB" if g.memory_total_bytes else "?"
        t.add_row(g.key, f"{g.name or '?'}, {mem}, max SM clock {_f(g.max_sm_clock_mhz, 'd', ' MHz')}")
    if env.driver_version:
        t.add_row("driver", env.driver_version)
    c = report.capture
    imported = c.target.startswith("import:")  # a trace made elsewhere: what it does not say is unknown, not "off"
    t.add_row("MAX", env.max_version or ("unknown (imported trace)" if imported else "not installed"))
    if measured_anything(report):  # doctor captured nothing: no target or capture settings to show
        graphs = {True: "on", False: "off", None: "unknown"}[c.device_graph_capture]
        t.add_row("target", c.target + (f"  model {c.model_path}" if c.model_path else "") + (f"  devices {c.devices}" if c.devices else ""))
        profiling = f"MODULAR_ENABLE_PROFILING={c.profiling_mode or ('unknown' if imported else 'off')}"
        t.add_row("profiling", f"{profiling}, phase markers {c.phase_markers or 'none'}, device graphs {graphs}")
    if measured_anything(report) and env.tools:  # a capture: one line; `max-profile doctor` has the paths and install commands
        t.add_row("tools", ", ".join(f"{tool.name} {'ok' if tool.usable else 'missing' if tool.path is None else 'unusable'}" for tool in env.tools)
                  + "  (max-profile doctor: versions and install commands)")
    else:
        for tool in env.tools:
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
        return "decode step time flat with the context"  # a slope at or below 1 % of the step (negative: noise) is no trend
    return f"decode step +{g:.2f} ms per 100 context tokens"


def steps_section(report: Report, width: int = DEFAULT_WIDTH) -> RenderableType:
    s = report.step_summary
    if isinstance(s, Unavailable):
        return Panel(_na(s.reason), title="Steps", title_align="left")
    if not isinstance(s, StepSummary):
        return Panel(_na("no steps recorded"), title="Steps", title_align="left")
    cols = [Col("phase", numeric=False), Col("steps"), Col("p50 ms"), Col("p90 ms"), Col("max ms"), Col("total ms"), Col("tokens")]
    rows = [[p.phase, str(p.steps), _f(p.p50_ms, ".3f"), _f(p.p90_ms, ".3f"), _f(p.max_ms, ".3f"), _f(p.total_ms, ".1f"), str(p.tokens)] for p in s.phases]
    head = Text(f"TTFT {_f(s.ttft_ms, '.2f', ' ms')}   decode {_f(s.decode_tokens_per_s, '.1f', ' tok/s')}   steps {s.steps}"
                + (f"   (from {s.source})" if s.source != "host steps" else ""))
    growth = growth_text(s)
    if growth:
        head.append(f"   {growth}")
    parts: list[RenderableType] = [head, *fitted_tables(cols, rows, width - INNER)]
    if len(s.by_batch) > len(s.phases):  # several batch sizes in one phase (a server): step times by size
        bcols = [Col("phase", numeric=False), Col("batch"), Col("steps"), Col("p50 ms"), Col("p90 ms"), Col("tokens/step")]
        brows = [[b.phase, str(b.batch_size), str(b.steps), _f(b.p50_ms, ".3f"), _f(b.p90_ms, ".3f"), _f(b.tokens_per_step, ".1f")] for b in s.by_batch]
        parts += fitted_tables(bcols, brows, width - INNER, title="by batch size")
    return Panel(Group(*parts), title="Steps (host)" if s.source == "host steps" else "Steps", title_align="left")


def serve_section(report: Report) -> RenderableType | None:
    s = report.serve
    if s is None:
        return None
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("mode", f"{s.mode}, window {s.window_s:.1f} s, port {s.port}, /health after {_f(s.time_to_ready_s, '.1f', ' s')}")
    t.add_row("requests", f"{s.requests} ({s.failed_requests} failed), {s.output_tokens} streamed chunks")
    t.add_row("TTFT", f"p50 {_f(s.ttft_ms_p50, '.2f', ' ms')}, p90 {_f(s.ttft_ms_p90, '.2f', ' ms')} (client side)")
    t.add_row("inter-token", f"p50 {_f(s.itl_ms_p50, '.2f', ' ms')}, p90 {_f(s.itl_ms_p90, '.2f', ' ms')} -> {_f(s.tokens_per_s, '.1f', ' tok/s')} per request")
    if s.output_tok_per_s is not None:
        t.add_row("streamed", f"{s.output_tok_per_s:.1f} tok/s over the window (all requests)")
    for cmd in s.commands:
        t.add_row("server", Text(" ".join(cmd), style="dim"))
    if s.first_error:
        t.add_row("first error", Text(s.first_error[:200], style="yellow"))
    if s.server_log:
        t.add_row("log", s.server_log)
    label = "attached: max serve" if s.mode == "attach" else "max serve"
    return Panel(t, title=label, title_align="left")


def server_metrics_section(m: ServerMetrics | None) -> RenderableType | None:
    """The server's own metrics over the window (deltas of its counters and histograms, gauges at the end)."""
    if m is None:
        return None
    if m.unavailable:
        return Panel(_na(m.unavailable), title="Server metrics", title_align="left")
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("window", f"{m.window_s:.1f} s, {m.url}")
    t.add_row("requests", f"{_f(m.requests, '.0f')} finished, {_f(m.output_tokens, '.0f')} output tokens")
    if m.batches:
        t.add_row("batches", ", ".join(f"{k} {v:.0f} x {m.batch_execution_ms_mean.get(k, float('nan')):.2f} ms" for k, v in sorted(m.batches.items()))
                  + "  (CE = prefill, TG = decode; mean execution time)")
    t.add_row("batch size", f"mean {_f(m.batch_size_mean, '.2f')} requests")
    t.add_row("latency", f"TTFT mean {_f(m.ttft_ms_mean, '.2f', ' ms')}, ITL mean {_f(m.itl_ms_mean, '.2f', ' ms')} (server side)")
    t.add_row("queue", f"{_f(m.requests_queued, '.0f')} queued, {_f(m.requests_running, '.0f')} running at the end")
    t.add_row("KV cache", f"{_f(m.kv_cache_used_pct, '.1f', '%')} used (blocks {_f(m.kv_blocks_used, '.0f')} / {_f(m.kv_blocks_total, '.0f')}), "
              f"preemptions {_f(m.preemptions, '.0f') if m.preemptions is not None else '0 (none recorded)'}")
    if m.missing:
        t.add_row("not exported", Text(", ".join(m.missing), style="dim"))
    return Panel(t, title="Server metrics (its /metrics, over the window)", title_align="left")


def tracer_cost_line(report: Report) -> RenderableType | None:
    """serve kernels mode: the recorder's cost against the untraced reference window of the same server."""
    c = report.tracer_cost
    if c is None:
        return None
    step = ""
    if c.reference_decode_step_ms and c.traced_decode_step_ms:
        step = f"; server decode step {c.traced_decode_step_ms:.3f} vs {c.reference_decode_step_ms:.3f} ms ({c.decode_step_change_pct:+.1f} %)"
    ratio = f" ({c.throughput_ratio:.3f})" if c.throughput_ratio is not None else ""
    return Text(f"recorder cost, against an untraced window of this server (concurrency {c.concurrency}): {c.traced_tok_s:.1f} vs "
                f"{c.reference_tok_s:.1f} tok/s{ratio}{step}")


def load_levels_section(levels: list[LoadLevel], slo: dict[str, float], width: int = DEFAULT_WIDTH) -> RenderableType | None:
    if not levels:
        return None
    cols = [Col("concurrency"), Col("requests"), Col("output tok/s"), Col("TTFT p50 ms"), Col("TTFT p90 ms"), Col("TTFT p99 ms"),
            Col("ITL p50 ms"), Col("ITL p90 ms"), Col("ITL p99 ms"), Col("goodput req/s"), Col("batch size"), Col("CE batch ms"),
            Col("TG batch ms"), Col("KV %"), Col("GPU util %")]
    rows = []
    for lv in levels:
        m = lv.server if lv.server is not None and not lv.server.unavailable else None
        rows.append([str(lv.concurrency), str(lv.completed), _f(lv.output_tok_per_s, ".1f"), _f(lv.ttft_ms.p50, ".1f"), _f(lv.ttft_ms.p90, ".1f"),
                     _f(lv.ttft_ms.p99, ".1f"), _f(lv.itl_ms.p50, ".2f"), _f(lv.itl_ms.p90, ".2f"), _f(lv.itl_ms.p99, ".2f"), _f(lv.goodput_rps, ".2f"),
                     _f(m.batch_size_mean if m else None, ".2f"), _f(m.batch_execution_ms_mean.get("CE") if m else None, ".2f"),
                     _f(m.batch_execution_ms_mean.get("TG") if m else None, ".2f"), _f(m.kv_cache_used_pct if m else None, ".1f"),
                     _f(lv.gpu_utilization_pct, ".1f")])
    note = Text("goodput: completed requests/s meeting " + (", ".join(f"{k} <= {v:g} ms" for k, v in slo.items()) if slo else "no SLO (pass --slo ttft=MS,itl=MS)")
                + "; batch size, batch times and KV use from the server's metrics", style="dim")
    return Panel(Group(*fitted_tables(cols, rows, width - INNER), note), title="Load sweep", title_align="left")


def utilization_section(report: Report, width: int = DEFAULT_WIDTH) -> RenderableType:
    u = report.utilization
    if isinstance(u, Unavailable) or u is None:
        return Panel(_na(u.reason if u else "not measured"), title="GPU utilization", title_align="left")
    assert isinstance(u, UtilizationSection)
    cols = [Col("gpu", numeric=False), Col("samples"), Col("util peak %"), Col("util mean %"), Col("SM activity %"), Col("mem peak"),
            Col("mem % total"), Col("SM clock mean/max MHz"), Col("HW throttle", numeric=False)]
    rows = []
    for g in u.gpus:
        mem = f"{g.peak_memory_bytes / 2**30:.2f} GiB" if g.peak_memory_bytes is not None else "n/a"
        rows.append([g.gpu, str(g.samples), _f(g.peak_utilization_pct, ".0f"), _f(g.mean_utilization_pct, ".1f"), _f(g.mean_sm_activity_pct, ".1f"), mem,
                     _f(g.peak_memory_pct, ".1f"), f"{_f(g.mean_sm_clock_mhz, '.0f')}/{_f(g.max_sm_clock_mhz, 'd')}", ", ".join(g.hardware_throttle_reasons) or "none"])
    tables = fitted_tables(cols, rows, width - INNER)
    parts = [Text(f"{g.gpu} partitions (XCP) mean activity %: " + " / ".join(f"{v:.0f}" for v in g.mean_partition_activity_pct))
             for g in u.gpus if g.mean_partition_activity_pct]
    note = Text(f"{u.source}, every {u.interval_s:g} s; NVML utilization = time some kernel ran, not how much of the GPU it used", style="dim")
    return Panel(Group(*tables, *parts, note), title="GPU utilization (steps' window)", title_align="left")


def _family_tables(rows: list[FamilyRow], title: str, width: int, unit: str) -> list[Table]:
    cols = [Col("family", numeric=False), Col(unit), Col("ms"), Col("share %")]
    return fitted_tables(cols, [[r.family, str(r.kernels), _f(r.total_ms, ".3f"), _f(r.share_pct, ".1f")] for r in rows], width, title=title)


def _kernel_tables(rows: list[KernelRow], title: str, width: int, unit: str) -> list[Table]:
    cols = [Col(unit.rstrip("s"), numeric=False, wrap=True), Col("family", numeric=False), Col("count"), Col("ms"), Col("mean µs"), Col("share %")]
    return fitted_tables(cols, [[r.name[:160], r.family, str(r.count), _f(r.total_ms, ".3f"), _f(r.mean_us, ".2f"), _f(r.share_pct, ".1f")] for r in rows],
                         width, title=title)


def kernels_section(report: Report, width: int = DEFAULT_WIDTH) -> RenderableType | None:
    k = report.kernels
    if k is None:
        return None
    if isinstance(k, Unavailable):
        return Panel(_na(k.reason), title="Kernels", title_align="left")
    assert isinstance(k, KernelBreakdown)
    inner = width - INNER
    ops = k.source.startswith("nvtx-log")
    unit = "ops" if ops else "kernels"  # MAX's op ranges on the host clock are not GPU kernels: the columns say so
    head = (f"{k.kernels} {'MAX ops' if ops else 'kernels'}, {k.kernel_ms:.3f} ms of {'op time (host clock)' if ops else 'kernel time'}, source {k.source}; "
            f"steps from {k.step_source}, attribution by {k.attribution}")
    if k.gpu_busy_pct is not None:
        what = "MAX ops cover" if ops else "GPU busy"
        head += (f"; {what} {k.gpu_busy_pct:.1f}% of the {_f(k.recorded_ms, '.3f')} ms recorded in slices of the {_f(k.window_ms, '.3f')} ms window"
                 if k.recorded_ms is not None else f"; {what} {k.gpu_busy_pct:.1f}% of the {_f(k.window_ms, '.3f')} ms window")
        if ops:
            head += f" (the other {100 - k.gpu_busy_pct:.1f}% is host time between ops: Python, scheduling, sampling)"
    if k.unattributed_kernels and k.step_source != "none":
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
        head += (f"; the GPU waited for work {w.waited_pct:.1f}% {scope} in {w.gaps} gaps of {w.min_gap_us / 1e3:g}-{w.max_gap_ms:g} ms "
                 f"({w.before_graph_gaps} before device-graph kernels)")
    parts: list[RenderableType] = [Text(head)]
    if k.unreliable:
        parts.append(Text(f"UNRELIABLE: {k.unreliable}", style="bold yellow"))
    if k.phases:
        busy = "ops cover %" if ops else "GPU busy %"
        cols = [Col("phase", numeric=False), Col("steps"), Col(unit), Col(f"{'op' if ops else 'kernel'} ms"), Col("wall ms"), Col(busy),
                Col(f"{unit} /step"), Col(f"{'op' if ops else 'kernel'} ms /step"), Col("µs /token")]
        rows = [[p.phase, str(p.steps), str(p.kernels), _f(p.kernel_ms, ".3f"), _f(p.wall_ms, ".3f"), _f(p.gpu_busy_pct, ".1f"), _f(p.kernels_per_step, ".1f"),
                 _f(p.kernel_ms_per_step, ".4f"), _f(p.kernel_us_per_token, ".2f")] for p in k.phases]
        parts += fitted_tables(cols, rows, inner)
    if k.per_device:
        cols = [Col("device"), Col("kernels"), Col("kernel ms"), Col("GPU busy %"), Col("collective ms /decode step"), Col("collective % of decode"),
                Col("top families", numeric=False, wrap=True)]
        rows = [[str(d.device), str(d.kernels), _f(d.kernel_ms, ".3f"), _f(d.gpu_busy_pct, ".1f"), _f(d.collective_ms_per_decode_step, ".4f"),
                 _f(d.collective_share_of_decode_pct, ".1f"), ", ".join(f.family for f in d.families[:3])] for d in k.per_device]
        parts += fitted_tables(cols, rows, inner, title="Per device")
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
    head = Text(f"batch {c.batch}, context {c.context_tokens:.0f} tokens (summed over the batch); per step: weights {c.weight_bytes / 1e9:.3f} GB, "
                f"KV cache {c.kv_bytes / 1e9:.4f} GB, {c.flops / 1e9:.1f} GFLOP ({c.operand} operands); peaks: "
                f"{_f(c.peak_bandwidth_GBps, '.0f', ' GB/s')}, {_f(c.peak_TFLOPs, '.0f', ' TFLOP/s')} ({c.gpu or 'GPU unknown'})")
    cols = [Col("part", numeric=False), Col("ms /step"), Col("GB /step"), Col("GB/s"), Col("% of peak BW"), Col("TFLOP/s"), Col("% of peak compute")]
    rows = [[r.family, _f(r.ms_per_step, ".4f"), _f(r.bytes_per_step / 1e9, ".4f"), _f(r.achieved_GBps, ".1f"), _f(r.pct_of_peak_bandwidth, ".1f"),
             _f(r.achieved_TFLOPs, ".2f"), _f(r.pct_of_peak_compute, ".1f")] for r in [c.step, *([c.kernels] if c.kernels else []), *c.families]]
    note = Text(f"weights counted from {c.weights_basis}", style="dim")
    return Panel(Group(head, *fitted_tables(cols, rows, width - INNER), note), title="Decode step against the roofline", title_align="left")


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
        t.add_row("duration", _f(a.duration_ns / 1e3 if a.duration_ns is not None else None, ".2f", " µs"))
        t.add_row("SOL", f"compute {_f(a.compute_throughput_pct, '.1f', '%')}, memory {_f(a.memory_throughput_pct, '.1f', '%')}, DRAM {_f(a.dram_throughput_pct, '.1f', '%')}")
        t.add_row("DRAM", _f(a.dram_bytes_per_s / 1e9 if a.dram_bytes_per_s else None, ".1f", " GB/s"))
        t.add_row("occupancy", f"achieved {_f(a.achieved_occupancy_pct, '.1f', '%')} of theoretical {_f(a.theoretical_occupancy_pct, '.1f', '%')}, limiter {a.occupancy_limiter or 'n/a'}, {_f(a.registers_per_thread, '.0f')} regs/thread")
        if a.achieved_flop_per_s is not None:
            t.add_row("roofline", f"{a.achieved_flop_per_s / 1e12:.2f} TFLOP/s, intensity {_f(a.arithmetic_intensity, '.2f')} FLOP/byte")
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
        parts.append(Text(f"{r.spec}  (MAX {r.max_version or '?'}, {r.duration_s:.1f} s)  architectures: {', '.join(r.architectures) or 'none'}", style="bold"))
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
        return Panel(_na(lg.reason), title="Step ledger", title_align="left") if report.steps or isinstance(report.kernels, KernelBreakdown) else None
    parts: list[RenderableType] = []
    roofs = (f"; ideal = the roofline at {lg.attainable_bandwidth_pct:g} % of peak bandwidth"
             + (f" / {lg.attainable_compute_pct:g} % of peak compute" if lg.attainable_compute_pct else "") if lg.attainable_bandwidth_pct else "")
    parts.append(Text(f"from the {lg.source}{roofs}; recoverable = actual - ideal (idle: all of it)", style="dim"))
    cols = [Col("part", numeric=False, wrap=True), Col("ms/step"), Col("% of step"), Col("ideal ms"), Col("recoverable ms"), Col("kernels/step")]
    on_gpu = lg.source == "kernel timeline" and not (isinstance(report.kernels, KernelBreakdown) and report.kernels.source.startswith("nvtx-log"))
    for p in lg.phases:
        head = Text(f"{p.phase}: {p.steps} step{'s' if p.steps != 1 else ''} of {p.step_ms:.3f} ms", style="bold")
        extra = [f"host step p50 {p.host_step_p50_ms:.3f} ms" if p.host_step_p50_ms is not None else "", f"batch {p.batch}" if p.batch else "",
                 f"GPU busy {p.busy_pct:.1f} %" if on_gpu else "",
                 f"{p.recoverable_ms_per_step:.3f} ms per step recoverable" if p.recoverable_ms_per_step else ""]
        head.append("  " + ", ".join(x for x in extra if x), style="dim")
        rows = [[r.part, f"{r.ms_per_step:.3f}", f"{r.share_pct:.1f}", _f(r.ideal_ms_per_step, ".3f", "") if r.ideal_ms_per_step is not None else "-",
                 _f(r.recoverable_ms_per_step, ".3f") if r.recoverable_ms_per_step is not None else "-",
                 _f(r.kernels_per_step, ".1f") if r.kernels_per_step is not None else ""] for r in p.rows]
        parts += [head, *fitted_tables(cols, rows, width - INNER)]
    outside = Text(f"outside steps: {lg.outside_steps_ms:.2f} ms ({lg.outside_steps_pct:.1f} % of the {lg.window_ms:.1f} ms observed)")
    if lg.outside_kernels_ms:
        outside.append(f", {lg.outside_kernels_ms:.2f} ms of it kernels launched between steps")
    if lg.requests_in_flight_pct is not None:
        outside.append(f"; requests in flight {lg.requests_in_flight_pct:.0f} % of the window"
                       + (f", {lg.request_rate_rps:.2f} requests/s" if lg.request_rate_rps is not None else ""))
    parts.append(outside)
    parts += [Text(n, style="dim") for n in lg.notes]
    return Panel(Group(*parts), title="Step ledger", title_align="left")


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
            parts.append(Text(f"    buys: {f.lever.ms_per_step:.3f} ms {where} ({f.lever.pct_of_step:.1f} %), {f.lever.total_ms:.1f} ms over the capture",
                              style="bold"))
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
    return any((report.steps, report.step_summary is not None, report.utilization is not None, report.kernels is not None,
                report.kernel_analyses, report.serve is not None, report.preflight, report.findings, report.startup is not None))


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
    span = "from launch to /health 200 (from the server's log)" if st.source.startswith("max serve") else "from process start to the first token"
    head = Text(f"{st.total_s:.1f} s {span}; compile cache {st.cache_reason}")
    if st.max_logged_compile_s is not None:
        head.append(f"\nMAX logged {st.max_logged_compile_s:.1f} s of compiling; the engine timed {_f(st.engine_compile_s, '.1f', ' s')}"
                    + (f"; cache folder {st.cache_dir}" if st.cache_dir else ""))
    cols = [Col("phase", numeric=False, wrap=True), Col("s"), Col("%"), Col("cache", numeric=False), Col("bytes"), Col("GB/s")]
    rows = [[p.name, f"{p.seconds:.2f}", f"{100 * p.seconds / st.total_s:.1f}" if st.total_s > 0 else "n/a", p.cache or "",
             size_text(p.bytes), _f(p.gb_per_s, ".2f") if p.gb_per_s else ""] for p in st.phases if p.seconds >= 0.005 or p.bytes]
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
    # two readings of one thing (the kernel's idle counter, the processes' CPU times): the larger is said, never one below the other
    busy = max(load.cpu_busy_pct or 0.0, min(100.0, 100.0 * (load.own_cores + load.other_cores) / load.cores)) if load.cores else load.cpu_busy_pct
    return Text(f"host CPU over the window: {_f(busy, '.0f', '%')} busy of {load.cores} cores; this process tree {load.own_cores:.2f} cores, "
                f"other processes {load.other_cores:.2f}" + (f" ({others})" if others else ""), style="dim")


def render_renderables(report: Report, width: int = DEFAULT_WIDTH) -> list[RenderableType]:
    measured = measured_anything(report)
    sections: list[RenderableType | None] = [
        environment_section(report),
        preflight_section(report.preflight),
        ledger_section(report, width),
        findings_section(report) if measured else None,
        startup_section(report.startup, width),
        serve_section(report),
        server_metrics_section(report.server_metrics),
        tracer_cost_line(report),
        load_levels_section(report.load_levels, report.slo_ms, width),
        steps_section(report, width) if report.steps or report.step_summary is not None else None,
        utilization_section(report, width) if report.utilization is not None or (measured and report.serve is None and report.steps) else None,
        kernels_section(report, width),
        decode_cost_section(report.decode_cost, width) if report.environment.vendor != "none" else None,  # no peaks on a CPU: no roofline box
        analyses_section(report.kernel_analyses),
        host_load_line(report),
    ]
    if report.notes:
        sections.append(Panel(Text("\n".join(report.notes), style="dim"), title="Notes", title_align="left"))
    if report.artifacts:
        sections.append(Panel(Text("\n".join(report.artifacts)), title="Artifacts", title_align="left"))
    return [s for s in sections if s is not None]


def terminal_width() -> int:
    """The terminal's width (``COLUMNS`` first, as the CLI's console reads it), DEFAULT_WIDTH where there is none; never
    under 80 (every table fits 80 columns)."""
    import shutil

    return max(shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns, 80)


def fit_to_terminal(text: str, width: int | None = None, indent: str = "    ") -> str:
    """``text`` with each line wrapped at the terminal's width (or ``width``); continuations indented by ``indent``. Words
    are never cut, so a figure or a name longer than the width stays whole on its own line."""
    import textwrap

    width = width or terminal_width()
    return "\n".join(
        textwrap.fill(line, width=width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False) if len(line) > width else line
        for line in text.splitlines()
    )


def render_text(report: Report, width: int | None = None, color: bool = False) -> str:
    """The report as text, ``width`` columns wide (default: the terminal's, as the CLI prints it)."""
    width = width or terminal_width()
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, color_system="auto" if color else None, highlight=False)
    for r in render_renderables(report, width):
        console.print(r)
    return buf.getvalue()


def print_report(report: Report, console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    for r in render_renderables(report, console.width):
        console.print(r)


def diff_renderables(result: DiffResult, width: int = DEFAULT_WIDTH) -> list[RenderableType]:
    """A diff: comparability, the verdict lines, and every compared metric."""
    parts: list[RenderableType] = []
    head = Text(f"A = {result.a}\nB = {result.b}\n")
    if result.reasons:
        head.append(("not comparable" if not result.forced else "not comparable (compared anyway: --force)") + ":\n", style="bold yellow")
        for r in result.reasons:
            head.append(f"  - {r}\n", style="yellow")
    parts.append(head)
    if result.lines:
        cols = [Col("metric", numeric=False, wrap=True), Col("A"), Col("B"), Col("delta"), Col("delta %"), Col("test", numeric=False), Col("samples A/B")]
        rows = [[line.metric[:120], f"{line.a:.4g} {line.unit}", f"{line.b:.4g} {line.unit}", f"{line.delta:+.4g} {line.unit}", _f(line.delta_pct, "+.1f"),
                 "no test" if line.p_value is None else f"p={line.p_value:.2g}", f"{line.samples[0]}/{line.samples[1]}"] for line in result.lines]
        parts += fitted_tables(cols, rows, width - INNER)
    return [Panel(Group(*parts), title=f"max-profile diff (regression threshold {result.fail_above_pct:g} %)", title_align="left")]


def print_diff(result: DiffResult, console: Console | None = None) -> None:
    """The comparison, then one verdict each (``REGRESSION: ...`` starts a line, what a CI log is searched for), wrapped at
    the console's width without cutting a figure."""
    console = console or Console(highlight=False)
    for r in diff_renderables(result, console.width):
        console.print(r)
    for v in result.verdicts:
        console.print(Text(fit_to_terminal(v, console.width, indent="  "), style="bold red" if v.startswith("REGRESSION") else ""), soft_wrap=True)
