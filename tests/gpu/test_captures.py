"""Real H200 captures of a 180M and a 7B Llama, three custom architectures and the serve modes
(tests/data/gpu/*/README.md says how each was made): exact numbers and verdicts."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

from max_profile.analyze.report import build_report
from max_profile.analyze.timeline import align_steps_to_ranges
from max_profile.collect.readers.nsys import nsys_capture, read_nsys_sqlite
from max_profile.errors import TraceFormatError
from max_profile.model import KernelBreakdown, RawCapture, Report, StepLedger, UtilizationSection

H200 = Path(__file__).parents[1] / "data" / "gpu"


def _load(name: str) -> tuple[RawCapture, Report]:
    folder = {"small": "h200_llama180m_host_bound", "big": "h200_llama7b_gemv_decode"}[name]
    raw = RawCapture.load(str(H200 / folder / f"{name}_cupti_raw.json.gz"))
    return raw, build_report(raw)


def _phase(k: KernelBreakdown, name: str):  # type: ignore[no-untyped-def]
    return next(p for p in k.phases if p.phase == name)


def test_big_model_is_healthy_gemv_bound_decode() -> None:
    raw, report = _load("big")
    assert report.capture.target == "OverlapTextGenerationPipeline"
    assert [s.phase for s in raw.steps if s.batch_size] == ["prefill"] + ["decode"] * 64
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    # 46 of the 19,626 CUPTI records carry zero timestamps (start = end = 0 before the clock mapping): dropped and
    # counted
    assert len(raw.kernels) == 19626 and k.invalid_kernels == 46 and k.kernels == 19580
    assert k.attribution == "launch time (any thread)" and k.step_source == "host steps" and k.unattributed_kernels == 0
    assert any("46 of 19626 kernel records had invalid timestamps" in n for n in report.notes)
    dec = _phase(k, "decode")
    assert dec.steps == 64 and dec.kernels == 19282  # 19,328 launched, 46 without valid timestamps
    assert 19282 / 64 == pytest.approx(301.28, abs=0.01)
    assert dec.kernels_per_step == pytest.approx(301.28, abs=0.01)  # the ledger's (rounded to 2 decimals per part)
    assert [f.family for f in dec.families[:4]] == ["gemv", "norm", "elementwise", "attention"]
    assert dec.families[0].share_pct == pytest.approx(86.8, abs=0.1)
    # the ledger's kernel time per step: concurrent kernels counted once (their summed durations are 3.814 ms)
    assert dec.kernel_ms_per_step == pytest.approx(3.759, abs=0.001)
    # the ledger's busy share of the decode step; a zero-time record once made a union block of -1.8e18 ns (100 %)
    assert dec.gpu_busy_pct == pytest.approx(85.6, abs=0.1)
    assert k.gpu_busy_pct == pytest.approx(84.8, abs=0.1)
    pre = _phase(k, "prefill")
    assert pre.families[0].family == "gemm" and pre.families[0].share_pct == pytest.approx(91.8, abs=0.1)
    ids = [f.id for f in report.findings]
    assert (
        "healthy-dense-decode" in ids and "gpu-bound" not in ids
    )  # healthy decode already says where the busy GPU's time goes
    assert "host-bound" not in ids and "kv-cache-broken" not in ids
    assert all(f.severity == "info" for f in report.findings)
    bw = next(f for f in report.findings if f.id == "decode-bandwidth")
    assert bw.evidence["pct_of_peak_kernel_time"] == pytest.approx(77.4, abs=0.1)  # over the ledger's kernel time
    assert report.next_measurement is None


def test_small_model_is_host_bound_and_stops_there() -> None:
    raw, report = _load("small")
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    dec = _phase(k, "decode")
    lg = report.ledger
    assert isinstance(lg, StepLedger)
    ldec = next(p for p in lg.phases if p.phase == "decode")
    assert dec.kernels_per_step == pytest.approx(50.0)
    assert dec.gpu_busy_pct == ldec.busy_pct == pytest.approx(7.9, abs=0.1)
    kernel_ms = sum(r.ms_per_step for r in ldec.rows if r.kind == "kernels")
    assert dec.kernel_us_per_token == pytest.approx(1e3 * kernel_ms / 1, rel=1e-4)  # batch 1
    assert dec.kernel_us_per_token == pytest.approx(191.4, abs=0.1)  # concurrent kernels once (summed: 193.5)
    host = next(
        f for f in report.findings if f.id == "host-bound" and f.lever is not None and f.lever.phase == "decode"
    )
    assert host.severity == "warning" and report.findings[0] is host
    # the ledger's busy share: the decode kernels' union over the ledger's decode time (the breakdown's 7.9 % is over
    # the host
    # steps' wall time, which the overlap pipeline shifts against the GPU)
    assert host.evidence["gpu_busy_pct"] == pytest.approx(7.9, abs=0.3)
    # NVML's 3 samples over the 0.17 s window (peak 10 %) are not evidence: it averages over up to 1 s; the kernel
    # timeline is
    assert "peak_utilization_pct" not in host.evidence and "healthy-dense-decode" not in {f.id for f in report.findings}
    assert any("0.17 s window (3 samples)" in n and "no verdict is drawn from it" in n for n in report.notes)
    assert report.next_measurement is None  # host-bound: a deeper trace adds nothing


def test_recorded_utilization_series() -> None:
    raw, report = _load("small")
    assert raw.utilization_unavailable is None
    assert {s.gpu for s in raw.samples} == {"nv0"}
    assert len(raw.samples) == 16
    assert all(s.memory_total_bytes == 150754820096 for s in raw.samples)
    assert all(s.max_sm_clock_mhz == 1980 for s in raw.samples)
    u = report.utilization
    assert isinstance(u, UtilizationSection)
    g = u.gpus[0]
    assert g.hardware_throttle_reasons == []  # 'gpu_idle' may be present but is not a hardware reason
    assert g.peak_utilization_pct == 10.0
    assert g.mean_sm_activity_pct is not None and g.mean_sm_activity_pct < 5  # NVML GPM on Hopper


def test_sampling_window_excludes_samples_outside_steps() -> None:
    raw, _ = _load("small")
    from max_profile.analyze.utilization import window_samples

    lo, hi = raw.steps[0].start_ns, raw.steps[-1].end_ns
    inside = window_samples(raw.samples, (lo, hi), int(raw.sample_interval_s * 1e9))
    assert 0 < len(inside) < len(raw.samples)


@pytest.fixture(scope="module")
def nsys_sqlite(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("nsys") / "small.sqlite"
    with gzip.open(H200 / "h200_llama180m_host_bound/small_nsys.sqlite.gz", "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return str(out)


def test_nsys_sqlite_kernels_and_ranges(nsys_sqlite: str) -> None:
    trace = read_nsys_sqlite(nsys_sqlite)
    assert len(trace.kernels) == 2046
    assert trace.gpu_names == ["NVIDIA H200"]
    names = [r.name for r in trace.ranges]
    assert names.count("max_profile:decode") == 40 and names.count("max_profile:prefill") == 1
    # every kernel's launch was found through CUPTI_ACTIVITY_KIND_RUNTIME
    assert trace.kernels.launch_ns is not None and (trace.kernels.launch_ns >= 0).all()
    # MAX launches from a worker thread, not the thread that holds the NVTX ranges
    range_tids = {r.tid for r in trace.ranges}
    assert trace.kernels.launch_tid is not None and not (set(trace.kernels.launch_tid.tolist()) & range_tids)


@pytest.mark.parametrize(
    ("edit", "step_source", "attribution", "gpu_named"),
    [
        # `nsys profile --trace=cuda` without the runtime API rows kept: kernels fall back to their start time
        ("DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME", "max_profile ranges", "start time", True),
        # no NVTX (no --trace=nvtx): no phases, busy % over the window still measured
        ("DROP TABLE NVTX_EVENTS", "none", None, True),
        ("DROP TABLE TARGET_INFO_GPU", "max_profile ranges", "launch time (any thread)", False),
        # exports whose kernel table names kernels by shortName only
        (
            "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN demangledName",
            "max_profile ranges",
            "launch time (any thread)",
            True,
        ),
    ],
)
def test_nsys_export_variants(
    nsys_sqlite: str, tmp_path: Path, edit: str, step_source: str, attribution: str | None, gpu_named: bool
) -> None:
    """Exports that lack what an older nsys, other trace flags or a partial export leave out still read; kernels are
    all kept."""
    import sqlite3

    db = tmp_path / "variant.sqlite"
    shutil.copyfile(nsys_sqlite, db)
    with sqlite3.connect(db) as con:
        con.execute(edit)
    report = build_report(nsys_capture(str(db)))
    bd = report.kernels
    assert isinstance(bd, KernelBreakdown) and bd.kernels == 2046 and bd.step_source == step_source
    assert bd.gpu_busy_pct is not None and 0 < bd.gpu_busy_pct < 100
    if attribution:
        assert bd.attribution.startswith(attribution) and _phase(bd, "decode").kernels == 2000
    assert bool(report.environment.gpus) == gpu_named


def test_nsys_export_without_string_table_is_refused(nsys_sqlite: str, tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "nostrings.sqlite"
    shutil.copyfile(nsys_sqlite, db)
    with sqlite3.connect(db) as con:
        con.execute("DROP TABLE StringIds")
    with pytest.raises(TraceFormatError, match="no StringIds table, so kernel names cannot be read"):
        nsys_capture(str(db))


def test_nsys_breakdown_by_launch_time_matches_cupti(nsys_sqlite: str) -> None:
    report = build_report(nsys_capture(nsys_sqlite))
    bd = report.kernels
    assert isinstance(bd, KernelBreakdown)
    assert bd.attribution == "launch time (any thread)" and bd.step_source == "max_profile ranges"
    assert bd.unattributed_kernels == 0 and bd.gpu_busy_pct == pytest.approx(6.97, abs=0.01)
    dec = _phase(bd, "decode")
    assert dec.steps == 40 and dec.kernels == 2000
    assert dec.kernels_per_step == pytest.approx(50.0)
    assert dec.families[0].family == "gemv"
    _, cupti = _load("small")
    assert isinstance(cupti.kernels, KernelBreakdown)
    cupti_dec = _phase(cupti.kernels, "decode")
    # the two tracers agree on the per-token kernel time within 1 %
    assert dec.kernel_ms_per_step == pytest.approx(cupti_dec.kernel_ms_per_step, rel=0.01)
    assert "host-bound" in {f.id for f in report.findings} and "healthy-dense-decode" not in {
        f.id for f in report.findings
    }
    assert report.step_summary is not None
    assert report.step_summary.source == ("max_profile ranges")  # type: ignore[union-attr]


def test_nsys_alignment_needs_one_range_per_step(nsys_sqlite: str) -> None:
    trace = read_nsys_sqlite(nsys_sqlite)
    raw, _ = _load("small")
    assert align_steps_to_ranges(raw.steps, trace.ranges) is None  # 65 steps vs 42 ranges: refused


# --- custom architectures on the H200 (benchmarks/gpu/archs_and_serve.sh archs1 / archs2) -----------------
# bf16, hidden 4096, 8 layers, 32 / 8 heads, 256 tokens, CUPTI; (a), (b), (c) share weights.


def _arch(name: str) -> Report:
    return build_report(
        RawCapture.load(str(H200 / "h200_llama1.75b_custom_architectures" / f"arch_{name}_raw.json.gz"))
    )


def _ids(report: Report) -> dict[str, str]:
    return {f.id: f.severity for f in report.findings}


def test_h200_correct_arch_no_error() -> None:
    """The correct custom architecture (graphs off, 8 layers): no error, fused attention, a GEMV-dominated decode; its
    GPU is busy 38.4 % of the decode step, under the host-bound threshold (40 %): host-bound, so not called healthy
    beside it."""
    r = _arch("a")
    assert "error" not in _ids(r).values() and "unfused-attention" not in _ids(r)
    host = next(f for f in r.findings if f.id == "host-bound" and f.lever is not None and f.lever.phase == "decode")
    assert host.severity == "warning" and host.evidence["gpu_busy_pct"] == pytest.approx(38.4, abs=0.1)
    assert "healthy-dense-decode" not in _ids(r)  # a lever of 62 % of the step remains: not healthy
    decode = next(p for p in r.kernels.phases if p.phase == "decode")  # type: ignore[union-attr]
    assert decode.families[0].family == "gemv" and decode.kernels_per_step == 86


def test_h200_unfused_attention_arch() -> None:
    r = _arch("b")
    ids = _ids(r)
    assert ids.get("unfused-attention") == "warning" and "kv-cache-broken" not in ids
    assert "healthy-dense-decode" not in ids  # superseded: its decode is not the healthy mix
    decode = next(p for p in r.kernels.phases if p.phase == "decode")  # type: ignore[union-attr]
    fams = {f.family for f in decode.families}
    assert "attention" not in fams and {"gemv", "gemm", "kv_cache", "elementwise"} <= fams
    assert decode.kernels_per_step == 200  # vs 86 with MAX's fused attention


def test_h200_no_kv_cache_arch() -> None:
    r = _arch("c")
    f = r.findings[0]
    assert f.id == "kv-cache-broken" and f.severity == "error"
    # the overlap pipeline keeps host step time flat on the GPU; the evidence is the re-fed sequence and the kernel mix
    assert "re-fed tokens" in str(f.evidence["signals"])
    assert f.evidence["decode_top_family"] == "gemm" and float(f.evidence["decode_gemm_share_pct"] or 0) > 80
    assert float(f.evidence["decode_vs_prefill_mix_similarity"] or 0) > 0.99
    ids = _ids(r)
    assert "decode-bandwidth-low" not in ids and "healthy-dense-decode" not in ids
    assert ids.get("throttled") == "info"  # sw_power_cap reported at 99.7 % of the max SM clock


def test_nsys_reader_wide_values_and_pid_filter(nsys_sqlite: str, tmp_path: Path) -> None:
    """A kernel longer than 2^31 ns keeps its duration (the old packing truncated it); --pid keeps one process."""
    import sqlite3

    base = read_nsys_sqlite(nsys_sqlite)
    wide = tmp_path / "wide.sqlite"
    shutil.copy(nsys_sqlite, wide)
    con = sqlite3.connect(wide)
    rowid, start = con.execute(
        "SELECT rowid, start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid LIMIT 1 OFFSET 7"
    ).fetchone()
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = ? WHERE rowid = ?", (start + 3_000_000_000, rowid))
    gpid = con.execute("SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()[0]
    con.commit()
    con.close()
    t = read_nsys_sqlite(str(wide))
    k, b = t.kernels, base.kernels
    assert len(k) == len(b) and int((k.end_ns - k.start_ns).max()) == 3_000_000_000
    same = (k.end_ns - k.start_ns) != 3_000_000_000
    assert (k.name_idx == b.name_idx).all() and ((k.end_ns - k.start_ns)[same] == (b.end_ns - b.start_ns)[same]).all()
    assert (k.launch_ns == b.launch_ns).all() and (k.launch_tid == b.launch_tid).all()
    assert len(read_nsys_sqlite(nsys_sqlite, pid=(gpid >> 24) & 0xFFFFFF).kernels) == len(b)
    assert len(read_nsys_sqlite(nsys_sqlite, pid=((gpid >> 24) & 0xFFFFFF) + 1).kernels) == 0


def _edited_copy(nsys_sqlite: str, dst: Path, *statements: str) -> Path:
    """A copy of the real export with SQL statements applied (damage, gaps, odd values)."""
    import sqlite3

    shutil.copy(nsys_sqlite, dst)
    con = sqlite3.connect(dst)
    for sql in statements:
        con.execute(sql)
    con.commit()
    con.close()
    return dst


def test_nsys_reader_windows_match_plain_sqlite(nsys_sqlite: str, tmp_path: Path) -> None:
    """Rowid windows (with gaps from deleted rows) read in parallel give the rows SQLite gives, in order."""
    import sqlite3

    from max_profile.collect.readers.nsys import TableRead, _read_int64_columns

    gappy = _edited_copy(
        nsys_sqlite,
        tmp_path / "gappy.sqlite",
        "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 7 = 3 OR rowid BETWEEN 300 AND 520",
    )
    con = sqlite3.connect(gappy)
    want_kernels = np.array(
        con.execute("SELECT start, end, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid").fetchall(),
        dtype=np.int64,
    )
    want_api = np.array(
        con.execute(
            "SELECT correlationId, coalesce(globalTid, 0) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId > 100 "
            "ORDER BY rowid"
        ).fetchall(),
        dtype=np.int64,
    )
    con.close()
    reads = [
        TableRead("CUPTI_ACTIVITY_KIND_KERNEL", ("start", "end", "correlationId")),
        TableRead("CUPTI_ACTIVITY_KIND_RUNTIME", ("correlationId", "globalTid"), "correlationId > 100"),
    ]
    kernels, api = _read_int64_columns(str(gappy), reads, window=97)
    assert len(kernels[0]) == len(want_kernels) > 1000
    for i in range(3):
        assert (kernels[i] == want_kernels[:, i]).all()
    assert len(api[0]) == len(want_api) > 0 and (api[0] == want_api[:, 0]).all() and (api[1] == want_api[:, 1]).all()
    whole = read_nsys_sqlite(str(gappy))
    assert len(whole.kernels) == len(want_kernels)


def test_nsys_reader_non_integer_column_is_a_format_error(nsys_sqlite: str, tmp_path: Path) -> None:
    bad = _edited_copy(
        nsys_sqlite,
        tmp_path / "text in start.sqlite",
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = 5",
    )
    with pytest.raises(TraceFormatError, match=r"text in start\.sqlite.*not integers"):
        read_nsys_sqlite(str(bad))


@pytest.mark.parametrize("spread", [1, 10**12])
def test_join_helpers_agree_with_numpy(spread: int) -> None:
    """Table lookups (dense ids) and the sorted-search fallback (sparse ids) give np.unique's answer."""
    from max_profile.collect.readers.nsys import _dense_codes, _positions_of

    rng = np.random.default_rng(7)
    ids = rng.integers(0, 5000, 20_000) * spread
    uniq, codes = _dense_codes(ids)
    want_uniq, want_codes = np.unique(ids, return_inverse=True)
    assert (uniq == want_uniq).all() and (codes == want_codes).all()
    keys = rng.permutation(np.arange(1, 30_001) * spread)
    wanted = np.concatenate([keys[:5000], np.array([0, -3, 30_001 * spread + 1])])
    pos = _positions_of(keys, wanted)
    assert (keys[pos[:5000]] == wanted[:5000]).all() and (pos[5000:] == -1).all()


def test_nsys_ranges_filtered_in_sqlite_among_many_op_ranges(nsys_sqlite: str, tmp_path: Path) -> None:
    """Per-op ranges of another domain (MAX with profiling on) are counted, not returned; MAX's
    scheduler ranges and ours are returned, in time order."""
    import sqlite3

    base = read_nsys_sqlite(nsys_sqlite)
    busy = tmp_path / "ops.sqlite"
    shutil.copy(nsys_sqlite, busy)
    con = sqlite3.connect(busy)
    gtid, t0 = con.execute("SELECT globalTid, min(start) FROM NVTX_EVENTS WHERE eventType = 59").fetchone()
    con.execute(
        "INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (0, 75, 'max', ?, 2)", (gtid,)
    )
    con.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?, ?, 59, ?, ?, 2)",
        [(t0 + i, t0 + i + 5, "mo.matmul" if i % 2 else "mo.rms_norm", gtid) for i in range(60_000)],
    )
    sched = "_schedule(TextGenerationInputs(batch_size=1, batch_type=TG))"
    con.execute(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?, ?, 59, ?, ?, 0)",
        (t0 - 10, t0 - 5, sched, gtid),
    )
    con.execute(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?, ?, 59, 'x_schedule(y)', "
        "?, 0)",
        (t0 - 9, t0 - 6, gtid),
    )
    con.commit()
    con.close()
    t = read_nsys_sqlite(str(busy))
    assert t.all_range_names["max:mo.matmul"] == 30_000 and t.all_range_names["max:mo.rms_norm"] == 30_000
    assert t.all_range_names[":" + sched] == 1
    assert [r.name for r in t.ranges] == [sched] + [r.name for r in base.ranges]
    assert [r.start_ns for r in t.ranges] == sorted(r.start_ns for r in t.ranges)
    assert {k: v for k, v in t.all_range_names.items() if k.startswith("max_profile:")} == base.all_range_names


def test_nsys_reader_corrupt_kernel_pages_are_a_format_error(nsys_sqlite: str, tmp_path: Path) -> None:
    """A file whose schema reads but whose kernel rows are damaged fails inside the Arrow reader:
    still one TraceFormatError naming the file."""
    import sqlite3

    con = sqlite3.connect(nsys_sqlite)
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'").fetchone()[0]
    page = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    bad = tmp_path / "damaged.sqlite"
    shutil.copy(nsys_sqlite, bad)
    with open(bad, "r+b") as fh:
        fh.seek((root + 2) * page)  # a leaf page of the kernel table, past its root
        fh.write(b"\xff" * page)
    with pytest.raises(TraceFormatError, match=r"damaged\.sqlite: corrupt or truncated SQLite file"):
        read_nsys_sqlite(str(bad))


def test_serve_tracer_overhead_explains_the_low_utilization_of_in_worker_cupti() -> None:
    """Real H200 `max serve` reports of one model: in-worker CUPTI took 3.87 s of a 10 s window and the
    utilization fell from 36-47 % to 8.8 %; with the tracer's share known, host-bound gives way to
    tracer-overhead; the run with no tracer at all has no host-bound finding."""
    import re

    import msgspec

    from max_profile.analyze.rules import evaluate

    folder = H200 / "h200_llama1.75b_serve_modes"
    traced = Report.load(str(folder / "serve_kernels_report.json"))
    untraced = Report.load(str(folder / "serve_utilization_report.json"))
    nsys = Report.load(str(folder / "serve_nsys_report.json"))
    assert isinstance(traced.kernels, KernelBreakdown) and isinstance(traced.utilization, UtilizationSection)
    assert {f.id for f in traced.findings} >= {"host-bound"}  # what the report said before the rule existed
    seconds = float(
        re.search(
            r"([\d.]+) s in CUPTI "
            r"callbacks",
            traced.kernels.source,
        ).group(1)
    )  # type: ignore[union-attr]
    assert seconds == pytest.approx(3.87)
    overhead_pct = 100 * seconds / traced.serve.window_s  # type: ignore[union-attr]
    traced.kernels = msgspec.structs.replace(traced.kernels, tracer_overhead_pct=overhead_pct)  # type: ignore[arg-type]
    traced.findings = evaluate(traced)
    ids = {f.id: f for f in traced.findings}
    assert "tracer-overhead" in ids and "host-bound" not in ids
    from max_profile.analyze.commands import next_measurement

    assert (next_measurement(traced) or "").startswith(
        "max-profile serve --model-path /tmp/m8 --devices gpu --mode utilization"
    )
    assert ids["tracer-overhead"].evidence["mean_utilization_pct_while_tracing"] == pytest.approx(8.8, abs=0.1)
    for other in (untraced, nsys):
        assert other.serve is not None and traced.serve is not None
        assert other.serve.output_tokens > 3 * traced.serve.output_tokens
        assert (
            isinstance(other.utilization, UtilizationSection)
            and other.utilization.gpus[0].mean_utilization_pct > 4 * 8.8
        )  # type: ignore[operator]
    assert "host-bound" not in {
        f.id for f in evaluate(untraced)
    }  # 46.6 % with no tracer (nsys: 36.0 %, still host-bound)


def test_nsys_export_with_graphs_recorded_whole_is_marked_unreliable(nsys_sqlite: str, tmp_path: Path) -> None:
    """A FAKE graph-level export made from the real one: each decode step's 50 kernels replaced by one
    CUPTI_ACTIVITY_KIND_GRAPH_TRACE row (what `nsys profile` records by default, --cuda-graph-trace=graph, when MAX
    replays device graphs). The kernel timeline then misses most GPU work: no host-bound verdict from it, the
    breakdown marked unreliable, and the note says how to record the kernels."""
    import sqlite3

    db = tmp_path / "graph_level.sqlite"
    shutil.copyfile(nsys_sqlite, db)
    with sqlite3.connect(db) as con:
        con.execute(
            "CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId "
            "INTEGER, "
            "contextId INTEGER, greenContextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER, "
            "graphId INTEGER, "
            "graphExecId INTEGER)"
        )
        steps = con.execute(
            "SELECT n.start, n.end FROM NVTX_EVENTS n JOIN StringIds s ON n.textId = s.id "
            "WHERE s.value = 'decode' AND n.eventType = 59 ORDER BY n.start"
        ).fetchall()  # our ranges, domain max_profile
        assert len(steps) == 40
        for s0, s1 in steps:
            rows = con.execute(
                "SELECT k.start, k.end, k.deviceId, k.streamId, k.correlationId, k.globalPid FROM "
                "CUPTI_ACTIVITY_KIND_KERNEL k "
                "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId WHERE r.start >= ? AND "
                "r.start < ?",
                (s0, s1),
            ).fetchall()
            assert len(rows) == 50
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (?, ?, ?, 1, 0, ?, ?, ?, 7, 7)",
                (min(r[0] for r in rows), max(r[1] for r in rows), rows[0][2], rows[0][3], rows[0][4], rows[0][5]),
            )
            con.executemany("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE correlationId = ?", [(r[4],) for r in rows])
    raw = nsys_capture(str(db))
    assert raw.graph_launches == 40 and len(raw.kernels) == 46 and raw.capture.device_graph_capture is True
    assert any("40 device-graph replays" in n and "--cuda-graph-trace=node" in n for n in raw.notes)
    report = build_report(raw)
    bd = report.kernels
    assert isinstance(bd, KernelBreakdown) and bd.unreliable is not None and "graph" in bd.unreliable
    ids = {f.id for f in report.findings}
    assert "device-graphs" in ids and "host-bound" not in ids  # the untouched export says host-bound (test above)
    with sqlite3.connect(db) as con:  # every kernel inside graphs: nsys then writes no kernel table at all
        con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    with pytest.raises(TraceFormatError, match="device-graph replays but no kernel.*--cuda-graph-trace=node"):
        nsys_capture(str(db))
