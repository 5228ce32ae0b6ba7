"""MAX's OTLP spans as a source: decoding (protobuf, OTLP/JSON, a Collector's file exporter), passes and requests,
replicas, the receiver over HTTP, and 10,000 fuzzed bodies."""

from __future__ import annotations

import gzip
import http.client
import json
import random
from pathlib import Path

import pytest

from max_profile.analyze.replicas import replica_table
from max_profile.analyze.report import build_report
from max_profile.collect.readers.otlp import (
    MAX_BODY_BYTES,
    OtlpFormatError,
    decode_body,
    decode_json,
    decode_protobuf,
    read_otlp_file,
)
from max_profile.collect.readers.otlp_passes import passes_from_spans
from max_profile.collect.readers.sources import import_trace
from max_profile.collect.server.otlp_receiver import OtlpReceiver, parse_listen
from max_profile.errors import InputError, MaxProfileError

from ...conftest import DATA
from ...otlp_spans import collector_file_lines, json_document, protobuf_body, served_spans


def test_protobuf_and_json_decode_to_the_same_spans() -> None:
    served = served_spans()
    from_proto = decode_protobuf(protobuf_body(served.spans))
    from_json = decode_json(json.dumps(json_document(served.spans)))
    assert len(from_proto) == len(served.spans) == 3 * (16 + 3)
    assert from_proto == from_json
    batch = next(s for s in from_proto if s.name == "max.batch")
    assert batch.int_attr("max.ce_count") == 1 and batch.links and len(batch.trace_id) == 32


def test_passes_and_requests_from_the_spans() -> None:
    served = served_spans(requests=3, output_tokens=16, input_tokens=7, pass_ns=2_000_000)
    passes = passes_from_spans(decode_protobuf(protobuf_body(served.spans)))
    phases = [s.phase for s in passes.steps]
    assert phases.count("prefill") == served.prefill_passes == 3
    assert phases.count("decode") == served.decode_passes == 45
    assert all(s.duration_ns == 2_000_000 for s in passes.steps)
    assert [s.input_tokens for s in passes.steps if s.phase == "prefill"] == [7, 7, 7]  # from the request spans
    assert len(passes.server_requests) == 3
    for r in passes.server_requests:
        assert r.output_tokens == 16 and r.input_tokens == 7 and r.replica == "replica-a"
        assert r.queue_ns == 1_000_000  # arrival to its first pass
        assert r.ttft_ns == 3_000_000 and r.prefill_ns == 2_000_000 and r.decode_ns == 15 * 2_000_000
    records = passes.client_view()
    assert [len(r.itl_ms) for r in records] == [15, 15, 15] and records[0].itl_ms[0] == pytest.approx(2.0)


def test_a_window_keeps_the_passes_that_end_inside_it() -> None:
    served = served_spans(requests=2, output_tokens=4, start_ns=10_000_000_000)
    spans = decode_protobuf(protobuf_body(served.spans))
    everything = passes_from_spans(spans, offset_ns=10_000_000_000)
    first_request_end = everything.server_requests[0].ended_ns
    part = passes_from_spans(spans, offset_ns=10_000_000_000, windows=[(0, first_request_end)])
    assert len(part.server_requests) == 1 and len(part.steps) == 4
    # two windows with a pause between them: the passes and requests that ended in the pause are nobody's
    ends = sorted(s.end_ns for s in everything.steps)
    second = (everything.server_requests[1].ended_ns - 1, everything.server_requests[1].ended_ns)
    pause = [e for e in ends if first_request_end < e < second[0]]
    split = passes_from_spans(spans, offset_ns=10_000_000_000, windows=[(0, first_request_end), second])
    assert len(split.server_requests) == 2 and pause
    assert len(split.steps) == len([e for e in ends if e <= first_request_end or second[0] <= e <= second[1]])
    assert len(split.steps) == len(everything.steps) - len(pause)


def test_replicas_are_named_by_instance_or_joined_by_their_traces() -> None:
    a = served_spans(instance="a", requests=2, batch_id0=1)
    b = served_spans(instance=None, requests=3, batch_id0=1, start_ns=1_700_000_000_500_000_000)
    spans = decode_protobuf(protobuf_body(a.spans + b.spans))
    passes = passes_from_spans(spans)
    # b has no instance id: its API and worker processes are joined by the traces the batches link to
    assert passes.replicas == ["a", "replica-2"]
    assert sorted({s.replica for s in passes.steps}) == ["a", "replica-2"]
    rows = {r.replica: r for r in replica_table(passes.steps, passes.server_requests)}
    assert rows["a"].passes == 2 * 16 and rows["replica-2"].passes == 3 * 16
    assert rows["a"].requests == 2 and rows["replica-2"].output_tokens == 48


def test_collector_file_export_reads_through_report(tmp_path: Path) -> None:
    served = served_spans(requests=3)
    path = tmp_path / "traces.jsonl"
    path.write_bytes(collector_file_lines(served.spans[:20], served.spans[20:]))
    raw = import_trace(str(path))
    assert len(raw.steps) == 48 and len(raw.server_requests) == 3
    report = build_report(raw)
    from_proto = passes_from_spans(decode_protobuf(protobuf_body(served.spans)))
    assert [s.duration_ns for s in report.steps] == [s.duration_ns for s in from_proto.steps]
    assert report.replicas and report.replicas[0].passes == 48
    gz = tmp_path / "traces.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert len(import_trace(str(gz)).steps) == 48


def test_real_max_serve_spans_read_back() -> None:
    """The spans a real CPU `max serve` sent (tests/data/cpu/tiny_llama_otlp_spans): 3 requests of 8 tokens."""
    raw = import_trace(str(DATA / "cpu" / "tiny_llama_otlp_spans" / "spans.jsonl"))
    assert [s.phase for s in raw.steps].count("prefill") == 3 and [s.phase for s in raw.steps].count("decode") == 21
    assert {s.replica for s in raw.steps} == {"tiny-cpu"} and len(raw.server_requests) == 3
    assert all(r.output_tokens == 8 and r.ttft_ns and r.queue_ns is not None for r in raw.server_requests)
    report = build_report(raw)
    assert report.ledger is not None and report.ledger.source == "MAX serve spans"  # type: ignore[union-attr]
    assert report.replicas[0].passes == 24


def test_truncated_collector_file_is_refused(tmp_path: Path) -> None:
    served = served_spans(requests=2)
    data = collector_file_lines(served.spans[:10], served.spans[10:])
    path = tmp_path / "cut.jsonl"
    path.write_bytes(data[: len(data) - 40])
    with pytest.raises(OtlpFormatError, match="line 2"):
        read_otlp_file(str(path), path.read_bytes())


def _post(port: int, body: bytes, headers: dict[str, str], path: str = "/v1/traces") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_receiver_takes_protobuf_json_and_gzip_and_counts_what_it_refuses() -> None:
    served = served_spans(requests=1, output_tokens=4)
    proto = protobuf_body(served.spans)
    with OtlpReceiver(port=0) as receiver:
        assert receiver.host == "127.0.0.1"
        assert _post(receiver.port, proto, {"Content-Type": "application/x-protobuf"}) == 200
        assert (
            _post(receiver.port, json.dumps(json_document(served.spans)).encode(), {"Content-Type": "application/json"})
            == 200
        )
        zipped = gzip.compress(proto)
        assert (
            _post(receiver.port, zipped, {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}) == 200
        )
        assert _post(receiver.port, b"\xff\x00garbage", {"Content-Type": "application/x-protobuf"}) == 400
        assert _post(receiver.port, b"{}", {"Content-Type": "text/plain"}) == 400
        assert _post(receiver.port, proto, {"Content-Type": "application/x-protobuf"}, path="/v1/logs") == 200
        assert (
            _post(receiver.port, zipped[:-9], {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
            == 400
        )
        assert len(receiver.spans()) == 3 * len(served.spans)
        assert receiver.refused["malformed"] == 3 and receiver.other_signals == 1
    with pytest.raises(OSError):
        _post(receiver.port, proto, {"Content-Type": "application/x-protobuf"})  # stopped with the window


def test_receiver_caps_spans_and_body_size() -> None:
    served = served_spans(requests=2, output_tokens=4)
    with OtlpReceiver(port=0, max_spans=5) as receiver:
        receiver.accept(protobuf_body(served.spans), "application/x-protobuf")
        assert len(receiver.spans()) == 5 and receiver.dropped_spans == len(served.spans) - 5
        with pytest.raises(OtlpFormatError, match="MiB"):
            receiver.accept(gzip.compress(b"\x00" * (MAX_BODY_BYTES + 10)), "application/x-protobuf", "gzip")
        assert (
            _post(receiver.port, b"", {"Content-Type": "application/x-protobuf", "Content-Length": str(1 << 40)}) == 413
        )


def test_listen_address_is_checked() -> None:
    assert parse_listen("4318") == ("127.0.0.1", 4318)
    assert parse_listen("0.0.0.0:4318") == ("0.0.0.0", 4318)
    with pytest.raises(InputError, match=r"\[HOST:\]PORT"):
        parse_listen("localhost:http")


def _mutate(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randint(1, 8)):
        op = rng.random()
        if op < 0.35 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif op < 0.55 and data:
            cut = rng.randrange(len(data))
            data = data[:cut] if rng.random() < 0.5 else data[cut:]
        elif op < 0.75:
            at = rng.randrange(len(data) + 1)
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op < 0.9 and len(data) > 4:
            a, b = sorted(rng.sample(range(len(data)), 2))
            data[a:a] = data[a:b]  # a repeated field or nested message
        else:
            data = bytearray(
                rng.choice([b"", b"{", b"[]", b"null", b'{"resourceSpans": 5}', b"\x0a\xff\xff\xff\xff\x0f"])
            )
    return bytes(data)


def _mutate_json(rng: random.Random, doc: object) -> object:
    """One JSON node swapped for a value of the wrong kind, an out-of-range number or a deep nest."""
    if isinstance(doc, dict) and doc:
        key = rng.choice(list(doc))
        if rng.random() < 0.3:
            return {**doc, key: rng.choice([None, 1, -1, "x", [], {}, 2**70, "18446744073709551616", True, 1.5])}
        return {**doc, key: _mutate_json(rng, doc[key])}
    if isinstance(doc, list) and doc:
        i = rng.randrange(len(doc))
        return [*doc[:i], _mutate_json(rng, doc[i]), *doc[i + 1 :]]
    return rng.choice([None, "zz", -5, {"arrayValue": {"values": [{"arrayValue": {}}] * 3}}, [1] * 3])


def test_ten_thousand_fuzzed_bodies_are_read_or_refused_with_a_typed_error() -> None:
    rng = random.Random(20261206)
    served = served_spans(requests=2, output_tokens=5)
    seeds = [
        (protobuf_body(served.spans), "application/x-protobuf"),
        (json.dumps(json_document(served.spans)).encode(), "application/json"),
    ]
    doc = json_document(served.spans)
    outcomes = {"read": 0, "refused": 0}
    with OtlpReceiver(port=0) as receiver:
        for n in range(10_000):
            body, kind = seeds[n % 2]
            if n % 4 == 3:
                body = json.dumps(_mutate_json(rng, doc)).encode()
            else:
                body = _mutate(rng, body)
            try:
                spans = receiver.accept(body, kind)
                passes_from_spans(receiver.spans()[-spans:] if spans else [])
                outcomes["read"] += 1
            except MaxProfileError:
                outcomes["refused"] += 1
        # through HTTP too: the server thread survives every one
        for _ in range(50):
            assert _post(receiver.port, _mutate(rng, seeds[0][0]), {"Content-Type": "application/x-protobuf"}) in (
                200,
                400,
            )
        assert _post(receiver.port, seeds[0][0], {"Content-Type": "application/x-protobuf"}) == 200
    assert outcomes["read"] + outcomes["refused"] == 10_000
    assert outcomes["refused"] > 1_000 and outcomes["read"] > 100  # both paths exercised


def test_garbage_is_refused_by_content_type() -> None:
    with pytest.raises(OtlpFormatError, match="content type"):
        decode_body(b"{}", "text/html")
    with pytest.raises(OtlpFormatError, match="not JSON"):
        decode_body(b"{", "application/json")
