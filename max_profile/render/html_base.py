"""What every HTML page of max_profile shares: its style sheet, colours, escaping, the Bokeh figure it draws on."""

from __future__ import annotations

import html
from typing import Any

import numpy as np

MAX_POINTS = 4000
"""Steps plotted at most (evenly thinned beyond that)."""
HEATMAP_COLUMNS = 400
"""Per-step heat map columns at most (steps averaged into buckets beyond that)."""
PHASE_COLORS = {"prefill": "#d95f02", "decode": "#1b9e77", "mixed": "#7570b3", "unknown": "#999999"}
SEVERITY_COLORS = {"error": "#b2182b", "warning": "#c77c02", "info": "#2b7a3d"}

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:18px 28px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#c9d1e0;font-size:13px}
main{padding:12px 28px 40px;max-width:1280px}
section{background:#fff;border-radius:8px;margin:16px 0;padding:14px 18px;box-shadow:0 1px 2px #0002}
section h2{font-size:16px;margin:0 0 10px}.na{color:#777;font-style:italic}.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{flex:1 1 380px;border-left:6px solid #999;background:#fafbfc;padding:10px 14px;border-radius:4px}
.card h3{margin:0 0 6px;font-size:14px}.card .sev{font-size:11px;text-transform:uppercase;font-weight:700}
.card table{font-size:12px;border-collapse:collapse}.card td{padding:1px 8px 1px 0;vertical-align:top}
.card .next{font-size:12px;margin-top:6px;line-height:1.7}
.next-measurement{margin-top:12px;font-size:13px;line-height:1.7}
code{background:#eef1f5;padding:1px 4px;border-radius:3px;overflow-wrap:anywhere;box-decoration-break:clone;
-webkit-box-decoration-break:clone}
.notes li{font-size:13px;color:#444}.meta{font-size:12px;color:#555}
.card.metric{flex:0 1 200px;border-left-color:#2c7fb8}
table.figures{border-collapse:collapse;font-size:13px}
table.figures th,table.figures td{padding:3px 10px;border-bottom:1px solid #e3e6ea;text-align:right}
table.figures th:first-child,table.figures td:first-child{text-align:left}
"""


def esc(value: object) -> str:
    """``value`` as HTML text (quotes escaped too: safe in attributes)."""
    return html.escape(str(value), quote=True)


def na(reason: str) -> str:
    """A section's place when its data is missing."""
    return f'<p class="na">not available: {esc(reason)}</p>'


def new_figure(title: str, **kw: Any) -> Any:
    """A Bokeh figure with the report's tools and size (Bokeh is imported here: only when a page is drawn)."""
    from bokeh.plotting import figure

    fig = figure(
        title=title,
        height=kw.pop("height", 300),
        sizing_mode="stretch_width",
        tools="pan,wheel_zoom,box_zoom,reset,save,hover",
        output_backend="canvas",
        **kw,
    )
    fig.toolbar.logo = None
    return fig


def thin(n: int, limit: int = MAX_POINTS) -> np.ndarray:
    """Indices of at most ``limit`` of ``n`` points, evenly spread."""
    return np.arange(n) if n <= limit else np.linspace(0, n - 1, limit).astype(int)
