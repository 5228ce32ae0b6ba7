"""The per-replica table of an attached fleet, each figure against a truth the test computes from the passes and
requests it drew: a sweep of two levels with a pause between them, two replicas (one slower), a third server that
sent nothing, and the one batch figure the ledger, the table and the decode roofline share."""

from __future__ import annotations

import numpy as np

from max_profile.analyze.replicas import FLEET, replica_table, servers_named, slowest_replica
from max_profile.analyze.report import build_report
from max_profile.model import (
    Capture,
    Environment,
    LoadWindow,
    RawCapture,
    RequestRecord,
    ServerRequest,
    ServeRun,
    Step,
    StepLedger,
)

from .test_ledger import CFG

MS = 1_000_000
S = 1_000_000_000
LEVELS = [(0, 4 * S), (6 * S, 10 * S)]  # two load levels, the 2 s between them a pause


def _passes(replica: str, every_ns: int, pass_ns: int, batches: list[int]) -> list[Step]:
    """Decode passes every ``every_ns`` over both levels and the pause, batch sizes in turn, one prefill per level."""
    out: list[Step] = []
    t = 0
    while t + pass_ns <= 10 * S:
        phase = "prefill" if t in (0, 6 * S) else "decode"
        batch = batches[len(out) % len(batches)]
        out.append(
            Step(
                index=len(out),
                phase=phase,
                batch_size=batch,
                input_tokens=batch if phase == "decode" else 20,
                context_tokens=None,  # MAX's spans say no context length
                start_ns=t,
                end_ns=t + pass_ns,
                output_tokens=batch,
                replica=replica,
            )
        )
        t += every_ns
    return out


def _requests(replica: str, itl_ms: float) -> list[ServerRequest]:
    """A request ending every 0.5 s (in the levels and the pause), 9 tokens, a decode phase of 8 gaps."""
    return [
        ServerRequest(
            request_id=f"{replica}-{k}",
            replica=replica,
            started_ns=k * S // 2 - 200 * MS,
            ended_ns=k * S // 2,
            output_tokens=9,
            ttft_ns=20 * MS,
            decode_ns=int(8 * itl_ms * MS),
        )
        for k in range(1, 21)
    ]


FAST = _passes("fast", 20 * MS, 8 * MS, [4, 4, 5])
SLOW = _passes("slow", 25 * MS, 15 * MS, [2, 3, 3])
REQUESTS = _requests("fast", 9.0) + _requests("slow", 14.0)


def _inside(t: int) -> bool:
    return any(a <= t <= b for a, b in LEVELS)


def test_each_replica_over_the_levels_only_and_the_fleet_adds_them_up() -> None:
    rows = {r.replica: r for r in replica_table([*FAST, *SLOW], REQUESTS, LEVELS)}
    assert set(rows) == {"fast", "slow", FLEET}
    seconds = sum(b - a for a, b in LEVELS) / S
    for name, passes in (("fast", FAST), ("slow", SLOW)):
        kept = [s for s in passes if _inside(s.end_ns)]
        assert len(kept) < len(passes)  # the pause had passes: they are no level's
        row = rows[name]
        assert row.passes == len(kept) and row.passes_per_s == len(kept) / seconds
        assert row.busy_pct == 100 * sum(s.end_ns - s.start_ns for s in kept) / (seconds * S)
        decode = [s.batch_size for s in kept if s.phase == "decode"]
        assert row.decode_batch == round(float(np.median(decode)))
        mine = [r for r in REQUESTS if r.replica == name and _inside(r.ended_ns)]
        assert row.requests == len(mine) and row.output_tokens == 9 * len(mine)
    fleet = rows[FLEET]
    assert fleet.passes == rows["fast"].passes + rows["slow"].passes
    assert fleet.requests == rows["fast"].requests + rows["slow"].requests
    # a replica's busy share is of its own time: the fleet's is their mean, not their sum
    assert fleet.busy_pct == (rows["fast"].busy_pct + rows["slow"].busy_pct) / 2  # type: ignore[operator]
    worst = slowest_replica(list(rows.values()))
    truth = max(("fast", "slow"), key=lambda n: rows[n].itl_ms or 0.0)
    assert truth == "slow" and worst is not None and worst[0].replica == truth
    assert "decode pass" in worst[1]  # 15 ms passes against 8 ms


def test_a_server_watched_that_sent_nothing_is_listed_silent() -> None:
    url_a, url_b, url_c = "http://127.0.0.1:8000", "http://127.0.0.1:8010", "http://127.0.0.1:8020"
    sent = [
        RequestRecord(started_ns=0, ended_ns=S, ok=True, request_id="fast-1", server=url_a),
        RequestRecord(started_ns=0, ended_ns=S, ok=True, request_id="slow-2", server=url_b),
        RequestRecord(started_ns=0, ended_ns=S, ok=True, request_id="never-seen", server=url_c),
    ]
    raw = RawCapture(
        environment=Environment(vendor="none", vendor_reason="test"),
        capture=Capture(started_unix_s=0.0),
        serve=ServeRun(mode="attach", port=8000, servers=[url_a, url_b, url_c]),
        requests=sent,
        server_requests=REQUESTS,
    )
    named = servers_named(raw)
    assert named == {url_a: "fast", url_b: "slow", url_c: None}
    rows = replica_table([*FAST, *SLOW], REQUESTS, LEVELS, named)
    by_name = {r.replica: r for r in rows}
    assert by_name["fast"].server == url_a and by_name["slow"].server == url_b
    silent = by_name[url_c]
    assert silent.silent and silent.passes == 0 and silent.requests == 0
    fleet = by_name[FLEET]
    assert fleet.passes == by_name["fast"].passes + by_name["slow"].passes
    assert fleet.busy_pct == (by_name["fast"].busy_pct + by_name["slow"].busy_pct) / 2  # type: ignore[operator]


def test_one_replicas_batch_is_the_same_figure_in_the_ledger_the_table_and_the_roofline() -> None:
    """One server's passes from its spans over a sweep of two levels: the ledger accounts the levels only (the pause is
    nobody's time outside steps), and its decode batch, the table's and the decode roofline's are one figure; the spans
    give no context length, so the KV cache's bytes are unknown, never zero."""
    windows = [
        LoadWindow(concurrency=c, window_ns=w, requests=[RequestRecord(started_ns=w[0], ended_ns=w[1], ok=True)])
        for c, w in zip((1, 8), LEVELS, strict=True)
    ]
    raw = RawCapture(
        environment=Environment(vendor="none", vendor_reason="test"),
        capture=Capture(started_unix_s=0.0, model_config=CFG),
        serve=ServeRun(mode="attach", port=8000),
        steps=FAST,
        server_requests=_requests("fast", 9.0),
        load_windows=windows,
        window_ns=(LEVELS[0][0], LEVELS[-1][1]),
    )
    report = build_report(raw)
    kept = [s for s in FAST if _inside(s.end_ns)]
    decode = [s for s in kept if s.phase == "decode"]
    batch = round(float(np.median([s.batch_size for s in decode])))
    lg = report.ledger
    assert isinstance(lg, StepLedger)
    observed_ms = sum(b - a for a, b in LEVELS) / MS
    inside_ms = sum(s.end_ns - s.start_ns for s in kept) / MS
    assert lg.window_ms == round(observed_ms, 6)
    assert abs(lg.outside_steps_ms - (observed_ms - inside_ms)) < 1e-3
    ledger_decode = next(p for p in lg.phases if p.phase == "decode")
    assert ledger_decode.steps == len(decode) and ledger_decode.batch == batch
    assert report.replicas[0].decode_batch == batch
    assert report.decode_cost is not None and report.decode_cost.batch == batch
    assert report.decode_cost.context_tokens is None and report.decode_cost.kv_bytes is None
    outside = next((f for f in report.findings if f.id == "time-outside-steps"), None)
    if outside is not None:  # the lever, if any, is the levels' own time between passes, never the pause
        assert outside.evidence["window_ms"] == lg.window_ms
