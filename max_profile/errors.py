"""The one error hierarchy: every failure a user can meet is a :class:`MaxProfileError` with its exit code.

The CLI prints ``max-profile: error: <message>`` (a line of at most 200 characters; the rest on indented lines below
it) and exits with ``exit_code``:

====  =====================================================================================
1     a significant regression above the threshold (``max-profile diff``, the pytest gate): not an error
2     bad input: a flag, a path, a file in the wrong or a damaged format (:class:`InputError`,
      :class:`TraceFormatError`)
3     a tool or library is missing; the message carries the exact install command
      (:class:`ToolMissingError`)
4     the capture itself failed: the profiled program, the server or a profiler died or
      wrote nothing usable (:class:`CaptureError`)
130   interrupted (Ctrl-C); everything the command started was stopped
143   terminated (SIGTERM); everything the command started was stopped
70    anything else: a bug in max_profile (re-run with ``MAX_PROFILE_DEBUG=1`` for the traceback)
====  =====================================================================================
"""

from __future__ import annotations

EXIT_REGRESSION = 1
EXIT_BAD_INPUT = 2
EXIT_TOOL_MISSING = 3
EXIT_CAPTURE_FAILED = 4
EXIT_INCONCLUSIVE = 5
"""``diff`` (and the gates) could not judge: no regression found, none ruled out (see ``DiffResult.inconclusive``)."""
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
"""128 + SIGTERM: a job scheduler or `timeout` ended the command (everything it started was stopped)."""
EXIT_UNEXPECTED = 70
"""sysexits' EX_SOFTWARE: an internal error (exit 1 means a regression was found)."""


class MaxProfileError(Exception):
    """Base of every max_profile error; ``exit_code`` is what the CLI exits with."""

    exit_code: int = EXIT_UNEXPECTED

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(MaxProfileError, ValueError):
    """Bad input: a flag, a path, a profiling target or a model folder that cannot be used."""

    exit_code = EXIT_BAD_INPUT


class TraceFormatError(InputError):
    """A file that is not what it claims or is damaged; the message names the file and the problem."""


class ToolMissingError(MaxProfileError):
    """A profiler or library is not installed or not usable here; the message says how to install it."""

    exit_code = EXIT_TOOL_MISSING


class CaptureError(MaxProfileError, RuntimeError):
    """The capture failed: the workload, the server or the profiler died, hung or wrote nothing usable."""

    exit_code = EXIT_CAPTURE_FAILED


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (``timeout``, a job scheduler): raised in the main thread so every cleanup path that handles
    Ctrl-C runs for it too; the CLI exits 143."""
