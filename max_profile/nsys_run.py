"""``max-profile kernels --backend nsys``: a generation under ``nsys profile``, warm-up outside the capture.

The child loads the model, warms up, then runs the profiled generation inside MAX's own
``cuProfilerStart/Stop`` bracket (``--capture-range=cudaProfilerApi``) with ``profile()`` marking
each step in the ``max_profile`` NVTX domain. The result is one :class:`RawCapture`: the child's
host steps plus the export's kernels and ranges (trace clock); ``build_report`` lines the host
steps up with the ranges.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from max_profile.collect.live.recorders import CudaProfilerRangeRecorder
from max_profile.collect.probes.environment import require_tool
from max_profile.collect.readers.nsys import merge_trace, read_nsys_sqlite
from max_profile.errors import CaptureError
from max_profile.model import RawCapture
from max_profile.model.tags import Collector, KernelOrigin
from max_profile.runner import generate, load_model
from max_profile.session import profile
from max_profile.util.models import check_model_folder
from max_profile.util.procs import clean_child_env, die_with_parent, kill_group

NSYS_CHILD = """
import os, sys, json
sys.path[:0] = json.loads(os.environ['MAX_PROFILE_SYSPATH'])
from max_profile.nsys_run import child_main
child_main()
"""


@dataclass
class NsysRun:
    model_path: str
    devices: str = "gpu"
    batch_size: int = 1
    prompt: str = "I believe the meaning of life is"
    warmup: int = 4
    max_new_tokens: int = 64
    custom_architectures: list[str] = field(default_factory=list)
    device_graph_capture: bool | None = None
    """None: MAX decides (as ``max generate``)."""


def child_main() -> None:
    """Runs inside ``nsys profile --capture-range=cudaProfilerApi``: load, warm up, capture the generation (the
    capture range opened and closed by a :class:`CudaProfilerRangeRecorder` among the profiler's recorders)."""
    spec = json.loads(os.environ["MAX_PROFILE_NSYS_SPEC"])
    model = load_model(
        spec["model_path"],
        devices=spec["devices"],
        max_batch_size=spec["batch"],
        custom_architectures=spec["custom"],
        device_graph_capture=spec.get("graphs"),
    )
    prompts = [spec["prompt"]] * spec["batch"]
    generate(model, prompts, spec["warmup"])
    # MAX's own cuProfilerStart/Stop bracketing: the capture range starts after the warm-up
    with profile(
        model.pipeline,
        kernels="off",
        gpu_sampling=False,
        model_path=spec["model_path"],
        devices=spec["devices"],
        recorders=[CudaProfilerRangeRecorder()],
    ) as prof:
        generate(model, prompts, spec["tokens"])
    prof.raw_capture.save(spec["steps_out"])
    model.close()


class NsysProfileTool:
    """``nsys profile`` around the generation's process (a :class:`~max_profile.collect.live.recorders.ProcessTool`):
    its SQLite export read back into the process's own raw capture after it ended."""

    def __init__(self, nsys: str, report_base: str) -> None:
        self.nsys, self.report_base = nsys, report_base
        self.sqlite_path = report_base + ".sqlite"

    def command(self, cmd: list[str]) -> list[str]:
        return nsys_profile_command(self.nsys, self.report_base) + cmd

    def env(self) -> dict[str, str]:
        return {}

    def read_after_teardown(self, raw: RawCapture, span: tuple[int, int]) -> None:
        if not os.path.exists(self.sqlite_path):
            raise CaptureError(f"nsys profile wrote no {self.sqlite_path}")
        merge_trace(raw, read_nsys_sqlite(self.sqlite_path), KernelOrigin.NSYS.describe(), self.sqlite_path)
        raw.capture.collectors = [*raw.capture.collectors, Collector.NSYS]

    def close(self) -> None:
        return None

    def artifacts(self) -> list[str]:
        rep = self.report_base + ".nsys-rep"
        return [f"{rep}  (open with: nsys-ui {rep})", self.sqlite_path]


def nsys_profile_command(nsys: str, output: str) -> list[str]:
    """The nsys command line (argument list; never a shell string)."""
    return [
        nsys,
        "profile",
        "--trace=cuda,nvtx",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        "--cuda-graph-trace=node",
        "--force-overwrite=true",
        "--export=sqlite",
        "-o",
        output,
    ]


def profile_generation_with_nsys(run: NsysRun, progress: Callable[[str], None]) -> RawCapture:
    check_model_folder(run.model_path)
    nsys = require_tool("nsys", "--backend nsys")
    out_dir = Path(tempfile.mkdtemp(prefix="max-profile-nsys-"))
    rep = str(out_dir / "capture")
    steps_out = str(out_dir / "host_raw.json")
    spec = {
        "model_path": run.model_path,
        "devices": run.devices,
        "batch": run.batch_size,
        "custom": run.custom_architectures,
        "graphs": run.device_graph_capture,
        "prompt": run.prompt,
        "warmup": max(run.warmup, 1),
        "tokens": run.max_new_tokens,
        "steps_out": steps_out,
    }
    tool = NsysProfileTool(nsys, rep)
    env = clean_child_env(
        {"MAX_PROFILE_NSYS_SPEC": json.dumps(spec), "MAX_PROFILE_SYSPATH": json.dumps(sys.path), **tool.env()}
    )
    cmd = tool.command([sys.executable, "-c", NSYS_CHILD])
    progress("running: " + " ".join(cmd[:-2]) + " python <generation>")
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=die_with_parent())
    try:
        rc = proc.wait()
    except BaseException:
        kill_group(proc)
        raise
    finally:
        tool.close()
    if rc != 0:
        raise CaptureError(f"nsys profile failed (exit {rc}); no {tool.sqlite_path} was read")
    raw = RawCapture.load(steps_out)
    steps = [s for s in raw.steps if s.batch_size > 0]
    span = (min(s.start_ns for s in steps), max(s.end_ns for s in steps)) if steps else (0, 0)
    tool.read_after_teardown(raw, span)
    raw.artifacts = tool.artifacts()
    return raw
