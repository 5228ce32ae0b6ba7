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
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from max_profile.errors import (
    EXIT_INTERRUPTED,
    EXIT_REGRESSION,
    EXIT_TERMINATED,
    EXIT_UNEXPECTED,
    CaptureError,
    InputError,
    MaxProfileError,
    Terminated,
)


class Progress:
    """One line per long step on stderr, with elapsed time (model build, compile, warm-up), wrapped at the terminal's width."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            from max_profile.render.text import fit_to_terminal  # rich: loaded once the first line prints, not at start

            line = f"[max-profile {time.perf_counter() - self.t0:6.1f}s] {message}"
            print(fit_to_terminal(line, indent=" " * 22), file=sys.stderr, flush=True)


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error line and exit code for bad flags."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        verb = self.prog.split(" ", 1)[1] if " " in self.prog else ""  # "max-profile run" -> "run"
        message += self._hint(message)
        raise InputError(f"{verb}: {message}" if verb else message)

    def _hint(self, message: str) -> str:
        """A verb list for a missing verb; for an unknown flag, the close ones this verb takes (``--tokens``: ``--max-new-tokens``)."""
        import difflib

        if "required: VERB" in message:
            verbs = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
            return f" (one of: {', '.join(verbs.choices)}; `max-profile VERB --help` for each)" if verbs is not None else ""
        unknown = [w.split("=")[0] for w in message.removeprefix("unrecognized arguments:").split() if w.startswith("--")]
        if not unknown or not message.startswith("unrecognized arguments"):
            return ""
        flags = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        hints = []
        for word in unknown:
            inside = [f for f in flags if word.removeprefix("--") in f]  # --tokens: --max-new-tokens before --kernels
            close = list(dict.fromkeys(inside + difflib.get_close_matches(word, flags, n=2, cutoff=0.6)))
            if close:
                hints.append(f"{word}: did you mean {' or '.join(close[:2])}?")
        return ("; " + "; ".join(hints)) if hints else ""


def _requested_outputs(args: argparse.Namespace) -> dict[str, str | bool | None]:
    from max_profile.render.outputs import OUTPUTS

    return {o.name: getattr(args, o.name, None) for o in OUTPUTS}


def _check_outputs(args: argparse.Namespace) -> None:
    """Every requested output writable and renderable (its libraries import) before a capture of minutes, not after."""
    from max_profile.render.outputs import check_outputs

    check_outputs(_requested_outputs(args))


def _emit(raw: Any, args: argparse.Namespace, progress: Progress) -> int:
    """Analyse a raw capture, print the report, write every requested output. Returns the exit code."""
    from max_profile.analyze.report import build_report
    from max_profile.render.text import print_report
    from max_profile.version import __version__

    raw.capture.interface = "cli"  # next steps are said as command lines
    if getattr(args, "raw", None):  # first: the capture is kept even if the analysis fails
        raw.save(args.raw)
        progress(f"raw capture (steps, kernels, samples) written to {args.raw}")
    report = build_report(raw, tool_version=__version__)
    print_report(report)
    _write_report(report, args, progress, raw=raw, skip=("raw",))
    return 0


def _write_report(report: Any, args: argparse.Namespace, progress: Progress, raw: Any = None, skip: tuple[str, ...] = ()) -> None:
    from max_profile.render.outputs import write_outputs

    targets = {k: v for k, v in _requested_outputs(args).items() if k not in skip}
    write_outputs(report, raw, progress=progress, **targets)


# ---------------------------------------------------------------------------------------------
def cmd_doctor(args: argparse.Namespace, progress: Progress) -> int:
    import msgspec

    from max_profile.collect.probes.environment import detect_environment, doctor_checks
    from max_profile.model import Capture, Report
    from max_profile.render.outputs import output_checks
    from max_profile.render.text import print_report
    from max_profile.version import __version__

    env = detect_environment(check_tools=True)
    env = msgspec.structs.replace(env, tools=[*env.tools, *doctor_checks(env), *output_checks()])
    report = Report(environment=env, capture=Capture(started_unix_s=time.time(), target="doctor"), tool_version=__version__)
    print_report(report)
    _write_report(report, args, progress)
    return 0


def cmd_make_model(args: argparse.Namespace, progress: Progress) -> int:
    from pathlib import Path

    from max_profile.render.outputs import probe_writable
    from max_profile.tinymodel import DEFAULT_CHAT_TEMPLATE, ModelShape, build_tiny_llama

    existing = Path(args.dir).expanduser().resolve()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the folder is created with its parents: the nearest existing one must take it
    probe_writable(str(existing / "config.json"), f"make-model {args.dir}:")
    shape = ModelShape(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, intermediate=args.intermediate, vocab=args.vocab)
    progress(f"building a random-weight Llama ({args.dtype}, hidden {args.hidden}, {args.layers} layers) in {args.dir}")
    try:
        path = build_tiny_llama(args.dir, dtype=args.dtype, shape=shape, architecture=args.architecture,
                                chat_template=None if args.no_chat_template else DEFAULT_CHAT_TEMPLATE)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    print(path)
    return 0


def _run_plan(args: argparse.Namespace) -> Any:
    """The generation flags as a :class:`max_profile.run.RunPlan` (run, demo, startup, kernels --backend cupti|nvtx-log)."""
    from max_profile.run import RunPlan

    return RunPlan(model_path=getattr(args, "model_path", None) or "", devices=args.devices, kernels=args.kernels, batch_size=args.batch_size,
                   prompt=args.prompt, max_new_tokens=args.max_new_tokens, warmup=args.warmup, interval_s=args.interval,
                   max_length=args.max_length, quantization_encoding=args.quantization_encoding, device_graph_capture=args.device_graph_capture,
                   custom_architectures=list(args.custom_architectures or []), kernel_share=getattr(args, "kernel_share", None))


def cmd_startup(args: argparse.Namespace, progress: Progress) -> int:
    """Process start to the first token of a local model: imports, config, each graph's build / compile (cache hit or miss,
    and why) / initialize, weights, KV cache, device graphs, warm-up. Exit 4 (after the report) when the load failed."""
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
    """The generation's report; a kernel recorder asked for by name that recorded nothing then fails the command (exit 4)."""
    from max_profile.run import kernels_outcome

    failure = kernels_outcome(raw, plan, prepared)
    code = _emit(raw, args, progress)
    if failure is not None:
        raise failure
    return code


def cmd_demo(args: argparse.Namespace, progress: Progress) -> int:
    from pathlib import Path

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
    code = _emit_run(profile_generation(plan, prepared, progress, model_path=str(folder)), args, progress, plan, prepared)
    print(f"\nreport: {args.json}\nopen in a browser: file://{os.path.abspath(args.html)}\nre-analyse: max-profile report {args.raw}")
    return code


def cmd_kernels(args: argparse.Namespace, progress: Progress) -> int:
    if args.import_file:
        from max_profile.collect.readers.sources import import_trace

        return _emit(import_trace(args.import_file), args, progress)
    if not args.model_path:
        raise InputError("kernels needs --model-path P (run a generation) or --import FILE (read an existing trace)")
    if args.backend == "nsys":
        from max_profile.collect.probes.environment import detect_environment
        from max_profile.nsys_run import NsysRun, profile_generation_with_nsys
        from max_profile.run import check_plan, workload
        from max_profile.util.devices import resolve_devices

        plan = _run_plan(args)
        check_plan(plan)
        devices = resolve_devices(args.devices, detect_environment(check_tools=False).vendor)
        run = NsysRun(model_path=args.model_path, devices=devices, batch_size=args.batch_size, prompt=args.prompt, warmup=args.warmup,
                      max_new_tokens=args.max_new_tokens, custom_architectures=list(args.custom_architectures or []),
                      device_graph_capture=args.device_graph_capture)
        raw = profile_generation_with_nsys(run, progress)
        raw.capture.workload = workload(plan, raw, kernels="nsys")
        return _emit(raw, args, progress)
    if args.backend == "rocprof":
        raise InputError("run the generation under rocprofv3 yourself (rocprofv3 --kernel-trace --marker-trace --output-format csv -d OUT -- "
                         "max-profile run --model-path P --kernels off) and read it with `max-profile kernels --import OUT/<host>/<pid>_kernel_trace.csv`")
    args.kernels = "cupti" if args.backend == "cupti" else "nvtx-log"
    return cmd_run(args, progress)


def cmd_kernel(args: argparse.Namespace, progress: Progress) -> int:
    from max_profile.collect.probes.environment import detect_environment
    from max_profile.ncu_run import KernelRun, profile_kernel

    if args.import_file:
        from max_profile.collect.readers.ncu import ncu_capture, ncu_rep_capture

        target = f"ncu:{args.name or 'import'}"
        if args.import_file.endswith(".ncu-rep"):
            raw = ncu_rep_capture(args.import_file, target=target)
        else:
            raw = ncu_capture(args.import_file, args.import_raw, target=target)
        return _emit(raw, args, progress)
    if not args.name:
        raise InputError("kernel needs a kernel NAME (or regex:...) to profile; or --import CSV to read existing ncu output")
    if not args.model_path:
        raise InputError("kernel needs --model-path P (run a short generation under ncu) or --import CSV")
    from max_profile.util.devices import resolve_devices

    devices = resolve_devices(args.devices, detect_environment(check_tools=False).vendor)
    run = KernelRun(name=args.name, model_path=args.model_path, devices=devices, launches=args.launches, launch_skip=args.launch_skip,
                    section_set=args.set, max_new_tokens=args.max_new_tokens, timeout_s=args.timeout, output_dir=args.output_dir,
                    suggest_from=args.suggest_from, batch_size=args.batch_size, custom_architectures=list(args.custom_architectures or []),
                    device_graph_capture=bool(args.device_graph_capture), prompt=args.prompt, max_length=args.max_length,
                    quantization_encoding=args.quantization_encoding)
    return _emit(profile_kernel(run, progress), args, progress)


def cmd_check_arch(args: argparse.Namespace, progress: Progress) -> int:
    import msgspec
    from rich.console import Console

    from max_profile.preflight import check_architecture
    from max_profile.render.text import preflight_section
    from max_profile.util.files import write_output

    results = []
    for spec in args.spec:
        progress(f"preflight of {spec}")
        results.append(check_architecture(spec, model_path=args.model_path, serve=args.serve, max_length=args.max_length, timeout_s=args.timeout))
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
    from max_profile.collect.probes.environment import detect_environment
    from max_profile.serve import ServePlan, free_port, run_serve_capture
    from max_profile.util.devices import resolve_devices

    extra = list(args.extra or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    if not args.duration > 0:
        raise InputError("--duration must be > 0 seconds")
    if not 0 < args.record_share <= 1:
        raise InputError(f"--record-share must be above 0 and at most 1 (a fraction of each window), not {args.record_share:g}")
    if not args.record_slice > 0:
        raise InputError(f"--record-slice must be > 0 seconds, not {args.record_slice:g}")
    vendor = detect_environment(check_tools=False).vendor
    devices = resolve_devices(args.devices, vendor)
    plan = ServePlan(model_path=args.model_path, devices=devices, mode=args.mode, duration_s=args.duration, vendor=vendor,
                     port=args.port or free_port(), metrics_port=args.metrics_port or free_port(),
                     custom_architectures=list(args.custom_architectures or []), extra_args=extra, warm=not args.no_warm, reference=not args.no_reference,
                     max_tokens=args.max_tokens, record_share=args.record_share, record_slice_s=args.record_slice,
                     profiling_mode=args.profiling_mode, concurrency=list(args.concurrency), slo_ms=dict(args.slo))
    print("max-profile serve plan:\n" + plan.describe(), file=sys.stderr)

    def confirm(p: ServePlan) -> bool:
        if args.yes:
            return True
        if sys.stdin.isatty():
            return input("Proceed? [y/N] ").strip().lower() in ("y", "yes")
        return False

    raw = run_serve_capture(plan, confirm=confirm, progress=progress, ready_timeout_s=args.ready_timeout, artifacts_dir=args.artifacts_dir)
    return _emit(raw, args, progress)


def cmd_attach(args: argparse.Namespace, progress: Progress) -> int:
    """A bounded, read-only window on a running server; exit 4 (after the report) when the server died in it."""
    from max_profile.attach import AttachPlan, run_attach

    plan = AttachPlan(url=args.url, metrics_url=args.metrics_url, duration_s=args.duration, probe=args.probe, concurrency=list(args.concurrency),
                      slo_ms=dict(args.slo), max_tokens=args.max_tokens)
    result = run_attach(plan, progress)
    code = _emit(result.raw, args, progress)
    if result.failure:
        raise CaptureError(f"{args.url}: {result.failure}; the report above holds what was seen before")
    return code


def cmd_report(args: argparse.Namespace, progress: Progress) -> int:
    """Re-analyse a saved raw capture, re-render a saved report, or import any supported trace."""
    from max_profile.collect.readers.sources import load_any
    from max_profile.model import Report
    from max_profile.render.text import print_report

    loaded = load_any(args.file)
    if isinstance(loaded, Report):
        if args.perfetto or args.raw:
            raise InputError(f"{args.file} is an analysed report: --perfetto / --raw need the raw capture it was built from (--raw of the run)")
        progress(f"{args.file} is an analysed report (schema {loaded.schema_version}): shown as saved; pass its raw capture to re-analyse")
        print_report(loaded)
        _write_report(loaded, args, progress)
        return 0
    return _emit(loaded, args, progress)


def _loaded(path: str) -> tuple[Any, Any]:
    """(report, raw capture or None) of a saved raw capture, report, or trace file."""
    from max_profile.analyze.report import build_report
    from max_profile.collect.readers.sources import load_any
    from max_profile.model import Report
    from max_profile.version import __version__

    loaded = load_any(path)
    if isinstance(loaded, Report):
        return loaded, None
    return build_report(loaded, tool_version=__version__), loaded


def cmd_diff(args: argparse.Namespace, progress: Progress) -> int:
    """Compare run B against baseline A; exit 1 on a significant regression above --fail-above, 2 when not comparable."""
    import msgspec

    from max_profile.analyze.diff import diff_reports
    from max_profile.render.text import print_diff
    from max_profile.util.files import write_output

    if not args.fail_above >= 0:
        raise InputError("--fail-above must be >= 0 (a percentage)")
    if not 0 < args.alpha < 1:
        raise InputError("--alpha must be between 0 and 1")
    a, a_raw = _loaded(args.a)
    b, b_raw = _loaded(args.b)
    result = diff_reports(a, b, a_label=args.a, b_label=args.b, fail_above_pct=args.fail_above, alpha=args.alpha, force=args.force,
                          a_raw=a_raw, b_raw=b_raw)
    print_diff(result)
    if args.json:
        write_output(args.json, msgspec.json.format(result.to_json(), indent=2))
    if args.html:
        from max_profile.render.html import render_diff_html

        write_output(args.html, render_diff_html(result).encode())
        progress(f"HTML diff written to {args.html}")
    if not result.comparable and not args.force:
        raise InputError("the two runs are not comparable: " + "; ".join(result.reasons) + " (pass --force to compare anyway)")
    return EXIT_REGRESSION if result.regression else 0


# ---------------------------------------------------------------------------------------------
def _add_output_flags(p: argparse.ArgumentParser, raw: bool = True) -> None:
    from max_profile.render.outputs import OUTPUTS

    for o in OUTPUTS:
        if not raw and o.name not in ("text", "json", "html"):
            continue
        if o.takes_path:
            p.add_argument(f"--{o.name}", metavar="PATH", help=o.help)
        else:
            p.add_argument(f"--{o.name}", action="store_true", help=o.help)


def _add_generation_flags(p: argparse.ArgumentParser, default_tokens: int = 64) -> None:
    p.add_argument("--devices", help="cpu, gpu, gpu:N, gpu:N,M or gpu:all (default: gpu when one is visible, else cpu)")
    p.add_argument("--prompt", default="I believe the meaning of life is", help="prompt text")
    p.add_argument("--max-new-tokens", type=int, default=default_tokens, help="tokens to generate in the profiled run")
    p.add_argument("--batch-size", type=int, default=1, help="prompts in the batch")
    p.add_argument("--warmup", type=int, default=4, help="tokens of an unprofiled warm-up generation (0: none)")
    p.add_argument("--kernels", choices=["off", "cupti", "nvtx-log", "auto"], default="auto",
                   help="kernel recording: cupti (NVIDIA, in-process), nvtx-log (MAX's op ranges, any device; device graphs off), off; "
                   "auto (every verb): cupti on an NVIDIA GPU, nvtx-log on the CPU (off when its library cannot be built), off on "
                   "another vendor's GPU (nvtx-log would turn its device graphs off)")
    p.add_argument("--kernel-share", type=float, default=None, metavar="SHARE",
                   help="with cupti: the share of steps recorded, in slices of 8 steps, the first from the start (default 0.25: a 2 ms "
                   "H200 decode step ran at 0.978 of untraced, 0.863 with every step; 1: every step)")
    p.add_argument("--interval", type=float, default=0.1, help="GPU sampling interval in seconds (> 0)")
    p.add_argument("--max-length", type=int, default=None, help="MAX --max-length")
    p.add_argument("--quantization-encoding", default=None, help="MAX --quantization-encoding (e.g. float32, bfloat16)")
    p.add_argument("--device-graph-capture", action=argparse.BooleanOptionalAction, default=None,
                   help="force device graph capture on / off (default: MAX decides, as `max generate` does: on for supported "
                   "architectures on a GPU; CUPTI and nsys record the kernels inside the graphs)")
    p.add_argument("--custom-architectures", action="append", metavar="DIR", help="custom architecture package (repeatable)")
    _add_output_flags(p)


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Help with each option's default shown (only where it has one worth saying)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS or action.default in ([], {}) \
                or "%(default)" in text or "default" in text:
            return text
        return super()._get_help_string(action) or text


def _levels(text: str) -> list[int]:
    """``--concurrency 1,4,16``."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected concurrency levels like 1,4,16") from None
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError(f"{text!r}: levels must be whole numbers >= 1")
    return levels


def _slo(text: str) -> dict[str, float]:
    """``--slo ttft=500,itl=50`` (milliseconds)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        key = key.strip().lower()
        if key not in ("ttft", "itl") or not value:
            raise argparse.ArgumentTypeError(f"{part!r}: expected ttft=MS and / or itl=MS (e.g. ttft=500,itl=50)")
        try:
            ms = float(value.strip().removesuffix("ms"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: {value!r} is not a number of milliseconds") from None
        if not ms > 0:
            raise argparse.ArgumentTypeError(f"{part!r}: the objective must be > 0 ms")
        out[key] = ms
    if not out:
        raise argparse.ArgumentTypeError("expected ttft=MS and / or itl=MS")
    return out


def build_parser() -> argparse.ArgumentParser:
    from max_profile.preflight import DEFAULT_TIMEOUT_S
    from max_profile.serve import READY_TIMEOUT_S, SERVE_MODES

    common = _Parser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress lines on stderr")
    parser = _Parser(prog="max-profile", description="Profile models run with Modular's MAX: utilization, kernels by phase, single-kernel deep dives.",
                     formatter_class=_Help)
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB", parser_class=_Parser)

    def verb(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, parents=[common], formatter_class=_Help)

    p = verb("doctor", "what this machine has and what a capture will use: GPUs, driver, MAX, profilers with install commands, samplers, output libraries")
    p.add_argument("--json", metavar="PATH", help="write the findings as JSON (the environment section of a report)")
    p.add_argument("--html", metavar="PATH", help="write them as one HTML page")
    p.set_defaults(func=cmd_doctor)

    p = verb("make-model", "build a random-weight Llama model in HF format (config, safetensors, tokenizer trained locally), offline")
    p.add_argument("dir", help="folder to write (created with its parents)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float8_e4m3fn"], default="float32",
                   help="weights: float32 (CPU), bfloat16 (GPU), float8_e4m3fn (block-scaled FP8, quant_method fp8, 128x128 blocks; GPU)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size")
    p.add_argument("--layers", type=int, default=2, help="decoder layers")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--kv-heads", type=int, default=2, help="key / value heads (grouped-query attention)")
    p.add_argument("--intermediate", type=int, default=None, help="MLP intermediate size (default: 2 x hidden)")
    p.add_argument("--vocab", type=int, default=320, help="tokenizer vocabulary to train")
    p.add_argument("--architecture", default="LlamaForCausalLM", help="config.json architectures[0]")
    p.add_argument("--no-chat-template", action="store_true", help="write no chat template (a base model)")
    p.set_defaults(func=cmd_make_model)

    p = verb("demo", "build a tiny model, warm up, profile a generation on the best device, print the report")
    _add_generation_flags(p)
    p.add_argument("--hidden", type=int, default=None, help="demo model hidden size (default: 64 on CPU, 2048 on GPU)")
    p.add_argument("--layers", type=int, default=None, help="demo model layers (default: 2 on CPU, 4 on GPU)")
    p.add_argument("--out", default="max-profile-demo", help="folder for report.json, report.html and raw.json.gz")
    p.set_defaults(func=cmd_demo)

    p = verb("run", "profile a generation of a local model")
    p.add_argument("--model-path", required=True, help="local Hugging Face model folder")
    _add_generation_flags(p)
    p.set_defaults(func=cmd_run)

    p = verb("startup", "where the time before the first token goes: imports, config, each graph's compile (cache hit or miss, and why), weights, "
             "KV cache, device graphs, warm-up")
    p.add_argument("--model-path", required=True, help="local Hugging Face model folder")
    _add_generation_flags(p, default_tokens=1)
    p.set_defaults(func=cmd_startup)

    p = verb("kernels", "kernel breakdown by family and phase (run a generation, or --import a trace)")
    p.add_argument("--model-path", help="local model folder (or --import FILE)")
    p.add_argument("--backend", choices=["cupti", "nsys", "nvtx-log", "rocprof"], default="cupti",
                   help="cupti: in-process recorder (NVIDIA); nsys: a run under Nsight Systems; nvtx-log: MAX's op ranges (any device)")
    p.add_argument("--import", dest="import_file", metavar="FILE",
                   help="nsys .sqlite/.nsys-rep/stats CSV, rocprofv3 CSV/rocpd db, Kineto JSON, `max generate --profile` output, or a raw capture")
    _add_generation_flags(p)
    p.set_defaults(func=cmd_kernels)

    p = verb("kernel", "why is this kernel slow: a targeted Nsight Compute run (or --import an ncu CSV / .ncu-rep)")
    p.add_argument("name", nargs="?", help="kernel name (hash suffix ignored) or regex (regex:...) — required for a run: ncu never profiles every kernel here")
    p.add_argument("--model-path", help="local model folder")
    p.add_argument("--devices", default=None, help="default: gpu")
    p.add_argument("--launches", "-c", type=int, default=3, help="launches to profile (1..20)")
    p.add_argument("--launch-skip", type=int, default=16, help="matching launches to skip first (past prefill into decode)")
    p.add_argument("--set", default="full", choices=["basic", "full"], help="ncu section set")
    p.add_argument("--max-new-tokens", type=int, default=24, help="tokens of the generation run under ncu")
    p.add_argument("--batch-size", type=int, default=1, help="prompts in the batch of the generation run under ncu")
    p.add_argument("--prompt", default="I believe the meaning of life is", help="prompt text of the generation run under ncu")
    p.add_argument("--max-length", type=int, default=None, help="MAX --max-length")
    p.add_argument("--quantization-encoding", default=None, help="MAX --quantization-encoding (e.g. float32, bfloat16)")
    p.add_argument("--custom-architectures", action="append", metavar="DIR", help="custom architecture package (repeatable)")
    p.add_argument("--device-graph-capture", action=argparse.BooleanOptionalAction, default=False,
                   help="device graphs in the profiled generation (default off: ncu replays each launch, and MAX 26.7 "
                   "capturing graphs under ncu crashed on an H200)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before the ncu run is stopped")
    p.add_argument("--output-dir", help="where the .ncu-rep and CSVs go (default: a temp folder)")
    p.add_argument("--suggest-from", metavar="REPORT_JSON", help="a kernels report whose names are suggested when the regex matches nothing")
    p.add_argument("--import", dest="import_file", metavar="CSV", help="an existing `ncu --csv --page details` output, or a .ncu-rep report (read through ncu) (no NAME needed)")
    p.add_argument("--import-raw", metavar="CSV", help="the matching `--page raw` output (stall reasons, roofline)")
    _add_output_flags(p)
    p.set_defaults(func=cmd_kernel)

    p = verb("check-arch", "preflight a --custom-architectures package before the long load")
    p.add_argument("spec", nargs="+", help="package folder or IMPORT_PATH:MODULE, as given to --custom-architectures")
    p.add_argument("--model-path", help="the model folder that will use it (checks config.json and the tokenizer)")
    p.add_argument("--serve", action="store_true", help="also check what `max serve` needs (chat template, embeddings)")
    p.add_argument("--max-length", type=int, help="--max-length that will be used (predicts PromptTooLongError)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds allowed for the package import")
    p.add_argument("--json", metavar="PATH", help="write every check as JSON")
    p.set_defaults(func=cmd_check_arch)

    p = verb("serve", "profile `max serve`: plan, confirm, warm, capture under a streaming load (one concurrency or a sweep), clean up")
    p.add_argument("--model-path", required=True, help="local model folder to serve")
    p.add_argument("--devices", help="cpu, gpu, gpu:N ... (default: gpu when one is visible, else cpu)")
    p.add_argument("--mode", choices=list(SERVE_MODES), default="utilization",
                   help="; ".join(f"{m.name}: {m.summary}" for m in SERVE_MODES.values()))
    p.add_argument("--duration", type=float, default=10.0, help="capture window in seconds, per concurrency level (about 10 s shows the kernel mix)")
    p.add_argument("--concurrency", type=_levels, default=[1], metavar="N[,N...]",
                   help="requests in flight (closed loop); several levels (1,4,16,64) make a load sweep on one server (default: 1)")
    p.add_argument("--slo", type=_slo, default={}, metavar="ttft=MS,itl=MS", help="objectives for goodput (requests/s meeting every one)")
    p.add_argument("--port", type=int, help="API port (default: a free one)")
    p.add_argument("--metrics-port", type=int, help="Prometheus metrics port (default: a free one; MAX's own default is a fixed 8001)")
    p.add_argument("--custom-architectures", action="append", metavar="DIR", help="custom architecture package (repeatable)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per load request")
    p.add_argument("--profiling-mode", choices=["auto", "on", "detailed", "off"], default="auto",
                   help="MODULAR_ENABLE_PROFILING for the kernel modes (auto: on, unless MAX cannot use NVTX on this GPU)")
    p.add_argument("--no-warm", action="store_true", help="skip the warm pass (the compile cache is already filled)")
    p.add_argument("--no-reference", action="store_true",
                   help="kernels mode on NVIDIA: skip the untraced reference window run first (it measures the recorder's cost on this server)")
    p.add_argument("--record-share", type=float, default=0.25, metavar="FRACTION",
                   help="kernels mode on NVIDIA: the share of each window recorded, in slices (1 records all of it, "
                        "at about 6 %% of the server's tokens/s measured on an H200; default: 0.25)")
    p.add_argument("--record-slice", type=float, default=0.5, metavar="SECONDS", help="length of one recorded slice (default: 0.5)")
    p.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT_S, help="seconds allowed until /health answers 200")
    p.add_argument("--artifacts-dir", help="keep the server log (and captures) here")
    p.add_argument("--yes", "-y", action="store_true", help="start without asking")
    _add_output_flags(p)
    p.add_argument("extra", nargs=argparse.REMAINDER, help="-- then extra `max serve` flags")
    p.set_defaults(func=cmd_serve)

    p = verb("attach", "read-only look at a running `max serve`: its metrics over a window, the GPUs, client latency with --probe, or a load sweep")
    p.add_argument("url", help="the server's API, http://HOST:PORT")
    p.add_argument("--metrics-url", help="its Prometheus endpoint (default: http://HOST:8001/metrics, MAX's default port)")
    p.add_argument("--duration", type=float, default=10.0, help="window in seconds (per concurrency level)")
    p.add_argument("--probe", action="store_true", help="send a few streaming requests of our own in the window (client TTFT / ITL)")
    p.add_argument("--concurrency", type=_levels, default=[], metavar="N[,N...]", help="drive our own closed-loop load per level (a sweep) instead")
    p.add_argument("--slo", type=_slo, default={}, metavar="ttft=MS,itl=MS", help="objectives for goodput")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request of ours")
    _add_output_flags(p)
    p.set_defaults(func=cmd_attach)

    p = verb("report", "re-analyse a saved raw capture (.json/.json.gz), show a saved report, or import any supported trace")
    p.add_argument("file", help="a --raw capture, a --json report, or an nsys / rocprofv3 / Kineto / ncu / `max generate --profile` file")
    _add_output_flags(p)
    p.set_defaults(func=cmd_report)

    p = verb("diff", "compare run B against baseline A (raw captures, reports or traces): exit 1 on a significant regression")
    p.add_argument("a", metavar="A", help="the baseline")
    p.add_argument("b", metavar="B", help="the run to judge")
    p.add_argument("--fail-above", type=float, default=5.0, metavar="PCT", help="a significant slowdown above this %% is a regression (exit 1)")
    p.add_argument("--alpha", type=float, default=0.01, help="significance level of the Mann-Whitney U test over per-step times")
    p.add_argument("--force", action="store_true", help="compare even when the runs are not comparable (model, GPU, MAX version, clocks...)")
    p.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    p.add_argument("--html", metavar="PATH", help="write the comparison as one HTML page")
    p.set_defaults(func=cmd_diff)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parse_args``, with an unknown flag reported by its verb's parser (which knows the close flags to suggest)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        verbs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        sub = verbs.choices.get(getattr(args, "verb", None) or "") if verbs is not None else None
        (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    progress = Progress(quiet=bool(argv is not None and ("-q" in argv or "--quiet" in argv)))
    previous = _on_sigterm_raise()
    try:
        parser = build_parser()
        args = parse_args(parser, argv)
        progress.quiet = bool(getattr(args, "quiet", False))
        func: Callable[[argparse.Namespace, Progress], int] = args.func
        _check_outputs(args)
        return int(func(args, progress) or 0)
    except MaxProfileError as exc:
        print(_error_lines(_one_line(exc)), file=sys.stderr)
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
        print(_error_lines(f"unexpected {type(exc).__name__}: {_one_line(exc)}; a bug in max_profile: re-run with MAX_PROFILE_DEBUG=1 "
                           "for the traceback and report it"), file=sys.stderr)
        return EXIT_UNEXPECTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        _remove_own_nvtx_log()


def _remove_own_nvtx_log() -> None:
    """The NVTX log the re-exec for ``--kernels nvtx-log`` wrote in max_profile's cache folder: read into the report (and
    the raw capture) by now, so removed, not left to pile up. A log the user pointed elsewhere is theirs."""
    from max_profile.session import attached_nvtx_log
    from max_profile.util.files import cache_dir

    path = attached_nvtx_log()
    if path and os.path.dirname(os.path.realpath(path)) == os.path.realpath(cache_dir()):
        with contextlib.suppress(OSError):
            os.remove(path)


def _on_sigterm_raise() -> Any:
    """SIGTERM raises :class:`Terminated` in the main thread (the cleanup of Ctrl-C runs for it); returns the old handler."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: object) -> None:
        raise Terminated()

    return signal.signal(signal.SIGTERM, handler)


ERROR_LINE_MAX = 200
"""The ``max-profile: error:`` line is at most this long (and the terminal's width); what does not fit goes on indented
lines below it."""


def _error_lines(message: str, prefix: str = "max-profile: error: ") -> str:
    """The error line, cut after the last clause (``; ``, then ``: ``, ``, ``, a space) that fits the terminal's width (or,
    where none does, ERROR_LINE_MAX); the rest below it, indented, one clause a line, wrapped at the width. Only a name
    longer than ERROR_LINE_MAX is ever cut."""
    import textwrap

    from max_profile.render.text import terminal_width  # rich: only when an error prints

    width = min(ERROR_LINE_MAX, terminal_width())
    if len(prefix) + len(message) <= width:
        return prefix + message
    head, rest = "", message
    for room in (width - len(prefix), ERROR_LINE_MAX - len(prefix)):
        for sep in ("; ", ": ", ", ", " "):
            cut = message.rfind(sep, 0, room)
            if cut > room // 3:
                head, rest = message[:cut + len(sep.rstrip())], message[cut + len(sep):]
                break
        if head:
            break
    if not head:
        room = ERROR_LINE_MAX - len(prefix)
        head, rest = message[:room], message[room:]
    return prefix + head + "\n" + "\n".join(
        textwrap.fill(part, width, initial_indent="  ", subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
        for part in rest.split("; "))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return " ".join(text.split()) if text else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
