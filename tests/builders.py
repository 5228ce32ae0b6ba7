"""Small report parts the truth tests build by hand (each with every required field said once)."""

from __future__ import annotations

from pathlib import Path

from max_profile.analyze.report import build_report
from max_profile.model import LatencyStats, LoadLevel, RawCapture, Report, ServerMetrics, ServeSummary

_BUILT: dict[Path, Report] = {}


def built_report(path: Path) -> Report:
    """The report of a recorded raw capture, built once per test session (tests/conftest.py empties the cache at each
    session's start: a mutation run forks sessions from one process, and a report built by other code would hide a
    mutant). Tests change copies of it (msgspec.structs.replace), never the report itself."""
    if path not in _BUILT:
        _BUILT[path] = build_report(RawCapture.load(str(path)))
    return _BUILT[path]


def forget_built_reports() -> None:
    _BUILT.clear()


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


def load_level(
    concurrency: int,
    tok_s: float,
    *,
    itl: float | None,
    itl_p99: float | None,
    ttft: float | None,
    gpu: float | None = None,
    server: ServerMetrics | None = None,
) -> LoadLevel:
    """One level of a load sweep: 10 requests over a 10 s window, all completed, ``tok_s`` output tokens/s, the
    latencies as given (TTFT the same at every percentile, ITL's p50 and p90 at ``itl``)."""
    return LoadLevel(
        concurrency=concurrency,
        window_s=10.0,
        requests=10,
        completed=10,
        failed=0,
        output_tokens=int(tok_s * 10),
        output_tok_per_s=tok_s,
        request_rate_rps=1.0,
        ttft_ms=LatencyStats(p50=ttft, p90=ttft, p99=ttft, samples=10),
        itl_ms=LatencyStats(p50=itl, p90=itl, p99=itl_p99, samples=100),
        gpu_utilization_pct=gpu,
        server=server,
    )
