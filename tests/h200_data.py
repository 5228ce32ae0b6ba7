"""The arithmetic and reading the tests of committed GPU measurements (tests/test_h200_session*.py) share:
``benchmarks/untraced_overhead.py``'s rounds, an arm against ``none``; ``benchmarks/h200/acceptance.sh``'s table;
``benchmarks/serve_ab.py``'s worker notes."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

UNDONE_JOINS = re.compile(r"CUPTI: (\d+) kernel\(s\) were joined to a launch call")
"""The note the recorder writes where it undid launch joins that cannot be right (``cupti_decode``)."""


def acceptance_rows(table: Path) -> list[list[str]]:
    """The rows of an ``acceptance.tsv`` below its header: step, exit code, seconds, findings, command."""
    return [line.split("\t") for line in table.read_text().splitlines()[1:]]


def launch_joins_undone(window: dict[str, Any]) -> int:
    """How many kernels a served window's recording had joined to a launch call that cannot be theirs (undone by
    ``cupti_decode.impossible_launch_joins``), from the worker's notes; 0 where no note says so."""
    found = [UNDONE_JOINS.match(n) for n in window["worker_notes"]]
    return next((int(m.group(1)) for m in found if m), 0)


def tok_s_ratios(none: list[float], traced: list[float]) -> tuple[float, float]:
    """Tokens/s of an arm against ``none``, round by round: the ratio of the medians and the median of the per-round
    ratios."""
    paired = statistics.median(t / n for n, t in zip(none, traced, strict=True))
    return statistics.median(traced) / statistics.median(none), paired


def paired_steps(docs: list[dict[str, Any]], arm: str) -> list[float]:
    """Per round of ``docs``, none's median decode step over the arm's (below 1: the arm's step is slower)."""
    return [a["p50_ms"] / b["p50_ms"] for d in docs for a, b in zip(d["steps"]["none"], d["steps"][arm], strict=True)]


def against_none(docs: list[dict[str, Any]], arm: str) -> tuple[float, float, float]:
    """An arm against ``none`` over the rounds of ``docs``: the ratio of the median tokens/s, the median of the
    per-round ratios, and the median decode step paired per round (:func:`paired_steps`)."""
    none = [x for d in docs for x in d["arms"]["none"]["all"]]
    traced = [x for d in docs for x in d["arms"][arm]["all"]]
    return *tok_s_ratios(none, traced), statistics.median(paired_steps(docs, arm))
