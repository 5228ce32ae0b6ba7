#!/usr/bin/env bash
# Captures the real-GPU artifacts used as test fixtures (tests/data/gpu/h200_llama180m_host_bound,
# h200_llama7b_gemv_decode) and the numbers in their READMEs. Runs on the device machine after the MAX runtime parts are staged
# (../shared/device/README.md), from the repository root:
#     bash benchmarks/gpu/capture.sh small|big
# small: hidden 2048, 4 layers, bf16 (host-bound on an H200): demo, CUPTI, nsys, ncu, overhead.
# big:   hidden 4096, 32 layers, bf16 (GPU-bound decode): CUPTI run, overhead, ncu on a GEMV.
# Every step is independent; results are re-packed into $OUT/h200_<mode>.tgz after each step.
set -u
MODE=${1:-small}
source benchmarks/gpu/common.sh
NCU=/usr/local/cuda/bin/ncu

if [ "$MODE" = small ]; then
  MODEL=/tmp/small; SHAPE=(--hidden 2048 --layers 4 --heads 16 --kv-heads 4 --intermediate 5632)
else
  MODEL=/tmp/big; SHAPE=(--hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336)
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUTDIR/nvidia-smi.csv" 2>&1
step doctor python3 -m max_profile doctor --json "$OUTDIR/doctor.json"
[ -f "$MODEL/model.safetensors" ] || step make_model python3 -m max_profile make-model "$MODEL" --dtype bfloat16 "${SHAPE[@]}"
# 1. profile() with CUPTI kernels and GPU sampling (the first run compiles: ~3.5 min)
step run_cupti python3 -m max_profile run --model-path "$MODEL" --devices gpu --max-new-tokens 64 --kernels cupti \
  --json "$OUTDIR/run_cupti.json" --raw "$OUTDIR/run_cupti_raw.json.gz"
# 2. overhead of profile() (markers + sampling), interleaved in one process
step overhead python3 benchmarks/overhead.py --model-path "$MODEL" --devices gpu --tokens 128 --repeats 5
if [ "$MODE" = small ]; then
  step demo python3 -m max_profile demo --hidden 2048 --layers 4 --max-new-tokens 48 --json "$OUTDIR/demo.json"
  # 3. nsys with warm-up outside the capture range
  step nsys python3 -m max_profile kernels --backend nsys --model-path "$MODEL" --devices gpu --max-new-tokens 40 --json "$OUTDIR/nsys.json"
  cp /tmp/max-profile-nsys-*/capture.sqlite "$OUTDIR/nsys_capture.sqlite" 2>/dev/null; snap nsys_copy 0
fi
# 4. ncu on a decode GEMV and a decode attention kernel (few launches, replayed)
GEN=(python3 -m max_profile -q run --model-path "$MODEL" --devices gpu --max-new-tokens 12 --warmup 0 --kernels off)
step ncu_gemv $NCU --target-processes all --clock-control none -k regex:gemv_split_k --launch-skip 8 -c 2 --set full \
  -o "$OUTDIR/ncu_gemv" -f "${GEN[@]}"
step ncu_mha $NCU --target-processes all --clock-control none --nvtx --nvtx-include "max_profile@decode/" -k regex:mha -c 2 --set full \
  -o "$OUTDIR/ncu_mha" -f "${GEN[@]}"
for r in ncu_gemv ncu_mha; do
  [ -f "$OUTDIR/$r.ncu-rep" ] || continue
  $NCU --import "$OUTDIR/$r.ncu-rep" --csv --page details --print-units base > "$OUTDIR/${r}_details.csv" 2>&1
  $NCU --import "$OUTDIR/$r.ncu-rep" --csv --page raw --print-units base > "$OUTDIR/${r}_raw.csv" 2>&1
done
snap ncu_export 0
# 5. live ncu CSV on stdout (the noisy form: app output before the header)
step ncu_live $NCU --target-processes all --clock-control none -k regex:rms_norm -c 1 --set basic --csv --page details --print-units base "${GEN[@]}"
ls -la "$OUTDIR" > "$OUTDIR/listing.txt"; snap done 0
