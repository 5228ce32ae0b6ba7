"""The arithmetic the tests of committed GPU measurements (tests/test_h200_session*.py) recompute their figures with:
``benchmarks/untraced_overhead.py``'s JSON, an arm against ``none``."""

from __future__ import annotations

import statistics
from typing import Any


def paired_steps(docs: list[dict[str, Any]], arm: str) -> list[float]:
    """Per round of ``docs``, none's median decode step over the arm's (below 1: the arm's step is slower)."""
    return [a["p50_ms"] / b["p50_ms"] for d in docs for a, b in zip(d["steps"]["none"], d["steps"][arm], strict=True)]


def against_none(docs: list[dict[str, Any]], arm: str) -> tuple[float, float, float]:
    """An arm against ``none`` over the rounds of ``docs``: the ratio of the median tokens/s, the median of the
    per-round ratios, and the median decode step paired per round (:func:`paired_steps`)."""
    none = [x for d in docs for x in d["arms"]["none"]["all"]]
    traced = [x for d in docs for x in d["arms"][arm]["all"]]
    paired = statistics.median(t / n for n, t in zip(none, traced, strict=True))
    return statistics.median(traced) / statistics.median(none), paired, statistics.median(paired_steps(docs, arm))
