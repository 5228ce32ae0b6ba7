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

from max_profile.collect.probes.environment import require_tool
from max_profile.collect.readers.nsys import merge_trace, read_nsys_sqlite
from max_profile.errors import CaptureError
from max_profile.model import RawCapture
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
    """Runs inside ``nsys profile --capture-range=cudaProfilerApi``: load, warm up, capture the generation."""
    from max.profiler.oneshot._cuda import cuda_profiler_region

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
    # MAX's own cuProfilerStart/Stop bracketing (pushes the context MAX opened): the capture
    # range of `nsys profile --capture-range=cudaProfilerApi` starts after the warm-up.
    with cuda_profiler_region():
        with profile(
            model.pipeline, kernels="off", gpu_sampling=False, model_path=spec["model_path"], devices=spec["devices"]
        ) as prof:
            generate(model, prompts, spec["tokens"])
    prof.raw_capture.save(spec["steps_out"])
    model.close()


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
    env = clean_child_env({"MAX_PROFILE_NSYS_SPEC": json.dumps(spec), "MAX_PROFILE_SYSPATH": json.dumps(sys.path)})
    cmd = nsys_profile_command(nsys, rep) + [sys.executable, "-c", NSYS_CHILD]
    progress("running: " + " ".join(cmd[:-2]) + " python <generation>")
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=die_with_parent())
    try:
        rc = proc.wait()
    except BaseException:
        kill_group(proc)
        raise
    sqlite_path = rep + ".sqlite"
    if rc != 0 or not os.path.exists(sqlite_path):
        raise CaptureError(f"nsys profile failed (exit {rc}); no {sqlite_path} was written")
    trace = read_nsys_sqlite(sqlite_path)
    raw = RawCapture.load(steps_out)
    merge_trace(raw, trace, "nsys", sqlite_path)
    raw.capture.collectors = [*raw.capture.collectors, "nsys"]
    raw.artifacts = [rep + ".nsys-rep  (open with: nsys-ui " + rep + ".nsys-rep)", sqlite_path]
    return raw
