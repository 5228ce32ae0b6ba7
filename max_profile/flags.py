"""The command line's verbs and flags: one parser, its help, its checks of flag values (``max-profile VERB --help``).

:func:`build_parser` is the whole grammar; :mod:`max_profile.cli` maps each verb to the function that runs it. A bad
flag is an :class:`~max_profile.errors.InputError` (exit 2) with the verb's close flags suggested.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Sequence
from typing import Any

from max_profile.defaults import DEFAULT_KERNEL_SHARE, PREFLIGHT_TIMEOUT_S, READY_TIMEOUT_S
from max_profile.errors import InputError
from max_profile.model.kernel_modes import BACKENDS, IN_PROCESS_MODES
from max_profile.render.outputs import OUTPUTS
from max_profile.serve.modes import SERVE_MODES


class Parser(argparse.ArgumentParser):
    """argparse with the project's error line and exit code for bad flags."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        verb = self.prog.split(" ", 1)[1] if " " in self.prog else ""  # "max-profile run" -> "run"
        message += self._hint(message)
        raise InputError(f"{verb}: {message}" if verb else message)

    def _hint(self, message: str) -> str:
        """A verb list for a missing verb; for an unknown flag, the close ones this verb takes (``--tokens``:
        ``--max-new-tokens``)."""
        if "required: VERB" in message:
            verbs = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
            return (
                f" (one of: {', '.join(verbs.choices)}; `max-profile VERB --help` for each)"
                if verbs is not None
                else ""
            )
        unknown = [
            w.split("=")[0] for w in message.removeprefix("unrecognized arguments:").split() if w.startswith("--")
        ]
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


def add_output_flags(p: argparse.ArgumentParser, raw: bool = True) -> None:
    for o in OUTPUTS:
        if not raw and o.name not in ("text", "json", "html"):
            continue
        if o.takes_path:
            p.add_argument(f"--{o.name}", metavar="PATH", help=o.help)
        else:
            p.add_argument(f"--{o.name}", action="store_true", help=o.help)


def add_generation_flags(p: argparse.ArgumentParser, default_tokens: int = 64) -> None:
    p.add_argument("--devices", help="cpu, gpu, gpu:N, gpu:N,M or gpu:all (default: gpu when one is visible, else cpu)")
    p.add_argument("--prompt", default="I believe the meaning of life is", help="prompt text")
    p.add_argument("--max-new-tokens", type=int, default=default_tokens, help="tokens to generate in the profiled run")
    p.add_argument("--batch-size", type=int, default=1, help="prompts in the batch")
    p.add_argument("--warmup", type=int, default=4, help="tokens of an unprofiled warm-up generation (0: none)")
    p.add_argument(
        "--kernels",
        choices=list(IN_PROCESS_MODES),
        default="auto",
        help="kernel recording: cupti (NVIDIA, in-process), nvtx-log (MAX's op ranges, any device; device graphs off), "
        "ops (MAX's ops joined to the CUPTI kernels they launch, NVIDIA; profiling on, device graphs off), off; "
        "auto (every verb): cupti on an NVIDIA GPU, nvtx-log on the CPU (off when its library cannot be built), off on "
        "another vendor's GPU (nvtx-log would turn its device graphs off)",
    )
    p.add_argument(
        "--kernel-share",
        type=float,
        default=None,
        metavar="SHARE",
        help="with cupti: the share of steps recorded, in slices of 8 steps, the first from the start (default 0.0625: "
        "on an H200 each recorded step cost 13-14 %% of its throughput, so a sixteenth costs under 1 %%; "
        "1: every step)",
    )
    p.add_argument("--interval", type=float, default=0.1, help="GPU sampling interval in seconds (> 0)")
    p.add_argument("--max-length", type=int, default=None, help="MAX --max-length")
    p.add_argument("--quantization-encoding", default=None, help="MAX --quantization-encoding (e.g. float32, bfloat16)")
    p.add_argument(
        "--device-graph-capture",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="force device graph capture on / off (default: MAX decides, as `max generate` does: on for supported "
        "architectures on a GPU; CUPTI and nsys record the kernels inside the graphs)",
    )
    p.add_argument(
        "--custom-architectures", action="append", metavar="DIR", help="custom architecture package (repeatable)"
    )
    add_output_flags(p)


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """Help with each option's default shown (only where it has one worth saying)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.default is None
            or action.default is False
            or action.default == argparse.SUPPRESS
            or action.default in ([], {})
            or "%(default)" in text
            or "default" in text
        ):
            return text
        return super()._get_help_string(action) or text


def levels(text: str) -> list[int]:
    """``--concurrency 1,4,16``."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected concurrency levels like 1,4,16") from None
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError(f"{text!r}: levels must be whole numbers >= 1")
    return levels


def slo(text: str) -> dict[str, float]:
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


def _doctor_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", help="write the findings as JSON (the environment section of a report)")
    p.add_argument("--html", metavar="PATH", help="write them as one HTML page")


def _make_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="folder to write (created with its parents)")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float8_e4m3fn"],
        default="float32",
        help="weights: float32 (CPU), bfloat16 (GPU), float8_e4m3fn (block-scaled FP8, quant_method fp8, 128x128 "
        "blocks; GPU)",
    )
    p.add_argument("--hidden", type=int, default=64, help="hidden size")
    p.add_argument("--layers", type=int, default=2, help="decoder layers")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--kv-heads", type=int, default=2, help="key / value heads (grouped-query attention)")
    p.add_argument("--intermediate", type=int, default=None, help="MLP intermediate size (default: 2 x hidden)")
    p.add_argument("--vocab", type=int, default=320, help="tokenizer vocabulary to train")
    p.add_argument("--architecture", default="LlamaForCausalLM", help="config.json architectures[0]")
    p.add_argument("--no-chat-template", action="store_true", help="write no chat template (a base model)")


def _demo_flags(p: argparse.ArgumentParser) -> None:
    add_generation_flags(p)
    p.add_argument("--hidden", type=int, default=None, help="demo model hidden size (default: 64 on CPU, 2048 on GPU)")
    p.add_argument("--layers", type=int, default=None, help="demo model layers (default: 2 on CPU, 4 on GPU)")
    p.add_argument("--out", default="max-profile-demo", help="folder for report.json, report.html and raw.json.gz")


def _run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", required=True, help="local Hugging Face model folder")
    add_generation_flags(p)


def _startup_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", required=True, help="local Hugging Face model folder")
    add_generation_flags(p, default_tokens=1)


def _kernels_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", help="local model folder (or --import FILE)")
    p.add_argument(
        "--backend",
        choices=list(BACKENDS),
        default="cupti",
        help="cupti: in-process recorder (NVIDIA); nsys: a run under Nsight Systems; nvtx-log: MAX's op ranges (any "
        "device); ops: MAX's ops joined to the CUPTI kernels they launched (NVIDIA)",
    )
    p.add_argument(
        "--import",
        dest="import_file",
        metavar="FILE",
        help="nsys .sqlite/.nsys-rep/stats CSV, rocprofv3 CSV/rocpd db, Kineto JSON, `max generate --profile` output, "
        "or a raw capture",
    )
    add_generation_flags(p)


def _kernel_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "name",
        nargs="?",
        help="kernel name (hash suffix ignored) or regex (regex:...) — required for a run: ncu never profiles every "
        "kernel here",
    )
    p.add_argument("--model-path", help="local model folder")
    p.add_argument("--devices", default=None, help="default: gpu")
    p.add_argument("--launches", "-c", type=int, default=3, help="launches to profile (1..20)")
    p.add_argument(
        "--launch-skip", type=int, default=16, help="matching launches to skip first (past prefill into decode)"
    )
    p.add_argument("--set", default="full", choices=["basic", "full"], help="ncu section set")
    p.add_argument("--max-new-tokens", type=int, default=24, help="tokens of the generation run under ncu")
    p.add_argument("--batch-size", type=int, default=1, help="prompts in the batch of the generation run under ncu")
    p.add_argument(
        "--prompt", default="I believe the meaning of life is", help="prompt text of the generation run under ncu"
    )
    p.add_argument("--max-length", type=int, default=None, help="MAX --max-length")
    p.add_argument("--quantization-encoding", default=None, help="MAX --quantization-encoding (e.g. float32, bfloat16)")
    p.add_argument(
        "--custom-architectures", action="append", metavar="DIR", help="custom architecture package (repeatable)"
    )
    p.add_argument(
        "--device-graph-capture",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="device graphs in the profiled generation (default off: ncu replays each launch, and MAX 26.7 "
        "capturing graphs under ncu crashed on an H200)",
    )
    p.add_argument("--timeout", type=float, default=1800, help="seconds before the ncu run is stopped")
    p.add_argument("--output-dir", help="where the .ncu-rep and CSVs go (default: a temp folder)")
    p.add_argument(
        "--suggest-from",
        metavar="REPORT_JSON",
        help="a kernels report whose names are suggested when the regex matches nothing",
    )
    p.add_argument(
        "--import",
        dest="import_file",
        metavar="CSV",
        help="an existing `ncu --csv --page details` output, or a .ncu-rep report (read through ncu) (no NAME needed)",
    )
    p.add_argument("--import-raw", metavar="CSV", help="the matching `--page raw` output (stall reasons, roofline)")
    add_output_flags(p)


def _check_arch_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="+", help="package folder or IMPORT_PATH:MODULE, as given to --custom-architectures")
    p.add_argument("--model-path", help="the model folder that will use it (checks config.json and the tokenizer)")
    p.add_argument("--serve", action="store_true", help="also check what `max serve` needs (chat template, embeddings)")
    p.add_argument("--max-length", type=int, help="--max-length that will be used (predicts PromptTooLongError)")
    p.add_argument("--timeout", type=float, default=PREFLIGHT_TIMEOUT_S, help="seconds allowed for the package import")
    p.add_argument("--json", metavar="PATH", help="write every check as JSON")


def _serve_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", required=True, help="local model folder to serve")
    p.add_argument("--devices", help="cpu, gpu, gpu:N ... (default: gpu when one is visible, else cpu)")
    p.add_argument(
        "--mode",
        choices=list(SERVE_MODES),
        default="utilization",
        help="; ".join(f"{m.name}: {m.summary}" for m in SERVE_MODES.values()),
    )
    p.add_argument(
        "--duration",
        type=float,
        default=10.0,
        help="capture window in seconds, per concurrency level (about 10 s shows the kernel mix)",
    )
    p.add_argument(
        "--concurrency",
        type=levels,
        default=[1],
        metavar="N[,N...]",
        help="requests in flight (closed loop); several levels (1,4,16,64) make a load sweep on one server "
        "(default: 1)",
    )
    p.add_argument(
        "--slo",
        type=slo,
        default={},
        metavar="ttft=MS,itl=MS",
        help="objectives for goodput (requests/s meeting every one)",
    )
    p.add_argument("--port", type=int, help="API port (default: a free one)")
    p.add_argument(
        "--metrics-port",
        type=int,
        help="Prometheus metrics port (default: a free one; MAX's own default is a fixed 8001)",
    )
    p.add_argument(
        "--custom-architectures", action="append", metavar="DIR", help="custom architecture package (repeatable)"
    )
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per load request")
    p.add_argument(
        "--profiling-mode",
        choices=["auto", "on", "detailed", "off"],
        default="auto",
        help="MODULAR_ENABLE_PROFILING for the kernel modes (auto: off where CUPTI records the worker, as a plain max "
        "serve runs; on where MAX's op ranges are needed and MAX can use NVTX here)",
    )
    p.add_argument("--no-warm", action="store_true", help="skip the warm pass (the compile cache is already filled)")
    p.add_argument(
        "--spans",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="MAX's OTLP spans (a max.batch per pass, max.request) to a receiver of ours; turns MAX's telemetry on for "
        "the server (default: on, except in the kernels and ops modes, whose worker hook stamps every pass itself)",
    )
    p.add_argument(
        "--no-reference",
        action="store_true",
        help="kernels mode on NVIDIA: skip the untraced reference window run first (it measures the recorder's cost on "
        "this server)",
    )
    p.add_argument(
        "--record-share",
        type=float,
        default=DEFAULT_KERNEL_SHARE,
        metavar="FRACTION",
        help="kernels mode on NVIDIA: the share of each window recorded, in slices (1 records all of it; "
        f"default: {DEFAULT_KERNEL_SHARE:g}, the in-process default's share)",
    )
    p.add_argument(
        "--record-slice", type=float, default=0.5, metavar="SECONDS", help="length of one recorded slice (default: 0.5)"
    )
    p.add_argument(
        "--ready-timeout", type=float, default=READY_TIMEOUT_S, help="seconds allowed until /health answers 200"
    )
    p.add_argument("--artifacts-dir", help="keep the server log (and captures) here")
    p.add_argument("--yes", "-y", action="store_true", help="start without asking")
    add_output_flags(p)
    p.add_argument("extra", nargs=argparse.REMAINDER, help="-- then extra `max serve` flags")


def _attach_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "url", nargs="+", help="the server's API, http://HOST:PORT (several: one window over all, probes to each)"
    )
    p.add_argument(
        "--metrics-url", help="its Prometheus endpoint (default: http://HOST:8001/metrics, MAX's default port)"
    )
    p.add_argument("--duration", type=float, default=10.0, help="window in seconds (per concurrency level)")
    p.add_argument(
        "--probe",
        action="store_true",
        help="send a few streaming requests of our own in the window (client TTFT / ITL)",
    )
    p.add_argument(
        "--concurrency",
        type=levels,
        default=[],
        metavar="N[,N...]",
        help="drive our own closed-loop load per level (a sweep) instead",
    )
    p.add_argument("--slo", type=slo, default={}, metavar="ttft=MS,itl=MS", help="objectives for goodput")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request of ours")
    p.add_argument(
        "--otlp",
        metavar="[HOST:]PORT",
        help="receive the servers' OpenTelemetry spans here for the window (127.0.0.1 unless HOST): every forward "
        "pass and request from MAX's own spans, per replica; prints the server / Collector settings that send them",
    )
    p.add_argument(
        "--otlp-save",
        metavar="FILE",
        help="with --otlp: keep every span received in FILE as a Collector's file exporter writes it (JSON lines)",
    )
    add_output_flags(p)


def _report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "file",
        help="a --raw capture, a --json report, or an nsys / rocprofv3 / Kineto / ncu / `max generate --profile` file",
    )
    add_output_flags(p)


def _diff_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="the baseline")
    p.add_argument("b", metavar="B", help="the run to judge")
    p.add_argument(
        "--fail-above",
        type=float,
        default=5.0,
        metavar="PCT",
        help="a significant slowdown above this %% is a regression (exit 1)",
    )
    p.add_argument(
        "--alpha", type=float, default=0.01, help="significance level of the Mann-Whitney U test over per-step times"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="compare even when the runs are not comparable (model, GPU, MAX version, clocks...)",
    )
    p.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    p.add_argument("--html", metavar="PATH", help="write the comparison as one HTML page")


VERBS: tuple[tuple[str, str, Callable[[argparse.ArgumentParser], None]], ...] = (
    (
        "doctor",
        "what this machine has and what a capture will use: GPUs, driver, MAX, profilers with install commands, "
        "samplers, output libraries",
        _doctor_flags,
    ),
    (
        "make-model",
        "build a random-weight Llama model in HF format (config, safetensors, tokenizer trained locally), offline",
        _make_model_flags,
    ),
    ("demo", "build a tiny model, warm up, profile a generation on the best device, print the report", _demo_flags),
    ("run", "profile a generation of a local model", _run_flags),
    (
        "startup",
        "where the time before the first token goes: imports, config, each graph's compile (cache hit or miss, and "
        "why), weights, KV cache, device graphs, warm-up",
        _startup_flags,
    ),
    ("kernels", "kernel breakdown by family and phase (run a generation, or --import a trace)", _kernels_flags),
    (
        "kernel",
        "why is this kernel slow: a targeted Nsight Compute run (or --import an ncu CSV / .ncu-rep)",
        _kernel_flags,
    ),
    ("check-arch", "preflight a --custom-architectures package before the long load", _check_arch_flags),
    (
        "serve",
        "profile `max serve`: plan, confirm, warm, capture under a streaming load (one concurrency or a sweep), clean "
        "up",
        _serve_flags,
    ),
    (
        "attach",
        "read-only look at a running `max serve`: its metrics over a window, the GPUs, client latency with --probe, or "
        "a load sweep",
        _attach_flags,
    ),
    (
        "report",
        "re-analyse a saved raw capture (.json/.json.gz), show a saved report, or import any supported trace",
        _report_flags,
    ),
    (
        "diff",
        "compare run B against baseline A (raw captures, reports or traces): exit 1 on a significant regression, 5 "
        "when it could not judge (inconclusive)",
        _diff_flags,
    ),
)
"""Every verb: its name, its help (also its description), and what adds its flags."""


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument(
        "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress lines on stderr"
    )
    parser = Parser(
        prog="max-profile",
        description="Profile models run with Modular's MAX: utilization, kernels by phase, single-kernel deep dives.",
        formatter_class=Help,
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB", parser_class=Parser)

    def verb(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, parents=[common], formatter_class=Help)

    for name, help_text, add_flags in VERBS:
        add_flags(verb(name, help_text))
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parse_args``, with an unknown flag reported by its verb's parser (which knows the close flags to suggest)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        verbs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        sub = verbs.choices.get(getattr(args, "verb", None) or "") if verbs is not None else None
        (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    check_values(args)
    return args


def check_values(args: argparse.Namespace) -> None:
    """The checks of flag values a type cannot make alone (ranges, with the verb's wording); serve's pass-through
    arguments without their leading ``--``."""
    if args.verb == "serve":
        extra = list(args.extra or [])
        args.extra = extra[1:] if extra[:1] == ["--"] else extra
        if not args.duration > 0:
            raise InputError("--duration must be > 0 seconds")
        if not 0 < args.record_share <= 1:
            raise InputError(
                f"--record-share must be above 0 and at most 1 (a fraction of each window), not {args.record_share:g}"
            )
        if not args.record_slice > 0:
            raise InputError(f"--record-slice must be > 0 seconds, not {args.record_slice:g}")
    if args.verb == "diff":
        if not args.fail_above >= 0:
            raise InputError("--fail-above must be >= 0 (a percentage)")
        if not 0 < args.alpha < 1:
            raise InputError("--alpha must be between 0 and 1")
