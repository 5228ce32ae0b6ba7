"""The HTML page of ``max-profile diff``: comparability, each metric compared, the verdicts."""

from __future__ import annotations

from max_profile.analyze.diff import DiffLine, DiffResult
from max_profile.render.html_base import CSS, esc, na, new_figure


def render_diff_html(result: DiffResult) -> str:
    """A diff as one HTML page: comparability, verdicts, a bar per metric (delta %), the table."""
    from bokeh.embed import components
    from bokeh.resources import Resources

    lines = [x for x in result.lines if x.delta_pct is not None]
    red = '<b style="color:#b2182b">'
    body = [
        '<section id="verdicts" data-section="verdicts"><h2>Verdicts</h2><ul class="notes">'
        + "".join(f"<li>{red if v.startswith('REGRESSION') else '<b>'}{esc(v)}</b></li>" for v in result.verdicts)
        + "</ul></section>"
    ]
    if result.reasons:
        body.insert(
            0,
            '<section id="comparability"><h2>Not comparable</h2><ul class="notes">'
            + "".join(f"<li>{esc(r)}</li>" for r in result.reasons)
            + "</ul></section>",
        )
    script, js, chart = "", "", ""
    if lines:
        names = [x.metric[:70] for x in lines][::-1]
        fig = new_figure(
            f"B against A: delta of each metric (%), regression threshold {result.fail_above_pct:g} %",
            y_range=names,
            height=60 + 22 * len(names),
            x_axis_label="% change (B vs A)",
        )
        colors = [
            "#b2182b"
            if x.regression
            else "#c77c02"
            if x.significant and x.delta > 0
            else "#2b7a3d"
            if x.significant
            else "#9e9e9e"
            for x in lines
        ][::-1]
        fig.hbar(y=names, right=[x.delta_pct for x in lines][::-1], height=0.6, color=colors)
        script, divs = components({"chart": fig})
        chart = divs["chart"]
        js = Resources(mode="inline", components=["bokeh"]).render_js()
    rows = "".join(
        f"<tr><td>{esc(x.metric)}</td><td>{x.a:.4g} {esc(x.unit)}</td><td>{x.b:.4g} "
        f"{esc(x.unit)}</td><td>{x.delta:+.4g} {esc(x.unit)}</td>"
        f"<td>{'' if x.delta_pct is None else f'{x.delta_pct:+.1f} %'}</td>"
        f"<td>{'no test' if x.p_value is None else f'{x.p_value:.2g}'}</td>"
        f"<td>{_verdict(x)}</td></tr>"
        for x in result.lines
    )
    body.append(f'<section id="chart" data-section="chart"><h2>Deltas</h2>{chart or na("nothing compared")}</section>')
    body.append(
        '<section id="table" data-section="table"><h2>Every metric (A = baseline, B = the run judged)</h2><table '
        'class="figures"><tr><th>metric</th>'
        "<th>A</th><th>B</th><th>delta (B - A)</th><th>delta %</th><th>p (Mann-Whitney U)</th><th>verdict</th></tr>"
        f"{rows}</table></section>"
    )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>max_profile '
        f"diff</title><style>{CSS}</style>{js}</head><body>"
        f"<header><h1>max_profile diff</h1><p>A = {esc(result.a)}<br>B = "
        f"{esc(result.b)}</p></header><main>{''.join(body)}</main>{script}</body></html>\n"
    )


def _verdict(line: DiffLine) -> str:
    if line.regression:
        return "REGRESSION"
    if line.significant:
        return "significant"
    return "" if line.judged else "not judged: other load"
