#!/usr/bin/env bash
# Every verb with MAX's defaults on one H200 (device graphs as MAX decides, overlap pipeline): each step's exit code,
# wall time and findings in one table (acceptance.tsv), with the reports and commands. Run after GPU-path changes:
#     bash benchmarks/gpu/acceptance.sh            (from the repository root, MAX runtime staged: shared/device/README.md)
# It copies the repository to /tmp/acc_repo first, so it can run detached (setsid) while other commands poll it;
# everything lands in /tmp/acc, packed into /tmp/acceptance.tgz (and $OUT/ when set) after every step.
#
# Models (random weights, built here by `max-profile make-model`): m24 = bf16 Llama hidden 4096, 24 layers, 32/8 heads,
# intermediate 14336 (~5.2B, GPU-bound decode); fp8 = the same shape with 8 layers, block-scaled FP8 (quant_method fp8,
# 128x128 blocks); custom = m24's weights under the custom architecture of custom_archs/llama_custom.
set -u
SRC=$(pwd)
ACC=/tmp/acc
mkdir -p "$ACC"
rm -rf /tmp/acc_repo && cp -r "$SRC" /tmp/acc_repo && cd /tmp/acc_repo || exit 1
source .maxrt/env.sh
export PYTHONPATH="/tmp/acc_repo:/tmp/site:$PYTHONPATH" MAX_PROFILE_CACHE=/tmp/mpc PYTHONUNBUFFERED=1 COLUMNS=120
if [ -d .gpu/debs ]; then
  mkdir -p /tmp/dw && for f in .gpu/debs/*.deb; do dpkg -x "$f" /tmp/dw; done
  export LD_LIBRARY_PATH="/tmp/dw/usr/lib/x86_64-linux-gnu:/tmp/dw/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
export PATH="/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64:/usr/local/cuda/bin:$PATH"   # nsys, ncu
# CUDA 12's NVTX v2 library for MAX's profiling mode (the ops steps), from the nvidia-nvtx-cu12 wheel carried in .gpu/nvtx/
# (12.1.105, as the refusal's fix names: 12.9's wheel holds headers only):
# on PYTHONPATH, where max_profile finds it and puts it on the model worker's library path
if ls .gpu/nvtx/nvidia_nvtx_cu12-*.whl > /dev/null 2>&1; then
  python3 -m zipfile -e .gpu/nvtx/nvidia_nvtx_cu12-*.whl /tmp/nvtxw && export PYTHONPATH="$PYTHONPATH:/tmp/nvtxw"
fi
MP=(python3 -m max_profile)
M24=/tmp/m24 FP8=/tmp/fp8 CUSTOM=/tmp/m24custom
TABLE=$ACC/acceptance.tsv
[ -f "$TABLE" ] || printf 'step\texit\tseconds\tfindings\tcommand\n' > "$TABLE"

# (a part file per shell: the warm-cache steps run in subshells beside the measured one)
pack() { local part=/tmp/acceptance.tgz.part.$BASHPID; tar czf "$part" -C "$ACC" . 2>/dev/null && mv "$part" /tmp/acceptance.tgz; [ -n "${OUT:-}" ] && cp /tmp/acceptance.tgz "$OUT/" 2>/dev/null; return 0; }
findings() {  # the finding ids (severity) of a --json report
  python3 - "$1" <<'PY' 2>/dev/null
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception:
    print("-"); sys.exit()
print(",".join(f"{f['id']}({f['severity'][0]})" for f in d.get("findings", [])) or "none")
PY
}
# with_arch SRC DST ARCH: DST is model SRC under architecture ARCH (SRC's files linked, config.json's architectures
# [ARCH]); DST = SRC rewrites SRC's config.json in place
with_arch() {
  local src=$1 dst=$2 arch=$3
  if [ "$src" != "$dst" ]; then
    mkdir -p "$dst" && for f in "$src"/*; do ln -sf "$f" "$dst"/; done && rm -f "$dst/config.json" || return 1
  fi
  python3 -c "import json, sys; c = json.load(open(sys.argv[1])); c['architectures'] = [sys.argv[3]]; json.dump(c, open(sys.argv[2], 'w'))" \
    "$src/config.json" "$dst/config.json" "$arch"
}
# step NAME JSON -- command...: run it, keep stdout/stderr, one table row (exit code, wall seconds, findings of JSON).
# ACC_ONLY="make_m24 startup_m24_cold serve_ab ..." runs only the named steps (name the make_* a step needs);
# AB_PAIRS=5 gives serve_ab more rounds (default 3); AB_VARIANTS its recording variants (default: "default,full", what
# `serve --mode kernels` records and every kernel of the whole window; benchmarks/serve_ab.py lists the others)
step() {
  local name=$1 json=$2; shift 3
  if [ -n "${ACC_ONLY:-}" ] && [[ " $ACC_ONLY " != *" $name "* ]]; then echo "== skipped $name (ACC_ONLY)"; return 0; fi
  local t0=$(date +%s.%N)
  # packed every PACK_EVERY s (default 30) while it runs: a machine taken back mid-step still leaves the step's output so
  # far in /tmp/acceptance.tgz (a serve_ab window table is printed only at its end)
  "$@" > "$ACC/$name.out" 2> "$ACC/$name.err" &
  local pid=$! waited=0
  while kill -0 "$pid" 2> /dev/null; do
    sleep 1; waited=$((waited + 1))
    [ $((waited % ${PACK_EVERY:-30})) -eq 0 ] && pack
  done
  wait "$pid"
  local rc=$?
  local secs=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$secs" "$( [ "$json" = - ] && echo - || findings "$json")" "$*" >> "$TABLE"
  echo "== $(date +%T) $name rc=$rc ${secs}s"; tail -2 "$ACC/$name.err"
  pack
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$ACC/nvidia-smi.csv" 2>&1
step doctor "$ACC/doctor.json" -- "${MP[@]}" doctor --json "$ACC/doctor.json"

# --- models, then three cold compiles side by side (they only use CPU cores and the cache; startup reports are cold)
[ -f $M24/model.safetensors ] || step make_m24 - -- "${MP[@]}" make-model $M24 --dtype bfloat16 --hidden 4096 --layers 24 --heads 32 --kv-heads 8 --intermediate 14336
[ -f $FP8/model.safetensors ] || step make_fp8 - -- "${MP[@]}" make-model $FP8 --dtype float8_e4m3fn --hidden 4096 --layers 8 --heads 32 --kv-heads 8 --intermediate 14336
[ -f $M24/model.safetensors ] && with_arch $M24 $CUSTOM MaxProfileLlamaForCausalLM  # not when ACC_ONLY skipped m24
DEMO=/tmp/mpc/models/demo-llama-bfloat16-h2048-l4   # the model `max-profile demo` builds on a GPU (same shape, same compile key)
[ -f $DEMO/model.safetensors ] || step make_demo - -- "${MP[@]}" make-model $DEMO --dtype bfloat16 --hidden 2048 --layers 4 --heads 16 --kv-heads 4 --intermediate 5632
# the GPU compiles m24 (its cold start-up, recorded); meanwhile MAX compiles the other two for sm_90 on virtual devices
# (`max warm-cache --target`: CPU cores only, no GPU memory taken from the measured run)
( step warm_fp8 - -- max warm-cache --model-path $FP8 --devices gpu --target cuda:sm_90 ) &
( step warm_demo - -- max warm-cache --model-path $DEMO --devices gpu --target cuda:sm_90 ) &
step startup_m24_cold "$ACC/startup_m24_cold.json" -- "${MP[@]}" startup --model-path $M24 --devices gpu --json "$ACC/startup_m24_cold.json" --html "$ACC/startup_m24_cold.html"
wait

# --- `serve --mode ops` on the 8-layer custom-architecture Llama of the ops runs (bf16, hidden 2048,
# 16 / 8 heads, intermediate 8192; benchmarks/gpu/ops.sh): MAX's op ranges from the server's model worker joined to its
# CUPTI kernels, the server cold (its compile with profiling on is part of the run)
MOPS=/tmp/mops_custom MOPSU=/tmp/mops_unfused
[ -f $MOPS/model.safetensors ] || step make_mops - -- "${MP[@]}" make-model $MOPS --dtype bfloat16 --hidden 2048 --layers 8 --heads 16 --kv-heads 8 --intermediate 8192
if [ -f $MOPS/model.safetensors ]; then
  with_arch $MOPS $MOPS MaxProfileLlamaForCausalLM && with_arch $MOPS $MOPSU MaxProfileUnfusedAttentionLlamaForCausalLM
fi
step serve_ops_custom "$ACC/serve_ops_custom.json" -- "${MP[@]}" serve --model-path $MOPS --custom-architectures custom_archs/llama_custom --mode ops --no-warm --yes --json "$ACC/serve_ops_custom.json" --raw "$ACC/serve_ops_custom_raw.json.gz" --text "$ACC/serve_ops_custom.txt"
# the deep dive that ops capture's `op-below-roofline` prints, run as printed (its argv, output flags added)
step kernel_ops_custom "$ACC/kernel_ops_custom.json" -- python3 benchmarks/gpu/run_printed.py "$ACC/serve_ops_custom.json" kernel@op-below-roofline --json "$ACC/kernel_ops_custom.json" --output-dir "$ACC/ncu_ops"

# --- one at a time: what each number rests on (GPU to itself)
step kernel_gemv "$ACC/kernel_gemv.json" -- "${MP[@]}" kernel gemv_split_k --model-path $M24 --launches 2 --output-dir "$ACC/ncu" --json "$ACC/kernel_gemv.json"
step serve_ab - -- python3 benchmarks/serve_ab.py --model-path $M24 --devices gpu --pairs "${AB_PAIRS:-3}" --duration 10 --variants "${AB_VARIANTS:-default,full}" --json "$ACC/serve_ab.json"
step run_b32 "$ACC/run_b32.json" -- "${MP[@]}" run --model-path $M24 --devices gpu --batch-size 32 --max-new-tokens 64 --json "$ACC/run_b32.json" --raw "$ACC/run_b32_raw.json.gz"
step startup_fp8 "$ACC/startup_fp8.json" -- "${MP[@]}" startup --model-path $FP8 --devices gpu --json "$ACC/startup_fp8.json"
step run_fp8 "$ACC/run_fp8.json" -- "${MP[@]}" run --model-path $FP8 --devices gpu --max-new-tokens 64 --json "$ACC/run_fp8.json" --raw "$ACC/run_fp8_raw.json.gz" --html "$ACC/run_fp8.html"
step serve_kernels "$ACC/serve_kernels.json" -- "${MP[@]}" serve --model-path $M24 --mode kernels --no-warm --yes --json "$ACC/serve_kernels.json" --raw "$ACC/serve_kernels_raw.json.gz"
step startup_m24_warm "$ACC/startup_m24_warm.json" -- "${MP[@]}" startup --model-path $M24 --devices gpu --json "$ACC/startup_m24_warm.json"
step run_b1 "$ACC/run_b1.json" -- "${MP[@]}" run --model-path $M24 --devices gpu --max-new-tokens 64 --json "$ACC/run_b1.json" --raw "$ACC/run_b1_raw.json.gz" --html "$ACC/run_b1.html"
step serve_sweep "$ACC/serve_sweep.json" -- "${MP[@]}" serve --model-path $M24 --mode utilization --concurrency 1,4,16,64 --duration 8 --slo ttft=200,itl=20 --no-warm --yes --json "$ACC/serve_sweep.json" --raw "$ACC/serve_sweep_raw.json.gz" --html "$ACC/serve_sweep.html"
step demo "$ACC/demo/report.json" -- "${MP[@]}" demo --out "$ACC/demo"
step run_custom "$ACC/run_custom.json" -- "${MP[@]}" run --model-path $CUSTOM --devices gpu --custom-architectures custom_archs/llama_custom --max-new-tokens 64 --json "$ACC/run_custom.json"
step serve_nsys "$ACC/serve_nsys.json" -- "${MP[@]}" serve --model-path $M24 --mode nsys --no-warm --yes --artifacts-dir "$ACC/nsys" --json "$ACC/serve_nsys.json"
step run_off "$ACC/run_off.json" -- "${MP[@]}" run --model-path $M24 --devices gpu --kernels off --json "$ACC/run_off.json"
step run_nvtx "$ACC/run_nvtx.json" -- "${MP[@]}" run --model-path $M24 --devices gpu --kernels nvtx-log --json "$ACC/run_nvtx.json"
# the same A/B with the traced windows opened right after the worker's recording runs (no settle): CUPTI's first launches
# after its enable inside the window, as measured against the default settle above
step serve_ab_settle0 - -- python3 benchmarks/serve_ab.py --model-path $M24 --devices gpu --pairs 3 --duration 10 --settle 0 --variants full --json "$ACC/serve_ab_settle0.json"

# --- the step ledger on a Llama-3.2-3B-shaped bf16 model (hidden 3072,
# 28 layers, 24 / 8 heads, intermediate 8192), batch 64; the deep dive its report prints, run as printed; the serve worker's
# phase split; attach on an idle server; a block-scaled FP8 nsys trace read back without its config
M3B=/tmp/m3b
[ -f $M3B/model.safetensors ] || step make_m3b - -- "${MP[@]}" make-model $M3B --dtype bfloat16 --hidden 3072 --layers 28 --heads 24 --kv-heads 8 --intermediate 8192
step run_b64_3b "$ACC/run_b64_3b.json" -- "${MP[@]}" run --model-path $M3B --devices gpu --batch-size 64 --max-new-tokens 128 --json "$ACC/run_b64_3b.json" --raw "$ACC/run_b64_3b_raw.json.gz" --text "$ACC/run_b64_3b.txt"
# the same run with every step recorded (run_b64_3b records a quarter of the steps by default):
# the sampled ledger against the full one
step run_b64_3b_all "$ACC/run_b64_3b_all.json" -- "${MP[@]}" run --model-path $M3B --devices gpu --batch-size 64 --max-new-tokens 128 --kernel-share 1 --json "$ACC/run_b64_3b_all.json" --raw "$ACC/run_b64_3b_all_raw.json.gz"
# the report's top deep-dive command as printed (its argv), with only the output flags added
step kernel_b64_3b "$ACC/kernel_b64_3b.json" -- python3 benchmarks/gpu/run_printed.py "$ACC/run_b64_3b.json" kernel --json "$ACC/kernel_b64_3b.json" --output-dir "$ACC/ncu3b"
# the servers take the run's --max-batch-size (64): the same compile key, no second compile of the model
step serve_kernels_3b "$ACC/serve_kernels_3b.json" -- "${MP[@]}" serve --model-path $M3B --mode kernels --concurrency 4 --no-warm --yes --json "$ACC/serve_kernels_3b.json" --raw "$ACC/serve_kernels_3b_raw.json.gz" --text "$ACC/serve_kernels_3b.txt" -- --max-batch-size 64
step attach_idle_3b "$ACC/attach_idle_3b.json" -- bash benchmarks/gpu/attach_idle.sh $M3B "$ACC/attach_idle_3b"
# what profiling costs a fast model against no max_profile code at all: batch 1, 128 tokens, 11 rotating rounds,
# the run's compile key (--max-batch-size 64); device graphs as MAX decides, then eager
step overhead_3b_graphs - -- python3 benchmarks/untraced_overhead.py --model-path $M3B --devices gpu --tokens "${OVERHEAD_TOKENS:-128}" --repeats "${OVERHEAD_REPEATS:-11}" --max-batch-size 64 --arms "${OVERHEAD_ARMS:-none,hook,sampler,cupti,cupti-all}" --json "$ACC/overhead_3b_graphs.json"
FP8S=/tmp/fp8s  # block-scaled FP8, 4 layers (a shorter compile than the 8-layer one above)
[ -f $FP8S/model.safetensors ] || step make_fp8s - -- "${MP[@]}" make-model $FP8S --dtype float8_e4m3fn --hidden 4096 --layers 4 --heads 32 --kv-heads 8 --intermediate 14336
step nsys_fp8 "$ACC/nsys_fp8.json" -- "${MP[@]}" kernels --backend nsys --model-path $FP8S --devices gpu --max-new-tokens 32 --json "$ACC/nsys_fp8.json"
python3 -c "import json, shutil, sys; d = json.load(open(sys.argv[1])); src = next(a for a in d['artifacts'] if a.endswith('.sqlite')); shutil.copy(src, sys.argv[2])" "$ACC/nsys_fp8.json" "$ACC/nsys_fp8.sqlite" 2>/dev/null && gzip -kf "$ACC/nsys_fp8.sqlite"
step import_fp8_noconfig "$ACC/import_fp8_noconfig.json" -- "${MP[@]}" report "$ACC/nsys_fp8.sqlite" --json "$ACC/import_fp8_noconfig.json" --text "$ACC/import_fp8_noconfig.txt"
rm -f "$ACC/nsys_fp8.sqlite"
step overhead_3b_eager - -- python3 benchmarks/untraced_overhead.py --model-path $M3B --devices gpu --tokens "${OVERHEAD_TOKENS:-128}" --repeats "${OVERHEAD_REPEATS:-11}" --max-batch-size 64 --arms "${OVERHEAD_ARMS:-none,hook,sampler,cupti,cupti-all}" --no-device-graph-capture --json "$ACC/overhead_3b_eager.json"
# the unfused-attention architecture (attention as separate matmul / softmax ops) served in ops mode
step serve_ops_unfused "$ACC/serve_ops_unfused.json" -- "${MP[@]}" serve --model-path $MOPSU --custom-architectures custom_archs/llama_unfused_attention --mode ops --no-warm --yes --json "$ACC/serve_ops_unfused.json" --raw "$ACC/serve_ops_unfused_raw.json.gz" --text "$ACC/serve_ops_unfused.txt"
# serve's recorder on the fast 3B shape, A/B on one server (its compile with profiling on is in the
# warm pass): the default share against a sixteenth of each window, the step hook alone (CUPTI off) and CUPTI paused
# through the window (the served cost did not follow the share recorded); then the 5.2B model against no
# profiler, graphs on. serve_ab_3b's capture (--raw, ~3M kernels) stays outside $ACC: too large to bring back, and in
# $ACC it would swell every later pack of acceptance.tgz. serve_ab.py puts each recorded window between two untraced
# ones and compares it with the untraced level at its place (a server can drift 26 % between untraced windows):
# 4 variants x 3 rounds = 25 windows.
step serve_ab_3b - -- python3 benchmarks/serve_ab.py --model-path $M3B --devices gpu --pairs "${AB_PAIRS:-3}" --duration 10 --variants "${AB3_VARIANTS:-default,share=0.0625,steps,share=0.001}" --json "$ACC/serve_ab_3b.json" --raw /tmp/serve_ab_3b_raw.json.gz
step overhead_m24_graphs - -- python3 benchmarks/untraced_overhead.py --model-path $M24 --devices gpu --tokens "${OVERHEAD_TOKENS:-128}" --repeats "${OVERHEAD_REPEATS:-11}" --arms "${OVERHEAD_M24_ARMS:-none,sampler,cupti}" --json "$ACC/overhead_m24_graphs.json"
rm -rf "$ACC/ncu"/*.ncu-rep "$ACC/ncu3b"/*.ncu-rep "$ACC/ncu_ops"/*.ncu-rep "$ACC/nsys"/*.nsys-rep "$ACC/nsys"/*.sqlite 2>/dev/null  # big; their readings are in the reports
# the table, aligned (the H200 image has no `column`)
python3 -c "import csv, sys; rows = list(csv.reader(open(sys.argv[1]), delimiter='\t')); w = [max(len(r[i]) for r in rows) for i in range(4)]
for r in rows: print('  '.join(c.ljust(n) for c, n in zip(r, w)), ' ', r[4][:100])" "$TABLE"
pack
echo "acceptance: done"
