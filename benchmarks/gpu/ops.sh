#!/usr/bin/env bash
# H200 runs of `--kernels ops`: MAX's ops joined to the CUPTI kernels they launched, from the repository
# root on the device machine after the MAX runtime is staged (../shared/device/README.md):
#     bash benchmarks/gpu/ops.sh
# The NVTX v2 library MAX's profiling mode needs on CUDA 13 comes from the nvidia-nvtx-cu12 wheel (carried in
# .gpu/nvtx/), unpacked onto PYTHONPATH: max_profile finds it there and puts it on the model's library path.
# ops_a: (a) llama_custom; ops_b: (b) llama_unfused_attention (its own graph); default_a: (a) as MAX runs it by default
# (--kernels auto: device graphs on, profiling off), the yardstick of the ops mode's own cost.
# Model: bf16, hidden 2048, 8 layers, 16 heads / 8 KV heads, intermediate 8192.
set -u
MODE=ops
source benchmarks/gpu/common.sh
python3 -m zipfile -e .gpu/nvtx/nvidia_nvtx_cu12-*.whl /tmp/extra
export PYTHONPATH="$PYTHONPATH:/tmp/extra"

BASE=/tmp/mops
if [ ! -f "$BASE/model.safetensors" ]; then
  step make_model python3 -m max_profile make-model "$BASE" --dtype bfloat16 --hidden 2048 --layers 8 --heads 16 \
    --kv-heads 8 --intermediate 8192
fi
variant() {  # same weights, another architecture name in config.json
  local dir=$1 arch=$2
  mkdir -p "$dir"
  for f in "$BASE"/*; do [ "$(basename "$f")" = config.json ] || ln -sf "$f" "$dir/"; done
  python3 -c "import json; c=json.load(open('$BASE/config.json')); c['architectures']=['$arch']; json.dump(c, open('$dir/config.json','w'))"
}
variant /tmp/mops_a MaxProfileLlamaForCausalLM
variant /tmp/mops_b MaxProfileUnfusedAttentionLlamaForCausalLM
RUN=(python3 -m max_profile run --devices gpu --prompt "The quick brown fox jumps over the lazy dog" --max-new-tokens 64)
for name in ${RUNS:-ops_a ops_b default_a}; do
  case $name in
    ops_a) args=(--model-path /tmp/mops_a --custom-architectures custom_archs/llama_custom --kernels ops) ;;
    ops_b) args=(--model-path /tmp/mops_b --custom-architectures custom_archs/llama_unfused_attention --kernels ops) ;;
    default_a) args=(--model-path /tmp/mops_a --custom-architectures custom_archs/llama_custom --kernels auto) ;;
  esac
  step "$name" "${RUN[@]}" "${args[@]}" --json "$OUTDIR/$name.json" --raw "$OUTDIR/${name}_raw.json.gz" \
    --text "$OUTDIR/$name.txt"
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUTDIR/nvidia-smi.csv"
snap done 0
