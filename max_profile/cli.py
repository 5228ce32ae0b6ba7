"""``max-profile``: the command-line tool (the only module that parses arguments).

Verbs: doctor, make-model, demo, run, startup, kernels, kernel, check-arch, serve, attach, report, diff. Every verb
that captures writes the outputs of :data:`max_profile.render.outputs.OUTPUTS` (``--json``, ``--raw`` — ``max-profile
report RAW`` rebuilds everything —, ``--text``, ``--html``, ``--perfetto``, ``--prometheus``, ``--otel``); every path
and library is checked before anything runs. On error: one line ``max-profile: error: ...`` (at most 200 characters;
what does not fit follows on indented lines) and the exit code of
:mod:`max_profile.errors` (1 a regression found by diff, 2 bad input, 3 tool missing, 4 capture failed,
130 interrupted, 143 terminated, 70 a bug).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

import max_profile
from max_profile.errors import (
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_REGRESSION,
    EXIT_TERMINATED,
    EXIT_UNEXPECTED,
    CaptureError,
    InputError,
    MaxProfileError,
    Terminated,
)
from max_profile.flags import build_parser, parse_args
from max_profile.render.outputs import OUTPUTS, check_outputs, probe_writable, write_outputs
from max_profile.render.terminal import Progress, error_lines
from max_profile.render.text import print_report
from max_profile.util.files import write_output
from max_profile.util.procs import raise_on_signals, restore_signals
from max_profile.version import __version__

if TYPE_CHECKING:
    from max_profile.model.serialization import Vendor
    from max_profile.serve import ResolvedServe

# Each verb imports what only it uses (MAX's runners, the server and attach machinery, diff, preflight, ncu and nsys):
# `max-profile report FILE` or `kernels --import FILE` starts without them.

T = TypeVar("T")


def _requested_outputs(args: argparse.Namespace) -> dict[str, str | bool | None]:
    return {o.name: getattr(args, o.name, None) for o in OUTPUTS}


def _check_outputs(args: argparse.Namespace) -> None:
    """Every requested output writable and renderable (its libraries import) before a capture of minutes, not after."""
    check_outputs(_requested_outputs(args))


def _emit(raw: Any, args: argparse.Namespace, progress: Progress) -> int:
    """Analyse a raw capture, print the report, write every requested output. Returns the exit code."""
    raw.capture.interface = "cli"  # next steps are said as command lines
    if getattr(args, "raw", None):  # first: the capture is kept even if the analysis fails
        raw.save(args.raw)
        progress(f"raw capture (steps, kernels, samples) written to {args.raw}")
    from max_profile.analyze.report import build_report  # a saved report is shown without the analysis

    report = build_report(raw, tool_version=__version__)
    print_report(report)
    _write_report(report, args, progress, raw=raw, skip=("raw",))
    return 0


def _import_analysis_meanwhile() -> None:
    """Import the analysis in a thread while a trace is read: the read's SQLite and Arrow work releases the GIL, so the
    ~0.1 s of importing the analysis (and numpy) overlaps it instead of following it. ``_emit``'s own import then finds
    the module loaded (or waits for the thread to finish it, or raises what it raised)."""
    import importlib
    import threading

    def load() -> None:
        with contextlib.suppress(BaseException):  # said by the main thread's own import, never from this thread
            importlib.import_module("max_profile.analyze.report")

    threading.Thread(target=load, daemon=True).start()


def _write_report(
    report: Any, args: argparse.Namespace, progress: Progress, raw: Any = None, skip: tuple[str, ...] = ()
) -> None:
    targets = {k: v for k, v in _requested_outputs(args).items() if k not in skip}
    write_outputs(report, raw, progress=progress, **targets)


def _from_flags(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """A plan (a dataclass) from the flags named like its fields; ``given`` for the rest (renamed or converted)."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    named = {f.name: getattr(args, f.name) for f in fields if f.init and hasattr(args, f.name)}
    return cls(**{**named, **given})


def cmd_doctor(args: argparse.Namespace, progress: Progress) -> int:
    from max_profile.collect.probes.environment import detect_environment, doctor_checks
    from max_profile.model import Capture, Report
    from max_profile.render.outputs import output_checks

    env = detect_environment(check_tools=True)
    env = msgspec.structs.replace(env, tools=[*env.tools, *doctor_checks(env), *output_checks()])
    report = Report(
        environment=env, capture=Capture(started_unix_s=time.time(), target="doctor"), tool_version=__version__
    )
    print_report(report)
    _write_report(report, args, progress)
    return 0


def cmd_make_model(args: argparse.Namespace, progress: Progress) -> int:
    from max_profile.tinymodel import DEFAULT_CHAT_TEMPLATE, ModelShape, build_tiny_llama

    existing = Path(args.dir).expanduser().resolve()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the folder is created with its parents: the nearest existing one must take it
    probe_writable(str(existing / "config.json"), f"make-model {args.dir}:")
    shape = _from_flags(ModelShape, args)
    progress(f"building a random-weight Llama ({args.dtype}, hidden {args.hidden}, {args.layers} layers) in {args.dir}")
    try:
        path = build_tiny_llama(
            args.dir,
            dtype=args.dtype,
            shape=shape,
            architecture=args.architecture,
            chat_template=None if args.no_chat_template else DEFAULT_CHAT_TEMPLATE,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    print(path)
    return 0


def _run_plan(args: argparse.Namespace) -> Any:
    """The generation flags as a :class:`max_profile.run.RunPlan` (run, demo, startup, kernels --backend
    cupti|nvtx-log)."""
    from max_profile.run import RunPlan

    return _from_flags(
        RunPlan,
        args,
        model_path=getattr(args, "model_path", None) or "",
        interval_s=args.interval,
        custom_architectures=list(args.custom_architectures or []),
        kernel_share=getattr(args, "kernel_share", None),
    )


def _vendor_and_devices(args: argparse.Namespace) -> tuple[Vendor, str]:
    """This machine's GPU vendor and ``--devices`` resolved on it (kernels --backend nsys, kernel, serve)."""
    from max_profile.collect.probes.environment import detect_environment
    from max_profile.util.devices import resolve_devices

    vendor = detect_environment(check_tools=False).vendor
    return vendor, resolve_devices(args.devices, vendor)


def cmd_startup(args: argparse.Namespace, progress: Progress) -> int:
    """Process start to the first token of a local model: imports, config, each graph's build / compile (cache hit or
    miss, and why) / initialize, weights, KV cache, device graphs, warm-up. Exit 4 (after the report) when the load
    failed."""
    from max_profile.run import startup_capture
    from max_profile.util.models import check_model_folder

    check_model_folder(args.model_path)
    raw, failure = startup_capture(_run_plan(args), progress)
    code = _emit(raw, args, progress)
    if failure is not None:
        raise failure
    return code


def cmd_run(args: argparse.Namespace, progress: Progress) -> int:
    from max_profile.run import prepare_run, profile_generation
    from max_profile.util.models import check_model_folder

    check_model_folder(args.model_path)
    plan = _run_plan(args)
    prepared = prepare_run(plan, progress)
    return _emit_run(profile_generation(plan, prepared, progress), args, progress, plan, prepared)


def _emit_run(raw: Any, args: argparse.Namespace, progress: Progress, plan: Any, prepared: Any) -> int:
    """The generation's report; a kernel recorder asked for by name that recorded nothing then fails the command (exit
    4)."""
    from max_profile.run import kernels_outcome

    failure = kernels_outcome(raw, plan, prepared)
    code = _emit(raw, args, progress)
    if failure is not None:
        raise failure
    return code


def cmd_demo(args: argparse.Namespace, progress: Progress) -> int:
    from max_profile.run import demo_model, prepare_run, profile_generation

    out = Path(args.out)
    if not out.is_dir():
        if not out.parent.is_dir():
            raise InputError(f"--out {args.out}: the folder {out.parent} does not exist")
        try:
            out.mkdir()
        except OSError as exc:
            raise InputError(f"--out {args.out}: cannot create the folder ({exc.strerror or exc})") from exc
    args.json = args.json or str(out / "report.json")
    args.html = args.html or str(out / "report.html")
    args.raw = args.raw or str(out / "raw.json.gz")
    _check_outputs(args)  # the defaults too: a read-only --out or a missing renderer fails before the model is built
    plan = _run_plan(args)
    prepared = prepare_run(plan, progress)
    folder = demo_model(prepared.devices, args.hidden, args.layers, progress)
    code = _emit_run(
        profile_generation(plan, prepared, progress, model_path=str(folder)), args, progress, plan, prepared
    )
    print(
        f"\nreport: {args.json}\nopen in a browser: file://{os.path.abspath(args.html)}\nre-analyse: max-profile "
        f"report {args.raw}"
    )
    return code


def cmd_kernels(args: argparse.Namespace, progress: Progress) -> int:
    from max_profile.collect.readers.sources import import_trace

    if args.import_file:
        _import_analysis_meanwhile()
        return _emit(import_trace(args.import_file), args, progress)
    if not args.model_path:
        raise InputError("kernels needs --model-path P (run a generation) or --import FILE (read an existing trace)")
    from max_profile.model.kernel_modes import BACKENDS, kernel_mode

    mode = kernel_mode(args.backend, BACKENDS)
    if mode.runner == "refused":
        raise InputError(mode.refusal)
    if mode.runner == "nsys":
        from max_profile.nsys_run import NsysRun, profile_generation_with_nsys
        from max_profile.run import check_plan, workload

        plan = _run_plan(args)
        check_plan(plan)
        _, devices = _vendor_and_devices(args)
        run = _from_flags(NsysRun, args, devices=devices, custom_architectures=list(args.custom_architectures or []))
        raw = profile_generation_with_nsys(run, progress)
        raw.capture.workload = workload(plan, raw, kernels=mode.name)
        return _emit(raw, args, progress)
    args.kernels = mode.name  # a profiled generation in this process
    return cmd_run(args, progress)


def cmd_kernel(args: argparse.Namespace, progress: Progress) -> int:
    from max_profile.collect.readers.ncu import ncu_capture, ncu_rep_capture

    if args.import_file:
        target = f"ncu:{args.name or 'import'}"
        if args.import_file.endswith(".ncu-rep"):
            raw = ncu_rep_capture(args.import_file, target=target)
        else:
            raw = ncu_capture(args.import_file, args.import_raw, target=target)
        return _emit(raw, args, progress)
    if not args.name:
        raise InputError(
            "kernel needs a kernel NAME (or regex:...) to profile; or --import CSV to read existing ncu output"
        )
    if not args.model_path:
        raise InputError("kernel needs --model-path P (run a short generation under ncu) or --import CSV")

    from max_profile.ncu_run import KernelRun, profile_kernel

    _, devices = _vendor_and_devices(args)
    run = _from_flags(
        KernelRun,
        args,
        devices=devices,
        section_set=args.set,
        timeout_s=args.timeout,
        custom_architectures=list(args.custom_architectures or []),
        device_graph_capture=bool(args.device_graph_capture),
    )
    return _emit(profile_kernel(run, progress), args, progress)


def cmd_check_arch(args: argparse.Namespace, progress: Progress) -> int:
    from rich.console import Console

    from max_profile.preflight import check_architecture
    from max_profile.render.text import preflight_section

    results = []
    for spec in args.spec:
        progress(f"preflight of {spec}")
        results.append(
            check_architecture(
                spec, model_path=args.model_path, serve=args.serve, max_length=args.max_length, timeout_s=args.timeout
            )
        )
    section = preflight_section(results)
    if section is not None:
        Console(highlight=False).print(section)
    if args.json:
        write_output(args.json, msgspec.json.format(msgspec.json.encode(results), indent=2))
    failed = [r for r in results if not r.ok]
    if failed:
        first = next(c for c in failed[0].checks if not c.ok and c.severity == "error")
        raise InputError(f"{failed[0].spec}: {first.message}" + (f" — fix: {first.fix}" if first.fix else ""))
    return 0


def cmd_serve(args: argparse.Namespace, progress: Progress) -> int:
    from max_profile.serve import ServePlan, free_port, resolve_plan, run_serve_capture

    vendor, devices = _vendor_and_devices(args)
    plan = _from_flags(
        ServePlan,
        args,
        devices=devices,
        duration_s=args.duration,
        vendor=vendor,
        port=args.port or free_port(),
        metrics_port=args.metrics_port or free_port(),
        custom_architectures=list(args.custom_architectures or []),
        extra_args=args.extra,
        warm=not args.no_warm,
        reference=not args.no_reference,
        spans=args.spans,
        record_slice_s=args.record_slice,
        concurrency=list(args.concurrency),
        slo_ms=dict(args.slo),
    )
    resolved = resolve_plan(plan, vendor)  # checked and resolved before anything starts
    print("max-profile serve plan:\n" + resolved.describe(), file=sys.stderr)

    def confirm(p: ResolvedServe) -> bool:
        if args.yes:
            return True
        if sys.stdin.isatty():
            return input("Proceed? [y/N] ").strip().lower() in ("y", "yes")
        return False

    raw = run_serve_capture(
        resolved,
        confirm=confirm,
        progress=progress,
        ready_timeout_s=args.ready_timeout,
        artifacts_dir=args.artifacts_dir,
    )
    return _emit(raw, args, progress)


def cmd_attach(args: argparse.Namespace, progress: Progress) -> int:
    """A bounded, read-only window on a running server; exit 4 (after the report) when the server died in it."""
    from max_profile.attach import AttachPlan, run_attach

    if args.otlp_save:
        if not args.otlp:
            raise InputError("--otlp-save needs --otlp [HOST:]PORT (the spans it saves are the ones received there)")
        probe_writable(args.otlp_save, "--otlp-save")
    plan = _from_flags(
        AttachPlan,
        args,
        url=args.url[0],
        replicas=list(args.url[1:]),
        duration_s=args.duration,
        concurrency=list(args.concurrency),
        slo_ms=dict(args.slo),
    )
    result = run_attach(plan, progress)
    code = _emit(result.raw, args, progress)
    if result.failure:
        raise CaptureError(f"{args.url[0]}: {result.failure}; the report above holds what was seen before")
    return code


def cmd_report(args: argparse.Namespace, progress: Progress) -> int:
    """Re-analyse a saved raw capture, re-render a saved report, or import any supported trace."""
    from max_profile.collect.readers.sources import detect_format, load_any
    from max_profile.model import Report

    source = detect_format(args.file)
    if not source.saved:  # a trace: read, then analysed
        _import_analysis_meanwhile()
    loaded = load_any(args.file, source)
    if isinstance(loaded, Report):
        if args.perfetto or args.raw:
            raise InputError(
                f"{args.file} is an analysed report: --perfetto / --raw need the raw capture it was built from (--raw "
                "of the run)"
            )
        progress(
            f"{args.file} is an analysed report (schema {loaded.schema_version}): shown as saved; pass its raw capture "
            "to re-analyse"
        )
        print_report(loaded)
        _write_report(loaded, args, progress)
        return 0
    return _emit(loaded, args, progress)


def _loaded(path: str) -> tuple[Any, Any]:
    """(report, raw capture or None) of a saved raw capture, report, or trace file."""
    from max_profile.collect.readers.sources import load_any
    from max_profile.model import Report

    loaded = load_any(path)
    if isinstance(loaded, Report):
        return loaded, None
    from max_profile.analyze.report import build_report

    return build_report(loaded, tool_version=__version__), loaded


def cmd_diff(args: argparse.Namespace, progress: Progress) -> int:
    """Compare run B against baseline A; exit 1 on a significant regression above --fail-above, 5 when the comparison
    could not judge (inconclusive), 2 when not comparable."""
    from max_profile.analyze.diff import diff_reports
    from max_profile.render.diff_html import render_diff_html
    from max_profile.render.diff_text import print_diff

    a, a_raw = _loaded(args.a)
    b, b_raw = _loaded(args.b)
    result = diff_reports(
        a,
        b,
        a_label=args.a,
        b_label=args.b,
        fail_above_pct=args.fail_above,
        alpha=args.alpha,
        force=args.force,
        a_raw=a_raw,
        b_raw=b_raw,
    )
    print_diff(result)
    if args.json:
        write_output(args.json, msgspec.json.format(result.to_json(), indent=2))
    if args.html:
        write_output(args.html, render_diff_html(result).encode())
        progress(f"HTML diff written to {args.html}")
    if not result.comparable and not args.force:
        raise InputError(
            "the two runs are not comparable: " + "; ".join(result.reasons) + " (pass --force to compare anyway)"
        )
    if result.regression:
        return EXIT_REGRESSION
    return EXIT_INCONCLUSIVE if result.outcome == "inconclusive" else 0


VERBS: dict[str, Callable[[argparse.Namespace, Progress], int]] = {
    "doctor": cmd_doctor,
    "make-model": cmd_make_model,
    "demo": cmd_demo,
    "run": cmd_run,
    "startup": cmd_startup,
    "kernels": cmd_kernels,
    "kernel": cmd_kernel,
    "check-arch": cmd_check_arch,
    "serve": cmd_serve,
    "attach": cmd_attach,
    "report": cmd_report,
    "diff": cmd_diff,
}
"""Each verb of :func:`max_profile.flags.build_parser` and the function that runs it."""


def main(argv: Sequence[str] | None = None) -> int:
    from max_profile.collect.probes import startup

    startup.PROGRAM_ENTRY = max_profile.IMPORTED_AT  # a start-up profile counts from this command, not an exec'd shell
    progress = Progress(quiet=bool(argv is not None and ("-q" in argv or "--quiet" in argv)))
    previous = raise_on_signals()
    try:
        parser = build_parser()
        args = parse_args(parser, argv)
        progress.quiet = bool(getattr(args, "quiet", False))
        func = VERBS[args.verb]
        _check_outputs(args)
        return int(func(args, progress) or 0)
    except MaxProfileError as exc:
        print(error_lines(_one_line(exc)), file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print("max-profile: terminated (SIGTERM); everything this command started was stopped", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print("max-profile: interrupted (Ctrl-C); everything this command started was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - one clear line, never a traceback
        if os.environ.get("MAX_PROFILE_DEBUG"):
            raise
        print(
            error_lines(
                f"unexpected {type(exc).__name__}: {_one_line(exc)}; a bug in max_profile: re-run with "
                "MAX_PROFILE_DEBUG=1 for the traceback and report it"
            ),
            file=sys.stderr,
        )
        return EXIT_UNEXPECTED
    finally:
        restore_signals(previous)
        if os.environ.get("MAX_PROFILE_NVTX_LOG"):  # only a process started with the op-range log can have one
            from max_profile.session import remove_own_nvtx_log

            remove_own_nvtx_log()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return " ".join(text.split()) if text else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
