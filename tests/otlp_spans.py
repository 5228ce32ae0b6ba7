"""OTLP bodies built the way MAX serve builds them: spans made with the OpenTelemetry SDK (the names and attributes of
MAX 26.7's ``max.request``, ``max.phase.prefill`` / ``max.phase.decode`` and ``max.batch``), encoded by the SDK's own
OTLP encoder (protobuf), and as OTLP/JSON the way a Collector's ``file`` exporter writes it (hex ids, 64-bit integers
as strings, one ``ExportTraceServiceRequest`` per line)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class _Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: object) -> SpanExportResult:
        self.spans.extend(spans)  # type: ignore[arg-type]
        return SpanExportResult.SUCCESS


@dataclass
class Served:
    """What one replica's spans say, to check a reader against."""

    spans: list[ReadableSpan]
    requests: int
    prefill_passes: int
    decode_passes: int
    output_tokens: int


def served_spans(
    instance: str | None = "replica-a",
    requests: int = 3,
    output_tokens: int = 16,
    input_tokens: int = 7,
    start_ns: int = 1_700_000_000_000_000_000,
    pass_ns: int = 2_000_000,
    batch_id0: int = 1,
) -> Served:
    """``requests`` requests served one after another: each a prefill pass and ``output_tokens - 1`` decode passes of
    ``pass_ns``, as MAX's API process (the request span) and model worker (phase and batch spans) record them."""
    attrs = {"service.name": "max-serve"} | ({"service.instance.id": instance} if instance else {})
    api = TracerProvider(resource=Resource.create(attrs | {"telemetry.session": f"api-{instance}"}))
    worker = TracerProvider(resource=Resource.create(attrs | {"telemetry.session": f"worker-{instance}"}))
    keep = _Keep()
    api.add_span_processor(SimpleSpanProcessor(keep))
    worker.add_span_processor(SimpleSpanProcessor(keep))
    api_tracer, worker_tracer = api.get_tracer("max.serve"), worker.get_tracer("max.serve")
    t = start_ns
    batch_id = batch_id0
    for n in range(requests):
        req_id = f"{instance}-req-{n}"
        request = api_tracer.start_span(
            "max.request", start_time=t, attributes={"max.request_id": req_id, "gen_ai.request.model": "tiny"}
        )
        ctx = trace.set_span_in_context(request)
        link = trace.Link(request.get_span_context())
        t += 1_000_000  # to the worker's queue
        prefill = worker_tracer.start_span(
            "max.phase.prefill", context=ctx, start_time=t, attributes={"max.request_id": req_id}
        )
        first = batch_id
        for k in range(output_tokens):
            ce = 1 if k == 0 else 0
            batch = worker_tracer.start_span(
                "max.batch",
                start_time=t,
                links=[link],
                attributes={"max.batch_id": batch_id, "max.ce_count": ce, "max.tg_count": 1 - ce},
            )
            t += pass_ns
            batch.set_attribute("max.terminated_count", int(k == output_tokens - 1))
            batch.end(end_time=t)
            if k == 0:
                prefill.set_attribute("max.batch_id", batch_id)
                prefill.end(end_time=t)
                decode = worker_tracer.start_span(
                    "max.phase.decode",
                    context=ctx,
                    start_time=t,
                    attributes={"max.request_id": req_id, "max.batch_id": batch_id},
                )
            batch_id += 1
        decode.end(end_time=t)
        t += 200_000
        request.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        request.set_attribute("gen_ai.usage.output_tokens", output_tokens)
        request.set_attribute("max.first_batch_id", first)
        request.set_attribute("max.last_batch_id", batch_id - 1)
        request.end(end_time=t)
        t += 500_000
    return Served(keep.spans, requests, requests, requests * (output_tokens - 1), requests * output_tokens)


def protobuf_body(spans: list[ReadableSpan]) -> bytes:
    """One ``ExportTraceServiceRequest`` as OTLP/HTTP's ``http/protobuf`` sends it."""
    return encode_spans(spans).SerializeToString()  # type: ignore[no-any-return]


def _hex_ids(node: object) -> object:
    """protobuf's JSON mapping writes bytes as base64; OTLP/JSON writes trace and span ids as hex."""
    import base64

    if isinstance(node, dict):
        return {
            k: base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else _hex_ids(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids(v) for v in node]
    return node


def json_document(spans: list[ReadableSpan]) -> dict[str, object]:
    """One ``ExportTraceServiceRequest`` in OTLP/JSON."""
    return _hex_ids(MessageToDict(encode_spans(spans)))  # type: ignore[return-value]


def collector_file_lines(*batches: list[ReadableSpan]) -> bytes:
    """A Collector ``file`` exporter's output: one OTLP/JSON document per exported batch, one per line."""
    return b"".join(json.dumps(json_document(b), separators=(",", ":")).encode() + b"\n" for b in batches)
