"""Profile ``max serve``: planned, confirmed, warmed, bounded, fail-fast, and cleaned up — one lifecycle for every mode.

    max-profile serve --model-path P [--devices D] [--mode utilization|kernels|ops|nsys|rocprof] [--duration 10]
                      [--concurrency 1,4,16] [--slo ttft=MS,itl=MS] [--yes] [-- EXTRA SERVE FLAGS]

``plan`` holds what was asked (:class:`ServePlan`) and the same plan resolved once (:class:`ResolvedServe`); ``modes``
the registry of serve modes and :func:`resolve_plan`; ``lifecycle`` the one server lifecycle every mode runs
(:func:`run_serve_capture`).

From Python::

    from max_profile.serve import ServePlan, free_port, run_serve_capture
    raw = run_serve_capture(ServePlan(model_path="M", devices="gpu", mode="kernels", duration_s=10,
                                      port=free_port(), metrics_port=free_port()), confirm=True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from max_profile.util.lazy import lazy_attributes

if TYPE_CHECKING:  # the names for type checkers; at run time each module loads on first use (PEP 562)
    from max_profile.collect.server.server_process import free_port, scan_server_log, server_tmpdir
    from max_profile.serve.lifecycle import READY_TIMEOUT_S, new_serve_raw, run_serve_capture, serve_windows, warm_pass
    from max_profile.serve.modes import SERVE_MODES, check_plan, resolve_plan, serve_mode
    from max_profile.serve.plan import ModeContext, ResolvedServe, ServeMode, ServePlan

_LAZY = {
    "free_port": "max_profile.collect.server.server_process",
    "scan_server_log": "max_profile.collect.server.server_process",
    "server_tmpdir": "max_profile.collect.server.server_process",
    "READY_TIMEOUT_S": "max_profile.serve.lifecycle",
    "new_serve_raw": "max_profile.serve.lifecycle",
    "run_serve_capture": "max_profile.serve.lifecycle",
    "serve_windows": "max_profile.serve.lifecycle",
    "warm_pass": "max_profile.serve.lifecycle",
    "SERVE_MODES": "max_profile.serve.modes",
    "check_plan": "max_profile.serve.modes",
    "resolve_plan": "max_profile.serve.modes",
    "serve_mode": "max_profile.serve.modes",
    "ModeContext": "max_profile.serve.plan",
    "ResolvedServe": "max_profile.serve.plan",
    "ServeMode": "max_profile.serve.plan",
    "ServePlan": "max_profile.serve.plan",
}
"""Where each name lives: the serve mode registry loads without the lifecycle (the CLI's parser reads it)."""


__getattr__ = lazy_attributes(globals(), _LAZY)


__all__ = [
    "READY_TIMEOUT_S",
    "SERVE_MODES",
    "ModeContext",
    "ResolvedServe",
    "ServeMode",
    "ServePlan",
    "check_plan",
    "free_port",
    "new_serve_raw",
    "resolve_plan",
    "run_serve_capture",
    "scan_server_log",
    "serve_mode",
    "serve_windows",
    "server_tmpdir",
    "warm_pass",
]
