"""The kernel modes, as data: what each way of recording a generation's kernels records, what it needs, where it runs
and what stands in for it where it cannot.

``profile(pipeline, kernels=...)``, ``max-profile run --kernels`` and ``max-profile kernels --backend`` all read this
registry; no code outside it branches on a mode's name (``tests/test_registries.py`` scans for that).

=========  ======================================================================================================
mode       records
=========  ======================================================================================================
off        steps and utilization only
cupti      every GPU kernel of a share of the steps (CUPTI activity records, in this process)
nvtx-log   MAX's op ranges on the host clock (MODULAR_ENABLE_PROFILING=on, NVTX log library at process start)
ops        MAX's op ranges joined to the CUPTI kernels each op launched (every step; device graphs off)
auto       cupti on an NVIDIA GPU; elsewhere MAX's op ranges when the NVTX log library loads, else off
nsys       the generation in a child under ``nsys profile`` (``kernels --backend nsys`` only)
rocprof    refused with the rocprofv3 command line to run yourself (``kernels --backend rocprof`` only)
=========  ======================================================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from max_profile.errors import InputError
from max_profile.model.tags import KernelOrigin

Place = Literal["nvidia-gpu", "other-gpu", "cpu"]
"""Where a generation runs, as far as kernel recording cares."""

Runner = Literal["in-process", "nsys", "refused"]
"""How a mode records: inside this process, in a child under nsys, or not by us at all (the user runs the tool)."""


def place_of(vendor: str, devices: str) -> Place:
    """The place of a run on ``devices`` ("cpu", "gpu", "gpu:0,1") of a machine of GPU ``vendor``."""
    if devices == "cpu" or vendor == "none":
        return "cpu"
    return "nvidia-gpu" if vendor == "nvidia" else "other-gpu"


@dataclass(frozen=True)
class KernelMode:
    """One way of recording a generation's kernels."""

    name: str
    records: str
    """What it records, as ``--help`` and the plan say it."""
    cupti: bool = False
    """Records GPU kernels with CUPTI in this process."""
    op_ranges: bool = False
    """Records MAX's op ranges: needs MODULAR_ENABLE_PROFILING=on and the NVTX log library loaded at process start."""
    sampled: bool = False
    """Records a share of the steps (``kernel_share``); otherwise every step."""
    origin: KernelOrigin | None = None
    """The origin tag of the kernel records it writes (``RawCapture.kernel_source``); None: it writes none."""
    choices: Mapping[Place, tuple[str, ...]] = field(default_factory=dict)
    """Per place, the modes that stand for this one there, in order of preference: the first whose needs are met
    is the one that records (an op-range mode needs the NVTX log library); none left: refused with ``refusal``."""
    refusal: str = ""
    runner: Runner = "in-process"
    in_process_api: bool = True
    """Offered by ``profile(kernels=...)`` and ``run --kernels`` (nsys and rocprof are ``kernels --backend`` only)."""

    @property
    def records_kernels(self) -> bool:
        """Records kernels (or ops standing for them) in this process."""
        return self.cupti or self.op_ranges

    @property
    def collector(self) -> str | None:
        """Its tag among ``Capture.collectors`` (``kernels:cupti``); None when it records nothing."""
        return f"kernels:{self.name}" if self.records_kernels else None

    @property
    def graphs_off_on_gpu(self) -> bool:
        """Device graphs off on a GPU: MAX's op ranges are host-side ranges around each launch; a graph replay has
        none."""
        return self.op_ranges


_EVERYWHERE: tuple[Place, ...] = ("nvidia-gpu", "other-gpu", "cpu")

KERNEL_MODES: dict[str, KernelMode] = {
    m.name: m
    for m in (
        KernelMode("off", "steps and utilization only", choices={p: ("off",) for p in _EVERYWHERE}),
        KernelMode(
            "cupti",
            "every GPU kernel of a share of the steps (CUPTI, in this process)",
            cupti=True,
            sampled=True,
            origin=KernelOrigin.CUPTI,
            choices={"nvidia-gpu": ("cupti",)},
            refusal="--kernels cupti records NVIDIA GPU kernels; use --kernels nvtx-log for MAX's op ranges on any "
            "device (or --kernels auto)",
        ),
        KernelMode(
            "nvtx-log",
            "MAX's op ranges on the host clock (MODULAR_ENABLE_PROFILING=on)",
            op_ranges=True,
            origin=KernelOrigin.OP_RANGES,
            choices={p: ("nvtx-log",) for p in _EVERYWHERE},
            refusal="MAX's op ranges need the NVTX log library loaded at process start",
        ),
        KernelMode(
            "ops",
            "MAX's op ranges joined to the CUPTI kernels each op launched (every step, device graphs off)",
            cupti=True,
            op_ranges=True,
            origin=KernelOrigin.CUPTI,
            choices={"nvidia-gpu": ("ops",), "other-gpu": ("nvtx-log",), "cpu": ("nvtx-log",)},
            refusal="--kernels ops needs MAX's op ranges: the NVTX log library loaded at process start",
        ),
        KernelMode(
            "auto",
            "cupti on an NVIDIA GPU; elsewhere MAX's op ranges when they can be recorded, else off",
            choices={"nvidia-gpu": ("cupti",), "other-gpu": ("nvtx-log", "off"), "cpu": ("nvtx-log", "off")},
        ),
        KernelMode(
            "nsys",
            "the generation in a child process under nsys profile (CUDA trace, NVTX ranges)",
            origin=KernelOrigin.NSYS,
            choices={"nvidia-gpu": ("nsys",), "other-gpu": ("nsys",), "cpu": ("nsys",)},
            runner="nsys",
            in_process_api=False,
        ),
        KernelMode(
            "rocprof",
            "run the generation under rocprofv3 yourself and import its trace",
            origin=KernelOrigin.ROCPROF,
            runner="refused",
            refusal="run the generation under rocprofv3 yourself (rocprofv3 --kernel-trace --marker-trace "
            "--output-format csv -d OUT -- max-profile run --model-path P --kernels off) and read it with "
            "`max-profile kernels --import OUT/<host>/<pid>_kernel_trace.csv`",
            in_process_api=False,
        ),
    )
}

IN_PROCESS_MODES: tuple[str, ...] = tuple(name for name, m in KERNEL_MODES.items() if m.in_process_api)
"""The modes of ``profile(kernels=...)`` and ``run --kernels``."""
BACKENDS: tuple[str, ...] = tuple(name for name, m in KERNEL_MODES.items() if m.name not in ("off", "auto"))
"""The modes of ``kernels --backend`` (a named recorder: not off, not a choice made for you)."""


def kernel_mode(name: str | bool, offered: tuple[str, ...] = IN_PROCESS_MODES) -> KernelMode:
    """The mode of a name (True: cupti, False: off, as ``profile(kernels=True)`` has it); InputError for another."""
    if name is True or name is False:
        return KERNEL_MODES["cupti" if name else "off"]
    if name not in offered:
        raise InputError(f"kernels={name!r}: use one of {', '.join(offered)}")
    return KERNEL_MODES[name]


def resolve_kernel_mode(mode: KernelMode, place: Place, op_ranges_available: bool) -> KernelMode:
    """The mode that records for ``mode`` at ``place``: the first of its choices there whose needs are met
    (``op_ranges_available``: the NVTX log library is, or can be, loaded in the recording process). InputError, with
    the mode's refusal, when none is."""
    for name in mode.choices.get(place, ()):
        chosen = KERNEL_MODES[name]
        if not chosen.op_ranges or op_ranges_available:
            return chosen
    where = {"cpu": "the CPU", "other-gpu": "a GPU other than NVIDIA's", "nvidia-gpu": "an NVIDIA GPU"}[place]
    raise InputError(f"{mode.refusal or f'--kernels {mode.name} cannot record'} (this run is on {where})")
