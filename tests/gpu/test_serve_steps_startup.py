"""A served window's device-graph launches, a custom architecture's import, the demo and start-up on an H200, re-read on
the CPU (tests/data/gpu/h200_llama5b_serve_steps_startup). m24 = bf16 Llama 4096 x 24 (~5.2B)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from max_profile.analyze.report import build_report
from max_profile.model import RawCapture, Unavailable

S9 = Path(__file__).parents[1] / "data" / "gpu" / "h200_llama5b_serve_steps_startup"


def saved(name: str) -> dict:  # type: ignore[type-arg]
    return json.loads(gzip.decompress((S9 / f"{name}.json.gz").read_bytes()))


def test_second_half_of_the_acceptance_run() -> None:
    """run b1 in-process traced at 353.5 tok/s and 78 % of peak bandwidth (healthy), rebuilt from its raw capture; the
    custom architecture decodes the same, its slow import named; start-up cold miss 286 s, warm hit 32 s; the sweep's
    knee."""
    b1 = build_report(RawCapture.load(str(S9 / "run_b1_raw.json.gz")))
    found = {f.id: f for f in b1.findings}
    assert "healthy-dense-decode" in found and 75 < float(found["decode-bandwidth"].evidence["pct_of_peak"] or 0) < 81
    assert b1.capture.device_graph_capture is True
    custom = saved("run_custom")
    assert custom["step_summary"]["decode_tokens_per_s"] == pytest.approx(354.2, abs=0.1)
    assert "startup-custom-import-slow" in {f["id"] for f in custom["findings"]}
    cold, warm = saved("startup_m24_cold")["startup"], saved("startup_m24_warm")["startup"]
    assert cold["cache"] == "miss" and cold["total_s"] == pytest.approx(286.2, abs=0.1)
    assert warm["cache"] == "hit" and warm["total_s"] < 0.15 * cold["total_s"]
    sweep = saved("serve_sweep")
    assert [lv["concurrency"] for lv in sweep["load_levels"]] == [1, 4, 16, 64]
    assert "latency-knee" in {f["id"] for f in sweep["findings"]}
    demo = saved("demo")
    assert "host-bound" in {f["id"] for f in demo["findings"]} and demo["startup"]["cache"] == "partial"


def test_graph_launch_late_found_in_the_serve_window_and_explained_by_a_measured_tracer_cost() -> None:
    """Seconds 4-6 of the serve_kernels window (real kernels, cut): 203 waits of 0.1-5 ms before device-graph kernels,
    4.1 % of the window, named; where the recorder's cost was measured the tracer's finding carries them instead. The
    in-process run (batch 1) has no such pattern."""
    import msgspec

    from max_profile.analyze.rules import evaluate
    from max_profile.model import TracerCost

    report = build_report(RawCapture.load(str(S9 / "serve_kernels_4to6s_raw.json.gz")))
    w = report.kernels.gpu_waits  # type: ignore[union-attr]
    assert w is not None and w.before_graph_gaps == 203 and w.before_graph_pct == pytest.approx(4.11, abs=0.01)
    assert w.gap_p50_us is not None and 200 < w.gap_p50_us < 700 and w.longer_gaps > 0  # request turns counted apart
    found = {f.id: f for f in report.findings}
    assert "graph-launch-late" in found and "203 device-graph launches" in found["graph-launch-late"].title
    assert "tracer-overhead" not in found  # nothing measured in this cut: no tracer claim
    # the recorder's cost as serve_ab measured it on one server (windows 4 untraced and 5 recorded)
    measured = TracerCost(
        concurrency=1,
        reference_tok_s=328.5,
        traced_tok_s=309.7,
        throughput_ratio=round(309.7 / 328.5, 4),
        reference_decode_step_ms=2.901,
        traced_decode_step_ms=3.077,
    )
    with_cost = {f.id: f for f in evaluate(msgspec.structs.replace(report, tracer_cost=measured))}
    assert (
        "graph-launch-late" not in with_cost and with_cost["tracer-overhead"].evidence["gpu_waits_before_graphs"] == 203
    )
    b1 = build_report(RawCapture.load(str(S9 / "run_b1_raw.json.gz")))
    assert b1.kernels.gpu_waits is not None and b1.kernels.gpu_waits.before_graph_gaps < 5  # type: ignore[union-attr]
    assert "graph-launch-late" not in {f.id for f in b1.findings}
    # the demo's 182M model is host-bound: it waits before its graphs too (15 % of its window), and host-bound says so
    demo = build_report(RawCapture.load(str(S9 / "demo_raw.json.gz")))
    waits = demo.kernels.gpu_waits  # type: ignore[union-attr]
    assert waits is not None and waits.before_graph_pct > 10
    assert "host-bound" in {f.id for f in demo.findings} and "graph-launch-late" not in {f.id for f in demo.findings}


def test_custom_import_judged_by_the_packages_own_import_not_the_preflight_childs() -> None:
    """On the H200 the preflight child took 19.4 s, 13-15 s of it importing MAX (the load's own MAX import took 13.7 s):
    the run said "the custom architecture's import takes 19 s". Judged now by the package's own import in that child."""
    import msgspec

    from max_profile.analyze.rules import evaluate
    from max_profile.model import PreflightResult, Report

    report = Report.from_json(gzip.decompress((S9 / "run_custom.json.gz").read_bytes()))
    phases = {p.name: p.seconds for p in report.startup.phases}  # type: ignore[union-attr]
    assert phases["custom-architecture preflight (a child imports the package)"] == pytest.approx(19.39, abs=0.01)
    assert phases["import MAX"] == pytest.approx(13.72, abs=0.01)
    assert "startup-custom-import-slow" in {f.id for f in report.findings}  # what that run printed
    spec = report.preflight[0].spec

    def judged(import_s: float | None) -> set[str]:
        pre = [msgspec.structs.replace(report.preflight[0], package_import_s=import_s)]
        return {f.id for f in evaluate(msgspec.structs.replace(report, preflight=pre))}

    assert "startup-custom-import-slow" not in judged(0.6) and "startup-custom-import-slow" not in judged(None)
    slow = next(
        f
        for f in evaluate(
            msgspec.structs.replace(
                report, preflight=[PreflightResult(spec=spec, max_version=None, checks=[], package_import_s=12.0)]
            )
        )
        if f.id == "startup-custom-import-slow"
    )
    assert "own import takes 12 s" in slow.title and slow.evidence["preflight_child_s"] == pytest.approx(
        19.39, abs=0.01
    )


def test_graph_launch_late_of_a_capture_without_steps_at_its_threshold_and_every_figure() -> None:
    """The serve window cut above (no phase ranges: the capture's own waits): at ``graph_launch_late_pct`` exactly the
    verdict stands, every figure read off the window's waits; a window whose waits have no median says none."""
    import msgspec

    from max_profile.analyze.rules.idle import _capture_graph_waits
    from max_profile.analyze.thresholds import Thresholds

    report = build_report(RawCapture.load(str(S9 / "serve_kernels_4to6s_raw.json.gz")))
    w = report.kernels.gpu_waits  # type: ignore[union-attr]
    assert w is not None and w.gap_p50_us is not None
    th = Thresholds(graph_launch_late_pct=w.before_graph_pct)
    [f] = _capture_graph_waits(report, th)
    assert round(w.before_graph_ms, 1) != round(w.before_graph_ms)  # the one decimal shows
    assert f.evidence == {
        "before_graph_gaps": 203,
        "before_graph_ms": round(w.before_graph_ms, 1),
        "before_graph_pct": round(w.before_graph_pct, 2),
        "all_waits": w.gaps,
        "all_waits_pct": round(w.waited_pct, 2),
        "gap_p50_us": round(w.gap_p50_us, 1),
        "longer_gaps": w.longer_gaps,
        "threshold_pct": w.before_graph_pct,
        "min_gaps": th.graph_launch_late_min_gaps,
    }
    assert f.title == (
        f"The GPU waited for the host before 203 device-graph launches: {w.before_graph_pct:.1f} % of the window in "
        f"gaps of {w.min_gap_us / 1e3:g}-{w.max_gap_ms:g} ms, median {w.gap_p50_us / 1e3:.2f} ms"
    )
    assert f.severity == "info" and f.confidence == 0.7
    assert _capture_graph_waits(report, Thresholds(graph_launch_late_pct=math.nextafter(w.before_graph_pct, 100))) == []
    k = report.kernels
    no_median = msgspec.structs.replace(
        report, kernels=msgspec.structs.replace(k, gpu_waits=msgspec.structs.replace(w, gap_p50_us=None))
    )
    [g] = _capture_graph_waits(no_median, th)
    assert g.evidence["gap_p50_us"] is None and g.title.endswith(f"gaps of {w.min_gap_us / 1e3:g}-{w.max_gap_ms:g} ms")


COST = Path(__file__).parents[1] / "data" / "gpu" / "h100_llama16_serve_cost_parts"


def test_a_kernels_server_without_profiling_mode_splits_its_steps_by_the_worker_hook() -> None:
    """`serve --mode kernels` as it now runs on NVIDIA (H100, device graphs as MAX decides): MAX's profiling mode off,
    the worker hook's passes are the steps of every window, with their batch and context, and a window in which no
    recorded slice fell says so (never an empty GPU)."""
    raw = RawCapture.load(str(COST / "graphs_kernels_server_raw.json.gz"))
    assert raw.capture.profiling_mode == "off" and raw.capture.phase_markers == "model worker steps"
    assert not raw.ranges and not len(raw.kernels)
    windows = [w.window_ns for w in raw.load_windows]
    inside = [s for s in raw.steps if any(a <= s.end_ns <= b for a, b in windows)]
    # the hook stamps only while a window records (a step running at a window's close ends just after it)
    assert len(raw.steps) - len(windows) <= len(inside) <= len(raw.steps) and len(inside) > 1000
    decode = [s for s in inside if s.phase == "decode" and s.batch_size > 0]
    assert decode and all(s.context_tokens is not None for s in decode)
    report = build_report(raw)
    assert isinstance(report.kernels, Unavailable)  # said as recorded (this capture predates the wording of today)
    assert report.decode_cost is not None and report.decode_cost.kv_bytes  # the hook's contexts price the KV cache
    steps_8 = sorted(s.batch_size for s in decode if s.start_ns >= raw.load_windows[3].window_ns[0])
    assert report.decode_cost.batch == round(float(np.median([s.batch_size for s in decode])))
    assert steps_8 and max(steps_8) <= 8
