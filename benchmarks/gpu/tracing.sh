#!/usr/bin/env bash
# In-process kernel tracing on the H200 (the C CUPTI recorder, issue "tracing that does not change what it
# measures"), from the repository root on the device machine after the MAX runtime is staged
# (../shared/device/README.md):
#     bash benchmarks/gpu/tracing.sh overhead|counts|serve|graphs|eager|verify
# overhead: build the recorder, then decode tok/s with no tracer / the C recorder / cupti-python / ctypes buffers,
#           and profile(kernels=off|cupti), interleaved in one process (compiles the model on a fresh machine);
#           one native recording saved for the CPU decoder tests.
# counts:   `run --kernels cupti` against `kernels --backend nsys` (same tokens: kernel counts), the recorder under
#           nsys (another CUPTI client: backs off), and `run --device-graph-capture` (kernels inside device graphs).
# serve:    `serve --mode utilization` and `serve --mode kernels` with MAX's default device graphs on in both.
# graphs:   the GPU-bound 24-layer model with device graphs on: no tracer,
#           the C recorder with / without launch records / started before a traced warm-up, profile(kernels=off|cupti).
# eager:    the same arms with device graphs off, then kernel counts of `run --kernels cupti` against nsys with graphs on.
# verify:   after the GPU wait before CUPTI's flush: counts against nsys with graphs on and off, then the graphs arms
#           again in a second process, with one graphs-on recording saved for the CPU decoder tests.
# Model: bf16, hidden 4096, 8 layers, 32 heads / 8 KV heads, intermediate 14336 (Llama-3-8B layers, ~1.75B);
# graphs / eager: the same with 24 layers (~5.2B, GPU-bound decode).
set -u
MODE=${1:?overhead|counts|serve|graphs|eager}
source benchmarks/gpu/common.sh
M=/tmp/m8
LAYERS=8
case "$MODE" in graphs|eager|verify) M=/tmp/m24; LAYERS=24 ;; esac
ARMS=off,native,native-kernels,native-warm,profile-off,profile-cupti
# the product builds the recorder against this machine's CUPTI headers; the copy built on the dev machine (CUDA 13.0
# headers, .gpu/) stands in only if that fails, and the step log says so
if ! python3 -c "from max_profile.collect.live.cupti_native import build_cupti_library as b; print('recorder built here:', b())" >> "$OUTDIR/recorder_build.txt" 2>&1; then
  echo "recorder build failed here; using the carried .gpu/libmax_profile_cupti.so" >> "$OUTDIR/recorder_build.txt"
  export MAX_PROFILE_CUPTI_RING_LIB="$PWD/.gpu/libmax_profile_cupti.so"
fi
if [ ! -f "$M/model.safetensors" ]; then
  step make_model python3 -m max_profile make-model "$M" --dtype bfloat16 --hidden 4096 --layers $LAYERS --heads 32 --kv-heads 8 --intermediate 14336
fi
case "$MODE" in
overhead)
  step recorder python3 -c "
from max_profile.collect.live.cupti_native import NativeCuptiCollector, build_cupti_library, find_libcupti, static_layout_matches
c = NativeCuptiCollector()
print('library', build_cupti_library(), 'libcupti', find_libcupti(), 'CUPTI API', c.cupti_version, 'layout as CUDA 13.0 headers here:', static_layout_matches(c.layout))"
  step overhead python3 benchmarks/tracer_overhead.py --model-path "$M" --tokens 128 --repeats 5 \
    --arms off,native,profile-off,profile-cupti --record "$OUTDIR/cupti_recording.npz" --json "$OUTDIR/overhead.json"
  # idea 1 (ctypes buffers) and the previous collector against the C recorder, in a second process (each re-registers CUPTI's callbacks)
  step ideas python3 benchmarks/tracer_overhead.py --model-path "$M" --tokens 128 --repeats 5 --arms off,native,python,ctypes \
    --json "$OUTDIR/ideas.json"
  ;;
counts)
  step run_cupti python3 -m max_profile run --model-path "$M" --devices gpu --max-new-tokens 64 --kernels cupti \
    --raw "$OUTDIR/run_cupti_raw.json.gz" --json "$OUTDIR/run_cupti.json"
  step run_nsys python3 -m max_profile kernels --backend nsys --model-path "$M" --devices gpu --max-new-tokens 64 \
    --raw "$OUTDIR/run_nsys_raw.json.gz" --json "$OUTDIR/run_nsys.json"
  step under_nsys nsys profile --trace=cuda -o /tmp/under_nsys -f true python3 -m max_profile run --model-path "$M" --devices gpu \
    --max-new-tokens 16 --kernels cupti --json "$OUTDIR/under_nsys.json"
  step run_graphs python3 -m max_profile run --model-path "$M" --devices gpu --max-new-tokens 64 --kernels cupti --device-graph-capture \
    --raw "$OUTDIR/run_graphs_raw.json.gz" --json "$OUTDIR/run_graphs.json"
  ;;
graphs)
  step graphs python3 benchmarks/tracer_overhead.py --model-path "$M" --tokens 256 --repeats "${REPEATS:-7}" --device-graph-capture \
    --arms $ARMS --json "$OUTDIR/overhead_m24_graphs.json"
  ;;
eager)
  step eager python3 benchmarks/tracer_overhead.py --model-path "$M" --tokens 256 --repeats "${REPEATS:-7}" \
    --arms $ARMS --json "$OUTDIR/overhead_m24_eager.json"
  step graphs_cupti python3 -m max_profile run --model-path "$M" --devices gpu --max-new-tokens 64 --kernels cupti --device-graph-capture \
    --raw "$OUTDIR/m24_graphs_cupti_raw.json.gz" --json "$OUTDIR/m24_graphs_cupti.json"
  step graphs_nsys python3 -m max_profile kernels --backend nsys --model-path "$M" --devices gpu --max-new-tokens 64 --device-graph-capture \
    --raw "$OUTDIR/m24_graphs_nsys_raw.json.gz" --json "$OUTDIR/m24_graphs_nsys.json"
  ;;
verify)
  for g in graphs eager; do
    flag=""; [ $g = graphs ] && flag=--device-graph-capture
    step ${g}_cupti python3 -m max_profile run --model-path "$M" --devices gpu --max-new-tokens 64 --kernels cupti $flag \
      --raw "$OUTDIR/m24_${g}_cupti_raw.json.gz" --json "$OUTDIR/m24_${g}_cupti.json"
    step ${g}_nsys python3 -m max_profile kernels --backend nsys --model-path "$M" --devices gpu --max-new-tokens 64 $flag \
      --raw "$OUTDIR/m24_${g}_nsys_raw.json.gz" --json "$OUTDIR/m24_${g}_nsys.json"
  done
  step graphs2 python3 benchmarks/tracer_overhead.py --model-path "$M" --tokens 256 --repeats "${REPEATS:-7}" --device-graph-capture \
    --arms $ARMS --json "$OUTDIR/overhead_m24_graphs2.json" --record "$OUTDIR/cupti_recording_graphs.npz"
  ;;
serve)
  step serve_util python3 -m max_profile serve --model-path "$M" --devices gpu --mode utilization --duration 10 --yes \
    --raw "$OUTDIR/serve_util_raw.json.gz" --json "$OUTDIR/serve_util.json"
  step serve_kernels python3 -m max_profile serve --model-path "$M" --devices gpu --mode kernels --duration 10 --yes --no-warm \
    --raw "$OUTDIR/serve_kernels_raw.json.gz" --json "$OUTDIR/serve_kernels.json" -- --device-graph-capture
  ;;
esac
ps -eo pid,pgid,cmd | grep -E "max|nsys" | grep -v grep > "$OUTDIR/leftover_processes.txt"
snap done 0
