"""A newcomer's first hour on a CPU machine, each case as it was first hit: unwritable outputs fail before
any work (exit 2, naming the path), a kernel recorder that cannot record fails (exit 4), SIGTERM ends a run like Ctrl-C
(exit 143, one line), no child prints a traceback, check-arch warns when the model runs the built-in, reports fit 80
columns without cut figures, the HTML page's legends and ticks, -q after the verb, help text for every option.

Unwritable folder: ``/proc`` refuses new files even to root (a ``chmod`` does not stop root; CI may run as root)."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from max_profile.analyze.report import build_report
from max_profile.model import KernelBreakdown, RawCapture, Report
from max_profile.render.text import render_text
from max_profile.util.procs import clean_child_env

from ..conftest import DATA, REPO, default_sigint, error_message, run_cli

SMALL_RAW = DATA / "gpu" / "h200_llama180m_host_bound" / "small_cupti_raw.json.gz"
GOOD_ARCH = REPO / "custom_archs" / "llama_custom"
UNWRITABLE = "/proc"


def _one_error_line(stderr: str) -> str:
    message = error_message(stderr)
    assert "unexpected" not in message, stderr
    return message


@pytest.mark.parametrize(
    "args",
    [
        ["report", str(SMALL_RAW), "--json", f"{UNWRITABLE}/r.json"],
        ["report", str(SMALL_RAW), "--html", f"{UNWRITABLE}/r.html"],
        ["report", str(SMALL_RAW), "--perfetto", f"{UNWRITABLE}/t.pftrace"],
        ["report", str(SMALL_RAW), "--raw", f"{UNWRITABLE}/raw.json.gz"],
        ["report", str(SMALL_RAW), "--text", f"{UNWRITABLE}/r.txt"],
        ["diff", str(SMALL_RAW), str(SMALL_RAW), "--html", f"{UNWRITABLE}/d.html"],
        ["diff", str(SMALL_RAW), str(SMALL_RAW), "--json", f"{UNWRITABLE}/d.json"],
        ["check-arch", str(GOOD_ARCH), "--json", f"{UNWRITABLE}/c.json"],
        ["doctor", "--json", f"{UNWRITABLE}/d.json"],
        ["make-model", f"{UNWRITABLE}/m"],
    ],
    ids=lambda a: " ".join(a[:1] + [x for x in a if x.startswith("--")] or a[:1]),
)
def test_unwritable_output_is_exit_2_naming_the_path(args: list[str]) -> None:
    res = run_cli(*args, timeout=120)
    assert res.returncode == 2, res.stderr
    assert UNWRITABLE in _one_error_line(res.stderr)


def test_write_output_says_the_real_error() -> None:
    """The temporary file's clean-up in the error path must not mask why the write failed."""
    from max_profile.errors import InputError
    from max_profile.util.files import write_output

    with pytest.raises(
        InputError, match=r"/proc/x\.json: cannot write \((No such file|Permission denied|Operation not permitted)"
    ):
        write_output(f"{UNWRITABLE}/x.json", b"{}")


@pytest.mark.max
def test_unwritable_run_output_fails_before_the_load(tiny_model_dir: Path) -> None:
    res = run_cli(
        "run", "--model-path", str(tiny_model_dir), "--devices", "cpu", "--json", f"{UNWRITABLE}/r.json", timeout=120
    )
    assert res.returncode == 2 and UNWRITABLE in _one_error_line(res.stderr)
    assert "loading" not in res.stderr  # refused before the model load, not after minutes of it


@pytest.mark.parametrize(
    "args", [["kernels", "--backend", "cupti"], ["run", "--kernels", "cupti"]], ids=["kernels", "run"]
)
def test_cupti_without_an_nvidia_gpu_is_exit_2_before_the_load(args: list[str], tiny_model_dir: Path) -> None:
    """A flag that cannot work on this machine is bad input (exit 2, as the README maps bad flags), said before any
    load."""
    res = run_cli(*args, "--model-path", str(tiny_model_dir), "--devices", "cpu", timeout=120)
    assert res.returncode == 2, res.stderr
    line = _one_error_line(res.stderr)
    assert "cupti" in line and "NVIDIA" in line and "--kernels nvtx-log" in line
    assert "loading" not in res.stderr


@pytest.mark.max
def test_sigterm_during_a_run_is_exit_143_with_one_line(tiny_model_dir: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "max_profile",
        "run",
        "--model-path",
        str(tiny_model_dir),
        "--devices",
        "cpu",
        "--max-new-tokens",
        "1900",
        "--batch-size",
        "8",
        "--kernels",
        "off",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
        env=clean_child_env(),
        start_new_session=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "profiling a generation" in line:  # loaded and warmed up: the profiled generation (seconds of it) starts now
            break
    time.sleep(0.3)
    assert proc.poll() is None, "the generation ended before the signal: make it longer"
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    err = "".join(seen) + proc.stderr.read()
    assert rc == 143, err
    assert time.monotonic() - t < 30
    assert "terminated (SIGTERM)" in err and "Traceback" not in err
    assert len([ln for ln in err.splitlines() if ln.startswith("max-profile:")]) == 1


def test_children_started_for_the_gpu_recorder_ignore_ctrl_c() -> None:
    """MAX's GPU recorder child is started inside this guard: Ctrl-C to the terminal's process group reaches only us
    (which stops the recorder), not the child (which otherwise prints a KeyboardInterrupt traceback)."""
    from max_profile.collect.live.gpu_sampling import _child_ignores_ctrl_c

    code = (
        "import time\ntry:\n    print('READY', flush=True)\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    "
        "print('INTERRUPTED', flush=True)\n    raise\n"
    )
    with default_sigint(), _child_ignores_ctrl_c():
        guarded = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    with default_sigint():
        plain = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    for p in (guarded, plain):  # each says READY inside its try: its handler is in place (no sleep to win a race)
        assert p.stdout is not None and p.stdout.readline().strip() == "READY"
    for p in (guarded, plain):
        p.send_signal(signal.SIGINT)
    out, err = plain.communicate(timeout=20)
    assert "INTERRUPTED" in out and "KeyboardInterrupt" in err  # the control: an unguarded child prints the traceback
    time.sleep(0.5)
    assert guarded.poll() is None  # the guarded child did not see Ctrl-C
    guarded.kill()
    out, err = guarded.communicate(timeout=20)
    assert "INTERRUPTED" not in out and "Traceback" not in err


def test_check_arch_warns_when_the_model_runs_the_builtin(tmp_path: Path) -> None:
    from max_profile.preflight import check_architecture
    from max_profile.tinymodel import build_tiny_llama

    model = build_tiny_llama(
        tmp_path / "m", architecture="LlamaForCausalLM"
    )  # the built-in's name; the package registers another
    result = check_architecture(str(GOOD_ARCH), model_path=str(model))
    warned = [c for c in result.checks if c.id == "model-arch-not-custom"]
    assert warned and warned[0].severity == "warning" and "the custom code is never used" in warned[0].message
    assert "MaxProfileLlamaForCausalLM" in (warned[0].fix or "")
    res = run_cli("check-arch", str(GOOD_ARCH), "--model-path", str(model), timeout=300)
    assert "custom code is never used" in " ".join(
        re.sub(r"[│╭╮╰╯─]", " ", res.stdout).split()
    )  # the panel wraps lines


REPORTS = {
    "h200 run": lambda: build_report(RawCapture.load(str(SMALL_RAW))),
    "h200 batch 32": lambda: build_report(
        RawCapture.load(str(DATA / "gpu" / "h200_llama5b_every_verb" / "run_b32_raw.json.gz"))
    ),
    "cpu serve sweep": lambda: build_report(RawCapture.load(str(DATA / "cpu" / "serve_sweep_c1_c2_raw.json.gz"))),
    "cpu startup": lambda: Report.load(str(DATA / "cpu" / "startup" / "startup_cold.json")),
}


@pytest.mark.parametrize("name", list(REPORTS))
def test_text_report_fits_80_columns_without_cutting_figures(name: str) -> None:
    text = render_text(REPORTS[name](), width=80)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in text, next(line for line in lines if "…" in line)


def test_cpu_op_breakdown_says_what_its_columns_measure() -> None:
    """MAX's op ranges on a CPU are host time, not GPU time: no 'GPU busy' column, the coverage named as such."""
    import msgspec

    report = build_report(RawCapture.load(str(SMALL_RAW)))
    k = report.kernels
    assert k is not None and not isinstance(k, str)
    cpu = msgspec.structs.replace(
        report, kernels=msgspec.structs.replace(k, source="nvtx-log (MAX op ranges, host time)")
    )  # type: ignore[type-var]
    text = render_text(cpu, width=120)
    assert "GPU busy" not in text and "MAX ops cover" in text


def test_quiet_is_accepted_after_the_verb(tmp_path: Path) -> None:
    res = run_cli("report", str(SMALL_RAW), "-q", "--json", str(tmp_path / "r.json"), timeout=120)
    assert res.returncode == 0, res.stderr
    assert not [ln for ln in res.stderr.splitlines() if ln.startswith("[max-profile")]
    loud = run_cli("report", str(SMALL_RAW), "--json", str(tmp_path / "r.json"), timeout=120)
    assert [ln for ln in loud.stderr.splitlines() if ln.startswith("[max-profile")]


def test_every_option_has_help_and_shows_its_default() -> None:
    from max_profile.flags import build_parser

    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in verbs.choices.items():
        for action in sub._actions:
            if action.option_strings and action.help != argparse.SUPPRESS:
                assert action.help, f"{name} {action.option_strings[0]} has no help text"
        shown = sub.format_help()
        options = shown[shown.index("options:") :]
        for action in sub._actions:
            empty = isinstance(action.default, (list, dict, tuple, str)) and not action.default
            if (
                action.option_strings
                and action.default not in (None, False, argparse.SUPPRESS)
                and not empty
                and action.help != argparse.SUPPRESS
            ):
                flag = max(action.option_strings, key=len)
                m = re.search(rf"\n  (?:-[^\n]*?, )?{re.escape(flag)}\b", options)
                assert m, f"{name} {flag} not in its help"
                entry = options[m.start() + 1 :]
                end = re.search(r"\n  -", entry) or re.search(r"$", entry)
                entry = entry[: end.start()]  # type: ignore[union-attr]
                assert "default:" in entry, f"{name} {flag}: default {action.default!r} not shown"


def test_html_legends_sit_beside_the_data_and_counts_have_integer_ticks() -> None:
    from bokeh.models import AdaptiveTicker, Legend, Plot

    from max_profile.render import html

    serve = build_report(
        RawCapture.load(str(DATA / "gpu" / "h200_llama5b_cupti_recorder" / "serve_kernels_raw.json.gz"))
    )
    run = build_report(RawCapture.load(str(DATA / "gpu" / "h200_llama5b_cupti_recorder" / "run_cupti_raw.json.gz")))
    sweep = build_report(RawCapture.load(str(DATA / "cpu" / "serve_sweep_c1_c2_raw.json.gz")))
    layouts = [
        html._steps_plot(run),
        html._utilization_plots(run),
        html._family_plots(run.kernels),
        html._sweep_plots(sweep),
    ]
    plots = [p for lay in layouts if not isinstance(lay, str) for p in lay.select({"type": Plot})]
    with_legend = [p for p in plots if p.select({"type": Legend})]
    assert len(with_legend) >= 4
    for plot in with_legend:
        assert not [r for r in plot.center if isinstance(r, Legend)], f"{plot.title.text}: legend over the data"
        assert [r for r in plot.right if isinstance(r, Legend)], f"{plot.title.text}: legend not beside the plot"
    # the family legend names every family the heat map shows
    k = run.kernels
    assert isinstance(k, KernelBreakdown)
    families = {r.family for p in k.phases for r in p.families} | {f for step in k.per_step for f in step.families}
    bars = next(p for p in plots if (p.title.text or "").startswith("Kernel time by family"))
    labels = {item.label.value for legend in bars.select({"type": Legend}) for item in legend.items}
    assert families <= labels, families - labels
    hist = html._serve_plots(serve)
    assert not isinstance(hist, str)
    for plot in hist.select({"type": Plot}):
        ticker = plot.yaxis[0].ticker
        assert isinstance(ticker, AdaptiveTicker) and ticker.min_interval == 1, "counts need integer ticks"
    summary = html._summary(serve)
    for figure in ("TTFT", "ITL", "tok/s"):
        assert figure in summary


def test_examples_and_preflight_leave_nothing_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass-through chat template lives in max_profile's cache folder, not a fixed /tmp file two users would
    share."""
    import tempfile

    from max_profile.preflight import check_architecture
    from max_profile.tinymodel import build_tiny_llama

    monkeypatch.setenv("MAX_PROFILE_CACHE", str(tmp_path / "cache"))
    model = build_tiny_llama(tmp_path / "m", architecture="MaxProfileLlamaForCausalLM", chat_template=None)
    before = set(os.listdir(tempfile.gettempdir()))
    result = check_architecture(str(GOOD_ARCH), model_path=str(model), serve=True)
    template = next(c for c in result.checks if c.id == "chat-template")
    path = (template.fix or "").split()[1]
    assert path.startswith(str(tmp_path / "cache")), path
    new = {n for n in set(os.listdir(tempfile.gettempdir())) - before if not n.startswith(("pytest-", "tmp"))}
    assert not new, new


def test_unknown_flags_suggest_the_close_ones_and_a_bare_call_lists_the_verbs() -> None:
    res = run_cli("run", "--model-path", "M", "--tokens", "5", timeout=60)
    assert res.returncode == 2 and "--tokens: did you mean --max-new-tokens" in res.stderr, res.stderr
    res = run_cli("kernel", "gemv", "--lanches", "3", timeout=60)
    assert res.returncode == 2 and "did you mean --launches" in res.stderr, res.stderr
    res = run_cli(timeout=60)
    assert res.returncode == 2 and "one of: doctor, make-model, demo, run" in error_message(res.stderr), res.stderr


def test_reports_take_the_terminal_width() -> None:
    """`print(prof.report)` and `--text` files take the terminal's width (COLUMNS), as the CLI does; never under 80."""
    import os
    import subprocess

    code = (
        "from max_profile.model import RawCapture; from max_profile import build_report; "
        f"print(build_report(RawCapture.load({str(SMALL_RAW)!r})))"
    )
    for columns in (80, 100, 150):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": str(columns)},
            timeout=120,
        ).stdout
        widths = [len(line) for line in out.splitlines()]
        assert max(widths) == columns, (columns, max(widths))


def test_our_own_outputs_fed_back_name_what_to_pass(tmp_path: Path) -> None:
    for name, text in (
        ("trace.pftrace", "\x0a\x05junk"),
        ("report.html", "<!doctype html><html></html>"),
        ("report.txt", "╭─ Environment"),
    ):
        path = tmp_path / name
        path.write_text(text)
        res = run_cli("report", str(path), timeout=60)
        line = _one_error_line(res.stderr)
        assert res.returncode == 2 and "--raw" in line and len(line) - len(str(path)) <= 140, line
    odd = tmp_path / "odd.bin"
    odd.write_bytes(bytes(range(256)) * 4)
    line = _one_error_line(run_cli("report", str(odd), timeout=60).stderr)
    assert "unrecognized format" in line and len(line) - len(str(odd)) <= 200, line


VERBS_ON_RECORDED_DATA = {
    "report run": ["report", str(SMALL_RAW)],
    "report serve sweep": ["report", str(DATA / "cpu" / "serve_sweep_c1_c2_raw.json.gz")],
    "report startup": ["report", str(DATA / "cpu" / "startup" / "startup_cold.json")],
    "diff": [
        "diff",
        str(DATA / "gpu" / "h200_llama1.75b_custom_architectures" / "arch_a_raw.json.gz"),
        str(DATA / "gpu" / "h200_llama1.75b_custom_architectures" / "arch_b_raw.json.gz"),
    ],
    "kernels --import": [
        "kernels",
        "--import",
        str(DATA / "gpu" / "h200_llama180m_host_bound" / "small_nsys.sqlite.gz"),
    ],
    "kernel --import": [
        "kernel",
        "--import",
        str(DATA / "gpu" / "h200_llama180m_host_bound" / "small_ncu_gemv_details.csv"),
    ],
    "check-arch": ["check-arch", str(REPO / "custom_archs" / "llama_custom")],
    "doctor": ["doctor"],
    "bad flag": ["run", "--model-path", "M", "--tokens", "5"],
}


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("verb", list(VERBS_ON_RECORDED_DATA))
def test_every_verb_fits_the_terminal(verb: str, columns: int) -> None:
    """what each verb prints (stdout and stderr) fits a terminal COLUMNS wide, at 80 and 120; only a single
    name longer than the width (a deep path) may stand alone on a longer line. (The model-running verbs print the same
    renderer: `run` / `demo` are covered by tests/cli/test_front_door.py and the examples.)"""
    res = run_cli(*VERBS_ON_RECORDED_DATA[verb], env={"COLUMNS": str(columns)}, timeout=300)
    assert res.returncode in (0, 1, 2), res.stderr[-2000:]
    lines = (res.stdout + res.stderr).splitlines()
    too_wide = [line for line in lines if len(line) > columns and " " in line.strip()]
    assert not too_wide, too_wide[:3]
    assert len(res.stdout) > 50 or res.returncode == 2, res.stdout
