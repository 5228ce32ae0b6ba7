"""The C CUPTI recorder's captures on an H200 (tests/data/gpu/h200_llama5b_cupti_recorder), re-read on the CPU: kernel
counts against nsys, kernels inside device graphs, another CUPTI client, max serve."""

from __future__ import annotations

from pathlib import Path

import pytest

from max_profile.analyze.report import build_report
from max_profile.model import KernelBreakdown, RawCapture, Report

TRACING = Path(__file__).parents[1] / "data" / "gpu" / "h200_llama5b_cupti_recorder"


def _report(name: str) -> tuple[RawCapture, Report]:
    raw = RawCapture.load(str(TRACING / name))
    return raw, build_report(raw)


def _k(report: Report) -> KernelBreakdown:
    assert isinstance(report.kernels, KernelBreakdown), report.kernels
    return report.kernels


def test_recorder_counts_the_kernels_nsys_counts() -> None:
    """Same model, same 64 tokens: the C recorder and nsys see the same 5,586 kernels, 86 per decode step."""
    _, cupti = _report("run_cupti_raw.json.gz")
    _, nsys = _report("run_nsys_raw.json.gz")
    a, b = _k(cupti), _k(nsys)
    assert a.source == "cupti" and b.source == "nsys"
    assert a.kernels == b.kernels == 5586 and a.invalid_kernels == 0
    assert (
        [(p.phase, p.steps, p.kernels) for p in a.phases]
        == [(p.phase, p.steps, p.kernels) for p in b.phases]
        == [("prefill", 1, 82), ("decode", 64, 5504)]
    )
    assert a.kernel_ms == pytest.approx(b.kernel_ms, rel=0.01)
    assert a.tracer_overhead_pct is not None and a.tracer_overhead_pct < 0.1  # buffer callbacks in C: microseconds
    assert any("launch calls only" in n for n in cupti.notes)


def test_kernels_inside_device_graphs_are_recorded_and_attributed() -> None:
    """`run --device-graph-capture` (graphs warmed up and replayed): every kernel of every graph recorded, per-step
    numbers hold."""
    raw, report = _report("run_graphs_raw.json.gz")
    k = _k(report)
    assert report.capture.device_graph_capture is True and raw.graph_launches > 0
    assert k.kernels == 5586 and k.graph_kernels == 4864 and k.unreliable is None
    assert "device-graphs" not in {f.id for f in report.findings}
    decode = next(p for p in k.phases if p.phase == "decode")
    assert decode.kernels_per_step == 86.0 and decode.families[0].family == "gemv"


def test_recorder_backs_off_under_another_cupti_client() -> None:
    """`nsys profile ... max-profile run --kernels cupti`: CUPTI is nsys's; the recorder says so and records nothing."""
    report = Report.load(str(TRACING / "under_nsys_report.json"))
    assert report.kernels is not None and not isinstance(report.kernels, KernelBreakdown)
    reason = report.kernels.reason  # type: ignore[union-attr]
    assert ("already held by") in reason and "backs off" in reason


def test_serve_worker_records_graph_kernels_with_graphs_on() -> None:
    """`serve --mode kernels -- --device-graph-capture` (MAX's default serving configuration): 403,396 kernels in 10 s,
    351,196 of them inside device graphs, the recorder's callbacks 0.55 % of the window."""
    raw, report = _report("serve_kernels_raw.json.gz")
    k = _k(report)
    assert k.kernels == 403396 and k.graph_kernels == 351196 and k.unreliable is None
    assert k.tracer_overhead_pct is not None and k.tracer_overhead_pct < 1.0
    ids = {f.id for f in report.findings}
    assert "tracer-overhead" not in ids and "healthy-dense-decode" in ids
    assert report.serve is not None and report.serve.output_tokens == _streamed_inside(raw) == 4627
    untraced_raw, untraced = _report("serve_util_raw.json.gz")
    assert untraced.serve is not None and untraced.serve.output_tokens == _streamed_inside(untraced_raw) == 5079


def _streamed_inside(raw: RawCapture) -> int:
    """Tokens the client streamed inside the capture's window, from its request records: each successful request's
    tokens times the share of its span inside the window."""
    assert raw.window_ns is not None
    w0, w1 = raw.window_ns
    return round(
        sum(
            r.tokens * max(min(r.ended_ns, w1) - max(r.started_ns, w0), 0) / (r.ended_ns - r.started_ns)
            for r in raw.requests
            if r.ok
        )
    )


@pytest.mark.parametrize("graphs", ["graphs", "eager"])
def test_recorder_equals_nsys_on_the_gpu_bound_model(graphs: str) -> None:
    """24-layer bf16 Llama, 64 tokens, device graphs on and off (`tracing.sh verify`): the recorder and nsys
    (`--cuda-graph-trace=node`) see the same 14,946 kernels, the same 14,080 inside graphs, 226 + 230 per decode
    step."""
    raw, cupti = _report(f"m24_{graphs}_cupti_raw.json.gz")
    _, nsys = _report(f"m24_{graphs}_nsys_raw.json.gz")
    a, b = _k(cupti), _k(nsys)
    assert a.source == "cupti" and b.source == "nsys"
    assert a.kernels == b.kernels == 14946 and a.invalid_kernels == b.invalid_kernels == 0
    assert a.graph_kernels == b.graph_kernels == (14080 if graphs == "graphs" else 0)
    assert raw.capture.device_graph_capture is (graphs == "graphs") and nsys.capture.device_graph_capture is (
        graphs == "graphs"
    )
    per_step = [(p.phase, p.steps, p.kernels) for p in a.phases]
    assert per_step == [(p.phase, p.steps, p.kernels) for p in b.phases] == [("prefill", 1, 226), ("decode", 64, 14720)]
    assert a.kernel_ms == pytest.approx(b.kernel_ms, rel=0.05)
    assert not any("no start or end time" in n for n in raw.notes)


def test_without_the_gpu_wait_a_forced_flush_cut_the_last_kernels() -> None:
    """The same graphs-on run before the session waited for the GPU: CUPTI's forced flush handed out the 161 kernels the
    overlap pipeline still had running with zero timestamps (dropped and counted): 14,785 of nsys's 14,946."""
    _, report = _report("m24_graphs_cupti_before_gpu_wait_raw.json.gz")
    k = _k(report)
    assert k.kernels == 14785 and k.invalid_kernels == 161 and k.kernels + k.invalid_kernels == 14946
    assert any("161 of 14946 kernel records had invalid timestamps" in n for n in report.notes)
