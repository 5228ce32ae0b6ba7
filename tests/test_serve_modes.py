"""Serve modes as a registry (issue 33): each mode's recorder, plan lines and needs come from its entry, and no code
outside the registry branches on a mode's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from max_profile.collect.probes.environment import detect_environment
from max_profile.errors import InputError
from max_profile.serve import SERVE_MODES, ModeContext, ServePlan, check_plan, serve_mode

from .conftest import REPO


def plan(mode: str, model: Path, **kw: object) -> ServePlan:
    ports: dict[str, object] = {"port": 1, "metrics_port": 2, **kw}
    return ServePlan(model_path=str(model), devices="cpu", mode=mode, duration_s=1.0, **ports)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(SERVE_MODES))
def test_each_mode_builds_its_own_recorder_and_says_its_plan(name: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    p = plan(name, tiny_model_dir, vendor="nvidia")
    # the profiler binary: /bin/true stands in for nsys / rocprofv3 (the recorder only asks nsys for stale sessions
    # here)
    ctx = ModeContext(
        detect_environment(check_tools=False), tmp_path, "/bin/true", 60.0, lambda line: None, str(tmp_path / "art")
    )
    recorder, _ = p.spec.make_recorder(p, ctx)
    assert recorder.mode == name
    assert recorder.reads_after_teardown == (name in ("nsys", "rocprof"))
    described = p.describe(width=400)
    for line in p.spec.plan_lines(p):
        assert line in described
    assert ("--no-device-graph-capture" in p.serve_command()) is False  # NVIDIA keeps graphs: its tracers see into them
    other = plan(name, tiny_model_dir, vendor="amd")
    assert ("--no-device-graph-capture" in other.serve_command()) == SERVE_MODES[name].records_kernels


def test_sweeps_only_where_the_mode_records_several_windows(tiny_model_dir: Path) -> None:
    for name, mode in SERVE_MODES.items():
        from max_profile.serve import free_port

        p = plan(name, tiny_model_dir, concurrency=[1, 4], port=free_port(), metrics_port=free_port())
        if mode.sweeps:
            check_plan(p)
        else:
            with pytest.raises(InputError, match="one window per server: sweep with --mode utilization or kernels"):
                check_plan(p)
    with pytest.raises(InputError, match="unknown --mode 'gpu': use utilization or kernels or nsys or rocprof"):
        serve_mode("gpu")


def test_no_code_outside_the_registry_branches_on_a_serve_mode_name() -> None:
    names = "|".join(SERVE_MODES)
    branch = re.compile(rf"""mode\s*(==|!=|\bin\b|\bnot in\b)\s*[(\[{{]?[^\n]*["']({names})["']""")
    found = []
    for path in sorted((REPO / "max_profile").rglob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if branch.search(line) and "kernel_mode" not in line and "profiling_mode" not in line:
                found.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()}")
    assert not found, found
