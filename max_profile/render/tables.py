"""Terminal tables that never cut a figure: columns that do not fit the width go to a second table (the key column
repeated), headers wrap at spaces, numbers keep every digit; only long names wrap."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

from max_profile.model import DecodeCost, OpCoverage, OpRoofline, OpRow, PhaseBreakdown

INNER = 4
"""Columns a panel's border and padding take from the width its tables get."""

PAD = 2
"""Space between columns (rich's default cell padding of one on each side)."""
NAME_MIN = 24
"""A text column that must wrap keeps at least this width."""


@dataclass(frozen=True)
class Col:
    header: str
    numeric: bool = True
    wrap: bool = False
    """A long text column (kernel names) that may wrap; numbers and short labels never do."""


def _min_width(col: Col, cells: Sequence[str]) -> int:
    longest_word = max((len(w) for w in col.header.split()), default=0)
    content = max((len(c) for c in cells), default=0)
    if col.wrap:
        return max(min(content, NAME_MIN), longest_word)
    return max(content, longest_word)


def _header(col: Col, width: int) -> str:
    """The header broken at spaces into lines of at most ``width`` (never cut)."""
    lines: list[str] = []
    for word in col.header.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def fitted_tables(
    columns: Sequence[Col], rows: Sequence[Sequence[str]], width: int, title: str | None = None, key_columns: int = 1
) -> list[Table]:
    """One or more rich tables holding ``rows`` within ``width`` characters without cutting any number.

    Columns are laid out greedily; when the next one would overflow, a new table starts with the first
    ``key_columns`` columns repeated (so every row stays identifiable).
    """
    widths = [_min_width(c, [r[i] for r in rows]) for i, c in enumerate(columns)]
    key = list(range(min(key_columns, len(columns))))
    groups: list[list[int]] = []
    current = list(key)
    used = sum(widths[i] for i in key) + PAD * max(len(key) - 1, 0)
    for i in range(len(key), len(columns)):
        need = widths[i] + PAD
        if len(current) > len(key) and used + need > width:
            groups.append(current)
            current = list(key)
            used = sum(widths[j] for j in key) + PAD * max(len(key) - 1, 0)
        current.append(i)
        used += need
    groups.append(current)
    tables = []
    for n, group in enumerate(groups):
        t = Table(box=None, title=title if n == 0 else None, title_justify="left", pad_edge=False, padding=(0, 1))
        for i in group:
            col = columns[i]
            t.add_column(
                _header(col, widths[i]),
                justify="right" if col.numeric else "left",
                no_wrap=not col.wrap,
                min_width=widths[i],
                overflow="fold",
            )
        for r in rows:
            t.add_row(*(r[i] for i in group))
        tables.append(t)
    return tables


def na_text(reason: str) -> Text:
    """A section's place when its data is missing: ``not available: <why>``, dimmed."""
    return Text(f"not available: {reason}", style="dim")


def decode_context_text(c: DecodeCost) -> str:
    """The context a decode step was priced at, in words (unknown contexts said so)."""
    if c.context_tokens is None:
        return "context unknown (the passes carry no context lengths)"
    return f"context {c.context_tokens:.0f} tokens (summed over the batch)"


def kv_text(c: DecodeCost, label: str) -> str:
    """The KV cache's bytes per decode step, in words (unknown, never 0)."""
    return f"{label} unknown" if c.kv_bytes is None else f"{label} {c.kv_bytes / 1e9:.4f} GB"


def figure(v: float | int | None, fmt: str = ".2f", unit: str = "") -> str:
    """A number as the tables print it (``n/a`` when unknown)."""
    if v is None:
        return "n/a"
    return f"{v:{fmt}}{unit}"


OP_COLUMNS = ("op", "calls", "kernels", "GPU ms", "share %", "host ms", "kernels it launched")
"""The op table's columns (``--kernels ops``), in the text and the HTML report."""


def op_figures(r: OpRow) -> list[str]:
    """An op row's figures (calls to host ms), as both reports print them."""
    return [str(r.calls), str(r.kernels), f"{r.gpu_ms:.3f}", f"{r.share_pct:.1f}", f"{r.host_ms:.3f}"]


OP_ROOF_COLUMNS = ("priced as", "ops", "ms/step", "ideal ms", "% of roof", "recoverable ms", "MB/step", "GFLOP/step")
"""The priced op groups' columns (``--kernels ops`` on a GPU with a model description), in both reports."""


def op_roof_figures(g: OpRoofline) -> list[str]:
    """A priced op group's figures (ms per step to GFLOP per step), as both reports print them."""
    return [
        f"{g.ms_per_step:.3f}",
        f"{g.ideal_ms_per_step:.3f}",
        f"{g.pct_of_roofline:.0f}",
        f"{g.recoverable_ms_per_step:.3f}",
        f"{g.bytes_per_step / 1e6:.1f}",
        f"{g.flops_per_step / 1e9:.2f}",
    ]


def op_phase_heading(c: OpCoverage) -> str:
    """A phase of the op table by name and steps; ``unknown`` said as what it holds: the calls that fed no request (a
    server's batch-0 calls between requests) and ops outside every step."""
    name = (
        "outside prefill and decode (calls that fed no request, ops between steps)" if c.phase == "unknown" else c.phase
    )
    return f"{name}: {c.steps} step{'s' if c.steps != 1 else ''}"


def op_coverage_text(c: OpCoverage) -> str:
    """How much of a phase's kernel time the named ops hold, and the op calls that launched nothing."""
    return (
        f"{c.attributed_pct:.1f} % of {c.kernel_ms:.3f} ms kernel time inside named ops; "
        f"{c.calls_without_kernels} of {c.calls} op calls launched no kernel"
    )


def steps_text(recorded: int, in_capture: int | None) -> str:
    """``8 of 128 steps recorded`` where a sampled recording recorded a share of the steps, else ``64 steps``."""
    if in_capture is not None and in_capture != recorded:
        return f"{recorded} of {in_capture} steps recorded"
    return f"{recorded} step{'s' if recorded != 1 else ''}"


def recorded_share(p: PhaseBreakdown) -> str | None:
    """``8 of 128`` for a phase whose steps were recorded in part (a sampled recording), else None."""
    if p.steps_in_capture is not None and p.steps_in_capture != p.steps:
        return f"{p.steps} of {p.steps_in_capture}"
    return None
