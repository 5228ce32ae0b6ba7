"""Unit tests: kernel families, breakdown mechanics, the tiny-model builder, the report model."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from max_profile.analyze.breakdown import build_breakdown, union_ns
from max_profile.analyze.families import base_name, classify_kernel, distinctive_regex
from max_profile.analyze.timeline import phase_of_range
from max_profile.model import SCHEMA_VERSION, Capture, Environment, KernelRecord, KernelTable, Report, Step
from max_profile.tinymodel import ModelShape, _bf16_bytes, build_tiny_llama
from max_profile.util.models import model_folder_problem as is_model_folder

# Names MAX 26.7 launched on the H200 (hash suffixes as seen) and on the CPU (NVTX op ranges).
NAMES = {
    "gemv_split_k_bfloat16_bfloat16_bfloat16_128_abd1b559": "gemv",
    "gemv_split_k_epilogue_fn_bfloat16_bfloat16_bfloat16_128_9f00aa31": "gemv",
    "rms_norm_fused_residual_gpu_block_bfloat16_False_1a2b3c4d": "norm",
    "sm90_mha_depth128_bfloat16_bfloat16_nqh32_nkvh8_0123abcd": "attention",
    "sm100_mha_depth128_bfloat16_bfloat16_nqh32_nkvh8_0123abcd": "attention",
    "sm90_matmul_bfloat16_bfloat16_bfloat16_True_77aa88bb": "gemm",
    "mogg_foreach_r2_w8_b256_gs_False_abcdef01": "elementwise",
    "gather_r2_w8_b256_gs_False_abcdef01": "gather_scatter",
    # MAX's KV-cache kernels on the H200 : "gather" in a KV-cache kernel's name is still the KV cache
    "kv_cache_gather_rows_ragged_r3_w8_b256_gs_False_abcdef01": "kv_cache",
    "kv_cache_store_ragged_r3_w8_b256_gs_False_abcdef01": "kv_cache",
    "topk_topp_sampling_from_prob_float32_int64_False_True_False_float32_1_abcdef01": "sampling",
    "moe_create_indices_bfloat16_abcdef01": "moe_routing",
    "grouped_matmul_sm100_bfloat16_abcdef01": "grouped_matmul",
    "block_scaled_matmul_nvfp4_abcdef01": "gemm",  # one dense low-bit weight matrix, not a group of experts
    "quantize_dynamic_scaled_fp8_abcdef01": "quantize",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL": "collective",
    "ep_dispatch_kernel_bf16": "collective",
    "matmulmo.matmul": "gemm",
    "mo.mha.ragged.paged.causal.nhead_2.hdim_16": "attention",
    "composite.rms_norm_residual_add": "norm",
    "reduce.rms_norm": "norm",
    "elementwise(gather)": "gather_scatter",
    "View(slice, slice, Elementwise(silu, mul))": "activation",
    "fused_token_sampling": "sampling",
    "[CUDA memcpy Device-to-Host]": "memcpy",
    "completely_unknown_kernel": "other",
    # vendor libraries and other frameworks' kernels (names as their profilers print them)
    "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI32x32x8x1_SN_1LDSB0": "gemm",  # Tensile: rocBLAS / hipBLASLt
    "nvjet_tst_128x64_64x8_1x1_v_bz_coopB_TNT": "gemm",  # cuBLAS on Hopper
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)": "gemm",
    "void internal::gemvx::kernel<int, int, __nv_bfloat16>(cublasGemvParamsEx<int>)": "gemv",
    "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t>, "
    "false>(Flash_fwd_params)": "attention",
    "void fused_moe_kernel": "grouped_matmul",
    "__amd_rocclr_fillBufferAligned": "memcpy",
    "__amd_rocclr_copyBuffer": "memcpy",
    "void my_kernel<cutlass::bfloat16_t>(float*)": "other",  # a template type alone says nothing
}


@pytest.mark.parametrize(("name", "family"), sorted(NAMES.items()))
def test_families(name: str, family: str) -> None:
    assert classify_kernel(name) == family


def test_base_name_strips_noise_not_meaning() -> None:
    assert (
        base_name("sm90_mha_depth128_bfloat16_bfloat16_nqh16_nkvh4_0123456789abcdef")
        == "mha_depth128_bfloat16_bfloat16_nqh16_nkvh4"
    )
    assert base_name("void scale_kernel<float>(T1 *, T1, int)") == "scale_kernel"
    assert base_name("ns::inner::kernel_name<int, 4>(int *)") == "kernel_name"
    assert base_name("elementwise(gather)") == "elementwise(gather)"
    assert (
        base_name("__amd_rocclr_fillBufferAligned") == "__amd_rocclr_fillBufferAligned"
    )  # a camelCase word, not a hash
    assert (
        distinctive_regex("gemv_split_k_bfloat16_bfloat16_bfloat16_128_abd1b559")
        == "gemv_split_k_bfloat16_bfloat16_bfloat16_128"
    )


def test_mangled_names_are_classified() -> None:
    assert classify_kernel("_ZN2ns14rms_norm_kernelIfEEvPT_S1_i") == "norm"
    from max_profile.analyze.families import _demangle_light

    assert _demangle_light("_ZN2ns15rms_norm_kernelEv") == "ns_rms_norm_kernel"
    assert _demangle_light("_Z3abc") == "abc" and _demangle_light("_ZN3foo3barE") == "foo_bar"
    assert _demangle_light("_ZN1aXY2bcE") == "a_bc"  # letters between the names are stepped over one by one
    assert _demangle_light("_Zabc") == "_Zabc"  # no length-prefixed name: the name as it came
    assert _demangle_light("_Z3abc12") == "abc_"  # a length at the very end: an empty word, no error


def test_union_counts_overlap_once() -> None:
    s = np.array([0, 5, 20], dtype=np.int64)
    e = np.array([10, 15, 30], dtype=np.int64)
    assert union_ns(s, e) == 25
    # negative times (a CUPTI zero timestamp after clock mapping) never make a huge block
    assert union_ns(np.array([-(10**18), 5]), np.array([-(10**18), 15])) == 10


def _steps() -> list[Step]:
    return [
        Step(index=0, phase="prefill", batch_size=1, input_tokens=8, context_tokens=0, start_ns=0, end_ns=100),
        Step(index=1, phase="decode", batch_size=1, input_tokens=1, context_tokens=8, start_ns=100, end_ns=200),
        Step(index=2, phase="decode", batch_size=1, input_tokens=1, context_tokens=9, start_ns=200, end_ns=300),
    ]


def test_attribution_uses_launch_time_not_execution_time() -> None:
    # overlap pipeline: a kernel launched in step 1 runs during step 2's host time
    k = [
        KernelRecord(name="gemv_a", start_ns=210, end_ns=260, launch_ns=150),
        KernelRecord(name="matmul_b", start_ns=10, end_ns=60),
    ]
    bd = build_breakdown(KernelTable.from_records(k), source="t", steps=_steps())
    by_phase = {p.phase: p for p in bd.phases}
    assert by_phase["decode"].kernels == 1 and by_phase["prefill"].kernels == 1
    assert by_phase["decode"].kernel_us_per_token == pytest.approx(0.05 / 2)
    assert bd.attribution == "launch time (any thread), else start time"
    assert [(p.index, p.phase, p.kernels, p.families) for p in bd.per_step] == [
        (0, "prefill", 1, {"gemm": 0.00005}),
        (1, "decode", 1, {"gemv": 0.00005}),
        (2, "decode", 0, {}),
    ]


def test_unknown_kernels_are_listed_not_dropped() -> None:
    bd = build_breakdown(
        KernelTable.from_records([KernelRecord(name="weird_kernel_x", start_ns=0, end_ns=10)]), source="t"
    )
    assert bd.kernels == 1 and bd.unknown_kernel_names == ["weird_kernel_x"] and bd.families[0].family == "other"
    assert bd.attribution == "none" and bd.gpu_busy_pct == pytest.approx(100.0)


def test_invalid_timestamps_are_dropped_and_counted() -> None:
    k = [
        KernelRecord(name="gemv", start_ns=110, end_ns=130, launch_ns=105),
        KernelRecord(name="gemv", start_ns=-1, end_ns=-1, launch_ns=106),
        KernelRecord(name="gemv", start_ns=150, end_ns=140, launch_ns=107),
    ]
    bd = build_breakdown(KernelTable.from_records(k), source="t", steps=_steps())
    assert bd.kernels == 1 and bd.invalid_kernels == 2 and bd.kernel_ms == pytest.approx(20e-6)


def test_phase_of_range_names() -> None:
    assert phase_of_range("max_profile:decode") == "decode"
    assert phase_of_range(":prefill") == "prefill"
    assert phase_of_range("_schedule(TextGenerationInputs(batch_size=4, batch_type=TG))") == "decode"
    assert phase_of_range("_schedule(TextGenerationInputs(batch_size=1, batch_type=CE))") == "prefill"
    assert phase_of_range("execute") is None


def test_tiny_model_files_and_safetensors_header(tmp_path: Path) -> None:
    out = build_tiny_llama(
        tmp_path / "m", dtype="bfloat16", shape=ModelShape(hidden=32, layers=1, heads=2, kv_heads=1), chat_template=None
    )
    assert is_model_folder(out) is None
    assert not (out / "chat_template.jinja").exists()
    raw = (out / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert header["model.layers.0.self_attn.q_proj.weight"] == {
        "dtype": "BF16",
        "shape": [32, 32],
        "data_offsets": header["model.layers.0.self_attn.q_proj.weight"]["data_offsets"],
    }
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    assert len(raw) == 8 + n + end


def test_bf16_rounding() -> None:
    vals = np.array([1.0, -2.5, 3.140625, 1.00390625], dtype=np.float32)
    as_u16 = np.frombuffer(_bf16_bytes(vals), dtype=np.uint16)
    back = (as_u16.astype(np.uint32) << 16).view(np.float32)
    assert back.tolist() == [1.0, -2.5, 3.140625, 1.0]  # 1.00390625 rounds to even


def test_is_model_folder_messages(tmp_path: Path) -> None:
    assert "does not exist" in (is_model_folder(tmp_path / "nope") or "")
    assert "no config.json" in (is_model_folder(tmp_path) or "")
    (tmp_path / "config.json").write_text("{}")
    assert "no *.safetensors" in (is_model_folder(tmp_path) or "")


def test_report_schema_version_guard() -> None:
    r = Report(environment=Environment(vendor="none", vendor_reason="t"), capture=Capture(started_unix_s=1.0))
    data = json.loads(r.to_json())
    assert data["schema_version"] == SCHEMA_VERSION
    data["schema_version"] = 999
    with pytest.raises(ValueError, match="schema version 999"):
        Report.from_json(json.dumps(data))


class _FakeCupti:
    """Stand-in for cupti-python's module (no NVIDIA GPU in CI): a callback-name table and the
    per-call activity switches of CUPTI 12.5+, recording what was switched."""

    class CallbackDomain:
        DRIVER_API = 1
        RUNTIME_API = 2

    def __init__(self, names: dict[int, dict[int, str]], with_switches: bool = True) -> None:
        self.names = names
        self.switched: dict[tuple[int, int], int] = {}
        if with_switches:
            self.activity_enable_driver_api = lambda cbid, on: self.switched.__setitem__((1, cbid), on)
            self.activity_enable_runtime_api = lambda cbid, on: self.switched.__setitem__((2, cbid), on)

    def get_callback_name(self, domain: int, cbid: int) -> str:
        return self.names[domain][cbid]  # KeyError past the table, as CUPTI errors there


def test_cupti_api_records_kept_for_launch_calls_only() -> None:
    from max_profile.collect.live.cupti_kernels import _keep_only_launch_records, _launch_switch_table

    names = {
        1: {
            307: "cuLaunchKernel",
            652: "cuLaunchKernelEx",
            514: "cuGraphLaunch",
            17: "cuEventQuery",
            18: "cuStreamQuery",
        },
        2: {211: "cudaLaunchKernel_v7000", 31: "cudaEventQuery_v3020"},
    }
    fake = _FakeCupti(names)
    said = _keep_only_launch_records(_launch_switch_table(fake, max_cbid=1000))
    assert said == "launch calls only (4 kept, 3 other driver/runtime calls off)"
    assert fake.switched == {(1, 307): 1, (1, 652): 1, (1, 514): 1, (1, 17): 0, (1, 18): 0, (2, 211): 1, (2, 31): 0}
    # no launch call recognized: nothing is switched off (the launch join needs those records)
    fake = _FakeCupti({1: {17: "cuEventQuery"}, 2: {}})
    assert _keep_only_launch_records(_launch_switch_table(fake, max_cbid=100)) is None and fake.switched == {}
    # a CUPTI without per-call switches (before CUDA 12.5) records everything
    assert (
        _keep_only_launch_records(_launch_switch_table(_FakeCupti(names, with_switches=False), max_cbid=1000)) is None
    )


def test_serve_coverage_reports_the_tracer_share_of_the_window(tmp_path: Path) -> None:
    import json

    from max_profile.collect.server.worker_protocol import WorkerHook

    hook = WorkerHook(tmp_path)
    assert hook._coverage(1, (0, 10_000_000_000)) is None
    (tmp_path / "coverage-77-1.json").write_text(
        json.dumps(
            {
                "started_ns": 100_000_000,
                "stopped_ns": 12_000_000_000,
                "dropped": 0,
                "callback_s": 3.87,
                "api_records": 72983,
                "api_filter": "launch calls only",
            }
        )
    )
    coverage = hook._coverage(1, (0, 10_000_000_000))
    assert coverage is not None and hook._coverage(2, (0, 10_000_000_000)) is None  # one window's file, not another's
    text, callback_s = coverage.describe(), coverage.callback_s
    assert (
        text == ", recorded 9.9 of 10.0 s, 3.87 s in CUPTI callbacks for 72983 API records"
        and callback_s == pytest.approx(3.87)
    )
    from max_profile.analyze.report import tracer_overhead_pct

    assert tracer_overhead_pct(callback_s, (0, 10_000_000_000)) == pytest.approx(38.7)


def test_stream_chunks_count_the_tokens_they_carry() -> None:
    """MAX sends a token that decodes to no visible text with the next chunk: its token_ids say how many tokens a chunk
    holds (so its gap is split per token), and the usage chunk gives the server's own total."""
    from max_profile.collect.server.serve_client import chunk_tokens

    assert chunk_tokens('{"choices":[{"text":" a","token_ids":[17]}]}') == (1, None)
    assert chunk_tokens('{"choices":[{"text":"é","token_ids":[201,98]}]}') == (2, None)
    assert chunk_tokens('{"choices":[{"text":"x"}]}') == (1, None)  # a server without token ids: one per chunk
    assert chunk_tokens('{"choices":[],"usage":{"completion_tokens":64,"prompt_tokens":9}}') == (0, 64)
    assert chunk_tokens("not json") == (1, None)


def test_gpu_waits_counts_the_gaps_the_gpu_waited_for_the_host() -> None:
    """Gaps between merged kernel intervals on the busiest device: under 100 µs is launch latency (not counted), 100 µs
    to 5 ms a wait (before a graph kernel: the graph launched late), longer a pause counted apart; overlaps merge."""
    from max_profile.analyze.breakdown import gpu_waits
    from max_profile.model import KernelRecord, KernelTable

    us = 1000
    recs = [
        KernelRecord(name="a", start_ns=0, end_ns=100 * us),
        KernelRecord(name="b", start_ns=50 * us, end_ns=120 * us),  # overlaps a: the busy block ends at 120 µs
        KernelRecord(name="c", start_ns=170 * us, end_ns=200 * us),  # 50 µs after: launch latency
        KernelRecord(name="g1", start_ns=400 * us, end_ns=500 * us, graph_id=7),  # 200 µs wait before a graph kernel
        KernelRecord(name="g2", start_ns=505 * us, end_ns=600 * us, graph_id=7),
        KernelRecord(name="d", start_ns=900 * us, end_ns=950 * us),  # 300 µs wait before an eager kernel
        KernelRecord(name="e", start_ns=20_950 * us, end_ns=21_000 * us),  # 20 ms: a pause, apart
        KernelRecord(name="other-device", start_ns=300 * us, end_ns=310 * us, device=1),  # not the busiest device
    ]
    w = gpu_waits(KernelTable.from_records(recs), (0, 21_000 * us), 100 * us, 5_000 * us)
    assert w is not None
    assert (w.gaps, w.before_graph_gaps, w.longer_gaps) == (2, 1, 1)
    assert (
        w.waited_ms == pytest.approx(0.5)
        and w.before_graph_ms == pytest.approx(0.2)
        and w.longer_ms == pytest.approx(20.0)
    )
    assert w.before_graph_pct == pytest.approx(100 * 0.2 / 21.0) and w.gap_p50_us == pytest.approx(250.0)
    assert gpu_waits(KernelTable.from_records(recs[:1]), (0, 21_000 * us), 100 * us, 5_000 * us) is None


def test_a_sampled_recording_judges_busy_and_waits_over_its_slices_only() -> None:
    """Kernels recorded in two slices of a window (the recorder paused between them): the pause is no wait and no pause
    of the GPU, busy and wait shares are of the slices' time, the window stays the window."""
    from max_profile.analyze.breakdown import build_breakdown, gpu_waits
    from max_profile.model import KernelRecord, KernelTable

    us = 1000
    recs = [
        KernelRecord(name="gemv_a", start_ns=t * us, end_ns=(t + 80) * us) for t in range(0, 1000, 100)
    ]  # slice 1: 0-1 ms
    recs.append(
        KernelRecord(name="gemv_g", start_ns=1300 * us, end_ns=1380 * us, graph_id=3)
    )  # 300 µs wait before a graph, in slice 1
    recs += [
        KernelRecord(name="gemv_a", start_ns=t * us, end_ns=(t + 80) * us) for t in range(4000, 5000, 100)
    ]  # slice 2: 4-5 ms
    table = KernelTable.from_records(recs)
    window, slices = (0, 10_000 * us), [(0, 1500 * us), (4000 * us, 5000 * us)]
    w = gpu_waits(table, window, 100 * us, 5_000 * us, recorded=slices)
    assert w is not None and (w.gaps, w.before_graph_gaps, w.longer_gaps) == (
        1,
        1,
        0,
    )  # 1.38 → 4 ms is the pause: neither
    assert w.before_graph_pct == pytest.approx(100 * 0.32 / 2.5)  # the 320 µs wait (980 → 1300 µs) over 2.5 ms recorded
    whole = gpu_waits(table, window, 100 * us, 5_000 * us)
    assert (
        whole is not None and whole.gaps == 2 and whole.before_graph_pct == pytest.approx(100 * 0.32 / 10)
    )  # unsampled reading: the pause counts
    b = build_breakdown(table, source="test", window=window, recorded=slices)
    assert b.window_ms == pytest.approx(10.0) and b.recorded_ms == pytest.approx(2.5)
    assert b.gpu_busy_pct == pytest.approx(100 * 21 * 0.08 / 2.5)
    assert build_breakdown(table, source="test", window=window).recorded_ms is None


def test_the_worker_hook_drops_kernels_stamped_across_a_pause_of_a_sampled_recording() -> None:
    """On the H200 kernels of the graph launched as the recorder paused came back ending at the resume, 1.5 s later and
    ~0.4 ms before the next slice's first timestamp, and those in flight at the last pause ending at the stop: such
    records (ending past the middle of the pause after their slice) are left out and counted; a kernel running a little
    past its slice's end stays, and busy time is clipped to the slice it started in. The breakdown drops them too, from
    a capture whose recorder did not, and merges the overlapping slices of two recording processes."""
    import importlib.util

    from max_profile.analyze.breakdown import build_breakdown
    from max_profile.collect.server.worker_protocol import HOOK_DIR
    from max_profile.model import KernelRecord, KernelTable

    spec = importlib.util.spec_from_file_location("max_profile_hook_under_test", HOOK_DIR / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    ms = 1_000_000
    slices = [[0, 500 * ms], [2000 * ms, 2500 * ms]]
    stopped = 3000 * ms  # the recording paused after its last slice until the stop
    recs = [
        KernelRecord(name="gemv", start_ns=10 * ms, end_ns=11 * ms),
        KernelRecord(name="gemv", start_ns=499 * ms, end_ns=503 * ms),  # past its slice by 3 ms: kept
        KernelRecord(name="norm", start_ns=500 * ms, end_ns=1999 * ms + 600_000),  # stamped at the resume: dropped
        KernelRecord(name="gemv", start_ns=2100 * ms, end_ns=2101 * ms),
        KernelRecord(name="gemv", start_ns=2499 * ms, end_ns=2600 * ms),  # before the middle of the last pause: kept
        KernelRecord(name="mha", start_ns=2499 * ms, end_ns=3001 * ms),
    ]  # stamped at the stop: dropped
    table = KernelTable.from_records(recs)
    kept, dropped = hook._drop_pause_spanning(table, slices, stopped)
    assert dropped == 2 and len(kept) == 4 and {kept.names[i] for i in kept.name_idx} == {"gemv"}
    _, ran_to_stop = hook._drop_pause_spanning(table, [[0, 500 * ms], [2000 * ms, 3000 * ms]], stopped)
    assert ran_to_stop == 1  # stopped inside the last slice: no pause after it, only the resume-stamped record goes
    whole, none = hook._drop_pause_spanning(table, slices[:1], stopped)
    assert none == 0 and len(whole) == 6  # one slice (a whole window): nothing to judge
    b = build_breakdown(kept, source="test", window=(0, 3000 * ms), recorded=[(0, 500 * ms), (2000 * ms, 2500 * ms)])
    assert b.recorded_ms == pytest.approx(1000) and b.gpu_busy_pct == pytest.approx(100 * (1 + 1 + 1 + 1) / 1000)
    assert b.paused_kernels == 0
    two_processes = [(0, 500 * ms), (1 * ms, 501 * ms), (2000 * ms, 2500 * ms), (2001 * ms, 2500 * ms)]
    raw = build_breakdown(table, source="test", window=(0, 3000 * ms), recorded=two_processes)
    assert raw.paused_kernels == 2 and raw.kernels == 4 and raw.recorded_ms == pytest.approx(1001)
    assert raw.kernel_ms == pytest.approx(kept.end_ns.sum() / 1e6 - kept.start_ns.sum() / 1e6)


def test_kernels_are_counted_by_the_slice_they_were_asked_for_in() -> None:
    """A sampled recording's kernels by recorded slice (launch time where recorded, else start), and those asked for in
    none: CUPTI records nothing while paused, so a launch 0.5 s into a pause, or a start stamped before the recording
    began, is a record whose time cannot be right (whole windows of a served recording fell outside the
    window when read). A kernel queued in a slice that starts up to 250 ms after it, or launched just before it began
    (10 ms), still counts; one near two slices counts once."""
    from max_profile.model import KernelRecord, KernelTable

    ms = 1_000_000
    slices = [(1000 * ms, 1500 * ms), (3000 * ms, 3500 * ms)]
    recs = [
        KernelRecord(name="gemv", start_ns=1100 * ms, end_ns=1101 * ms, launch_ns=1099 * ms),
        KernelRecord(name="gemv", start_ns=1700 * ms, end_ns=1701 * ms),  # no launch: queued, started 200 ms after
        KernelRecord(name="gemv", start_ns=1600 * ms, end_ns=1601 * ms, launch_ns=1499 * ms),  # launched in it
        KernelRecord(name="mha", start_ns=2100 * ms, end_ns=2101 * ms, launch_ns=2000 * ms),  # launched mid-pause
        KernelRecord(name="mha", start_ns=995 * ms, end_ns=996 * ms),  # 5 ms before the first slice: kept
        KernelRecord(name="mha", start_ns=3 * ms, end_ns=4 * ms),  # long before the recording began
        KernelRecord(name="norm", start_ns=3400 * ms, end_ns=3401 * ms, launch_ns=3399 * ms),
        KernelRecord(name="norm", start_ns=9000 * ms, end_ns=9001 * ms),  # 5.5 s after the last slice
    ]
    table = KernelTable.from_records(recs)
    counts, outside = table.per_slice(slices)
    assert counts == [4, 1] and outside.tolist() == [False, False, False, True, False, True, False, True]
    # the 1700 ms start is near both slices: counted for the first only; the 2000 ms launch is 200 ms after the second
    near_both, left = table.per_slice([(1000 * ms, 1500 * ms), (1600 * ms, 1800 * ms)])
    assert near_both == [4, 1] and left.tolist() == [False, False, False, False, False, True, True, True]
    no_slices, all_out = table.per_slice([])
    assert no_slices == [] and all_out.all()
    none_counts, none_outside = KernelTable.empty().per_slice(slices)
    assert none_counts == [0, 0] and none_outside.size == 0
    # by their own start: a kernel that ran in the second slice but was joined to a launch in the first (a wrong
    # correlation id) counts where it ran
    wrong = KernelTable.from_records(
        [
            KernelRecord(name="gemv", start_ns=(3100 + i) * ms, end_ns=(3100 + i) * ms + 1, launch_ns=1200 * ms)
            for i in range(5)
        ]
    )
    assert wrong.per_slice(slices)[0] == [5, 0] and wrong.per_slice(slices, by_start=True)[0] == [0, 5]
