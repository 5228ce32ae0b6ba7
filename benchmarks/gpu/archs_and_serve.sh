#!/usr/bin/env bash
# H200 runs of the custom architectures (custom_archs/) and of `max-profile serve`, from the
# repository root on the device machine after the MAX runtime is staged (../shared/device/README.md):
#     bash benchmarks/gpu/archs_and_serve.sh archs1|archs2|serve
# archs1: (a) llama_custom, then (c) llama_no_kv_cache (the same graph: one compile), CUPTI kernels.
# archs2: (b) llama_unfused_attention (its own graph: a second compile), CUPTI kernels.
# serve:  `max-profile serve` on the built-in Llama with the same weights: --mode kernels, then --mode nsys.
# servek: --mode kernels, --mode utilization (no tracer: the baseline), then `run --kernels cupti` (CUPTI's cost).
# Model: bf16, hidden 4096, 8 layers, 32 heads / 8 KV heads, intermediate 14336 (Llama-3-8B layers).
set -u
MODE=${1:?archs1|archs2|serve|servek}
source benchmarks/gpu/common.sh

BASE=/tmp/m8
if [ ! -f "$BASE/model.safetensors" ]; then
  step make_model python3 -m max_profile make-model "$BASE" --dtype bfloat16 --hidden 4096 --layers 8 --heads 32 --kv-heads 8 --intermediate 14336
fi
variant() {  # same weights, another architecture name in config.json
  local dir=$1 arch=$2
  mkdir -p "$dir"
  for f in "$BASE"/*; do [ "$(basename "$f")" = config.json ] || ln -sf "$f" "$dir/"; done
  python3 -c "import json,sys; c=json.load(open('$BASE/config.json')); c['architectures']=['$arch']; json.dump(c, open('$dir/config.json','w'))"
}
variant /tmp/m8_a MaxProfileLlamaForCausalLM
variant /tmp/m8_b MaxProfileUnfusedAttentionLlamaForCausalLM
variant /tmp/m8_c MaxProfileNoKVCacheLlamaForCausalLM
RUN=(python3 -m max_profile run --devices gpu --prompt "hi" --max-new-tokens 256 --kernels cupti)

case "$MODE" in
archs1)
  step arch_a "${RUN[@]}" --model-path /tmp/m8_a --custom-architectures custom_archs/llama_custom --json "$OUTDIR/arch_a.json" --raw "$OUTDIR/arch_a_raw.json.gz"
  step arch_c "${RUN[@]}" --model-path /tmp/m8_c --custom-architectures custom_archs/llama_no_kv_cache --json "$OUTDIR/arch_c.json" --raw "$OUTDIR/arch_c_raw.json.gz"
  ;;
archs2)
  step arch_b "${RUN[@]}" --model-path /tmp/m8_b --custom-architectures custom_archs/llama_unfused_attention --json "$OUTDIR/arch_b.json" --raw "$OUTDIR/arch_b_raw.json.gz"
  ;;
serve)
  step serve_kernels python3 -m max_profile serve --model-path "$BASE" --devices gpu --mode kernels --duration 10 --yes \
    --artifacts-dir "$OUTDIR/serve_kernels" --json "$OUTDIR/serve_kernels.json"
  step serve_nsys python3 -m max_profile serve --model-path "$BASE" --devices gpu --mode nsys --duration 10 --yes --no-warm \
    --artifacts-dir "$OUTDIR/serve_nsys" --json "$OUTDIR/serve_nsys.json"
  rm -f "$OUTDIR"/serve_nsys/serve.nsys-rep
  [ -f "$OUTDIR"/serve_nsys/serve.sqlite ] && step time_nsys_read python3 benchmarks/time_nsys_read.py "$OUTDIR"/serve_nsys/serve.sqlite
  gzip -9 "$OUTDIR"/serve_nsys/serve.sqlite 2>/dev/null
  [ "$(stat -c %s "$OUTDIR"/serve_nsys/serve.sqlite.gz 2>/dev/null || echo 0)" -lt 20000000 ] || rm -f "$OUTDIR"/serve_nsys/serve.sqlite.gz
  ls -la "$OUTDIR"/serve_* > "$OUTDIR/serve_listing.txt" 2>&1
  ;;
servek)
  step serve_kernels python3 -m max_profile serve --model-path "$BASE" --devices gpu --mode kernels --duration 10 --yes \
    --artifacts-dir "$OUTDIR/serve_kernels" --json "$OUTDIR/serve_kernels.json"
  step serve_util python3 -m max_profile serve --model-path "$BASE" --devices gpu --mode utilization --duration 10 --yes --no-warm \
    --json "$OUTDIR/serve_util.json"
  step run_cupti "${RUN[@]}" --model-path "$BASE" --json "$OUTDIR/run_cupti.json"
  ;;
esac
ps -eo pid,pgid,cmd | grep -E "max|nsys" | grep -v grep > "$OUTDIR/leftover_processes.txt"
snap done 0
