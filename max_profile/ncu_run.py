"""``max-profile kernel NAME``: one targeted Nsight Compute run on a short generation, read back as a RawCapture.

Runs ``ncu --target-processes all --clock-control none -k regex:NAME --launch-skip K -c N --set full -o R
<generation>`` (never without a name filter and a launch cap: ncu replays each launch dozens of
times), then ``ncu --import R.ncu-rep --csv --page details|raw --print-units base``.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from max_profile.analyze.families import distinctive_regex
from max_profile.collect.environment import detect_environment, require_tool
from max_profile.collect.gpu_sampling import clean_child_env
from max_profile.collect.ncu import NO_KERNELS, PERMISSION_ERRORS, PERMISSION_FIX, export_ncu_pages, ncu_capture
from max_profile.errors import CaptureError, InputError
from max_profile.model import KernelBreakdown, RawCapture, load_saved
from max_profile.util.models import check_model_folder
from max_profile.util.procs import kill_group

MAX_LAUNCHES = 20


def name_filter(name: str) -> str:
    """``-k`` value for a kernel name or regex: a breakdown name keeps its distinctive base, never its hash."""
    if name.startswith("regex:"):
        name = name[6:]
    if not name or name.strip() in (".*", ".", "*", ".+"):
        raise InputError("refusing to profile every kernel: give a kernel name or a regex that selects one kernel (ncu replays each launch many times)")
    if re.fullmatch(r"[\w.]+", name):
        return "regex:" + distinctive_regex(name)
    try:
        re.compile(name)
    except re.error as exc:
        raise InputError(f"kernel regex {name!r} is not a valid regular expression ({exc})") from exc
    return "regex:" + name


def ncu_command(ncu: str, name: str, launches: int, launch_skip: int, section_set: str, report: str, target: list[str]) -> list[str]:
    if not 1 <= launches <= MAX_LAUNCHES:
        raise InputError(f"--launches must be between 1 and {MAX_LAUNCHES} (each launch is replayed dozens of times)")
    if launch_skip < 0:
        raise InputError("--launch-skip must be >= 0")
    return [ncu, "--target-processes", "all", "--clock-control", "none", "-k", name_filter(name), "--launch-skip", str(launch_skip),
            "-c", str(launches), "--set", section_set, "-o", report, "-f", *target]


def run_ncu(cmd: list[str], log_path: Path, timeout_s: float, progress: Callable[[str], None]) -> str:
    progress("running: " + " ".join(cmd))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=clean_child_env(), start_new_session=True)
        t0 = time.monotonic()
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout_s:
                    kill_group(proc, grace_s=10)
                    raise CaptureError(f"ncu did not finish within {timeout_s:.0f} s; stopped it (its process group only). "
                                       "Profile fewer launches (-c) or a narrower regex")
                time.sleep(1)
        except BaseException:
            kill_group(proc, grace_s=10)
            raise
    return log_path.read_text(errors="replace")


@dataclass
class KernelRun:
    name: str
    model_path: str
    devices: str = "gpu"
    launches: int = 3
    launch_skip: int = 16
    section_set: str = "full"
    max_new_tokens: int = 24
    timeout_s: float = 1800.0
    output_dir: str | None = None
    suggest_from: str | None = None


def profile_kernel(run: KernelRun, progress: Callable[[str], None]) -> RawCapture:
    """Run ncu on a short generation and return its launches as a :class:`RawCapture`."""
    name_filter(run.name)
    ncu = require_tool("ncu", "`max-profile kernel` (Nsight Compute)")
    check_model_folder(run.model_path)
    work = Path(run.output_dir or tempfile.mkdtemp(prefix="max-profile-ncu-"))
    work.mkdir(parents=True, exist_ok=True)
    report_base = str(work / "kernel")
    target = [sys.executable, "-m", "max_profile", "-q", "run", "--model-path", run.model_path, "--devices", run.devices,
              "--max-new-tokens", str(run.max_new_tokens), "--warmup", "0", "--kernels", "off"]
    cmd = ncu_command(ncu, run.name, run.launches, run.launch_skip, run.section_set, report_base, target)
    out = run_ncu(cmd, work / "ncu.log", run.timeout_s, progress)
    if any(e in out for e in PERMISSION_ERRORS):
        raise CaptureError(PERMISSION_FIX)
    if NO_KERNELS in out or not os.path.exists(report_base + ".ncu-rep"):
        raise CaptureError(no_kernels_message(run.name, run.suggest_from))
    pages = export_ncu_pages(ncu, report_base + ".ncu-rep", str(work))
    raw = ncu_capture(pages["details"], pages["raw"], target=f"ncu:{run.name}")
    raw.environment = detect_environment(check_tools=False)
    raw.capture.model_path = run.model_path
    raw.capture.devices = run.devices
    raw.artifacts = [f"{report_base}.ncu-rep  (open with: ncu-ui {report_base}.ncu-rep)", pages["details"], pages["raw"]]
    return raw


def no_kernels_message(name: str, suggest_from: str | None) -> str:
    msg = f"ncu profiled no kernel: the filter {name_filter(name)!r} matched no launch"
    candidates: list[str] = []
    if suggest_from and os.path.exists(suggest_from):
        saved = load_saved(suggest_from)
        kernels = getattr(saved, "kernels", None)
        if isinstance(kernels, KernelBreakdown):
            candidates = [k.name for k in kernels.top_kernels]
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.3) if candidates else []
    if close:
        msg += "; close names from the breakdown: " + ", ".join(close)
    else:
        msg += "; take a name from `max-profile kernels` (its top-kernels table), or widen the regex; --launch-skip may skip past all launches"
    return msg
