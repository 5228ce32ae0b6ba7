"""The controller's read of one served window from every recording process (``WorkerHook.read``): its coverage is
the model worker's, also when none of the worker's kernels fell inside the window (H100: two default
windows read back with the API server's empty coverage, hiding what the worker had recorded)."""

from __future__ import annotations

import json
from pathlib import Path

from max_profile.collect.server.worker_protocol import WorkerHook
from max_profile.model import KernelRecord, KernelTable

MS = 1_000_000


def _process(folder: Path, pid: str, kernels: list[KernelRecord], note: str) -> None:
    (folder / f"ready-{pid}").write_text(json.dumps({"kernels": True, "steps": True}))
    coverage = {"started_ns": 0, "stopped_ns": 100 * MS, "notes": [note], "kernels": len(kernels), "share": 1.0}
    (folder / f"coverage-{pid}-1.json").write_text(json.dumps(coverage))
    (folder / f"kernels-{pid}-1.json").write_bytes(KernelTable.from_records(kernels).to_json())


def test_the_coverage_read_is_the_recording_process_even_with_no_kernel_in_the_window(tmp_path: Path) -> None:
    late = [KernelRecord(name="gemv", start_ns=(200 + i) * MS, end_ns=(200 + i) * MS + 1000) for i in range(50)]
    _process(tmp_path, "1498", [], "api server: nothing recorded")
    _process(tmp_path, "1610", late, "model worker: 50 kernels")
    kernels, coverage = WorkerHook(tmp_path).read(1, (0, 100 * MS), lambda: True, timeout_s=1)
    assert kernels is not None and len(kernels) == 0  # every kernel after the window
    assert coverage is not None and coverage.notes == ("model worker: 50 kernels",)
    assert coverage.recorded_kernels == 50
    # inside the window the process with kernels there wins, as before
    _process(tmp_path, "1498", late[:2] + [KernelRecord(name="x", start_ns=5 * MS, end_ns=6 * MS)], "api: one inside")
    kernels, coverage = WorkerHook(tmp_path).read(1, (0, 100 * MS), lambda: True, timeout_s=1)
    assert kernels is not None and len(kernels) == 1 and coverage is not None and coverage.notes == ("api: one inside",)
