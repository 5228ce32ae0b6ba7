"""MAX serve's spans as forward passes and requests: one :class:`~max_profile.model.Step` per ``max.batch`` span and one
:class:`~max_profile.model.ServerRequest` per ``max.request`` span (with its ``max.phase.prefill`` /
``max.phase.decode``), each named by the replica that exported it.

A pass's kind comes from its ``max.ce_count`` (context-encoding, i.e. prefill, requests) and ``max.tg_count``
(token-generation, i.e. decode, requests): prefill when it holds only CE requests, decode when only TG, mixed when
both. A request's queue is its arrival at the API server to the start of its first pass (``max.first_batch_id``),
its TTFT the end of its prefill phase, its inter-token latency its decode phase over its output tokens after the
first (the spans carry no per-token times).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from max_profile.collect.readers.otlp import (
    BATCH_SPAN,
    DECODE_SPAN,
    PREFILL_SPAN,
    REQUEST_SPAN,
    OtlpFormatError,
    OtlpSpan,
    read_otlp_file,
    replica_names,
)
from max_profile.model import (
    Capture,
    Environment,
    RawCapture,
    RequestRecord,
    ServerRequest,
    Step,
    Unavailable,
    Workload,
)
from max_profile.model.serialization import Phase
from max_profile.model.tags import Collector, StepSource, TargetKind


@dataclass
class SpanPasses:
    """What a set of spans says about a server's work; times on the caller's clock (Unix ns minus ``offset_ns``)."""

    steps: list[Step] = field(default_factory=list)
    server_requests: list[ServerRequest] = field(default_factory=list)
    spans: int = 0
    other_spans: int = 0
    replicas: list[str] = field(default_factory=list)

    def fill(self, raw: RawCapture) -> None:
        """Put the passes and requests into ``raw``: the spans' steps replace any others (the worker hook's, which
        :func:`agreement` compares first), their requests are the server's."""
        raw.steps = list(self.steps)
        raw.server_requests = list(self.server_requests)
        if raw.capture.phase_markers is None or raw.capture.phase_markers == StepSource.NONE:
            raw.capture.phase_markers = StepSource.SPANS
        if Collector.OTLP not in raw.capture.collectors:
            raw.capture.collectors = [*raw.capture.collectors, Collector.OTLP]

    def raw_capture(self, env: Environment, capture: Capture, artifacts: list[str]) -> RawCapture:
        """A raw capture of only these passes and requests (an imported OTLP file)."""
        raw = RawCapture(environment=env, capture=capture, artifacts=artifacts)
        tokens = Counter(r.output_tokens for r in self.server_requests if r.output_tokens)
        prompts = Counter(r.input_tokens for r in self.server_requests if r.input_tokens)
        if tokens:  # what the requests asked for, as the next command reproduces it
            capture.workload = Workload(
                max_new_tokens=tokens.most_common(1)[0][0],
                prompt_tokens=prompts.most_common(1)[0][0] if prompts else None,
            )
        self.fill(raw)
        raw.requests = self.client_view()
        if self.steps:
            raw.window_ns = (min(s.start_ns for s in self.steps), max(s.end_ns for s in self.steps))
        raw.notes.append(
            f"{len(self.steps)} forward passes and {len(self.server_requests)} requests from {self.spans} MAX serve "
            f"spans ({', '.join(self.replicas)}); per-token latency is each request's decode phase over its tokens"
        )
        return raw

    def client_view(self) -> list[RequestRecord]:
        """The requests as :class:`RequestRecord` (what the latency view reads): TTFT from the spans, the decode
        phase's mean gap repeated for each token after the first."""
        out = []
        for r in self.server_requests:
            gaps = r.output_tokens - 1
            itl = [r.decode_ns / gaps / 1e6] * gaps if gaps > 0 and r.decode_ns is not None else []
            out.append(
                RequestRecord(
                    started_ns=r.started_ns,
                    ended_ns=r.ended_ns,
                    ok=r.ok,
                    tokens=r.output_tokens,
                    ttft_ms=None if r.ttft_ns is None else r.ttft_ns / 1e6,
                    itl_ms=itl,
                )
            )
        return out


def pass_phase(ce_count: int, tg_count: int) -> Phase:
    if ce_count and tg_count:
        return "mixed"
    if ce_count:
        return "prefill"
    return "decode" if tg_count else "unknown"


def passes_from_spans(
    spans: Iterable[OtlpSpan], offset_ns: int = 0, windows: Sequence[tuple[int, int]] | None = None
) -> SpanPasses:
    """Steps and requests of ``spans``; ``offset_ns`` is subtracted from their Unix times (a capture's
    ``unix_minus_perf_counter_ns``); with ``windows`` (on the caller's clock: a sweep's levels) only passes and
    requests that end inside one of them are kept (the pauses between levels are no level's)."""
    spans = sorted(spans, key=lambda s: (s.start_ns, s.span_id))
    replica = replica_names(spans)
    requests = {s.str_attr("max.request_id"): s for s in spans if s.name == REQUEST_SPAN}
    prefill = {s.str_attr("max.request_id"): s for s in spans if s.name == PREFILL_SPAN}
    decode = {s.str_attr("max.request_id"): s for s in spans if s.name == DECODE_SPAN}
    batches = [s for s in spans if s.name == BATCH_SPAN]
    batch_by_id = {(replica[id(b)], b.int_attr("max.batch_id")): b for b in batches}
    first_tokens: dict[tuple[str, int | None], int] = {}
    for req in requests.values():
        key = (replica[id(req)], req.int_attr("max.first_batch_id"))
        first_tokens[key] = first_tokens.get(key, 0) + (req.int_attr("gen_ai.usage.input_tokens") or 0)

    def inside(end_ns: int) -> bool:
        return windows is None or any(a <= end_ns - offset_ns <= b for a, b in windows)

    out = SpanPasses(spans=len(spans))
    names = set()
    for b in batches:
        if not inside(b.end_ns):
            continue
        ce, tg = b.int_attr("max.ce_count") or 0, b.int_attr("max.tg_count") or 0
        name = replica[id(b)]
        names.add(name)
        out.steps.append(
            Step(
                index=len(out.steps),
                phase=pass_phase(ce, tg),
                batch_size=ce + tg,
                input_tokens=first_tokens.get((name, b.int_attr("max.batch_id")), ce) + tg,
                context_tokens=None,
                start_ns=b.start_ns - offset_ns,
                end_ns=b.end_ns - offset_ns,
                output_tokens=ce + tg,
                replica=name,
                batch_id=b.int_attr("max.batch_id"),
            )
        )
    for request_id, req in requests.items():
        if not inside(req.end_ns):
            continue
        name = replica[id(req)]
        names.add(name)
        first = batch_by_id.get((name, req.int_attr("max.first_batch_id")))
        pre, dec = prefill.get(request_id), decode.get(request_id)
        out.server_requests.append(
            ServerRequest(
                request_id=request_id or "",
                replica=name,
                started_ns=req.start_ns - offset_ns,
                ended_ns=req.end_ns - offset_ns,
                ok=not req.error,
                input_tokens=req.int_attr("gen_ai.usage.input_tokens") or 0,
                output_tokens=req.int_attr("gen_ai.usage.output_tokens") or 0,
                queue_ns=None if first is None else max(first.start_ns - req.start_ns, 0),
                ttft_ns=None if pre is None else max(pre.end_ns - req.start_ns, 0),
                prefill_ns=None if pre is None else pre.end_ns - pre.start_ns,
                decode_ns=None if dec is None else dec.end_ns - dec.start_ns,
                first_batch_id=req.int_attr("max.first_batch_id"),
                last_batch_id=req.int_attr("max.last_batch_id"),
            )
        )
    out.other_spans = sum(1 for s in spans if s.name not in (BATCH_SPAN, REQUEST_SPAN, PREFILL_SPAN, DECODE_SPAN))
    out.replicas = sorted(names)
    return out


def otlp_capture(path: str) -> RawCapture:
    """A saved OTLP file (a Collector's file exporter JSON lines, one OTLP/JSON document or one protobuf
    ``ExportTraceServiceRequest``) as a raw capture: its passes as steps, its requests, its replicas. Times stay on the
    spans' Unix clock; there are no kernels."""
    from max_profile.util.files import read_input

    try:
        spans = read_otlp_file(path, read_input(path))
    except OtlpFormatError as exc:
        raise OtlpFormatError(str(exc) if path in str(exc) else f"{path}: {exc}") from exc
    passes = passes_from_spans(spans)
    if not passes.steps and not passes.server_requests:
        names = sorted({s.name for s in spans})[:8]
        raise OtlpFormatError(
            f"{path}: {len(spans)} OTLP spans but no MAX serve passes or requests (max.batch / max.request) among them"
            + (f" (span names: {', '.join(names)})" if names else "")
            + "; MAX exports them with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set and MAX_SERVE_KERNEL_TRACE_LEVEL=batch"
        )
    models = Counter(s.str_attr("gen_ai.request.model") for s in spans if s.name == REQUEST_SPAN)
    models.pop(None, None)
    raw = passes.raw_capture(
        Environment(vendor="none", vendor_reason=f"imported OTLP spans ({path}): no device information"),
        Capture(
            started_unix_s=time.time(),
            target=TargetKind.IMPORT.target("otlp"),
            collectors=[Collector.OTLP],
            model_path=models.most_common(1)[0][0] if models else None,
        ),
        artifacts=[os.path.abspath(path)],
    )
    raw.kernels_unavailable = Unavailable("MAX's spans time each forward pass, not its kernels")
    return raw
