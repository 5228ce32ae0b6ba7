"""Profiler on a live pipeline: an app thread keeps generating while another thread captures (real MAX, CPU)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from max_profile import Profiler
from max_profile.analyze.report import build_report
from max_profile.errors import InputError
from max_profile.model import StepSummary
from max_profile.runner import generate


class App:
    """A stand-in application: generates short completions in a loop on its own thread."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.stop = threading.Event()
        self.completions = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="app", daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                out = generate(self.model, ["the app keeps talking"], 6)
                assert len(out[0]) == 6
                self.completions += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@pytest.fixture()
def app(loaded_model: Any) -> Iterator[App]:
    running = App(loaded_model)
    running.thread.start()
    while running.completions == 0 and running.error is None:  # warm: one full completion first
        time.sleep(0.01)
    yield running
    running.stop.set()
    running.thread.join(timeout=60)
    assert running.error is None, running.error


def _work(raw: Any) -> list[Any]:
    return [s for s in raw.steps if s.batch_size]


def test_off_means_nothing_installed(loaded_model: Any) -> None:
    pipe = loaded_model.pipeline
    profiler = Profiler(pipe, gpu_sampling=False)
    assert not profiler.active and "execute" not in pipe.__dict__
    profiler.start()
    assert "execute" in pipe.__dict__
    raw = profiler.stop()
    assert "execute" not in pipe.__dict__ and "_max_profile_hook" not in pipe.__dict__
    assert raw.steps == []


def test_capture_steps_while_the_app_generates(app: App) -> None:
    # defaults (sampling on: with no GPU here the sampler is not started, and the report says why)
    profiler = Profiler(app.model.pipeline)
    before = app.completions
    raw = profiler.capture(steps=10, timeout_s=120)
    work = _work(raw)
    assert len(work) == 10  # exactly: the hook stops recording at the 10th step, however late this thread wakes
    assert {s.phase for s in work} <= {"prefill", "decode"} and "decode" in {s.phase for s in work}
    assert all(a.end_ns <= b.start_ns for a, b in zip(work, work[1:], strict=False))
    assert "execute" not in app.model.pipeline.__dict__  # removed while the app kept going
    time.sleep(0.3)
    assert app.completions > before and app.error is None
    report = build_report(raw)
    assert isinstance(report.step_summary, StepSummary) and report.step_summary.decode_tokens_per_s
    assert raw.capture.unix_minus_perf_counter_ns is not None
    assert raw.utilization_unavailable and "no GPU" in raw.utilization_unavailable.reason


def test_capture_seconds_and_restart(app: App) -> None:
    profiler = Profiler(app.model.pipeline, gpu_sampling=False)
    t0 = time.perf_counter_ns()
    first = profiler.capture(seconds=0.6)
    t1 = time.perf_counter_ns()
    # at least what was asked, and its steps inside it (steps are on this clock); how late a busy machine wakes the
    # capture's thread past 0.6 s is not judged (a wall-time bound was)
    assert t1 - t0 >= 0.6e9 and len(_work(first)) > 0
    assert all(t0 <= s.start_ns <= t1 for s in _work(first)), (t0, t1, [s.start_ns for s in _work(first)][:3])
    second = profiler.capture(steps=3, timeout_s=60)
    assert len(_work(second)) == 3
    assert min(s.start_ns for s in second.steps) > max(s.end_ns for s in first.steps)  # two separate windows


def test_capture_in_background_returns_a_future(app: App) -> None:
    profiler = Profiler(app.model.pipeline, gpu_sampling=False)
    future = profiler.capture_in_background(steps=4, timeout_s=60)
    raw = future.result(timeout=120)
    assert len(_work(raw)) == 4 and not profiler.active


def test_misuse_is_a_clear_error(loaded_model: Any) -> None:
    profiler = Profiler(loaded_model.pipeline, gpu_sampling=False)
    with pytest.raises(InputError, match="not recording"):
        profiler.stop()
    with pytest.raises(InputError, match="exactly one of steps=N or seconds=S"):
        profiler.capture()
    with pytest.raises(InputError, match="at least one step"):
        profiler.capture(steps=0)
    profiler.start()
    try:
        with pytest.raises(InputError, match="already recording"):
            profiler.start()
        with pytest.raises(RuntimeError, match="already being profiled"):
            Profiler(loaded_model.pipeline, gpu_sampling=False).start()  # a second profiler on the same pipeline
    finally:
        profiler.stop()


def test_idle_pipeline_times_out_with_one_clear_error(loaded_model: Any) -> None:
    """Nothing generates: capture(steps=N) stops at its bound (one given, or the default) with one clear error, and
    the pipeline is free again; in the background the future holds the same error."""
    from max_profile.errors import CaptureError
    from max_profile.session import CAPTURE_TIMEOUT_S

    profiler = Profiler(loaded_model.pipeline, gpu_sampling=False)
    with pytest.raises(CaptureError, match=r"capture\(steps=5\): no pipeline step ran in 0.3 s"):
        profiler.capture(steps=5, timeout_s=0.3)
    future = profiler.capture_in_background(steps=5, timeout_s=0.2)
    with pytest.raises(CaptureError, match="no pipeline step ran in 0.2 s"):
        future.result(timeout=30)
    assert 0 < CAPTURE_TIMEOUT_S < float("inf")  # bounded without being asked
    import inspect

    assert inspect.signature(Profiler.capture).parameters["timeout_s"].default == CAPTURE_TIMEOUT_S
    assert inspect.signature(Profiler.capture_in_background).parameters["timeout_s"].default == CAPTURE_TIMEOUT_S


def test_capture_from_the_pipeline_thread_is_refused(loaded_model: Any) -> None:
    profiler = Profiler(loaded_model.pipeline, gpu_sampling=False)
    profiler.start()
    generate(loaded_model, ["same thread"], 3)  # this thread now runs the pipeline
    profiler.stop()
    with pytest.raises(InputError, match="thread that runs the pipeline"):
        profiler.capture(steps=2)
