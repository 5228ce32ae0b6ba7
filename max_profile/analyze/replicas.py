"""Per-replica figures of a window whose passes and requests came from MAX's spans (``attach --otlp``, ``serve``, an
imported OTLP file): one row per server instance and the fleet's total, and which replica is slowest and why.

Each figure is read off the same steps the step ledger reads (one per ``max.batch`` span) and the requests' own spans:
passes / s over the window, prefill (CE) and decode (TG) time, mean batch size, queue, TTFT and inter-token latency.
Equivalent by hand: group the Collector's ``max.batch`` spans by ``service.instance.id`` and sum their durations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import msgspec
import numpy as np

from max_profile.analyze.load import ended_inside
from max_profile.analyze.steps import phase_shape
from max_profile.model import RawCapture, ReplicaRow, ServerRequest, Step

FLEET = "fleet"


def _mean_ms(values: Sequence[int | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) / 1e6 if kept else None


def _p90_ms(values: Sequence[int | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.percentile(kept, 90)) / 1e6 if kept else None


def _row(
    name: str, steps: Sequence[Step], requests: Sequence[ServerRequest], window_s: float | None, server: str | None
) -> ReplicaRow:
    prefill = [s for s in steps if s.phase in ("prefill", "mixed")]
    decode = [s for s in steps if s.phase == "decode"]
    span_s = window_s
    if span_s is None and steps:
        span_s = (max(s.end_ns for s in steps) - min(s.start_ns for s in steps)) / 1e9
    busy_ns = sum(s.duration_ns for s in steps)
    itl = [
        r.decode_ns / (r.output_tokens - 1) if r.decode_ns is not None and r.output_tokens > 1 else None
        for r in requests
    ]
    return ReplicaRow(
        replica=name,
        passes=len(steps),
        passes_per_s=len(steps) / span_s if span_s else None,
        prefill_passes=len(prefill),
        decode_passes=len(decode),
        prefill_ms=sum(s.duration_ns for s in prefill) / 1e6,
        decode_ms=sum(s.duration_ns for s in decode) / 1e6,
        busy_pct=100.0 * busy_ns / (span_s * 1e9) if span_s else None,
        decode_batch=phase_shape(steps, "decode").batch_figure,
        mean_decode_pass_ms=sum(s.duration_ns for s in decode) / len(decode) / 1e6 if decode else None,
        requests=len(requests),
        failed_requests=sum(1 for r in requests if not r.ok),
        output_tokens=sum(r.output_tokens for r in requests),
        queue_ms=_mean_ms([r.queue_ns for r in requests]),
        ttft_ms=_mean_ms([r.ttft_ns for r in requests]),
        ttft_p90_ms=_p90_ms([r.ttft_ns for r in requests]),
        itl_ms=_mean_ms([None if v is None else int(v) for v in itl]),
        server=server,
    )


def servers_named(raw: RawCapture) -> dict[str, str | None]:
    """Each server the capture watched (``ServeRun.servers``) -> the replica name its spans carry: the replica whose
    ``max.request`` spans hold the ids of the requests sent to that URL (None: none of them arrived as a span)."""
    urls = list(raw.serve.servers) if raw.serve is not None else []
    if not urls:
        return {}
    replica_of = {r.request_id: r.replica for r in raw.server_requests if r.request_id}
    out: dict[str, str | None] = {}
    for url in urls:
        seen = Counter(replica_of[r.request_id] for r in raw.requests if r.server == url and r.request_id in replica_of)
        out[url] = seen.most_common(1)[0][0] if seen else None
    return out


def replica_table(
    steps: Sequence[Step],
    requests: Sequence[ServerRequest],
    windows: Sequence[tuple[int, int]] | None = None,
    servers: Mapping[str, str | None] | None = None,
) -> list[ReplicaRow]:
    """One row per replica (steps and requests carrying a ``replica``) over the measured ``windows`` (passes and
    requests that ended inside them; a sweep's pauses are nobody's time), then the fleet's total when there are
    several. ``servers``: the URLs the capture watched, each named by its replica (:func:`servers_named`): a replica
    gets its URL, and a URL whose server sent nothing gets a silent row of its own. Empty when no step or request names
    a replica and no server was watched."""
    if windows:
        steps = [s for s in steps if ended_inside(s.end_ns, windows)]
        requests = [r for r in requests if ended_inside(r.ended_ns, windows)]
    servers = dict(servers or {})
    names = sorted({s.replica for s in steps if s.replica} | {r.replica for r in requests if r.replica})
    if not names:
        return []
    url_of = {name: url for url, name in servers.items() if name is not None}
    window_s = sum(b - a for a, b in windows) / 1e9 if windows else None
    rows = [
        _row(n, [s for s in steps if s.replica == n], [r for r in requests if r.replica == n], window_s, url_of.get(n))
        for n in names
    ]
    for url, name in servers.items():
        if name is None:  # watched, but no span of it arrived: said, never dropped
            rows.append(msgspec.structs.replace(_row(url, [], [], window_s, url), silent=True))
    if len(rows) > 1:
        fleet = _row(FLEET, [s for s in steps if s.replica], [r for r in requests if r.replica], window_s, None)
        # the fleet's passes and requests add up; its busy share is the mean of the replicas that were seen
        busy = [r.busy_pct for r in rows if r.busy_pct is not None and not r.silent]
        fleet.busy_pct = float(np.mean(busy)) if busy else None
        rows.append(fleet)
    return rows


def slowest_replica(rows: Sequence[ReplicaRow]) -> tuple[ReplicaRow, str] | None:
    """The replica with the highest mean inter-token latency (else TTFT), and why: its decode pass, batch size, queue
    or share of time busy against the other replicas' mean. None with fewer than two replicas seen."""
    replicas = [r for r in rows if r.replica != FLEET and not r.silent]
    if len(replicas) < 2:
        return None

    def key(r: ReplicaRow) -> float:
        return r.itl_ms if r.itl_ms is not None else (r.ttft_ms or 0.0)

    worst = max(replicas, key=key)
    others = [r for r in replicas if r is not worst]
    reasons = []

    def mean(values: list[float | None]) -> float | None:
        kept = [v for v in values if v is not None]
        return float(np.mean(kept)) if kept else None

    for label, mine, theirs, unit in (
        ("decode pass", worst.mean_decode_pass_ms, mean([r.mean_decode_pass_ms for r in others]), "ms"),
        ("decode batch", worst.decode_batch, mean([r.decode_batch for r in others]), ""),
        ("queue", worst.queue_ms, mean([r.queue_ms for r in others]), "ms"),
        ("busy", worst.busy_pct, mean([r.busy_pct for r in others]), "%"),
    ):
        if mine is not None and theirs and mine > 1.2 * theirs:
            reasons.append(f"{label} {mine:.3g}{unit} against {theirs:.3g}{unit} on the others")
    why = "; ".join(reasons) or "no single figure stands out (latencies within 20 % of the others')"
    return worst, why
