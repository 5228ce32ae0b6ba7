#!/usr/bin/env bash
# The end-to-end `max-profile kernel` run on the H200 (attention kernel of the small model), after
# staging the MAX runtime. Results in $OUT/deep_dive.tgz. See tests/data/gpu/h200_llama180m_host_bound/README.md.
set -u
OUTDIR=/tmp/mp_deep; mkdir -p "$OUTDIR"
source .maxrt/env.sh
export PYTHONPATH="$PWD:$PYTHONPATH" MAX_PROFILE_CACHE=/tmp/mpc PYTHONUNBUFFERED=1
snap() { tar czf "$OUT/deep_dive.tgz" -C "$OUTDIR" . 2>/dev/null; echo "== $(date +%T) $1 rc=$2"; }
python3 -m max_profile make-model /tmp/small --dtype bfloat16 --hidden 2048 --layers 4 --heads 16 --kv-heads 4 --intermediate 5632 > /dev/null
t0=$(date +%s); python3 -m max_profile -q run --model-path /tmp/small --devices gpu --max-new-tokens 2 --kernels off > "$OUTDIR/warm.out" 2>&1; rc=$?
echo "warm (compile): $(( $(date +%s) - t0 ))s rc=$rc" | tee -a "$OUTDIR/times.txt"; snap warm $rc
t0=$(date +%s); python3 -m max_profile kernel mha_depth128_bfloat16_bfloat16_nqh16_nkvh4 --model-path /tmp/small --launches 2 --launch-skip 16 \
  --output-dir "$OUTDIR/mha" --json "$OUTDIR/mha_report.json" > "$OUTDIR/mha.out" 2> "$OUTDIR/mha.err"; rc=$?
echo "kernel mha: $(( $(date +%s) - t0 ))s rc=$rc" | tee -a "$OUTDIR/times.txt"; tail -3 "$OUTDIR/mha.err"; snap mha $rc
t0=$(date +%s); python3 -m max_profile kernel no_such_kernel_xyz --model-path /tmp/small --launches 1 > "$OUTDIR/miss.out" 2> "$OUTDIR/miss.err"; rc=$?
echo "kernel miss: $(( $(date +%s) - t0 ))s rc=$rc" | tee -a "$OUTDIR/times.txt"; tail -2 "$OUTDIR/miss.err"; snap miss $rc
