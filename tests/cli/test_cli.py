"""The max-profile CLI: exit codes, one clear line per error, JSON output, nothing left running."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest

from max_profile.model import Report

from ..conftest import DATA, error_message, run_cli


def _one_error_line(stderr: str) -> str:
    return error_message(stderr)


def test_doctor_reports_missing_tools_with_install_commands(tmp_path: Path) -> None:
    res = run_cli("doctor", "--json", str(tmp_path / "d.json"))
    assert res.returncode == 0, res.stderr
    report = Report.load(str(tmp_path / "d.json"))
    assert report.environment.vendor == "none"
    assert report.environment.max_version and report.environment.max_version.startswith("26.7")
    tools = {t.name: t for t in report.environment.tools}
    assert {"nsys", "ncu", "rocprofv3"} <= set(tools)
    assert tools["nsys"].path is None and "apt-get install nsight-systems" in (tools["nsys"].install_hint or "")
    # printed on a machine without a GPU: the GPU profilers in one line (their installs stay in the JSON), and what a
    # capture here records
    assert "nsys, ncu, rocprofv3: not used without a GPU" in " ".join(res.stdout.split())
    assert "apt-get install nsight-systems" not in res.stdout and "a capture here" in res.stdout
    assert tools["a capture here"].path and "op ranges" in tools["a capture here"].path


def test_make_model(tmp_path: Path) -> None:
    res = run_cli(
        "make-model",
        str(tmp_path / "m"),
        "--hidden",
        "32",
        "--layers",
        "1",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--dtype",
        "bfloat16",
    )
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["hidden_size"] == 32 and cfg["num_hidden_layers"] == 1 and cfg["torch_dtype"] == "bfloat16"
    assert (tmp_path / "m" / "chat_template.jinja").exists()


def test_make_model_bad_shape(tmp_path: Path) -> None:
    res = run_cli("make-model", str(tmp_path / "m"), "--hidden", "30", "--heads", "4")
    assert res.returncode == 2
    assert "must divide" in _one_error_line(res.stderr)


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["run", "--model-path", "/nonexistent/model"], "does not exist"),
        (
            ["run", "--model-path", "meta-llama/Llama-3.2-1B"],
            "(a hub id? a local folder is needed: hf download meta-llama/Llama-3.2-1B --local-dir Llama-3.2-1B)",
        ),
        (["run", "--model-path", str(DATA)], "no config.json"),
        (["run", "--model-path", __file__], "is a file"),
        (["run", "--model-path", "MODEL", "--devices", "gpu"], "no GPU is visible"),
        (["run", "--model-path", "MODEL", "--devices", "tpu"], "unsupported --devices"),
        (["run", "--model-path", "MODEL", "--interval", "0"], "--interval must be > 0"),
        (["kernels"], "needs --model-path"),
        (
            ["serve", "--model-path", "MODEL", "--mode", "kernels", "--record-share", "0", "--yes"],
            "--record-share must be above 0",
        ),
        (["serve", "--model-path", "MODEL", "--mode", "kernels", "--record-share", "1.5", "--yes"], "at most 1"),
        (
            ["serve", "--model-path", "MODEL", "--mode", "kernels", "--record-slice", "-1", "--yes"],
            "--record-slice must be > 0",
        ),
    ],
)
def test_bad_input_one_line_nonzero(args: list[str], expect: str, tiny_model_dir: Path) -> None:
    args = [str(tiny_model_dir) if a == "MODEL" else a for a in args]
    res = run_cli(*args, timeout=120)
    assert res.returncode == 2, res.stderr
    assert expect in _one_error_line(res.stderr)


def test_bad_flag_exits_2() -> None:
    res = run_cli("run", "--no-such-flag")
    assert res.returncode == 2
    assert "unrecognized arguments" in res.stderr or "required" in res.stderr


def test_the_grammar_fuzzed_gives_one_line_and_exit_2_or_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    """Unknown verbs and flags, with and without ``--help`` / ``-q``, in any order: the help and exit 0, or one error
    line and exit 2; never a traceback. In-process through the console entry (every command here stops at its parse:
    each holds an unknown word or asks for help)."""
    import random

    from max_profile.entry import main as entry
    from max_profile.flags import build_parser

    verbs = list(next(a for a in build_parser()._actions if a.dest == "verb").choices)
    words = [*verbs, "try", "tryy", "--bogus", "--model-path", "-x", "--help", "-h", "-q", "--quiet", "1", "--", "=x"]
    rng = random.Random(20261208)
    for _ in range(300):
        argv = rng.sample(words, rng.randint(1, 4))
        head = argv[: argv.index("--")] if "--" in argv else argv
        if not ({"--bogus", "-x", "--help", "-h"} & set(head)):
            argv.insert(rng.randint(0, len(head)), rng.choice(["--bogus", "-x"]))  # every command stops at its parse
        try:
            code = entry(argv)
        except SystemExit as exc:  # argparse's own exit: the help printed
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err, argv
        if code == 0:
            assert "usage: max-profile" in out, argv
        else:
            lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[max-profile")]
            assert code == 2 and lines and lines[0].startswith("max-profile: error: "), (argv, code, err)
            assert all(ln.startswith("  ") for ln in lines[1:]), (argv, err)  # one error, wrapped


@pytest.fixture()
def bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {}
    files["empty"] = tmp_path / "empty.sqlite"
    files["empty"].write_bytes(b"")
    nsys = gzip.decompress((DATA / "gpu" / "h200_llama180m_host_bound" / "small_nsys.sqlite.gz").read_bytes())
    files["truncated"] = tmp_path / "trunc.sqlite"
    files["truncated"].write_bytes(nsys[: len(nsys) // 3])
    files["corrupt"] = tmp_path / "corrupt.sqlite"
    files["corrupt"].write_bytes(b"SQLite format 3\x00" + b"\xff" * 5000)
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    files["other"] = other
    files["csv_other_columns"] = tmp_path / "x.csv"
    files["csv_other_columns"].write_text("a,b,c\n1,2,3\n")
    files["json_no_kernels"] = tmp_path / "t.json"
    files["json_no_kernels"].write_text(
        json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 2}]})
    )
    files["json_truncated"] = tmp_path / "t2.json"
    files["json_truncated"].write_text('{"traceEvents": [{"ph": "X", "cat": "kernel"')
    return files


@pytest.mark.parametrize(
    ("key", "expect"),
    [
        ("empty", "file is empty"),
        ("truncated", "corrupt or truncated"),
        ("corrupt", "corrupt or truncated"),
        ("other", "neither an nsys export nor a rocprofv3"),
        ("csv_other_columns", "unrecognized format"),
        ("json_no_kernels", "no GPU kernel events"),
        ("json_truncated", "truncated or invalid JSON"),
    ],
)
def test_import_bad_files(bad_files: dict[str, Path], key: str, expect: str) -> None:
    res = run_cli("kernels", "--import", str(bad_files[key]), timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    line = _one_error_line(res.stderr)
    assert expect in line and str(bad_files[key]) in line


def test_import_real_nsys_capture(tmp_path: Path) -> None:
    db = tmp_path / "cap.sqlite"
    db.write_bytes(gzip.decompress((DATA / "gpu" / "h200_llama180m_host_bound" / "small_nsys.sqlite.gz").read_bytes()))
    res = run_cli("kernels", "--import", str(db), "--json", str(tmp_path / "r.json"), timeout=120)
    assert res.returncode == 0, res.stderr
    report = Report.load(str(tmp_path / "r.json"))
    assert report.kernels is not None and report.kernels.kernels == 2046  # type: ignore[union-attr]
    assert "gemv_split_k" in res.stdout


def test_device_graphs_follow_max_except_for_op_ranges_on_a_gpu() -> None:
    from max_profile.model.kernel_modes import KERNEL_MODES
    from max_profile.run import device_graphs_for as by_mode

    def device_graphs_for(name: str, devices: str, requested: bool | None) -> bool | None:
        return by_mode(KERNEL_MODES[name], devices, requested)

    assert device_graphs_for("cupti", "gpu", None) is None  # MAX decides (on for supported architectures on a GPU)
    assert device_graphs_for("off", "gpu", None) is None
    assert device_graphs_for("nvtx-log", "gpu:0", None) is False  # op ranges are not emitted for graph replays
    assert device_graphs_for("nvtx-log", "cpu", None) is None
    assert (
        device_graphs_for("nvtx-log", "gpu", True) is True and device_graphs_for("cupti", "gpu", False) is False
    )  # the user's choice wins


@pytest.mark.max
def test_demo_on_the_cpu_writes_its_three_files_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """The README's first command, as a newcomer runs it: the tiny model built, profiled with MAX's op ranges (a
    re-exec with the NVTX log library), report / HTML / raw written; the NVTX log it wrote in max_profile's cache is
    removed after."""
    cache = tmp_path / "mp-cache"
    res = run_cli("demo", "--out", str(tmp_path / "out"), env={"MAX_PROFILE_CACHE": str(cache)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"report.json", "report.html", "raw.json.gz"}
    report = Report.load(str(tmp_path / "out" / "report.json"))
    assert report.kernels is not None and getattr(report.kernels, "source", "").startswith("nvtx-log")
    assert report.step_summary is not None
    verdicts = [f for f in report.findings if f.id in ("host-time-between-ops", "ops-bound")]
    assert sorted(str(f.evidence["phase"]) for f in verdicts) == ["decode", "prefill"], [
        f.id for f in report.findings
    ]  # where each phase's time goes, on any CPU and under any load: the ops, or the host between them
    assert not list(cache.glob("nvtx-*.log")), "the NVTX log was left in the cache"
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "message",
    [
        "short",
        "/a/very/long/path/" * 8
        + "x.csv: unrecognized format (first bytes 'a,b,c'); it reads raw captures, reports, nsys; and more",
        "word " * 90,
        "x" * 450,
    ],
)
@pytest.mark.parametrize("columns", [80, 120, 300])
def test_an_error_line_fits_200_characters_and_nothing_is_lost(
    message: str, columns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error line fits the terminal (COLUMNS) where a clause boundary allows, and 200 characters always; the rest
    is on indented lines, nothing lost; only a name longer than 200 characters is cut."""
    from max_profile.render.terminal import ERROR_LINE_MAX, error_lines

    monkeypatch.setenv("COLUMNS", str(columns))
    width = min(columns, ERROR_LINE_MAX)
    lines = error_lines(message).splitlines()
    assert lines[0].startswith("max-profile: error: ") and len(lines[0]) <= ERROR_LINE_MAX
    assert all(line.startswith("  ") for line in lines[1:])
    said = lines[0].removeprefix("max-profile: error: ") + "".join(line[2:] for line in lines[1:])
    assert said.replace(" ", "").replace(";", "") == message.replace(" ", "").replace(";", "")
    assert (len(lines) == 1) == (len("max-profile: error: " + message) <= width)
    long_names = [w for w in message.split() if len(w) > width]
    assert all(
        len(line) <= width for line in lines if not any(w in line for w in long_names) and message != "x" * 450
    ), lines
