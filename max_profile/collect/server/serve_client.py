"""A streaming client for ``max serve``'s OpenAI endpoint, and a closed-loop load at a fixed concurrency.

Each request streams ``/v1/completions`` and records what the client saw: time to first token, the gap before
every later chunk (inter-token latency; one chunk per token with MAX's default ``stream_min_chunk_tokens=1``),
tokens and errors. :class:`LoadGenerator` keeps ``concurrency`` requests in flight until stopped (each worker sends
its next request as soon as its last one ends), bounded by a deadline and a request cap. Equivalent:
``max benchmark --max-concurrency N`` / ``vllm bench serve --max-concurrency N``.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

import msgspec

from max_profile.model import RequestRecord

REQUEST_TIMEOUT_S = 60.0


def split_url(url: str) -> tuple[str, int, str]:
    """(host, port, path prefix) of ``http://host:port[/prefix]`` (``http://`` may be left out)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", ""):
        raise ValueError(f"{url}: only http:// URLs are supported")
    if not parts.hostname:
        raise ValueError(f"{url}: no host")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


def stream_completion(
    host: str,
    port: int,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    stop: threading.Event | None = None,
    prefix: str = "",
    headers: dict[str, str] | None = None,
    timeout_s: float = REQUEST_TIMEOUT_S,
    server: str | None = None,
) -> RequestRecord:
    """One streamed completion; the record says what the client saw (never raises for a server's fault).

    Tokens are counted as the server counted them: a chunk can carry several (MAX skips chunks whose tokens decode to no
    visible text and sends them with the next), so each chunk's ``token_ids`` (MAX's ``return_token_ids``) split its gap
    into per-token inter-token latencies, and the final ``usage`` chunk (``stream_options.include_usage``) gives the
    total. The record keeps the server's id of the request (the chunks' ``id``) and ``server`` (the URL it went to).
    """
    t_sent = time.perf_counter_ns()
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
    )
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        t0 = time.perf_counter()
        conn.request(
            "POST",
            f"{prefix}/v1/completions",
            body=body,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            text = resp.read(300).decode(errors="replace")
            conn.close()
            return RequestRecord(
                started_ns=t_sent,
                ended_ns=time.perf_counter_ns(),
                ok=False,
                error=f"HTTP {resp.status}: {text}",
                server=server,
            )
        record = _read_stream(resp, t_sent, t0, stop)
        conn.close()
        return msgspec.structs.replace(record, ended_ns=time.perf_counter_ns(), server=server)
    except (OSError, http.client.HTTPException) as exc:
        return RequestRecord(
            started_ns=t_sent,
            ended_ns=time.perf_counter_ns(),
            ok=False,
            error=f"{type(exc).__name__}: {exc}",
            server=server,
        )


def _read_stream(resp: Iterable[bytes], t_sent: int, t0: float, stop: threading.Event | None) -> RequestRecord:
    """What one streamed response said, chunk by chunk (see :func:`stream_completion`); its end is stamped by the
    caller."""
    first: float | None = None
    request_id: str | None = None
    last = t0
    gaps: list[float] = []
    tokens = 0
    usage_tokens: int | None = None
    truncated = False
    for raw in resp:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        now = time.perf_counter()
        if request_id is None:
            request_id = chunk_id(line[5:])
        in_chunk, usage = chunk_tokens(line[5:])
        if usage is not None:
            usage_tokens = usage
        if not in_chunk:
            continue  # the usage chunk: no token of its own
        tokens += in_chunk
        if first is None:
            first = now
        else:
            gaps += [(now - last) * 1e3 / in_chunk] * in_chunk
        last = now
        if stop is not None and stop.is_set():
            truncated = True
            break
    if usage_tokens is not None and not truncated:
        tokens = usage_tokens
    return RequestRecord(
        started_ns=t_sent,
        ended_ns=t_sent,
        ok=True,
        tokens=tokens,
        ttft_ms=(first - t0) * 1e3 if first else None,
        itl_ms=gaps,
        truncated=truncated,
        request_id=request_id,
    )


def chunk_id(data: str) -> str | None:
    """The ``id`` of one SSE ``data:`` payload (the server's id of the request), None where it has none."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    found = doc.get("id") if isinstance(doc, dict) else None
    return found if isinstance(found, str) and found else None


def chunk_tokens(data: str) -> tuple[int, int | None]:
    """(tokens the chunk carries, the usage's completion tokens when it is the usage chunk) of one SSE ``data:``
    payload. A chunk that is not JSON, or has no ``token_ids``, counts as one token."""
    try:
        doc = json.loads(data)
    except ValueError:
        return 1, None
    if not isinstance(doc, dict):
        return 1, None
    usage = doc.get("usage")
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    choices = doc.get("choices")
    if not choices:
        return (0, completion if isinstance(completion, int) else None) if usage is not None else (1, None)
    ids = choices[0].get("token_ids") if isinstance(choices[0], dict) else None
    n = len(ids) if isinstance(ids, list) and ids else 1
    return n, completion if isinstance(completion, int) else None


class LoadGenerator:
    """``concurrency`` closed-loop streaming clients until :meth:`stop` (bounded by a deadline and ``max_requests``)."""

    def __init__(
        self,
        host: str,
        port: int,
        model: str,
        prompt: str,
        max_tokens: int,
        *,
        concurrency: int = 1,
        deadline_s: float = 600.0,
        max_requests: int = 100_000,
        prefix: str = "",
        server: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.host, self.port, self.model, self.prompt, self.max_tokens, self.prefix = (
            host,
            port,
            model,
            prompt,
            max_tokens,
            prefix,
        )
        self.concurrency = concurrency
        self.server = server
        """The URL its records name as their server (None: the only one)."""
        self.deadline = time.monotonic() + deadline_s
        self.max_requests = max_requests
        self.stop_event = threading.Event()
        self.records: list[RequestRecord] = []
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._worker, daemon=True, name=f"max-profile-load-{i}") for i in range(concurrency)
        ]

    def _worker(self) -> None:
        while not self.stop_event.is_set() and time.monotonic() < self.deadline:
            with self._lock:
                if len(self.records) >= self.max_requests:
                    return
            record = stream_completion(
                self.host,
                self.port,
                self.model,
                self.prompt,
                self.max_tokens,
                stop=self.stop_event,
                prefix=self.prefix,
                server=self.server,
            )
            with self._lock:
                self.records.append(record)
            if not record.ok:
                time.sleep(0.2)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, join_s: float = 70.0) -> None:
        """Stop sending; requests in flight end at their next chunk."""
        self.stop_event.set()
        deadline = time.monotonic() + join_s
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=max(deadline - time.monotonic(), 0.1))

    def snapshot(self) -> list[RequestRecord]:
        with self._lock:
            return list(self.records)
