"""Shared helpers for the text-format readers (CSV and JSON traces): cells to numbers, columns by name.

Every reader refuses a file it cannot use with a :class:`~max_profile.errors.TraceFormatError` that
names the file, and skips single bad rows while counting them (the count becomes a note).
"""

from __future__ import annotations

import csv
import io
import math

from max_profile.errors import TraceFormatError
from max_profile.util.files import read_input

NOISE_PREFIXES = ("Processing [", "Generating SQLite", " **", "**")
"""Lines tools print around their CSV (nsys stats' preamble, notices)."""
MAX_CELL_CHARS = 1 << 16

ROCPROF_JSON_KEY = "rocprofiler-sdk-tool"
"""The top-level key of a rocprofv3 JSON file (``rocprofv3 --output-format json``): the reader and the format
sniffer (readers/sources.py) both look for it."""


def read_text(path: str) -> str:
    return read_input(path).decode("utf-8", errors="replace")


MAX_NESTING = 10_000
"""JSON nested deeper than this is refused before parsing (Python's parser would recurse into a RecursionError)."""


def check_json_depth(text: str, path: str) -> None:
    """Refuse JSON nested more than :data:`MAX_NESTING` levels (checked over the first million characters)."""
    depth = 0
    deepest = 0
    for ch in text[:1_000_000] if len(text) > 1_000_000 else text:
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_NESTING:
                    raise TraceFormatError(f"{path}: JSON nested more than {MAX_NESTING} levels deep; not a trace")
        elif ch in "]}":
            depth -= 1


def csv_rows(path: str, text: str | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a CSV file, tool noise lines dropped."""
    text = read_text(path) if text is None else text
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(NOISE_PREFIXES)]
    try:
        csv.field_size_limit(MAX_CELL_CHARS)
        rows = list(csv.reader(io.StringIO("\n".join(lines))))
    except csv.Error as exc:
        raise TraceFormatError(f"{path}: not a readable CSV file ({exc})") from exc
    if not rows:
        raise TraceFormatError(f"{path}: no CSV rows")
    return [h.strip() for h in rows[0]], rows[1:]


def column(header: list[str], path: str, *names: str) -> int:
    """Index of the first of ``names`` in the header; a format error naming the file when none is there."""
    for n in names:
        if n in header:
            return header.index(n)
    raise TraceFormatError(f"{path}: expected a column {names[0]!r}; the header has {header[:12]}")


def optional_column(header: list[str], *names: str) -> int | None:
    for n in names:
        if n in header:
            return header.index(n)
    return None


def number(value: object) -> float | None:
    """A finite number from a cell (``"3,191,212.5"``, ``12``, ``1.5e3``), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        v = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(",", "")
        if not text:
            return None
        try:
            v = float(text)
        except ValueError:
            return None
    else:
        return None
    return v if math.isfinite(v) else None


INT64_LIMIT = 2**62
"""Timestamps beyond this (ns) are refused as garbage rather than overflowing int64 arithmetic."""


def ns(value: object, scale: float = 1.0) -> int | None:
    """A timestamp or duration cell in some unit, as integer nanoseconds; None when not a usable number."""
    v = number(value)
    if v is None:
        return None
    v *= scale
    if not -INT64_LIMIT < v < INT64_LIMIT:
        return None
    return int(round(v))
