"""The report of a default `serve --mode kernels` run (its sampled recording: part of each window, in 0.5 s slices),
rebuilt from its raw capture (tests/data/gpu/h200_llama5b_serve_recording_cost). m24 = bf16 Llama 4096 x 24 (~5.2B),
MAX's defaults (device graphs on)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from max_profile.analyze.report import build_report
from max_profile.model import KernelBreakdown, RawCapture

S11 = Path(__file__).parents[1] / "data" / "gpu" / "h200_llama5b_serve_recording_cost"


def test_default_kernels_mode_report_from_its_raw_capture() -> None:
    """`serve --mode kernels` with no flags: its own untraced reference window then the recorded one, 0.9951 of it;
    graphs on from what ran. The records CUPTI stamped across a pause (a kernel running as the recorder paused, its end
    stamped at the resume or the stop: 0.6-1.5 s long) are left out (459), so kernel time is what fits in the 2.5 s
    recorded: the report written on the machine, before that fix, summed 495.6 s of kernel time in 2.5 s of slices."""
    written = json.loads(gzip.decompress((S11 / "serve_kernels.json.gz").read_bytes()))
    assert written["kernels"]["kernel_ms"] > 400_000  # the bug, as the machine's report had it
    report = build_report(RawCapture.load(str(S11 / "serve_kernels_raw.json.gz")))
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    assert k.paused_kernels == 459 and k.kernels == 190_889
    assert k.recorded_ms == pytest.approx(2501.9, abs=0.1) and k.kernel_ms < k.recorded_ms
    assert 90 < (k.gpu_busy_pct or 0) <= 100
    assert k.graph_kernels > 0.9 * k.kernels
    gemv = next(f for f in k.families if f.family == "gemv")
    assert gemv.total_ms > 0.8 * k.kernel_ms  # a GEMV-bound decode at batch 1
    assert report.tracer_cost is not None and report.tracer_cost.throughput_ratio >= 0.97
    assert report.capture.device_graph_capture is not False
    assert any("device graphs on, from what ran" in n for n in report.notes)
    assert any("459 kernel record(s)" in n for n in report.notes)
    ids = {f.id for f in report.findings}
    assert "healthy-dense-decode" in ids and "tracer-overhead" not in ids and "unfused-attention" not in ids
