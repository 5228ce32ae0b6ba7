"""Where GPU readings come from: MAX's own recorder when the MAX build has it, else NVML or AMD SMI directly.

* ``max.profiler.gpu`` (MAX 26.7 and later) or ``max.diagnostics.gpu`` (its older name, a deprecated
  alias in 26.7): ``BackgroundRecorder`` samples NVML / ROCm SMI in a child process.
* ``pynvml`` (``pip install nvidia-ml-py``): NVML read from a thread of this process. Equivalent CLI:
  ``nvidia-smi --query-gpu=utilization.gpu,memory.used,clocks.sm,clocks_event_reasons.active --format=csv -lms 100``.
* ``amdsmi`` (ships with ROCm 6+; ``pip install amdsmi`` matching the installed ROCm): preferred on AMD
  because it gives what ROCm SMI through MAX does not: throttle status (MAX reports none on ROCm) and
  per-partition (XCP) activity on partitioned Instinct GPUs. Equivalent CLI: ``amd-smi metric --usage
  --power --clock``.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from max_profile.model import GpuInfo, UtilizationSample

MAX_GPU_MODULES = ("max.profiler.gpu", "max.diagnostics.gpu")
MAX_GPU_UPGRADE = "pip install -U 'max>=26.7'"
"""What adds ``max.profiler.gpu`` to a MAX install that lacks it."""

NVML_CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""``nvmlClocksEventReason*`` bits (nvml.h) under the names ``max.profiler.gpu.ThrottleReason`` uses."""

AMD_THROTTLER_BITS: tuple[tuple[range, str], ...] = (
    (range(0, 8), "sw_power_cap"),  # PPT0-3, SPL, FPPT, SPPT, SPPT_APU: power limits
    (range(16, 24), "hw_slowdown"),  # TDC_*, EDC_*, APCC: current limits
    (range(32, 44), "hw_thermal_slowdown"),  # TEMP_*: temperature limits
    (range(44, 48), "hw_power_brake_slowdown"),  # VRHOT0/1, PROCHOT_CPU/GFX: external brake signals
)
"""``indep_throttle_status`` bit groups (Linux amdgpu ``SMU_THROTTLER_*_BIT``) mapped to the NVIDIA-style names."""

AMD_NOT_AVAILABLE = 0xFFFFFFFF
"""amdsmi's marker for a per-XCC value the GPU does not report (max uint32)."""


class GpuReader(Protocol):
    source: str

    def gpus(self) -> list[GpuInfo]: ...

    def read(self, t_ns: int) -> list[UtilizationSample]: ...

    def close(self) -> None: ...


def max_gpu_module() -> tuple[ModuleType | None, str]:
    """MAX's GPU diagnostics module and its name, or None and why neither name imports."""
    problems: list[str] = []
    for name in MAX_GPU_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return importlib.import_module(name), name
        except Exception as exc:  # noqa: BLE001 - MAX missing, or a build without the module
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    return None, "; ".join(problems)


def _number(value: Any) -> float | None:
    """amdsmi / NVML values: numbers, or "N/A" (and amdsmi's max-uint markers) when not reported."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value in (0xFFFF, AMD_NOT_AVAILABLE, 0xFFFFFFFFFFFFFFFF):
        return None
    return float(value)


def amd_throttle_reasons(indep_throttle_status: Any) -> list[str]:
    """Names for the set bits of an ``indep_throttle_status`` bitmask (empty when not reported)."""
    bits = _number(indep_throttle_status)
    if bits is None:
        return []
    mask = int(bits)
    return [name for span, name in AMD_THROTTLER_BITS if any(mask >> b & 1 for b in span)]


def nvml_throttle_reasons(mask: int) -> list[str]:
    return [name for bit, name in NVML_CLOCK_EVENT_REASONS.items() if mask & bit]


@dataclass
class NvmlReader:
    """NVML through ``pynvml``, one call set per GPU per sample (about 0.1 ms per GPU)."""

    nvml: Any
    handles: list[Any]
    source: str = "pynvml (sampled in-process)"

    @classmethod
    def open(cls) -> NvmlReader:
        import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            pynvml.nvmlShutdown()
            raise RuntimeError("NVML sees no GPU")
        return cls(pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)])

    def gpus(self) -> list[GpuInfo]:
        out = []
        for i, h in enumerate(self.handles):
            name = self.nvml.nvmlDeviceGetName(h)
            out.append(
                GpuInfo(
                    key=f"nv{i}",
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    memory_total_bytes=int(self.nvml.nvmlDeviceGetMemoryInfo(h).total),
                    max_sm_clock_mhz=int(self.nvml.nvmlDeviceGetMaxClockInfo(h, self.nvml.NVML_CLOCK_SM)),
                )
            )
        return out

    def _reasons(self, h: Any) -> list[str]:
        for fn in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            if hasattr(self.nvml, fn):
                return nvml_throttle_reasons(int(getattr(self.nvml, fn)(h)))
        return []

    def read(self, t_ns: int) -> list[UtilizationSample]:
        nv = self.nvml
        out = []
        for i, h in enumerate(self.handles):
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            out.append(
                UtilizationSample(
                    t_ns=t_ns,
                    gpu=f"nv{i}",
                    utilization_pct=float(nv.nvmlDeviceGetUtilizationRates(h).gpu),
                    memory_used_bytes=int(mem.used),
                    memory_total_bytes=int(mem.total),
                    sm_clock_mhz=int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                    max_sm_clock_mhz=int(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
                    memory_clock_mhz=int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
                    throttle_reasons=self._reasons(h),
                )
            )
        return out

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a library that may already be gone
            pass


@dataclass
class AmdSmiReader:
    """AMD SMI through the ``amdsmi`` Python package (ROCm 6+)."""

    smi: Any
    handles: list[Any]
    source: str = "amdsmi (sampled in-process)"

    @classmethod
    def open(cls) -> AmdSmiReader:
        import amdsmi  # type: ignore[import-not-found,import-untyped,unused-ignore]

        flags = getattr(getattr(amdsmi, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
        amdsmi.amdsmi_init(flags) if flags is not None else amdsmi.amdsmi_init()
        handles = list(amdsmi.amdsmi_get_processor_handles())
        if not handles:
            amdsmi.amdsmi_shut_down()
            raise RuntimeError("AMD SMI sees no GPU")
        return cls(amdsmi, handles)

    def _gfx_clock(self, h: Any) -> dict[str, Any]:
        kind = getattr(getattr(self.smi, "AmdSmiClkType", None), "GFX", None)
        try:
            return dict(self.smi.amdsmi_get_clock_info(h, kind))
        except Exception:  # noqa: BLE001 - not reported on this GPU / driver
            return {}

    def gpus(self) -> list[GpuInfo]:
        out = []
        for i, h in enumerate(self.handles):
            try:
                name = str(self.smi.amdsmi_get_gpu_asic_info(h).get("market_name") or "") or None
            except Exception:  # noqa: BLE001
                name = None
            vram = self.smi.amdsmi_get_gpu_vram_usage(h)
            total = _number(vram.get("vram_total"))
            max_clk = _number(self._gfx_clock(h).get("max_clk"))
            out.append(
                GpuInfo(
                    key=f"amd{i}",
                    name=name,
                    memory_total_bytes=int(total * 2**20) if total is not None else None,
                    max_sm_clock_mhz=int(max_clk) if max_clk is not None else None,
                )
            )
        return out

    def read(self, t_ns: int) -> list[UtilizationSample]:
        out = []
        for i, h in enumerate(self.handles):
            activity = self.smi.amdsmi_get_gpu_activity(h)
            vram = self.smi.amdsmi_get_gpu_vram_usage(h)  # MiB
            clock = self._gfx_clock(h)
            try:
                metrics = dict(self.smi.amdsmi_get_gpu_metrics_info(h))
            except Exception:  # noqa: BLE001 - older GPUs have no metrics table
                metrics = {}
            used, total = _number(vram.get("vram_used")), _number(vram.get("vram_total"))
            gfx, clk, max_clk = (
                _number(activity.get("gfx_activity")),
                _number(clock.get("clk")),
                _number(clock.get("max_clk")),
            )
            out.append(
                UtilizationSample(
                    t_ns=t_ns,
                    gpu=f"amd{i}",
                    utilization_pct=gfx,
                    memory_used_bytes=int(used * 2**20) if used is not None else None,
                    memory_total_bytes=int(total * 2**20) if total is not None else None,
                    sm_clock_mhz=int(clk) if clk is not None else None,
                    max_sm_clock_mhz=int(max_clk) if max_clk is not None else None,
                    throttle_reasons=amd_throttle_reasons(metrics.get("indep_throttle_status")),
                    partition_activity_pct=partition_activity(metrics),
                )
            )
        return out

    def close(self) -> None:
        try:
            self.smi.amdsmi_shut_down()
        except Exception:  # noqa: BLE001
            pass


def partition_activity(metrics: dict[str, Any]) -> list[float]:
    """Mean instantaneous graphics activity (%) of each compute partition (XCP), from the metrics table.

    ``xcp_stats.gfx_busy_inst`` holds one row per partition and one value per XCC (compute die) in it;
    unused slots hold the not-available marker. One entry per partition that reports anything.
    """
    rows = metrics.get("xcp_stats.gfx_busy_inst")
    count = _number(metrics.get("num_partition"))
    if not isinstance(rows, list) or count is None:
        return []
    out = []
    for row in rows[: int(count)]:
        values = [
            v for v in (_number(x) for x in (row if isinstance(row, list) else [])) if v is not None and 0 <= v <= 100
        ]
        if values:
            out.append(sum(values) / len(values))
    return out


def open_direct_reader(prefer_amd: bool = True) -> tuple[GpuReader | None, list[str]]:
    """The first of amdsmi / pynvml that opens and sees a GPU, and why each that did not failed."""
    problems: list[str] = []
    openers: list[tuple[str, Any]] = [("amdsmi", AmdSmiReader.open), ("pynvml", NvmlReader.open)]
    if not prefer_amd:
        openers.reverse()
    for name, opener in openers:
        try:
            return opener(), problems
        except Exception as exc:  # noqa: BLE001 - library missing, driver missing, or no GPU
            problems.append(f"{name}: {type(exc).__name__}: {str(exc)[:120] or 'unavailable'}")
    return None, problems
