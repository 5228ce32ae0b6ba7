"""The step ledger on a Llama-3.2-3B-shaped bf16 model at batch 64 on an H200 with MAX's defaults
(tests/data/gpu/h200_llama3b_batch64_ledger): each test re-analyses a raw capture with the package and checks it against
a figure computed here from the raw records (or the Nsight Compute CSVs), independently of the ledger."""

from __future__ import annotations

import gzip
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest

from max_profile.analyze.report import build_report
from max_profile.collect.readers.ncu import read_ncu_files
from max_profile.collect.readers.sources import load_any
from max_profile.flags import build_parser
from max_profile.model import KernelBreakdown, RawCapture, Report, StepLedger
from max_profile.model.command_text import cli

from ..analyze.test_ledger import _decode_idle_independently
from ..gpu.test_every_verb import decode_matmul_lever

S12 = Path(__file__).parents[1] / "data" / "gpu" / "h200_llama3b_batch64_ledger"


def _raw(name: str) -> RawCapture:
    return RawCapture.load(str(S12 / f"{name}_raw.json.gz"))


def _decode(report: Report, fid: str) -> object:
    return next(f for f in report.findings if f.id == fid and f.lever is not None and f.lever.phase == "decode")


def test_batch_64_ranks_both_levers_with_ms_per_step() -> None:
    """The GPU idles over 20 % of each decode step (1.10 of 5.30 ms, 0.66 ms of it before the step's
    device graph) and the GEMMs run at 41 % of their roofline. Both levers are warnings, in ms per step, the larger
    first; no "healthy" verdict beside them. The two figures are recomputed from the raw records here."""
    raw = _raw("run_b64_3b")
    report = build_report(raw)
    matmul, idle = _decode(report, "matmul-below-roofline"), _decode(report, "graph-launch-late")
    assert matmul.severity == idle.severity == "warning"  # type: ignore[attr-defined]
    assert (
        report.findings[0] is matmul and report.findings[1] is idle
    )  # ranked by what they buy: 1.96 then 1.10 ms per step
    groups = raw.capture.model_weights.groups  # type: ignore[union-attr]
    weights = sum(g.bytes for name, g in groups.items() if name != "embedding")
    assert matmul.lever is not None and idle.lever is not None
    assert matmul.lever.ms_per_step == pytest.approx(decode_matmul_lever(raw, weights), rel=0.01)
    assert idle.lever.ms_per_step == pytest.approx(_decode_idle_independently(raw), rel=0.01)
    assert idle.lever.pct_of_step >= 20  # type: ignore[attr-defined]
    assert not {"healthy-batched-decode", "healthy-dense-decode", "decode-bandwidth-low"} & {
        f.id for f in report.findings
    }


def test_the_printed_deep_dive_reproduces_the_run_and_profiles_decode_gemms() -> None:
    """The command the batch-64 report printed (`kernel_b64_3b.stderr.txt`, run as printed on the H200) keeps the batch
    and skips 339 launches: replayed on the run's own launches, the 3 profiled ones are decode launches, and Nsight
    Compute's grids are exactly theirs (20, 12 and 64 blocks of 256 threads), not the prefill GEMMs' (x 19 blocks of
    384)."""
    raw = _raw("run_b64_3b")
    report = build_report(raw)
    cmd = _decode(report, "matmul-below-roofline").command  # type: ignore[attr-defined]
    printed = re.search(r"as printed: (.*)", (S12 / "kernel_b64_3b.stderr.txt").read_text())
    assert printed is not None and cli(cmd).split("   # ")[0] == printed.group(1)
    args = build_parser().parse_args(shlex.split(printed.group(1))[1:])
    assert (args.batch_size, args.max_new_tokens, args.launch_skip, args.launches) == (64, 128, 339, 3)
    k = raw.kernels
    t = k.attribution_time()
    pattern = re.compile(args.name)
    matched = np.flatnonzero(np.array([bool(pattern.search(n)) for n in k.names])[k.name_idx])
    picked = matched[np.argsort(t[matched], kind="stable")][339:342]
    decode = [s for s in raw.steps if s.phase == "decode" and s.batch_size > 0]
    assert all(any(s.start_ns <= t[i] <= s.end_ns for s in decode) for i in picked)
    grid, block = k.grid, k.block
    assert grid is not None and block is not None
    expected = [(tuple(int(x) for x in grid[i]), tuple(int(x) for x in block[i])) for i in picked]
    launches = read_ncu_files(str(S12 / "kernel_b64_3b_details.csv.gz"), str(S12 / "kernel_b64_3b_raw.csv.gz"))
    profiled = [
        (
            tuple(int(x) for x in re.findall(r"\d+", launch.grid or "")),
            tuple(int(x) for x in re.findall(r"\d+", launch.block or "")),
        )
        for launch in launches
    ]
    assert profiled == expected == [((20, 1, 1), (256, 1, 1)), ((12, 1, 1), (256, 1, 1)), ((64, 1, 1), (256, 1, 1))]
    prefill = [s for s in raw.steps if s.phase == "prefill"]
    prefill_grids = {
        tuple(int(x) for x in k.grid[i]) for i in matched if any(s.start_ns <= t[i] <= s.end_ns for s in prefill)
    }  # type: ignore[index]
    assert not {g for g, _ in profiled} & prefill_grids


def test_serve_kernels_splits_prefill_and_decode() -> None:
    """`serve --mode kernels --concurrency 4` on the H200 (CUPTI in the worker, a quarter of the window recorded): the
    worker's batches stamped by the hook, split into prefill and decode; step times by batch size; the ledger per
    phase."""
    raw = _raw("serve_kernels_3b")
    report = build_report(raw)
    kinds = {s.phase for s in raw.steps}
    assert {"prefill", "decode"} <= kinds and len(raw.steps) > 2000
    assert {s.batch_size for s in raw.steps if s.phase == "decode"} == {4}
    k = report.kernels
    assert isinstance(k, KernelBreakdown) and {p.phase for p in k.phases} >= {"prefill", "decode"}
    assert "phases-missing" not in {f.id for f in report.findings}
    lg = report.ledger
    assert isinstance(lg, StepLedger) and {p.phase for p in lg.phases} >= {"prefill", "decode"}
    assert lg.requests_in_flight_pct == pytest.approx(100.0, abs=1.0)
    by = report.step_summary.by_batch  # type: ignore[union-attr]
    decode_rows = [b for b in by if b.phase == "decode"]
    assert [b.batch_size for b in decode_rows] == [4] and decode_rows[0].steps == sum(
        1 for s in raw.steps if s.phase == "decode"
    )
    assert len([b for b in by if b.phase == "prefill"]) >= 2  # prompts batched 1 to 4 at a time
    # decode's kernels per step: every decode step ran the whole model (113 launches on average here)
    d = next(p for p in lg.phases if p.phase == "decode")
    assert 100 < next(r for r in d.rows if r.part.startswith("matmul")).kernels_per_step < 120  # type: ignore[operator]


def test_attach_on_an_idle_server_is_lightly_loaded() -> None:
    """`attach --probe` on a server idle but for its 3 probe requests: requests in flight 4 % of the 10 s window,
    recomputed here from the requests: lightly loaded, no host-bound (NVML read 3.9 %)."""
    raw = _raw("attach_idle_3b")
    report = build_report(raw)
    w0, w1 = raw.load_windows[-1].window_ns
    spans = sorted((max(r.started_ns, w0), min(r.ended_ns, w1)) for r in raw.load_windows[-1].requests)
    covered, reach = 0, w0
    for a, b in spans:
        covered += max(0, b - max(a, reach))
        reach = max(reach, b)
    f = next(f for f in report.findings if f.id == "lightly-loaded")
    assert (
        f.evidence["loaded_pct"] == pytest.approx(100 * covered / (w1 - w0), abs=0.1)
        and float(f.evidence["loaded_pct"]) < 10
    )  # type: ignore[arg-type]
    assert "host-bound" not in {x.id for x in report.findings}


def test_fp8_nsys_trace_without_its_config_names_the_naive_fallback(tmp_path: Path) -> None:
    """The block-scaled FP8 model's nsys export, read back as an import (no config.json, no weights): the naive FP8
    matmuls are a dense matmul family (gemm), 99 % of decode, named as the fallback, a warning."""
    sqlite = tmp_path / "fp8.sqlite"
    with gzip.open(S12 / "nsys_fp8.sqlite.gz", "rb") as src, open(sqlite, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw = load_any(str(sqlite))
    assert isinstance(raw, RawCapture) and raw.capture.model_config is None and raw.capture.model_weights is None
    report = build_report(raw)
    f = _decode(report, "matmul-slow-path")
    assert f.severity == "warning" and "naive FP8" in f.title  # type: ignore[attr-defined]
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    decode = next(p for p in k.phases if p.phase == "decode")
    assert decode.families[0].family == "gemm" and decode.families[0].share_pct > 95
    assert "grouped_matmul" not in {r.family for r in k.families} and "low-bit-normal" not in {
        x.id for x in report.findings
    }
