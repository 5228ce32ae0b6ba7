# Sourced by the H200 scripts after they set MODE: output folder, MAX runtime, nsys's libdw/libelf,
# and the step/snap helpers (each step's stdout/stderr kept, results re-packed into $OUT after each).
OUTDIR=/tmp/mp_out_$MODE
mkdir -p "$OUTDIR"
source .maxrt/env.sh
export PYTHONPATH="$PWD:$PYTHONPATH" MAX_PROFILE_CACHE=/tmp/mpc PYTHONUNBUFFERED=1
# wheels the bundle lacks (carried in .whl/: adbc-driver-sqlite, nanoarrow), after the bundle on sys.path
if ls .whl/*.whl > /dev/null 2>&1; then
  mkdir -p /tmp/extra && for w in .whl/*.whl; do python3 -m zipfile -e "$w" /tmp/extra; done
  export PYTHONPATH="$PYTHONPATH:/tmp/extra"
fi
mkdir -p /tmp/dw && for f in .gpu/debs/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH="/tmp/dw/usr/lib/x86_64-linux-gnu:/tmp/dw/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export PATH="/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64:$PATH"   # nsys
snap() { tar czf "$OUT/h200_$MODE.tgz" -C "$OUTDIR" . 2>/dev/null; echo "== $(date +%T) $1 (rc $2)"; }
step() { local name=$1; shift; local t0=$(date +%s); "$@" >"$OUTDIR/$name.out" 2>"$OUTDIR/$name.err"; local rc=$?; echo "$name: rc=$rc $(( $(date +%s) - t0 ))s" >> "$OUTDIR/steps.txt"; tail -4 "$OUTDIR/$name.err"; snap "$name" $rc; }
