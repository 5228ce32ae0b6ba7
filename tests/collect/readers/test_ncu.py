"""Nsight Compute CSV parsing and verdicts on real H200 output, plus the documented format traps."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from max_profile.analyze.ncu import analyze_launch
from max_profile.analyze.rules.nsight import kernel_findings
from max_profile.collect.readers.ncu import parse_ncu_csv, to_number
from max_profile.collect.readers.ncu import read_ncu_files as read_launches
from max_profile.errors import MaxProfileError as NcuError
from max_profile.model import KernelAnalysis, NcuLaunch
from max_profile.ncu_run import name_filter, ncu_command

from ...conftest import run_cli

H200 = Path(__file__).parents[2] / "data" / "gpu"


def read_ncu_files(details: str, raw: str | None = None) -> list[KernelAnalysis]:
    """The pages' launches, analysed (collect/ncu parses, analyze/ncu analyses)."""
    return [analyze_launch(launch) for launch in read_launches(details, raw)]


def _launch(parsed: dict) -> NcuLaunch:  # type: ignore[type-arg]
    return NcuLaunch(
        launch_id="0",
        name=parsed["name"],
        grid=parsed["grid"],
        block=parsed["block"],
        device=parsed["device"],
        metrics=parsed["metrics"],
        sections=parsed["sections"],
        rules=parsed["rules"],
    )


def test_decode_gemv_7b_is_memory_bound_near_peak() -> None:
    a = read_ncu_files(str(H200 / "h200_llama7b_gemv_decode/big_ncu_gemv_details.csv"))
    assert [x.launch_id for x in a] == [0, 1]
    g = a[0]
    assert g.kernel_name == "gemv_split_k_bfloat16_bfloat16_bfloat16_128_41f3d61e"
    assert g.duration_ns == 30400
    assert g.dram_throughput_pct == pytest.approx(82.39)
    assert g.dram_bytes_per_s == pytest.approx(3.958e12, rel=1e-3)
    assert g.compute_throughput_pct == pytest.approx(22.52)
    assert g.bound == "memory"
    assert g.theoretical_occupancy_pct == 75 and g.achieved_occupancy_pct == pytest.approx(47.33)
    assert g.occupancy_limiter == "registers"  # Block Limit Registers 12 < Warps 16 < Shared Mem 28 < SM 32
    assert g.registers_per_thread == 40 and g.grid_size == "(1, 1024, 1)"
    assert any("SOLBottleneck" in r for r in g.ncu_rules)
    assert [f.id for f in kernel_findings(g)] == ["kernel-memory-bound-near-peak"]


def test_small_gemv_stalls_from_raw_page() -> None:
    (g,) = read_ncu_files(
        str(H200 / "h200_llama180m_host_bound/small_ncu_gemv_details.csv"),
        str(H200 / "h200_llama180m_host_bound/small_ncu_gemv_raw.csv.gz"),
    )[:1]
    assert g.duration_ns == 9056
    assert g.stalls[0].reason == "long_scoreboard" and g.stalls[0].cycles_per_instruction == pytest.approx(
        19.65, abs=0.01
    )
    assert "memory latency" in g.stalls[0].meaning
    assert g.bound == "memory" and g.dram_throughput_pct == pytest.approx(53.31)
    assert "kernel-memory-bound" in {f.id for f in kernel_findings(g)}


def test_decode_attention_is_latency_bound() -> None:
    a = read_ncu_files(
        str(H200 / "h200_llama180m_host_bound/small_ncu_mha_details.csv"),
        str(H200 / "h200_llama180m_host_bound/small_ncu_mha_raw.csv.gz"),
    )
    m = a[0]
    assert m.kernel_name.startswith("sm90_mha_depth128_bfloat16_bfloat16_nqh16_nkvh4")
    assert m.bound == "latency" and m.grid_size == "(1, 4, 1)"
    assert m.occupancy_limiter == "registers"
    # bf16 tensor work counted once (aggregate path metric only) + fp32 sass ops
    assert m.achieved_flop_per_s == pytest.approx(3.317e12, rel=1e-3)
    assert m.arithmetic_intensity == pytest.approx(56.74, rel=1e-3)
    f = {x.id: x for x in kernel_findings(m)}
    assert "kernel-latency-bound" in f and "long scoreboard" in f["kernel-latency-bound"].title


def test_live_stdout_with_noise_before_header() -> None:
    text = (H200 / "h200_llama180m_host_bound/small_ncu_rmsnorm_live_stdout.txt").read_text()
    assert text.splitlines()[0].startswith("==WARNING==")  # ncu lines and MAX's own output come first
    (launch,) = parse_ncu_csv(text).values()
    assert launch["name"].startswith("rms_norm_fused_residual_gpu_block_bfloat16")
    assert analyze_launch(_launch(launch)).bound == "latency"


def test_units_and_separators() -> None:
    assert to_number("3,191,212,121.21", "hz") == pytest.approx(3191212121.21)
    assert to_number("17.5", "us") == pytest.approx(17500.0)
    assert to_number("1.25", "Mbyte") == pytest.approx(1.25e6)
    assert to_number("3.96", "Tbyte/s") == pytest.approx(3.96e12)
    assert to_number("PolicySpread", "") is None and to_number("", "ns") is None


def test_auto_scaled_units_match_base_units() -> None:
    base = (H200 / "h200_llama7b_gemv_decode/big_ncu_gemv_details.csv").read_text()
    auto = base.replace('"Duration","ns","30,400"', '"Duration","us","30.40"')
    assert auto != base
    assert read_ncu_files.__name__  # same parser for both
    a, b = analyze_launch(_launch(parse_ncu_csv(base)["0"])), analyze_launch(_launch(parse_ncu_csv(auto)["0"]))
    assert a.duration_ns == pytest.approx(b.duration_ns or 0)


def _older_ncu_layout(text: str) -> str:
    """The H200 details page as older ncu (2022-2023) wrote it without --print-units base: no Block / Grid /
    Device / CC / rule columns, a Kernel Time column, human units (usecond, Gbyte/second, cycle/nsecond, Kbyte)."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO(text)))
    header = rows[0]
    keep = [
        header.index(c)
        for c in (
            "ID",
            "Process ID",
            "Process Name",
            "Host Name",
            "Kernel Name",
            "Context",
            "Stream",
            "Section Name",
            "Metric Name",
            "Metric Unit",
            "Metric Value",
        )
    ]
    human = {
        "nsecond": ("usecond", 1e-3),
        "ns": ("usecond", 1e-3),
        "byte/s": ("Gbyte/second", 1e-9),
        "hz": ("cycle/nsecond", 1e-9),
        "byte": ("Kbyte", 1e-3),
    }
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow([header[i] for i in keep[:5]] + ["Kernel Time"] + [header[i] for i in keep[5:]])
    for r in rows[1:]:
        r = r + [""] * (len(header) - len(r))
        cells = [r[i] for i in keep]
        if not cells[8]:
            continue  # rule rows: older layouts put rules elsewhere
        unit, value = cells[9], cells[10].replace(",", "")
        if unit in human and value.replace(".", "", 1).isdigit():
            cells[9], cells[10] = human[unit][0], f"{float(value) * human[unit][1]:.4f}"
        writer.writerow(cells[:5] + ["2024-Jan-01 10:00:00"] + cells[5:])
    return out.getvalue()


@pytest.mark.parametrize(
    "name",
    [
        "h200_llama180m_host_bound/small_ncu_gemv_details.csv",
        "h200_llama180m_host_bound/small_ncu_mha_details.csv",
        "h200_llama7b_gemv_decode/big_ncu_gemv_details.csv",
    ],
)
def test_older_ncu_layout_and_human_units_give_the_same_analysis(name: str) -> None:
    base = (H200 / name).read_text()
    old = _older_ncu_layout(base)
    assert "Gbyte/second" in old and "cycle/nsecond" in old and "Block Size" not in old.splitlines()[0]
    for a, b in zip(
        (analyze_launch(_launch(v)) for v in parse_ncu_csv(base).values()),
        (analyze_launch(_launch(v)) for v in parse_ncu_csv(old).values()),
        strict=True,
    ):
        assert b.bound == a.bound and b.duration_ns == pytest.approx(a.duration_ns or 0, rel=1e-3)
        assert b.dram_bytes_per_s == pytest.approx(a.dram_bytes_per_s or 0, rel=1e-3)
        assert b.achieved_occupancy_pct == pytest.approx(a.achieved_occupancy_pct or 0, rel=1e-3)
    launches = read_launches(str(H200 / name))
    assert all(launch.block for launch in launches)


def test_ragged_metrics_only_csv() -> None:
    text = (
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid '
        'Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n'
        '"0","1481","app","127.0.0.1","fma_kernel(float *, const float *, int, int)","1","7","(256, 1, 1)","(4096, 1, '
        '1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","18,144"\n'
    )
    (k,) = parse_ncu_csv(text).values()
    assert analyze_launch(_launch(k)).duration_ns == 18144


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("==PROF== Connected\n==WARNING== No kernels were profiled.\n", "matched nothing"),
        (
            "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
            "Counters\n",
            "NVreg_RestrictProfilingToAdminUsers=0",
        ),
        ("hello,world\n1,2\n", "not ncu CSV output"),
        (
            '"ID","Process ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n',
            "no profiled kernel rows",
        ),
    ],
)
def test_bad_ncu_output(text: str, expect: str) -> None:
    with pytest.raises(NcuError, match=expect.replace("(", r"\(")):
        parse_ncu_csv(text, "x.csv")


def test_name_filter_never_profiles_everything() -> None:
    assert (
        name_filter("gemv_split_k_bfloat16_bfloat16_bfloat16_128_41f3d61e")
        == "regex:gemv_split_k_bfloat16_bfloat16_bfloat16_128"
    )
    assert name_filter("regex:mha_depth.*") == "regex:mha_depth.*"
    for bad in ("", ".*", "regex:.*"):
        with pytest.raises(NcuError, match="refusing"):
            name_filter(bad)
    with pytest.raises(NcuError, match="between 1 and"):
        ncu_command("ncu", "gemv", 0, 0, "full", "r", ["python"])
    cmd = ncu_command("ncu", "gemv", 2, 8, "full", "r", ["python", "-m", "x"])
    assert cmd[cmd.index("-k") + 1] == "regex:gemv" and cmd[cmd.index("-c") + 1] == "2" and "--target-processes" in cmd


def test_kernel_cli_import_and_errors(tmp_path: Path) -> None:
    ok = run_cli(
        "kernel",
        "gemv",
        "--import",
        str(H200 / "h200_llama7b_gemv_decode/big_ncu_gemv_details.csv"),
        "--json",
        str(tmp_path / "k.json"),
    )
    assert ok.returncode == 0, ok.stderr
    assert "near its roofline" in ok.stdout
    bad = tmp_path / "trunc.csv"
    bad.write_text((H200 / "h200_llama7b_gemv_decode/big_ncu_gemv_details.csv").read_text().splitlines()[0] + "\n")
    res = run_cli("kernel", "gemv", "--import", str(bad))
    assert res.returncode == 2 and "no profiled kernel rows" in res.stderr and "Traceback" not in res.stderr
    missing_tool = run_cli("kernel", "gemv", "--model-path", str(tmp_path))
    assert missing_tool.returncode == 3 and "apt-get install nsight-compute" in missing_tool.stderr


def _fake_ncu(folder: Path, fail_page: str | None = None) -> Path:
    """A FAKE `ncu` (CI has no Nsight Compute): `--version`, and `--import R --csv --page details|raw --print-units
    base` printing the H200 pages of the decode attention kernel, as the real one prints them from its report."""
    script = folder / "ncu"
    details, raw = (
        H200 / "h200_llama180m_host_bound/small_ncu_mha_details.csv",
        H200 / "h200_llama180m_host_bound/small_ncu_mha_raw.csv.gz",
    )
    fail = f'  *"--page {fail_page}"*) echo "==ERROR== Failed to load report" >&2; exit 1;;\n' if fail_page else ""
    script.write_text(
        '#!/bin/sh\n# FAKE ncu for tests\ncase "$*" in\n'
        "  *--version*) echo 'NVIDIA (R) Nsight Compute Command Line Profiler'; echo 'Version 2025.3.1.0 (build "
        "36398880)';;\n"
        f"{fail}"
        f"  *'--import'*'--page details'*) cat '{details}';;\n"
        f"  *'--import'*'--page raw'*) gzip -dc '{raw}';;\n"
        "  *) exit 2;;\nesac\n"
    )
    script.chmod(0o755)
    return script


def test_ncu_rep_is_read_through_ncu_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`report R.ncu-rep` / `kernel --import R.ncu-rep`: the pages come from `ncu --import` (a FAKE ncu here) and read
    as the same pages imported as CSV; a failing ncu names the page and its error; no ncu: exit 3 with the install
    command."""
    from max_profile.analyze.report import build_report
    from max_profile.collect.readers.sources import detect_format, import_trace
    from max_profile.errors import ToolMissingError, TraceFormatError

    rep = tmp_path / "kernel.ncu-rep"
    rep.write_bytes(b"\x00binary report")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_ncu(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert detect_format(str(rep)).name == "ncu-rep"
    report = build_report(import_trace(str(rep)))
    direct = read_ncu_files(
        str(H200 / "h200_llama180m_host_bound/small_ncu_mha_details.csv"),
        str(H200 / "h200_llama180m_host_bound/small_ncu_mha_raw.csv.gz"),
    )
    assert [a.kernel_name for a in report.kernel_analyses] == [a.kernel_name for a in direct]
    assert report.kernel_analyses[0].bound == "latency" == direct[0].bound
    assert report.artifacts == [str(rep)]
    _fake_ncu(bin_dir, fail_page="raw")
    with pytest.raises(TraceFormatError, match="--page raw` failed: ==ERROR== Failed to load report"):
        import_trace(str(rep))
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("max_profile.collect.probes.environment.find_tool", lambda name: None)
    with pytest.raises(ToolMissingError, match="ncu is needed for reading .*Install: Nsight Compute"):
        import_trace(str(rep))


def _fake_ncu_run(folder: Path, log: str, write_report: bool) -> Path:
    """A FAKE `ncu` for a profiling run (CI has no Nsight Compute): prints ``log`` as ncu prints its own lines and the
    application's output, records its arguments, and writes the ``-o`` report only when ``write_report``."""
    script = folder / "ncu"
    (folder / "log.txt").write_text(log)
    report = (
        (
            'out=""; prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done; '
            'printf x > "$out.ncu-rep"\n'
        )
        if write_report
        else ""
    )
    script.write_text(
        "#!/bin/sh\n# FAKE ncu for tests\n"
        "case \"$*\" in *--version*) echo 'Version 2025.3.1.0'; exit 0;; esac\n"
        f"echo \"$@\" > '{folder}/args.txt'\ncat '{folder}/log.txt'\n{report}exit 0\n"
    )
    script.chmod(0o755)
    return script


# ncu's lines as Nsight Compute 2025.3.1 prints them (`==PROF==` / `==ERROR==` / `==WARNING==`), around the
# application's own output
CRASH_LOG = """==PROF== Connected to process 1234 (/opt/torch/.venv/bin/python3.12)
[max-profile    1.0s] loading /tmp/m24 on gpu
malloc(): unaligned tcache chunk detected
==PROF== Disconnected from process 1234
==ERROR== The application returned an error code (6).
==WARNING== No kernels were profiled.
"""
NO_MATCH_LOG = """==PROF== Connected to process 1234 (/opt/torch/.venv/bin/python3.12)
==PROF== Disconnected from process 1234
==WARNING== No kernels were profiled.
"""


@pytest.mark.parametrize(
    "log, expect",
    [
        (CRASH_LOG, "crashed under ncu .*error code 6: SIGABRT.*malloc\\(\\): unaligned tcache chunk detected"),
        (CRASH_LOG.replace("(6)", "(11)"), "error code 11: SIGSEGV"),
        (NO_MATCH_LOG, "ncu profiled no kernel: the filter 'regex:gemv_split_k' matched no launch"),
    ],
)
def test_kernel_run_tells_a_crash_from_no_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log: str, expect: str
) -> None:
    """A profiled program that dies under ncu is reported as a crash (its error code named, a signal spelled out, its
    last telling line), never as "no match"; a real no-match still says so. The child runs with device graphs off."""
    from max_profile.errors import CaptureError
    from max_profile.ncu_run import KernelRun, profile_kernel

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_ncu_run(bin_dir, log, write_report=False)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"x")
    with pytest.raises(CaptureError, match=expect):
        profile_kernel(
            KernelRun(name="gemv_split_k", model_path=str(model), output_dir=str(tmp_path / "out")),
            progress=lambda m: None,
        )
    args = (bin_dir / "args.txt").read_text().split()
    assert "--no-device-graph-capture" in args and args[args.index("-k") + 1] == "regex:gemv_split_k"


def test_kernel_run_reads_the_report_back_through_its_process_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run that works: ncu (a FAKE: CI has no Nsight Compute) profiles the generation, writes its report, and
    exports the pages a real ncu 2025.3.1 wrote on the H200 (gemv_split_k); the capture holds those launches, ncu among
    its collectors, the report and pages as artifacts, the workload of the run."""
    import shutil

    from max_profile.ncu_run import KernelRun, NcuTool, profile_kernel

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_ncu_run(bin_dir, NO_MATCH_LOG.replace("==WARNING== No kernels were profiled.\n", ""), write_report=True)
    h200 = Path(__file__).parents[2] / "data" / "gpu" / "h200_llama180m_host_bound"
    shutil.copy(h200 / "small_ncu_gemv_details.csv", bin_dir / "details.csv")
    (bin_dir / "raw.csv").write_bytes(gzip.decompress((h200 / "small_ncu_gemv_raw.csv.gz").read_bytes()))
    script = (bin_dir / "ncu").read_text()
    export = (
        'case "$*" in *--import*--page\\ details*) cat "' + str(bin_dir) + '/details.csv"; exit 0;; '
        '*--import*--page\\ raw*) cat "' + str(bin_dir) + '/raw.csv"; exit 0;; esac\n'
    )
    (bin_dir / "ncu").write_text(script.replace("# FAKE ncu for tests\n", "# FAKE ncu for tests\n" + export))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"x")
    run = KernelRun(name="gemv_split_k", model_path=str(model), output_dir=str(tmp_path / "out"), batch_size=2)
    raw = profile_kernel(run, progress=lambda m: None)
    expected = read_launches(str(bin_dir / "details.csv"), str(bin_dir / "raw.csv"))
    assert expected and raw.ncu_launches == expected
    assert raw.capture.target == "ncu:gemv_split_k" and raw.capture.collectors[-1] == "ncu"
    assert raw.capture.workload is not None and raw.capture.workload.batch_size == 2
    out = tmp_path / "out"
    assert raw.artifacts == [
        f"{out}/kernel.ncu-rep  (open with: ncu-ui {out}/kernel.ncu-rep)",
        f"{out}/kernel_details.csv",
        f"{out}/kernel_raw.csv",
    ]
    assert isinstance(NcuTool("ncu", run, str(out / "kernel"), out).command(["python"])[-1], str)
