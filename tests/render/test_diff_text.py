"""The text of ``max-profile diff``: the outcome on its first line, then one table in which each metric appears once,
at 80 columns too."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from max_profile.analyze.diff import diff_reports
from max_profile.render.diff_text import print_diff

from ..builders import built_report

B1 = Path(__file__).parents[1] / "data" / "gpu" / "h200_llama5b_every_verb" / "run_b1_raw.json.gz"


def test_the_outcome_first_and_each_metric_once_at_80_columns() -> None:
    report = built_report(B1)
    result = diff_reports(report, report)
    out = io.StringIO()
    print_diff(result, Console(file=out, width=80, highlight=False, color_system=None))
    text = out.getvalue()
    assert text.splitlines()[0] == "outcome: NO REGRESSION"
    assert max(len(line) for line in text.splitlines()) <= 80
    # every metric's row once: its "A -> B" figure printed once per line of the comparison
    table = [line for line in text.splitlines() if line.startswith("│")]
    arrows = sum(1 for line in table if " -> " in line and "A -> B" not in line)
    assert arrows == len(result.lines)
