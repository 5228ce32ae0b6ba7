"""One self-contained HTML file per report: verdict cards and interactive plots, working offline.

Plots are Bokeh models; BokehJS (core, widgets, tables: about 2 MB) is inlined, so the file makes no
network request and opens in any browser. Everything plotted is aggregated first (per step, per
family, per phase, histograms), so a million-kernel capture gives a page of the same size as a small one.

Sections: verdicts (each finding with its evidence and next step), steps (host step time against
context length, prefill and decode coloured: a rising line is a KV cache not used), utilization
(GPU use, memory and SM clock over time with the steps shaded), families (share per phase, and
per step as a heat map), top kernels (a sortable table), Nsight Compute (speed-of-light bars, warp
stalls, occupancy) and serve (TTFT and inter-token latency histograms).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from max_profile.analyze.account import paired_steps
from max_profile.model import (
    FamilyRow,
    KernelAnalysis,
    KernelBreakdown,
    Report,
    StepSummary,
    Unavailable,
    UtilizationSection,
)
from max_profile.model.command_text import say
from max_profile.model.tags import LedgerSource
from max_profile.render.html_base import CSS, HEATMAP_COLUMNS, PHASE_COLORS, SEVERITY_COLORS, esc, na, new_figure, thin
from max_profile.render.tables import (
    OP_COLUMNS,
    OP_ROOF_COLUMNS,
    decode_context_text,
    kv_text,
    op_coverage_text,
    op_figures,
    op_phase_heading,
    op_roof_figures,
    steps_text,
)
from max_profile.render.verdict_text import no_next_reason

SECTIONS = (
    "verdicts",  # first: the top verdict, what fixing it buys and its command on the first screen
    "summary",
    "ledger",
    "startup",
    "steps",
    "utilization",
    "families",
    "kernels",
    "ops",
    "roofline",
    "ncu",
    "serve",
    "server",
    "replicas",
    "sweep",
)


# ---------------------------------------------------------------------------------------------
def _verdicts(report: Report) -> str:
    cards = []
    for f in report.findings:
        rows = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in f.evidence.items())
        color = SEVERITY_COLORS.get(f.severity, "#999")
        nxt = f'<div class="next"><b>next:</b> {esc(f.next_step)}</div>' if f.next_step else ""
        if f.lever is not None:
            where = f.lever.phase if f.lever.phase == "outside steps" else f"per {f.lever.phase} step"
            nxt = (
                f'<div class="next"><b>buys:</b> {f.lever.ms_per_step:.3f} ms {esc(where)} ({f.lever.pct_of_step:.1f} '
                "%), "
                f"{f.lever.total_ms:.1f} ms over the capture</div>"
            ) + nxt
        if f.command is not None:
            nxt += f'<div class="next"><b>run:</b> <code>{esc(say(f.command, report.capture.interface))}</code></div>'
        cards.append(
            f'<div class="card finding" style="border-left-color:{color}"><span class="sev" '
            f'style="color:{color}">{esc(f.severity)}</span>'
            f' <span class="meta">{esc(f.id)}, confidence '
            f"{f.confidence:.0%}</span><h3>{esc(f.title)}</h3><table>{rows}</table>{nxt}</div>"
        )
    body = f'<div class="cards">{"".join(cards)}</div>' if cards else '<p class="na">no findings</p>'
    nm = report.next_measurement or no_next_reason(report)
    return body + f'<p class="next-measurement"><b>Next measurement:</b> <code>{esc(nm)}</code></p>'


def _steps_plot(report: Report) -> Any | str:
    from bokeh.models import ColumnDataSource

    steps = sorted((s for s in report.steps if s.batch_size > 0), key=lambda s: s.start_ns)
    if not steps:
        return na(report.step_summary.reason if isinstance(report.step_summary, Unavailable) else "no steps recorded")
    seq = [s.sequence_tokens for s in steps]
    by_seq = all(v is not None for v in seq)
    x = np.array([v if by_seq else s.index for v, s in zip(seq, steps, strict=True)], dtype=float)
    ms = np.array([s.duration_ns / 1e6 for s in steps])
    k = report.kernels
    kernel_ms: np.ndarray | None = None
    pairs = [pair for phase in ("prefill", "mixed", "decode", "unknown") for pair in paired_steps(report, phase)]
    if isinstance(k, KernelBreakdown) and pairs:  # the steps recorded whole (a sampled recording: a share of them)
        recorded = {st.start_ns: row.kernel_ms for st, row in pairs}
        kernel_ms = np.array([recorded.get(s.start_ns, np.nan) for s in steps])
    source = isinstance(report.step_summary, StepSummary) and report.step_summary.source or "host steps"
    fig = new_figure(
        f"Step time per step ({source}) against {'sequence length (context + fed tokens)' if by_seq else 'step index'}"
        " — a line rising with the sequence is a KV cache not used",
        x_axis_label="tokens in the sequence" if by_seq else "step",
        y_axis_label="ms",
    )
    idx = thin(len(steps))
    for phase in ("prefill", "mixed", "decode", "unknown"):
        sel = [i for i in idx if steps[i].phase == phase]
        if not sel:
            continue
        data = {
            "x": x[sel],
            "ms": ms[sel],
            "step": [steps[i].index for i in sel],
            "fed": [steps[i].input_tokens for i in sel],
            "model": [steps[i].model_input_tokens if steps[i].model_input_tokens is not None else -1 for i in sel],
        }
        src = ColumnDataSource(data)
        fig.scatter("x", "ms", source=src, size=5, color=PHASE_COLORS[phase], legend_label=f"{phase} step time")
        if phase == "decode":
            fig.line("x", "ms", source=src, color=PHASE_COLORS[phase], alpha=0.5)
        shown = [i for i in sel if kernel_ms is not None and not np.isnan(kernel_ms[i])]
        if kernel_ms is not None and shown:
            fig.scatter(
                x[shown],
                kernel_ms[shown],
                size=4,
                marker="triangle",
                color=PHASE_COLORS[phase],
                alpha=0.6,
                legend_label=f"{phase} kernel time",
            )
    _legend_outside(fig)
    return fig


def _legend_outside(fig: Any) -> None:
    """The legend beside the plot, never over its data; clicking an entry hides its glyphs."""
    if fig.legend:
        fig.legend.click_policy = "hide"
        fig.add_layout(fig.legend[0], "right")


def _integer_counts(fig: Any) -> None:
    """Count axes tick at whole numbers only (no 0.5 requests)."""
    from bokeh.models import AdaptiveTicker

    fig.yaxis.ticker = AdaptiveTicker(min_interval=1, num_minor_ticks=0)


def _utilization_plots(report: Report) -> Any | str:
    from bokeh.layouts import column
    from bokeh.models import ColumnDataSource

    u = report.utilization
    if not isinstance(u, UtilizationSection) or not u.samples:
        return na(u.reason if isinstance(u, Unavailable) else "no GPU samples")
    t0 = min(s.t_ns for s in u.samples)
    figs = []
    shared = None
    steps = [s for s in report.steps if s.batch_size > 0]
    windows = {
        phase: [(s.start_ns - t0, s.end_ns - t0) for s in steps if s.phase == phase]
        for phase in ("prefill", "decode", "mixed")
    }
    for title, key, unit in (
        ("GPU utilization (time some kernel ran)", "utilization_pct", "%"),
        ("GPU memory used", "memory_used_bytes", "GiB"),
        ("SM clock", "sm_clock_mhz", "MHz"),
    ):
        kw: dict[str, Any] = {"height": 200, "x_axis_label": "seconds", "y_axis_label": unit}
        if shared is not None:
            kw["x_range"] = shared.x_range
        fig = new_figure(title, **kw)
        shared = shared or fig
        top = 100.0 if key == "utilization_pct" else None
        for gpu in sorted({s.gpu for s in u.samples}):
            sel = [s for s in u.samples if s.gpu == gpu and getattr(s, key) is not None]
            if not sel:
                continue
            ys = [float(getattr(s, key)) / (2**30 if key == "memory_used_bytes" else 1) for s in sel]
            top = max(top or 0.0, max(ys))
            fig.line([(s.t_ns - t0) / 1e9 for s in sel], ys, line_width=2, legend_label=gpu)
            if key == "utilization_pct":  # AMD partitioned GPUs (amdsmi): each compute partition's activity, dashed
                for i in range(max((len(s.partition_activity_pct) for s in sel), default=0)):
                    part = [s for s in sel if len(s.partition_activity_pct) > i]
                    fig.line(
                        [(s.t_ns - t0) / 1e9 for s in part],
                        [s.partition_activity_pct[i] for s in part],
                        line_width=1,
                        line_dash="dashed",
                        legend_label=f"{gpu} partition (XCP) {i}",
                    )
        for phase, spans in windows.items():
            if spans:
                shown = thin(len(spans), 2000)
                fig.quad(
                    source=ColumnDataSource(
                        {"left": [spans[i][0] / 1e9 for i in shown], "right": [spans[i][1] / 1e9 for i in shown]}
                    ),
                    left="left",
                    right="right",
                    bottom=0,
                    top=top or 1.0,
                    fill_color=PHASE_COLORS[phase],
                    fill_alpha=0.12,
                    line_alpha=0,
                    legend_label=f"{phase} steps",
                )
        _legend_outside(fig)
        figs.append(fig)
    return column(*figs, sizing_mode="stretch_width")


def _family_plots(k: KernelBreakdown | Unavailable | None) -> Any | str:
    from bokeh.layouts import column
    from bokeh.models import ColorBar, ColumnDataSource, LinearColorMapper
    from bokeh.palettes import Category20, Viridis256

    if not isinstance(k, KernelBreakdown):
        return na(k.reason if isinstance(k, Unavailable) else "no kernel trace")
    scopes: list[tuple[str, list[FamilyRow]]] = [(str(p.phase), p.families) for p in k.phases] or [
        ("whole capture", k.families)
    ]
    # every family the page shows anywhere (the per-step heat map too) gets a legend entry, in order of time
    in_steps = {f for p in k.per_step for f in p.families}
    families = sorted(
        {r.family for _, rows in scopes for r in rows} | in_steps,
        key=lambda f: -sum(r.total_ms for _, rows in scopes for r in rows if r.family == f),
    )
    palette = (Category20[20] * 2)[: max(len(families), 3)]
    data: dict[str, Any] = {"scope": [name for name, _ in scopes]}
    for fam in families:
        data[fam] = [next((r.share_pct for r in rows if r.family == fam), 0.0) for _, rows in scopes]
    bars = new_figure(
        "Kernel time by family, per phase (% of the phase's kernel time)",
        y_range=data["scope"],
        height=max(90 + 45 * len(scopes), 50 + 22 * len(families)),
        x_axis_label="% of kernel time",
    )  # tall enough for every legend entry
    bars.hbar_stack(
        families,
        y="scope",
        height=0.7,
        color=palette[: len(families)],
        source=ColumnDataSource(data),
        legend_label=families,
    )
    bars.legend.click_policy = "hide"
    bars.add_layout(bars.legend[0], "right")
    parts: list[Any] = [bars]
    if k.per_step:
        n = len(k.per_step)
        bucket = max(1, int(np.ceil(n / HEATMAP_COLUMNS)))
        fams = sorted(
            {f for p in k.per_step for f in p.families}, key=lambda f: -sum(p.families.get(f, 0.0) for p in k.per_step)
        )
        xs, ys, vals = [], [], []
        for b in range(0, n, bucket):
            chunk = k.per_step[b : b + bucket]
            for fam in fams:
                xs.append(b + bucket / 2)
                ys.append(fam)
                vals.append(float(np.mean([p.families.get(fam, 0.0) for p in chunk])))
        mapper = LinearColorMapper(palette=Viridis256, low=0.0, high=max(vals) if vals else 1.0)
        heat = new_figure(
            "Kernel time per step and family "
            f"(ms{', mean of ' + str(bucket) + ' steps per column' if bucket > 1 else ''})",
            y_range=list(reversed(fams)),
            height=60 + 24 * len(fams),
            x_axis_label="step",
        )
        heat.rect(
            x="x",
            y="y",
            width=bucket,
            height=1,
            source=ColumnDataSource({"x": xs, "y": ys, "ms": vals}),
            fill_color={"field": "ms", "transform": mapper},
            line_color=None,
        )
        heat.add_layout(ColorBar(color_mapper=mapper, title="ms"), "right")
        parts.append(heat)
    return column(*parts, sizing_mode="stretch_width")


def _kernel_table(k: KernelBreakdown | Unavailable | None) -> Any | str:
    from bokeh.models import ColumnDataSource, DataTable, NumberFormatter, TableColumn

    if not isinstance(k, KernelBreakdown):
        return na(k.reason if isinstance(k, Unavailable) else "no kernel trace")
    rows: dict[str, list[Any]] = {
        "phase": [],
        "name": [],
        "family": [],
        "count": [],
        "total_ms": [],
        "mean_us": [],
        "share_pct": [],
    }
    for phase, kernels in [("all", k.top_kernels)] + [(p.phase, p.top_kernels) for p in k.phases]:
        for r in kernels:
            for key, value in (
                ("phase", phase),
                ("name", r.name),
                ("family", r.family),
                ("count", r.count),
                ("total_ms", r.total_ms),
                ("mean_us", r.mean_us),
                ("share_pct", r.share_pct),
            ):
                rows[key].append(value)
    fmt = NumberFormatter(format="0,0.000")
    columns = [
        TableColumn(field="phase", title="phase", width=70),
        TableColumn(field="name", title="kernel", width=520),
        TableColumn(field="family", title="family", width=100),
        TableColumn(field="count", title="count", width=70),
        TableColumn(field="total_ms", title="total ms", formatter=fmt, width=90),
        TableColumn(field="mean_us", title="mean µs", formatter=fmt, width=90),
        TableColumn(
            field="share_pct", title="share % (of its phase)", formatter=NumberFormatter(format="0.0"), width=120
        ),
    ]
    return DataTable(
        source=ColumnDataSource(rows),
        columns=columns,
        sortable=True,
        height=min(600, 28 + 25 * len(rows["name"])),
        sizing_mode="stretch_width",
        index_position=None,
    )


def _ncu_plots(analyses: Sequence[KernelAnalysis]) -> Any | str:
    from bokeh.layouts import column, row

    if not analyses:
        return na("no Nsight Compute analysis in this report (max-profile kernel NAME ...)")
    rows = []
    for a in analyses[:8]:
        label = f"{a.kernel_name[:60]} (launch {a.launch_id}, {a.bound or '?'}-bound)"
        sol = [
            ("compute", a.compute_throughput_pct),
            ("memory", a.memory_throughput_pct),
            ("DRAM", a.dram_throughput_pct),
        ]
        sol_fig = new_figure(
            f"Speed of light: {label}",
            y_range=[n for n, _ in sol],
            x_range=(0, 100),
            height=170,
            x_axis_label="% of peak",
        )
        sol_fig.hbar(y=[n for n, _ in sol], right=[v or 0.0 for _, v in sol], height=0.6, color="#2c7fb8")
        occ = [("achieved", a.achieved_occupancy_pct), ("theoretical", a.theoretical_occupancy_pct)]
        occ_fig = new_figure(
            f"Occupancy (limiter: {a.occupancy_limiter or 'n/a'})",
            y_range=[n for n, _ in occ],
            x_range=(0, 100),
            height=170,
            x_axis_label="% of max warps",
        )
        occ_fig.hbar(y=[n for n, _ in occ], right=[v or 0.0 for _, v in occ], height=0.6, color="#41ab5d")
        parts = [sol_fig, occ_fig]
        if a.stalls:
            names = [s.reason for s in a.stalls][::-1]
            st = new_figure("Warp stalls (cycles per issued instruction)", y_range=names, height=60 + 26 * len(names))
            st.hbar(y=names, right=[s.cycles_per_instruction for s in a.stalls][::-1], height=0.6, color="#e6550d")
            parts.append(st)
        rows.append(row(*parts, sizing_mode="stretch_width"))
    return column(*rows, sizing_mode="stretch_width")


def _serve_plots(report: Report) -> Any | str:
    from bokeh.layouts import row

    s = report.serve
    if s is None:
        return na("not a max serve capture")
    figs = []
    for title, hist in (
        ("Time to first token (client, ms)", s.ttft_histogram),
        ("Inter-token latency (client, ms)", s.itl_histogram),
    ):
        if hist is None or not hist.counts:
            continue
        fig = new_figure(title, height=260, x_axis_label="ms", y_axis_label="count")
        fig.quad(
            left=hist.edges[:-1],
            right=hist.edges[1:],
            bottom=0,
            top=hist.counts,
            fill_color="#756bb1",
            line_color="white",
        )
        _integer_counts(fig)
        figs.append(fig)
    if not figs:
        return na(f"no request completed ({s.first_error or 'no request'})")
    return row(*figs, sizing_mode="stretch_width")


def _figures_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="figures"><tr>{head}</tr>{body}</table>'


def _n(v: float | int | None, fmt: str = ".2f", unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{fmt}}{unit}"


def _ops_table(report: Report) -> str:
    """``--kernels ops``: every op of each phase with its calls, kernels and their GPU time."""
    ops = report.ops
    if ops is None:
        return na("not recorded: `--kernels ops` joins MAX's ops to the kernels they launch (an NVIDIA GPU, CUPTI)")
    if isinstance(ops, Unavailable):
        return na(ops.reason)
    parts = [f'<p class="meta">{esc(ops.source)}; {esc(ops.join)}</p>']
    for c in ops.coverage:
        parts.append(f"<h3>{esc(op_phase_heading(c))}, {esc(op_coverage_text(c))}</h3>")
        rows = [[r.op, *op_figures(r), ", ".join(r.top_kernels)] for r in ops.rows if r.phase == c.phase]
        parts.append(_figures_table(OP_COLUMNS, rows))
        priced = [[g.part, g.ops_text, *op_roof_figures(g), g.basis] for g in ops.priced if g.phase == c.phase]
        if priced:
            parts.append(_figures_table((*OP_ROOF_COLUMNS, "priced"), priced))
    return "".join(parts)


def _summary(report: Report) -> str:
    """The headline figures the text report leads with: TTFT, decode tok/s, step times, serve latency."""
    items: list[tuple[str, str]] = []
    s = report.step_summary
    if isinstance(s, StepSummary):
        items += [("TTFT", _n(s.ttft_ms, ".2f", " ms")), ("decode", _n(s.decode_tokens_per_s, ".1f", " tok/s"))]
        dec = next((p for p in s.phases if p.phase == "decode"), None)
        if dec:
            items.append(("decode step p50 / p90", f"{dec.p50_ms:.3f} / {dec.p90_ms:.3f} ms"))
    if report.serve is not None:
        sv = report.serve
        items += [
            ("TTFT p50 / p90 (client)", f"{_n(sv.ttft_ms_p50)} / {_n(sv.ttft_ms_p90)} ms"),
            ("ITL p50 / p90 (client)", f"{_n(sv.itl_ms_p50)} / {_n(sv.itl_ms_p90)} ms"),
            ("streamed", _n(sv.output_tok_per_s, ".1f", " tok/s")),
            ("requests", f"{sv.requests} ({sv.failed_requests} failed)"),
        ]
    c = report.decode_cost
    if c is not None and c.step.pct_of_peak_bandwidth is not None:
        items.append(
            ("decode bandwidth", f"{c.step.achieved_GBps:.0f} GB/s, {c.step.pct_of_peak_bandwidth:.0f}% of peak")
        )
    load = report.capture.host_load
    if load is not None:
        items.append(
            ("host CPU", f"{load.cpu_busy_pct or 0:.0f}% busy; others {load.other_cores:.2f} of {load.cores} cores")
        )
    if not items:
        return na("no step or request timings in this report")
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card metric"><span class="meta">{esc(k)}</span><h3>{esc(v)}</h3></div>' for k, v in items
        )
        + "</div>"
    )


def _ledger(report: Report) -> str:
    """Each phase's step split into kernel parts and GPU idle, against the roofline (the account every verdict
    reads)."""
    lg = report.ledger
    if lg is None:
        return na("no steps to account in this capture")
    if isinstance(lg, Unavailable):
        return na(lg.reason)
    roofs = (
        f"; ideal: the roofline at {lg.attainable_bandwidth_pct:g} % of peak bandwidth"
        + (f" / {lg.attainable_compute_pct:g} % of peak compute" if lg.attainable_compute_pct else "")
        if lg.attainable_bandwidth_pct
        else ""
    )
    out = [f"<p class='meta'>from the {esc(lg.source)}{esc(roofs)}; recoverable = actual - ideal (idle: all of it)</p>"]
    for p in lg.phases:
        facts = [
            f"{steps_text(p.steps, p.steps_in_capture)} of {p.step_ms:.3f} ms",
            f"host step p50 {_n(p.host_step_p50_ms, '.3f', ' ms')}",
            f"batch {p.batch}" if p.batch else "",
            f"GPU busy {p.busy_pct:.1f} %" if lg.source == LedgerSource.KERNEL_TIMELINE else "",
            f"{p.recoverable_ms_per_step:.3f} ms per step recoverable",
        ]
        out.append(f"<h3>{esc(p.phase)}</h3><p class='meta'>{esc(', '.join(x for x in facts if x))}</p>")
        rows = [
            [
                r.part,
                f"{r.ms_per_step:.3f}",
                f"{r.share_pct:.1f}",
                _n(r.ideal_ms_per_step, ".3f") if r.ideal_ms_per_step is not None else "-",
                _n(r.recoverable_ms_per_step, ".3f") if r.recoverable_ms_per_step is not None else "-",
                _n(r.kernels_per_step, ".1f") if r.kernels_per_step is not None else "",
                r.basis or "",
            ]
            for r in p.rows
        ]
        out.append(
            _figures_table(
                ["part", "ms / step", "% of step", "ideal ms", "recoverable ms", "kernels / step", "priced"], rows
            )
        )
    tail = (
        f"outside steps: {lg.outside_steps_ms:.2f} ms ({lg.outside_steps_pct:.1f} % of the {lg.window_ms:.1f} ms "
        "observed)"
    )
    if lg.requests_in_flight_pct is not None:
        tail += f"; requests in flight {lg.requests_in_flight_pct:.0f} % of the window"
    out.append(f"<p class='meta'>{esc(tail)}</p>")
    out += [f"<p class='meta'>{esc(n)}</p>" for n in lg.notes]
    return "".join(out)


def _decode_cost(report: Report) -> str:
    c = report.decode_cost
    if c is None:
        return na("no decode steps with a model description (config.json / safetensors) in this capture")
    rows = [
        [
            r.family,
            _n(r.ms_per_step, ".4f"),
            _n(r.bytes_per_step / 1e9, ".4f"),
            _n(r.achieved_GBps, ".1f"),
            _n(r.pct_of_peak_bandwidth, ".1f"),
            _n(r.achieved_TFLOPs, ".2f"),
            _n(r.pct_of_peak_compute, ".1f"),
        ]
        for r in [c.step, *([c.kernels] if c.kernels else []), *c.families]
    ]
    head = (
        f"<p class='meta'>batch {c.batch}, {esc(decode_context_text(c))}; weights {c.weight_bytes / 1e9:.3f} GB, "
        f"{esc(kv_text(c, 'KV'))} per step; peaks {_n(c.peak_bandwidth_GBps, '.0f', ' GB/s')}, "
        f"{_n(c.peak_TFLOPs, '.0f', ' TFLOP/s')} "
        f"({esc(c.operand)}); {esc(c.weights_basis)}</p>"
    )
    return head + _figures_table(
        ["part", "ms / step", "GB / step", "GB/s", "% of peak bandwidth", "TFLOP/s", "% of peak compute"], rows
    )


def _server(report: Report) -> str:
    m = report.server_metrics
    if m is None:
        return na("no server metrics (not a serve / attach capture)")
    if m.unavailable:
        return na(m.unavailable)
    rows = [
        ["requests finished", _n(m.requests, ".0f")],
        ["output tokens", _n(m.output_tokens, ".0f")],
        *[
            [f"{k} batches (mean ms)", f"{v:.0f} ({m.batch_execution_ms_mean.get(k, float('nan')):.2f} ms)"]
            for k, v in sorted(m.batches.items())
        ],
        ["batch size (mean)", _n(m.batch_size_mean)],
        ["TTFT / ITL mean (server)", f"{_n(m.ttft_ms_mean)} / {_n(m.itl_ms_mean)} ms"],
        ["queued / running at the end", f"{_n(m.requests_queued, '.0f')} / {_n(m.requests_running, '.0f')}"],
        ["KV cache used", _n(m.kv_cache_used_pct, ".1f", " %")],
        ["preemptions", _n(m.preemptions, ".0f") if m.preemptions is not None else "0 (none recorded)"],
    ]
    return f"<p class='meta'>{esc(m.url)}, {m.window_s:.1f} s window</p>" + _figures_table(["metric", "value"], rows)


def _replicas(report: Report) -> str:
    """Per server instance from MAX's own spans, and the fleet's total."""
    if not report.replicas:
        return na("no MAX serve spans (serve records them; attach --otlp PORT receives them)")
    header = ["replica", "passes", "passes/s", "prefill / decode passes", "prefill / decode ms", "busy %"]
    header += ["decode batch", "decode pass ms", "requests", "queue ms", "TTFT ms", "ITL ms"]
    rows = [
        [
            r.replica + (" (silent: no span arrived)" if r.silent else ""),
            str(r.passes),
            _n(r.passes_per_s, ".1f"),
            f"{r.prefill_passes} / {r.decode_passes}",
            f"{r.prefill_ms:.1f} / {r.decode_ms:.1f}",
            _n(r.busy_pct, ".1f"),
            _n(r.decode_batch, "d"),
            _n(r.mean_decode_pass_ms),
            f"{r.requests} ({r.failed_requests} failed)",
            _n(r.queue_ms),
            _n(r.ttft_ms),
            _n(r.itl_ms),
        ]
        for r in report.replicas
    ]
    slowest = f"<p class='meta'>slowest: {esc(report.slowest_replica)}</p>" if report.slowest_replica else ""
    return slowest + _figures_table(header, rows)


def _startup_plot(report: Report) -> Any | str:
    """Start-up as one horizontal bar of phases (compile phases coloured by cache hit / miss), then the table."""
    from bokeh.models import ColumnDataSource

    st = report.startup
    if st is None:
        return na("no start-up profile (max-profile startup / run / demo record one)")
    phases = [p for p in st.phases if p.seconds > 0]
    left = 0.0
    data: dict[str, list[Any]] = {"left": [], "right": [], "name": [], "seconds": [], "color": []}
    colors = {"hit": "#2b7a3d", "miss": "#b2182b", "partial": "#c77c02"}
    for i, p in enumerate(phases):
        data["left"].append(left)
        data["right"].append(left + p.seconds)
        data["name"].append(p.name + (f" (cache {p.cache})" if p.cache else ""))
        data["seconds"].append(round(p.seconds, 3))
        data["color"].append(colors.get(p.cache or "", "#9ecae1" if i % 2 else "#6baed6"))
        left += p.seconds
    fig = new_figure(
        f"Start-up: {st.total_s:.1f} s to the first token — compile cache {st.cache}",
        height=150,
        x_axis_label="seconds since process start",
        tooltips=[("phase", "@name"), ("seconds", "@seconds")],
    )
    fig.quad(
        left="left",
        right="right",
        bottom=0,
        top=1,
        fill_color="color",
        line_color="white",
        source=ColumnDataSource(data),
    )
    fig.yaxis.visible = False
    return fig


def _startup_table(report: Report) -> str:
    st = report.startup
    if st is None:
        return ""
    rows = [
        [
            p.name,
            f"{p.seconds:.2f}",
            p.cache or "",
            f"{p.bytes / 1e9:.3f}" if p.bytes else "",
            _n(p.gb_per_s) if p.gb_per_s else "",
        ]
        for p in st.phases
    ]
    extra = f"<p class='meta'>compile cache {esc(st.cache_reason)}</p>"
    if st.warm_cache_command:
        extra += f"<p class='meta'>fill it for this key: <code>{esc(st.warm_cache_command)}</code></p>"
    if st.failure:
        extra += f"<p><b style='color:#b2182b'>FAILED:</b> {esc(st.failure)}</p>"
    return extra + _figures_table(["phase", "seconds", "cache", "GB", "GB/s"], rows)


def _sweep_plots(report: Report) -> Any | str:
    from bokeh.layouts import row

    levels = sorted(report.load_levels, key=lambda lv: lv.concurrency)
    if not levels:
        return na("no load sweep (serve / attach --concurrency 1,4,16)")
    xs = [lv.concurrency for lv in levels]
    lat = new_figure(
        "Latency against concurrency (client, ms)",
        height=300,
        x_axis_label="concurrency",
        y_axis_label="ms",
        x_axis_type="log",
    )
    for label, values, color in (
        ("TTFT p50", [lv.ttft_ms.p50 for lv in levels], "#d95f02"),
        ("TTFT p90", [lv.ttft_ms.p90 for lv in levels], "#fdae6b"),
        ("ITL p50", [lv.itl_ms.p50 for lv in levels], "#1b9e77"),
        ("ITL p99", [lv.itl_ms.p99 for lv in levels], "#66c2a4"),
    ):
        ys = [v if v is not None else float("nan") for v in values]
        lat.line(xs, ys, line_width=2, color=color, legend_label=label)
        lat.scatter(xs, ys, size=6, color=color, legend_label=label)
    _legend_outside(lat)
    thr = new_figure(
        "Throughput and goodput against concurrency",
        height=300,
        x_axis_label="concurrency",
        y_axis_label="tok/s",
        x_axis_type="log",
    )
    thr.line(xs, [lv.output_tok_per_s for lv in levels], line_width=2, color="#2c7fb8", legend_label="output tok/s")
    thr.scatter(xs, [lv.output_tok_per_s for lv in levels], size=6, color="#2c7fb8", legend_label="output tok/s")
    if any(lv.goodput_rps is not None for lv in levels):
        from bokeh.models import LinearAxis, Range1d

        good = [lv.goodput_rps or 0.0 for lv in levels]
        thr.extra_y_ranges = {"rps": Range1d(start=0, end=max(max(good), 1e-3) * 1.15)}
        thr.add_layout(LinearAxis(y_range_name="rps", axis_label="goodput (requests/s)"), "right")
        thr.line(
            xs,
            good,
            y_range_name="rps",
            line_width=2,
            line_dash="dashed",
            color="#756bb1",
            legend_label="goodput req/s",
        )
    _legend_outside(thr)
    return row(lat, thr, sizing_mode="stretch_width")


# ---------------------------------------------------------------------------------------------
def render_html(report: Report) -> str:
    """The report as one HTML document (BokehJS inlined: no CDN, no network request)."""
    from bokeh.embed import components
    from bokeh.resources import Resources

    titles = {
        "summary": "Summary",
        "ledger": "Step ledger: where each step's time goes",
        "verdicts": "Verdicts",
        "startup": "Start-up (to the first token)",
        "steps": "Steps",
        "utilization": "GPU utilization over time",
        "families": "Where the time goes: kernel families",
        "kernels": "Top kernels",
        "ops": "MAX ops and the kernels they launched",
        "roofline": "Decode step against the roofline",
        "ncu": "Kernel deep dive (Nsight Compute)",
        "serve": "max serve: client-side latency",
        "server": "Server metrics (its /metrics over the window)",
        "replicas": "Replicas (MAX serve spans)",
        "sweep": "Load sweep",
    }
    built: dict[str, Any] = {
        "summary": _summary(report),
        "ledger": _ledger(report),
        "verdicts": _verdicts(report),
        "startup": _startup_plot(report),
        "steps": _steps_plot(report),
        "utilization": _utilization_plots(report),
        "families": _family_plots(report.kernels),
        "kernels": _kernel_table(report.kernels),
        "ops": _ops_table(report),
        "roofline": _decode_cost(report),
        "ncu": _ncu_plots(report.kernel_analyses),
        "serve": _serve_plots(report),
        "server": _server(report),
        "replicas": _replicas(report),
        "sweep": _sweep_plots(report),
    }
    models = {name: obj for name, obj in built.items() if not isinstance(obj, str)}
    script, divs = components(models) if models else ("", {})
    body = []
    for name in SECTIONS:
        content = divs[name] if name in divs else built[name]
        if name == "startup":
            content += _startup_table(report)
        body.append(f'<section id="{name}" data-section="{name}"><h2>{titles[name]}</h2>{content}</section>')
    if report.notes:
        body.append(
            '<section id="notes"><h2>Notes</h2><ul class="notes">'
            + "".join(f"<li>{esc(n)}</li>" for n in report.notes)
            + "</ul></section>"
        )
    if report.artifacts:
        body.append(
            '<section id="artifacts"><h2>Artifacts</h2><ul class="notes">'
            + "".join(f"<li><code>{esc(a)}</code></li>" for a in report.artifacts)
            + "</ul></section>"
        )
    env, cap = report.environment, report.capture
    gpus = ", ".join(f"{g.key} {g.name or '?'}" for g in env.gpus) or "no GPU"
    subtitle = (
        f"{esc(cap.target)}{' — ' + esc(cap.model_path) if cap.model_path else ''} · {esc(gpus)} · MAX "
        f"{esc(env.max_version or '?')} · "
        f"max_profile {esc(report.tool_version or '?')} · schema {report.schema_version}"
    )
    js = Resources(mode="inline", components=["bokeh", "bokeh-widgets", "bokeh-tables"]).render_js() if models else ""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
        'content="width=device-width,initial-scale=1">'
        f"<title>max_profile — {esc(cap.target)}</title><style>{CSS}</style>{js}</head><body><header><h1>max_profile "
        f"report</h1><p>{subtitle}</p></header><main>{''.join(body)}</main>{script}</body></html>\n"
    )
