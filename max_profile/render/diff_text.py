"""The text of ``max-profile diff``: comparability, every compared metric, the verdict lines."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from max_profile.analyze.diff import DiffResult
from max_profile.render.tables import INNER, Col, figure, fitted_tables
from max_profile.render.terminal import DEFAULT_WIDTH, fit_to_terminal


def diff_renderables(result: DiffResult, width: int = DEFAULT_WIDTH) -> list[RenderableType]:
    """A diff: comparability, the verdict lines, and every compared metric."""
    parts: list[RenderableType] = []
    head = Text(f"A = {result.a}\nB = {result.b}\n")
    if result.reasons:
        head.append(
            ("not comparable" if not result.forced else "not comparable (compared anyway: --force)") + ":\n",
            style="bold yellow",
        )
        for r in result.reasons:
            head.append(f"  - {r}\n", style="yellow")
    parts.append(head)
    if result.lines:
        # one table at any width: A and B in one column, so an 80-column terminal shows each metric once
        cols = [
            Col("metric", numeric=False, wrap=True),
            Col("A -> B", numeric=False, wrap=True),
            Col("delta %"),
            Col("test", numeric=False, wrap=True),
        ]
        rows = [
            [
                line.metric[:120],
                f"{line.a:.4g} -> {line.b:.4g} {line.unit}",
                figure(line.delta_pct, "+.1f"),
                ("no test" if line.p_value is None else f"p={line.p_value:.2g}")
                + (f", n={line.samples[0]}/{line.samples[1]}" if line.p_value is not None else "")
                + ("" if line.judged else ", not judged: other load"),
            ]
            for line in result.lines
        ]
        parts += fitted_tables(cols, rows, width - INNER)
    return [
        Panel(
            Group(*parts),
            title=f"max-profile diff (regression threshold {result.fail_above_pct:g} %)",
            title_align="left",
        )
    ]


def print_diff(result: DiffResult, console: Console | None = None) -> None:
    """The outcome first, then the comparison, then one verdict each (``REGRESSION: ...`` starts a line, what a CI log
    is searched for), wrapped at the console's width without cutting a figure."""
    console = console or Console(highlight=False)
    style = {"regression": "bold red", "inconclusive": "bold yellow"}.get(result.outcome, "bold green")
    console.print(Text(fit_to_terminal(f"outcome: {result.outcome.upper()}", console.width), style=style))
    for r in diff_renderables(result, console.width):
        console.print(r)
    for v in result.verdicts:
        console.print(
            Text(
                fit_to_terminal(v, console.width, indent="  "), style="bold red" if v.startswith("REGRESSION") else ""
            ),
            soft_wrap=True,
        )
