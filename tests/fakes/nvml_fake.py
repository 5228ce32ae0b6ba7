"""FAKE ``pynvml`` — stands in for NVML on machines without an NVIDIA GPU (CI). Not the real library.

The functions and constants are the ones nvml.h documents and nvidia-ml-py exposes under the same
names: ``nvmlInit`` / ``nvmlShutdown``, ``nvmlDeviceGetCount`` / ``GetHandleByIndex`` / ``GetName``,
``nvmlDeviceGetUtilizationRates`` (``.gpu``, ``.memory`` in %), ``nvmlDeviceGetMemoryInfo`` (``.total``
/ ``.used`` / ``.free`` bytes), ``nvmlDeviceGetClockInfo`` / ``GetMaxClockInfo`` (MHz, ``NVML_CLOCK_SM``
= 1, ``NVML_CLOCK_MEM`` = 2) and ``nvmlDeviceGetCurrentClocksEventReasons`` (the
``nvmlClocksEventReason*`` bitmask). GPM is reported unsupported.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2


class NVMLError(Exception):
    pass


class FakeNvml:
    """One instance is one machine: ``gpus`` lists (name, total bytes, used bytes, utilization series, reasons mask)."""

    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        self.gpus = gpus
        self.initialized = False
        self.reads = 0
        self.NVML_CLOCK_GRAPHICS = NVML_CLOCK_GRAPHICS
        self.NVML_CLOCK_SM = NVML_CLOCK_SM
        self.NVML_CLOCK_MEM = NVML_CLOCK_MEM
        self.NVMLError = NVMLError

    def _gpu(self, handle: int) -> dict[str, Any]:
        if not self.initialized:
            raise NVMLError("Uninitialized")
        return self.gpus[handle]

    def nvmlInit(self) -> None:
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialized:
            raise NVMLError("Uninitialized")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._gpu(index)
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self._gpu(handle)["name"])

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        series = self._gpu(handle)["utilization"]
        self.reads += 1
        return SimpleNamespace(gpu=series[self.reads % len(series)], memory=30)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        g = self._gpu(handle)
        return SimpleNamespace(total=g["total"], used=g["used"], free=g["total"] - g["used"])

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        return int(self._gpu(handle)["sm_mhz" if clock == NVML_CLOCK_SM else "mem_mhz"])

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock: int) -> int:
        return 1980 if clock == NVML_CLOCK_SM else 3201

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return int(self._gpu(handle)["reasons"])

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.0-FAKE"

    def nvmlGpmQueryDeviceSupport(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(isSupportedDevice=0)


def h200_like(utilization: list[int] | None = None, reasons: int = 0x1) -> FakeNvml:
    return FakeNvml(
        [
            {
                "name": "NVIDIA H200 (FAKE)",
                "total": 150754820096,
                "used": 80 << 30,
                "utilization": utilization or [100, 98, 100],
                "sm_mhz": 1980,
                "mem_mhz": 3201,
                "reasons": reasons,
            }
        ]
    )
