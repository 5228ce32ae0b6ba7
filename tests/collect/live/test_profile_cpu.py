"""profile() on a real MAX pipeline on the CPU (tiny random-weight Llama, float32)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from max_profile import Report, profile
from max_profile.collect.live.pipeline_hook import ProfileTargetError
from max_profile.collect.probes.environment import detect_environment
from max_profile.errors import MaxProfileError
from max_profile.model import RawCapture, StepSummary, Unavailable
from max_profile.runner import generate


def test_generation_profiled_steps_and_report(loaded_model: Any) -> None:
    pipe = loaded_model.pipeline
    assert "execute" not in pipe.__dict__
    with profile(pipe, sample_interval_s=0.05, model_path=loaded_model.model_path, devices="cpu") as prof:
        tokens = generate(loaded_model, ["hello world"], 12)
    assert len(tokens[0]) == 12
    work = [s for s in prof.steps if s.batch_size]
    # one prefill, then one decode step per further token
    assert [s.phase for s in work] == ["prefill"] + ["decode"] * 11
    assert work[0].input_tokens > 1 and all(s.input_tokens == 1 for s in work[1:])
    assert [s.context_tokens for s in work[1:]] == list(range(work[0].input_tokens, work[0].input_tokens + 11))
    # monotonic, non-overlapping host times
    for a, b in zip(work, work[1:], strict=False):
        assert a.start_ns < a.end_ns <= b.start_ns
    assert sum(s.output_tokens for s in prof.steps) == 12
    report = prof.report
    assert isinstance(report.step_summary, StepSummary)
    assert report.step_summary.ttft_ms is not None and report.step_summary.ttft_ms > 0
    assert report.step_summary.decode_tokens_per_s is not None and report.step_summary.decode_tokens_per_s > 0
    # no GPU here: utilization is "not available" with the reason, never zeros
    assert isinstance(report.utilization, Unavailable)
    assert "no GPU" in report.utilization.reason
    assert report.capture.target == "TextGenerationPipeline"
    assert report.capture.model_config and report.capture.model_config["hidden_size"] == 64
    # restored exactly
    assert "execute" not in pipe.__dict__
    assert not hasattr(pipe, "_max_profile_hook") or "_max_profile_hook" not in pipe.__dict__


def test_report_json_round_trip(loaded_model: Any, tmp_path: Any) -> None:
    with profile(loaded_model.pipeline, gpu_sampling=False) as prof:
        generate(loaded_model, ["round trip"], 4)
    path = tmp_path / "r.json"
    prof.report.save(str(path))
    again = Report.load(str(path))
    assert again == prof.report
    raw_path = tmp_path / "raw.json.gz"
    prof.raw_capture.save(str(raw_path))
    assert RawCapture.load(str(raw_path)).steps == prof.steps
    assert "Steps (host)" in str(again)


def test_execute_restored_after_exception(loaded_model: Any) -> None:
    pipe = loaded_model.pipeline
    with pytest.raises(RuntimeError, match="boom"):
        with profile(pipe, gpu_sampling=False):
            generate(loaded_model, ["x"], 2)
            raise RuntimeError("boom")
    assert "execute" not in pipe.__dict__
    # still usable afterwards, unwrapped
    assert len(generate(loaded_model, ["x"], 2)[0]) == 2


def test_nested_profile_is_refused(loaded_model: Any) -> None:
    pipe = loaded_model.pipeline
    with profile(pipe, gpu_sampling=False):
        with pytest.raises(RuntimeError, match="already being profiled"):
            with profile(pipe, gpu_sampling=False):
                pass
    assert "execute" not in pipe.__dict__


def test_report_unavailable_before_exit(loaded_model: Any) -> None:
    prof = profile(loaded_model.pipeline, gpu_sampling=False)
    with pytest.raises(MaxProfileError, match="built when"):
        _ = prof.report


def test_profile_rejects_non_pipeline() -> None:
    with pytest.raises(ProfileTargetError, match="needs a MAX text-generation pipeline"):
        profile(object())
    with pytest.raises(ProfileTargetError, match="got dict"):
        profile({"pipeline": 1})


def test_zero_sampling_interval_is_refused(loaded_model: Any) -> None:
    with pytest.raises(ValueError, match="> 0"):
        profile(loaded_model.pipeline, sample_interval_s=0)


def test_accepts_automodel_like_wrapper(loaded_model: Any) -> None:
    class Wrapper:  # AutoModel exposes the loaded pipeline as .pipeline
        pipeline = loaded_model.pipeline

    with profile(Wrapper(), gpu_sampling=False) as prof:
        generate(loaded_model, ["w"], 3)
    assert len([s for s in prof.steps if s.batch_size]) == 3


def test_cupti_recording_waits_for_the_gpu_and_says_what_it_cost(
    loaded_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """profile(kernels="cupti") with a stand-in for the C recorder (CI has no GPU / CUPTI): the session waits for the
    pipeline's accelerators before the recorder's stop (its flush), and says when kernels were cut and that graphs were
    off."""
    from time import perf_counter_ns

    import numpy as np

    import max_profile.session as session
    from max_profile.model import KernelTable

    order: list[str] = []

    def wait_for_gpu(pipeline: Any) -> int:
        order.append("gpu wait")
        return 0

    monkeypatch.setattr(session, "synchronize_accelerators", wait_for_gpu)

    class StandInRecorder:  # a FAKE of NativeCuptiCollector: what its stop() leaves behind on a GPU
        native = True
        callback_s_before_stop = callback_s = stop_s = 0.0
        graph_launches = dropped = 0
        unfinished, api_records, api_filter = 3, 2, "launch calls only (27 kept)"
        rejected_launches = 5  # joins cupti_decode undid
        resume_problem = "CUPTI was taken by Nsight Systems while the recording was paused"

        def start(self) -> None:
            order.append("start")

        def pause(self) -> None:
            order.append("pause")

        def resume(self) -> None:
            order.append("resume")

        def stop(self) -> KernelTable:
            order.append("stop")
            ns = np.array([perf_counter_ns() + 1_000, perf_counter_ns() + 2_000], dtype=np.int64)
            return KernelTable(
                names=["gemv_bf16"],
                name_idx=np.zeros(2, dtype=np.int32),
                start_ns=ns,
                end_ns=ns + 500,
                device=np.zeros(2, dtype=np.int32),
                stream=np.zeros(2, dtype=np.int64),
            )

    monkeypatch.setattr(
        "max_profile.collect.live.recorders.make_cupti_collector", lambda notes, launches=True: StandInRecorder()
    )
    # the environment a GPU machine detects (CUPTI is refused on a CPU machine before anything starts)
    on_a_gpu = msgspec.structs.replace(detect_environment(check_tools=False), vendor="nvidia")
    with profile(loaded_model.pipeline, kernels="cupti", gpu_sampling=False, environment=on_a_gpu) as prof:
        generate(loaded_model, ["hello world"], 4)
    assert order == ["start", "gpu wait", "stop"]
    raw = prof.raw_capture
    assert len(raw.kernels) == 2 and raw.capture.device_graph_capture is False
    assert any("3 kernel(s) had no start or end time" in n for n in raw.notes)
    assert any(n.startswith("CUPTI: 5 kernel(s) were joined to a launch call that cannot be theirs") for n in raw.notes)
    assert StandInRecorder.resume_problem in raw.notes
    from max_profile.collect.live.recorders import CUPTI_WITHOUT_GRAPHS_NOTE

    assert CUPTI_WITHOUT_GRAPHS_NOTE in raw.notes


def test_recorders_of_ones_own_run_around_the_steps_and_fill_the_capture(loaded_model: Any) -> None:
    """``profile(recorders=[...])``: the caller's recorder starts before the first step, stops after the last and
    fills the raw capture with the steps' span; one that fails to start (the CUDA profiler range with no libcuda, as on
    this CPU machine) fails the session before any step, the pipeline left unhooked and usable."""
    import ctypes.util
    import time

    from max_profile.collect.live.recorders import CudaProfilerRangeRecorder

    class Own:
        name = "own"

        def __init__(self) -> None:
            self.calls: list[tuple[str, int]] = []
            self.window: tuple[int, int] | None = None

        def start(self) -> None:
            self.calls.append(("start", time.perf_counter_ns()))

        def stop(self, failed: bool) -> None:
            self.calls.append(("stop" if not failed else "failed", time.perf_counter_ns()))

        def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
            self.window = window
            raw.capture.collectors = [*raw.capture.collectors, self.name]

    own = Own()
    with profile(loaded_model.pipeline, gpu_sampling=False, recorders=[own]) as prof:
        generate(loaded_model, ["x"], 3)
    steps = prof.raw_capture.steps
    (started, t0), (stopped, t1) = own.calls
    assert (started, stopped) == ("start", "stop") and steps
    assert t0 < min(s.start_ns for s in steps) and max(s.end_ns for s in steps) < t1
    assert own.window == (min(s.start_ns for s in steps), max(s.end_ns for s in steps))
    assert "own" in prof.raw_capture.capture.collectors
    if ctypes.util.find_library("cuda") is None:  # no driver here: the range cannot open, and says so
        other = Own()
        with pytest.raises(RuntimeError, match="libcuda"):
            with profile(loaded_model.pipeline, gpu_sampling=False, recorders=[other, CudaProfilerRangeRecorder()]):
                generate(loaded_model, ["x"], 2)
        assert [c for c, _ in other.calls] == ["start", "failed"]  # the recorders started before it were stopped
        assert "execute" not in loaded_model.pipeline.__dict__ and len(generate(loaded_model, ["x"], 2)[0]) == 2
