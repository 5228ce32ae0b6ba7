"""Text sections of a served model's report: the server run, its /metrics, each load level of a sweep."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from max_profile.model import LoadLevel, Report, ServerMetrics
from max_profile.render.tables import INNER, Col, figure, fitted_tables, na_text
from max_profile.render.terminal import DEFAULT_WIDTH


def serve_section(report: Report) -> RenderableType | None:
    s = report.serve
    if s is None:
        return None
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row(
        "mode",
        f"{s.mode}, window {s.window_s:.1f} s, port {s.port}, /health after {figure(s.time_to_ready_s, '.1f', ' s')}",
    )
    t.add_row("requests", f"{s.requests} ({s.failed_requests} failed), {s.output_tokens} streamed chunks")
    t.add_row(
        "TTFT", f"p50 {figure(s.ttft_ms_p50, '.2f', ' ms')}, p90 {figure(s.ttft_ms_p90, '.2f', ' ms')} (client side)"
    )
    t.add_row(
        "inter-token",
        f"p50 {figure(s.itl_ms_p50, '.2f', ' ms')}, p90 {figure(s.itl_ms_p90, '.2f', ' ms')} -> "
        f"{figure(s.tokens_per_s, '.1f', ' tok/s')} per request",
    )
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
        return Panel(na_text(m.unavailable), title="Server metrics", title_align="left")
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("window", f"{m.window_s:.1f} s, {m.url}")
    t.add_row("requests", f"{figure(m.requests, '.0f')} finished, {figure(m.output_tokens, '.0f')} output tokens")
    if m.batches:
        t.add_row(
            "batches",
            ", ".join(
                f"{k} {v:.0f} x {m.batch_execution_ms_mean[k]:.2f} ms"
                if v and k in m.batch_execution_ms_mean
                else f"{k} {v:.0f}"
                for k, v in sorted(m.batches.items())
            )
            + "  (CE = prefill, TG = decode; mean execution time)",
        )
    t.add_row("batch size", f"mean {figure(m.batch_size_mean, '.2f')} requests")
    t.add_row(
        "latency",
        f"TTFT mean {figure(m.ttft_ms_mean, '.2f', ' ms')}, ITL mean {figure(m.itl_ms_mean, '.2f', ' ms')} (server "
        "side)",
    )
    t.add_row(
        "queue", f"{figure(m.requests_queued, '.0f')} queued, {figure(m.requests_running, '.0f')} running at the end"
    )
    t.add_row(
        "KV cache",
        f"{figure(m.kv_cache_used_pct, '.1f', '%')} used (blocks {figure(m.kv_blocks_used, '.0f')} / "
        f"{figure(m.kv_blocks_total, '.0f')}), preemptions "
        f"{figure(m.preemptions, '.0f') if m.preemptions is not None else '0 (none recorded)'}",
    )
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
        step = (
            f"; server decode step {c.traced_decode_step_ms:.3f} vs {c.reference_decode_step_ms:.3f} ms "
            f"({c.decode_step_change_pct:+.1f} %)"
        )
    ratio = f" ({c.throughput_ratio:.3f}{c.ratio_noise_text})" if c.throughput_ratio is not None else ""
    return Text(
        f"recorder cost, against an untraced window of this server (concurrency {c.concurrency}): {c.traced_tok_s:.1f} "
        f"vs {c.reference_tok_s:.1f} tok/s{ratio}{step}{c.unresolved_text}"
    )


def load_levels_section(
    levels: list[LoadLevel], slo: dict[str, float], width: int = DEFAULT_WIDTH
) -> RenderableType | None:
    if not levels:
        return None
    cols = [
        Col("concurrency"),
        Col("requests"),
        Col("output tok/s"),
        Col("TTFT p50 ms"),
        Col("TTFT p90 ms"),
        Col("TTFT p99 ms"),
        Col("ITL p50 ms"),
        Col("ITL p90 ms"),
        Col("ITL p99 ms"),
        Col("goodput req/s"),
        Col("batch size"),
        Col("CE batch ms"),
        Col("TG batch ms"),
        Col("KV %"),
        Col("GPU util %"),
    ]
    rows = []
    for lv in levels:
        m = lv.server if lv.server is not None and not lv.server.unavailable else None
        rows.append(
            [
                str(lv.concurrency),
                str(lv.completed),
                figure(lv.output_tok_per_s, ".1f"),
                figure(lv.ttft_ms.p50, ".1f"),
                figure(lv.ttft_ms.p90, ".1f"),
                figure(lv.ttft_ms.p99, ".1f"),
                figure(lv.itl_ms.p50, ".2f"),
                figure(lv.itl_ms.p90, ".2f"),
                figure(lv.itl_ms.p99, ".2f"),
                figure(lv.goodput_rps, ".2f"),
                figure(m.batch_size_mean if m else None, ".2f"),
                figure(m.batch_execution_ms_mean.get("CE") if m else None, ".2f"),
                figure(m.batch_execution_ms_mean.get("TG") if m else None, ".2f"),
                figure(m.kv_cache_used_pct if m else None, ".1f"),
                figure(lv.gpu_utilization_pct, ".1f"),
            ]
        )
    note = Text(
        "goodput: completed requests/s meeting "
        + (", ".join(f"{k} <= {v:g} ms" for k, v in slo.items()) if slo else "no SLO (pass --slo ttft=MS,itl=MS)")
        + "; batch size, batch times and KV use from the server's metrics",
        style="dim",
    )
    return Panel(Group(*fitted_tables(cols, rows, width - INNER), note), title="Load sweep", title_align="left")


def replicas_section(report: Report, width: int = DEFAULT_WIDTH) -> RenderableType | None:
    """Per server instance from MAX's own spans (``attach --otlp``, ``serve``, an imported span file)."""
    if not report.replicas:
        return None
    cols = [
        Col("replica", numeric=False),
        Col("passes"),
        Col("passes/s"),
        Col("prefill passes"),
        Col("decode passes"),
        Col("prefill ms"),
        Col("decode ms"),
        Col("busy %"),
        Col("decode batch"),
        Col("decode pass ms"),
        Col("requests"),
        Col("output tokens"),
        Col("queue ms"),
        Col("TTFT ms"),
        Col("TTFT p90 ms"),
        Col("ITL ms"),
    ]
    rows = [
        [
            r.replica + (" (silent: no span arrived)" if r.silent else ""),
            str(r.passes),
            figure(r.passes_per_s, ".1f"),
            str(r.prefill_passes),
            str(r.decode_passes),
            f"{r.prefill_ms:.1f}",
            f"{r.decode_ms:.1f}",
            figure(r.busy_pct, ".1f"),
            figure(r.decode_batch, "d"),
            figure(r.mean_decode_pass_ms, ".2f"),
            f"{r.requests}" + (f" ({r.failed_requests} failed)" if r.failed_requests else ""),
            str(r.output_tokens),
            figure(r.queue_ms, ".2f"),
            figure(r.ttft_ms, ".2f"),
            figure(r.ttft_p90_ms, ".2f"),
            figure(r.itl_ms, ".2f"),
        ]
        for r in report.replicas
    ]
    lines = [
        "from MAX's own spans: a pass is one max.batch span (prefill: context-encoding requests only; decode: "
        "token generation only), queue is arrival to the first pass, ITL the decode phase over its tokens; decode "
        "batch is the median requests per decode pass"
    ]
    served = [f"{r.replica}: {r.server}" for r in report.replicas if r.server and r.server != r.replica]
    if served:
        lines.append("served at " + "; ".join(served))
    if report.slowest_replica:
        lines.insert(0, f"slowest: {report.slowest_replica}")
    body = Group(*fitted_tables(cols, rows, width - INNER), Text("\n".join(lines), style="dim"))
    return Panel(body, title="Replicas (MAX serve spans)", title_align="left")
