"""The CUPTI record decoder (numpy over the C recorder's arrays) on the CPU: records built in CUPTI 13's layout,
and the recording made on the H200 when it is present (tests/data/gpu/h200_llama5b_cupti_recorder/)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from max_profile.collect.live.cupti_decode import CUPTI_13_LAYOUT, RecordLayout, decode, unfinished_records
from max_profile.errors import TraceFormatError

LAYOUT = RecordLayout.from_values(CUPTI_13_LAYOUT)
RECORDING = Path(__file__).parents[2] / "data" / "gpu" / "h200_llama5b_cupti_recorder" / "cupti_recording.npz"
"""1,458 kernels and their launch records, 16 tokens of the 1.75B model (benchmarks/tracer_overhead.py --record)."""


def _records(kernels: list[dict], apis: list[dict]) -> tuple[bytes, bytes]:  # type: ignore[type-arg]
    k = np.zeros(len(kernels), dtype=LAYOUT.kernel_dtype())
    for i, rec in enumerate(kernels):
        for key, value in rec.items():
            k[key][i] = value
    a = np.zeros(len(apis), dtype=LAYOUT.api_dtype())
    for i, rec in enumerate(apis):
        for key, value in rec.items():
            a[key][i] = value
    return k.tobytes(), a.tobytes()


def test_layout_is_the_compiled_one() -> None:
    assert (
        LAYOUT.kernel["size"] == 216 and LAYOUT.api["size"] == 40
    )  # CUpti_ActivityKernel10 / CUpti_ActivityAPI, CUDA 13.0
    assert LAYOUT.kinds["CONCURRENT_KERNEL"] == 10 and LAYOUT.kinds["DRIVER"] == 4
    assert RecordLayout.from_values(LAYOUT.values()) == LAYOUT
    bad = list(CUPTI_13_LAYOUT)
    bad[2] = 300  # start past the end of the record
    with pytest.raises(TraceFormatError, match="outside the 216-byte record"):
        RecordLayout.from_values(bad)


def test_decode_joins_launches_maps_clock_and_marks_zero_timestamps() -> None:
    gemv, mha = 0x7F00_0000_1000, 0x7F00_0000_2000
    kernel_bytes, api_bytes = _records(
        [
            {
                "kind": 10,
                "start": 2_000_500,
                "end": 2_000_900,
                "deviceId": 0,
                "streamId": 13,
                "correlationId": 7,
                "name": gemv,
                "gridX": [1, 1024, 1],
                "blockX": [128, 1, 1],
                "registersPerThread": 40,
            },
            {
                "kind": 10,
                "start": 2_001_000,
                "end": 2_001_100,
                "correlationId": 8,
                "name": mha,
                "graphId": 3,
                "graphNodeId": 99,
            },
            {"kind": 10, "start": 0, "end": 0, "correlationId": 9, "name": gemv},
        ],
        [
            {"kind": 4, "cbid": 652, "start": 2_000_100, "end": 2_000_150, "threadId": 4300, "correlationId": 7},
            {"kind": 4, "cbid": 514, "start": 2_000_200, "end": 2_000_250, "threadId": 4300, "correlationId": 8},
            {"kind": 4, "cbid": 652, "start": 2_000_300, "end": 2_000_350, "threadId": 4300, "correlationId": 9},
        ],
    )
    clock = [(10_000_000, 2_000_000), (10_010_000, 2_010_000)]  # host = CUPTI + 8,000,000
    out = decode(
        kernel_bytes,
        api_bytes,
        LAYOUT,
        {gemv: "gemv_split_k_bf16_128", mha: "sm90_mha_depth128"},
        clock,
        graph_cbids=frozenset({514}),
    )
    t = out.table
    assert len(t) == 3 and out.api_records == 3 and out.graph_launches == 1 and out.unnamed == 0
    valid = t.start_ns >= 0
    assert valid.sum() == 2  # the zero-timestamp record maps to -1, for the analysis to drop and count
    by_name = {t.name_of(i): i for i in np.flatnonzero(valid)}
    g, m = by_name["gemv_split_k_bf16_128"], by_name["sm90_mha_depth128"]
    assert t.launch_ns is not None and t.launch_tid is not None and t.grid is not None and t.block is not None
    assert t.start_ns[g] == 10_000_500 and t.end_ns[g] == 10_000_900 and t.launch_ns[g] == 10_000_100
    assert t.launch_tid[g] == 4300 and list(t.grid[g]) == [1, 1024, 1] and list(t.block[g]) == [128, 1, 1]
    assert t.graph_id[m] == 3 and t.graph_node_id[m] == 99 and t.graph_id[g] == 0  # type: ignore[index]
    assert unfinished_records(kernel_bytes, LAYOUT) == 1  # the record a forced flush handed out while its kernel ran


def test_decode_refuses_cut_records() -> None:
    kernel_bytes, api_bytes = _records([{"kind": 10, "start": 5, "end": 6}], [])
    with pytest.raises(TraceFormatError, match="cut short"):
        decode(kernel_bytes[:-8], api_bytes, LAYOUT, {}, [(0, 0), (1, 1)])
    wrong_kind, _ = _records([{"kind": 4, "start": 5, "end": 6}], [])
    with pytest.raises(TraceFormatError, match="does not match the recording"):
        decode(wrong_kind, b"", LAYOUT, {}, [(0, 0), (1, 1)])


def test_recording_from_the_h200_decodes() -> None:
    """A real recording of the C recorder on the H200 (benchmarks/gpu/tracing.sh overhead), decoded here."""
    data = np.load(RECORDING)
    meta = json.loads(data["meta"].tobytes())
    layout = RecordLayout.from_values(meta["layout"])
    names = {int(k): v for k, v in meta["names"].items()}
    out = decode(data["kernels"].tobytes(), data["apis"].tobytes(), layout, names, [tuple(p) for p in meta["clock"]])
    t = out.table
    assert len(t) == meta["kernels"] == 1458 and out.api_records == meta["api_records"] == 1458 and out.unnamed == 0
    assert meta["cupti_version"] == 130001 and layout == LAYOUT  # the H200's headers gave CUDA 13.0's layout
    assert (
        t.launch_ns is not None and (t.launch_ns[t.start_ns >= 0] > 0).all()
    )  # every kernel joined to its launch call
    assert any("gemv" in n for n in t.names) and any("mha" in n for n in t.names)


def test_accelerators_of_a_pipeline_are_waited_on_and_hosts_are_not() -> None:
    """Before CUPTI's forced flush the session waits for the pipeline's GPUs (overlap pipelines leave a step
    running)."""
    from max_profile.collect.live.pipeline_hook import pipeline_accelerators, synchronize_accelerators

    class Device:
        def __init__(self, is_host: bool) -> None:
            self.is_host, self.waits = is_host, 0

        def synchronize(self) -> None:
            self.waits += 1

    gpu0, gpu1, cpu = Device(False), Device(False), Device(True)

    class Pipeline:
        _devices = [gpu0, cpu, gpu1]

    class ModelOnly:
        class _pipeline_model:  # noqa: N801 - MAX's attribute name
            devices = (gpu0,)

    assert pipeline_accelerators(Pipeline()) == [gpu0, gpu1]
    assert synchronize_accelerators(Pipeline()) == 2 and gpu0.waits == 1 and gpu1.waits == 1 and cpu.waits == 0
    assert pipeline_accelerators(ModelOnly()) == [gpu0]
    assert synchronize_accelerators(object()) == 0


def test_graphs_on_recording_from_the_h200_ties_graph_kernels_to_their_graph_launch() -> None:
    """16 tokens of the 24-layer model with device graphs on: kernels inside graphs carry graph and node ids, and their
    correlation id is their graph launch's (cuGraphLaunch), so each one gets that launch's time and thread."""
    data = np.load(RECORDING.with_name("cupti_recording_graphs.npz"))
    meta = json.loads(data["meta"].tobytes())
    layout = RecordLayout.from_values(meta["layout"])
    names = {int(k): v for k, v in meta["names"].items()}
    assert (
        meta["device_graph_capture"] is True
        and meta["unfinished"] == 0
        and unfinished_records(data["kernels"].tobytes(), layout) == 0
    )
    out = decode(data["kernels"].tobytes(), data["apis"].tobytes(), layout, names, [tuple(p) for p in meta["clock"]])
    t = out.table
    assert len(t) == meta["kernels"] == 3906 and out.api_records == meta["api_records"] == 402
    assert (
        t.graph_id is not None and t.graph_node_id is not None and t.launch_ns is not None and t.launch_tid is not None
    )
    in_graph = t.graph_id > 0
    assert in_graph.sum() > 0.9 * len(t) and (t.graph_node_id[in_graph] > 0).all()
    # many kernels per launch record: every graph kernel shares its graph launch's correlation id, launch time and
    # thread
    graph_corr = np.unique(t.correlation_id[in_graph])
    assert graph_corr.size < in_graph.sum() / 50
    assert (t.launch_ns[in_graph] > 0).all() and (t.launch_ns[in_graph] <= t.start_ns[in_graph]).all()
    for c in graph_corr[:5]:
        same = t.correlation_id == c
        assert np.unique(t.launch_ns[same]).size == 1 and np.unique(t.launch_tid[same]).size == 1


def test_a_graph_kernel_joined_to_an_earlier_launch_is_timed_by_its_start() -> None:
    """CUPTI 13.0 can give graph kernels of later recording sessions the correlation id of an earlier graph launch
    (fixed in CUDA 13.1 Update 1). The H200's graphs-on recording with the second half of its graph launches' kernels
    given the first launch's id: each such join breaks the stream's launch order, so those kernels (and the first
    launch's own, which now share an id with them) lose their launch time and are timed by their start; the rest keep
    their joins. Unchanged, the recording has no impossible join."""
    data = np.load(RECORDING.with_name("cupti_recording_graphs.npz"))
    meta = json.loads(data["meta"].tobytes())
    layout = RecordLayout.from_values(meta["layout"])
    names = {int(k): v for k, v in meta["names"].items()}
    clock = [tuple(p) for p in meta["clock"]]
    whole = decode(data["kernels"].tobytes(), data["apis"].tobytes(), layout, names, clock)
    assert whole.rejected_launches == 0

    k = np.frombuffer(data["kernels"].tobytes(), dtype=layout.kernel_dtype()).copy()
    in_graph = k["graphId"] > 0
    launches = np.unique(k["correlationId"][in_graph])
    first, later = launches[0], launches[launches.size // 2 :]
    stale = in_graph & np.isin(k["correlationId"], later)
    k["correlationId"][stale] = first
    hurt = decode(k.tobytes(), data["apis"].tobytes(), layout, names, clock)

    t, w = hurt.table, whole.table
    assert t.launch_ns is not None and w.launch_ns is not None and t.correlation_id is not None
    rows = t.correlation_id == first  # the first launch's kernels and the re-labelled ones (decode sorts by start)
    assert hurt.rejected_launches == int(rows.sum()) > int(stale.sum()) > 1000
    assert (t.launch_ns[rows] == -1).all() and (t.attribution_time()[rows] == t.start_ns[rows]).all()
    assert (t.launch_ns[~rows] == w.launch_ns[~rows]).all() and (t.launch_ns[~rows] > 0).all()
    # without the check they would have been put at the first launch's time, up to the whole recording earlier
    moved = w.launch_ns[rows].min() - t.start_ns[rows]
    assert moved.min() < -20_000_000


def test_a_kernel_on_an_idle_stream_long_after_its_joined_launch_is_not_its_launch() -> None:
    """A kernel that starts on an idle stream 100 ms after the launch call joined to it was not launched by that call;
    behind a queue of work on its stream the same wait is real; a launch call that starts after its kernel never is."""
    ms = 1_000_000

    def one(prev_end: int, start: int, launch: int) -> int:
        kernels, apis = _records(
            [
                {"kind": 10, "start": 1 * ms, "end": prev_end, "streamId": 7, "correlationId": 1, "name": 1},
                {"kind": 10, "start": start, "end": start + ms, "streamId": 7, "correlationId": 2, "name": 1},
            ],
            [
                {"kind": 4, "cbid": 1, "start": ms // 2, "end": ms // 2 + 10, "correlationId": 1},
                {"kind": 4, "cbid": 1, "start": launch, "end": launch + 10, "correlationId": 2},
            ],
        )
        return decode(kernels, apis, LAYOUT, {1: "gemv"}, [(0, 0), (10**9, 10**9)]).rejected_launches

    assert one(prev_end=2 * ms, start=200 * ms, launch=100 * ms) == 1  # idle for 198 ms, launched 100 ms before
    assert one(prev_end=199 * ms, start=200 * ms, launch=100 * ms) == 0  # queued behind 198 ms of work: real
    assert one(prev_end=2 * ms, start=200 * ms, launch=190 * ms) == 0  # 10 ms launch latency: judged possible
    assert one(prev_end=2 * ms, start=200 * ms, launch=205 * ms) == 1  # launched after it started


def test_a_kernel_joins_the_last_launch_before_it_among_calls_sharing_its_id() -> None:
    """Against a brute force over random records: with one call per id the join is that call; where calls share an id
    (CUPTI 13.0 repeats graph launches' ids in later sessions) the last that started no later than the kernel, else the
    first; no call, no join."""
    from max_profile.collect.live.cupti_decode import _launch_rows

    rng = np.random.default_rng(22)
    for _ in range(200):
        n_calls, n_kernels = int(rng.integers(1, 40)), int(rng.integers(1, 60))
        call_id, call_start = rng.integers(0, 6, n_calls).astype(np.int64), rng.integers(0, 100, n_calls)
        kernel_id, kernel_start = rng.integers(0, 8, n_kernels).astype(np.int64), rng.integers(0, 100, n_kernels)
        rows, hit = _launch_rows(kernel_id, kernel_start.astype(np.uint64), call_id, call_start.astype(np.uint64))
        for i in range(n_kernels):
            same = [j for j in range(n_calls) if call_id[j] == kernel_id[i]]
            assert hit[i] == bool(same)
            if same:
                before = [call_start[j] for j in same if call_start[j] <= kernel_start[i]]
                want = max(before) if before else min(call_start[j] for j in same)
                assert call_id[rows[i]] == kernel_id[i] and call_start[rows[i]] == want


def test_a_badly_stamped_kernel_does_not_put_the_rest_of_its_stream_out_of_order() -> None:
    """A kernel stamped as starting 100 ms before its own launch call is flagged, and only it: its late launch time
    does not make every later kernel of the stream look launched out of order. Kernels without a start time are not
    judged."""
    from max_profile.collect.live.cupti_decode import impossible_launch_joins

    ms = 1_000_000
    start = np.array([1, 10, 20, 30, -1], dtype=np.int64) * ms
    end = start + ms // 2
    launch = np.array([101, 9, 19, 29, 500], dtype=np.int64) * ms
    bad = impossible_launch_joins(start, end, np.full(5, 7), launch, np.arange(5))
    assert bad.tolist() == [True, False, False, False, False]


def test_the_cupti_python_recorder_undoes_an_impossible_join_as_the_c_one_does() -> None:
    """The cupti-python fallback joins a kernel to the last launch call of its id it was handed; a kernel that started
    on an idle stream 300 ms after that call (a wrong id) is timed by its start, and the count is kept. Its records
    are set here directly (no cupti-python on CI): kernel rows and launch calls as ``_take`` stores them."""
    from max_profile.collect.live.cupti_kernels import CuptiKernelCollector

    ms = 1_000_000
    c = object.__new__(CuptiKernelCollector)
    c._sync = [(0, 0), (10**9, 10**9)]
    c._record_launches = True
    dims = ((1, 1, 1), (128, 1, 1))
    c._kernels = [
        ("gemv", 10 * ms, 11 * ms, 0, 7, 1, *dims, 32, 0, 0),
        ("gemv", 400 * ms, 401 * ms, 0, 7, 1, *dims, 32, 0, 0),  # the same id, 390 ms later on an idle stream
        ("norm", 500 * ms, 501 * ms, 0, 7, 2, *dims, 32, 0, 0),
    ]
    c._launches = {1: (9 * ms, 9 * ms + 10, 4242), 2: (499 * ms, 499 * ms + 10, 4242)}
    table = c._to_table()
    assert table.launch_ns is not None and table.launch_tid is not None
    assert table.launch_ns.tolist() == [-1, -1, 499 * ms] and table.launch_tid.tolist() == [-1, -1, 4242]
    assert c.rejected_launches == 2  # the wrong join, and the right one that shares its id
