"""MAX's spans read as passes and requests, each figure held to a truth the test computes from the spans it built (the
OpenTelemetry SDK's own span objects): times, phases, batch sizes and tokens per pass, on both clocks, from protobuf,
OTLP/JSON and the snake_case JSON of older exporters."""

from __future__ import annotations

import json
import re

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from max_profile.collect.readers.otlp import decode_json, decode_protobuf
from max_profile.collect.readers.otlp_passes import passes_from_spans

from ...otlp_spans import _Keep, json_document, protobuf_body, served_spans

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def _snake(node: object) -> object:
    """An OTLP/JSON document with snake_case keys (protobuf's JSON mapping as older exporters write it)."""
    if isinstance(node, dict):
        return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): _snake(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_snake(v) for v in node]
    return node


def test_every_span_keeps_its_own_start_and_end_in_every_encoding() -> None:
    served = served_spans(requests=2, output_tokens=3)
    truth = sorted((s.name, s.start_time, s.end_time) for s in served.spans)
    assert all(start != end for _, start, end in truth)  # a reader that took one time for the other shows
    camel = json_document(served.spans)
    for decoded in (
        decode_protobuf(protobuf_body(served.spans)),
        decode_json(json.dumps(camel)),
        decode_json(json.dumps(_snake(camel))),
    ):
        assert sorted((s.name, s.start_ns, s.end_ns) for s in decoded) == truth


def _mixed_spans() -> list[ReadableSpan]:
    """Three passes of one worker, as MAX exports them: CE only, CE and TG together (in-flight batching), TG only;
    two requests start in the same first pass (their prompt tokens both fed by it)."""
    worker = TracerProvider(resource=Resource.create({"service.instance.id": "r"}))
    keep = _Keep()
    worker.add_span_processor(SimpleSpanProcessor(keep))
    tracer = worker.get_tracer("max.serve")
    passes = [(1, 2, 0), (2, 1, 3), (3, 0, 4)]  # (batch id, CE requests, TG requests)
    t = T0
    for batch_id, ce, tg in passes:
        span = tracer.start_span(
            "max.batch", start_time=t, attributes={"max.batch_id": batch_id, "max.ce_count": ce, "max.tg_count": tg}
        )
        t += 5 * MS
        span.end(end_time=t)
    prompts = {"a": (1, 11), "b": (1, 17), "c": (2, 29)}  # request -> (first batch, prompt tokens)
    for rid, (first, prompt) in prompts.items():
        req = tracer.start_span(
            "max.request",
            start_time=T0,
            attributes={
                "max.request_id": rid,
                "max.first_batch_id": first,
                "gen_ai.usage.input_tokens": prompt,
                "gen_ai.usage.output_tokens": 4,
            },
        )
        with trace.use_span(req):
            pass
        req.end(end_time=t + MS)
    return keep.spans


def test_each_pass_is_its_own_kind_batch_and_tokens_on_the_callers_clock() -> None:
    spans = _mixed_spans()
    offset = 123 * MS
    passes = passes_from_spans(decode_protobuf(protobuf_body(spans)), offset_ns=offset)
    batches = sorted((s for s in spans if s.name == "max.batch"), key=lambda s: s.start_time)
    requests = [s for s in spans if s.name == "max.request"]
    assert len(passes.steps) == len(batches) == 3
    for step, span in zip(sorted(passes.steps, key=lambda s: s.start_ns), batches, strict=True):
        a = span.attributes
        ce, tg = int(a["max.ce_count"]), int(a["max.tg_count"])
        phase = "mixed" if ce and tg else "prefill" if ce else "decode"
        # the prompt tokens of every request whose first pass this was, summed, plus one token per decoding request
        fed = sum(
            int(r.attributes["gen_ai.usage.input_tokens"])
            for r in requests
            if r.attributes["max.first_batch_id"] == a["max.batch_id"]
        )
        assert (step.phase, step.batch_size, step.input_tokens) == (phase, ce + tg, (fed or ce) + tg)
        # on the caller's clock: the span's Unix times less the offset, each end its own
        assert (step.start_ns, step.end_ns) == (span.start_time - offset, span.end_time - offset)
        assert step.context_tokens is None  # the spans carry no context lengths: unknown, never 0
    for req in passes.server_requests:
        span = next(s for s in requests if s.attributes["max.request_id"] == req.request_id)
        assert (req.started_ns, req.ended_ns) == (span.start_time - offset, span.end_time - offset)
