"""In-process hook on a MAX text-generation pipeline: one :class:`Step` per ``execute`` call.

MAX runs every prefill and decode batch through ``pipeline.execute(inputs)``
(``TextGenerationPipeline`` on CPU, ``OverlapTextGenerationPipeline`` on GPUs). The hook
shadows ``execute`` with an instance attribute and removes it on exit, so the pipeline is
restored exactly, also when the profiled body raises.

It also shadows the pipeline model's ``execute(model_inputs)`` (``pipeline._pipeline_model``) to
count the tokens in the model's own ragged input tensor each step: what the model computes, which
an architecture can make differ from what the scheduler fed (re-encoding the whole sequence).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from max_profile.collect.live.markers import NullMarker, PhaseMarker
from max_profile.errors import InputError
from max_profile.model import Phase, Step

_ACTIVE_ATTR = "_max_profile_hook"
_MISSING = object()


class ProfileTargetError(InputError, TypeError):
    """The object handed to ``profile()`` is not a MAX text-generation pipeline."""


class PipelineBusyError(InputError, RuntimeError):
    """The pipeline is already being profiled (nested ``profile()``, or a second profiler)."""


def resolve_pipeline(target: Any) -> Any:
    """Return the pipeline object whose ``execute`` runs each step.

    Accepts a ``TextGenerationPipeline`` / ``OverlapTextGenerationPipeline`` (anything whose
    ``execute`` takes ``TextGenerationInputs``), or ``AutoModel`` / ``AutoPipeline`` objects
    (their ``.pipeline``, or ``.model.pipeline``).
    """
    seen: list[str] = []
    obj = target
    for _ in range(3):
        if obj is None:
            break
        seen.append(type(obj).__name__)
        if _looks_like_pipeline(obj):
            return obj
        nxt = getattr(obj, "pipeline", None)
        if nxt is None and hasattr(obj, "model"):
            nxt = getattr(obj.model, "pipeline", None)
        obj = nxt
    raise ProfileTargetError(
        f"profile() needs a MAX text-generation pipeline (TextGenerationPipeline, "
        f"OverlapTextGenerationPipeline, AutoModel or AutoPipeline); got {type(target).__name__}"
        + (f" (looked through {' -> '.join(seen)})" if len(seen) > 1 else "")
    )


def looks_like_pipeline(obj: Any) -> bool:
    """Whether ``obj`` is a MAX text-generation pipeline (by its classes' names: MAX's own, or a subclass)."""
    return _looks_like_pipeline(obj)


def _looks_like_pipeline(obj: Any) -> bool:
    cls_names = {c.__name__ for c in type(obj).__mro__}
    return bool(
        cls_names & {"TextGenerationPipeline", "OverlapTextGenerationPipeline", "TextGenerationPipelineInterface"}
    )


def pipeline_accelerators(pipeline: Any) -> list[Any]:
    """The accelerators a MAX pipeline runs on: its ``_devices`` (both text pipelines) or its model's ``devices``,
    hosts left out."""
    holders = (pipeline, getattr(pipeline, "_pipeline_model", None))
    for holder in holders:
        for attr in ("_devices", "devices"):
            devices = getattr(holder, attr, None) if holder is not None else None
            if isinstance(devices, (list, tuple)) and devices:
                return [
                    d for d in devices if callable(getattr(d, "synchronize", None)) and not getattr(d, "is_host", True)
                ]
    return []


def synchronize_accelerators(pipeline: Any) -> int:
    """Wait until the GPU work the pipeline queued has finished (``Device.synchronize()``); returns the devices waited
    on.

    A generation returns while work it queued may still run (the overlap pipeline launches the next
    step before it reads the last token): a tracer stopped before that work ends gets kernels without
    an end time. Equivalent: ``cudaDeviceSynchronize()`` before ``cuptiActivityFlushAll``.
    """
    devices = pipeline_accelerators(pipeline)
    for device in devices:
        device.synchronize()
    return len(devices)


def classify(inputs: Any) -> tuple[Phase, int, int, int | None]:
    """(phase, batch size, input tokens, context tokens) of a ``TextGenerationInputs``.

    MAX sets ``batch_type`` CE ("context encoding") when any request has generated nothing
    yet, TG ("token generation") otherwise. A CE batch that also carries requests already
    decoding (in-flight batching) is ``mixed``.
    """
    flat = list(getattr(inputs, "flat_batch", []) or [])
    batch_size = len(flat)
    input_tokens = int(getattr(inputs, "input_tokens", -1))
    context_tokens = getattr(inputs, "context_tokens", None)
    batch_type = getattr(getattr(inputs, "batch_type", None), "value", None)
    if batch_size == 0:
        return "unknown", 0, max(input_tokens, 0), context_tokens
    if batch_type == "TG":
        return "decode", batch_size, input_tokens, context_tokens
    if batch_type == "CE":
        decoding = 0
        for ctx in flat:
            tokens = getattr(ctx, "tokens", None)
            if tokens is not None and getattr(tokens, "generated_length", 0) > 0:
                decoding += 1
        return ("mixed" if decoding else "prefill"), batch_size, input_tokens, context_tokens
    return "unknown", batch_size, input_tokens, context_tokens


def make_step(
    index: int,
    kind: tuple[Phase, int, int, int | None],
    outputs: Any,
    start_ns: int,
    end_ns: int,
    *,
    model_input_tokens: int | None = None,
    cpu_ns: int | None = None,
) -> Step:
    """One :class:`Step` from an ``execute`` call: its kind (:func:`classify` of the inputs), the tokens it returned,
    its times."""
    phase, batch_size, input_tokens, context_tokens = kind
    produced = 0
    if isinstance(outputs, dict):
        for out in outputs.values():
            produced += len(getattr(out, "tokens", ()) or ())
    return Step(
        index=index,
        phase=phase,
        batch_size=batch_size,
        input_tokens=input_tokens,
        context_tokens=context_tokens,
        start_ns=start_ns,
        end_ns=end_ns,
        output_tokens=produced,
        model_input_tokens=model_input_tokens,
        cpu_ns=cpu_ns,
    )


def pipeline_classes() -> list[type]:
    """Every text-generation pipeline class loaded in this process that defines its own ``execute`` (MAX's,
    subclasses)."""
    import sys

    module = sys.modules.get("max.pipelines.lib.pipeline_variants.text_generation")
    base = getattr(module, "TextGenerationPipelineInterface", None)
    if base is None:
        return []
    found: list[type] = []
    todo = [base]
    while todo:
        cls = todo.pop()
        if cls in found:
            continue
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in found if "execute" in c.__dict__ and callable(c.__dict__["execute"])]


class ClassStepHook:
    """Steps of every pipeline of the given classes, by wrapping their ``execute`` on the class (a process whose
    objects the hook cannot reach: ``max serve``'s model worker freezes its heap with ``gc.freeze()``). Installed for a
    window and removed after it; a subclass calling ``super().execute`` makes one step, not two."""

    def __init__(self, classes: list[type], clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.classes = classes
        self.steps: list[Step] = []
        self._originals: dict[type, Any] = {}
        self._clock = clock
        self._local = threading.local()
        self._inflight = 0
        self._idle = threading.Condition()
        self._lock = threading.Lock()

    def install(self) -> None:
        hook = self
        for cls in self.classes:
            if cls in self._originals:
                continue
            original = cls.__dict__["execute"]

            def execute(this: Any, inputs: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
                return hook._run(__original, this, inputs, *args, **kwargs)

            execute.__wrapped__ = original  # type: ignore[attr-defined]
            self._originals[cls] = original
            cls.execute = execute  # type: ignore[attr-defined]

    def uninstall(self) -> None:
        for cls, original in self._originals.items():
            cls.execute = original  # type: ignore[attr-defined]
        self._originals.clear()

    def wait_idle(self, timeout_s: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout=timeout_s)

    def _run(self, original: Any, this: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self._local, "inside", False):
            return original(this, inputs, *args, **kwargs)
        with self._idle:
            self._inflight += 1
        self._local.inside = True
        kind = classify(inputs)
        start, cpu = self._clock(), time.process_time_ns()
        outputs = None
        try:
            outputs = original(this, inputs, *args, **kwargs)
            return outputs
        finally:
            end, cpu_end = self._clock(), time.process_time_ns()
            self._local.inside = False
            with self._lock:
                self.steps.append(make_step(len(self.steps), kind, outputs, start, end, cpu_ns=cpu_end - cpu))
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()


class PipelineHook:
    """Wraps ``pipeline.execute``; collects :class:`Step` records while installed."""

    def __init__(
        self,
        pipeline: Any,
        marker: PhaseMarker | None = None,
        on_step: Callable[[Step], None] | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.pipeline = pipeline
        self.marker = marker or NullMarker()
        self.steps: list[Step] = []
        self._on_step = on_step
        self._clock = clock
        self._previous: Any = _MISSING
        self._model: Any = None
        self._model_previous: Any = _MISSING
        self._model_tokens: int | None = None
        self._in_step = False
        self._lock = threading.Lock()
        self._thread: int | None = None
        self._installed = False
        self._inflight = 0
        self._idle = threading.Condition()

    @property
    def thread(self) -> int | None:
        """``threading.get_ident()`` of the thread that ran the first recorded step (None before one ran)."""
        return self._thread

    def wait_idle(self, timeout_s: float) -> bool:
        """After :meth:`uninstall`: wait until no step started under the hook is still running."""
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout=timeout_s)

    def pause(self) -> None:
        """Stop recording steps but leave the wrapper in place (the next calls run the original directly)."""
        with self._idle:
            self._installed = False

    def check_free(self) -> None:
        """Raise :class:`PipelineBusyError` when another hook is installed on this pipeline."""
        if getattr(self.pipeline, _ACTIVE_ATTR, None) is not None:
            raise PipelineBusyError(
                "this pipeline is already being profiled: profile() cannot be nested or used from two "
                "threads on one pipeline; leave the first `with profile(...)` block first"
            )

    def install(self) -> None:
        self.check_free()
        if "execute" not in dir(self.pipeline):
            raise ProfileTargetError(f"{type(self.pipeline).__name__} has no execute() to hook")
        self._previous = self.pipeline.__dict__.get("execute", _MISSING)
        original = self.pipeline.execute
        hook = self

        def execute(inputs: Any) -> Any:
            return hook._run_step(original, inputs)

        execute.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(self.pipeline, _ACTIVE_ATTR, self)
        with self._idle:
            self._installed = True
        self.pipeline.execute = execute
        self._install_model_hook()

    def _install_model_hook(self) -> None:
        model = getattr(self.pipeline, "_pipeline_model", None)
        original = getattr(model, "execute", None)
        if model is None or not callable(original) or not hasattr(model, "__dict__"):
            return
        self._model = model
        self._model_previous = model.__dict__.get("execute", _MISSING)
        hook = self

        def model_execute(*args: Any, **kwargs: Any) -> Any:
            hook._count_model_tokens(kwargs.get("model_inputs", args[0] if args else None))
            return original(*args, **kwargs)

        model_execute.__wrapped__ = original  # type: ignore[attr-defined]
        model.execute = model_execute

    def _count_model_tokens(self, model_inputs: Any) -> None:
        """Tokens in the ragged ``tokens`` tensor the model is about to run (None when it has none)."""
        if not self._in_step:
            return
        shape = getattr(getattr(model_inputs, "tokens", None), "shape", None)
        try:
            count = int(shape[0]) if shape is not None and len(shape) >= 1 else None
        except (TypeError, ValueError):
            count = None
        if count is not None:
            self._model_tokens = (self._model_tokens or 0) + count

    def uninstall(self) -> None:
        with self._idle:
            self._installed = False  # a caller that looked the wrapper up just before this runs the original
        try:
            if self._previous is _MISSING:
                self.pipeline.__dict__.pop("execute", None)
            else:
                self.pipeline.execute = self._previous
            if self._model is not None:
                if self._model_previous is _MISSING:
                    self._model.__dict__.pop("execute", None)
                else:
                    self._model.execute = self._model_previous
                self._model = None
        finally:
            self.pipeline.__dict__.pop(_ACTIVE_ATTR, None)

    def _run_step(self, original: Callable[[Any], Any], inputs: Any) -> Any:
        with self._idle:
            if not self._installed:
                return original(inputs)
            self._inflight += 1
        try:
            return self._record_step(original, inputs)
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def _record_step(self, original: Callable[[Any], Any], inputs: Any) -> Any:
        phase, batch_size, input_tokens, context_tokens = classify(inputs)
        label = phase if batch_size else "drain"
        tid = threading.get_ident()
        if self._thread is None:
            self._thread = tid
        self.marker.push(label)
        self._model_tokens = None
        self._in_step = True
        start, cpu_start = self._clock(), time.process_time_ns()
        try:
            outputs = original(inputs)
        finally:
            end, cpu_end = self._clock(), time.process_time_ns()
            self._in_step = False
            self.marker.pop()
        step = make_step(
            len(self.steps),
            (phase, batch_size, input_tokens, context_tokens),
            outputs,
            start,
            end,
            model_input_tokens=self._model_tokens,
            cpu_ns=cpu_end - cpu_start,
        )
        with self._lock:
            self.steps.append(step)
        if self._on_step is not None:
            self._on_step(step)
        return outputs
