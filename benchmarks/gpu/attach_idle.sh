#!/usr/bin/env bash
# attach_idle.sh MODEL OUT_PREFIX: a `max serve` left idle, then `max-profile attach --probe` on it (3 probe requests in a
# 10 s window and nothing else): the report (OUT_PREFIX.json, _raw.json.gz, .txt) must say lightly loaded, not host-bound.
# The server is started here in its own process group and stopped by it.
set -u
MODEL=$1 OUT=$2
PORT=8123 METRICS=8124
MAX_SERVE_METRICS_ENDPOINT_PORT=$METRICS OTEL_SDK_DISABLED=true setsid max serve --model-path "$MODEL" --devices gpu --host 127.0.0.1 --port $PORT --max-batch-size 64 \
  > "$OUT.server.log" 2>&1 &
PGID=$!
trap 'kill -TERM -- -$PGID 2>/dev/null; sleep 5; kill -KILL -- -$PGID 2>/dev/null' EXIT
for _ in $(seq 1 600); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" > /dev/null 2>&1 && break
  kill -0 $PGID 2>/dev/null || { echo "max serve died: $(tail -3 "$OUT.server.log")" >&2; exit 4; }
  sleep 1
done
sleep 3  # idle, as a server between users is
python3 -m max_profile attach "http://127.0.0.1:$PORT" --metrics-url "http://127.0.0.1:$METRICS/metrics" --probe --duration 10 \
  --json "$OUT.json" --raw "${OUT}_raw.json.gz" --text "$OUT.txt"
