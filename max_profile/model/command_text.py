"""A :class:`~max_profile.model.Command` as the user reads it: a ``max-profile`` command line (:func:`cli`), or the
Python call that does the same (:func:`python`: ``profile(...)``, ``profile_kernel(...)``, ...); :func:`say` picks the
one of the report's interface. The text form of the data, beside it in the model: analyses and renderers both say
commands, so neither owns how."""

from __future__ import annotations

import shlex

from max_profile.model.kernel_modes import KERNEL_MODES
from max_profile.model.report import Command

ArgValue = str | int | float | bool | list[str]


def cli(cmd: Command) -> str:
    if cmd.verb == "shell":
        line = str(cmd.args.get("line", ""))
    else:
        parts = [cmd.program or "max-profile", cmd.verb, *cmd.positional]
        for key, value in cmd.args.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                parts.append(flag)
            elif value is False:
                parts.append("--no-" + key.replace("_", "-"))
            elif isinstance(value, list):
                for item in value:
                    parts += [flag, str(item)]
            else:
                parts += [flag, str(value)]
        line = " ".join(shlex.quote(p) for p in parts)
    return line + (f"   # {cmd.comment}" if cmd.comment else "")


def _kw(args: dict[str, ArgValue], rename: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> str:
    rename = rename or {}
    return ", ".join(f"{rename.get(k, k)}={v!r}" for k, v in args.items() if k not in drop)


_GENERATION_ARGS = (
    "batch_size",
    "prompt",
    "max_new_tokens",
    "max_length",
    "quantization_encoding",
    "custom_architectures",
    "device_graph_capture",
    "warmup",
)
"""What a ``run`` command sets that, from Python, is the user's own load and generation, not ``profile()``'s."""


def python(cmd: Command) -> str:
    """The Python equivalent (one line; ``...`` stands for the user's own generation)."""
    a = dict(cmd.args)
    if cmd.verb in ("run", "kernels"):
        backend = str(a.pop("backend", ""))
        named = KERNEL_MODES.get(str(a.pop("kernels", None) or backend or "auto"), KERNEL_MODES["auto"])
        if named.runner == "nsys":
            line = (
                "from max_profile.nsys_run import NsysRun, profile_generation_with_nsys; raw = "
                f"profile_generation_with_nsys(NsysRun({_kw(a)}), print)"
            )
        else:
            mode = named if named.in_process_api else KERNEL_MODES["auto"]
            same = [f"{k}={a[k]!r}" for k in _GENERATION_ARGS if k in a]
            extra = f"  (as before: {', '.join(same)})" if same else ""
            line = (
                f"with max_profile.profile(pipeline, kernels={mode.name!r}, {_kw(a, drop=_GENERATION_ARGS)}) as "
                f"prof: ...{extra}"
            )
            if mode.op_ranges:  # MAX's op ranges need the process started for them: that call first
                devices = str(a.get("devices", "cpu"))
                line = (
                    f"max_profile.restart_with_op_ranges({devices!r})  # first thing in the script, before MAX loads "
                    f"the model; then: {line}"
                )
    elif cmd.verb == "kernel":
        a.pop("set", None)
        name = cmd.positional[0] if cmd.positional else "NAME"
        line = (
            f"from max_profile.ncu_run import KernelRun, profile_kernel; raw = profile_kernel(KernelRun(name={name!r}, "
            f"{_kw(a)}), print)"
        )
    elif cmd.verb == "serve":
        a.setdefault("duration", 10)
        line = (
            "from max_profile.serve import ServePlan, free_port, run_serve_capture; raw = "
            f"run_serve_capture(ServePlan({_kw(a, {'duration': 'duration_s'})}, "
            "port=free_port(), metrics_port=free_port()), confirm=True)"
        )
    else:
        return cli(cmd)
    return line + (f"   # {cmd.comment}" if cmd.comment else "")


def say(cmd: Command, interface: str) -> str:
    """The command in the form of the report's interface (Python when the capture came from the API)."""
    return python(cmd) if interface == "python" else cli(cmd)
