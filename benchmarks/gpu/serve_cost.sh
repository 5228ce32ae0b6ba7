#!/usr/bin/env bash
# What `serve --mode kernels` costs a served model on the GPU, part by part, against a plain `max serve` under the same
# load (benchmarks/serve_cost.py), on an eager server and on one with MAX's default device graphs, at concurrency 1
# and 8. From the repository root on the device machine after the MAX runtime parts are staged
# (../shared/device/README.md); it runs in the background (setsid) and keeps its results in /tmp/mp_serve_cost:
#     bash benchmarks/gpu/serve_cost.sh start     # starts the job, returns at once
#     bash benchmarks/gpu/serve_cost.sh wait S    # waits up to S seconds for it, then packs what it has into $OUT
# Model: bf16 Llama, hidden 2048, 16 layers, 16 / 8 heads, intermediate 6144 (~0.9B: a Qwen3-1.7B-like width, whose
# eager decode step is launch-bound).
set -u
OUTDIR=/tmp/mp_serve_cost
M=/tmp/m16
case "${1:-start}" in
start)
  mkdir -p "$OUTDIR" /tmp/mp_repo
  tar cf - --exclude="./.maxrt/maxrt.part*" . | tar xf - -C /tmp/mp_repo  # its own copy: the next call replaces the tree
  cd /tmp/mp_repo || exit 1
  setsid bash -c '
    source .maxrt/env.sh
    export PYTHONPATH="$PWD:$PYTHONPATH" MAX_PROFILE_CACHE=/tmp/mpc PYTHONUNBUFFERED=1
    O='"$OUTDIR"'; M='"$M"'
    step() { local name=$1; shift; local t0=$(date +%s); echo "== $(date +%T) $name" >> $O/steps.txt
      "$@" > $O/$name.out 2> $O/$name.err; echo "$name: rc=$? $(( $(date +%s) - t0 ))s" >> $O/steps.txt; }
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > $O/nvidia-smi.csv 2>&1
    step recorder python3 -c "from max_profile.collect.live.cupti_native import build_cupti_library as b; print(b())"
    step make_model python3 -m max_profile make-model $M --dtype bfloat16 --hidden 2048 --layers 16 --heads 16 \
      --kv-heads 8 --intermediate 6144
    step eager python3 benchmarks/serve_cost.py --model-path $M --devices gpu --concurrency 1,8 --rounds 1 \
      --duration 6 --servers plain,kernels --variants steps,paused,default --json $O/eager.json --raw-dir $O \
      -- --no-device-graph-capture
    step graphs python3 benchmarks/serve_cost.py --model-path $M --devices gpu --concurrency 1,8 --rounds 1 \
      --duration 6 --servers plain,kernels --variants default --json $O/graphs.json --raw-dir $O --no-warm
    step eager_spans python3 benchmarks/serve_cost.py --model-path $M --devices gpu --concurrency 1,8 --rounds 1 \
      --duration 6 --servers kernels+spans,kernels --variants default --json $O/eager_spans.json --no-warm \
      -- --no-device-graph-capture
    echo done > $O/DONE
  ' > "$OUTDIR/job.log" 2>&1 < /dev/null &
  echo "started: $OUTDIR"
  ;;
wait)
  deadline=$(( $(date +%s) + ${2:-500} ))
  while [ ! -f "$OUTDIR/DONE" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
  cat "$OUTDIR/steps.txt" 2>/dev/null
  for f in "$OUTDIR"/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -25 "$f"; }; done
  tar czf "$OUT/serve_cost.tgz" -C "$OUTDIR" . 2>/dev/null
  [ -f "$OUTDIR/DONE" ] && echo "serve_cost: DONE" || echo "serve_cost: still running"
  ;;
esac
