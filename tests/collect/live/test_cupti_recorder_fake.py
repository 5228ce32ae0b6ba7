"""max_profile's C CUPTI recorder (collect/live/native/cupti_ring.c) run for real on a machine without an NVIDIA GPU,
against tests/fakes/fake_cupti.c: a FAKE libcupti built from CUPTI's documented activity API (not NVIDIA's library).
What is tested is the recorder's own logic: records sorted by kind into its arrays, buffers handed over on another
thread and reused, the cap and the records past it counted, kernels still running at the flush counted and marked,
windows cleared between starts, another CUPTI client named, and the decode to the host clock with launches and graphs.

Each scenario runs in a fresh Python process: the recorder keeps one libcupti per process (as CUPTI is one per process).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from max_profile.collect.live.cupti_native import KERNEL_RECORD_STRUCTS, cupti_include_dirs

FAKE_SOURCE = Path(__file__).parents[2] / "fakes" / "fake_cupti.c"


@pytest.fixture(scope="module")
def fake_libcupti(tmp_path_factory: pytest.TempPathFactory) -> Path:
    include = cupti_include_dirs()
    cc = shutil.which("gcc") or shutil.which("cc")
    if not include or not cc:
        pytest.skip("no CUPTI headers or C compiler: the recorder cannot be built here either")
    out = tmp_path_factory.mktemp("fake_cupti") / "libcupti.so"
    errors = []
    for struct in KERNEL_RECORD_STRUCTS:  # the struct the recorder itself is built with on these headers
        res = subprocess.run(
            [
                cc,
                "-shared",
                "-fPIC",
                "-O1",
                f"-DMP_KERNEL_RECORD={struct}",
                *(f"-I{d}" for d in include),
                "-o",
                str(out),
                str(FAKE_SOURCE),
                "-lpthread",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode == 0:
            return out
        errors.append(res.stderr[-500:])
    raise AssertionError(f"the fake libcupti does not build against {include[0]}: {errors}")


CHILD = r"""
import ctypes, json, sys, time
from max_profile.collect.live.cupti_native import NativeCuptiCollector, CuptiBusy

fake = ctypes.CDLL(sys.argv[1])
fake.fake_emit.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32]
fake.fake_emit_unfinished.argtypes = [ctypes.c_uint64]
fake.fake_set_holder.argtypes = [ctypes.c_char_p]
fake.fake_set_repeated_graph_ids.argtypes = [ctypes.c_int]
scenario = sys.argv[2]
out = {}

def stats():
    s = (ctypes.c_uint64 * 8)()
    fake.fake_stats(s)
    return {"requested": s[0], "completed": s[1], "distinct": s[2], "undersized": s[3], "dirty": s[4],
            "switches": s[5], "written": s[6], "intercepted": s[7]}

def now_cupti():
    return time.monotonic_ns()  # the fake's cuptiGetTimestamp is CLOCK_MONOTONIC, as perf_counter_ns is on Linux

def free():  # whether another client could subscribe to CUPTI now (then lets go again)
    handle = ctypes.c_void_p()
    if fake.cuptiSubscribe(ctypes.byref(handle), None, None) != 0:
        return False
    fake.cuptiUnsubscribe(handle)
    return True

if scenario == "windows":
    c = NativeCuptiCollector(buffer_bytes=1 << 20, launches=True)
    windows = []
    for w in range(3):
        c.start()
        t0 = now_cupti()
        # 20,000 eager launches: several 1 MB buffers fill mid-window
        eager = fake.fake_emit(20000, t0, 2000, 0)
        graph = fake.fake_emit(5000, t0 + 50_000_000, 2000, 17 + w)  # one graph launch of 5,000 kernels
        fake.fake_emit_unfinished(t0 + 80_000_000)
        k = c.stop()
        windows.append({"emitted": eager + graph, "kernels": len(k), "unfinished": c.unfinished, "dropped": c.dropped,
                        "no_end": int((k.end_ns < 0).sum()),
                        "graph_kernels": int((k.graph_id == 17 + w).sum()), "graph_launches": c.graph_launches,
                        "api_records": c.api_records, "callback_s": c.callback_s,
                        "names": sorted(set(k.names)),
                        "first_start_offset_ns": int(k.start_ns.min()) - t0 if len(k) else None,
                        "launched": int((k.launch_ns > 0).sum()) if k.launch_ns is not None else 0,
                        "launch_tids": sorted({int(x) for x in k.launch_tid}) if k.launch_tid is not None else [],
                        "stats": stats()})
    fake.fake_emit(100, now_cupti(), 1000, 0)  # after stop: CUPTI writes nothing, the recorder holds nothing
    out = {"windows": windows, "after_stop": stats()}
elif scenario == "overlap":
    fake.fake_set_async(1)  # completions on their own threads, overlapping the next buffer requests and each other
    c = NativeCuptiCollector(buffer_bytes=1 << 20, launches=True)
    c.start()
    t0 = now_cupti()
    emitted = sum(fake.fake_emit(10000, t0 + i * 100_000_000, 1000, 0) for i in range(20))
    k = c.stop()
    corr = sorted(int(x) for x in k.correlation_id)
    out = {"emitted": emitted, "kernels": len(k), "dropped": c.dropped, "unique_correlations": len(set(corr)),
           "launched": int((k.launch_ns > 0).sum()), "stats": stats()}
elif scenario == "resize":
    # a recording with 1 MB buffers, then one with 4 MB: no 1 MB buffer may be handed out as a 4 MB one
    small = NativeCuptiCollector(buffer_bytes=1 << 20, launches=False)
    small.start(); fake.fake_emit(20000, now_cupti(), 1000, 0); n_small = len(small.stop())
    big = NativeCuptiCollector(buffer_bytes=4 << 20, launches=False)
    big.start(); emitted = fake.fake_emit(60000, now_cupti(), 1000, 0); k = big.stop()
    out = {"small": n_small, "emitted": emitted, "kernels": len(k), "stats": stats()}
elif scenario == "reserve":
    # memory faulted in before the first recording (serve's worker does it at prepare): the arrays do not grow in the
    # window and the reserved buffers are the ones CUPTI gets
    size = NativeCuptiCollector(launches=False).layout.kernel_dtype().itemsize
    c = NativeCuptiCollector(buffer_bytes=1 << 20, launches=False)
    before = c.held()
    c.reserve(arena_bytes=30000 * size, buffers=3)
    reserved = c.held()
    c.start(); emitted = fake.fake_emit(20000, now_cupti(), 1000, 0); k = c.stop()
    out = {"before": before, "reserved": reserved, "after": c.held(), "bytes": 30000 * size, "emitted": emitted,
           "kernels": len(k), "stats": stats()}
elif scenario == "cap":
    size = NativeCuptiCollector(launches=False).layout.kernel_dtype().itemsize
    c = NativeCuptiCollector(buffer_bytes=1 << 20, launches=False, max_bytes=1000 * size)
    c.start()
    emitted = fake.fake_emit(3000, now_cupti(), 1000, 0)
    k = c.stop()
    out = {"emitted": emitted, "kernels": len(k), "dropped": c.dropped}
elif scenario == "options":
    # zeroed buffers: CUPTI is told the recorder zeroes them, and every buffer it gets (fresh or reused) is zero;
    # pause / resume: nothing recorded in between
    c = NativeCuptiCollector(buffer_bytes=1 << 20, launches=False)
    c.options = ("zeroed-buffers",)
    zeroed = []
    for w in range(3):
        c.start(); emitted = fake.fake_emit(15000, now_cupti(), 1000, 0); k = c.stop()
        zeroed.append({"emitted": emitted, "kernels": len(k)})
    c.options = ()
    c.start(); t0 = now_cupti()
    a = fake.fake_emit(100, t0, 1000, 0); c.pause(); b = fake.fake_emit(100, t0 + 1_000_000, 1000, 0); c.resume()
    d = fake.fake_emit(100, t0 + 2_000_000, 1000, 0)
    k = c.stop()
    paused = {"before": a, "while_paused": b, "after": d, "kernels": len(k)}
    try:
        c.options = ("no-such-option",); c.start(); bad = None
    except Exception as e:
        bad = str(e)
    out = {"zeroed": zeroed, "paused": paused, "bad": bad, "stats": stats()}
elif scenario == "sampled-launches":
    # a sampled recording with launch records: three slices and two pauses; each emit also makes a driver call that is
    # not a launch (cuMemcpyHtoD_v2)
    c = NativeCuptiCollector(buffer_bytes=1 << 20, launches=True)
    c.start(); t0 = now_cupti()
    started = stats()["switches"]
    slices, switches, between = [], [], []
    for i in range(3):
        if i:
            before = stats()["switches"]
            c.resume()
            switches.append(stats()["switches"] - before)
        slices.append(fake.fake_emit(100, t0 + i * 2_000_000, 1000, 0))
        before = stats()["switches"]
        c.pause()
        switches.append(stats()["switches"] - before)
        seen = stats()
        fake.fake_emit(100, t0 + i * 2_000_000 + 1_000_000, 1000, 0)  # a step between slices
        between.append(stats()["intercepted"] - seen["intercepted"] + stats()["written"] - seen["written"])
    k = c.stop()
    out = {"slices": slices, "kernels": len(k), "api_records": c.api_records, "started": started,
           "switches": switches, "launched": int((k.launch_ns > 0).sum()), "between": between}
elif scenario == "repeated-graph-ids":
    # three graph launches 100 ms apart in a second recording session, all carrying one correlation id
    c = NativeCuptiCollector(buffer_bytes=1 << 20, launches=True)
    c.start(); fake.fake_emit(10, now_cupti(), 1000, 3); c.stop()  # the first session
    fake.fake_set_repeated_graph_ids(1)
    c.start(); t0 = now_cupti()
    for i in range(3):
        fake.fake_emit(100, t0 + i * 100_000_000, 1000, 5)
    k = c.stop()
    fake.fake_set_repeated_graph_ids(0)
    lag = (k.start_ns - k.launch_ns).tolist()
    out = {"kernels": len(k), "ids": len(set(k.correlation_id.tolist())), "lag_min": min(lag), "lag_max": max(lag),
           "rejected": c.rejected_launches, "api_records": c.api_records}
elif scenario == "release-while-paused":
    # the subscription given up at each pause and taken again at resume; a client that subscribes meanwhile keeps it
    c = NativeCuptiCollector(buffer_bytes=1 << 20, launches=True)
    c.options = ("release-while-paused",)
    c.start(); t0 = now_cupti()
    states = [free()]
    a = fake.fake_emit(100, t0, 1000, 0); c.pause(); states.append(free())
    fake.fake_emit(100, t0 + 1_000_000, 1000, 0); c.resume(); states.append(free())
    b = fake.fake_emit(100, t0 + 2_000_000, 1000, 0); c.pause()
    fake.fake_set_holder(b"Nsight Systems 2025.3"); c.resume()
    fake.fake_emit(100, t0 + 3_000_000, 1000, 0)
    problem = c.resume_problem
    c.resume()  # stays paused: the holder keeps CUPTI
    fake.fake_set_holder(b"")
    fake.fake_emit(100, t0 + 4_000_000, 1000, 0)
    k = c.stop()
    out = {"free": states, "recorded": a + b, "kernels": len(k), "launched": int((k.launch_ns > 0).sum()),
           "problem": problem, "free_after_stop": free()}
elif scenario == "flush-at-pause":
    # buffers handed over at each pause (flush-at-pause) or left partly filled (the default); 100 kernels per slice
    runs = {}
    for options in ((), ("flush-at-pause",)):
        c = NativeCuptiCollector(buffer_bytes=1 << 20, launches=True)
        c.options = options
        c.start(); t0 = now_cupti()
        at_pause = []
        for i in range(2):
            if i:
                c.resume()
            fake.fake_emit(100, t0 + i * 2_000_000, 1000, 0)
            before = stats()["completed"]
            c.pause()
            at_pause.append(stats()["completed"] - before)
        k = c.stop()
        runs["+".join(options) or "default"] = {"at_pause": at_pause, "kernels": len(k),
                                                 "launched": int((k.launch_ns > 0).sum()), "unfinished": c.unfinished}
    out = runs
elif scenario == "busy":
    fake.fake_set_holder(b"Nsight Systems 2025.3")
    c = NativeCuptiCollector(launches=False)
    try:
        c.start()
        out = {"raised": None}
    except CuptiBusy as e:
        out = {"raised": str(e)}
    fake.fake_set_holder(b"")
    c.start()
    out["kernels_after_release"] = fake.fake_emit(10, now_cupti(), 1000, 0)
    out["recorded_after_release"] = len(c.stop())
print("RESULT " + json.dumps(out))
"""


def run_child(lib: Path, scenario: str, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    env = {**os.environ, "MAX_PROFILE_LIBCUPTI": str(lib), "MAX_PROFILE_CACHE": str(tmp_path / "cache")}
    env.pop("MAX_PROFILE_CUPTI_RING_LIB", None)
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(lib), scenario],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])  # type: ignore[no-any-return]


def test_recorder_windows_against_the_fake(fake_libcupti: Path, tmp_path: Path) -> None:
    out = run_child(fake_libcupti, "windows", tmp_path)
    windows = out["windows"]
    assert len(windows) == 3
    for w in windows:
        # every kernel recorded once; the one still running at the flush counted, its end marked unknown (-1) for the
        # analysis to drop and count
        assert (
            w["emitted"] == 25000
            and w["kernels"] == 25001
            and w["unfinished"] == 1
            and w["no_end"] == 1
            and w["dropped"] == 0
        )
        assert w["graph_kernels"] == 5000 and w["graph_launches"] == 1
        assert w["names"] == ["gemv_split_k_bfloat16_256", "mha_depth128_bfloat16", "rms_norm_fused_residual"]
        # on the host clock: the first kernel where it was emitted (same clock here, so within the clock pairing's
        # error)
        assert w["first_start_offset_ns"] is not None and abs(w["first_start_offset_ns"]) < 5_000_000
        assert w["launched"] == 25001 and w["launch_tids"] == [
            4242
        ]  # eager kernels by their cuLaunchKernel, graph kernels by the cuGraphLaunch
        assert w["callback_s"] > 0 and w["stats"]["undersized"] == 0
    # buffers filled mid-window and handed over on another thread, then reused: the first window allocates, later ones
    # mostly reuse
    s1, s3 = windows[0]["stats"], windows[2]["stats"]
    assert s1["completed"] > 5
    assert s3["requested"] - s1["requested"] > 10 and s3["distinct"] - s1["distinct"] <= 2
    assert out["after_stop"]["requested"] == s3["requested"]  # nothing written once stopped


def test_recorder_with_completions_overlapping_requests(fake_libcupti: Path, tmp_path: Path) -> None:
    """CUPTI hands buffers over on its own thread while the process goes on writing into new ones: 200,000 kernels with
    their launch records through 1 MB buffers whose completions overlap, every record kept once and joined."""
    out = run_child(fake_libcupti, "overlap", tmp_path)
    assert out["emitted"] == 200000 and out["kernels"] == 200000 and out["dropped"] == 0
    assert out["unique_correlations"] == 200000 and out["launched"] == 200000
    assert out["stats"]["completed"] > 40 and out["stats"]["requested"] == out["stats"]["completed"]


def test_recorder_never_hands_out_a_smaller_buffer_than_it_claims(fake_libcupti: Path, tmp_path: Path) -> None:
    """Buffers kept from a recording with 1 MB buffers are not reused as 4 MB ones by the next (CUPTI would write past
    them)."""
    out = run_child(fake_libcupti, "resize", tmp_path)
    assert out["small"] == 20000 and out["emitted"] == 60000 and out["kernels"] == 60000
    assert out["stats"]["undersized"] == 0 and out["stats"]["requested"] > 5


def test_recorder_reserves_its_memory_before_the_first_recording(fake_libcupti: Path, tmp_path: Path) -> None:
    """reserve() grows the kernel array and fills the free list ahead: the recording that follows neither grows the
    array nor allocates buffers beyond what it needs past the reserved ones, and records everything."""
    out = run_child(fake_libcupti, "reserve", tmp_path)
    assert out["before"] == [0, 0] and out["reserved"] == [out["bytes"], 3]
    assert out["emitted"] == 20000 and out["kernels"] == 20000 and out["stats"]["undersized"] == 0
    assert out["after"][0] == out["bytes"]  # 20,000 records fit the reserved 30,000: the array never grew
    # the first requests took the three reserved buffers; completed ones went back to the list and were reused
    assert out["stats"]["requested"] >= 3 and out["after"][1] >= 3


def test_recorder_options_zeroed_buffers_and_pause(fake_libcupti: Path, tmp_path: Path) -> None:
    out = run_child(fake_libcupti, "options", tmp_path)
    # 15,000 records of ~216 B over 1 MB buffers: several buffers per recording, reused from the second on, all zero
    assert [z["kernels"] for z in out["zeroed"]] == [z["emitted"] for z in out["zeroed"]] == [15000] * 3
    assert out["stats"]["requested"] > out["stats"]["distinct"] >= 1 and out["stats"]["dirty"] == 0
    assert out["paused"] == {"before": 100, "while_paused": 0, "after": 100, "kernels": 200}
    assert out["bad"] is not None and "no-such-option" in out["bad"] and "zeroed-buffers" in out["bad"]


def test_sampled_recording_leaves_the_steps_between_slices_alone(fake_libcupti: Path, tmp_path: Path) -> None:
    """A pause switches the DRIVER / RUNTIME kinds off, so CUPTI neither records nor intercepts a call of the steps
    between slices (leaving the kinds on with only the launch calls switched off cost those steps on the H200: a
    sixteenth of the steps recorded cost as much as a quarter); a resume switches them on and re-applies the launch
    filter whole (switching a kind on records every call again), so a driver call that is no launch is not recorded."""
    out = run_child(fake_libcupti, "sampled-launches", tmp_path)
    assert out["slices"] == [100, 100, 100] and out["kernels"] == 300 and out["launched"] == 300
    assert out["api_records"] == 300  # one cuLaunchKernel per recorded kernel: no memcpy, nothing between the slices
    assert out["between"] == [0, 0, 0]  # nothing recorded or intercepted between slices
    full = out["started"]  # the filter at the start: every driver and runtime call of CUPTI's tables
    assert full > 100 and out["switches"] == [0, full, 0, full, 0]  # pause, resume, pause, resume, pause


def test_release_while_paused_leaves_cupti_unsubscribed_between_slices(fake_libcupti: Path, tmp_path: Path) -> None:
    """``release-while-paused``: between slices the process has no CUPTI subscriber (a probe can subscribe), each
    slice records with its launch calls, and a client that subscribes during a pause keeps CUPTI: the later slices are
    not recorded and the collector says why."""
    out = run_child(fake_libcupti, "release-while-paused", tmp_path)
    assert out["free"] == [False, True, False]
    assert out["recorded"] == 200 and out["kernels"] == 200 and out["launched"] == 200
    assert out["problem"] and "Nsight Systems 2025.3" in out["problem"]
    assert out["free_after_stop"] is True


def test_flush_at_pause_hands_each_slices_buffer_over_at_its_pause(fake_libcupti: Path, tmp_path: Path) -> None:
    """``flush-at-pause``: each pause hands the partly filled buffer over (the default leaves it to fill on in the next
    slice), and every slice's kernels still come out once, joined to their launch calls."""
    out = run_child(fake_libcupti, "flush-at-pause", tmp_path)
    assert out["default"]["at_pause"] == [0, 0]
    assert out["flush-at-pause"]["at_pause"] == [1, 1]
    for run in out.values():
        assert run["kernels"] == run["launched"] == 200 and run["unfinished"] == 0


def test_graph_launches_sharing_one_id_keep_their_own_launch_times(fake_libcupti: Path, tmp_path: Path) -> None:
    """The FAKE libcupti gives three graph launches of a second session one correlation id (CUPTI 13.0's bug, as
    modelled there): through the real C recorder and decoder each kernel joins its own launch call, the last one
    before it (1 us before its first node), not the first launch 100-200 ms earlier, and no join is undone."""
    out = run_child(fake_libcupti, "repeated-graph-ids", tmp_path)
    assert out["kernels"] == 300 and out["ids"] == 1 and out["api_records"] == 3
    assert out["rejected"] == 0
    assert 0 < out["lag_min"] and out["lag_max"] < 200_000  # within its own graph's 100 us of nodes


def test_recorder_caps_its_arrays_and_counts_the_rest(fake_libcupti: Path, tmp_path: Path) -> None:
    out = run_child(fake_libcupti, "cap", tmp_path)
    assert out["emitted"] == 3000 and out["kernels"] == 1000 and out["dropped"] == 2000


def test_recorder_backs_off_from_another_cupti_client_and_names_it(fake_libcupti: Path, tmp_path: Path) -> None:
    out = run_child(fake_libcupti, "busy", tmp_path)
    assert out["raised"] is not None and "Nsight Systems 2025.3" in out["raised"] and "backs off" in out["raised"]
    assert out["kernels_after_release"] == 10 and out["recorded_after_release"] == 10


WORKER = r"""
import ctypes, os, sys, time
fake = ctypes.CDLL(sys.argv[1])  # mapped under a name holding "libcuda.so": the hook takes this process for a CUDA one
fake.fake_emit.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32]
folder = sys.argv[2]
open(os.path.join(folder, "loaded"), "w").close()
bogus = os.path.join(folder, "bogus")
while not os.path.exists(os.path.join(folder, "done")):  # a model worker launching kernels all the time
    if os.path.exists(bogus):  # once: a graph's 50 kernel records stamped 5 s in the past (a CUPTI fault)
        os.remove(bogus)
        fake.fake_emit(50, time.monotonic_ns() - 5_000_000_000, 1000, 9)
    fake.fake_emit(200, time.monotonic_ns(), 1000, 0)
    time.sleep(0.002)
"""


def test_worker_hook_records_windows_opened_after_recording_runs(fake_libcupti: Path, tmp_path: Path) -> None:
    """The serve worker hook (collect/server/worker_hook/sitecustomize.py) in a real child process, over the FAKE
    libcupti: it reserves its memory at prepare, says when each window's recording runs (so the controller opens the
    window after CUPTI's enable), and writes each window's kernels and coverage (the enable's seconds among it)."""
    import time

    from max_profile.collect.server.worker_protocol import WindowCoverage, WindowRecording, WorkerHook
    from max_profile.model import KernelTable

    as_cuda = tmp_path / "libcuda.so.fake-cupti"  # the FAKE library again, named so the hook's libcuda check passes
    shutil.copy(fake_libcupti, as_cuda)
    hook = WorkerHook(tmp_path / "hook")
    env = {
        **os.environ,
        **hook.env(None, launches=False),
        "MAX_PROFILE_LIBCUPTI": str(as_cuda),
        "MAX_PROFILE_CACHE": str(tmp_path / "cache"),
    }
    env.pop("MAX_PROFILE_CUPTI_RING_LIB", None)
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(as_cuda), str(hook.folder)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        alive = lambda: worker.poll() is None  # noqa: E731
        deadline = time.monotonic() + 60
        while not (hook.folder / "loaded").exists() and alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        said = hook.prepare(alive, timeout_s=120)
        assert "worker hook ready" in said and "CUPTI" in said, said

        def record(
            window: int,
            plan: WindowRecording = WindowRecording(),
            seconds: float = 0.3,
            bogus: bool = False,
            settle_s: float = 0.0,
        ) -> tuple[KernelTable, WindowCoverage, tuple[int, int]]:
            """One window as the controller runs it: started, opened once recording runs (and ``settle_s`` after it),
            stopped, read."""
            hook.start(window, plan)
            assert hook.wait_started(window, alive, timeout_s=30)
            time.sleep(settle_s)
            span_start = time.perf_counter_ns()
            if bogus:
                (hook.folder / "bogus").touch()
            time.sleep(seconds)
            span = (span_start, time.perf_counter_ns())
            hook.stop(window)
            kernels, coverage = hook.read(window, span, alive, timeout_s=60)
            assert kernels is not None and coverage is not None
            return kernels, coverage, span

        for window in (1, 2):
            kernels, coverage, span = record(window)
            # recording ran before the window opened: the whole window is covered, the enable's time is said
            assert (
                coverage.covered_s == pytest.approx(coverage.window_s, abs=1e-6)
                and coverage.start_s is not None
                and coverage.start_s >= 0
            )
            assert "CUPTI enable" in coverage.describe()
            assert len(kernels) > 100 and kernels.start_ns.min() >= span[0] and kernels.start_ns.max() <= span[1]
            # the worker's own account of its whole recording: every kernel it kept inside its one slice, none left
            # out, at least those of the window
            assert coverage.recorded_kernels is not None and coverage.recorded_kernels >= len(kernels)
            assert coverage.per_slice == (coverage.recorded_kernels,) and coverage.outside_slices == 0
        assert not hook.wait_started(3, alive, timeout_s=0.2)  # no start-3 asked: the wait gives up and says so
        # window 3 sampled: slices of 0.1 s, half the time; kernels only inside them, the pauses between them empty
        kernels, coverage, span = record(3, WindowRecording(share=0.5, slice_s=0.1), seconds=1.0)
        assert coverage.sampled and len(kernels) > 100
        slices = coverage.slices
        assert (
            len(slices) >= 3
            and all(a < b for a, b in slices)
            and all(b0 <= a1 for (_, b0), (a1, _) in zip(slices, slices[1:], strict=False))
        )
        assert (
            coverage.covered_s == pytest.approx(sum(b - a for a, b in slices) / 1e9)
            and coverage.covered_s < coverage.window_s
        )
        assert "slice" in coverage.describe()
        assert coverage.outside_slices == 0 and len(coverage.per_slice) >= len(slices)
        assert sum(coverage.per_slice) == coverage.recorded_kernels and coverage.recorded_kernels >= len(kernels)
        assert coverage.per_slice_by_start == coverage.per_slice  # the fake's launch calls are 1 us before their work
        margin = 1_000_000  # a launch just before a pause: its kernels start up to 0.2 ms after it
        in_slice = [any(a <= t <= b + margin for a, b in slices) for t in kernels.start_ns.tolist()]
        assert all(in_slice)
        paused = [(b0, a1) for (_, b0), (a1, _) in zip(slices, slices[1:], strict=False)]
        assert all(not ((kernels.start_ns > b0 + margin) & (kernels.start_ns < a1)).any() for b0, a1 in paused)
        # window 4, steps only (serve_ab's `steps` variant): CUPTI stays off, nothing recorded, the coverage says so
        kernels, coverage, _ = record(4, WindowRecording(kernels=False))
        assert len(kernels) == 0
        assert coverage.covered_s == 0 and coverage.slices == () and coverage.recorded_kernels == 0
        assert any("steps only (CUPTI off)" in n for n in coverage.notes)
        # the next window records again; records stamped 5 s before it began are left out, counted and said
        kernels, coverage, _ = record(5, bogus=True)
        assert not (hook.folder / "bogus").exists() and len(kernels) > 100
        assert coverage.outside_slices == 50 and "50 left out for a time outside every slice" in coverage.describe()
        assert any("50 kernel record(s) carried a time outside every recorded slice" in n for n in coverage.notes)
        assert kernels.graph_id is not None and not (kernels.graph_id == 9).any()
        assert coverage.per_slice == (coverage.recorded_kernels,)
        # a sixteenth in slices of 0.1 s (1.5 s paused between them) and a window of 0.3 s opened 0.2 s after the
        # recording began, as serve opens its window after a settle: the first slice runs on through the settle
        # (lead_s), so the window starts inside a recorded slice; without the lead it would lie in the first pause
        short = WindowRecording(share=1 / 16, slice_s=0.1, lead_s=0.2)
        kernels, coverage, span = record(6, short, seconds=0.3, settle_s=0.2)
        first = coverage.slices[0]  # the recorded slices as the window saw them (clipped to it)
        assert first[0] == span[0] and first[1] - first[0] >= 0.09e9, (coverage.slices, span)  # lead + slice - settle
        assert len(kernels) > 10 and kernels.start_ns.min() >= span[0]
    finally:
        hook.quit()
        (hook.folder / "done").touch()
        try:
            worker.wait(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
    assert worker.returncode == 0, worker.stderr.read() if worker.stderr else ""
