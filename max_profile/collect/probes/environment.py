"""Detect the environment before choosing a tool: vendor, GPUs, profilers, MAX version.

Equivalent manual checks: ``nvidia-smi -L`` / ``rocm-smi``, ``nsys --version``,
``ncu --version``, ``rocprofv3 --version``, ``max --version``.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from max_profile.collect.live.cupti_native import NativeCuptiCollector
from max_profile.collect.live.gpu_backends import MAX_GPU_UPGRADE, max_gpu_module, open_direct_reader
from max_profile.collect.live.nvtx_log import MAX_GPU_NVTX_PROBLEM, NVTX_V2_FIX, max_profiling_usable
from max_profile.errors import ToolMissingError
from max_profile.model import Environment, GpuInfo, ToolStatus, Vendor

NSYS_MIN_VERSION = (2024, 4, 2)
"""nsys older than this has known problems with MAX captures (SPEC)."""

INSTALL_HINTS: dict[str, str] = {
    "nsys": (
        "Nsight Systems ships with the CUDA Toolkit (/usr/local/cuda/bin/nsys); or `apt-get install nsight-systems` "
        "(NVIDIA's CUDA apt repository), or the installer from https://developer.nvidia.com/nsight-systems"
    ),
    "ncu": (
        "Nsight Compute ships with the CUDA Toolkit (/usr/local/cuda/bin/ncu); or `apt-get install nsight-compute` "
        "(NVIDIA's CUDA apt repository), or the installer from https://developer.nvidia.com/nsight-compute"
    ),
    "rocprofv3": "rocprofv3 ships with ROCm (/opt/rocm/bin/rocprofv3): `apt-get install rocprofiler-sdk`",
    "cupti": "pip install 'max-profile[nvidia]'   (cupti-python, nvtx, pynvml)",
}

_TOOL_GLOBS: dict[str, list[str]] = {
    "nsys": [
        "/usr/local/cuda/bin/nsys",
        "/usr/local/cuda-*/bin/nsys",
        "/opt/nvidia/nsight-systems/*/bin/nsys",
        "/opt/nvidia/nsight-systems*/bin/nsys",
        "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
    ],
    "ncu": ["/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu"],
    "rocprofv3": ["/opt/rocm/bin/rocprofv3", "/opt/rocm-*/bin/rocprofv3"],
}


def find_tool(name: str, extra_dirs: Sequence[str] = ()) -> str | None:
    """PATH first, then the usual install folders (newest version folder last wins)."""
    found = shutil.which(name)
    if found:
        return found
    for d in extra_dirs:
        cand = os.path.join(d, name)
        if os.access(cand, os.X_OK):
            return cand
    for pattern in _TOOL_GLOBS.get(name, []):
        hits = sorted(p for p in glob.glob(pattern) if os.access(p, os.X_OK))
        if hits:
            return hits[-1]
    return None


def _version_of(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or "") + (out.stderr or "")
    m = re.search(r"(\d{4}\.\d+(?:\.\d+)*(?:\.\d+)?)", text) or re.search(r"(\d+\.\d+(?:\.\d+)*)", text)
    return m.group(1) if m else None


def parse_version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    nums = re.findall(r"\d+", text)
    return tuple(int(n) for n in nums) if nums else None


def tool_status(name: str, path: str | None = None) -> ToolStatus:
    """Locate one profiler and check its version; missing tools carry their install command."""
    path = path or find_tool(name)
    if path is None:
        return ToolStatus(
            name=name, problem="not found on PATH or in the usual install folders", install_hint=INSTALL_HINTS[name]
        )
    version = _version_of(path)
    problem = None
    if name == "nsys":
        v = parse_version(version)
        if v is not None and v[:3] < NSYS_MIN_VERSION:
            problem = (
                f"nsys {version} is older than {'.'.join(map(str, NSYS_MIN_VERSION))}, which has known problems "
                "with MAX captures; install a newer Nsight Systems"
            )
    return ToolStatus(
        name=name, path=path, version=version, problem=problem, install_hint=INSTALL_HINTS[name] if problem else None
    )


def require_tool(name: str, purpose: str) -> str:
    """The path of a usable ``name`` (nsys, ncu, rocprofv3), or :class:`ToolMissingError` with the install command."""
    st = tool_status(name)
    if st.path is None or st.problem:
        raise ToolMissingError(f"{name} is needed for {purpose}: {st.problem}. Install: {st.install_hint}")
    return st.path


def max_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("max")
    except Exception:  # noqa: BLE001
        return None


def detect_vendor() -> tuple[Vendor, str, list[GpuInfo], str | None]:
    """(vendor, how it was decided, GPUs, driver version) — NVML / ROCm SMI via MAX, then the CLIs."""
    gpus: list[GpuInfo] = []
    driver: str | None = None
    module, source = max_gpu_module()
    try:
        if module is None:
            raise ImportError(source)
        with module.GPUDiagContext() as ctx:
            stats = ctx.get_stats()
        for key, st in sorted(stats.items()):
            clocks = getattr(st, "clocks", None)
            gpus.append(
                GpuInfo(
                    key=key,
                    memory_total_bytes=int(st.memory.total_bytes),
                    max_sm_clock_mhz=int(clocks.core_max_mhz) if clocks else None,
                )
            )
    except Exception:  # noqa: BLE001
        pass
    if gpus:
        vendor: Vendor = "nvidia" if gpus[0].key.startswith("nv") else "amd"
        names, driver = _nvml_names() if vendor == "nvidia" else ({}, None)
        gpus = [
            GpuInfo(
                key=g.key,
                name=names.get(g.key),
                memory_total_bytes=g.memory_total_bytes,
                max_sm_clock_mhz=g.max_sm_clock_mhz,
            )
            for g in gpus
        ]
        return (
            vendor,
            f"{source} found {len(gpus)} GPU(s) ({'NVML' if vendor == 'nvidia' else 'ROCm SMI'})",
            gpus,
            driver,
        )
    reader, _ = open_direct_reader()
    if reader is not None:
        try:
            gpus = reader.gpus()
        finally:
            reader.close()
        if gpus:
            direct: Vendor = "nvidia" if gpus[0].key.startswith("nv") else "amd"
            return (
                direct,
                f"{reader.source.split()[0]} found {len(gpus)} GPU(s)",
                gpus,
                _nvml_names()[1] if direct == "nvidia" else None,
            )
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
            if out.returncode == 0 and "GPU" in out.stdout:
                return "nvidia", "nvidia-smi -L lists GPUs but NVML gave no stats", [], None
        except (OSError, subprocess.TimeoutExpired):
            pass
    if shutil.which("rocm-smi"):
        return "amd", "rocm-smi is installed but ROCm SMI gave no stats", [], None
    return "none", "no GPU: NVML and ROCm SMI found none (nvidia-smi / rocm-smi absent or empty)", [], None


def _nvml_names() -> tuple[dict[str, str], str | None]:
    try:
        import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]

        pynvml.nvmlInit()
        names = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            n = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names[f"nv{i}"] = n.decode() if isinstance(n, bytes) else str(n)
        drv = pynvml.nvmlSystemGetDriverVersion()
        return names, drv.decode() if isinstance(drv, bytes) else str(drv)
    except Exception:  # noqa: BLE001
        return {}, None


def detect_environment(check_tools: bool = True) -> Environment:
    """Vendor, GPUs, MAX version, MODULAR_ENABLE_PROFILING and the profilers for this vendor."""
    vendor, reason, gpus, driver = detect_vendor()
    tools: list[ToolStatus] = []
    warnings: list[str] = []
    if check_tools:
        names = (
            ["nsys", "ncu"]
            if vendor == "nvidia"
            else ["rocprofv3"]
            if vendor == "amd"
            else ["nsys", "ncu", "rocprofv3"]
        )
        tools = [tool_status(n) for n in names]
        if vendor == "nvidia":
            tools.append(_cupti_status())
        if vendor != "none":
            tools.append(gpu_sampler_status(vendor))
        for t in tools:
            if t.problem and t.path:
                warnings.append(t.problem)
    profiling = os.environ.get("MODULAR_ENABLE_PROFILING")
    if profiling and profiling not in ("off", "on", "detailed"):
        warnings.append(
            f"MODULAR_ENABLE_PROFILING={profiling!r} is invalid: MAX accepts off, on or detailed and fails at load"
        )
    profiling_problem = None
    if vendor == "nvidia":
        profiling_problem = None if max_profiling_usable("gpu") else f"{MAX_GPU_NVTX_PROBLEM}; fix: {NVTX_V2_FIX}"
    return Environment(
        vendor=vendor,
        vendor_reason=reason,
        gpus=gpus,
        driver_version=driver,
        max_version=max_version(),
        python_version=sys.version.split()[0],
        platform=f"{platform.system()} {platform.machine()}",
        modular_enable_profiling=profiling,
        max_profiling_problem=profiling_problem,
        tools=tools,
        warnings=warnings,
        programs=programs_here(),
    )


PRINTED_PROGRAMS = ("max-profile", "max", "pip")
"""Programs the report's next commands start with."""


def programs_here() -> dict[str, str]:
    """Each of :data:`PRINTED_PROGRAMS` that this interpreter's environment holds beside it but a shell would not find
    as that script (not on PATH, or another one first): its path, so a printed command runs as printed."""
    here = Path(sys.executable).parent
    out: dict[str, str] = {}
    for name in PRINTED_PROGRAMS:
        script = here / name
        if script.is_file() and shutil.which(name) != str(script):
            out[name] = str(script)
    return out


def gpu_sampler_status(vendor: Vendor) -> ToolStatus:
    """Which GPU sampler a capture will use, and what a different MAX build or package would add."""
    module, detail = max_gpu_module()
    if vendor == "amd" and importlib.util.find_spec("amdsmi") is not None:
        return ToolStatus(name="gpu-sampler", path="amdsmi (sampled in-process: throttle status, partitions)")
    if module is not None:
        hint = (
            "`pip install amdsmi` (matching the ROCm install) adds throttle status and per-partition activity"
            if vendor == "amd"
            else None
        )
        return ToolStatus(name="gpu-sampler", path=f"{detail}.BackgroundRecorder", install_hint=hint)
    fallback = "pynvml" if vendor == "nvidia" else "amdsmi"
    return ToolStatus(
        name="gpu-sampler",
        path=f"{fallback} (sampled in-process)",
        problem=f"MAX {max_version() or '?'} has no max.profiler.gpu: utilization is read with {fallback} from a "
        "thread of the profiled process",
        install_hint=f"{MAX_GPU_UPGRADE} (its BackgroundRecorder samples in a child process)",
    )


def _cupti_status() -> ToolStatus:
    try:
        from importlib.metadata import version

        from cupti import cupti  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: F401

        return ToolStatus(name="cupti", path="cupti-python", version=version("cupti-python"))
    except Exception as exc:  # noqa: BLE001
        return ToolStatus(
            name="cupti",
            problem=f"cupti-python is not importable ({type(exc).__name__})",
            install_hint=INSTALL_HINTS["cupti"],
        )


def doctor_checks(env: Environment) -> list[ToolStatus]:
    """What ``max-profile doctor`` adds to the environment: whether MAX's profiling mode works here, whether the CUPTI
    recorder can subscribe, and the device-graph default (the outputs' libraries:
    :func:`max_profile.render.outputs.output_checks`)."""
    checks: list[ToolStatus] = []
    mode = env.modular_enable_profiling or "off"
    if env.max_profiling_problem:
        checks.append(
            ToolStatus(
                name="MAX profiling",
                path=f"MODULAR_ENABLE_PROFILING={mode}",
                problem=f"MODULAR_ENABLE_PROFILING=on cannot work here: {env.max_profiling_problem}",
                install_hint="install CUDA 12's libnvToolsExt.so.1 (e.g. `apt-get install cuda-nvtx-12-8`) for MAX's "
                "NVTX ranges; max_profile marks phases itself in-process",
            )
        )
    else:
        checks.append(
            ToolStatus(
                name="MAX profiling",
                path=f"MODULAR_ENABLE_PROFILING={mode} (on / detailed usable: MAX's op and scheduler ranges)",
            )
        )
    if env.vendor == "nvidia":
        checks.append(_cupti_subscribe_status())
    if env.vendor == "none":
        checks.append(
            ToolStatus(
                name="a capture here",
                path="the pipeline's steps (host time, process CPU time) and MAX's op ranges as its kernels (--kernels "
                "auto is nvtx-log on the CPU: a compile of its own with MODULAR_ENABLE_PROFILING=on); no GPU samples",
            )
        )
    checks.append(
        ToolStatus(
            name="device graphs",
            path="MAX decides: on for supported architectures on a GPU (max generate / serve default), off on the CPU"
            if env.vendor != "none"
            else "off on the CPU (MAX's default)",
        )
    )
    return checks


def _cupti_subscribe_status() -> ToolStatus:
    """Start and stop the C CUPTI recorder once: it builds, loads libcupti and subscribes (or says what holds CUPTI)."""
    try:
        rec = NativeCuptiCollector(launches=False)
        rec.start()
        rec.stop()
        return ToolStatus(
            name="cupti-recorder",
            path=f"C recorder subscribed and stopped ({rec.libcupti})",
            version=str(rec.cupti_version),
        )
    except Exception as exc:  # noqa: BLE001 - the reason is the answer
        return ToolStatus(
            name="cupti-recorder",
            problem=f"cannot record kernels in-process: {exc}",
            install_hint=INSTALL_HINTS["cupti"],
        )
