#!/usr/bin/env bash
# The serving benchmark on CPU with the tiny preset: `sala serve --random tiny` (no checkpoint),
# `sala bench --serve` at several concurrencies (table + JSON), scripts/serve_bench.sh end to end,
# and clear errors. Loopback only; every wait is bounded; the servers are killed on exit.
set -euo pipefail
SALA=${SALA:?set SALA to the sala binary}
SALA_ROOT=${SALA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  [ -f "$tmp/serve.log" ] && tail -20 "$tmp/serve.log" >&2
  exit 1
}
command -v curl >/dev/null || fail "curl is required"

# serve --random: the port comes from the log ("--port 0": any free port).
$SALA serve --random tiny --backend cpu -t 2 --port 0 --max-running 4 --ctx-size 128 >"$tmp/serve.log" 2>&1 &
pid=$!
url=""
for _ in $(seq 100); do
  url=$(grep -o 'listening on http://[^ ]*' "$tmp/serve.log" | head -1 | cut -d' ' -f3 || true)
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || fail "server did not listen"
for _ in $(seq 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && break
  sleep 0.1
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] || fail "server never became healthy"
grep -q "RANDOM weights" "$tmp/serve.log" || fail "serve --random does not say the weights are random"
curl -s "$url/v1/models" >"$tmp/models.json"
/usr/bin/python3 - "$tmp/models.json" <<'PY' || fail "/v1/models of a random model: $(cat "$tmp/models.json")"
import json, sys
m = json.load(open(sys.argv[1]))["data"][0]
assert m["id"] == "random-tiny" and m["source"] == "random" and m["loaded"] is True, m
PY

$SALA bench --serve "$url" --concurrency 1,4 --requests 4 --prompt-tokens 32 --max-tokens 6 --json "$tmp/s.json" \
  >"$tmp/out" 2>"$tmp/err" || fail "bench --serve failed: $(cat "$tmp/err")"
grep -Eq "^conc +reqs +fail +out tok +wall s +out tok/s +req/s +TTFT p50 +TTFT p99 +lat p50 +lat p99" "$tmp/out" ||
  fail "table header: $(cat "$tmp/out")"
[ "$(grep -Ec '^(1|4) +4 +0 +24 ' "$tmp/out")" -eq 2 ] || fail "expected 2 levels of 4 requests x 6 tokens: $(cat "$tmp/out")"
/usr/bin/python3 - "$tmp/s.json" <<'PY' || fail "bench --serve JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["model"] == "random-tiny" and d["prompt_tokens"] == 32 and d["max_tokens"] == 6, d
assert [l["concurrency"] for l in d["levels"]] == [1, 4]
for l in d["levels"]:
    assert l["requests"] == 4 and l["failed"] == 0 and l["output_tokens"] == 24, l
    assert l["wall_s"] > 0 and l["output_tok_s"] > 0 and l["requests_per_s"] > 0, l
    for k in ("ttft_s", "latency_s", "decode_tok_s_per_request"):
        s = l[k]
        assert s["n"] == 4 and 0 < s["p50"] <= s["p99"] <= s["max"], (k, s)
    assert l["ttft_s"]["p50"] <= l["latency_s"]["p50"], l
PY
# Requests the server refuses (prompt longer than the context) are failures, named, exit 1.
if $SALA bench --serve "$url" --concurrency 1 --requests 1 --prompt-tokens 200 --max-tokens 2 --warmup 0 \
  >/dev/null 2>"$tmp/e1"; then fail "failed requests gave exit 0"; fi
grep -q "1 requests failed; first: HTTP 400" "$tmp/e1" || fail "failure message: $(cat "$tmp/e1")"
grep -q "context_length_exceeded" "$tmp/e1" || fail "failure message lacks the server's reason: $(cat "$tmp/e1")"
kill -TERM "$pid"
wait "$pid" || fail "serve did not exit 0 on SIGTERM"
[ ! -e "${TMPDIR:-/tmp}/sala-random-tiny-$pid" ] || fail "serve --random left its directory behind"
pid=""

# Usage errors.
if $SALA bench --serve "https://127.0.0.1:1" >/dev/null 2>"$tmp/e2"; then fail "https accepted"; fi
grep -q "https is not supported" "$tmp/e2" || fail "https message: $(cat "$tmp/e2")"
if $SALA bench --serve "http://127.0.0.1:1" >/dev/null 2>"$tmp/e3"; then fail "dead server accepted"; fi
grep -q "cannot connect to 127.0.0.1:1" "$tmp/e3" || fail "connect message: $(cat "$tmp/e3")"
if $SALA bench --serve "http://127.0.0.1:1" --random tiny >/dev/null 2>"$tmp/e4"; then fail "--serve with --random"; fi
grep -q "give no MODEL, --random" "$tmp/e4" || fail "--serve/--random message: $(cat "$tmp/e4")"
if $SALA serve --port 0 >/dev/null 2>"$tmp/e5"; then fail "serve without a model accepted"; fi
grep -q -- "--model MODEL or --random PRESET" "$tmp/e5" || fail "serve usage message: $(cat "$tmp/e5")"
if $SALA serve --model x --random tiny >/dev/null 2>"$tmp/e6"; then fail "serve with --model and --random"; fi

# The script: server up, bench at three concurrencies, JSON under $OUT, server stopped.
SALA=$SALA OUT=$tmp/sb bash "$SALA_ROOT/scripts/serve_bench.sh" --preset tiny --backend cpu -t 2 --concurrency 1,2,4 \
  --requests 4 --prompt-tokens 16 --max-tokens 4 >"$tmp/sb.out" 2>&1 || fail "serve_bench.sh: $(cat "$tmp/sb.out")"
/usr/bin/python3 - "$tmp/sb/serve-bench.json" <<'PY' || fail "serve_bench.sh JSON: $(cat "$tmp/sb.out")"
import json, sys
d = json.load(open(sys.argv[1]))
assert [l["concurrency"] for l in d["levels"]] == [1, 2, 4] and all(l["failed"] == 0 for l in d["levels"]), d
PY
grep -q "SIGTERM received" "$tmp/sb/serve.log" || fail "serve_bench.sh did not stop the server: $(cat "$tmp/sb/serve.log")"
echo "bench_serve: ok"
