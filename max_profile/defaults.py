"""Defaults the command line shows and the code uses, kept where the CLI's parser can read them without loading the
code they configure (``max-profile --help`` imports only this, the registries and argparse)."""

from __future__ import annotations

DEFAULT_KERNEL_SHARE = 0.0625
"""The share of steps the in-process CUPTI recorder records by default: a slice of DEFAULT_SLICE_STEPS steps (the first
one from the start: prefill and the first decode steps), then a pause of fifteen times as many. On an H200 a recorded
step cost 13-14 % of its throughput, graphs or not, so a share s costs about 0.13 s: a sixteenth is under 1 %, a
quarter was 2-6 % (docs/measurements.md)."""
PREFLIGHT_TIMEOUT_S = 60.0
"""Seconds the custom-architecture preflight's child process may take (MAX's import, then the package's)."""
READY_TIMEOUT_S = 900.0
"""Seconds ``serve`` waits for the server's /health to answer 200 (a cold compile takes minutes)."""
