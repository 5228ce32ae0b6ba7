"""Profilers that wrap a launched process (the ``ProcessTool`` protocol): ``nsys profile`` around a generation.

CI has no nsys: the SQLite export nsys writes is generated in its documented schema (tests/nsys_schema.py) where the
tool would have written it; the tool itself is never faked here, only its output file."""

from __future__ import annotations

from pathlib import Path

import pytest

from max_profile.collect.live.recorders import ProcessTool
from max_profile.errors import CaptureError
from max_profile.model import Capture, Environment, RawCapture
from max_profile.nsys_run import NsysProfileTool, nsys_profile_command

from ..nsys_schema import make_nsys_sqlite


def test_nsys_profile_wraps_the_process_and_reads_its_export_into_the_capture(tmp_path: Path) -> None:
    base = str(tmp_path / "capture")
    tool: ProcessTool = NsysProfileTool("/opt/nsys/bin/nsys", base)
    cmd = tool.command(["python", "-c", "child"])
    assert cmd == [*nsys_profile_command("/opt/nsys/bin/nsys", base), "python", "-c", "child"]
    assert "--capture-range=cudaProfilerApi" in cmd and cmd[cmd.index("-o") + 1] == base and tool.env() == {}
    env = Environment(vendor="nvidia", vendor_reason="test")
    raw = RawCapture(environment=env, capture=Capture(started_unix_s=0.0, target="test"))
    with pytest.raises(CaptureError, match=r"wrote no .*capture\.sqlite"):
        tool.read_after_teardown(raw, (0, 0))
    exp = make_nsys_sqlite(Path(base + ".sqlite"), seed=2)
    tool.read_after_teardown(raw, (0, 0))
    assert len(raw.kernels) == sum(exp.kernels.values()) + exp.between_steps
    assert raw.kernel_source.startswith("nsys") and raw.capture.collectors[-1] == "nsys"
    assert tool.artifacts() == [f"{base}.nsys-rep  (open with: nsys-ui {base}.nsys-rep)", base + ".sqlite"]
