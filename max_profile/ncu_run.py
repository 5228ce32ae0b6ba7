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
from dataclasses import dataclass, field
from pathlib import Path

from max_profile.analyze.families import distinctive_regex
from max_profile.collect.probes.environment import detect_environment, require_tool
from max_profile.collect.readers.ncu import (
    NO_KERNELS,
    PERMISSION_ERRORS,
    PERMISSION_FIX,
    export_ncu_pages,
    fill_ncu_pages,
)
from max_profile.errors import CaptureError, InputError
from max_profile.model import Capture, KernelBreakdown, RawCapture, Workload, load_saved
from max_profile.util.models import check_model_folder
from max_profile.util.procs import clean_child_env, die_with_parent, kill_group

MAX_LAUNCHES = 20


def name_filter(name: str) -> str:
    """``-k`` value for a kernel name or regex: a breakdown name keeps its distinctive base, never its hash."""
    if name.startswith("regex:"):
        name = name[6:]
    if not name or name.strip() in (".*", ".", "*", ".+"):
        raise InputError(
            "refusing to profile every kernel: give a kernel name or a regex that selects one kernel (ncu replays each "
            "launch many times)"
        )
    if re.fullmatch(r"[\w.]+", name):
        return "regex:" + distinctive_regex(name)
    try:
        re.compile(name)
    except re.error as exc:
        raise InputError(f"kernel regex {name!r} is not a valid regular expression ({exc})") from exc
    return "regex:" + name


def ncu_command(
    ncu: str, name: str, launches: int, launch_skip: int, section_set: str, report: str, target: list[str]
) -> list[str]:
    if not 1 <= launches <= MAX_LAUNCHES:
        raise InputError(f"--launches must be between 1 and {MAX_LAUNCHES} (each launch is replayed dozens of times)")
    if launch_skip < 0:
        raise InputError("--launch-skip must be >= 0")
    return [
        ncu,
        "--target-processes",
        "all",
        "--clock-control",
        "none",
        "-k",
        name_filter(name),
        "--launch-skip",
        str(launch_skip),
        "-c",
        str(launches),
        "--set",
        section_set,
        "-o",
        report,
        "-f",
        *target,
    ]


def run_ncu(cmd: list[str], log_path: Path, timeout_s: float, progress: Callable[[str], None]) -> tuple[int, str]:
    """(ncu's exit code, its log: ncu's own ``==PROF==`` / ``==ERROR==`` lines and the application's output)."""
    progress("running: " + " ".join(cmd))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=clean_child_env(),
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        t0 = time.monotonic()
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout_s:
                    kill_group(proc, grace_s=10)
                    raise CaptureError(
                        f"ncu did not finish within {timeout_s:.0f} s; stopped it (its process group only). "
                        "Profile fewer launches (-c) or a narrower regex"
                    )
                time.sleep(1)
        except BaseException:
            kill_group(proc, grace_s=10)
            raise
    return int(proc.returncode), log_path.read_text(errors="replace")


_APP_ERROR = re.compile(r"==ERROR== The application returned an error code \((-?\d+)\)")
_SIGNALS = {6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 7: "SIGBUS", 4: "SIGILL", 8: "SIGFPE"}
_APP_CRASH_LINE = re.compile(
    r"(malloc\(\)|free\(\)|double free|corrupted|Segmentation fault|core dumped|Aborted|"
    r"Traceback \(most recent call last\)|Error:|error:|CUDA_ERROR|terminate called|Fatal|FATAL|ABORT)"
)


@dataclass(frozen=True)
class NcuOutcome:
    """What an ncu run's log says happened: the application's exit code under ncu, ncu's own errors,
    whether it matched no launch, and the application's last output lines."""

    app_exit_code: int | None
    ncu_errors: list[str]
    no_kernels: bool
    app_tail: list[str]

    @property
    def app_crashed(self) -> bool:
        return self.app_exit_code not in (None, 0)


def read_ncu_log(text: str, tail: int = 6) -> NcuOutcome:
    """Parse an ncu log. ``==ERROR== The application returned an error code (N)`` means the profiled program
    itself failed under ncu (N = its exit code; a signal number when it crashed: 6 abort, 11 segfault)."""
    codes = [int(m.group(1)) for m in _APP_ERROR.finditer(text)]
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    ncu_errors = [ln[:300] for ln in lines if ln.startswith("==ERROR==") and not _APP_ERROR.search(ln)]
    app_lines = [ln[:300] for ln in lines if not ln.startswith("==")]
    # the lines that explain a crash (allocator aborts, tracebacks, MAX errors), else simply the last ones
    telling = [ln for ln in app_lines if _APP_CRASH_LINE.search(ln)]
    return NcuOutcome(
        app_exit_code=codes[-1] if codes else None,
        ncu_errors=ncu_errors,
        no_kernels=NO_KERNELS in text,
        app_tail=(telling or app_lines)[-tail:],
    )


def crash_message(outcome: NcuOutcome, ncu_exit: int, graphs: bool | None) -> str:
    """One line for a profiled program that died under ncu: its exit code (a signal named), its last lines, and what to
    try."""
    code = outcome.app_exit_code
    if code in _SIGNALS:
        msg = (
            f"the profiled generation crashed under ncu (the application returned error code {code}: "
            f"{_SIGNALS[code]}; ncu exit {ncu_exit})"
        )
    else:
        msg = (
            f"the profiled generation failed under ncu (the application returned error code {code}; ncu exit "
            f"{ncu_exit})"
        )
    if outcome.app_tail:
        msg += ": " + " | ".join(outcome.app_tail)
    if outcome.ncu_errors:
        msg += "; ncu: " + " | ".join(outcome.ncu_errors[-2:])
    if graphs:
        msg += (
            ". The child ran with device graphs on (--device-graph-capture): MAX 26.7 captured its graphs under ncu "
            "and crashed on the H200 that way; leave the flag out (device graphs off under ncu, the default)"
        )
    else:
        msg += (
            ". Re-run it without ncu (`max-profile run --model-path P --kernels off`) to see whether the program "
            "fails on its own"
        )
    return msg


GRAPHS_OFF_UNDER_NCU_NOTE = (
    "the profiled generation ran with device graphs off: ncu replays each launch on its own, and MAX 26.7 capturing "
    "its device graphs under ncu crashed the process on the H200 (malloc abort / segfault); the kernels are the same "
    "code, launched eagerly (--device-graph-capture forces graphs on)"
)


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
    batch_size: int = 1
    custom_architectures: list[str] = field(default_factory=list)
    device_graph_capture: bool = False
    """Device graphs in the profiled child: off unless forced (see GRAPHS_OFF_UNDER_NCU_NOTE)."""
    prompt: str = "I believe the meaning of life is"
    max_length: int | None = None
    quantization_encoding: str | None = None


class NcuTool:
    """``ncu`` around the profiled generation (a :class:`~max_profile.collect.live.recorders.ProcessTool`): its command
    line, and after the process ended its report exported (``--page details`` / ``raw``) and read into the capture."""

    def __init__(self, ncu: str, run: KernelRun, report_base: str, work: Path) -> None:
        self.ncu, self.run, self.report_base, self.work = ncu, run, report_base, work
        self.report = report_base + ".ncu-rep"
        self.pages: dict[str, str] = {}

    def command(self, cmd: list[str]) -> list[str]:
        r = self.run
        return ncu_command(self.ncu, r.name, r.launches, r.launch_skip, r.section_set, self.report_base, cmd)

    def env(self) -> dict[str, str]:
        return {}

    def read_after_teardown(self, raw: RawCapture, span: tuple[int, int]) -> None:
        self.pages = export_ncu_pages(self.ncu, self.report, str(self.work))
        fill_ncu_pages(raw, self.pages["details"], self.pages["raw"])

    def close(self) -> None:
        return None

    def artifacts(self) -> list[str]:
        return [f"{self.report}  (open with: ncu-ui {self.report})", *self.pages.values()]


def profile_kernel(run: KernelRun, progress: Callable[[str], None]) -> RawCapture:
    """Run ncu on a short generation and return its launches as a :class:`RawCapture`."""
    name_filter(run.name)
    ncu = require_tool("ncu", "`max-profile kernel` (Nsight Compute)")
    check_model_folder(run.model_path)
    work = Path(run.output_dir or tempfile.mkdtemp(prefix="max-profile-ncu-"))
    work.mkdir(parents=True, exist_ok=True)
    report_base = str(work / "kernel")
    started = time.time()
    target = [
        sys.executable,
        "-m",
        "max_profile",
        "-q",
        "run",
        "--model-path",
        run.model_path,
        "--devices",
        run.devices,
        "--max-new-tokens",
        str(run.max_new_tokens),
        "--warmup",
        "0",
        "--kernels",
        "off",
        "--batch-size",
        str(run.batch_size),
        "--device-graph-capture" if run.device_graph_capture else "--no-device-graph-capture",
    ]
    for spec in run.custom_architectures:
        target += ["--custom-architectures", spec]
    target += ["--prompt", run.prompt]
    if run.max_length is not None:
        target += ["--max-length", str(run.max_length)]
    if run.quantization_encoding:
        target += ["--quantization-encoding", run.quantization_encoding]
    tool = NcuTool(ncu, run, report_base, work)
    ncu_exit, out = run_ncu(tool.command(target), work / "ncu.log", run.timeout_s, progress)
    if any(e in out for e in PERMISSION_ERRORS):
        raise CaptureError(PERMISSION_FIX)
    outcome = read_ncu_log(out)
    have_report = os.path.exists(tool.report)
    if outcome.app_crashed and not have_report:
        raise CaptureError(crash_message(outcome, ncu_exit, run.device_graph_capture))
    if not have_report:
        if outcome.no_kernels:
            raise CaptureError(no_kernels_message(run.name, run.suggest_from))
        why = " | ".join(outcome.ncu_errors[-2:] or outcome.app_tail[-3:]) or "no output"
        raise CaptureError(f"ncu wrote no report (ncu exit {ncu_exit}): {why}; its log: {work / 'ncu.log'}")
    raw = RawCapture(
        environment=detect_environment(check_tools=False),
        capture=Capture(
            started_unix_s=started,
            target=f"ncu:{run.name}",
            model_path=run.model_path,
            devices=run.devices,
            device_graph_capture=bool(run.device_graph_capture),
            workload=Workload(
                batch_size=run.batch_size,
                prompt=run.prompt,
                max_new_tokens=run.max_new_tokens,
                max_length=run.max_length,
                quantization_encoding=run.quantization_encoding,
                custom_architectures=list(run.custom_architectures),
            ),
        ),
    )
    tool.read_after_teardown(raw, (0, 0))
    raw.artifacts = tool.artifacts()
    if not run.device_graph_capture:
        raw.notes.append(GRAPHS_OFF_UNDER_NCU_NOTE)
    if outcome.app_crashed:
        raw.notes.append(
            crash_message(outcome, ncu_exit, run.device_graph_capture) + " — after the launches above were profiled"
        )
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
        msg += (
            "; take a name from `max-profile kernels` (its top-kernels table), or widen the regex; --launch-skip "
            "may skip past all launches"
        )
    return msg
