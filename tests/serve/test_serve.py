"""`max-profile serve` against real `max serve` on the CPU (tiny model): end to end, and fault injection.

Every case checks that nothing is left behind: no process of the server's (found by its port in
/proc), no temp folder, and a foreign process with "max" in its name still running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from max_profile.analyze.report import build_report
from max_profile.errors import MaxProfileError as ServeError
from max_profile.model import KernelBreakdown, Report, StepLedger, Unavailable
from max_profile.serve import ResolvedServe, ServePlan, resolve_plan
from max_profile.serve import run_serve_capture as capture_raw
from max_profile.util.procs import clean_child_env

from ..conftest import REPO, default_sigint, procs_with
from ..ports import free_port


def run_serve_capture(plan: ServePlan, **kw: object) -> Report:
    """The serve capture through the one pipeline: RawCapture -> build_report."""
    return build_report(capture_raw(plan, **kw))  # type: ignore[arg-type]


pytestmark = pytest.mark.slow


def serve_tmpdirs() -> set[str]:
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).glob("max-profile-serve-*")}


@pytest.fixture()
def foreign_max_process() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["bash", "-c", "exec -a max-serve-foreign-process sleep 600"], start_new_session=True)
    yield proc
    assert proc.poll() is None, "a foreign process with 'max' in its name was killed"
    proc.kill()
    proc.wait()


def _plan(model: Path, **kw: object) -> ServePlan:
    base = {
        "model_path": str(model),
        "devices": "cpu",
        "mode": "utilization",
        "duration_s": 3.0,
        "port": free_port(),
        "metrics_port": free_port(),
        "max_tokens": 8,
    }
    base.update(kw)
    return ServePlan(**base)  # type: ignore[arg-type]


def _assert_clean(port: int, before_tmp: set[str]) -> None:
    deadline = time.monotonic() + 10
    while procs_with(f"--port {port}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not procs_with(f"--port {port}"), "server processes left running"
    assert serve_tmpdirs() <= before_tmp, "temp folder left behind"


def test_utilization_mode_end_to_end(
    tiny_model_dir: Path, foreign_max_process: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """`serve --concurrency 1,2 --slo ...`: one server, a window per level, the server's own metrics per level."""
    before = serve_tmpdirs()
    plan = _plan(tiny_model_dir, concurrency=[1, 2], slo_ms={"ttft": 500.0, "itl": 100.0})
    report = run_serve_capture(plan, confirm=True, artifacts_dir=str(tmp_path / "art"))
    s = report.serve
    assert s is not None and s.requests >= 2 and s.failed_requests == 0
    assert s.ttft_ms_p50 is not None and s.itl_ms_p50 is not None and s.time_to_ready_s is not None
    assert isinstance(report.utilization, Unavailable) and "no GPU" in report.utilization.reason
    assert [lv.concurrency for lv in report.load_levels] == [1, 2]
    for lv in report.load_levels:
        assert (
            lv.completed > 0 and lv.output_tok_per_s > 0 and lv.ttft_ms.p50 is not None and lv.goodput_rps is not None
        )
        assert lv.server is not None and lv.server.requests and lv.server.batches.get("TG")
    assert (tmp_path / "art" / "server.log").read_text().strip()
    # MAX's own spans split the window by prefill / decode (no hook in this mode): one step per forward pass
    assert {st.phase for st in report.steps} >= {"prefill", "decode"}
    assert {st.replica for st in report.steps} == {"max-profile-serve"}
    replica = report.replicas[0]
    # the requests that ended inside the windows, as the server's spans tell them (a prefill pass may hold two)
    assert replica.passes == len(report.steps) and replica.requests >= 0.9 * s.requests
    _assert_clean(plan.port, before)


def test_kernels_mode_uses_scheduler_ranges(tiny_model_dir: Path) -> None:
    """`serve --mode kernels` on the CPU: MAX's op ranges split by its scheduler ranges, and the model worker's own
    batches stamped by the hook (prefill / decode, size, tokens): the report's steps, step times by batch size and its
    ledger; MAX's spans asked for too (off by default here: the hook stamps every pass), to hold the two against each
    other. The op-range log is written only while a window records: the untraced reference window first measures what
    recording costs this server."""
    plan = _plan(tiny_model_dir, mode="kernels", warm=False, duration_s=4.0, concurrency=[2], spans=True)
    raw = capture_raw(plan, confirm=True)
    report = build_report(raw)
    k = report.kernels
    assert isinstance(k, KernelBreakdown), k
    phases = {p.phase: p for p in k.phases}
    assert phases["decode"].steps > 5 and "attention" in {f.family for f in k.families}
    assert "--no-device-graph-capture" in report.serve.commands[0]  # type: ignore[union-attr]
    # the worker's batches, on the host clock of the window
    w0, w1 = raw.window_ns  # type: ignore[misc]
    assert raw.steps and all(w0 <= st.start_ns <= w1 for st in raw.steps)
    kinds = {st.phase for st in raw.steps}
    assert {"prefill", "decode"} <= kinds, kinds
    assert all(st.input_tokens == st.batch_size for st in raw.steps if st.phase == "decode")
    assert all(st.input_tokens > st.batch_size and st.context_tokens == 0 for st in raw.steps if st.phase == "prefill")
    summary = report.step_summary
    assert summary is not None and summary.source == ("model worker steps")  # type: ignore[union-attr]
    assert summary.ttft_ms is None  # type: ignore[union-attr]
    assert {b.batch_size for b in summary.by_batch if b.phase == "decode"} == {
        st.batch_size for st in raw.steps if st.phase == "decode"
    }  # type: ignore[union-attr]
    ledger = report.ledger
    assert isinstance(ledger, StepLedger) and {p.phase for p in ledger.phases} >= {"prefill", "decode"}
    assert ledger.requests_in_flight_pct is not None and ledger.requests_in_flight_pct > 90
    # MAX's spans of the same window agree with the hook: the passes, their prefill / decode split (a pass at either
    # edge of the window may fall on one side for one and the other side for the other) and the median pass within
    # 25 % (a span also holds the pass's response hand-off)
    a = raw.pass_agreement
    assert a is not None and a.span_passes > 5, a
    assert abs(a.span_passes - a.hook_steps) <= 2 and abs(a.span_prefill - a.hook_prefill) <= 1, a
    assert a.span_median_ms is not None and a.hook_median_ms is not None
    assert 0.75 <= a.span_median_ms / a.hook_median_ms <= 1.25, a
    # the op-range log is switched per window: an untraced reference window ran first and measured the recording
    assert [w.reference for w in raw.load_windows] == [True, False]
    assert report.tracer_cost is not None and report.tracer_cost.throughput_ratio is not None


def test_not_confirmed_starts_nothing(tiny_model_dir: Path) -> None:
    plan = _plan(tiny_model_dir)
    with pytest.raises(ServeError, match="not confirmed"):
        run_serve_capture(plan, confirm=lambda p: False)
    assert not procs_with(f"--port {plan.port}")


def test_missing_model_path() -> None:
    t = time.monotonic()
    with pytest.raises(ServeError, match="does not exist"):
        run_serve_capture(_plan(Path("/nonexistent/model")), confirm=True)
    assert time.monotonic() - t < 5


def test_port_already_taken(tiny_model_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t = time.monotonic()
        with pytest.raises(ServeError, match=f"port {port} is already in use"):
            run_serve_capture(_plan(tiny_model_dir, port=port), confirm=True)
        assert time.monotonic() - t < 5


def test_bad_flag_fails_fast_with_log_line(tiny_model_dir: Path) -> None:
    before = serve_tmpdirs()
    plan = _plan(tiny_model_dir, warm=False, extra_args=["--no-such-flag"])
    with pytest.raises(ServeError) as err:
        run_serve_capture(plan, confirm=True, ready_timeout_s=300)
    assert "No such option" in str(err.value) and "--no-such-flag" in str(err.value)
    _assert_clean(plan.port, before)


def test_server_killed_during_window(tiny_model_dir: Path) -> None:
    before = serve_tmpdirs()
    plan = _plan(tiny_model_dir, warm=False, duration_s=60.0)
    killed: list[float] = []

    def on_progress(msg: str) -> None:
        if msg.startswith("/health 200"):

            def kill() -> None:
                time.sleep(3)
                for pid in procs_with(f"--port {plan.port}"):
                    try:
                        os.killpg(os.getpgid(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                killed.append(time.monotonic())

            threading.Thread(target=kill, daemon=True).start()

    with pytest.raises(ServeError, match="died during the capture window"):
        run_serve_capture(plan, confirm=True, progress=on_progress)
    # noticed at the death, not at the window's end: the 60 s window would have run on for 55 s more (half of it is a
    # bound no busy machine reaches; a fixed few seconds was)
    assert killed and time.monotonic() - killed[0] < plan.duration_s / 2
    _assert_clean(plan.port, before)


@pytest.mark.parametrize("stage", ["warm pass", "/health 200"])
def test_ctrl_c(tiny_model_dir: Path, stage: str, foreign_max_process: subprocess.Popen[bytes]) -> None:
    before = serve_tmpdirs()
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "max_profile",
        "serve",
        "--model-path",
        str(tiny_model_dir),
        "--port",
        str(port),
        "--duration",
        "60",
        "--yes",
        "--max-tokens",
        "8",
    ]
    if stage != "warm pass":
        cmd.append("--no-warm")
    # clean_child_env: an in-process MAX load earlier in this pytest process set PYTHONEXECUTABLE in the C environment
    with default_sigint():  # Ctrl-C must reach it even when this test run was started with SIGINT ignored
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO), env=clean_child_env()
        )
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if stage in line:
            break
    # the stage's line is the event: the CLI's handlers are in place from its start (no sleep to win a race)
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=60)  # an interrupted capture ends; how fast depends on the machine's load, not judged here
    assert rc == 130, "".join(lines) + proc.stderr.read()
    assert "interrupted" in proc.stderr.read()
    _assert_clean(port, before)


# --- out-of-process profilers: nsys sessions (pure parts) and rocprofv3's three passes (fake tool) ---------


def test_nsys_session_names_and_stale_cleanup_touch_only_ours() -> None:
    from max_profile.collect.server import serve_profilers as sp

    listing = (  # `nsys sessions list -p false` as nsys 2025.3.1 prints it (research/formats.md §1.7)
        "         10850        00:04                                   Launched      1 s1\n"
        "         10851        01:10                                 Collection      1 max-profile-999999-0a1b2c3d\n"
        "         10852        00:01                                   Launched      1 "
        f"max-profile-{os.getpid()}-deadbeef\n"
    )
    sessions = sp.parse_nsys_sessions(listing)
    assert [(s[1], s[2]) for s in sessions] == [
        ("Launched", "s1"),
        ("Collection", "max-profile-999999-0a1b2c3d"),
        ("Launched", f"max-profile-{os.getpid()}-deadbeef"),
    ]
    # pid 999999 is gone: stale; ours (alive) and a foreign name are kept
    assert sp.stale_sessions(sessions, alive=lambda pid: pid != 999999) == ["max-profile-999999-0a1b2c3d"]
    a, b = sp.nsys_session_name(), sp.nsys_session_name()
    assert a != b and a.startswith(f"max-profile-{os.getpid()}-")
    cmd = sp.nsys_launch_command("/x/nsys", a, ["max", "serve", "--model-path", "m; rm -rf /"])
    assert (
        cmd[:3] == ["/x/nsys", "launch", f"--session-new={a}"] and cmd[-1] == "m; rm -rf /"
    )  # an argument, never a shell string
    assert (
        "--cuda-graph-trace=node" in cmd[: cmd.index("max")]
    )  # max serve replays device graphs: their kernels recorded one by one


def _fake_env(monkeypatch: pytest.MonkeyPatch, vendor: str) -> None:
    import msgspec

    from max_profile.collect.probes import environment
    from max_profile.model import Environment

    real = environment.detect_environment(check_tools=False)
    fake: Environment = msgspec.structs.replace(real, vendor=vendor, vendor_reason=f"FAKE for this test: {vendor}")
    monkeypatch.setattr(environment, "detect_environment", lambda check_tools=True: fake)
    monkeypatch.setattr("max_profile.serve.lifecycle.detect_environment", lambda check_tools=True: fake)


def test_wrong_vendor_and_missing_tool_start_nothing(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ServeError, match="--mode nsys needs an NVIDIA GPU; this machine has no GPU") as e:
        run_serve_capture(_plan(tiny_model_dir, mode="nsys"), confirm=True)
    assert e.value.exit_code == 2
    _fake_env(monkeypatch, "nvidia")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.raises(ServeError, match=r"nsys is needed for --mode nsys: .*Install: ") as e:
        run_serve_capture(_plan(tiny_model_dir, mode="nsys"), confirm=True)
    assert e.value.exit_code == 3
    with pytest.raises(ServeError, match="--mode rocprof needs an AMD GPU; this machine has nvidia"):
        run_serve_capture(_plan(tiny_model_dir, mode="rocprof"), confirm=True)


def test_rocprof_three_passes_with_fake_rocprofv3(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, foreign_max_process: subprocess.Popen[bytes]
) -> None:
    import json

    _fake_env(monkeypatch, "amd")  # FAKE: no AMD GPU on CI; tests/fakes/rocprofv3 stands in for the tool
    monkeypatch.setenv("PATH", f"{REPO / 'tests' / 'fakes'}{os.pathsep}{os.environ['PATH']}")
    before = serve_tmpdirs()
    from max_profile.collect.server import serve_profilers

    monkeypatch.setattr(serve_profilers, "ROCPROF_WINDOW_DELAY_S", 2.0)  # R2 + 10 s in use; 2 s keeps the test short
    plan = _plan(tiny_model_dir, mode="rocprof", duration_s=3.0, warm=False)  # the warm pass is tested by test_ctrl_c
    report = run_serve_capture(plan, confirm=True, artifacts_dir=str(tmp_path / "art"))
    args = json.loads(next((tmp_path / "art" / "rocprof").glob("fake_rocprofv3_args.json")).read_text())["argv"]
    delay, duration, repeat = (float(x) for x in args[args.index("--collection-period") + 1].split(":"))
    assert ["--kernel-trace", "--marker-trace", "--output-format", "csv"] == args[1:5]
    assert duration == 3.0 and repeat == 1 and 2.0 < delay < 2.0 + 120  # R2 + the settle delay
    assert tuple(args[args.index("--") + 1 :]) == resolve_plan(plan, "amd", check_tool=False).serve_command
    k = report.kernels
    assert isinstance(k, KernelBreakdown) and k.kernels > 1000  # ~1 per ms over the 3 s window
    assert {r.family for r in k.families} == {"gemv", "attention", "norm"}
    assert report.serve is not None and report.serve.requests > 0 and report.serve.mode == "rocprof"
    assert any(a.endswith("_kernel_trace.csv") for a in report.artifacts)
    _assert_clean(plan.port, before)


class _Child:
    """A stand-in for the served model's processes: any Python process with the hook on PYTHONPATH."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def alive(self) -> bool:
        return self.proc.poll() is None


@pytest.mark.parametrize("loads_driver", [False, True])
def test_worker_hook_prepares_before_the_window(tmp_path: Path, loads_driver: bool) -> None:
    """The sitecustomize hook answers `prepare`: a process without libcuda skips; one with it imports
    CUPTI up front (here a stand-in libcuda.so.1 and no usable CUPTI: it says why, before `start`)."""
    import shutil

    from max_profile.collect.server.worker_protocol import WorkerHook

    folder = tmp_path / "cupti"
    folder.mkdir()
    script = "import time\nwhile True: time.sleep(0.05)\n"
    if loads_driver:
        if shutil.which("gcc") is None:
            pytest.skip("gcc is needed to build the stand-in libcuda.so.1")
        (tmp_path / "empty.c").write_text("int max_profile_stand_in(void) { return 0; }\n")
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so.1"), str(tmp_path / "empty.c")], check=True
        )
        script = f"import ctypes\nctypes.CDLL({str(tmp_path / 'libcuda.so.1')!r})\n" + script
    hook = str(REPO / "max_profile" / "collect" / "server" / "worker_hook")
    # no libcupti for the C recorder (as on CI) and no cupti-python: nothing usable, said before `start`
    env = clean_child_env(
        {
            "MAX_PROFILE_WORKER_CUPTI_DIR": str(folder),
            "PYTHONPATH": hook + os.pathsep + str(REPO),
            "MAX_PROFILE_LIBCUPTI": str(tmp_path / "no-libcupti.so"),
        }
    )
    if not loads_driver:
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    try:
        time.sleep(0.5)
        assert not any(folder.iterdir()), "the hook must wait for `prepare`"
        line = WorkerHook(folder).prepare(_Child(proc).alive, timeout_s=3 if not loads_driver else 60)
        names = sorted(p.name for p in folder.iterdir())
        if loads_driver:
            assert f"unavailable-{proc.pid}.txt" in names and "CUPTI unavailable in the model worker" in line, (
                names,
                line,
            )
        else:
            deadline = time.monotonic() + 10
            while f"skipped-{proc.pid}.txt" not in names and time.monotonic() < deadline:
                time.sleep(0.05)
                names = sorted(p.name for p in folder.iterdir())
            assert f"skipped-{proc.pid}.txt" in names and not any(
                n.startswith(("ready-", "unavailable-")) for n in names
            ), names
            assert "no process answered as CUPTI-ready" in line
    finally:
        WorkerHook(folder).quit()
        proc.kill()
        proc.wait()


def test_kernel_modes_keep_maxs_device_graphs_on_nvidia_only(tiny_model_dir: Path) -> None:
    """On NVIDIA the kernel modes serve MAX's default configuration (CUPTI and nsys --cuda-graph-trace=node record each
    kernel inside device graphs); elsewhere graphs go off (MAX's op ranges and rocprof would see only replays); a
    choice the user passed after `--` is kept either way."""

    def cmd(**kw: object) -> list[str]:
        return list(resolve_plan(_plan(tiny_model_dir, **kw), "none", check_tool=False).serve_command)

    assert "--no-device-graph-capture" not in cmd(mode="kernels", vendor="nvidia")
    assert "--no-device-graph-capture" not in cmd(mode="nsys", vendor="nvidia")
    assert "--no-device-graph-capture" in cmd(mode="kernels", vendor="amd") and "--no-device-graph-capture" in cmd(
        mode="rocprof", vendor="amd"
    )
    assert "--no-device-graph-capture" not in cmd(mode="utilization", vendor="amd")
    assert (
        cmd(mode="kernels", vendor="amd", extra_args=["--device-graph-capture"]).count("--no-device-graph-capture") == 0
    )
    assert (
        cmd(mode="kernels", vendor="nvidia", extra_args=["--no-device-graph-capture"]).count(
            "--no-device-graph-capture"
        )
        == 1
    )
    nsys = resolve_plan(_plan(tiny_model_dir, mode="nsys", vendor="nvidia"), "nvidia", check_tool=False)
    assert "--cuda-graph-trace=node" in nsys.describe()
    # the ops mode needs every op launched eagerly, with its range: graphs off on NVIDIA too, unless the user says on
    assert "--no-device-graph-capture" in cmd(mode="ops", vendor="nvidia")
    assert "--no-device-graph-capture" not in cmd(mode="ops", vendor="nvidia", extra_args=["--device-graph-capture"])


def test_ops_mode_on_the_cpu_records_maxs_ops(tiny_model_dir: Path) -> None:
    """`serve --mode ops` on the CPU: no GPU kernel tracer, so MAX's op ranges are the work (as `--kernels nvtx-log`),
    with the worker's steps; the server runs with device graphs off and the capture says which mode recorded it."""
    plan = _plan(tiny_model_dir, mode="ops", warm=False, duration_s=2.0)
    raw = capture_raw(plan, confirm=True)
    assert raw.capture.collectors == ["serve:ops"] and raw.capture.profiling_mode == "on"
    assert raw.kernel_source == "nvtx-log (model worker ops, host time)" and len(raw.kernels)
    assert not len(raw.op_ranges)  # beside kernels only where CUPTI recorded them (NVIDIA)
    report = build_report(raw)
    k = report.kernels
    assert isinstance(k, KernelBreakdown) and any(p.phase == "decode" for p in k.phases)
    assert "--no-device-graph-capture" in report.serve.commands[0]  # type: ignore[union-attr]


def test_reference_window_is_planned_for_kernels_mode_and_can_be_skipped(tiny_model_dir: Path) -> None:
    """Kernels mode plans an untraced reference window (said in the plan where the recording is switched per window:
    CUPTI in the worker, or the gated log of MAX's op ranges); `--no-reference` and the other modes plan none."""
    from max_profile.flags import build_parser

    def resolved(**kw: object) -> ResolvedServe:
        return resolve_plan(_plan(tiny_model_dir, **kw), "none", check_tool=False)

    assert resolved(mode="kernels").reference_window
    assert not resolved(mode="kernels", reference=False).reference_window
    assert not any(resolved(mode=m).reference_window for m in ("utilization", "nsys", "rocprof"))
    assert "reference    one 3 s window without the recorder" in resolved(mode="kernels", vendor="nvidia").describe()
    assert "reference    one 3 s" in resolved(mode="kernels", vendor="none").describe()  # the op ranges' gated log
    assert "reference" not in resolved(mode="kernels", vendor="none", profiling_mode="off").describe()  # nothing to log
    args = build_parser().parse_args(
        ["serve", "--model-path", str(tiny_model_dir), "--mode", "kernels", "--no-reference"]
    )
    assert args.no_reference is True
    assert build_parser().parse_args(["serve", "--model-path", str(tiny_model_dir)]).no_reference is False


def test_worker_hook_records_several_windows(tmp_path: Path) -> None:
    """The hook records window after window of one server (A/B pairs, sweeps): the controller numbers only the windows
    it records, and each window's kernels and coverage come back on their own. The stand-in worker loads a stand-in
    libcuda and a FAKE collector (CI has no CUPTI) that returns one kernel per window at the time it was started; a
    second stand-in (the API server, which can have the CUDA driver loaded too) records nothing, and writes its empty
    file first: the read waits for every ready process (on the H200 the first empty file used to end the wait). The
    worker also runs a (FAKE) pipeline class: its steps come back per window beside the kernels (on the H200 the steps
    were read before the worker had written them: no phase split)."""
    import shutil

    from max_profile.collect.server.worker_protocol import WorkerHook

    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in libcuda.so.1")
    (tmp_path / "empty.c").write_text("int max_profile_stand_in(void) { return 0; }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so.1"), str(tmp_path / "empty.c")], check=True
    )
    script = f"""
import ctypes, time
ctypes.CDLL({str(tmp_path / "libcuda.so.1")!r})
import max_profile.collect.live.cupti_native as native
from max_profile.model import KernelRecord, KernelTable

class FakeCollector:  # FAKE: stands in for the C CUPTI recorder
    dropped = 0; api_records = 3; callback_s_before_stop = 0.01; api_filter = "fake"; unfinished = 0
    def start(self): self.t = time.perf_counter_ns()
    def stop(self):
        return KernelTable.from_records([KernelRecord(name="gemv_split_k_fake", start_ns=self.t + 1000,
                                                      end_ns=self.t + 2000)])

class IdleCollector(FakeCollector):  # FAKE: a process with the driver loaded that launches nothing
    def stop(self): return KernelTable.empty()

import sys
if sys.argv[1] == "worker":
    _stop = FakeCollector.stop
    def slow_stop(self):
        time.sleep(0.5)  # the worker's flush and dump take longer than the idle process's
        return _stop(self)
    FakeCollector.stop = slow_stop
native.make_cupti_collector = (
    lambda notes, launches=True: FakeCollector() if sys.argv[1] == "worker" else IdleCollector())
open({str(tmp_path)!r} + "/patched-" + sys.argv[1], "w").close()  # the event the test waits for (no sleep)
if sys.argv[1] != "worker":
    while True: time.sleep(0.05)
# FAKE: the worker's pipeline, as a module at MAX's path with MAX's interface name (the hook finds classes, not objects:
# the real worker freezes its heap with gc.freeze()); its loop calls execute on decode batches of 2 requests
import types
mod = types.ModuleType("max.pipelines.lib.pipeline_variants.text_generation")
class TextGenerationPipelineInterface: pass
class FakeOverlapPipeline(TextGenerationPipelineInterface):
    def execute(self, inputs):
        time.sleep(0.002)
        return dict()
mod.TextGenerationPipelineInterface = TextGenerationPipelineInterface
sys.modules[mod.__name__] = mod
class Kind: value = "TG"
class Inputs:
    flat_batch = [object(), object()]; input_tokens = 2; context_tokens = 40; batch_type = Kind()
pipeline = FakeOverlapPipeline()
while True: pipeline.execute(Inputs())
"""
    folder = tmp_path / "cupti"
    hook = WorkerHook(folder)
    env = clean_child_env(
        {
            **hook.env(None, launches=False),
            "PYTHONPATH": hook.env(None, launches=False)["PYTHONPATH"] + os.pathsep + str(REPO),
        }
    )
    proc = subprocess.Popen([sys.executable, "-c", script, "worker"], env=env, start_new_session=True)
    idle = subprocess.Popen([sys.executable, "-c", script, "api-server"], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while (
            not ((tmp_path / "patched-worker").exists() and (tmp_path / "patched-api-server").exists())
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)  # the stand-ins patch the collector before `prepare`: their files say so
        said = hook.prepare(lambda: proc.poll() is None, timeout_s=30)
        assert "worker hook ready" in said and "CUPTI" in said, said
        deadline = time.monotonic() + 10
        while len(list(folder.glob("ready-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        spans = []
        for n in (1, 2):
            t0 = time.perf_counter_ns()
            hook.start(n)
            assert hook.wait_started(
                n, lambda: proc.poll() is None
            )  # as the recorder does: the window opens once recording runs
            time.sleep(0.3)
            hook.stop(n)
            spans.append((t0, time.perf_counter_ns() + 10**9))
        for n, span in zip((1, 2), spans, strict=True):
            # steps first, as the recorder reads them: the read waits for the file (written after the stop, before the
            # kernels)
            steps = hook.read_steps(n, span, lambda: proc.poll() is None, timeout_s=10)
            assert len(steps) > 20 and {(s.phase, s.batch_size, s.context_tokens) for s in steps} == {("decode", 2, 40)}
            assert all(span[0] <= s.start_ns <= span[1] for s in steps) and [s.index for s in steps] == list(
                range(len(steps))
            )
            kernels, coverage = hook.read(n, span, lambda: proc.poll() is None, timeout_s=10)
            assert kernels is not None and len(kernels) == 1 and kernels.names == ["gemv_split_k_fake"]
            assert coverage is not None and coverage.callback_s == pytest.approx(0.01) and coverage.api_records == 3
        assert (
            kernels is not None and int(kernels.start_ns[0]) > spans[0][1] - 10**9
        )  # window 2's kernel, not window 1's again
    finally:
        hook.quit()
        for p in (proc, idle):
            p.kill()
            p.wait()


def test_kernels_mode_measures_the_recorder_against_an_untraced_reference_window(tiny_model_dir: Path) -> None:
    """`serve --mode kernels` where the recorder is switched per window (CUPTI in the worker, NVIDIA): one untraced
    window first on the same server, then the recorded one; the report gives the recorder's cost from the two and keeps
    the reference out of the load levels and the capture window. CI has no CUPTI: a stand-in recorder (it records
    nothing, it only counts its starts and stops) takes the worker recorder's place; the server, load and metrics are
    real."""
    from max_profile.collect.live.recorders import Recorder
    from max_profile.collect.probes.environment import detect_environment
    from max_profile.collect.server.serve_recorders import UtilizationRecorder
    from max_profile.model import RawCapture
    from max_profile.serve import new_serve_raw, resolve_plan, serve_windows, server_tmpdir

    class StandInRecorder(UtilizationRecorder):  # stands in for WorkerKernelRecorder with its CUPTI hook
        mode = "kernels"
        switched_per_window = True

        def __init__(self) -> None:
            self.calls: list[tuple[str, int, int]] = []

        def window(self, index: int, server: object, progress: object) -> Recorder:
            calls = self.calls

            class StandInWindow:  # stands in for WorkerKernelWindow: it records nothing, it notes when it was called
                name = "stand-in"

                def start(self) -> None:
                    calls.append(("start", index, time.perf_counter_ns()))

                def stop(self, failed: bool) -> None:
                    calls.append(("stop" if not failed else "failed", index, time.perf_counter_ns()))

                def fill(self, raw: RawCapture, window: tuple[int, int] | None) -> None:
                    assert window is not None
                    calls.append(("fill", index, window[1]))

            return StandInWindow()

    plan = resolve_plan(_plan(tiny_model_dir, mode="kernels", profiling_mode="off", warm=False, duration_s=3.0), "none")
    recorder = StandInRecorder()
    with server_tmpdir() as tmp:
        raw = serve_windows(
            plan,
            recorder,
            new_serve_raw(plan, detect_environment(check_tools=False), []),
            tmp,
            600,
            lambda m: None,
            None,
        )
    # the reference window ran without it; the recorded one is window 1, its recorder on before the window opened and
    # off after it closed, then read with the window's span
    assert [(c[0], c[1]) for c in recorder.calls] == [("start", 1), ("stop", 1), ("fill", 1)]
    reference, recorded = raw.load_windows
    (_, _, started), (_, _, stopped), (_, _, filled_end) = recorder.calls
    assert started <= recorded.window_ns[0] and recorded.window_ns[1] <= stopped and filled_end == recorded.window_ns[1]
    assert reference.reference and reference.traced is False and not recorded.reference and recorded.traced is True
    assert reference.window_ns[1] <= recorded.window_ns[0] and raw.window_ns == recorded.window_ns
    assert raw.requests and raw.requests == list(recorded.requests)  # the capture's requests are the recorded window's
    report = build_report(RawCapture.from_json(raw.to_json()))
    cost = report.tracer_cost
    assert cost is not None and cost.concurrency == 1 and cost.reference_tok_s > 0 and cost.traced_tok_s > 0
    assert cost.throughput_ratio == pytest.approx(cost.traced_tok_s / cost.reference_tok_s, rel=1e-3)
    assert cost.reference_decode_step_ms and cost.traced_decode_step_ms  # the server's own TG batch time, per window
    assert report.load_levels == [] and report.server_metrics is not None
    # the metrics' deltas span the two scrapes that bracket the recorded window
    assert recorded.metrics_before is not None and recorded.metrics_after is not None
    assert report.server_metrics.window_s == pytest.approx(
        (recorded.metrics_after.t_ns - recorded.metrics_before.t_ns) / 1e9, abs=1e-6
    )
    assert report.server_metrics.window_s >= (recorded.window_ns[1] - recorded.window_ns[0]) / 1e9
    assert Report.from_json(report.to_json()).tracer_cost == cost
