"""FAKE ``amdsmi`` — stands in for AMD SMI on machines without an AMD GPU (CI). Not the real library.

Built from the amdsmi Python API as documented in ROCm/amdsmi ``py-interface/README.md`` and as
``amdsmi_interface.py`` returns it: ``amdsmi_init`` / ``amdsmi_shut_down``,
``amdsmi_get_processor_handles``, ``amdsmi_get_gpu_asic_info`` (``market_name``),
``amdsmi_get_gpu_activity`` (``gfx_activity`` / ``umc_activity`` / ``mm_activity``, %),
``amdsmi_get_gpu_vram_usage`` (``vram_total`` / ``vram_used``, MiB), ``amdsmi_get_clock_info(h,
AmdSmiClkType.GFX)`` (``clk`` / ``min_clk`` / ``max_clk``, MHz) and ``amdsmi_get_gpu_metrics_info``: a
flat dict whose unsupported fields read "N/A", with ``indep_throttle_status`` (a bitmask of the amdgpu
``SMU_THROTTLER_*`` bits), ``num_partition`` and ``xcp_stats.gfx_busy_inst`` (one row per partition,
one value per XCC, 0xFFFFFFFF where there is none).

The GPUs come from ``$FAKE_AMDSMI_GPUS`` (JSON list of dicts with the keys below) or one MI300X in
SPX mode; ``gfx_activity`` walks through ``activity_series`` one reading per call.
"""

from __future__ import annotations

import json
import os
from enum import IntEnum
from typing import Any

NOT_AVAILABLE_U32 = 0xFFFFFFFF
MAX_XCC = 8
MAX_XCP = 8


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int, err_info: str = "") -> None:
        super().__init__(err_info or f"error {err_code}")
        self.err_code = err_code
        self.err_info = err_info


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1 << 0
    INIT_AMD_GPUS = 1 << 1


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4


DEFAULT_GPUS: list[dict[str, Any]] = [
    {
        "market_name": "AMD Instinct MI300X (FAKE)",
        "vram_total_mib": 196592,
        "vram_used_mib": 52000,
        "gfx_clk": 2100,
        "max_clk": 2100,
        "activity_series": [97, 99, 98],
        "indep_throttle_status": 0,
        "partitions": [[96, 98, 97, 99, 95, 98, 97, 96]],
    }
]

_state: dict[str, Any] = {"initialized": False, "calls": 0}


def _gpus() -> list[dict[str, Any]]:
    text = os.environ.get("FAKE_AMDSMI_GPUS")
    return json.loads(text) if text else DEFAULT_GPUS


def _check(handle: Any) -> dict[str, Any]:
    if not _state["initialized"]:
        raise AmdSmiLibraryException(32, "AMDSMI_STATUS_NOT_INIT")
    gpus = _gpus()
    if not isinstance(handle, int) or not 0 <= handle < len(gpus):
        raise AmdSmiLibraryException(2, "AMDSMI_STATUS_INVAL")
    return gpus[handle]


def amdsmi_init(flag: int = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
    if os.environ.get("FAKE_AMDSMI_NO_DRIVER"):
        raise AmdSmiLibraryException(31, "AMDSMI_STATUS_DRIVER_NOT_LOADED")
    _state["initialized"] = True


def amdsmi_shut_down() -> None:
    _state["initialized"] = False


def amdsmi_get_processor_handles() -> list[int]:
    if not _state["initialized"]:
        raise AmdSmiLibraryException(32, "AMDSMI_STATUS_NOT_INIT")
    return list(range(len(_gpus())))


def amdsmi_get_gpu_asic_info(handle: int) -> dict[str, Any]:
    gpu = _check(handle)
    return {
        "market_name": gpu["market_name"],
        "vendor_id": "0x1002",
        "device_id": "0x74a1",
        "rev_id": "0x00",
        "asic_serial": "0xFAKE",
    }


def amdsmi_get_gpu_activity(handle: int) -> dict[str, Any]:
    gpu = _check(handle)
    series = gpu.get("activity_series") or ["N/A"]
    _state["calls"] += 1
    return {"gfx_activity": series[_state["calls"] % len(series)], "umc_activity": 40, "mm_activity": "N/A"}


def amdsmi_get_gpu_vram_usage(handle: int) -> dict[str, Any]:
    gpu = _check(handle)
    return {"vram_total": gpu["vram_total_mib"], "vram_used": gpu["vram_used_mib"]}


def amdsmi_get_clock_info(handle: int, clock_type: int) -> dict[str, Any]:
    gpu = _check(handle)
    return {
        "clk": gpu["gfx_clk"],
        "min_clk": 500,
        "max_clk": gpu["max_clk"],
        "clk_locked": False,
        "clk_deep_sleep": False,
    }


def amdsmi_get_gpu_metrics_info(handle: int) -> dict[str, Any]:
    gpu = _check(handle)
    parts = gpu.get("partitions")
    if parts is None:
        raise AmdSmiLibraryException(2, "AMDSMI_STATUS_NOT_SUPPORTED")
    rows = [list(p) + [NOT_AVAILABLE_U32] * (MAX_XCC - len(p)) for p in parts]
    rows += [[NOT_AVAILABLE_U32] * MAX_XCC for _ in range(MAX_XCP - len(rows))]
    return {
        "temperature_edge": "N/A",
        "temperature_hotspot": 61,
        "average_gfx_activity": gpu.get("activity_series", [0])[0],
        "average_umc_activity": 40,
        "throttle_status": "N/A",
        "indep_throttle_status": gpu.get("indep_throttle_status", "N/A"),
        "current_gfxclk": gpu["gfx_clk"],
        "num_partition": len(parts),
        "xcp_stats.gfx_busy_inst": rows,
        "xcp_stats.gfx_busy_acc": [[NOT_AVAILABLE_U32] * MAX_XCC for _ in range(MAX_XCP)],
    }
