"""Lines sized to the terminal: its width, plain text wrapped to it, the one-line error and the progress lines of the
command line (no rich here: an error or a progress line prints without loading the report renderer)."""

from __future__ import annotations

import shutil
import sys
import textwrap
import time

DEFAULT_WIDTH = 120
"""Columns where there is no terminal (output piped, a file)."""


def terminal_width() -> int:
    """The terminal's width (``COLUMNS`` first, as the CLI's console reads it), DEFAULT_WIDTH where there is none; never
    under 80 (every table fits 80 columns)."""
    return max(shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns, 80)


def fit_to_terminal(text: str, width: int | None = None, indent: str = "    ") -> str:
    """``text`` with each line wrapped at the terminal's width (or ``width``); continuations indented by ``indent``.
    Words are never cut, so a figure or a name longer than the width stays whole on its own line."""
    width = width or terminal_width()
    return "\n".join(
        textwrap.fill(line, width=width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
        if len(line) > width
        else line
        for line in text.splitlines()
    )


ERROR_LINE_MAX = 200
"""The ``max-profile: error:`` line is at most this long (and the terminal's width); what does not fit goes on indented
lines below it."""


def error_lines(message: str, prefix: str = "max-profile: error: ") -> str:
    """The error line, cut after the last clause (``; ``, then ``: ``, ``, ``, a space) that fits the terminal's width
    (or, where none does, ERROR_LINE_MAX); the rest below it, indented, one clause a line, wrapped at the width. Only a
    name longer than ERROR_LINE_MAX is ever cut."""
    width = min(ERROR_LINE_MAX, terminal_width())
    if len(prefix) + len(message) <= width:
        return prefix + message
    head, rest = "", message
    for room in (width - len(prefix), ERROR_LINE_MAX - len(prefix)):
        for sep in ("; ", ": ", ", ", " "):
            cut = message.rfind(sep, 0, room)
            if cut > room // 3:
                head, rest = message[: cut + len(sep.rstrip())], message[cut + len(sep) :]
                break
        if head:
            break
    if not head:
        room = ERROR_LINE_MAX - len(prefix)
        head, rest = message[:room], message[room:]
    return (
        prefix
        + head
        + "\n"
        + "\n".join(
            textwrap.fill(
                part, width, initial_indent="  ", subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
            )
            for part in rest.split("; ")
        )
    )


class Progress:
    """One line per long step on stderr, with elapsed time (model build, compile, warm-up), wrapped at the terminal's
    width."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            line = f"[max-profile {time.perf_counter() - self.t0:6.1f}s] {message}"
            print(fit_to_terminal(line, indent=" " * 22), file=sys.stderr, flush=True)
