"""Every reader, fed mutated real captures: a typed refusal or a sane report, never a crash, garbage or hang.

A bounded sample (hypothesis picks the mutations; about a minute in all). ``benchmarks/fuzz.py`` runs
10,000 per reader with the same mutators and seeds (tests/fuzzing.py).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ...fuzzing import CATEGORIES, Reader, mutate_bytes, readers, run_one

READERS = (
    "nsys-sqlite",
    "nsys-gpu-trace-csv",
    "nsys-kern-sum-csv",
    "rocprofv3-csv",
    "rocpd",
    "kineto-json",
    "rocprofv3-json",
    "ncu-details-csv",
    "ncu-raw-csv",
    "nvtx-log",
    "raw-capture-json",
    "report-json",
    "serve-log",
)
EXAMPLES = {"nsys-sqlite": 80, "kineto-json": 100, "rocprofv3-json": 100}  # the slower readers get fewer inputs
DEFAULT_EXAMPLES = 150


@pytest.fixture(scope="module")
def fuzz_readers(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Reader], Path]:
    work = tmp_path_factory.mktemp("fuzz")
    return readers(work / "seeds"), work


def test_every_reader_has_a_seed_that_reads_clean(fuzz_readers: tuple[dict[str, Reader], Path]) -> None:
    """The harness's own check: each unmutated seed is accepted (a seed the reader refuses tests nothing)."""
    table, work = fuzz_readers
    assert set(table) == set(READERS)
    for reader in table.values():
        untouched = Reader(reader.name, reader.suffix, lambda path, rng: None, reader.read, reader.seed, reader.extra)
        outcome = run_one(untouched, random.Random(0), work, 0)
        assert outcome.category == "accepted", (reader.name, outcome)


@pytest.mark.parametrize("name", READERS)
def test_mutated_inputs_are_refused_or_read_sanely(name: str, fuzz_readers: tuple[dict[str, Reader], Path]) -> None:
    table, work = fuzz_readers
    reader = table[name]
    seen: dict[str, int] = dict.fromkeys(CATEGORIES, 0)

    @settings(
        max_examples=EXAMPLES.get(name, DEFAULT_EXAMPLES),
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(rng=st.randoms(use_true_random=False))
    def one(rng: random.Random) -> None:
        outcome = run_one(reader, rng, work, 0, hang_s=30.0)
        seen[outcome.category] += 1
        assert outcome.category in ("accepted", "refused"), f"{name}: {outcome.category}: {outcome.detail}"

    one()
    assert sum(seen.values()) >= 20, seen  # the sample really ran


def test_classifier_catches_crashes_garbage_and_hangs(fuzz_readers: tuple[dict[str, Reader], Path]) -> None:
    """The verdicts the fuzz tests rely on: an untyped exception, a negative time and a stall are findings."""
    import time

    from max_profile.errors import TraceFormatError
    from max_profile.model import KernelBreakdown

    table, work = fuzz_readers
    base = table["nvtx-log"]

    def reading(fn: object) -> Reader:
        return Reader("probe", base.suffix, lambda path, rng: None, fn, base.seed)  # type: ignore[arg-type]

    def crash(path: Path) -> None:
        raise KeyError("Kernel Name")

    def refuse(path: Path) -> None:
        raise TraceFormatError(f"{path}: damaged")

    def negative(path: Path) -> KernelBreakdown:
        return KernelBreakdown(
            source="probe", kernels=3, kernel_ms=-4991.9, attribution="none", families=[], top_kernels=[], phases=[]
        )

    def stall(path: Path) -> None:
        time.sleep(5)

    rng = random.Random(0)
    assert run_one(reading(crash), rng, work, 0).category == "untyped"
    assert run_one(reading(refuse), rng, work, 0).category == "refused"
    assert run_one(reading(negative), rng, work, 0).category == "garbage"
    assert run_one(reading(stall), rng, work, 0, hang_s=0.2).category == "hang"


def test_byte_mutator_changes_input() -> None:
    """A mutator that returned its input would make every fuzz test pass vacuously."""
    rng = random.Random(3)
    data = bytes(range(256)) * 8
    assert sum(mutate_bytes(data, rng) != data for _ in range(50)) >= 45
