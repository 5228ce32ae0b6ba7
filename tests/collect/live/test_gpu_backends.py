"""GPU readings without MAX's recorder (pynvml, amdsmi) and amdsmi's extras on AMD.

CI has no GPU, so NVML and AMD SMI are the FAKES in tests/fakes (built from their documented Python
APIs); MAX's recorder is the real one (it reports no GPU here). The H200 runs used the real recorder.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from max_profile.analyze.utilization import summarize_gpus
from max_profile.collect.live import gpu_backends, gpu_sampling
from max_profile.collect.live.gpu_backends import (
    AmdSmiReader,
    amd_throttle_reasons,
    nvml_throttle_reasons,
    partition_activity,
)
from max_profile.collect.live.gpu_sampling import GpuSampler

from ...conftest import run_cli
from ...fakes import nvml_fake

FAKES = Path(__file__).resolve().parents[2] / "fakes"


@pytest.fixture()
def fake_amdsmi(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    yield
    sys.modules.pop("amdsmi", None)  # the fake must not outlive the test


@pytest.fixture()
def no_max_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    """A MAX build without max.profiler.gpu / max.diagnostics.gpu (older or trimmed wheels)."""
    monkeypatch.setattr(gpu_backends, "MAX_GPU_MODULES", ("max.profiler.no_such_gpu_module",))


def _sample_for(sampler: GpuSampler, seconds: float) -> None:
    sampler.start()
    time.sleep(seconds)
    sampler.stop()


def test_amd_throttle_bits_map_to_reason_names() -> None:
    # SMU_THROTTLER_PPT0_BIT (0) and SMU_THROTTLER_TEMP_HOTSPOT_BIT (36); TDC_GFX (16)
    assert amd_throttle_reasons((1 << 0) | (1 << 36)) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert amd_throttle_reasons(1 << 16) == ["hw_slowdown"]
    assert amd_throttle_reasons(0) == [] and amd_throttle_reasons("N/A") == []
    assert nvml_throttle_reasons(0x1 | 0x4 | 0x40) == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]


def test_partition_activity_skips_unreported_slots() -> None:
    na = 0xFFFFFFFF
    metrics = {"num_partition": 2, "xcp_stats.gfx_busy_inst": [[10, 30, na, na], [90, na, na, na], [na] * 4]}
    assert partition_activity(metrics) == [20.0, 90.0]
    assert partition_activity({"num_partition": "N/A", "xcp_stats.gfx_busy_inst": "N/A"}) == []


def test_amdsmi_reader_reads_what_rocm_smi_through_max_lacks(
    fake_amdsmi: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = [
        {
            "market_name": "AMD Instinct MI300X (FAKE)",
            "vram_total_mib": 196592,
            "vram_used_mib": 1024,
            "gfx_clk": 1500,
            "max_clk": 2100,
            "activity_series": [40, 60],
            "indep_throttle_status": (1 << 33),
            "partitions": [[80, 82], [10, 12], [0, 0], [50, 50]],
        }
    ]
    monkeypatch.setenv("FAKE_AMDSMI_GPUS", json.dumps(gpus))
    reader = AmdSmiReader.open()
    try:
        info = reader.gpus()
        sample = reader.read(123)[0]
    finally:
        reader.close()
    assert info[0].key == "amd0" and info[0].memory_total_bytes == 196592 * 2**20 and info[0].max_sm_clock_mhz == 2100
    assert sample.memory_used_bytes == 1024 * 2**20 and sample.sm_clock_mhz == 1500
    assert sample.throttle_reasons == ["hw_thermal_slowdown"]  # TEMP_CORE
    assert sample.partition_activity_pct == [81.0, 11.0, 0.0, 50.0]
    assert sample.utilization_pct in (40.0, 60.0)


def test_sampler_prefers_amdsmi_on_amd_with_real_timestamps(fake_amdsmi: None) -> None:
    sampler = GpuSampler(0.02)
    _sample_for(sampler, 0.3)
    assert sampler.source == "amdsmi (sampled in-process)" and sampler.unavailable is None
    times = [s.t_ns for s in sampler.samples]
    assert len(times) >= 5 and times == sorted(times) and len(set(times)) == len(times)
    summary = summarize_gpus(sampler.samples)[0]
    assert summary.mean_partition_activity_pct and 95 < summary.mean_partition_activity_pct[0] < 99


def test_sampler_falls_back_to_pynvml_without_max_recorder(
    no_max_recorder: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = nvml_fake.h200_like(utilization=[100, 97], reasons=0x1 | 0x4)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = GpuSampler(0.02)
    _sample_for(sampler, 0.3)
    assert sampler.source == "pynvml (sampled in-process)", sampler.unavailable
    assert len(sampler.samples) >= 5 and fake.reads >= 5
    s = sampler.samples[0]
    assert s.gpu == "nv0" and s.memory_total_bytes == 150754820096 and s.max_sm_clock_mhz == 1980
    assert s.throttle_reasons == ["gpu_idle", "sw_power_cap"]
    summary = summarize_gpus(sampler.samples)[0]
    assert summary.hardware_throttle_reasons == ["sw_power_cap"] and 97 <= (summary.mean_utilization_pct or 0) <= 100
    assert not fake.initialized  # NVML shut down at stop


def test_sampler_says_which_build_adds_the_recorder(no_max_recorder: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """No MAX recorder, no usable NVML (this machine), no amdsmi: one reason naming each source and the upgrade."""
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    sampler = GpuSampler(0.05)
    sampler.start()
    sampler.stop()
    assert sampler.unavailable is not None
    reason = sampler.unavailable.reason
    assert (
        "max.profiler.no_such_gpu_module" in reason
        and "pip install -U 'max>=26.7'" in reason
        and "pynvml" in reason
        and "amdsmi" in reason
    )


def test_sampler_uses_max_recorder_when_present() -> None:
    """The real MAX 26.7 recorder: present, so it is chosen (it sees no GPU on this machine)."""
    sampler = GpuSampler(0.05)
    _sample_for(sampler, 0.2)
    assert sampler.source.startswith("max.profiler.gpu.BackgroundRecorder")
    assert sampler.unavailable is not None and "no GPU" in sampler.unavailable.reason


def test_doctor_with_amdsmi_reports_the_amd_gpu_and_its_sampler(tmp_path: Path) -> None:
    res = run_cli("doctor", "--json", str(tmp_path / "d.json"), env={"PYTHONPATH": str(FAKES)})
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "d.json").read_text())
    env = doc["environment"]
    assert env["vendor"] == "amd" and env["vendor_reason"].startswith("amdsmi found 1 GPU")
    assert env["gpus"][0]["name"] == "AMD Instinct MI300X (FAKE)"
    tools = {t["name"]: t for t in env["tools"]}
    assert tools["gpu-sampler"]["path"].startswith("amdsmi")
    assert "None" not in res.stdout


def test_doctor_prints_only_the_environment(tmp_path: Path) -> None:
    res = run_cli("doctor")
    assert res.returncode == 0, res.stderr
    for absent in (
        "Steps",
        "Utilization",
        "Findings",
        "Kernels",
        "None",
        "target",
        "phase markers",
    ):  # no capture settings: nothing captured
        assert absent not in res.stdout, absent
    assert "Environment" in res.stdout and "MAX" in res.stdout
    # what a capture here would use: MAX's profiling mode, the device-graph default, each output's libraries
    for present in ("MAX profiling", "device graphs", "--html", "--perfetto", "--otel"):
        assert present in res.stdout, present


def test_gpu_sampling_module_has_no_max_import_at_top() -> None:
    """Importing the sampler must not need MAX (analysis machines without it read saved captures)."""
    source = Path(gpu_sampling.__file__).read_text()
    assert "\nimport max" not in source and "\nfrom max." not in source


def test_doctor_line_names_the_build_that_adds_the_recorder(no_max_recorder: None) -> None:
    from max_profile.collect.probes.environment import gpu_sampler_status

    status = gpu_sampler_status("nvidia")
    assert status.path == "pynvml (sampled in-process)"
    assert status.problem and "has no max.profiler.gpu" in status.problem
    assert status.install_hint and "pip install -U 'max>=26.7'" in status.install_hint


def test_doctor_line_with_the_recorder_present() -> None:
    from max_profile.collect.probes.environment import gpu_sampler_status

    status = gpu_sampler_status("nvidia")
    assert status.path == "max.profiler.gpu.BackgroundRecorder" and status.problem is None


def test_child_python_env_leaves_os_environ_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX sets PYTHONEXECUTABLE / PYTHONPATH=: in the C environment after a load; os.environ must not inherit them."""
    import ctypes
    import os

    monkeypatch.delenv("PYTHONEXECUTABLE", raising=False)
    os.putenv("PYTHONEXECUTABLE", "/usr/bin/python3-from-max")  # C level only, as MAX's native code does
    try:
        with gpu_sampling.child_python_env():
            assert os.environ["PYTHONEXECUTABLE"] == sys.executable
        assert "PYTHONEXECUTABLE" not in os.environ
        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_char_p
        assert libc.getenv(b"PYTHONEXECUTABLE") == b"/usr/bin/python3-from-max"  # MAX's own value, back for MAX
    finally:
        os.unsetenv("PYTHONEXECUTABLE")


def test_hardware_throttle_reasons_match_max() -> None:
    """Analysis keeps its own copy (it imports no MAX); it must be MAX's set."""
    from max.profiler.gpu import HARDWARE_THROTTLE_REASONS as max_set

    from max_profile.analyze.utilization import HARDWARE_THROTTLE_REASONS

    assert set(max_set) == set(HARDWARE_THROTTLE_REASONS)
