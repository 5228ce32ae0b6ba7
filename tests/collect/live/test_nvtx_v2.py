"""MAX's profiling mode on CUDA 13 GPUs: CUDA 12's NVTX v2 library (``libnvToolsExt.so.1``) from the
``nvidia-nvtx-cu12`` wheel, found before the load and put first on the model process's library path; a clear error with
the exact fix where it is missing. On the H200 (CUDA 13, MAX 26.7) a `run --kernels nvtx-log --devices gpu` with it ran
to the end and recorded MAX's op ranges (tests/data/gpu/h200_llama180m_op_ranges_cuda13); without it the model worker
had aborted
('symbol not found: nvtxRangeStartEx')."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from max_profile.analyze.report import build_report
from max_profile.collect.live import nvtx_log
from max_profile.errors import ToolMissingError
from max_profile.model import KernelBreakdown, RawCapture

from ...conftest import DATA


def test_the_wheels_library_is_found_under_both_names_max_asks_for() -> None:
    lib = nvtx_log.nvtx_v2_library()
    assert lib is not None and lib.name == "libnvToolsExt.so.1", "the dev extra installs nvidia-nvtx-cu12==12.1.105"
    folder = nvtx_log.nvtx_v2_folder()
    assert folder is not None
    for name in ("libnvToolsExt.so", "libnvToolsExt.so.1"):
        loaded = ctypes.CDLL(str(folder / name))
        assert hasattr(loaded, "nvtxRangeStartEx") and hasattr(loaded, "nvtxDomainRangePushEx")  # the v2 entry points


def test_a_gpu_process_gets_the_folder_first_on_its_library_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvtx_log, "_system_nvtx_v2", lambda: False)  # CUDA 13: the loader finds no v2 library itself
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/other")
    env = nvtx_log.profiling_library_env("gpu")
    folder = nvtx_log.nvtx_v2_folder()
    assert env == {"LD_LIBRARY_PATH": f"{folder}:/opt/other"}
    assert nvtx_log.profiling_library_env("cpu") == {}
    monkeypatch.setattr(nvtx_log, "_system_nvtx_v2", lambda: True)  # a CUDA 12 toolkit: nothing to add
    assert nvtx_log.profiling_library_env("gpu:0") == {}


def test_serve_puts_it_on_the_servers_path_when_profiling_is_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    from max_profile import serve
    from max_profile.serve import modes

    monkeypatch.setattr(nvtx_log, "_system_nvtx_v2", lambda: False)
    plan = serve.ServePlan(
        model_path=str(tiny_model_dir),
        devices="gpu",
        mode="kernels",
        duration_s=1,
        port=1,
        metrics_port=2,
        vendor="nvidia",
        profiling_mode="on",
    )
    on_env = modes.resolve_plan(plan, "nvidia", check_tool=False).env_for(tmp_path, {})
    assert str(nvtx_log.nvtx_v2_folder()) in on_env["LD_LIBRARY_PATH"]
    off = serve.ServePlan(
        model_path=str(tiny_model_dir), devices="gpu", mode="utilization", duration_s=1, port=1, metrics_port=2
    )
    off_env = modes.resolve_plan(off, "nvidia", check_tool=False).env_for(tmp_path, {})
    assert str(nvtx_log.nvtx_v2_folder()) not in off_env.get("LD_LIBRARY_PATH", "")


def test_without_any_v2_library_the_error_names_the_fix_before_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvtx_log, "_system_nvtx_v2", lambda: False)
    monkeypatch.setattr(nvtx_log, "nvtx_v2_library", lambda: None)
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    assert not nvtx_log.max_profiling_usable("gpu") and nvtx_log.max_profiling_usable("cpu")
    with pytest.raises(ToolMissingError, match=r"fix: pip install 'nvidia-nvtx-cu12==12\.1\.105'"):
        nvtx_log.restart_with_nvtx_log(["/bin/false"], "gpu")


def test_the_h200_op_ranges_run_with_the_wheels_library() -> None:
    """The probe's capture: 16 decode steps of MAX's op ranges on the H200 (host time around each op's launch; device
    graphs off), split by phase and family."""
    raw = RawCapture.load(str(DATA / "gpu" / "h200_llama180m_op_ranges_cuda13" / "ops_gpu_raw.json.gz"))
    assert (
        raw.capture.devices == "gpu"
        and raw.capture.profiling_mode == "on"
        and raw.capture.device_graph_capture is False
    )
    assert raw.environment.gpus and raw.environment.gpus[0].name == "NVIDIA H200"
    k = build_report(raw).kernels
    assert isinstance(k, KernelBreakdown) and k.source.startswith("nvtx-log")
    decode = next(p for p in k.phases if p.phase == "decode")
    assert decode.steps == 16 and {r.family for r in decode.families} >= {"gemm", "attention", "norm"}
