"""Batch 32, the naive FP8 fallback, a kernel deep dive, a cold start-up and serve's kernel mode on an H200, re-read on
the CPU (tests/data/gpu/h200_llama5b_fp8_batch32_serve). m24 = bf16 Llama 4096 x 24 (~5.2B, GPU-bound decode); fp8 =
block-scaled FP8 4096 x 8."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from max_profile.analyze.ncu import analyze_launch
from max_profile.analyze.report import build_report
from max_profile.analyze.rules.nsight import kernel_findings
from max_profile.collect.readers.ncu import read_ncu_files
from max_profile.model import RawCapture

S8 = Path(__file__).parents[1] / "data" / "gpu" / "h200_llama5b_fp8_batch32_serve"


def saved(name: str) -> dict:  # type: ignore[type-arg]
    return json.loads(gzip.decompress((S8 / f"{name}.json.gz").read_bytes()))


def test_serve_kernels_mode_records_the_worker_and_says_graphs_on() -> None:
    """`serve --mode kernels` with no other flag: the model worker's kernels are read back (764,450 in 10 s), graphs on
    from what ran (720,184 inside graphs), and the phase next step does not send the user to a setting the report says
    fails."""
    doc = saved("serve_kernels")
    k = doc["kernels"]
    assert k["type"] != "unavailable" and k["kernels"] == 764450 and k["graph_kernels"] == 720184
    assert doc["capture"]["device_graph_capture"] is True
    assert any("from what ran" in n for n in doc["notes"])
    phases = next(f for f in doc["findings"] if f["id"] == "phases-missing")
    assert "cannot work on this GPU image" in phases["next_step"] and phases["command"]["verb"] == "run"
    assert "CUPTI ready in process" in (S8 / "serve_kernels.stderr.txt").read_text()


def test_batch_32_and_fp8_verdicts_on_the_new_run() -> None:
    """The same verdicts as h200_llama5b_every_verb on fresh captures: batch 32 at ~45 % of peak with its matmul lever
    ranked first (the ledger's figure recomputed from the raw records); FP8's naive fallback named, with no attention
    warning and no "quantization at normal cost" beside it."""
    from ..gpu.test_every_verb import decode_matmul_lever

    raw_b32 = RawCapture.load(str(S8 / "run_b32_raw.json.gz"))
    b32 = build_report(raw_b32)
    found = {f.id: f for f in b32.findings}
    assert (
        "healthy-batched-decode" not in found
        and 40 < float(found["decode-bandwidth"].evidence["pct_of_peak"] or 0) < 50
    )
    groups = raw_b32.capture.model_weights.groups  # type: ignore[union-attr]
    weights = sum(g.bytes for name, g in groups.items() if name != "embedding")
    top = b32.findings[0]
    assert top.id == "matmul-below-roofline" and top.lever is not None and top.lever.phase == "decode"
    assert top.lever.ms_per_step == pytest.approx(decode_matmul_lever(raw_b32, weights), rel=0.01)
    fp8 = build_report(RawCapture.load(str(S8 / "run_fp8_raw.json.gz")))
    ids = {f.id for f in fp8.findings}
    assert "matmul-slow-path" in ids and not ids & {"unfused-attention", "low-bit-normal", "healthy-dense-decode"}
    assert fp8.decode_cost is not None and fp8.decode_cost.weight_bytes == pytest.approx(1.75e9, rel=0.02)


def test_gemv_deep_dive_and_cold_startup() -> None:
    launches = read_ncu_files(str(S8 / "kernel_gemv_details.csv.gz"), str(S8 / "kernel_gemv_raw.csv.gz"))
    dram = sorted(analyze_launch(x).dram_throughput_pct or 0 for x in launches)
    assert len(launches) == 2 and dram == pytest.approx([70.9, 82.2], abs=0.1)
    assert all("kernel-memory-bound-near-peak" in {f.id for f in kernel_findings(analyze_launch(x))} for x in launches)
    cold = saved("startup_m24_cold")["startup"]
    named = sum(p["seconds"] for p in cold["phases"] if p["name"].startswith("compile "))
    assert cold["cache"] == "miss" and named == pytest.approx(cold["max_logged_compile_s"], rel=0.10)
