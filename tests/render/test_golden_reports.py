"""The golden test: the report of every recorded fixture under tests/data, as committed in
tests/data/golden_reports.json.gz. A restructuring (modules moved, a package split) must leave every report identical;
an intended change of the analysis regenerates the file and says so in its commit:

    MAX_PROFILE_UPDATE_GOLDEN=1 python -m pytest tests/render/test_golden_reports.py

Floats compare to 1e-9 relative (numpy's summation order may differ between its versions); everything else exactly."""

from __future__ import annotations

import gzip
import json
import math
import os
from typing import Any

import pytest

import max_profile
from max_profile.errors import MaxProfileError
from max_profile.model import Report

from ..conftest import DATA, REPO

GOLDEN = DATA / "golden_reports.json.gz"
NOT_CAPTURES = (".md", ".txt", ".tsv", ".log", ".npz")


def recorded_reports() -> dict[str, Any]:
    """Every file under tests/data that max_profile reads as a capture or report, by its path: the report as JSON."""
    out: dict[str, Any] = {}
    for path in sorted(p for p in DATA.rglob("*") if p.is_file() and not p.name.endswith(NOT_CAPTURES) and p != GOLDEN):
        try:
            loaded = max_profile.load(str(path))
        except MaxProfileError:
            continue  # benchmark tables, ncu pages, server logs: data, not captures
        report = loaded if isinstance(loaded, Report) else max_profile.build_report(loaded)
        rel = str(path.relative_to(REPO))
        doc = json.loads(
            report.to_json().decode().replace(str(path), rel)
        )  # where the file was read: the same in any checkout
        if str(doc["capture"].get("target", "")).startswith(
            "import:"
        ):  # an import is stamped with the time it was read
            doc["capture"].pop("started_unix_s", None)
            doc["capture"].pop("ended_unix_s", None)
        out[rel] = doc
    return out


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, float) or isinstance(b, float):
        if (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
        ):
            return []
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_every_recorded_fixture_gives_its_committed_report() -> None:
    now = recorded_reports()
    assert len(now) >= 80, len(now)
    if os.environ.get("MAX_PROFILE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_bytes(gzip.compress(json.dumps(now, sort_keys=True, separators=(",", ":")).encode(), 9, mtime=0))
        pytest.skip(f"golden reports rewritten: {len(now)} fixtures")
    golden = json.loads(gzip.decompress(GOLDEN.read_bytes()))
    assert sorted(now) == sorted(golden), (
        f"fixtures added or removed: {sorted(set(now) ^ set(golden))}; "
        "MAX_PROFILE_UPDATE_GOLDEN=1 rewrites the golden file"
    )
    changed = {name: d for name in now if (d := differences(golden[name], now[name]))}
    assert not changed, "\n".join(f"{name}: {len(d)} difference(s), e.g. {d[:3]}" for name, d in changed.items())
