"""``max-profile``: the command-line tool.

Verbs: doctor, make-model, demo, run, kernels, kernel, check-arch, serve. Every verb accepts
``--json PATH``. Exit 0 on success; on any error one line ``max-profile: error: ...`` and a
non-zero exit (2 bad input, 3 tool missing, 130 interrupted).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

EXIT_BAD_INPUT = 2
EXIT_TOOL_MISSING = 3
EXIT_INTERRUPTED = 130


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


class Progress:
    """One line per long step on stderr, with elapsed time (model build, compile, warm-up)."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            print(f"[max-profile {time.perf_counter() - self.t0:6.1f}s] {message}", file=sys.stderr, flush=True)


def _cache_root() -> Path:
    return Path(os.environ.get("MAX_PROFILE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "max_profile")))


def _write_json(report: Any, path: str | None, progress: Progress) -> None:
    if path:
        report.save(path)
        progress(f"report written to {path}")


def _print(report: Any) -> None:
    from max_profile.render.text import print_report

    print_report(report)


# ---------------------------------------------------------------------------------------------
def cmd_doctor(args: argparse.Namespace, progress: Progress) -> int:
    from max_profile.collect.environment import detect_environment
    from max_profile.model import Capture, Report

    env = detect_environment(check_tools=True)
    report = Report(environment=env, capture=Capture(started_unix_s=time.time(), target="doctor"))
    from max_profile import __version__

    report.tool_version = __version__
    _print(report)
    _write_json(report, args.json, progress)
    return 0


def cmd_make_model(args: argparse.Namespace, progress: Progress) -> int:
    from max_profile.tinymodel import ModelShape, build_tiny_llama

    shape = ModelShape(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, intermediate=args.intermediate, vocab=args.vocab)
    progress(f"building a random-weight Llama ({args.dtype}, hidden {args.hidden}, {args.layers} layers) in {args.dir}")
    try:
        path = build_tiny_llama(args.dir, dtype=args.dtype, shape=shape, architecture=args.architecture,
                                chat_template=None if args.no_chat_template else _default_template())
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    print(path)
    return 0


def _default_template() -> str:
    from max_profile.tinymodel import DEFAULT_CHAT_TEMPLATE

    return DEFAULT_CHAT_TEMPLATE


def _pick_devices(requested: str | None, vendor: str) -> str:
    if requested:
        text = requested.lower()
        if text.startswith("gpu") and vendor == "none":
            raise CliError(f"unsupported device {requested!r}: no GPU is visible here (NVML / ROCm SMI found none); use --devices cpu")
        if text != "cpu" and not text.startswith("gpu"):
            raise CliError(f"unsupported device {requested!r}: use cpu, gpu, gpu:N, gpu:N,M or gpu:all")
        return requested
    return "gpu" if vendor in ("nvidia", "amd") else "cpu"


def _ensure_nvtx_log_env(args: argparse.Namespace, progress: Progress) -> None:
    """--kernels nvtx-log needs the injection library loaded at process start: re-exec once."""
    if os.environ.get("MAX_PROFILE_NVTX_LOG") and "libmax_profile_nvtx" in os.environ.get("NVTX_INJECTION64_PATH", ""):
        return
    from max_profile.collect.nvtx_log import MAX_GPU_NVTX_PROBLEM, NvtxInjectionUnavailable, injection_env, max_profiling_usable

    devices = getattr(args, "devices", None) or "cpu"
    if not max_profiling_usable(devices):
        raise CliError(f"--kernels nvtx-log on {devices}: {MAX_GPU_NVTX_PROBLEM}. Use --kernels cupti on NVIDIA GPUs", EXIT_TOOL_MISSING)

    try:
        _cache_root().mkdir(parents=True, exist_ok=True)
        lib_env = injection_env(str(_cache_root() / "nvtx-%p.log"))
    except NvtxInjectionUnavailable as exc:
        raise CliError(str(exc), EXIT_TOOL_MISSING) from exc
    progress("restarting with the NVTX log library (MODULAR_ENABLE_PROFILING=on: first run of a shape recompiles)")
    env = {**os.environ, **lib_env}
    os.execve(sys.executable, [sys.executable, "-m", "max_profile", *sys.argv[1:]], env)


def _profile_generation(
    args: argparse.Namespace,
    progress: Progress,
    model_path: str,
    devices: str,
    env: Any,
) -> Any:
    from max_profile.runner import generate, load_model
    from max_profile.session import profile

    custom = list(args.custom_architectures or [])
    preflight = []
    for spec in custom:
        from max_profile.preflight import check_architecture

        progress(f"preflight of custom architecture {spec}")
        result = check_architecture(spec, model_path=model_path)
        preflight.append(result)
        if not result.ok:
            from rich.console import Console

            from max_profile.render.text import preflight_section

            Console(stderr=True).print(preflight_section([result]))
            failed = next(c for c in result.checks if not c.ok and c.severity == "error")
            raise CliError(f"custom architecture {spec} fails preflight: {failed.message}")
    progress(f"loading {model_path} on {devices} (a first run of a model shape compiles for minutes)")
    t = time.perf_counter()
    model = load_model(
        model_path,
        devices=devices,
        max_length=args.max_length,
        max_batch_size=max(args.batch_size, 1),
        custom_architectures=custom,
        quantization_encoding=args.quantization_encoding,
        device_graph_capture=args.device_graph_capture,
    )
    progress(f"loaded in {time.perf_counter() - t:.1f} s ({type(model.pipeline).__name__})")
    try:
        prompts = [args.prompt] * max(args.batch_size, 1)
        if args.warmup > 0:
            progress(f"warm-up: {args.warmup} token(s), not profiled")
            generate(model, prompts, args.warmup)
        kernels = args.kernels
        nvtx_log = None
        if kernels == "nvtx-log" and os.environ.get("MAX_PROFILE_NVTX_LOG"):
            from max_profile.collect.nvtx_log import log_path_for

            nvtx_log = log_path_for(os.environ["MAX_PROFILE_NVTX_LOG"])
        progress(f"profiling a generation of {args.max_new_tokens} tokens (kernels: {kernels})")
        with profile(model.pipeline, kernels=kernels, sample_interval_s=args.interval, model_path=model_path,
                     devices=devices, environment=env, nvtx_log=nvtx_log) as prof:
            generate(model, prompts, args.max_new_tokens)
        report = prof.report
        report.preflight = preflight
        if getattr(args, "raw", None):
            prof.raw_capture.save(args.raw)
            progress(f"raw capture (steps, kernels, samples) written to {args.raw}")
        return report
    finally:
        model.close()


def _add_generation_flags(p: argparse.ArgumentParser, default_tokens: int = 64) -> None:
    p.add_argument("--devices", help="cpu, gpu, gpu:N or gpu:N,M (default: gpu when one is visible, else cpu)")
    p.add_argument("--prompt", default="I believe the meaning of life is", help="prompt text")
    p.add_argument("--max-new-tokens", type=int, default=default_tokens, help="tokens to generate in the profiled run")
    p.add_argument("--batch-size", type=int, default=1, help="prompts in the batch")
    p.add_argument("--warmup", type=int, default=4, help="tokens of an unprofiled warm-up generation (0: none)")
    p.add_argument("--kernels", choices=["off", "cupti", "nvtx-log", "auto"], default="auto",
                   help="kernel recording: cupti (NVIDIA, in-process), nvtx-log (MAX's op ranges, any device), auto")
    p.add_argument("--interval", type=float, default=0.1, help="GPU sampling interval in seconds (> 0)")
    p.add_argument("--max-length", type=int, default=None, help="MAX --max-length")
    p.add_argument("--quantization-encoding", default=None, help="MAX --quantization-encoding (e.g. float32, bfloat16)")
    p.add_argument("--device-graph-capture", action="store_true", help="turn device graph capture on (hides kernels)")
    p.add_argument("--custom-architectures", action="append", metavar="DIR", help="custom architecture package (repeatable)")
    p.add_argument("--json", metavar="PATH", help="write the report as JSON")
    p.add_argument("--raw", metavar="PATH", help="also write the raw capture (steps, kernels, samples; .gz to compress)")


def _check_generation_args(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise CliError("--max-new-tokens must be >= 1")
    if not args.interval > 0:
        raise CliError("--interval must be > 0 seconds (0 makes the GPU recorder busy-loop)")
    if args.batch_size < 1:
        raise CliError("--batch-size must be >= 1")


def cmd_run(args: argparse.Namespace, progress: Progress) -> int:
    from max_profile.collect.environment import detect_environment
    from max_profile.tinymodel import is_model_folder

    _check_generation_args(args)
    problem = is_model_folder(args.model_path)
    if problem:
        raise CliError(problem)
    env = detect_environment(check_tools=True)
    devices = _pick_devices(args.devices, env.vendor)
    if args.kernels == "nvtx-log":
        _ensure_nvtx_log_env(args, progress)
    if args.kernels == "auto":
        args.kernels = "cupti" if env.vendor == "nvidia" else "off"
    report = _profile_generation(args, progress, args.model_path, devices, env)
    _print(report)
    _write_json(report, args.json, progress)
    return 0


def cmd_demo(args: argparse.Namespace, progress: Progress) -> int:
    from max_profile.collect.environment import detect_environment
    from max_profile.tinymodel import ModelShape, build_tiny_llama

    _check_generation_args(args)
    env = detect_environment(check_tools=True)
    devices = _pick_devices(args.devices, env.vendor)
    on_gpu = devices.startswith("gpu")
    if args.kernels == "nvtx-log":
        _ensure_nvtx_log_env(args, progress)
    if args.kernels == "auto":
        args.kernels = "cupti" if env.vendor == "nvidia" else "off"
    dtype: Literal["float32", "bfloat16"] = "bfloat16" if on_gpu else "float32"
    if on_gpu:
        hidden = args.hidden or 2048
        heads = max(hidden // 128, 1)
        shape = ModelShape(hidden=hidden, layers=args.layers or 4, heads=heads, kv_heads=max(heads // 4, 1), intermediate=int(hidden * 2.75))
    else:
        shape = ModelShape(hidden=args.hidden or 64, layers=args.layers or 2)
    folder = _cache_root() / "models" / f"demo-llama-{dtype}-h{shape.hidden}-l{shape.layers}"
    if not (folder / "model.safetensors").exists():
        progress(f"building the demo model ({dtype}, hidden {shape.hidden}, {shape.layers} layers) in {folder}")
        build_tiny_llama(folder, dtype=dtype, shape=shape)
    report = _profile_generation(args, progress, str(folder), devices, env)
    _print(report)
    _write_json(report, args.json, progress)
    return 0


def cmd_kernels(args: argparse.Namespace, progress: Progress) -> int:
    if args.import_file:
        from max_profile.collect import imports

        try:
            report = imports.import_trace(args.import_file)
        except imports.ImportFormatError as exc:
            raise CliError(str(exc)) from exc
        _print(report)
        _write_json(report, args.json, progress)
        return 0
    if not args.model_path:
        raise CliError("kernels needs --model-path P (run a generation) or --import FILE (read an existing trace)")
    if args.backend == "nsys":
        from max_profile.collect import nsys

        report = nsys.profile_generation_with_nsys(args, progress)
        _print(report)
        _write_json(report, args.json, progress)
        return 0
    if args.backend == "rocprof":
        raise CliError("run the generation under rocprofv3 yourself (rocprofv3 --kernel-trace --marker-trace --output-format csv -d OUT -- "
                       "max-profile run --model-path P --kernels off) and read it with `max-profile kernels --import OUT/<host>/<pid>_kernel_trace.csv`",
                       EXIT_BAD_INPUT)
    args.kernels = "cupti" if args.backend == "cupti" else "nvtx-log"
    return cmd_run(args, progress)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="max-profile", description="Profile models run with Modular's MAX: utilization, kernels by phase, single-kernel deep dives.")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = sub.add_parser("doctor", help="what this machine has: GPU vendor, profilers (with install commands), MAX version")
    p.add_argument("--json", metavar="PATH")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("make-model", help="build a random-weight Llama model in HF format, offline")
    p.add_argument("dir")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=None)
    p.add_argument("--vocab", type=int, default=320)
    p.add_argument("--architecture", default="LlamaForCausalLM", help="config.json architectures[0]")
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--json", metavar="PATH", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_make_model)

    p = sub.add_parser("demo", help="build a tiny model, warm up, profile a generation on the best device, print the report")
    _add_generation_flags(p)
    p.add_argument("--hidden", type=int, default=None, help="demo model hidden size (default: 64 on CPU, 2048 on GPU)")
    p.add_argument("--layers", type=int, default=None, help="demo model layers (default: 2 on CPU, 4 on GPU)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("run", help="profile a generation of a local model")
    p.add_argument("--model-path", required=True)
    _add_generation_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("kernels", help="kernel breakdown by family and phase (run a generation, or --import a trace)")
    p.add_argument("--model-path")
    p.add_argument("--backend", choices=["cupti", "nsys", "nvtx-log", "rocprof"], default="cupti")
    p.add_argument("--import", dest="import_file", metavar="FILE", help="nsys .sqlite/.nsys-rep/stats CSV, rocprofv3 CSV/rocpd db, Kineto JSON, or `max generate --profile` output")
    _add_generation_flags(p)
    p.set_defaults(func=cmd_kernels)

    _add_optional_verbs(sub)
    return parser


def _add_optional_verbs(sub: Any) -> None:
    """Verbs whose modules register themselves (kernel deep dive, preflight, serve)."""
    for module in ("max_profile.collect.ncu", "max_profile.preflight", "max_profile.serve"):
        try:
            mod = __import__(module, fromlist=["register_cli"])
        except ImportError:
            continue
        register: Callable[[Any], None] | None = getattr(mod, "register_cli", None)
        if register is not None:
            register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    progress = Progress(quiet=args.quiet)
    try:
        return int(args.func(args, progress) or 0)
    except CliError as exc:
        print(f"max-profile: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("max-profile: interrupted (Ctrl-C); everything this command started was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - one clear line, never a traceback
        from max_profile.runner import RunnerError

        name = "" if isinstance(exc, (RunnerError, ValueError, OSError)) else f"{type(exc).__name__}: "
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"max-profile: error: {name}{msg}", file=sys.stderr)
        if os.environ.get("MAX_PROFILE_DEBUG"):
            raise
        return 1


if __name__ == "__main__":
    sys.exit(main())
