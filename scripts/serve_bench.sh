#!/usr/bin/env bash
# Serving benchmark (issue #7): starts `sala serve --random PRESET` (random weights generated on the
# backend, no checkpoint on disk) on a free port, waits for /health 200, runs
# `sala bench --serve` at each concurrency, writes $OUT/serve-bench.json (+ .txt and serve.log),
# stops the server and prints the table. Run from the repository root:
#   OUT=out scripts/serve_bench.sh                                  # 9b on CUDA, concurrency 1,8,32
#   scripts/serve_bench.sh --preset tiny --backend cpu --prompt-tokens 64 --max-tokens 8   (CPU check)
# Environment: SALA (binary; default build/sala), OUT (default ./out), SALA_SERVE_WAIT (seconds for the
# model to load; default 900), SALA_SERVE_ARGS (more `sala serve` flags, e.g. "--prefill-chunk 512").
# Exit status: non-zero if the server or any request failed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SALA=${SALA:-$ROOT/build/sala}
OUT=${OUT:-$(pwd)/out}
WAIT=${SALA_SERVE_WAIT:-900}
preset=9b backend=cuda concurrency=1,8,32 requests=0 prompt=1024 max_tokens=128 threads=0
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while (($#)); do
  case $1 in
    --preset) preset=$2 ;;
    --backend) backend=$2 ;;
    --concurrency) concurrency=$2 ;;
    --requests) requests=$2 ;;
    --prompt-tokens) prompt=$2 ;;
    --max-tokens) max_tokens=$2 ;;
    -t | --threads) threads=$2 ;;
    -h | --help) usage ;;
    *) echo "serve_bench.sh: unknown argument '$1'" >&2; usage ;;
  esac
  shift 2
done
[ -x "$SALA" ] || { echo "serve_bench.sh: no sala binary at '$SALA' (build it or set SALA)" >&2; exit 1; }
command -v curl >/dev/null || { echo "serve_bench.sh: curl is required" >&2; exit 1; }
mkdir -p "$OUT"

# Every sequence the clients can hold at once, each with room for its prompt and answer.
max_running=$(tr ',' '\n' <<<"$concurrency" | sort -n | tail -1)
ctx=$((prompt + max_tokens + 16))
log=$OUT/serve.log
# shellcheck disable=SC2086  # SALA_SERVE_ARGS is a list of flags
"$SALA" serve --random "$preset" --backend "$backend" -t "$threads" --port 0 --max-running "$max_running" \
  --ctx-size "$ctx" ${SALA_SERVE_ARGS:-} >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT

# The port is in the server's first line ("listening on http://HOST:PORT").
url=""
for _ in $(seq 300); do
  url=$(grep -o 'listening on http://[^ ]*' "$log" | head -1 | cut -d' ' -f3 || true)
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "serve_bench.sh: the server exited:" >&2; cat "$log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "serve_bench.sh: the server did not listen within 30 s" >&2; cat "$log" >&2; exit 1; }
t0=$SECONDS
until [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ]; do
  kill -0 "$pid" 2>/dev/null || { echo "serve_bench.sh: the server exited while loading:" >&2; cat "$log" >&2; exit 1; }
  ((SECONDS - t0 < WAIT)) || { echo "serve_bench.sh: $url/health not 200 after $WAIT s" >&2; exit 1; }
  sleep 0.5
done
echo "serve_bench.sh: $preset on $backend at $url ready after $((SECONDS - t0)) s; max-running $max_running, ctx $ctx"

rc=0
"$SALA" bench --serve "$url" --concurrency "$concurrency" --requests "$requests" --prompt-tokens "$prompt" \
  --max-tokens "$max_tokens" --json "$OUT/serve-bench.json" | tee "$OUT/serve-bench.txt" || rc=$?

kill -TERM "$pid"
wait "$pid" || { echo "serve_bench.sh: the server exited with status $? (log: $log)" >&2; rc=1; }
trap - EXIT
echo "serve_bench.sh: wrote $OUT/serve-bench.json, $OUT/serve-bench.txt, $log"
exit "$rc"
