"""The scripted newcomer pass through the front door: the README's Python snippet as a user copies it, its
printed advice followed literally, the result a breakdown; the Python capture diffed with a CLI capture of the same
setup; a pytest baseline checked against the CLI capture. Real MAX on the CPU, each script in its own process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from max_profile.model import KernelBreakdown, RawCapture
from max_profile.pytest import assert_no_regression

from ..conftest import REPO, run_cli

pytestmark = pytest.mark.slow


def readme_snippet(model: Path) -> str:
    """The README's first Python block, with the user's own model folder and the CPU (no GPU here), the rest as
    printed."""
    block = re.search(r"## In Python\n\n```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block is not None
    code = block.group(1).replace("path/to/model", str(model)).replace('devices="gpu"', 'devices="cpu"')
    code = code.split("from max_profile.render.html")[
        0
    ]  # the HTML / Perfetto lines write files: not this pass's question
    return code.replace(
        'prof.report.save("report.json")',
        'prof.report.save("report.json"); print("NEXT:", prof.report.next_measurement)',
    )


def run_script(code: str, cwd: Path, columns: int = 80) -> subprocess.CompletedProcess[str]:
    """The script in a terminal ``columns`` wide: the report it prints (its panels) fits; the snippet's own print()
    lines are the user's."""
    import os

    script = cwd / "snippet.py"
    script.write_text(code)
    res = subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "COLUMNS": str(columns)},
    )
    panels = [line for line in res.stdout.splitlines() if line[:1] in ("╭", "│", "╰")]
    too_wide = [line for line in panels if len(line) > columns]
    assert res.returncode != 0 or (panels and not too_wide), too_wide[:3] or res.stdout[-2000:]
    return res


@pytest.fixture(scope="module")
def snippet_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The README snippet as printed, run once for this module's tests: its folder and what it printed."""
    first = tmp_path_factory.mktemp("snippet")
    res = run_script(readme_snippet(tiny_model_dir), first)
    assert res.returncode == 0, res.stderr[-3000:]
    return first, res.stdout


def test_readme_snippet_advice_followed_gives_a_breakdown(
    tiny_model_dir: Path, tmp_path: Path, snippet_run: tuple[Path, str]
) -> None:
    first, stdout = snippet_run
    advice = next(line.removeprefix("NEXT: ") for line in stdout.splitlines() if line.startswith("NEXT: "))
    # on a CPU nothing records kernels unless the process was started for MAX's op ranges: the advice says the one call
    assert advice.startswith("max_profile.restart_with_op_ranges('cpu')"), advice
    assert "kernels='nvtx-log'" in advice and "max-profile" not in advice.split("#")[0]  # Python, not a shell command
    first_raw = RawCapture.load(str(first / "raw.json.gz"))
    assert first_raw.capture.devices == "cpu" and first_raw.capture.model_path == str(
        tiny_model_dir
    )  # from the pipeline itself
    # followed literally: the call first, then profile() with the kernels it names
    code = readme_snippet(tiny_model_dir)
    followed = (
        "import max_profile\n"
        + advice.split("#")[0].strip()
        + "\n"
        + code.replace('kernels="auto"', "kernels='nvtx-log'")
        + "\nimport os\nprint('PID:', os.getpid())\n"
    )
    second = tmp_path / "second"
    second.mkdir()
    res = run_script(followed, second, columns=120)
    assert res.returncode == 0, res.stderr[-3000:]
    raw = RawCapture.load(str(second / "raw.json.gz"))
    from max_profile.analyze.report import build_report

    report = build_report(raw)
    k = report.kernels
    assert (
        isinstance(k, KernelBreakdown) and k.kernels > 100 and {p.phase for p in k.phases} >= {"prefill", "decode"}
    ), k
    # the script's own log (its pid, kept by the restart's exec) is gone; others' (another worker's live capture) may
    # come and go meanwhile
    pid = next(line.split()[1] for line in res.stdout.splitlines() if line.startswith("PID: "))
    assert not (REPO / ".cache" / "max_profile" / f"nvtx-{pid}.log").exists(), "the op-range log outlived the script"


def test_python_and_cli_captures_compare(tiny_model_dir: Path, tmp_path: Path, snippet_run: tuple[Path, str]) -> None:
    """The same setup from the README snippet and from the CLI: `diff` compares them (no 'not comparable: devices None
    vs cpu'), and the pytest gate checks the Python capture against the CLI capture as its baseline."""
    python_raw = snippet_run[0] / "raw.json.gz"
    cli_raw = tmp_path / "cli_raw.json.gz"
    run = run_cli(
        "run",
        "--model-path",
        str(tiny_model_dir),
        "--devices",
        "cpu",
        "--kernels",
        "off",
        "--max-new-tokens",
        "64",
        "--raw",
        str(cli_raw),
        "-q",
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    diff = run_cli("diff", str(python_raw), str(cli_raw), timeout=300)
    # a verdict or, under other load, inconclusive (exit 5): never "not comparable"
    assert diff.returncode in (0, 1, 5) and "not comparable" not in diff.stdout + diff.stderr, diff.stdout + diff.stderr
    result = assert_no_regression(
        RawCapture.load(str(python_raw)), cli_raw, fail_above=1000.0, inconclusive="pass"
    )  # comparability is the point here: a loaded machine's inconclusive comparison must not skip the test
    assert result is not None and result.comparable, result.reasons


def test_auto_records_the_same_in_run_as_in_demo_on_the_cpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`--kernels auto` (the default) on the CPU: `run` records MAX's op ranges as `demo` does (it used to pick off and
    show no breakdown), and both verbs' help says what auto picks on each device."""
    for verb in ("run", "demo"):
        text = " ".join(run_cli(verb, "--help", timeout=120).stdout.split())
        assert (
            "auto (every verb): cupti on an NVIDIA GPU, nvtx-log on the CPU" in text and "another vendor's GPU" in text
        ), text
    raw_path = tmp_path / "raw.json.gz"
    res = run_cli(
        "run",
        "--model-path",
        str(tiny_model_dir),
        "--devices",
        "cpu",
        "--max-new-tokens",
        "16",
        "--raw",
        str(raw_path),
        "-q",
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    from max_profile.analyze.report import build_report

    raw = RawCapture.load(str(raw_path))
    assert raw.capture.profiling_mode == "on", raw.capture.profiling_mode
    k = build_report(raw).kernels
    assert isinstance(k, KernelBreakdown) and {p.phase for p in k.phases} >= {"prefill", "decode"}, k


LONG_RUNNING_APP = """
import json, os, sys
import max_profile
max_profile.restart_with_op_ranges('cpu')
from max.pipelines import AutoModel, AutoTokenizer
from max_profile import profile
from max_profile.session import attached_nvtx_log

MODEL = sys.argv[1]
model = AutoModel(MODEL, devices="cpu")
tok = AutoTokenizer(MODEL)
log = attached_nvtx_log()

def size():
    from max_profile.collect.live.nvtx_log import flush_in_process
    flush_in_process()
    return os.path.getsize(log)

out = {"log": log, "sizes": [], "ops": [], "notes": []}
for block in range(2):
    model.generate(**tok(["outside any recording"]), max_new_tokens=8)   # the app's own work
    out["sizes"].append(size())
    with profile(model, kernels="nvtx-log", model_path=MODEL) as prof:
        model.generate(**tok(["I believe the meaning of life is"]), max_new_tokens=8)
    out["sizes"].append(size())
    out["ops"].append(len(prof.raw_capture.kernels))
    out["notes"].append(prof.raw_capture.notes)
print("RESULT", json.dumps(out))
"""


@pytest.mark.parametrize("cap_bytes", [None, 40_000])
def test_op_range_log_of_a_long_running_app_stays_bounded(
    tiny_model_dir: Path, tmp_path: Path, cap_bytes: int | None
) -> None:
    """after `restart_with_op_ranges`, the app's own steps outside `profile()` write nothing to the
    log, each block's ranges are removed once read (the log is empty again after every block), every block still gets
    its ops, and the log file is gone when the script ends. With a size cap, the block says that events were dropped."""
    import json
    import os

    script = tmp_path / "app.py"
    script.write_text(LONG_RUNNING_APP)
    env = {**os.environ}
    if cap_bytes:
        env["MAX_PROFILE_NVTX_LOG_MAX_BYTES"] = str(cap_bytes)
    res = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(
        next(line.removeprefix("RESULT ") for line in res.stdout.splitlines() if line.startswith("RESULT "))
    )
    assert out["sizes"] == [0, 0, 0, 0], out["sizes"]  # nothing outside blocks, nothing kept after a block is read
    assert all(n > 0 for n in out["ops"]), out["ops"]
    capped = [any("size cap" in note for note in notes) for notes in out["notes"]]
    assert capped == ([True, True] if cap_bytes else [False, False]), out["notes"]
    assert not os.path.exists(out["log"]), "the op-range log outlived the script"
