"""Importing other tools' traces. AMD files are FAKES (no AMD GPU or ROCm here), written from the
documented rocprofv3 CSV columns and rocpd views (../shared/research/formats.md §2); nsys stats CSV
follows the byte-exact H200 output quoted there."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from max_profile.analyze.report import build_report
from max_profile.collect.readers.sources import detect_format
from max_profile.collect.readers.sources import import_trace as import_raw
from max_profile.errors import InputError as ImportFormatError
from max_profile.model import KernelBreakdown, Report


def import_trace(path: str) -> Report:
    """Import through the one pipeline: trace -> RawCapture -> build_report."""
    return build_report(import_raw(path))


def _bd(path: Path) -> KernelBreakdown:
    k = import_trace(str(path)).kernels
    assert isinstance(k, KernelBreakdown)
    return k


def _phase(k: KernelBreakdown, name: str):  # type: ignore[no-untyped-def]
    return next(p for p in k.phases if p.phase == name)


FAKE_ROCPROF_KERNELS = (
    '"Kind","Agent_Id","Queue_Id","Stream_Id","Thread_Id","Dispatch_Id","Kernel_Id","Kernel_Name","Correlation_Id",'
    '"Start_Timestamp","End_Timestamp",'
    '"LDS_Block_Size","Scratch_Size","VGPR_Count","Accum_VGPR_Count","SGPR_Count","Workgroup_Size_X",'
    '"Workgroup_Size_Y","Workgroup_Size_Z","Grid_Size_X","Grid_Size_Y","Grid_Size_Z"\n'
    '"KERNEL_DISPATCH","Agent 4",1,0,901,1,10,"matmul_bfloat16_kernel(bf16*, bf16 const*, '
    'int)",1,1000,1900,0,0,8,0,16,64,1,1,1024,1,1\n'
    '"KERNEL_DISPATCH","Agent 4",1,0,905,2,11,"mha_decode_gfx942_bf16",2,2100,2150,0,0,8,0,16,64,1,1,64,1,1\n'
    '"KERNEL_DISPATCH","Agent 4",1,0,905,3,12,"gemv_split_k_bf16_gfx942",3,2200,2600,0,0,8,0,16,64,1,1,64,1,1\n'
    '"KERNEL_DISPATCH","Agent 5",1,0,905,4,12,"gemv_split_k_bf16_gfx942",4,3100,3500,0,0,8,0,16,64,1,1,64,1,1\n'
)
FAKE_ROCPROF_MARKERS = (
    '"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"\n'
    '"MARKER_CORE_RANGE_API","max_profile:prefill",900,900,1,950,2000\n'
    '"MARKER_CORE_RANGE_API","max_profile:decode",900,900,2,2050,3000\n'
    '"MARKER_CORE_RANGE_API","max_profile:decode",900,900,3,3050,4000\n'
)


def test_fake_rocprofv3_csv_with_markers(tmp_path: Path) -> None:
    (tmp_path / "900_kernel_trace.csv").write_text(FAKE_ROCPROF_KERNELS)
    (tmp_path / "900_marker_api_trace.csv").write_text(FAKE_ROCPROF_MARKERS)
    assert detect_format(str(tmp_path / "900_kernel_trace.csv")).name == "rocprof-kernel-csv"
    report = import_trace(str(tmp_path / "900_kernel_trace.csv"))
    assert report.environment.vendor == "amd"
    k = report.kernels
    assert isinstance(k, KernelBreakdown)
    assert k.kernels == 4 and k.devices == [4, 5]
    assert _phase(k, "prefill").families[0].family == "gemm"
    dec = _phase(k, "decode")
    assert dec.steps == 2 and dec.kernels == 3
    assert [f.family for f in dec.families] == ["gemv", "attention"]


def _fake_rocprofv3_json(dispatch_extra: list[object] | None = None) -> dict[str, object]:
    """FAKE rocprofv3 ``--output-format json`` of the run the CSV fakes above describe, written from the documented
    layout (rocprofiler-sdk's JSON tests: buffer_records.kernel_dispatch / marker_api, kernel_symbols, agents,
    strings)."""
    symbols = [
        {
            "kernel_id": 10,
            "kernel_name": "matmul_bfloat16_kernel",
            "formatted_kernel_name": "matmul_bfloat16_kernel(bf16*, bf16 const*, int)",
        },
        {"kernel_id": 11, "kernel_name": "mha_decode_gfx942_bf16"},
        {"kernel_id": 12, "truncated_kernel_name": "gemv_split_k_bf16_gfx942"},
    ]
    # agent handles as rocprofiler-sdk hands them out: 64-bit values, not small ordinals
    agents = [
        {"id": {"handle": 94_558_436_325_552}, "type": 1, "name": "AMD EPYC 9654"},
        {
            "id": {"handle": 94_558_436_325_600},
            "type": 2,
            "logical_node_type_id": 0,
            "name": "gfx942",
            "product_name": "AMD Instinct MI300X",
        },
        {
            "id": {"handle": 94_558_436_325_648},
            "type": 2,
            "logical_node_type_id": 1,
            "name": "gfx942",
            "product_name": "AMD Instinct MI300X",
        },
    ]

    def dispatch(kernel_id: int, agent: int, tid: int, corr: int, start: int, end: int, grid: int) -> dict[str, object]:
        return {
            "size": 120,
            "kind": 11,
            "operation": 0,
            "thread_id": tid,
            "correlation_id": {"internal": corr, "external": 0},
            "start_timestamp": start,
            "end_timestamp": end,
            "dispatch_info": {
                "agent_id": {"handle": agent},
                "queue_id": {"handle": 7},
                "kernel_id": kernel_id,
                "dispatch_id": corr,
                "workgroup_size": {"x": 64, "y": 1, "z": 1},
                "grid_size": {"x": grid, "y": 1, "z": 1},
            },
        }

    gpu0, gpu1 = 94_558_436_325_600, 94_558_436_325_648
    dispatches: list[object] = [
        dispatch(10, gpu0, 901, 1, 1000, 1900, 1024),
        dispatch(11, gpu0, 905, 2, 2100, 2150, 64),
        dispatch(12, gpu0, 905, 3, 2200, 2600, 64),
        dispatch(12, gpu1, 905, 4, 3100, 3500, 64),
        *(dispatch_extra or []),
    ]
    kinds = [
        {"kind": "NONE", "operations": []},
        {"kind": "MARKER_CORE_API", "operations": ["roctxRangePushA"]},
        {"kind": "MARKER_CORE_RANGE_API", "operations": ["roctxRange"]},
    ]
    markers = [
        {
            "kind": 2,
            "operation": 0,
            "thread_id": 900,
            "correlation_id": {"internal": 21, "external": 0},
            "start_timestamp": 950,
            "end_timestamp": 2000,
        },
        {
            "kind": 2,
            "operation": 0,
            "thread_id": 900,
            "correlation_id": {"internal": 22, "external": 0},
            "start_timestamp": 2050,
            "end_timestamp": 3000,
        },
        {
            "kind": 2,
            "operation": 0,
            "thread_id": 900,
            "correlation_id": {"internal": 23, "external": 0},
            "start_timestamp": 3050,
            "end_timestamp": 4000,
        },
        # the roctxRangePushA call itself (an API record, not a range): left out
        {
            "kind": 1,
            "operation": 0,
            "thread_id": 900,
            "correlation_id": {"internal": 24, "external": 0},
            "start_timestamp": 3050,
            "end_timestamp": 3051,
        },
    ]
    strings = {
        "buffer_records": kinds,
        "marker_api": [
            {"key": 21, "value": "max_profile:prefill"},
            {"key": 22, "value": "max_profile:decode"},
            {"key": 23, "value": "max_profile:decode"},
            {"key": 24, "value": "max_profile:decode"},
        ],
    }
    process = {
        "metadata": {"pid": 900},
        "agents": agents,
        "kernel_symbols": symbols,
        "strings": strings,
        "buffer_records": {"kernel_dispatch": dispatches, "marker_api": markers},
    }
    return {"rocprofiler-sdk-tool": [process]}


def test_fake_rocprofv3_json_reads_as_its_csv(tmp_path: Path) -> None:
    """The same run written as rocprofv3 JSON gives the CSV's breakdown, plus GPU names from the agents (FAKE: no AMD
    GPU)."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_fake_rocprofv3_json([{"kind": 11, "start_timestamp": 5}, "not a record"])))
    assert detect_format(str(path)).name == "rocprof-json"
    raw = import_raw(str(path))
    assert (
        raw.kernel_source == "rocprofv3 json" and [g.name for g in raw.environment.gpus] == ["AMD Instinct MI300X"] * 2
    )
    assert [r.name for r in raw.ranges] == ["max_profile:prefill", "max_profile:decode", "max_profile:decode"]
    assert any("2 row(s)" in n for n in raw.notes)  # the two broken dispatch records, counted
    assert raw.kernels.grid is not None and raw.kernels.grid[0].tolist() == [1024, 1, 1]
    report = build_report(raw)
    k = report.kernels
    assert isinstance(k, KernelBreakdown) and report.environment.vendor == "amd"
    assert k.kernels == 4 and k.devices == [0, 1]
    assert _phase(k, "prefill").families[0].family == "gemm"
    dec = _phase(k, "decode")
    assert dec.steps == 2 and dec.kernels == 3
    assert [f.family for f in dec.families] == ["gemv", "attention"]
    # names from kernel_symbols: formatted_kernel_name first, then kernel_name, then truncated_kernel_name
    assert sorted(raw.kernels.names) == [
        "gemv_split_k_bf16_gfx942",
        "matmul_bfloat16_kernel(bf16*, bf16 const*, int)",
        "mha_decode_gfx942_bf16",
    ]


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"rocprofiler-sdk-tool": "nope"}, "list of process objects"),
        (
            {"rocprofiler-sdk-tool": [{"buffer_records": {"kernel_dispatch": {"a": 1}}}]},
            "kernel_dispatch is not a list",
        ),
    ],
)
def test_broken_rocprofv3_json_is_refused(tmp_path: Path, doc: dict[str, object], match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ImportFormatError, match=match):
        import_raw(str(path))
    path.write_text(json.dumps(_fake_rocprofv3_json())[:-40])  # cut short
    with pytest.raises(ImportFormatError, match="truncated or invalid JSON"):
        import_raw(str(path))


def test_fake_rocprofv3_older_columns(tmp_path: Path) -> None:
    old = (
        '"Kind","Agent_Id","Queue_Id","Thread_Id","Dispatch_Id","Kernel_Id","Kernel_Name","Correlation_Id",'
        '"Start_Timestamp","End_Timestamp",'
        '"Private_Segment_Size","Group_Segment_Size","Workgroup_Size_X","Workgroup_Size_Y","Workgroup_Size_Z",'
        '"Grid_Size_X","Grid_Size_Y","Grid_Size_Z"\n'
        '"KERNEL_DISPATCH",2,1,852831,1,10,"void addition_kernel<float>(float*, float const*, float const*, int, '
        'int)",1,1551874061244694,1551874061255734,0,0,64,1,1,1024,1024,1\n'
    )
    (tmp_path / "k_kernel_trace.csv").write_text(old)
    k = _bd(tmp_path / "k_kernel_trace.csv")
    assert k.kernels == 1 and k.attribution == "none" and k.top_kernels[0].name == "addition_kernel"


@pytest.mark.parametrize(
    "text",
    [
        # rocprofv2 kernel trace (FAKE: written from its documented column names)
        "Dispatch_ID,GPU_ID,Queue_ID,Queue_Index,PID,TID,Grid_Size,Workgroup_Size,LDS_Per_Workgroup,"
        "Scratch_Per_Workitem,Arch_VGPR,"
        "Accum_VGPR,SGPR,Wave_Size,Kernel_Name,Start_Timestamp,End_Timestamp,Correlation_ID\n"
        '1,2,0,0,905,905,8192,256,0,0,32,0,16,64,"gemv_split_k_bf16_gfx942",1000,1400,1\n'
        '2,2,0,1,905,905,8192,256,0,0,32,0,16,64,"mha_decode_gfx942",1500,1600,2\n',
        # legacy rocprof --timestamp on results.csv (FAKE, same)
        "Index,KernelName,gpu-id,queue-id,queue-index,pid,tid,grd,wgr,lds,scr,arch_vgpr,accum_vgpr,sgpr,wave_size,"
        "sig,obj,DispatchNs,BeginNs,EndNs,CompleteNs\n"
        '0,"gemv_split_k_bf16_gfx942",2,0,0,905,905,8192,256,0,0,32,0,16,64,0x0,0x0,900,1000,1400,1450\n'
        '1,"mha_decode_gfx942",2,0,1,905,905,8192,256,0,0,32,0,16,64,0x0,0x0,1450,1500,1600,1650\n',
    ],
    ids=["rocprofv2", "rocprof-v1-results"],
)
def test_older_rocprof_kernel_csvs(tmp_path: Path, text: str) -> None:
    (tmp_path / "results.csv").write_text(text)
    assert detect_format(str(tmp_path / "results.csv")).name == "rocprof-kernel-csv"
    raw = import_raw(str(tmp_path / "results.csv"))
    assert raw.environment.vendor == "amd"
    k = build_report(raw).kernels
    assert isinstance(k, KernelBreakdown) and k.kernels == 2 and k.devices == [2]
    assert {f.family for f in k.families} == {"gemv", "attention"} and k.kernel_ms == pytest.approx(0.0005)
    table = raw.kernels
    assert table.grid is not None and table.grid[0].tolist() == [8192, 1, 1]
    assert table.block is not None and table.block[0].tolist() == [256, 1, 1]


def test_fake_rocpd_database(tmp_path: Path) -> None:
    db = _rocpd(
        tmp_path,
        "CREATE VIEW kernels AS SELECT 'gemv_split_k_bf16' AS name, 2000 AS start, 2400 AS end, 4 AS agent_abs_index, "
        "905 AS tid "
        "UNION ALL SELECT 'sm90_matmul_bf16', 1000, 1800, 4, 905",
        "CREATE VIEW regions AS SELECT 'MARKER_CORE_RANGE_API' AS category, 'roctxThreadRangeA' AS name, 1900 AS "
        "start, 3000 AS end, 900 AS tid, "
        "'{\"message\": \"max_profile:decode\"}' AS extdata UNION ALL SELECT 'MARKER_CORE_RANGE_API', "
        "'roctxThreadRangeA', 900, 1900, 900, '{\"message\": \"max_profile:prefill\"}'",
        name="900_results.db",
    )
    k = _bd(db)
    assert k.kernels == 2
    assert _phase(k, "decode").families[0].family == "gemv" and _phase(k, "prefill").families[0].family == "gemm"


def _rocpd(tmp_path: Path, *views: str, name: str = "results.db") -> Path:
    """A rocpd-shaped database: a rocpd_ table (how it is recognised) and the given views / tables."""
    db = tmp_path / name
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE rocpd_kernel_dispatch (id INTEGER)")
    for statement in views:
        con.execute(statement)
    con.commit()
    con.close()
    return db


def test_fake_rocpd_full_kernels_view(tmp_path: Path) -> None:
    """The documented view (data_views.sql): dims, stream and correlation are read too (FAKE: no AMD GPU)."""
    db = _rocpd(
        tmp_path,
        "CREATE VIEW kernels AS SELECT 1 AS id, 'gemv_split_k_bf16' AS name, 905 AS tid, 1 AS pid, 2 AS "
        "agent_abs_index, "
        "0 AS agent_log_index, 3 AS stream_id, 1 AS queue_id, 2000 AS start, 2400 AS end, 400 AS duration, 8192 AS "
        "grid_x, 1 AS grid_y, "
        "1 AS grid_z, 256 AS workgroup_x, 1 AS workgroup_y, 1 AS workgroup_z, 77 AS corr_id",
    )
    t = import_raw(str(db)).kernels
    assert t.device.tolist() == [2] and t.stream is not None and t.stream.tolist() == [3]
    assert (
        t.grid is not None
        and t.grid.tolist() == [[8192, 1, 1]]
        and t.block is not None
        and t.block.tolist() == [[256, 1, 1]]
    )
    assert t.correlation_id is not None and t.correlation_id.tolist() == [77]


def test_fake_rocpd_other_column_names_and_missing_view(tmp_path: Path) -> None:
    db = _rocpd(
        tmp_path,
        "CREATE VIEW kernels AS SELECT 'mha_decode' AS name, 10 AS start, 20 AS end, 5 AS agent_id, 9 AS thread_id",
    )
    t = import_raw(str(db)).kernels
    assert t.device.tolist() == [5] and t.launch_tid is not None and t.launch_tid.tolist() == [9] and t.grid is None
    empty = tmp_path / "empty"
    empty.mkdir()
    db = _rocpd(empty, "CREATE TABLE rocpd_region (id INTEGER)")
    with pytest.raises(ImportFormatError, match="without a kernels view"):
        import_raw(str(db))


def test_nsys_stats_csv_gpu_trace_with_commas_and_non_ascii(tmp_path: Path) -> None:
    text = (
        "Processing [OUT/r3.sqlite] with "
        "[/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/reports/cuda_gpu_trace.py]... \n"
        "Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),DymSMem (MB),Bytes "
        "(MB),Throughput (MB/s),SrcMemKd,DstMemKd,Device,Ctx,GreenCtx,Strm,Name\n"
        "525074279,2016,121,,,,,,,,,,4.194,2080504.807,Device,,NVIDIA H200 (0),1,,7,[CUDA memset]\n"
        '525406504,12928,125,4096,1,1,256,1,1,16,0.000,0.000,,,,,NVIDIA H200 (0),1,,7,"fma_kernel(float *, const float '
        '*, int, int)"\n'
        "525475464,43680,133,1,1,1,32,1,1,20,0.000,0.000,,,,,NVIDIA H200 (0),1,,7,sample_kernel_ünïcödé\n"
        "\n"
    )
    path = tmp_path / "gpu_trace.csv"
    path.write_text(text, encoding="utf-8")
    k = _bd(path)
    assert k.kernels == 2  # the memset row is not a kernel
    names = {r.name for r in k.top_kernels}
    assert names == {"fma_kernel", "sample_kernel_ünïcödé"}
    assert [(g.key, g.name) for g in import_raw(str(path)).environment.gpus] == [
        ("nv0", "NVIDIA H200")
    ]  # from the Device column


def test_nsys_kern_sum_csv_keeps_instance_counts(tmp_path: Path) -> None:
    text = (
        "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
        "59.5,84512,2,42256.0,42256.0,40832,43680,2013.8,sample_kernel\n"
        '25.8,36609,4,9152.3,9152.5,5376,12928,4323.6,"fma_kernel(float *, const float *, int, int)"\n'
    )
    (tmp_path / "sum.csv").write_text(text)
    k = _bd(tmp_path / "sum.csv")
    counts = {r.name: r.count for r in k.top_kernels}
    assert counts == {"sample_kernel": 2, "fma_kernel": 4}
    assert "totals only" in k.source


def test_kineto_json_with_phase_annotations(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "max_profile:decode", "ts": 10.0, "dur": 20.0},
        {"ph": "X", "cat": "kernel", "name": "gemv_split_k_bf16", "ts": 12.0, "dur": 5.0, "args": {"device": 1}},
        {"ph": "X", "cat": "kernel", "name": "mha_decode", "ts": 18.0, "dur": 2.0, "args": {"device": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 11.0, "dur": 1.0},
    ]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    k = _bd(tmp_path / "t.json")
    assert k.kernels == 2 and k.devices == [1]
    assert _phase(k, "decode").kernels == 2


_KERNEL = {
    "ph": "X",
    "cat": "kernel",
    "name": "gemv_split_k_bf16",
    "ts": 12.0,
    "dur": 5.0,
    "args": {"device": 0, "correlation": 7},
}


@pytest.mark.parametrize(
    ("extra", "vendor", "gpus"),
    [
        # PyTorch / Kineto on CUDA: deviceProperties from cudaGetDeviceProperties
        (
            {
                "deviceProperties": [
                    {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85089976320, "computeMajor": 8}
                ]
            },
            "nvidia",
            [("nv0", "NVIDIA A100-SXM4-80GB", 85089976320)],
        ),
        # ROCm builds: hipDeviceProp with gcnArchName
        (
            {
                "deviceProperties": [
                    {
                        "id": 0,
                        "name": "AMD Instinct MI300X",
                        "totalGlobalMem": 206141652992,
                        "gcnArchName": "gfx942:sramecc+:xnack-",
                    },
                    {"id": 1, "name": "", "totalGlobalMem": "x", "gcnArchName": "gfx942"},
                ]
            },
            "amd",
            [("amd0", "AMD Instinct MI300X", 206141652992), ("amd1", None, None)],
        ),
        # no deviceProperties: the launch API names the vendor, the GPUs stay unknown
        ({"launch": "hip_runtime"}, "amd", []),
        ({"launch": "cuda_driver"}, "nvidia", []),
        ({}, "none", []),
        # damaged deviceProperties: ignored, never a crash
        ({"deviceProperties": "not a list"}, "none", []),
    ],
)
def test_kineto_environment_from_device_properties(
    tmp_path: Path, extra: dict[str, object], vendor: str, gpus: list[tuple[str, str | None, int | None]]
) -> None:
    events: list[dict[str, object]] = [_KERNEL]
    launch = extra.pop("launch", None)
    if launch:
        events.append({"ph": "X", "cat": launch, "name": "launch", "ts": 10.0, "dur": 1.0, "args": {"correlation": 7}})
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events, **extra}))
    env = import_raw(str(tmp_path / "t.json")).environment
    assert env.vendor == vendor
    assert [(g.key, g.name, g.memory_total_bytes) for g in env.gpus] == gpus


def test_chrome_array_trace_without_closing_bracket(tmp_path: Path) -> None:
    """The Chrome trace format lets the array form end without ']' (the writer was killed): read, and said."""
    lines = ",\n".join(json.dumps({**_KERNEL, "ts": 12.0 + 10 * i}) for i in range(3))
    (tmp_path / "killed.json").write_text("[\n" + lines + ",\n")
    raw = import_raw(str(tmp_path / "killed.json"))
    assert len(raw.kernels) == 3 and any("closing ']'" in n for n in raw.notes)
    (tmp_path / "cut.json").write_text("[\n" + lines[:-15])  # cut inside an event: still refused
    with pytest.raises(ImportFormatError, match="truncated or invalid JSON"):
        import_raw(str(tmp_path / "cut.json"))


def test_max_generate_profile_output_has_no_kernels(tmp_path: Path) -> None:
    out = (
        "Note: Nsight Systems (`nsys`) not found on PATH; only Python/CPU profile will be captured.\nPrompt size: "
        "11\nTime to first token: 12.5 ms\n"
        "=== Top 10 Python/CPU functions (50.3% of CPU time, 23.32 ms total) ===\n"
    )
    (tmp_path / "gen.txt").write_text(out)
    report = import_trace(str(tmp_path / "gen.txt"))
    assert report.kernels is not None and not isinstance(report.kernels, KernelBreakdown)
    assert "cProfile" in report.kernels.reason  # type: ignore[union-attr]


def test_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError, match="is a folder"):
        import_trace(str(tmp_path))
