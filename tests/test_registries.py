"""Modes and sources as data: no code outside its registry branches on a kernel mode's or a serve mode's name, or
compares a source / collector tag as text (each has a typed tag in ``max_profile.model.tags``)."""

from __future__ import annotations

import re

import pytest

from max_profile.errors import InputError
from max_profile.model.kernel_modes import (
    BACKENDS,
    IN_PROCESS_MODES,
    KERNEL_MODES,
    kernel_mode,
    place_of,
    resolve_kernel_mode,
)
from max_profile.model.tags import (
    Collector,
    KernelOrigin,
    LedgerSource,
    StartupSource,
    StepSource,
    TargetKind,
    host_ops,
    traced_inside,
)
from max_profile.serve import SERVE_MODES

from .conftest import REPO

REGISTRIES = {"max_profile/model/tags.py", "max_profile/model/kernel_modes.py"}
SOURCE_SUBJECTS = r"(\w*source|collectors?|tool|target)"
"""What holds a source, collector or target tag (``k.source``, ``step_source``, ``capture.collectors``, ``tool``)."""
MODE_SUBJECTS = r"(kernels|kernel_mode|backend|mode)"
"""What holds a kernel mode's name (``plan.kernels``, ``args.backend``...)."""
SOURCE_TAGS = [
    t.value for enum in (KernelOrigin, LedgerSource, StepSource, Collector, TargetKind, StartupSource) for t in enum
] + ["serve:"]


def comparison(subjects: str, tags: list[str]) -> re.Pattern[str]:
    """A line that compares one of ``subjects`` with a string literal that is (or starts with) one of ``tags``."""
    names = "|".join(re.escape(t) for t in sorted(tags, key=len, reverse=True))
    return re.compile(
        rf"""\b{subjects}\b\)?\s*(==|!=|\bis\b|\bis not\b|\bin\b|\bnot in\b)\s*[^\n#]*?["']({names})["'\s:(]"""
        rf"""|\b{subjects}\b\)?\.(startswith|endswith|removeprefix)\(\s*["']({names})"""
        rf"""|["']({names})["']\s*(\bin\b|\bnot in\b)\s*[\w.]*\b{subjects}\b"""
    )


def _scan(pattern: re.Pattern[str], skip: tuple[str, ...] = ()) -> list[str]:
    found = []
    for path in sorted((REPO / "max_profile").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel in REGISTRIES:
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code) and not any(s in code for s in skip):
                found.append(f"{rel}:{lineno}: {line.strip()}")
    return found


def test_no_code_outside_a_registry_compares_a_source_collector_or_target_tag() -> None:
    found = _scan(comparison(SOURCE_SUBJECTS, SOURCE_TAGS))
    assert not found, found


def test_no_code_outside_the_registry_branches_on_a_kernel_mode_name() -> None:
    # MAX's profiling mode (--profiling-mode auto / off) is another setting, with names of its own
    found = _scan(comparison(MODE_SUBJECTS, list(KERNEL_MODES)), skip=("profiling", "PROFILING"))
    assert not found, found


def test_no_code_outside_the_registry_branches_on_a_serve_mode_name() -> None:
    names = "|".join(SERVE_MODES)
    branch = re.compile(rf"""mode\s*(==|!=|\bin\b|\bnot in\b)\s*[(\[{{]?[^\n]*["']({names})["']""")
    found = []
    for path in sorted((REPO / "max_profile").rglob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if branch.search(line) and "kernel_mode" not in line and "profiling_mode" not in line:
                found.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()}")
    assert not found, found


def test_the_scan_finds_the_comparisons_it_is_meant_to_refuse() -> None:
    """The guard's patterns catch the shapes of comparison they exist for (a guard that matches nothing passes
    forever), and leave alone a tag used as a value."""
    sources, modes = comparison(SOURCE_SUBJECTS, SOURCE_TAGS), comparison(MODE_SUBJECTS, list(KERNEL_MODES))
    for line in (
        'if k.source.startswith("nvtx-log"):',
        'on_gpu = lg.source == "kernel timeline" and not ops',
        'if tool in ("attach", "serve:utilization"):',
        'if tool.startswith("serve:"):',
        'startups = a.capture.target == b.capture.target == "startup"',
        'if "pipeline-hook" not in collectors:',
    ):
        assert sources.search(line), line
    for line in (
        'if kernels == "cupti" and devices != "cpu":',
        'if plan.kernels in ("cupti", "nvtx-log", "ops") and raw.kernels_unavailable:',
        'share = owner.kernel_share if owner.kernel_mode == "cupti" else 1.0',
        'if args.backend == "nsys":',
    ):
        assert modes.search(line), line
    for line in (
        'unit = "ops" if ops else "kernels"',
        'return {"ops": names}',
        "x = KernelOrigin.CUPTI",
        'raw.kernel_source = KernelOrigin.OP_RANGES.describe("model worker ops")',
        'if mode.runner == "nsys":',
    ):
        assert not sources.search(line) and not modes.search(line), line


@pytest.mark.parametrize(
    ("name", "vendor", "devices", "op_ranges", "expected"),
    [
        ("auto", "nvidia", "gpu", False, "cupti"),
        ("auto", "nvidia", "cpu", True, "nvtx-log"),  # a GPU machine running on its CPU: no CUPTI kernels there
        ("auto", "nvidia", "cpu", False, "off"),
        ("auto", "amd", "gpu", False, "off"),
        ("auto", "amd", "gpu", True, "nvtx-log"),
        ("auto", "none", "cpu", True, "nvtx-log"),
        ("ops", "nvidia", "gpu", True, "ops"),
        ("ops", "amd", "gpu", True, "nvtx-log"),
        ("ops", "none", "cpu", True, "nvtx-log"),
        ("nvtx-log", "nvidia", "gpu", True, "nvtx-log"),
        ("cupti", "nvidia", "gpu", False, "cupti"),
        ("off", "amd", "gpu", True, "off"),
    ],
)
def test_each_mode_resolves_per_vendor_and_device(
    name: str, vendor: str, devices: str, op_ranges: bool, expected: str
) -> None:
    assert resolve_kernel_mode(kernel_mode(name), place_of(vendor, devices), op_ranges).name == expected


@pytest.mark.parametrize(
    ("name", "vendor", "devices", "op_ranges", "says"),
    [
        ("cupti", "amd", "gpu", True, "records NVIDIA GPU kernels"),
        ("cupti", "nvidia", "cpu", True, "records NVIDIA GPU kernels"),
        ("nvtx-log", "none", "cpu", False, "NVTX log library"),
        ("ops", "nvidia", "gpu", False, "NVTX log library"),
    ],
)
def test_a_mode_that_cannot_record_here_is_refused_with_why(
    name: str, vendor: str, devices: str, op_ranges: bool, says: str
) -> None:
    with pytest.raises(InputError, match=says):
        resolve_kernel_mode(kernel_mode(name), place_of(vendor, devices), op_ranges)


def test_the_registry_says_what_each_mode_records_and_needs() -> None:
    assert set(IN_PROCESS_MODES) == {"off", "cupti", "nvtx-log", "ops", "auto"}
    assert set(BACKENDS) == {"cupti", "nvtx-log", "ops", "nsys", "rocprof"}
    for mode in KERNEL_MODES.values():
        assert mode.records, mode.name
        # a mode with op ranges turns device graphs off on a GPU (a replay has no op ranges); the others keep them
        assert mode.graphs_off_on_gpu == mode.op_ranges
        # a recorder's tag is among the capture's collectors exactly when it records kernels here
        assert (mode.collector is not None) == (mode.cupti or mode.op_ranges)
    assert KERNEL_MODES["cupti"].sampled and not KERNEL_MODES["ops"].sampled  # ops: every op's kernels
    with pytest.raises(InputError, match="use one of off, cupti, nvtx-log, ops, auto"):
        kernel_mode("nsys")  # a backend of `kernels`, not a mode of profile()
    assert kernel_mode(True).name == "cupti" and kernel_mode(False).name == "off"


def test_source_tags_parse_every_description_the_collectors_write() -> None:
    assert KernelOrigin.of("nsys stats cuda_gpu_trace") is KernelOrigin.NSYS_STATS  # the longer tag first
    assert KernelOrigin.of("nsys (max serve)") is KernelOrigin.NSYS
    assert KernelOrigin.of(KernelOrigin.CUPTI.describe("model worker, 1/16 of steps")) is KernelOrigin.CUPTI
    assert host_ops("nvtx-log (MAX op ranges, host time)") and not host_ops("cupti") and not host_ops(None)
    assert KernelOrigin.of("something else") is None
    assert not traced_inside("attach") and not traced_inside("serve:utilization")
    assert traced_inside("serve:kernels") and traced_inside("nsys")
