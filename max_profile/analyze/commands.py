"""Next measurements as data (:class:`~max_profile.model.Command`), said the way the user asked for the capture:
a ``max-profile`` command line, or the Python call that does the same (``profile(...)``, ``Profiler(...)``, ...)."""

from __future__ import annotations

import shlex

from max_profile.analyze.families import distinctive_regex
from max_profile.model import Command, Report


def for_model(report: Report, verb: str, positional: tuple[str, ...] = (), comment: str | None = None, **args: str | int | float | bool) -> Command:
    """A command on the report's own model and devices."""
    c = report.capture
    base: dict[str, str | int | float | bool] = {"model_path": c.model_path or "MODEL_PATH"}
    if c.devices:
        base["devices"] = c.devices
    return Command(verb=verb, args={**base, **args}, positional=list(positional), comment=comment)


def shell(text: str, comment: str | None = None) -> Command:
    return Command(verb="shell", args={"line": text}, comment=comment)


def cli(cmd: Command) -> str:
    if cmd.verb == "shell":
        line = str(cmd.args.get("line", ""))
    else:
        parts = ["max-profile", cmd.verb, *cmd.positional]
        for key, value in cmd.args.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                parts.append(flag)
            elif value is False:
                parts.append("--no-" + key.replace("_", "-"))
            else:
                parts += [flag, str(value)]
        line = " ".join(shlex.quote(p) for p in parts)
    return line + (f"   # {cmd.comment}" if cmd.comment else "")


def _kw(args: dict[str, str | int | float | bool], rename: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> str:
    rename = rename or {}
    return ", ".join(f"{rename.get(k, k)}={v!r}" for k, v in args.items() if k not in drop)


def python(cmd: Command) -> str:
    """The Python equivalent (one line; ``...`` stands for the user's own generation)."""
    a = dict(cmd.args)
    if cmd.verb in ("run", "kernels"):
        kernels = a.pop("kernels", None) or {"cupti": "cupti", "nvtx-log": "nvtx-log"}.get(str(a.pop("backend", "")), "auto")
        if cmd.verb == "kernels" and cmd.args.get("backend") == "nsys":
            line = f"from max_profile.nsys_run import NsysRun, profile_generation_with_nsys; raw = profile_generation_with_nsys(NsysRun({_kw(a)}), print)"
        else:
            graphs = a.pop("device_graph_capture", None)
            extra = f"  (load the pipeline with device_graph_capture={graphs})" if graphs is not None else ""
            line = f"with max_profile.profile(pipeline, kernels={kernels!r}, {_kw(a, drop=('max_new_tokens',))}) as prof: ...{extra}"
    elif cmd.verb == "kernel":
        a.pop("set", None)
        name = cmd.positional[0] if cmd.positional else "NAME"
        line = (f"from max_profile.ncu_run import KernelRun, profile_kernel; raw = profile_kernel(KernelRun(name={name!r}, "
                f"{_kw(a, {'set': 'section_set'})}), print)")
    elif cmd.verb == "serve":
        line = (f"from max_profile.serve import ServePlan, free_port, run_serve_capture; raw = run_serve_capture(ServePlan({_kw(a, {'duration': 'duration_s'})}, "
                "duration_s=10, port=free_port(), metrics_port=free_port()), confirm=True)")
    else:
        return cli(cmd)
    return line + (f"   # {cmd.comment}" if cmd.comment else "")


def say(cmd: Command, interface: str) -> str:
    """The command in the form of the report's interface (Python when the capture came from the API)."""
    return python(cmd) if interface == "python" else cli(cmd)


def kernel_command(report: Report, name: str) -> Command:
    """``max-profile kernel <distinctive regex of NAME>`` on the report's model (3 launches, full set)."""
    return for_model(report, "kernel", positional=(distinctive_regex(name),), launches=3, set="full")
