"""OpenTelemetry traces (OTLP) as MAX serve exports them: decoded into spans, then into the raw capture's steps (one
per ``max.batch`` forward pass) and requests (``max.request`` with its ``max.phase.prefill`` / ``max.phase.decode``).

MAX serve exports these with no profiler plugin when started with ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=URL``
(``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``) and ``MAX_SERVE_KERNEL_TRACE_LEVEL=batch``; an OpenTelemetry
Collector's ``file`` exporter writes the same payloads as JSON lines. Bodies are OTLP ``ExportTraceServiceRequest``
messages, as protobuf or as OTLP/JSON (hex ids, 64-bit integers as strings). Anything else is refused with
:class:`OtlpFormatError`; sizes are capped (:data:`MAX_BODY_BYTES`, :data:`MAX_SPANS`).
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from max_profile.errors import TraceFormatError

MAX_BODY_BYTES = 32 << 20
"""The largest OTLP body accepted (after decompression): 32 MiB, OTLP/HTTP exporters batch 512 spans by default."""
MAX_SPANS = 200_000
"""The most spans one body may hold."""
MAX_DEPTH = 64
"""The deepest JSON nesting accepted (attribute values nest arrays and key-value lists)."""

BATCH_SPAN = "max.batch"
REQUEST_SPAN = "max.request"
PREFILL_SPAN = "max.phase.prefill"
DECODE_SPAN = "max.phase.decode"

AttributeValue = str | int | float | bool | None | list["AttributeValue"] | dict[str, "AttributeValue"]


class OtlpFormatError(TraceFormatError):
    """An OTLP body or file that is not a well-formed ``ExportTraceServiceRequest`` (or is over the size caps)."""


@dataclass(frozen=True)
class OtlpSpan:
    """One span: times in Unix nanoseconds, ids in lower-case hex, attributes as plain values; ``links`` the trace ids
    it links to; ``resource`` the attributes of the process that exported it (``service.instance.id``, ...)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    links: tuple[str, ...] = ()
    resource: Mapping[str, AttributeValue] = field(default_factory=dict)
    error: bool = False

    def int_attr(self, key: str) -> int | None:
        value = self.attributes.get(key)
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
        return None

    def str_attr(self, key: str) -> str | None:
        value = self.attributes.get(key)
        return None if value is None else str(value)


# ---------------------------------------------------------------------------------------------------- decoding


def decompress(body: bytes, encoding: str | None) -> bytes:
    """``body`` as sent with HTTP ``Content-Encoding`` ``encoding`` (gzip, deflate or none), capped at
    :data:`MAX_BODY_BYTES` decompressed."""
    encoding = (encoding or "").strip().lower()
    if encoding in ("", "identity"):
        plain = body
    elif encoding in ("gzip", "x-gzip", "deflate"):
        wbits = 31 if encoding != "deflate" else 15
        try:
            inflater = zlib.decompressobj(wbits)
            plain = inflater.decompress(body, MAX_BODY_BYTES + 1)
        except zlib.error as exc:
            raise OtlpFormatError(f"body is not valid {encoding} ({exc})") from exc
        if not inflater.eof and len(plain) <= MAX_BODY_BYTES:
            raise OtlpFormatError(f"{encoding} body is truncated")
    else:
        raise OtlpFormatError(f"content encoding {encoding!r} is not supported (gzip, deflate or none)")
    if len(plain) > MAX_BODY_BYTES:
        raise OtlpFormatError(f"body over {MAX_BODY_BYTES >> 20} MiB")
    return plain


def decode_body(body: bytes, content_type: str | None) -> list[OtlpSpan]:
    """The spans of one OTLP/HTTP traces body: ``application/x-protobuf`` (the default) or ``application/json``."""
    if len(body) > MAX_BODY_BYTES:
        raise OtlpFormatError(f"body over {MAX_BODY_BYTES >> 20} MiB")
    kind = (content_type or "application/x-protobuf").split(";")[0].strip().lower()
    if kind == "application/json":
        return decode_json(body)
    if kind in ("application/x-protobuf", "application/protobuf", "application/octet-stream"):
        return decode_protobuf(body)
    raise OtlpFormatError(f"content type {kind!r} is not OTLP (application/x-protobuf or application/json)")


def decode_protobuf(body: bytes) -> list[OtlpSpan]:
    """An ``ExportTraceServiceRequest`` in protobuf wire format (OTLP/HTTP's default, ``http/protobuf``)."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    message = ExportTraceServiceRequest()
    try:
        message.ParseFromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise OtlpFormatError(f"not an OTLP protobuf ExportTraceServiceRequest ({exc})") from exc
    spans: list[OtlpSpan] = []
    for resource_spans in message.resource_spans:
        resource = {kv.key: _proto_value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            _check_count(len(spans) + len(scope_spans.spans))
            for s in scope_spans.spans:
                spans.append(
                    OtlpSpan(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        start_ns=int(s.start_time_unix_nano),
                        end_ns=int(s.end_time_unix_nano),
                        attributes={kv.key: _proto_value(kv.value) for kv in s.attributes},
                        links=tuple(link.trace_id.hex() for link in s.links),
                        resource=resource,
                        error=s.status.code == 2,
                    )
                )
    return spans


def _proto_value(value: object, depth: int = 0) -> AttributeValue:
    kind = value.WhichOneof("value")  # type: ignore[attr-defined]
    if depth > MAX_DEPTH:
        raise OtlpFormatError("attribute values nest too deep")
    if kind == "array_value":
        return [_proto_value(v, depth + 1) for v in value.array_value.values]  # type: ignore[attr-defined]
    if kind == "kvlist_value":
        return {kv.key: _proto_value(kv.value, depth + 1) for kv in value.kvlist_value.values}  # type: ignore[attr-defined]
    if kind == "bytes_value":
        return value.bytes_value.hex()  # type: ignore[attr-defined]
    return None if kind is None else getattr(value, kind)  # type: ignore[no-any-return]


def decode_json(body: bytes | str) -> list[OtlpSpan]:
    """An ``ExportTraceServiceRequest`` in OTLP/JSON (``http/json``; lowerCamelCase keys, hex ids, 64-bit integers as
    strings); snake_case keys (protobuf's JSON mapping of older exporters) are read too."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise OtlpFormatError(f"not JSON ({exc})") from exc
    return spans_of_json(doc)


def spans_of_json(doc: object) -> list[OtlpSpan]:
    """The spans of one decoded OTLP/JSON document."""
    spans: list[OtlpSpan] = []
    for resource_spans in _list(_obj(doc, "request"), "resourceSpans"):
        resource_obj = _get(_obj(resource_spans, "resourceSpans[]"), "resource")
        resource = _attributes(_obj(resource_obj, "resource")) if resource_obj is not None else {}
        scopes = _list(_obj(resource_spans, "resourceSpans[]"), "scopeSpans") or _list(
            _obj(resource_spans, "resourceSpans[]"), "instrumentationLibrarySpans"
        )
        for scope_spans in scopes:
            items = _list(_obj(scope_spans, "scopeSpans[]"), "spans")
            _check_count(len(spans) + len(items))
            for raw in items:
                spans.append(_json_span(_obj(raw, "span"), resource))
    return spans


def _json_span(s: Mapping[str, object], resource: Mapping[str, AttributeValue]) -> OtlpSpan:
    status = _get(s, "status")
    code = _get(_obj(status, "status"), "code") if status is not None else None
    return OtlpSpan(
        name=_str(_get(s, "name"), "name"),
        trace_id=_hex_id(_get(s, "traceId", "trace_id"), "traceId"),
        span_id=_hex_id(_get(s, "spanId", "span_id"), "spanId"),
        parent_span_id=_hex_id(_get(s, "parentSpanId", "parent_span_id"), "parentSpanId"),
        start_ns=_uint64(_get(s, "startTimeUnixNano", "start_time_unix_nano"), "startTimeUnixNano"),
        end_ns=_uint64(_get(s, "endTimeUnixNano", "end_time_unix_nano"), "endTimeUnixNano"),
        attributes=_attributes(s),
        links=tuple(
            _hex_id(_get(_obj(link, "link"), "traceId", "trace_id"), "links[].traceId") for link in _list(s, "links")
        ),
        resource=resource,
        error=code in (2, "STATUS_CODE_ERROR"),
    )


def _check_count(n: int) -> None:
    if n > MAX_SPANS:
        raise OtlpFormatError(f"over {MAX_SPANS} spans in one body")


def _get(doc: Mapping[str, object], *keys: str) -> object:
    if not isinstance(doc, dict):
        raise OtlpFormatError(f"{keys[0]}: expected an object around it, got {type(doc).__name__}")
    for key in keys:
        if key in doc:
            return doc[key]
    return None


def _obj(value: object, what: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise OtlpFormatError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def _list(doc: Mapping[str, object], key: str) -> list[object]:
    value = _get(doc, key, _snake(key))
    if value is None:
        return []
    if not isinstance(value, list):
        raise OtlpFormatError(f"{key}: expected a list, got {type(value).__name__}")
    return value


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def _str(value: object, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise OtlpFormatError(f"{what}: expected a string, got {type(value).__name__}")
    return value


def _hex_id(value: object, what: str) -> str:
    text = _str(value, what).lower()
    if text and (len(text) > 64 or any(c not in "0123456789abcdef" for c in text)):
        raise OtlpFormatError(f"{what}: not a hex id ({text[:40]!r})")
    return text


def _uint64(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise OtlpFormatError(f"{what}: expected an integer, got a boolean")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.isdigit() and len(value) <= 20:
        number = int(value)
    elif value is None:
        number = 0
    else:
        raise OtlpFormatError(f"{what}: expected an unsigned integer, got {str(value)[:40]!r}")
    if not 0 <= number < 1 << 64:
        raise OtlpFormatError(f"{what}: {number} is out of range")
    return number


def _attributes(doc: Mapping[str, object]) -> dict[str, AttributeValue]:
    out: dict[str, AttributeValue] = {}
    for item in _list(doc, "attributes"):
        kv = _obj(item, "attributes[]")
        out[_str(_get(kv, "key"), "attributes[].key")] = _json_value(_get(kv, "value"), 0)
    return out


def _json_value(value: object, depth: int) -> AttributeValue:
    if value is None:
        return None
    if depth > MAX_DEPTH:
        raise OtlpFormatError("attribute values nest too deep")
    v = _obj(value, "AnyValue")
    for key, convert in (
        ("stringValue", lambda x: _str(x, "stringValue")),
        ("boolValue", lambda x: x if isinstance(x, bool) else _bad("boolValue", x)),
        ("intValue", lambda x: _int64(x)),
        ("doubleValue", lambda x: _double(x)),
        ("bytesValue", lambda x: _str(x, "bytesValue")),
    ):
        found = _get(v, key, _snake(key))
        if found is not None:
            return convert(found)  # type: ignore[no-any-return]
    array = _get(v, "arrayValue", "array_value")
    if array is not None:
        return [_json_value(x, depth + 1) for x in _list(_obj(array, "arrayValue"), "values")]
    kvlist = _get(v, "kvlistValue", "kvlist_value")
    if kvlist is not None:
        return {
            _str(_get(_obj(kv, "kvlist[]"), "key"), "key"): _json_value(_get(_obj(kv, "kvlist[]"), "value"), depth + 1)
            for kv in _list(_obj(kvlist, "kvlistValue"), "values")
        }
    return None


def _bad(what: str, value: object) -> NoReturn:
    raise OtlpFormatError(f"{what}: unexpected value {str(value)[:40]!r}")


def _int64(value: object) -> int:
    if isinstance(value, bool):
        _bad("intValue", value)
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.lstrip("-").isdigit() and len(value) <= 21:
        number = int(value)
    else:
        _bad("intValue", value)
    if not -(1 << 63) <= number < 1 << 63:
        raise OtlpFormatError(f"intValue: {number} is out of range")
    return number


def _double(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        _bad("doubleValue", value)
    try:
        return float(value)
    except ValueError:
        _bad("doubleValue", value)


# ---------------------------------------------------------------------------------------------------- files


def read_otlp_file(path: str, data: bytes) -> list[OtlpSpan]:
    """Saved OTLP: a Collector ``file`` exporter's JSON lines (one ``ExportTraceServiceRequest`` per line), one
    OTLP/JSON document, or one protobuf ``ExportTraceServiceRequest`` (``.pb`` / ``.otlp``); gzip is unpacked first."""
    text_like = data.lstrip()[:1] in (b"{", b"[")
    if not text_like:
        return decode_protobuf(data)
    spans: list[OtlpSpan] = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):
            if number == 1:  # one document over several lines
                return decode_json(data)
            raise OtlpFormatError(f"{path}: line {number} is not JSON (truncated?)") from None
        spans.extend(spans_of_json(doc))
        _check_count(len(spans))
    return spans


def collector_json_line(body: bytes, content_type: str | None) -> bytes:
    """One accepted body as a line of an OpenTelemetry Collector ``file`` exporter's output (OTLP/JSON: hex ids,
    lowerCamelCase keys, 64-bit integers as strings), so a saved window reads back through ``max-profile report``."""
    if "json" in (content_type or ""):
        return json.dumps(json.loads(body), separators=(",", ":")).encode() + b"\n"
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    message = ExportTraceServiceRequest()
    message.ParseFromString(body)
    return json.dumps(_hex_ids(MessageToDict(message)), separators=(",", ":")).encode() + b"\n"


def _hex_ids(node: object) -> object:
    """protobuf's JSON mapping writes bytes as base64; OTLP/JSON writes trace and span ids as hex."""
    if isinstance(node, dict):
        return {
            k: base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else _hex_ids(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids(v) for v in node]
    return node


def looks_like_otlp_json(head: str) -> bool:
    """Whether a file's first bytes are OTLP/JSON traces (a ``resourceSpans`` document)."""
    start = head.lstrip()[:400]
    return start.startswith("{") and ('"resourceSpans"' in start or '"resource_spans"' in start)


# ---------------------------------------------------------------------------------------------------- replicas


def replica_names(spans: Iterable[OtlpSpan]) -> dict[int, str]:
    """A replica name per span (keyed by ``id(span)``): ``service.instance.id`` where the exporter set it, else the
    processes joined by the traces they share (a server's API process exports ``max.request``, its model worker the
    ``max.batch`` spans that link to those requests' traces), named ``replica-N`` in order of first span."""
    spans = list(spans)
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    def process_key(s: OtlpSpan) -> str:
        instance = s.resource.get("service.instance.id")
        if instance:
            return f"instance:{instance}"
        session = s.resource.get("telemetry.session") or s.resource.get("process.pid")
        return f"process:{session}" if session else "process:?"

    trace_owner: dict[str, str] = {}
    for s in spans:
        key = process_key(s)
        find(key)
        if s.name == REQUEST_SPAN and not key.startswith("instance:"):
            trace_owner.setdefault(s.trace_id, key)
    for s in spans:
        key = process_key(s)
        if key.startswith("instance:"):
            continue
        for trace_id in (s.trace_id, *s.links):
            owner = trace_owner.get(trace_id)
            if owner is not None:
                union(key, owner)
    names: dict[str, str] = {}
    out: dict[int, str] = {}
    for s in sorted(spans, key=lambda s: s.start_ns):
        root = find(process_key(s))
        if root not in names:
            names[root] = (
                root.removeprefix("instance:") if root.startswith("instance:") else f"replica-{len(names) + 1}"
            )
        out[id(s)] = names[root]
    return out


def iter_named(spans: list[OtlpSpan], name: str) -> Iterator[OtlpSpan]:
    return (s for s in spans if s.name == name)
