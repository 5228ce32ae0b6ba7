"""Text rendering of a :class:`Report` with ``rich`` (terminal tables; plain text when piped)."""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from max_profile.analyze.diff import DiffResult
from max_profile.model import (
    FamilyRow,
    KernelAnalysis,
    KernelBreakdown,
    KernelRow,
    PreflightResult,
    Report,
    StepSummary,
    Unavailable,
    UtilizationSection,
)

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


def steps_section(report: Report) -> RenderableType:
    s = report.step_summary
    if isinstance(s, Unavailable):
        return Panel(_na(s.reason), title="Steps", title_align="left")
    if not isinstance(s, StepSummary):
        return Panel(_na("no steps recorded"), title="Steps", title_align="left")
    t = Table(box=None)
    for col in ("phase", "steps", "p50 ms", "p90 ms", "max ms", "total ms", "tokens"):
        t.add_column(col, justify="right" if col != "phase" else "left")
    for p in s.phases:
        t.add_row(p.phase, str(p.steps), _f(p.p50_ms, ".3f"), _f(p.p90_ms, ".3f"), _f(p.max_ms, ".3f"), _f(p.total_ms, ".1f"), str(p.tokens))
    head = Text(f"TTFT {_f(s.ttft_ms, '.2f', ' ms')}   decode {_f(s.decode_tokens_per_s, '.1f', ' tok/s')}   steps {s.steps}"
                + (f"   (from {s.source})" if s.source != "host steps" else ""))
    if s.decode_step_growth_ms_per_100_ctx is not None:
        head.append(f"   decode step growth {s.decode_step_growth_ms_per_100_ctx:+.4f} ms / 100 ctx tokens")
    return Panel(Group(head, t), title="Steps (host)" if s.source == "host steps" else "Steps", title_align="left")


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
    for cmd in s.commands:
        t.add_row("server", Text(" ".join(cmd), style="dim"))
    if s.first_error:
        t.add_row("first error", Text(s.first_error[:200], style="yellow"))
    if s.server_log:
        t.add_row("log", s.server_log)
    return Panel(t, title="max serve (concurrency 1)", title_align="left")


def utilization_section(report: Report) -> RenderableType:
    u = report.utilization
    if isinstance(u, Unavailable) or u is None:
        return Panel(_na(u.reason if u else "not measured"), title="GPU utilization", title_align="left")
    assert isinstance(u, UtilizationSection)
    t = Table(box=None)
    for col in ("gpu", "samples", "util peak %", "util mean %", "SM activity %", "mem peak", "mem % total", "SM clock mean/max MHz", "HW throttle"):
        t.add_column(col, justify="right" if col not in ("gpu", "HW throttle") else "left")
    for g in u.gpus:
        mem = f"{g.peak_memory_bytes / 2**30:.2f} GiB" if g.peak_memory_bytes is not None else "n/a"
        t.add_row(
            g.gpu,
            str(g.samples),
            _f(g.peak_utilization_pct, ".0f"),
            _f(g.mean_utilization_pct, ".1f"),
            _f(g.mean_sm_activity_pct, ".1f"),
            mem,
            _f(g.peak_memory_pct, ".1f"),
            f"{_f(g.mean_sm_clock_mhz, '.0f')}/{_f(g.max_sm_clock_mhz, 'd')}",
            ", ".join(g.hardware_throttle_reasons) or "none",
        )
    parts = [Text(f"{g.gpu} partitions (XCP) mean activity %: " + " / ".join(f"{v:.0f}" for v in g.mean_partition_activity_pct))
             for g in u.gpus if g.mean_partition_activity_pct]
    note = Text(f"{u.source}, every {u.interval_s:g} s; NVML utilization = time some kernel ran, not how much of the GPU it used", style="dim")
    return Panel(Group(t, *parts, note), title="GPU utilization (steps' window)", title_align="left")


def _family_table(rows: list[FamilyRow], title: str) -> Table:
    t = Table(title=title, box=None, title_justify="left")
    for col in ("family", "kernels", "ms", "share %"):
        t.add_column(col, justify="left" if col == "family" else "right")
    for r in rows:
        t.add_row(r.family, str(r.kernels), _f(r.total_ms, ".3f"), _f(r.share_pct, ".1f"))
    return t


def _kernel_table(rows: list[KernelRow], title: str) -> Table:
    t = Table(title=title, box=None, title_justify="left")
    for col in ("kernel", "family", "count", "ms", "mean µs", "share %"):
        t.add_column(col, justify="left" if col in ("kernel", "family") else "right", overflow="fold")
    for r in rows:
        t.add_row(r.name[:90], r.family, str(r.count), _f(r.total_ms, ".3f"), _f(r.mean_us, ".2f"), _f(r.share_pct, ".1f"))
    return t


def kernels_section(report: Report) -> RenderableType | None:
    k = report.kernels
    if k is None:
        return None
    if isinstance(k, Unavailable):
        return Panel(_na(k.reason), title="Kernels", title_align="left")
    assert isinstance(k, KernelBreakdown)
    head = (f"{k.kernels} kernels, {k.kernel_ms:.3f} ms of kernel time, source {k.source}; steps from {k.step_source}, attribution by {k.attribution}")
    if k.gpu_busy_pct is not None:
        what = "MAX ops (host time) cover" if k.source.startswith("nvtx-log") else "GPU busy"
        head += f"; {what} {k.gpu_busy_pct:.1f}% of the {_f(k.window_ms, '.3f')} ms window"
    if k.unattributed_kernels and k.step_source != "none":
        head += f"; {k.unattributed_kernels} kernels outside every step"
    if k.invalid_kernels:
        head += f"; {k.invalid_kernels} records with invalid timestamps dropped"
    if k.tracer_overhead_pct is not None:
        head += f"; tracer callbacks {k.tracer_overhead_pct:.1f}% of the window"
    parts: list[RenderableType] = [Text(head)]
    if k.unreliable:
        parts.append(Text(f"UNRELIABLE: {k.unreliable}", style="bold yellow"))
    if k.phases:
        pt = Table(box=None)
        for col in ("phase", "steps", "kernels", "kernel ms", "wall ms", "GPU busy %", "kernels/step", "kernel ms/step", "kernel µs/token"):
            pt.add_column(col, justify="left" if col == "phase" else "right")
        for p in k.phases:
            pt.add_row(p.phase, str(p.steps), str(p.kernels), _f(p.kernel_ms, ".3f"), _f(p.wall_ms, ".3f"), _f(p.gpu_busy_pct, ".1f"),
                       _f(p.kernels_per_step, ".1f"), _f(p.kernel_ms_per_step, ".4f"), _f(p.kernel_us_per_token, ".2f"))
        parts.append(pt)
    if k.per_device:
        dt = Table(title="Per device", box=None, title_justify="left")
        for col in ("device", "kernels", "kernel ms", "GPU busy %", "collective ms/decode step", "collective % of decode", "top families"):
            dt.add_column(col, justify="left" if col in ("device", "top families") else "right")
        for d in k.per_device:
            dt.add_row(str(d.device), str(d.kernels), _f(d.kernel_ms, ".3f"), _f(d.gpu_busy_pct, ".1f"), _f(d.collective_ms_per_decode_step, ".4f"),
                       _f(d.collective_share_of_decode_pct, ".1f"), ", ".join(f.family for f in d.families[:3]))
        parts.append(dt)
    parts.append(_family_table(k.families, "Families (all phases)"))
    for p in k.phases:
        parts.append(_family_table(p.families, f"Families — {p.phase}"))
    parts.append(_kernel_table(k.top_kernels, "Top kernels (all phases)"))
    for p in k.phases:
        if p.phase == "decode":
            parts.append(_kernel_table(p.top_kernels, "Top kernels — decode"))
    if k.unknown_kernel_names:
        parts.append(Text("unclassified (family 'other'): " + ", ".join(k.unknown_kernel_names[:10]), style="dim"))
    return Panel(Group(*parts), title="Where the time goes", title_align="left")


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


def findings_section(report: Report) -> RenderableType:
    parts: list[RenderableType] = []
    if not report.findings:
        parts.append(Text("no findings", style="dim"))
    for f in report.findings:
        line = Text(f"[{f.severity}] ", style=_SEV_STYLE[f.severity])
        line.append(f"{f.title}", style="bold")
        line.append(f"  ({f.id}, confidence {f.confidence:.0%})", style="dim")
        parts.append(line)
        ev = ", ".join(f"{k}={v}" for k, v in f.evidence.items())
        parts.append(Text(f"    evidence: {ev}", style="dim"))
        if f.next_step:
            parts.append(Text(f"    next: {f.next_step}"))
    verdict = Text("Next measurement: ", style="bold")
    verdict.append(report.next_measurement or "none — the question is answered at this level")
    parts.append(verdict)
    return Panel(Group(*parts), title="Findings", title_align="left")


def measured_anything(report: Report) -> bool:
    """Whether the report holds measurements (``doctor`` holds only the environment)."""
    return any((report.steps, report.step_summary is not None, report.utilization is not None, report.kernels is not None,
                report.kernel_analyses, report.serve is not None, report.preflight, report.findings))


def render_renderables(report: Report) -> list[RenderableType]:
    measured = measured_anything(report)
    sections: list[RenderableType | None] = [
        environment_section(report),
        preflight_section(report.preflight),
        serve_section(report),
        steps_section(report) if report.steps or report.step_summary is not None else None,
        utilization_section(report) if report.utilization is not None or (measured and report.serve is None and report.steps) else None,
        kernels_section(report),
        analyses_section(report.kernel_analyses),
        findings_section(report) if measured else None,
    ]
    if report.notes:
        sections.append(Panel(Text("\n".join(report.notes), style="dim"), title="Notes", title_align="left"))
    if report.artifacts:
        sections.append(Panel(Text("\n".join(report.artifacts)), title="Artifacts", title_align="left"))
    return [s for s in sections if s is not None]


def render_text(report: Report, width: int = 120, color: bool = False) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, color_system="auto" if color else None, highlight=False)
    for r in render_renderables(report):
        console.print(r)
    return buf.getvalue()


def print_report(report: Report, console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    for r in render_renderables(report):
        console.print(r)


def diff_renderables(result: DiffResult) -> list[RenderableType]:
    """A diff: comparability, the verdict lines, and every compared metric."""
    parts: list[RenderableType] = []
    head = Text(f"A = {result.a}\nB = {result.b}\n")
    if result.reasons:
        head.append(("not comparable" if not result.forced else "not comparable (compared anyway: --force)") + ":\n", style="bold yellow")
        for r in result.reasons:
            head.append(f"  - {r}\n", style="yellow")
    parts.append(head)
    if result.lines:
        t = Table(box=None)
        for col in ("metric", "A", "B", "delta", "delta %", "test", "samples"):
            t.add_column(col, justify="left" if col in ("metric", "test") else "right", overflow="fold")
        for line in result.lines:
            style = "bold red" if line.regression else "green" if line.significant and line.delta < 0 else ""
            t.add_row(Text(line.metric[:80], style=style), f"{line.a:.4g}", f"{line.b:.4g}", f"{line.delta:+.4g} {line.unit}",
                      _f(line.delta_pct, "+.1f"), "no test" if line.p_value is None else f"p={line.p_value:.2g}", f"{line.samples[0]}/{line.samples[1]}")
        parts.append(t)
    return [Panel(Group(*parts), title=f"max-profile diff (regression threshold {result.fail_above_pct:g} %)", title_align="left")]


def print_diff(result: DiffResult, console: Console | None = None) -> None:
    """The comparison, then one unwrapped line per verdict (what a CI log is searched for)."""
    console = console or Console(highlight=False)
    for r in diff_renderables(result):
        console.print(r)
    for v in result.verdicts:
        console.print(Text(v, style="bold red" if v.startswith("REGRESSION") else ""), soft_wrap=True)
