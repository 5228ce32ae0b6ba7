"""Phase ranges and MAX's op ranges proven real on the CPU through max_profile's NVTX injection library.

MAX emits NVTX ranges with MODULAR_ENABLE_PROFILING=on (its own Python spans and every op); the
injection library (gcc + the CUDA image's NVTX headers) logs them, and the kernel breakdown
attributes the ops to our prefill / decode steps. The first run compiles the profiling variant.
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from max_profile.analyze.report import build_report
from max_profile.collect.live.nvtx_log import build_injection_library, read_nvtx_log
from max_profile.errors import ToolMissingError as NvtxInjectionUnavailable
from max_profile.model import KernelBreakdown, RawCapture

from ...conftest import run_cli


@pytest.fixture(scope="module")
def nvtx_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[RawCapture, Path]:
    try:
        lib = build_injection_library(tmp_path_factory.mktemp("lib"))
    except NvtxInjectionUnavailable as exc:
        pytest.fail(f"the NVTX injection library must build on this image: {exc}")
    out = tmp_path_factory.mktemp("nvtx")
    env = {
        "NVTX_INJECTION64_PATH": lib,
        "MAX_PROFILE_NVTX_LOG": str(out / "nvtx-%p.log"),
        "MODULAR_ENABLE_PROFILING": "on",
    }
    res = run_cli(
        "run",
        "--model-path",
        str(tiny_model_dir),
        "--devices",
        "cpu",
        "--max-new-tokens",
        "24",
        "--kernels",
        "nvtx-log",
        "--raw",
        str(out / "raw.json"),
        "--json",
        str(out / "report.json"),
        env=env,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return RawCapture.load(str(out / "raw.json")), out


def test_phase_ranges_enclose_max_execute_ranges(nvtx_run: tuple[RawCapture, Path]) -> None:
    raw, out = nvtx_run
    logs = glob.glob(str(out / "nvtx-*.log"))
    main_logs = [p for p in logs if any(r.domain == "max_profile" for r in read_nvtx_log(p).ranges)]
    assert len(main_logs) == 1, logs
    log = read_nvtx_log(main_logs[0])
    phases = [r for r in log.ranges if r.domain == "max_profile"]
    assert [r.name for r in phases if r.name != "drain"] == ["prefill"] + ["decode"] * 23
    executes = [r for r in log.ranges if r.domain == "-" and r.name == "execute"]
    assert len(executes) >= 24
    for ph in phases:
        inner = [e for e in executes if e.tid == ph.tid and ph.start_ns <= e.start_ns and e.end_ns <= ph.end_ns]
        assert len(inner) == 1, f"{ph.name} range should hold exactly one MAX execute range"
        assert inner[0].depth > ph.depth or inner[0].domain != ph.domain


def test_op_level_breakdown_on_cpu(nvtx_run: tuple[RawCapture, Path]) -> None:
    raw, _ = nvtx_run
    assert raw.kernel_source and raw.kernel_source.startswith("nvtx-log")
    report = build_report(raw)
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    # our ranges from the NVTX log and the host steps describe the same steps: counted once, host token counts kept
    assert k.step_source == "max_profile ranges + host steps" and k.attribution == "launch time (any thread)"
    fams = {f.family for f in k.families}
    assert {"gemm", "attention", "norm"} <= fams  # matmul, mo.mha.ragged.paged..., rms_norm ops
    decode = next(p for p in k.phases if p.phase == "decode")
    assert decode.steps == 23
    # the same op mix every decode step (a working KV cache): per-step op counts identical
    assert decode.kernels_per_step == pytest.approx(round(decode.kernels_per_step or 0))
    ids = {f.id for f in report.findings}
    assert "unfused-attention" not in ids and "kv-cache-broken" not in ids
