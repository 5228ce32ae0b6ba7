"""Small report parts the truth tests build by hand (each with every required field said once)."""

from __future__ import annotations

from max_profile.model import ServeSummary


def serve_summary(mode: str = "kernels", **fields: object) -> ServeSummary:
    """A ``max serve`` window's client summary: nothing measured unless ``fields`` says it."""
    base: dict[str, object] = {
        "mode": mode,
        "port": 8000,
        "window_s": 10.0,
        "requests": 1,
        "failed_requests": 0,
        "output_tokens": 1,
        "ttft_ms_p50": None,
        "ttft_ms_p90": None,
        "itl_ms_p50": None,
        "itl_ms_p90": None,
        "tokens_per_s": None,
        "time_to_ready_s": None,
    }
    return ServeSummary(**{**base, **fields})  # type: ignore[arg-type]
