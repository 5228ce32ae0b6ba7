"""The words a report says where it proposes no next measurement (the text and HTML reports both say them)."""

from __future__ import annotations

from max_profile.model import Report, Unavailable


def no_next_reason(report: Report) -> str:
    """Why no next measurement is proposed: the question answered, or what was asked for and not measured (never
    "answered" for a section the capture could not fill)."""

    missing = [
        f"{what}: {value.reason}"
        for what, value in (("kernels", report.kernels), ("utilization", report.utilization))
        if isinstance(value, Unavailable) and value.reason
    ]
    ids = {f.id for f in report.findings}
    if "kv-cache-broken" in ids:
        return "none until the KV-cache bug is fixed (a correctness bug: speed figures wait for it)"
    if "host-bound" in ids:
        return (
            "none: the GPU is not the bottleneck, a kernel trace adds nothing until it is busy (see the host "
            "profile above)"
        )
    if missing:
        return "none here, but not everything asked for was measured: " + "; ".join(missing)
    return "none — the question is answered at this level"
