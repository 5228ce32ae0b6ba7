#!/usr/bin/env bash
# GPU captures for the one-account checks, MAX's defaults, on a Llama shape (hidden 2560, 20 layers, 20 / 4 heads,
# intermediate 6912, bf16, random weights) built here:
#   1. in-process generations at batch 1 and batch 48, profile(kernels="auto") (a sixteenth of the steps recorded),
#      one load (max_batch_size 48): benchmarks/gpu/capture_generations.py
#   2. serve --mode kernels's recording against untraced windows of one eager server (--no-device-graph-capture):
#      benchmarks/serve_ab.py, the default share and a thirty-second, each window between two untraced ones
#   3. `serve --mode kernels` on the same eager server shape (its report: the ledger, the idle lever, the recording's
#      measured share)
# Run from the repository root with MAX's runtime staged (shared/device/README.md). It copies the repository to
# /tmp/oa_repo first, so it can run detached (setsid) while other commands poll it; results land in /tmp/oa,
# packed into /tmp/oa.tgz after every step. ONLY="gen serve_ab serve" picks steps.
set -u
SRC=$(pwd)
OA=/tmp/oa
mkdir -p "$OA"
rm -rf /tmp/oa_repo && cp -r "$SRC" /tmp/oa_repo && cd /tmp/oa_repo || exit 1
source .maxrt/env.sh
export PYTHONPATH="/tmp/oa_repo:$PYTHONPATH" MAX_PROFILE_CACHE=/tmp/mpc PYTHONUNBUFFERED=1 COLUMNS=120
MP=(python3 -m max_profile)
M=/tmp/m2560
pack() { tar czf /tmp/oa.tgz.part -C "$OA" . 2>/dev/null && mv /tmp/oa.tgz.part /tmp/oa.tgz; }
step() {
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then echo "== skipped $name"; return 0; fi
  local t0=$(date +%s)
  "$@" > "$OA/$name.out" 2> "$OA/$name.err" &
  local pid=$! waited=0
  while kill -0 "$pid" 2> /dev/null; do sleep 1; waited=$((waited + 1)); [ $((waited % 20)) -eq 0 ] && pack; done
  wait "$pid"; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OA/steps.txt"
  pack
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OA/nvidia-smi.csv" 2>&1
python3 -c "import max; print('MAX', max.__version__)" > "$OA/max_version.txt" 2>&1
[ -f $M/model.safetensors ] || "${MP[@]}" make-model $M --dtype bfloat16 --hidden 2560 --layers 20 --heads 20 \
  --kv-heads 4 --intermediate 6912 > "$OA/make_model.out" 2>&1
step gen python3 benchmarks/gpu/capture_generations.py --model-path $M --batch 48 --tokens 128 --out "$OA/gen"
step serve_ab python3 benchmarks/serve_ab.py --model-path $M --devices gpu --pairs 3 --duration 10 \
  --variants default,share=0.03125 --json "$OA/serve_ab_eager.json" -- --max-batch-size 48 --no-device-graph-capture
step serve "${MP[@]}" serve --model-path $M --mode kernels --no-warm --yes --json "$OA/serve_eager.json" \
  --raw "$OA/serve_eager_raw.json.gz" --text "$OA/serve_eager.txt" -- --max-batch-size 48 --no-device-graph-capture
echo "one_account: done" | tee -a "$OA/steps.txt"
pack
