"""Typed tags: where a capture's kernels, steps and ledger came from, and which collectors recorded it.

A capture keeps a human-readable description of each source (``RawCapture.kernel_source``: "cupti (model worker, ...)",
``StepSummary.source``...); code that decides by a source reads the typed tag here instead of comparing that text
(``tests/test_registries.py`` scans for such comparisons outside this module and the kernel-mode registry).
"""

from __future__ import annotations

from enum import StrEnum


class KernelOrigin(StrEnum):
    """What recorded a capture's kernel records; the value starts every ``kernel_source`` description it tags."""

    CUPTI = "cupti"
    OP_RANGES = "nvtx-log"  # MAX's op ranges on the host clock (MODULAR_ENABLE_PROFILING=on): ops, not GPU kernels
    NSYS_STATS = "nsys stats"
    NSYS = "nsys"
    ROCPROF = "rocprof"
    KINETO = "kineto"
    MAX_GENERATE = "max generate"

    def describe(self, detail: str = "") -> str:
        """The ``kernel_source`` text of this origin: its tag, then what in particular (``cupti (model worker)``)."""
        return f"{self.value} ({detail})" if detail else self.value

    @classmethod
    def of(cls, source: str | None) -> KernelOrigin | None:
        """The origin a ``kernel_source`` description starts with (the longest tag first: "nsys stats" before "nsys");
        None for none or one of no known origin."""
        if not source:
            return None
        for origin in sorted(cls, key=lambda o: -len(o.value)):
            if source.startswith(origin.value):
                return origin
        return None


def host_ops(source: str | None) -> bool:
    """Whether the "kernels" of this source are MAX's op ranges on the host clock (a CPU's work, or the host's side of
    a GPU's launches), not GPU kernels."""
    return KernelOrigin.of(source) is KernelOrigin.OP_RANGES


class LedgerSource(StrEnum):
    """What a step ledger's time was read from."""

    KERNEL_TIMELINE = "kernel timeline"  # GPU kernels on a timeline with the steps
    OP_RANGES = "op ranges (host)"  # MAX's op ranges on the host: idle is host time between ops
    SERVER_METRICS = "server metrics"  # a server's batch execution times (attach): no kernels
    SPANS = "MAX serve spans"  # one server's max.batch spans: each pass's wall time, no kernels


class StepSource(StrEnum):
    """Where a capture's steps came from."""

    HOST = "host steps"  # the pipeline hook of an in-process capture
    WORKER = "model worker steps"  # the hook in a served model's worker
    OURS = "max_profile ranges"  # our NVTX / roctx ranges in a trace
    OURS_AND_HOST = "max_profile ranges + host steps"
    SCHEDULER = "MAX scheduler ranges"  # MAX's own ranges (profiling on) in a trace
    SPANS = "MAX serve spans"  # MAX's OTLP max.batch spans, one per forward pass
    NONE = "none"


class Collector(StrEnum):
    """A collector that recorded part of a capture (``Capture.collectors``). A served capture's is ``serve:<mode>``
    (:func:`serve_collector`)."""

    PIPELINE_HOOK = "pipeline-hook"
    STARTUP = "startup"
    ATTACH = "attach"
    NSYS = "nsys"
    NCU = "ncu"
    KINETO_JSON = "kineto-json"
    OTLP = "otlp"  # MAX serve's OpenTelemetry spans


SERVE_PREFIX = "serve:"
OUTSIDE_SERVE_MODES = ("utilization",)
"""Serve modes that read the server from outside only (its /metrics and the GPU's counters): nothing traced inside."""


def serve_collector(mode: str) -> str:
    """The collector tag of a ``max serve`` capture in ``mode``."""
    return f"{SERVE_PREFIX}{mode}"


def serve_mode_of(collector: str) -> str | None:
    """The serve mode a collector tag names; None for a collector that is not a serve mode."""
    return collector[len(SERVE_PREFIX) :] if collector.startswith(SERVE_PREFIX) else None


def traced_inside(collector: str) -> bool:
    """Whether this collector ran inside the profiled process (attach and serve's utilization mode read it from
    outside)."""
    return collector != Collector.ATTACH and serve_mode_of(collector) not in OUTSIDE_SERVE_MODES


class TargetKind(StrEnum):
    """What a capture profiled (``Capture.target`` starts with it; a pipeline's class name otherwise)."""

    STARTUP = "startup"  # a model's load to its first token
    ATTACH = "attach"  # a running server: ``attach:<url>``
    IMPORT = "import"  # a trace read from a file: ``import:<format>``
    NCU = "ncu"  # Nsight Compute's launches: ``ncu:<name>``
    SERVE = "max serve"
    DOCTOR = "doctor"

    def target(self, detail: str = "") -> str:
        """The ``Capture.target`` of this kind: ``attach:http://...``."""
        return f"{self.value}:{detail}" if detail else self.value

    @classmethod
    def of(cls, target: str | None) -> TargetKind | None:
        """The kind a ``Capture.target`` names; None for a pipeline's class name."""
        head = (target or "").split(":", 1)[0]
        return next((k for k in cls if k.value == head), None)


class StartupSource(StrEnum):
    """Where a start-up profile's phases came from."""

    IN_PROCESS = "in-process load"  # the load recorded in this process, from its start to the first token
    SERVE_LOG = "max serve log (launch to /health 200)"  # a served model's log lines
