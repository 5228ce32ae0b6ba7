"""The one capture pipeline: every source -> RawCapture -> build_report, one attribution rule, exact numbers.

Generated nsys-schema traces (tests/nsys_schema.py) carry their own truth; the real H200 captures
are re-read through the same path (each folder's README under tests/data/gpu says how it was made).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from max_profile.analyze.report import build_report
from max_profile.collect.readers.nsys import nsys_capture
from max_profile.collect.readers.sources import import_trace, load_any
from max_profile.errors import TraceFormatError
from max_profile.model import SCHEMA_VERSION, KernelBreakdown, RawCapture, Report, StepLedger, Unavailable

from ...conftest import DATA, run_cli
from ...nsys_schema import make_nsys_sqlite

H200 = DATA / "gpu"
RAW_FIXTURES = [
    "h200_llama180m_host_bound/small_cupti_raw.json.gz",
    "h200_llama7b_gemv_decode/big_cupti_raw.json.gz",
    "h200_llama1.75b_custom_architectures/arch_a_raw.json.gz",
    "h200_llama1.75b_custom_architectures/arch_b_raw.json.gz",
    "h200_llama1.75b_custom_architectures/arch_c_raw.json.gz",
]


def _kernels(report: Report) -> KernelBreakdown:
    assert isinstance(report.kernels, KernelBreakdown), report.kernels
    return report.kernels


@pytest.mark.parametrize("worker_fraction", [0.0, 0.3, 1.0])
@pytest.mark.parametrize(
    ("ours", "scheduler"), [(True, False), (False, True), (True, True)], ids=["ours", "scheduler", "both"]
)
def test_generated_nsys_exact_per_phase_numbers(
    tmp_path: Path, worker_fraction: float, ours: bool, scheduler: bool
) -> None:
    """Kernels launched from any thread belong to the step that launched them; both range kinds count each step once."""
    path = tmp_path / "trace.sqlite"
    exp = make_nsys_sqlite(path, worker_fraction=worker_fraction, ours=ours, scheduler=scheduler, seed=3)
    assert (exp.worker_launches > 0) == (worker_fraction > 0) and (exp.main_launches > 0) == (worker_fraction < 1)
    report = build_report(nsys_capture(str(path)))
    k = _kernels(report)
    assert k.step_source == ("max_profile ranges" if ours else "MAX scheduler ranges")
    assert k.attribution == "launch time (any thread)" and k.unattributed_kernels == 0 and k.invalid_kernels == 0
    for p in k.phases:
        assert p.steps == exp.steps[p.phase]
        assert p.kernels == exp.kernels[p.phase]
        assert round(p.kernel_ms * 1e6) == exp.kernel_ns[p.phase]
        assert p.kernels_per_step == exp.kernels[p.phase] / exp.steps[p.phase]
    assert {p.phase for p in k.phases} == set(exp.steps)
    decode = next(p for p in k.phases if p.phase == "decode")
    assert decode.kernel_us_per_token == pytest.approx(exp.kernel_ns["decode"] / 1e3 / exp.steps["decode"])
    assert [s.phase for s in report.steps] == ["prefill"] + ["decode"] * exp.steps["decode"]
    if ours and scheduler:
        assert any("MAX scheduler range(s) describe the same steps" in n for n in report.notes)
    # the phase's time is the ledger's (one account): its kernels' busy time plus the GPU's idle time inside the steps
    ledger = report.ledger
    assert isinstance(ledger, StepLedger)
    lp = next(p for p in ledger.phases if p.phase == "decode")
    assert decode.wall_ms == pytest.approx(lp.step_ms * lp.steps, abs=1e-6)
    assert (decode.wall_ms or 0) * (decode.gpu_busy_pct or 0) / 100 == pytest.approx(decode.kernel_ms, rel=1e-3)
    if ours:  # the ranges' time is their kernels' plus the idle time inside them: never more than the step's
        assert (decode.wall_ms or 0) * 1e6 >= exp.wall_ns["decode"] - 1


def test_launches_at_step_boundaries(tmp_path: Path) -> None:
    """A launch call that starts 1 µs before its step ends and returns after it belongs to that step (the call's start
    decides, not its end); a kernel launched in the gap after a step belongs to no step (not to the step before): the
    per-phase counts are exact and the gap's kernels are the unattributed ones."""
    path = tmp_path / "boundary.sqlite"
    exp = make_nsys_sqlite(path, boundary_launches=True, seed=5)
    k = _kernels(build_report(nsys_capture(str(path))))
    assert k.unattributed_kernels == exp.between_steps == 1 + exp.steps["decode"]
    for p in k.phases:
        assert p.kernels == exp.kernels[p.phase] and round(p.kernel_ms * 1e6) == exp.kernel_ns[p.phase], p.phase


def test_nested_duplicate_ranges_count_once(tmp_path: Path) -> None:
    exp = make_nsys_sqlite(tmp_path / "dup.sqlite", worker_fraction=0.5, duplicate_ours=True, scheduler=True)
    report = build_report(nsys_capture(str(tmp_path / "dup.sqlite")))
    k = _kernels(report)
    assert {p.phase: p.steps for p in k.phases} == exp.steps
    assert {p.phase: p.kernels for p in k.phases} == exp.kernels
    assert any("25 nested or duplicate max_profile range(s) counted once" in n for n in report.notes)


def _kineto_from_raw(raw: RawCapture, path: Path) -> None:
    """A real CUPTI capture written as Kineto / HTA Chrome-trace JSON: kernels, launch calls, no phase ranges."""
    t = raw.kernels
    assert t.launch_ns is not None and t.correlation_id is not None
    events = []
    for i in range(len(t)):
        if t.start_ns[i] < 0:
            continue  # the zero-timestamp records CUPTI handed out; Kineto would not write them either
        corr = int(t.correlation_id[i])
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": t.name_of(i),
                "pid": 0,
                "tid": 13,
                "ts": t.start_ns[i] / 1e3,
                "dur": (t.end_ns[i] - t.start_ns[i]) / 1e3,
                "args": {"device": 0, "stream": 13, "correlation": corr},
            }
        )
        if t.launch_ns[i] >= 0:
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_driver",
                    "name": "cuLaunchKernelEx",
                    "pid": 4242,
                    "tid": 4300,
                    "ts": t.launch_ns[i] / 1e3,
                    "dur": 2.0,
                    "args": {"correlation": corr},
                }
            )
    work = [s for s in raw.steps if s.batch_size]
    events.append(
        {
            "ph": "X",
            "cat": "python_function",
            "name": "generate",
            "pid": 4242,
            "tid": 4242,
            "ts": work[0].start_ns / 1e3,
            "dur": (work[-1].end_ns - work[0].start_ns) / 1e3,
        }
    )
    with gzip.open(path, "wt") as fh:
        json.dump({"schemaVersion": 1, "traceEvents": events}, fh)


def test_kineto_without_ranges_host_bound(tmp_path: Path) -> None:
    """The small H200 capture (GPU busy ~7 %) as a Kineto trace without phase ranges: busy % and a host-bound
    verdict."""
    _kineto_from_raw(
        RawCapture.load(str(H200 / "h200_llama180m_host_bound/small_cupti_raw.json.gz")), tmp_path / "small.json.gz"
    )
    report = build_report(import_trace(str(tmp_path / "small.json.gz")))
    k = _kernels(report)
    assert k.step_source == "none" and not k.phases and k.kernels == 3246
    assert k.attribution == "none" and k.gpu_busy_pct == pytest.approx(7.5, abs=0.2)
    found = {f.id: f for f in report.findings}
    assert found["host-bound"].evidence["busy_scope"] == "whole capture window (no phase ranges)"
    assert found["host-bound"].confidence < 0.7  # said with lower confidence than a per-phase verdict
    assert "phases-missing" in found and "gpu-bound" not in found


def test_kineto_without_ranges_busy_dense_decode(tmp_path: Path) -> None:
    """The 7B-shaped H200 capture (GPU busy ~85 %) as Kineto without ranges: a matvec-dominated decode verdict, no
    host-bound."""
    _kineto_from_raw(
        RawCapture.load(str(H200 / "h200_llama7b_gemv_decode/big_cupti_raw.json.gz")), tmp_path / "big.json.gz"
    )
    report = build_report(import_trace(str(tmp_path / "big.json.gz")))
    k = _kernels(report)
    assert k.kernels == 19580 and k.gpu_busy_pct == pytest.approx(84.8, abs=0.3)
    found = {f.id: f for f in report.findings}
    assert "host-bound" not in found
    dense = found["healthy-dense-decode"]
    assert (
        dense.evidence["scope"] == "whole capture (no phase ranges)"
        and float(dense.evidence["gemv_share_pct"] or 0) > 80
    )
    assert dense.confidence < 0.8


@pytest.mark.parametrize("name", RAW_FIXTURES)
def test_raw_fixture_round_trips(name: str, tmp_path: Path) -> None:
    """v1 / v2 fixtures load (converted), save as the current version, load again: the same report, byte for byte."""
    raw = RawCapture.load(str(H200 / name))
    first = build_report(raw)
    raw.save(str(tmp_path / "again.json.gz"))
    again = RawCapture.load(str(tmp_path / "again.json.gz"))
    assert again.schema_version == SCHEMA_VERSION and len(again.kernels) == len(raw.kernels)
    second = build_report(again)
    first.capture.started_unix_s = second.capture.started_unix_s
    assert first.to_json() == second.to_json()


def test_schema_2_unavailable_strings_load_as_unavailable(tmp_path: Path) -> None:
    """Schema 2 said what was not measured as a string; it reads as :class:`Unavailable`, and saves as schema 3."""
    path = DATA / "cpu" / "serve_sweep_c1_c2_raw.json.gz"
    assert json.loads(gzip.decompress(path.read_bytes()))["schema_version"] == 2
    raw = RawCapture.load(str(path))
    assert isinstance(raw.utilization_unavailable, Unavailable) and "no GPU" in raw.utilization_unavailable.reason
    assert raw.schema_version == SCHEMA_VERSION == 3
    raw.save(str(tmp_path / "v3.json"))
    doc = json.loads((tmp_path / "v3.json").read_text())
    assert doc["schema_version"] == 3 and doc["utilization_unavailable"] == {
        "type": "unavailable",
        "reason": raw.utilization_unavailable.reason,
    }
    assert build_report(RawCapture.load(str(tmp_path / "v3.json"))).utilization == raw.utilization_unavailable


def test_report_cli_rebuilds_a_raw_capture(tmp_path: Path) -> None:
    res = run_cli(
        "report",
        str(H200 / "h200_llama1.75b_custom_architectures/arch_c_raw.json.gz"),
        "--json",
        str(tmp_path / "r.json"),
        "--raw",
        str(tmp_path / "raw.json.gz"),
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    report = Report.load(str(tmp_path / "r.json"))
    assert report.findings[0].id == "kv-cache-broken"
    assert "kv-cache-broken" in res.stdout
    again = run_cli("report", str(tmp_path / "raw.json.gz"), "--json", str(tmp_path / "r2.json"), timeout=120)
    assert again.returncode == 0, again.stderr
    r2 = Report.load(str(tmp_path / "r2.json"))
    assert [f.id for f in r2.findings] == [f.id for f in report.findings] and r2.kernels == report.kernels
    shown = run_cli("report", str(tmp_path / "r.json"), timeout=120)  # a saved report is shown as saved
    assert shown.returncode == 0 and "kv-cache-broken" in shown.stdout


SHOW_AND_LIST_MODULES = """
import contextlib, io, sys
from max_profile.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["-q", "report", sys.argv[1]])
print(code, " ".join(sorted(sys.modules)))
"""


def _modules_loaded_to_show(path: Path) -> tuple[int, set[str]]:
    """The exit code of ``max-profile report PATH`` and every module the command had imported by its end."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", SHOW_AND_LIST_MODULES, str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    code, names = res.stdout.strip().splitlines()[-1].split(" ", 1)
    return int(code), set(names.split())


def test_a_saved_report_is_shown_without_the_analysis_readers_or_numpy(tmp_path: Path) -> None:
    """What `max-profile report REPORT.json` needs is the model and the text renderer: no analysis, no trace reader
    and no numpy are imported (they took half of its start); a raw capture of the same run does load the analysis."""
    raw_path = H200 / "h200_llama1.75b_custom_architectures/arch_c_raw.json.gz"
    report_path = tmp_path / "r.json"
    build_report(RawCapture.load(str(raw_path))).save(str(report_path))
    code, shown = _modules_loaded_to_show(report_path)
    assert code == 0
    heavy = sorted(
        m for m in shown if m == "numpy" or m.startswith(("max_profile.analyze", "max_profile.collect.readers."))
    )
    assert heavy == [
        "max_profile.collect.readers.otlp",
        "max_profile.collect.readers.sources",
        "max_profile.collect.readers.tables",
    ], heavy
    code, analysed = _modules_loaded_to_show(raw_path)
    assert code == 0 and {"numpy", "max_profile.analyze.report", "max_profile.analyze.ledger"} <= analysed


def test_report_cli_imports_traces(tmp_path: Path) -> None:
    db = tmp_path / "cap.sqlite"
    db.write_bytes(gzip.decompress((H200 / "h200_llama180m_host_bound/small_nsys.sqlite.gz").read_bytes()))
    res = run_cli("report", str(db), "--raw", str(tmp_path / "nsys_raw.json"), timeout=120)
    assert res.returncode == 0, res.stderr
    assert "host-bound" in res.stdout  # (this check once sat inside the message of the assert above and never ran)
    raw = RawCapture.load(str(tmp_path / "nsys_raw.json"))
    assert raw.kernel_clock == "trace" and len(raw.kernels) == 2046 and raw.ranges


def test_schema_version_and_kind_checks(tmp_path: Path) -> None:
    doc = json.loads(gzip.decompress((H200 / "h200_llama180m_host_bound/small_cupti_raw.json.gz").read_bytes()))
    doc["schema_version"] = 999
    (tmp_path / "future.json").write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match="schema version 999 is not supported"):
        RawCapture.load(str(tmp_path / "future.json"))
    report = build_report(RawCapture.load(str(H200 / "h200_llama180m_host_bound/small_cupti_raw.json.gz")))
    report.save(str(tmp_path / "report.json"))
    with pytest.raises(TraceFormatError, match="an analysed report, not a raw capture"):
        RawCapture.load(str(tmp_path / "report.json"))
    assert isinstance(load_any(str(tmp_path / "report.json")), Report)
    truncated = tmp_path / "cut.json.gz"
    truncated.write_bytes((H200 / "h200_llama180m_host_bound/small_cupti_raw.json.gz").read_bytes()[:5000])
    with pytest.raises(TraceFormatError, match="truncated or corrupt gzip"):
        RawCapture.load(str(truncated))
    res = run_cli("report", str(truncated))
    assert res.returncode == 2 and "truncated or corrupt gzip" in res.stderr and "Traceback" not in res.stderr


def test_kernel_import_needs_no_name(tmp_path: Path) -> None:
    res = run_cli(
        "kernel",
        "--import",
        str(H200 / "h200_llama7b_gemv_decode/big_ncu_gemv_details.csv"),
        "--raw",
        str(tmp_path / "ncu_raw.json"),
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "near its roofline" in res.stdout
    raw = RawCapture.load(str(tmp_path / "ncu_raw.json"))
    assert [launch.launch_id for launch in raw.ncu_launches] == ["0", "1"]
    rebuilt = run_cli("report", str(tmp_path / "ncu_raw.json"), timeout=120)
    assert rebuilt.returncode == 0 and "near its roofline" in rebuilt.stdout
    none = run_cli("kernel", "--model-path", str(tmp_path))
    assert none.returncode == 2 and "needs a kernel NAME" in none.stderr


def test_serve_reports_of_schema_1_still_load() -> None:
    """The H200 serve reports  predate schema 2: they load as saved."""
    for name in ("serve_kernels_report.json", "serve_utilization_report.json", "serve_nsys_report.json"):
        report = Report.load(str(H200 / "h200_llama1.75b_serve_modes" / name))
        assert report.schema_version == 1 and report.serve is not None


def test_nsys_rep_without_nsys_says_how_to_install(tmp_path: Path) -> None:
    rep = tmp_path / "capture.nsys-rep"
    rep.write_bytes(b"\x00\x00\x00\x00QDST" + bytes(range(256)) * 8)  # a report needs nsys to be read; nsys is not here
    res = run_cli("report", str(rep), env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 3 and "apt-get install nsight-systems" in res.stderr and "Traceback" not in res.stderr


def test_gzipped_sqlite_export_imports(tmp_path: Path) -> None:
    shutil.copy(H200 / "h200_llama180m_host_bound/small_nsys.sqlite.gz", tmp_path / "small.sqlite.gz")
    report = build_report(import_trace(str(tmp_path / "small.sqlite.gz")))
    assert _kernels(report).kernels == 2046 and not list(tmp_path.glob("*.tmp*"))
