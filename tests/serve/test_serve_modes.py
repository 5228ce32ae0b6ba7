"""Serve modes as a registry: each mode's recorder, plan lines and needs come from its entry, and no code
outside the registry branches on a mode's name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from max_profile.collect.probes.environment import detect_environment
from max_profile.errors import InputError
from max_profile.serve import SERVE_MODES, ModeContext, ServePlan, check_plan, resolve_plan, serve_mode
from max_profile.serve.modes import serve_command, warm_command


def plan(mode: str, model: Path, **kw: object) -> ServePlan:
    ports: dict[str, object] = {"port": 1, "metrics_port": 2, **kw}
    return ServePlan(model_path=str(model), devices="cpu", mode=mode, duration_s=1.0, **ports)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(SERVE_MODES))
def test_each_mode_builds_its_own_recorder_and_says_its_plan(name: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    # the profiler binary: /bin/true stands in for nsys / rocprofv3 (the recorder only asks nsys for stale sessions
    # here)
    r = dataclasses.replace(resolve_plan(plan(name, tiny_model_dir, vendor="nvidia"), "nvidia", check_tool=False))
    r = dataclasses.replace(r, tool="/bin/true")
    ctx = ModeContext(detect_environment(check_tools=False), tmp_path, 60.0, lambda line: None, str(tmp_path / "art"))
    recorder, _ = r.mode.make_recorder(r, ctx)
    assert recorder.mode == name
    assert recorder.reads_after_teardown == (name in ("nsys", "rocprof"))
    described = r.describe(width=400)
    for line in r.mode.plan_lines(r):
        assert line in described
    # NVIDIA keeps graphs (its tracers see into them), unless the mode records MAX's op ranges (ops launched eagerly)
    assert ("--no-device-graph-capture" in r.serve_command) == SERVE_MODES[name].op_ranges
    assert r.device_graphs is (False if SERVE_MODES[name].op_ranges else None)
    other = resolve_plan(plan(name, tiny_model_dir, vendor="amd"), "amd", check_tool=False)
    assert ("--no-device-graph-capture" in other.serve_command) == SERVE_MODES[name].records_kernels


def test_sweeps_only_where_the_mode_records_several_windows(tiny_model_dir: Path) -> None:
    for name, mode in SERVE_MODES.items():
        from ..ports import free_port

        p = plan(name, tiny_model_dir, concurrency=[1, 4], port=free_port(), metrics_port=free_port())
        if mode.sweeps:
            check_plan(p)
        else:
            with pytest.raises(InputError, match="one window per server: sweep with --mode utilization or kernels"):
                check_plan(p)
    with pytest.raises(InputError, match="unknown --mode 'gpu': use utilization or kernels or ops or nsys or rocprof"):
        serve_mode("gpu")


def test_ops_mode_needs_maxs_op_ranges_before_anything_starts(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve --mode ops``: MAX's profiling mode must be on (its op ranges); asked off, or on a GPU where MAX cannot
    run it (CUDA 13 without CUDA 12's NVTX v2 library), the plan is refused with the fix, before the server or the
    load."""
    from max_profile.errors import ToolMissingError

    from ..ports import free_port

    ports = {"port": free_port(), "metrics_port": free_port()}
    check_plan(plan("ops", tiny_model_dir, **ports))  # a CPU: MAX's op ranges always work
    with pytest.raises(InputError, match="--mode ops records MAX's op ranges: leave --profiling-mode auto"):
        check_plan(plan("ops", tiny_model_dir, profiling_mode="off", **ports))
    with pytest.raises(InputError, match="--mode ops records one window per server"):
        check_plan(plan("ops", tiny_model_dir, concurrency=[1, 4], **ports))
    described = resolve_plan(plan("ops", tiny_model_dir, vendor="nvidia"), "nvidia").describe(width=400)
    assert (
        "MAX's op ranges (MODULAR_ENABLE_PROFILING=on, device graphs off: every op launched eagerly), joined to the "
        in described
    )
    assert "--no-device-graph-capture" in described
    monkeypatch.setattr(
        "max_profile.collect.live.nvtx_log.max_profiling_usable", lambda devices: False
    )  # CUDA 13, no NVTX v2
    gpu = ServePlan(model_path=str(tiny_model_dir), devices="gpu", mode="ops", duration_s=1.0, **ports)  # type: ignore[arg-type]
    with pytest.raises(
        ToolMissingError, match=r"--mode ops on gpu: MAX 26.7 on a GPU .* fix: pip install 'nvidia-nvtx-cu12"
    ):
        check_plan(gpu)
    check_plan(ServePlan(model_path=str(tiny_model_dir), devices="gpu", mode="kernels", duration_s=1.0, **ports))  # type: ignore[arg-type]


def test_relative_model_and_package_paths_reach_the_server_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server runs in a folder of its own: `--custom-architectures custom_archs/llama_custom` from the repository
    root failed there with MAX's "No module named 'llama_custom'" (seen on the CPU). Local paths go to the
    server absolute; a hub id and a folder that is not here go as given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "archs" / "pkg").mkdir(parents=True)
    plan = ServePlan(
        model_path="model",
        devices="cpu",
        mode="utilization",
        duration_s=1.0,
        port=1,
        metrics_port=2,
        custom_architectures=["archs/pkg", "archs:pkg", "elsewhere/pkg"],
    )
    for cmd in (serve_command(plan, SERVE_MODES["utilization"]), warm_command(plan)):
        assert cmd[cmd.index("--model-path") + 1] == str(tmp_path / "model")
        archs = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--custom-architectures"]
        assert archs == [str(tmp_path / "archs" / "pkg"), f"{tmp_path / 'archs'}:pkg", "elsewhere/pkg"]
    hub = ServePlan(model_path="org/model", devices="cpu", mode="utilization", duration_s=1.0, port=1, metrics_port=2)
    hub_cmd = serve_command(hub, SERVE_MODES["utilization"])
    assert hub_cmd[hub_cmd.index("--model-path") + 1] == "org/model"
