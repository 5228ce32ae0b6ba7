"""One window on a server, the same for ``serve`` (a server we started) and ``attach`` (one already running).

At one concurrency: our closed-loop streaming load around the window (none at concurrency 0: the server's own
traffic), the server's ``/metrics`` read at both ends, and live recorders inside it, all through the
:class:`~max_profile.collect.live.recorders.Recorder` protocol of in-process captures: the GPU sampler and the host
load, and a serve mode's tracer (the model worker's CUPTI, an nsys session), which starts before the window opens and
stops after it closes, so its own start and stop stay out of the measured span; always torn down.
Equivalent by hand: ``curl $METRICS``; a load generator; ``nvidia-smi dmon``; ``curl $METRICS`` again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from max_profile.analyze.load import load_level
from max_profile.collect.live.recorders import GpuSamplerRecorder, HostLoadRecorder, Recorder
from max_profile.collect.server.serve_client import LoadGenerator
from max_profile.collect.server.serve_metrics import scrape
from max_profile.model import LoadWindow, MetricsScrape, RawCapture, RequestRecord

SAMPLE_INTERVAL_S = 0.1
"""GPU samples in a server window, seconds apart."""


@dataclass(frozen=True)
class ServerTarget:
    """Where the load goes and what it asks for (one streaming completion per request)."""

    host: str
    port: int
    model: str
    prompt: str
    max_tokens: int
    prefix: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.prefix}"


def window_recorders(sample_gpus: bool, label: str, observed: frozenset[int] = frozenset()) -> list[Recorder]:
    """The recorders of a server window: host load always (``observed``: the attached server's processes, counted
    apart from other load), GPU samples where this machine has a GPU to sample."""
    recorders: list[Recorder] = [HostLoadRecorder(observed)]
    if sample_gpus:
        recorders.append(GpuSamplerRecorder(SAMPLE_INTERVAL_S, label=label))
    return recorders


class ServerWindow:
    """One window at one concurrency: ``start_load`` → ``open`` → (the caller waits) → ``close`` → ``finish``;
    ``abort`` in a ``finally`` always. ``fill(raw)`` puts the tracer's and the recorders' readings into a raw
    capture."""

    def __init__(
        self,
        targets: Sequence[ServerTarget],
        concurrency: int,
        duration_s: float,
        metrics_url: str | None,
        recorders: list[Recorder],
        traced: bool | None = None,
        reference: bool = False,
        tracer: Recorder | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.duration_s = duration_s
        self.metrics_url = metrics_url
        self.recorders = recorders
        self.tracer = tracer
        self.traced = traced
        self.reference = reference
        several = len(targets) > 1
        self.generators = (
            [
                LoadGenerator(
                    t.host,
                    t.port,
                    t.model,
                    t.prompt,
                    t.max_tokens,
                    concurrency=concurrency,
                    deadline_s=duration_s + 300,
                    prefix=t.prefix,
                    server=t.url if several else None,
                )
                for t in targets
            ]
            if concurrency
            else []
        )
        """One closed-loop load per server, each at ``concurrency`` (several servers: every one of them driven)."""
        self.span: tuple[int, int] = (0, 0)
        self.before: MetricsScrape | None = None
        self.after: MetricsScrape | None = None
        self.records: list[RequestRecord] = []
        self._started: list[Recorder] = []
        self._tracing = False

    def start_load(self, ahead: bool) -> None:
        """Start our load; with ``ahead`` let it run a moment, so the window opens on a server already busy."""
        if not self.generators:
            return
        for g in self.generators:
            g.start()
        if ahead:
            time.sleep(min(2.0, self.duration_s / 4))

    def open(self) -> None:
        if self.tracer is not None:
            self.tracer.start()
            self._tracing = True
        if self.metrics_url:
            self.before = scrape(self.metrics_url)
        for r in self.recorders:
            r.start()
            self._started.append(r)
        self.span = (time.perf_counter_ns(), 0)

    def close(self) -> None:
        self.span = (self.span[0], time.perf_counter_ns())
        self._stop_recorders(failed=False)
        if self.metrics_url:
            self.after = scrape(self.metrics_url)
        self._stop_tracer(failed=False)

    def finish(self, requests: list[RequestRecord] | None = None) -> None:
        """Stop our load and keep its requests (or ``requests``: the probes sent instead of a load)."""
        for g in self.generators:
            g.stop_event.set()  # every load stops at once, then each is joined
        for g in self.generators:
            g.stop()
        if self.generators:
            self.records = sorted((r for g in self.generators for r in g.snapshot()), key=lambda r: r.started_ns)
        if requests is not None:
            self.records = list(requests)

    def abort(self) -> None:
        for g in self.generators:
            g.stop_event.set()
        self._stop_recorders(True)
        self._stop_tracer(True)

    def _stop_recorders(self, failed: bool) -> None:
        while self._started:
            self._started.pop().stop(failed)

    def _stop_tracer(self, failed: bool) -> None:
        if self.tracer is not None and self._tracing:
            self._tracing = False
            self.tracer.stop(failed)

    def fill(self, raw: RawCapture) -> None:
        """The tracer's and each recorder's readings into ``raw`` (GPU samples appended window after window; the host
        load of the last window filled)."""
        for r in [*([self.tracer] if self.tracer is not None else []), *self.recorders]:
            r.fill(raw, self.span)

    def summary(self) -> str:
        """The window's requests and tokens/s as the report counts them (:func:`~max_profile.analyze.load.load_level`:
        requests completed inside the window, tokens streamed inside it)."""
        level = load_level(self.load_window(), {})
        return f"{level.completed} requests completed in the window, {level.output_tok_per_s:.0f} tok/s streamed"

    def load_window(self) -> LoadWindow:
        return LoadWindow(
            concurrency=self.concurrency,
            window_ns=self.span,
            requests=list(self.records),
            metrics_before=self.before,
            metrics_after=self.after,
            traced=self.traced,
            reference=self.reference,
        )
