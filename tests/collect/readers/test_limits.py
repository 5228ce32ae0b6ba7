"""Hostile sizes: a gzip bomb, a 10 GB file, JSON nested 100,000 deep, an SQLite table past the row limit.

Each ends in bounded memory and time or in one clear refusal with exit 2. Memory is the peak RSS of the
CLI process, read by a fresh wrapper process (``getrusage(RUSAGE_CHILDREN)`` counts only its own child).
``benchmarks/resource_limits.py`` runs the full-size SQLite case (10^8 kernel rows).
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ...conftest import REPO, error_message
from ...nsys_schema import make_nsys_sqlite

GiB = 1 << 30
MEMORY_BOUND_KIB = 1_000_000  # 1 GB


def _run_measured(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str, int]:
    """Exit code, stderr and peak RSS (KiB) of ``max-profile ARGS`` run as the only child of a fresh process."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-m', 'max_profile', *sys.argv[1:]], capture_output=True, text=True)\n"
        "sys.stderr.write(r.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(r.returncode)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", wrapper, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=str(REPO),
    )
    return res.returncode, res.stderr, int(res.stdout.strip().splitlines()[-1])


def _error_line(stderr: str) -> str:
    return error_message(stderr)


def _gzip_bomb(path: Path, decompressed: int) -> None:
    """Gzip members of 1 MiB of zeros, concatenated (valid gzip: readers decompress them in sequence)."""
    member = gzip.compress(b"\0" * (1 << 20), compresslevel=9)
    with open(path, "wb") as fh:
        fh.write(gzip.compress(b'{"traceEvents": [', compresslevel=9))
        for _ in range(decompressed >> 20):
            fh.write(member)


@pytest.mark.parametrize("verb", [["kernels", "--import"], ["report"]])
def test_gzip_bomb_is_refused_within_bounded_memory(tmp_path: Path, verb: list[str]) -> None:
    bomb = tmp_path / "trace.json.gz"
    _gzip_bomb(bomb, 2 * GiB)
    assert bomb.stat().st_size < 4 << 20  # 2 GiB of output from about 2 MiB
    rc, err, peak_kib = _run_measured(*verb, str(bomb))
    assert rc == 2
    line = _error_line(err)
    assert str(bomb) in line and "gzip bomb" in line and "MAX_PROFILE_MAX_INPUT_MB" in line
    assert peak_kib < MEMORY_BOUND_KIB, f"peak RSS {peak_kib} KiB"


def test_input_limit_is_configurable(tmp_path: Path) -> None:
    bomb = tmp_path / "trace.json.gz"
    _gzip_bomb(bomb, 40 << 20)
    rc, err, _ = _run_measured("kernels", "--import", str(bomb), env={"MAX_PROFILE_MAX_INPUT_MB": "16"})
    assert rc == 2 and "more than 16 MiB" in _error_line(err)
    rc, err, _ = _run_measured("kernels", "--import", str(bomb), env={"MAX_PROFILE_MAX_INPUT_MB": "sixteen"})
    assert rc == 2 and "MAX_PROFILE_MAX_INPUT_MB='sixteen'" in _error_line(err)


@pytest.mark.parametrize("name", ["trace.json", "kernel_trace.csv", "raw.json"])
def test_ten_gigabyte_file_is_refused_before_reading(tmp_path: Path, name: str) -> None:
    big = tmp_path / name
    with open(big, "wb") as fh:  # sparse: 10 GB long, a few bytes on disk
        fh.write(b'{"traceEvents": [' if name.endswith(".json") else b'"Kind","Agent_Id","Kernel_Name"\n')
        fh.truncate(10 * 10**9)
    verb = ["report"] if name == "raw.json" else ["kernels", "--import"]
    rc, err, peak_kib = _run_measured(*verb, str(big), timeout=120)
    assert rc == 2
    line = _error_line(err)
    assert str(big) in line and "9.3 GiB is more than the 512 MiB" in line
    assert peak_kib < MEMORY_BOUND_KIB


@pytest.mark.parametrize("shape", ["kineto", "bare-list", "raw-capture", "report"])
def test_json_nested_100000_deep_is_refused(tmp_path: Path, shape: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    doc = {
        "kineto": '{"traceEvents": ' + deep + "}",
        "bare-list": deep,
        "raw-capture": '{"schema_version": 2, "environment": ' + deep + "}",
        "report": '{"schema_version": 3, "findings": ' + deep + "}",
    }[shape]
    path = tmp_path / f"{shape}.json"
    path.write_text(doc)
    verb = ["kernels", "--import"] if shape in ("kineto", "bare-list") else ["report"]
    rc, err, peak_kib = _run_measured(*verb, str(path), timeout=120)
    assert rc == 2
    line = _error_line(err)
    assert str(path) in line and "nested" in line
    assert peak_kib < MEMORY_BOUND_KIB


def test_sqlite_table_past_the_row_limit_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "cap.sqlite"
    make_nsys_sqlite(db, decode_steps=24)
    con = sqlite3.connect(db)
    kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.close()
    rc, err, _ = _run_measured("kernels", "--import", str(db), env={"MAX_PROFILE_MAX_ROWS": str(kernels - 1)})
    assert rc == 2
    line = _error_line(err)
    assert f"CUPTI_ACTIVITY_KIND_KERNEL holds {kernels:,} rows" in line and "MAX_PROFILE_MAX_ROWS" in line
    rc, err, _ = _run_measured(
        "kernels", "--import", str(db), "--json", str(tmp_path / "r.json"), env={"MAX_PROFILE_MAX_ROWS": str(kernels)}
    )
    assert rc == 0, err
    assert json.loads((tmp_path / "r.json").read_text())["kernels"]["kernels"] == kernels


def test_sqlite_rowids_far_apart_read_in_one_pass(tmp_path: Path) -> None:
    """An edited export whose rowids jump to 2^62: read sequentially, not as 10^13 empty windows."""
    from max_profile.collect.readers.nsys import read_nsys_sqlite

    db = tmp_path / "cap.sqlite"
    make_nsys_sqlite(db, decode_steps=4)
    before = read_nsys_sqlite(str(db))
    con = sqlite3.connect(db)
    con.execute(
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET rowid = rowid + 4611686018427387904 WHERE rowid = (SELECT max(rowid) "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL)"
    )
    con.commit()
    con.close()
    after = read_nsys_sqlite(str(db))
    assert len(after.kernels) == len(before.kernels)
    assert sorted(after.kernels.start_ns.tolist()) == sorted(before.kernels.start_ns.tolist())


def test_truncated_gzip_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": []}' * 1000)[:-20])
    rc, err, _ = _run_measured("kernels", "--import", str(path))
    assert rc == 2 and "truncated or corrupt gzip" in _error_line(err)
