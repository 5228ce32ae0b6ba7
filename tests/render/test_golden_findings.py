"""Every finding of the rules, field by field, on a few real captures (mutation testing found the findings'
evidence, advice, commands and confidence unpinned where no test read them).

The captures are the fewest raw recordings whose findings together hold every finding id the recorded reports show
(chosen once from tests/data/golden_reports.json.gz); each one's findings, next command and skipped rules must equal
what the golden file committed for it. Fast enough to run against every mutant (benchmarks/mutation.py); the golden
test holds every fixture's whole report.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

import max_profile
from max_profile.model import Report

from ..conftest import DATA, REPO
from ..render.test_golden_reports import GOLDEN, differences

COVER = [
    "tests/data/gpu/h200_llama3b_batch64_ledger/run_b64_3b_raw.json.gz",
    "tests/data/gpu/h200_llama180m_host_bound/small_ncu_gemv_raw.csv.gz",
    "tests/data/gpu/h200_llama_custom_ops_mode/ops_b_raw.json.gz",
    "tests/data/gpu/h200_llama5b_cupti_recorder/serve_kernels_raw.json.gz",
    "tests/data/gpu/h200_llama3b_batch64_ledger/kernel_b64_3b_raw.csv.gz",
    "tests/data/gpu/h200_llama1.75b_custom_architectures/arch_c_raw.json.gz",
    "tests/data/cpu/serve_sweep_c1_c2_raw.json.gz",
    "tests/data/gpu/h200_llama5b_every_verb/serve_sweep_raw.json.gz",
    "tests/data/gpu/h200_llama3b_batch64_ledger/attach_idle_3b_raw.json.gz",
    "tests/data/gpu/h200_llama180m_op_ranges_cuda13/ops_gpu_raw.json.gz",
    "tests/data/cpu/demo_ops_quiet_raw.json.gz",
    "tests/data/cpu/demo_ops_loaded_raw.json.gz",
    "tests/data/gpu/h200_llama5b_fp8_batch32_serve/run_fp8_raw.json.gz",
]
PINNED = ("findings", "next_command", "next_measurement", "rules_skipped")


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(gzip.decompress(GOLDEN.read_bytes()))  # type: ignore[no-any-return]


def test_the_cover_still_holds_every_finding_id_of_the_raw_captures(golden: dict[str, Any]) -> None:
    raw_ids = {f["id"] for k in COVER for f in golden[k]["findings"]}
    every = {f["id"] for v in golden.values() for f in v.get("findings", [])}
    assert len(raw_ids) >= 25 and every - raw_ids <= {
        "healthy-batched-decode",
        "low-bit-normal",
        "startup-custom-import-slow",
    }  # only in saved reports


@pytest.mark.parametrize("rel", COVER)
def test_findings_field_by_field(rel: str, golden: dict[str, Any]) -> None:
    path = REPO / rel
    assert path.is_relative_to(DATA)
    loaded = max_profile.load(str(path))
    assert not isinstance(loaded, Report)
    doc = json.loads(max_profile.build_report(loaded).to_json().decode().replace(str(path), rel))
    diffs = [d for key in PINNED for d in differences(golden[rel].get(key), doc.get(key), key)]
    assert not diffs, diffs[:5]
