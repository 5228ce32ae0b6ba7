"""Next measurements as data (:class:`~max_profile.model.Command`); how one is said (a ``max-profile`` command line,
or the Python call that does the same) is :mod:`max_profile.model.command_text`.

A next command reproduces the capture it follows: the model, devices, batch size, prompt, new tokens, custom
architectures, length and encoding, the device-graph state (where the verb takes it), and for a kernel deep dive a
launch filter that lands in the phase the finding is about (``--launch-skip`` past the launches before it).

The escalation plan (:func:`next_command`, at the end) picks the one next measurement of a report, or none when the
question is answered.
"""

from __future__ import annotations

import shlex
from pathlib import PurePath
from urllib.parse import urlsplit

import msgspec
import numpy as np

from max_profile.analyze.families import distinctive_regex
from max_profile.analyze.load import load_share
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Command, KernelBreakdown, KernelRow, Report, Workload
from max_profile.model.command_text import ArgValue, cli, say
from max_profile.model.tags import Collector, TargetKind

DEEP_DIVE_STEPS_IN = 2
"""A decode deep dive skips this many decode steps' launches first (past the first, cold steps)."""


def workload_of(report: Report) -> Workload:
    """What the capture's generation asked for: what the capture recorded, else what its steps show (batch size, prompt
    tokens and new tokens per request; a Python capture knows no more)."""
    w = report.capture.workload or Workload()
    if report.serve is not None:
        return w  # a server's steps say nothing about one generation's batch or length
    work = [s for s in report.steps if s.batch_size > 0]
    decode = [s for s in work if s.phase == "decode"]
    prefill = [s for s in work if s.phase in ("prefill", "mixed")]
    batch = w.batch_size
    if batch is None and decode:
        batch = int(np.median([s.batch_size for s in decode]))
    prompt_tokens = w.prompt_tokens
    if prompt_tokens is None and prefill:
        prompt_tokens = int(round(sum(s.input_tokens for s in prefill) / max(sum(s.batch_size for s in prefill), 1)))
    new = w.max_new_tokens
    if new is None and decode:
        # the overlap pipeline (MAX's GPU default) runs one decode step per new token; the plain one makes the first in
        # prefill
        new = len(decode) if "Overlap" in report.capture.target else len(decode) + 1
    return msgspec.structs.replace(w, batch_size=batch, prompt_tokens=prompt_tokens, max_new_tokens=new)


def _reproducing(report: Report, verb: str) -> dict[str, ArgValue]:
    """The flags of ``verb`` that reproduce the capture's generation (model, devices and workload)."""
    c = report.capture
    args: dict[str, ArgValue] = {"model_path": c.model_path} if c.model_path else {}
    if c.devices:
        args["devices"] = c.devices
    w = workload_of(report)
    if verb in ("run", "kernels", "kernel"):
        if w.batch_size and w.batch_size != 1:
            args["batch_size"] = w.batch_size
        if w.prompt:
            args["prompt"] = w.prompt
        if w.max_new_tokens:
            args["max_new_tokens"] = w.max_new_tokens
        if w.max_length:
            args["max_length"] = w.max_length
        if w.quantization_encoding:
            args["quantization_encoding"] = w.quantization_encoding
    if w.custom_architectures and verb in ("run", "kernels", "kernel", "serve"):
        args["custom_architectures"] = list(w.custom_architectures)
    if verb == "serve":
        levels = [lv.concurrency for lv in report.load_levels] or (
            [report.window_load.concurrency] if report.window_load else []
        )
        if levels and levels != [1]:
            args["concurrency"] = ",".join(map(str, levels))
        if w.max_new_tokens and w.max_new_tokens != 64:
            args["max_tokens"] = w.max_new_tokens
    if verb in ("run", "kernels") and c.device_graph_capture is not None and c.devices != "cpu":
        args["device_graph_capture"] = c.device_graph_capture
    return args


def for_model(
    report: Report, verb: str, positional: tuple[str, ...] = (), comment: str | None = None, **args: ArgValue
) -> Command:
    """A command on the report's own model, devices and workload (``args`` add to or override them). What the capture
    does not know is said in the comment, never filled with a placeholder: a trace that names no model gets no
    ``--model-path`` and a comment asking for it."""
    full = {**_reproducing(report, verb), **args}
    if verb in MODEL_VERBS and "model_path" not in full:
        ask = "add --model-path DIR: the capture does not name its model"
        comment = f"{ask}; {comment}" if comment else ask
    return Command(
        verb=verb,
        args=full,
        positional=list(positional),
        comment=comment,
        program=report.environment.programs.get("max-profile"),
    )


MODEL_VERBS = ("run", "kernels", "kernel", "serve", "startup")
"""The verbs that need ``--model-path``."""


def program(report: Report, name: str) -> str:
    """How to run ``name`` (``max``, ``pip``...) on the capture's machine: its path where the bare name would not run
    it (:attr:`Environment.programs`), else the name. A script ``pip`` installs lands beside ``pip``."""
    programs = report.environment.programs
    if name in programs:
        return shlex.quote(programs[name])
    pip = programs.get("pip")
    if pip is not None and name not in ("max-profile", "max"):
        return shlex.quote(str(PurePath(pip).with_name(name)))
    return name


METRICS_PORT = 8001
"""MAX serve's default metrics port (``attach`` scrapes ``http://HOST:8001/metrics`` unless told otherwise)."""


def attach_command(report: Report, comment: str | None = None, **args: ArgValue) -> Command | None:
    """``max-profile attach`` on the attached server again (its URL, and its metrics URL where not the default), with
    ``args``; None when the report is not an attach capture."""
    target = report.capture.target
    if TargetKind.of(target) is not TargetKind.ATTACH:
        return None
    url = target.split(":", 1)[1]
    out: dict[str, ArgValue] = {}
    metrics = report.server_metrics.url if report.server_metrics is not None else None
    host = urlsplit(url).hostname
    if metrics and metrics != f"http://{host}:{METRICS_PORT}/metrics":
        out["metrics_url"] = metrics
    serve = report.serve
    if serve is not None and serve.otlp:  # the spans' receiver again: the same view of every replica
        out["otlp"] = serve.otlp
    return Command(
        verb="attach",
        args={**out, **args},
        positional=list(serve.servers) if serve is not None and serve.servers else [url],
        comment=comment,
        program=report.environment.programs.get("max-profile"),
    )


def shell(text: str, comment: str | None = None) -> Command:
    return Command(verb="shell", args={"line": text}, comment=comment)


def _row_in(k: KernelBreakdown, name: str, phase: str | None) -> tuple[KernelRow | None, int]:
    """The kernel's row in the phase's top kernels (else the capture's), and the phase's steps."""
    p = next((x for x in k.phases if x.phase == phase), None) if phase else None
    rows = p.top_kernels if p is not None else k.top_kernels
    return next((r for r in rows if r.name == name), None), (p.steps if p is not None else 0)


def launch_skip_for(report: Report, name: str, phase: str | None) -> int | None:
    """``--launch-skip`` that lands a deep dive of ``name`` in ``phase``: the launches its name filter matched before
    the phase's first one, plus (decode) :data:`DEEP_DIVE_STEPS_IN` steps' worth; None when the breakdown cannot tell.

    A server's capture has no such order to replay (the deep dive runs a generation, not the server): there the skip is
    that of a generation of the server's decode batch, one prefill step's launches of the kernel and the steps'
    worth."""
    k = report.kernels
    if not isinstance(k, KernelBreakdown) or phase is None:
        return None
    row, steps = _row_in(k, name, phase)
    if row is None:
        return None
    per_step = row.count / steps if steps else 0.0
    into = int(per_step * min(DEEP_DIVE_STEPS_IN, max(steps - 1, 0))) if phase == "decode" else 0
    if report.serve is not None:
        pre, pre_steps = _row_in(k, name, "prefill")
        per_prefill = round(pre.count / pre_steps) if pre is not None and pre_steps else 0
        return per_prefill + into if phase == "decode" else 0
    if row.launches_before is None:
        return None
    return max(row.launches_before + into, 0)


def kernel_command(report: Report, name: str, phase: str | None = None) -> Command:
    """``max-profile kernel <distinctive regex of NAME>`` on the report's model and workload (3 launches, full set), its
    launches skipped into ``phase``; for a server, a generation at the server's median decode batch."""
    args: dict[str, ArgValue] = {"launches": 3, "set": "full"}
    skip = launch_skip_for(report, name, phase)
    if skip is not None:
        args["launch_skip"] = skip
    if report.serve is not None:
        batches = [s.batch_size for s in report.steps if s.phase == "decode" and s.batch_size > 0]
        if batches and int(np.median(batches)) > 1:
            args["batch_size"] = int(np.median(batches))
    comment = f"{phase} launches" if skip is not None and phase else None
    if report.serve is not None:
        comment = f"a generation at the server's decode batch; {comment or 'the first launches'}"
    return for_model(report, "kernel", positional=(distinctive_regex(name),), comment=comment, **args)


# ---------------------------------------------------------------------------------------------
# The next measurement (escalation plan)
# Escalation planning: the next, costlier measurement — or none, when the question is answered.
#
# 1. A correctness bug (a broken KV cache), a start-up or kernel-level capture: nothing further here.
# 2. The in-process tracer distorted the timing (tracer-overhead): utilization again without it.
# 3. Host-bound: stop — a kernel trace adds nothing until the GPU is busy (the finding names the host profile to take).
# 4. No kernel breakdown yet: the breakdown (CUPTI in-process / nsys / rocprofv3; MAX's op ranges on a CPU).
# 5. The top-ranked finding that names a measurement (the biggest lever's deep dive, reproducing the capture).
# 6. A healthy breakdown with nothing at warning size: stop. A dominant suspicious kernel: one Nsight Compute run.

_HEALTHY_IDS = {"healthy-dense-decode", "healthy-moe", "healthy-batched-decode"}


def next_measurement(report: Report, th: Thresholds | None = None) -> str | None:
    """The next measurement in the report's interface (a ``max-profile`` command line, or the Python call)."""
    cmd = next_command(report, th)
    return say(cmd, report.capture.interface) if cmd is not None else None


def next_command(report: Report, th: Thresholds | None = None) -> Command | None:
    """The next, costlier measurement as a :class:`Command` (None when the question is answered)."""
    suspicious_pct = (th or Thresholds()).plan_suspicious_share_pct
    ids = {f.id for f in report.findings}
    if report.kernel_analyses or TargetKind.of(report.capture.target) is TargetKind.STARTUP or "kv-cache-broken" in ids:
        return None
    if "tracer-overhead" in ids:
        # the timing figures were distorted by the in-process tracer: measure utilization without it first
        if report.serve is not None:
            return for_model(
                report, "serve", mode="utilization", comment="then --mode nsys for kernels with timing kept"
            )
        return for_model(report, "run", kernels="off")
    if "lightly-loaded" in ids:
        return next((f.command for f in report.findings if f.id == "lightly-loaded" and f.command is not None), None)
    if TargetKind.of(report.capture.target) is TargetKind.ATTACH and load_share(report)[0] is None:
        # the server's load over the window is not known: the same window with a few requests of ours
        return attach_command(report, comment="a few requests of ours: the window's load and latency", probe=True)
    if "host-bound" in ids:
        return None
    if Collector.OTLP in report.capture.collectors and report.serve is None and report.capture.model_path:
        # MAX's spans time the passes of a server elsewhere: its kernels, on the machine that serves it
        return for_model(
            report, "serve", mode="kernels", comment="the kernels of these passes, where the model is served"
        )
    if report.environment.vendor == "none":
        if report.kernels is None:
            return for_model(report, "run", kernels="nvtx-log", comment="MAX's op ranges on the CPU")
        named = next((f.command for f in report.findings if f.command is not None and f.command.verb == "shell"), None)
        return named
    if not isinstance(report.kernels, KernelBreakdown):
        if report.serve is not None:
            mode = (
                "nsys"
                if report.environment.vendor == "nvidia"
                else "rocprof"
                if report.environment.vendor == "amd"
                else "kernels"
            )
            return for_model(
                report,
                "serve",
                mode=mode,
                comment="the kernels of the served model (--mode kernels: in-process recorder)",
            )
        if report.environment.vendor == "amd":
            return shell(
                "rocprofv3 --kernel-trace --marker-trace --output-format csv -d rocprof-out -- "
                f"{cli(for_model(report, 'run', kernels='off'))}"
                "  &&  max-profile kernels --import rocprof-out/<host>/<pid>_kernel_trace.csv"
            )
        return for_model(report, "kernels", backend="cupti")
    k = report.kernels
    if k.unreliable:
        return for_model(
            report,
            "kernels",
            backend="cupti",
            comment="the recorder records each kernel inside device graphs; or re-run with --no-device-graph-capture",
        )
    warned = [f for f in report.findings if f.severity != "info" and f.command is not None]
    if warned:
        return warned[0].command  # the biggest lever's (findings are ranked)
    if ids & _HEALTHY_IDS:
        return None
    if report.environment.vendor != "nvidia":
        return None  # Nsight Compute is NVIDIA-only
    decode = next((p for p in k.phases if p.phase == "decode"), None)
    rows = decode.top_kernels if decode else k.top_kernels
    for row in rows[:3]:
        if row.share_pct >= suspicious_pct and row.family not in ("gemv", "gemm"):
            return kernel_command(report, row.name, "decode" if decode else None)
    return None
