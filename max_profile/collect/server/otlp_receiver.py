"""A local OTLP/HTTP traces receiver for the length of a window: what ``serve`` points its server at and what ``attach
--otlp`` listens on (MAX serve, or an OpenTelemetry Collector's ``otlphttp`` exporter, sends to it).

It answers ``POST /v1/traces`` with protobuf (``application/x-protobuf``) or OTLP/JSON (``application/json``) bodies,
gzip or deflate encoded or not, as an OTLP/HTTP server must (an empty ``ExportTraceServiceResponse``). It binds to
127.0.0.1 unless told otherwise, refuses bodies over :data:`~max_profile.collect.readers.otlp.MAX_BODY_BYTES` and
spans past ``max_spans``, counts every refused body by reason, and never lets one body stop it. Equivalent by hand:
an OpenTelemetry Collector with an ``otlp`` receiver and a ``file`` exporter, read back with ``max-profile report``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from max_profile.collect.readers.otlp import (
    MAX_BODY_BYTES,
    OtlpFormatError,
    OtlpSpan,
    collector_json_line,
    decode_body,
    decompress,
)
from max_profile.errors import InputError
from max_profile.util.procs import raise_pending_signal

TRACES_PATH = "/v1/traces"
OTHER_SIGNALS = ("/v1/metrics", "/v1/logs")
"""Accepted and dropped: an exporter pointed at this receiver with ``OTEL_EXPORTER_OTLP_ENDPOINT`` sends its metrics
(and logs) here too, and MAX sends its metrics to Modular's collector unless that variable is set."""
DEFAULT_MAX_SPANS = 2_000_000
"""Spans one receiver keeps over a window (a pass is one ``max.batch`` span: hours of a busy server)."""
READ_TIMEOUT_S = 10.0


def _process_of(span: OtlpSpan) -> str:
    """The exporting process of a span (MAX's per-process ``telemetry.session``, else its instance)."""
    return str(span.resource.get("telemetry.session") or span.resource.get("service.instance.id"))


def parse_listen(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``[HOST:]PORT`` as given to ``--otlp``; :class:`InputError` when it is not one."""
    host, _, port_text = text.rpartition(":")
    host = host.strip("[]") or default_host
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise InputError(f"--otlp {text!r}: expected [HOST:]PORT, e.g. 4318 or 0.0.0.0:4318")
    return host, int(port_text)


class OtlpReceiver:
    """Receives OTLP traces on ``host:port`` (port 0: any free port, see :attr:`port`) until :meth:`stop`."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, max_spans: int = DEFAULT_MAX_SPANS, keep_bodies: bool = False
    ) -> None:
        self.max_spans = max_spans
        self.keep_bodies = keep_bodies
        self._bodies: list[bytes] = []
        self.refused: Counter[str] = Counter()
        self.bodies = 0
        self.other_signals = 0
        self.dropped_spans = 0
        self._spans: list[OtlpSpan] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            timeout = READ_TIMEOUT_S
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                status, reason = receiver._receive(self)
                response = b"{}" if "json" in (self.headers.get("Content-Type") or "") else b""
                self.send_response(status)
                self.send_header("Content-Type", self.headers.get("Content-Type") or "application/x-protobuf")
                self.send_header("Content-Length", str(len(response) if status == 200 else len(reason)))
                self.end_headers()
                self.wfile.write(response if status == 200 else reason.encode())

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_error(405, "POST OTLP traces to /v1/traces")

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise InputError(f"cannot receive OTLP on {host}:{port} ({exc}); give a free port (--otlp PORT)") from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """The URL an exporter's ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` takes."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}{TRACES_PATH}"

    def spans(self) -> list[OtlpSpan]:
        with self._lock:
            return list(self._spans)

    def save(self, path: str) -> int:
        """The bodies received (``keep_bodies``) as a Collector ``file`` exporter's JSON lines at ``path``; how many."""
        from max_profile.util.files import write_output

        with self._lock:
            lines = list(self._bodies)
        write_output(path, b"".join(lines))
        return len(lines)

    def wait_past(self, end_unix_ns: int, timeout_s: float) -> bool:
        """Wait until every process that exported here has sent a span ending after ``end_unix_ns`` (its spans before
        that are then in: an exporter sends spans in the order they end), or ``timeout_s`` has passed; whether they
        all had."""
        deadline = time.monotonic() + timeout_s
        while True:
            raise_pending_signal()
            spans = self.spans()
            processes = {_process_of(s) for s in spans}
            if spans and processes <= {_process_of(s) for s in spans if s.end_ns > end_unix_ns}:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> OtlpReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self) -> str:
        refused = ", ".join(f"{n} {why}" for why, n in sorted(self.refused.items()))
        return (
            f"{len(self._spans)} spans in {self.bodies} OTLP bodies on {self.endpoint}"
            + (f"; refused: {refused}" if refused else "")
            + (f"; {self.dropped_spans} spans over the {self.max_spans} cap dropped" if self.dropped_spans else "")
        )

    def accept(self, body: bytes, content_type: str | None, encoding: str | None = None) -> int:
        """Decode one body and keep its spans (what a POST does); :class:`OtlpFormatError` when it is refused."""
        plain = decompress(body, encoding)
        spans = decode_body(plain, content_type)
        with self._lock:
            self.bodies += 1
            if self.keep_bodies and len(self._spans) < self.max_spans:
                self._bodies.append(collector_json_line(plain, content_type))
            room = max(self.max_spans - len(self._spans), 0)
            self._spans.extend(spans[:room])
            self.dropped_spans += max(len(spans) - room, 0)
        return len(spans)

    def _receive(self, request: BaseHTTPRequestHandler) -> tuple[int, str]:
        path = request.path.split("?")[0]
        if path in OTHER_SIGNALS:
            self.other_signals += 1
            size = request.headers.get("Content-Length") or "0"
            if not size.isdigit() or int(size) > MAX_BODY_BYTES:
                return 413, f"body over {MAX_BODY_BYTES} bytes"
            request.rfile.read(int(size))
            return 200, ""
        if path != TRACES_PATH:
            self.refused["wrong path"] += 1
            return 404, f"OTLP traces go to {TRACES_PATH}"
        length_text = request.headers.get("Content-Length")
        if length_text is None or not length_text.isdigit():
            self.refused["no length"] += 1
            return 411, "Content-Length required"
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            self.refused["too large"] += 1
            return 413, f"body over {MAX_BODY_BYTES} bytes"
        try:
            body = request.rfile.read(length)
        except OSError:
            self.refused["unreadable"] += 1
            return 400, "body could not be read"
        if len(body) < length:
            self.refused["truncated"] += 1
            return 400, "body shorter than its Content-Length"
        try:
            self.accept(body, request.headers.get("Content-Type"), request.headers.get("Content-Encoding"))
        except OtlpFormatError as exc:
            self.refused["malformed"] += 1
            return 400, str(exc)[:500]
        return 200, ""
