#!/usr/bin/env bash
# End-to-end test of `sala serve` on a tiny random checkpoint, loopback only. Needs curl, jq,
# python3 (stdlib) and node/npm (the official `openai` client; installed by `npm ci` if missing).
# Every wait is bounded; every server is killed on exit.
set -euo pipefail
: "${SALA:?path of the sala binary}" "${SALA_ROOT:?repository root}"

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.log; do [[ -f $f ]] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
ok() { echo "ok: $*"; }
for tool in curl jq python3 node npm; do command -v $tool >/dev/null || fail "$tool is required"; done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
CLIENT="python3 $SALA_ROOT/tests/server/load_client.py"

MODEL=$WORK/tiny
"$SALA" init "$MODEL" --preset tiny --seed 1 >/dev/null

# start_server NAME ARGS...: sets URL_<NAME>, PID_<NAME>; does not wait for the model. Serves
# $MODEL unless ARGS name a --model; the URL uses the --host of ARGS (default 127.0.0.1).
start_server() {
  local name=$1; shift
  local port; port=$(free_port)
  local host=127.0.0.1 args=("$@") margs=(--model "$MODEL") i
  for ((i = 0; i < ${#args[@]}; i++)); do
    [[ ${args[i]} == --host ]] && host=${args[i + 1]}
    [[ ${args[i]} == --model ]] && margs=()
  done
  "$SALA" serve "${margs[@]}" --port "$port" --backend cpu "$@" >"$WORK/$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  printf -v "URL_$name" 'http://%s:%s' "$host" "$port"
  printf -v "PID_$name" '%s' "$pid"
  # Bounded wait for the socket (any HTTP answer).
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://$host:$port/health" && return 0
    kill -0 "$pid" 2>/dev/null || fail "server $name exited early"
    sleep 0.1
  done
  fail "server $name did not listen"
}
wait_ready() {  # URL
  for _ in $(seq 300); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "$1/health") == 200 ]] && return 0
    sleep 0.1
  done
  fail "$1 never became healthy"
}
# req METHOD URL BODY [curl args...]: prints the status; the body lands in $WORK/body.
req() {
  local method=$1 url=$2 body=$3; shift 3
  local args=(-s -o "$WORK/body" -w '%{http_code}' -X "$method" "$@")
  [[ -n $body ]] && args+=(-H 'Content-Type: application/json' --data-binary "$body")
  curl "${args[@]}" "$url"
}
# expect STATUS TYPE METHOD URL BODY [curl args...]: an OpenAI error object of that status and type.
expect_error() {
  local status=$1 type=$2; shift 2
  local code; code=$(req "$@")
  [[ $code == "$status" ]] || fail "$2 $3 $4: status $code, expected $status: $(head -c 300 "$WORK/body")"
  jq -e --arg t "$type" '.error.type == $t and (.error.message | type) == "string" and has("error") and (.error | has("param") and has("code"))' \
    "$WORK/body" >/dev/null || fail "$2 $3 $4: error object $(cat "$WORK/body"), expected type $type"
}
metric() {  # URL NAME-WITH-LABELS -> value (0 if absent)
  curl -s "$1/metrics" | awk -v k="$2" '$1 == k {print $2; f=1} END {if (!f) print 0}'
}

# --- Main server: loading state first ------------------------------------------------------------
start_server main --deterministic --max-running 32 --ctx-size 512 --cors-origin http://example.com --debug-load-delay-ms 2500
U=$URL_main
code=$(req GET "$U/health" "")
[[ $code == 503 ]] && jq -e '.status == "loading"' "$WORK/body" >/dev/null || fail "health while loading: $code $(cat "$WORK/body")"
expect_error 503 unavailable_error POST "$U/v1/completions" '{"prompt":"hi","max_tokens":2}'
ok "503 loading while the model loads"
wait_ready "$U"
[[ $(req GET "$U/health" "") == 200 ]] && jq -e '.status == "ok"' "$WORK/body" >/dev/null || fail "health ready"
ok "/health 200 once loaded"

# --- Non-streaming chat and completions -----------------------------------------------------------
code=$(req POST "$U/v1/chat/completions" '{"model":"tiny","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0}')
[[ $code == 200 ]] || fail "chat: $code $(cat "$WORK/body")"
jq -e '.object == "chat.completion" and (.id | startswith("chatcmpl-")) and (.created | type) == "number" and .model == "tiny"
  and (.choices | length) == 1 and .choices[0].index == 0 and .choices[0].message.role == "assistant"
  and (.choices[0].message.content | type) == "string" and (.choices[0].finish_reason | IN("stop", "length"))
  and .usage.prompt_tokens > 0 and .usage.completion_tokens <= 8
  and .usage.total_tokens == .usage.prompt_tokens + .usage.completion_tokens' "$WORK/body" >/dev/null ||
  fail "chat body: $(cat "$WORK/body")"
ok "chat completion"

code=$(req POST "$U/v1/completions" '{"prompt":"Once upon a time","max_tokens":6,"temperature":0,"ignore_eos":true}')
[[ $code == 200 ]] || fail "completions: $code"
jq -e '.object == "text_completion" and (.id | startswith("cmpl-")) and (.choices[0].text | type) == "string"
  and .choices[0].finish_reason == "length" and .usage.completion_tokens == 6' "$WORK/body" >/dev/null ||
  fail "completions body: $(cat "$WORK/body")"
GREEDY=$(jq -c '.choices[0].text' "$WORK/body")  # as JSON: keeps trailing newlines
ok "text completion, finish_reason length at max_tokens"

# max_completion_tokens wins over max_tokens; token-id prompts work.
code=$(req POST "$U/v1/completions" '{"prompt":[1,300,301,302],"max_tokens":9,"max_completion_tokens":3,"temperature":0,"ignore_eos":true}')
[[ $code == 200 ]] && jq -e '.usage.completion_tokens == 3 and .usage.prompt_tokens == 4' "$WORK/body" >/dev/null ||
  fail "max_completion_tokens / token prompt: $(cat "$WORK/body")"
ok "max_completion_tokens and token-id prompts"

# --- Streaming: SSE framing checked line by line ---------------------------------------------------
check_sse() {  # FILE OBJECT INCLUDE_USAGE
  local f=$1 obj=$2 usage=$3
  awk 'NR % 2 == 1 && !/^data: / {print "line " NR ": " $0; exit 1} NR % 2 == 0 && $0 != "" {print "line " NR " not blank"; exit 1}' "$f" ||
    fail "SSE framing in $f"
  [[ $(grep -c '' "$f") -ge 4 ]] || fail "SSE too short: $(cat "$f")"
  [[ $(tail -n 2 "$f" | head -n 1) == "data: [DONE]" ]] || fail "SSE does not end with [DONE]: $(tail -n 3 "$f")"
  [[ $(grep -c '^data: \[DONE\]$' "$f") == 1 ]] || fail "several [DONE]"
  grep '^data: ' "$f" | grep -v '^data: \[DONE\]$' | sed 's/^data: //' >"$f.json"
  jq -s -e --arg o "$obj" --argjson u "$usage" '
    (map(.object == $o) | all) and (map(.id) | unique | length) == 1
    and (map(select(.choices | length > 0) | .choices[0].finish_reason | select(. != null)) | length) == 1
    and (if $u then (.[-1].choices == [] and .[-1].usage.total_tokens == .[-1].usage.prompt_tokens + .[-1].usage.completion_tokens
                     and (.[:-1] | map(has("usage") and .usage == null) | all))
         else (map(has("usage") | not) | all) end)' "$f.json" >/dev/null || fail "SSE chunks: $(cat "$f.json")"
}
curl -sN -H 'Content-Type: application/json' "$U/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' >"$WORK/chat.sse"
check_sse "$WORK/chat.sse" chat.completion.chunk true
jq -s -e '.[0].choices[0].delta.role == "assistant" and (.[1:-1] | map(.choices[0].delta | has("role") | not) | all)' "$WORK/chat.sse.json" >/dev/null ||
  fail "role chunk first"
ok "streamed chat: framing, role first, one finish_reason, usage chunk last, [DONE]"

curl -sN -H 'Content-Type: application/json' "$U/v1/completions" \
  -d '{"prompt":"Once upon a time","max_tokens":6,"temperature":0,"ignore_eos":true,"stream":true}' >"$WORK/comp.sse"
check_sse "$WORK/comp.sse" text_completion false
[[ $(jq -s -c 'map(.choices[0].text) | add' "$WORK/comp.sse.json") == "$GREEDY" ]] || fail "streamed text differs from non-streamed"
ok "streamed completion equals the non-streamed one"

# --- Sampling controls ----------------------------------------------------------------------------
body='{"prompt":"Hello","max_tokens":12,"temperature":1.0,"top_p":0.9,"top_k":40,"min_p":0.01,"seed":42,"presence_penalty":0.5,"frequency_penalty":0.5,"ignore_eos":true}'
req POST "$U/v1/completions" "$body" >/dev/null; A=$(jq -r '.choices[0].text' "$WORK/body")
req POST "$U/v1/completions" "$body" >/dev/null; B=$(jq -r '.choices[0].text' "$WORK/body")
[[ "$A" == "$B" ]] || fail "same seed, different text"
ok "seeded sampling is reproducible"

# Stop strings: cut a greedy text at a piece of it (python compares, so no byte is lost to the shell).
req POST "$U/v1/completions" '{"prompt":"The sea","max_tokens":24,"temperature":0,"ignore_eos":true}' >/dev/null
cp "$WORK/body" "$WORK/full.json"
STOP=$(python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["choices"][0]["text"]; assert len(t) >= 8, t; print(json.dumps(t[len(t)//2:len(t)//2+2]))' "$WORK/full.json") ||
  fail "greedy text too short for the stop test"
for stop in "$STOP" "[\"zzzz\", $STOP]"; do
  code=$(req POST "$U/v1/completions" "{\"prompt\":\"The sea\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true,\"stop\":$stop}")
  [[ $code == 200 ]] || fail "stop: $code $(cat "$WORK/body")"
  python3 - "$WORK/full.json" "$WORK/body" "$STOP" <<'PY' || fail "stop $stop: $(cat "$WORK/body")"
import json, sys
full = json.load(open(sys.argv[1]))["choices"][0]["text"]
got = json.load(open(sys.argv[2]))["choices"][0]
stop = json.loads(sys.argv[3])
assert got["finish_reason"] == "stop", got
assert got["text"] == full[:full.index(stop)], (got["text"], full, stop)
PY
done
ok "stop (string and array) cuts the text, finish_reason stop"

code=$(req POST "$U/v1/chat/completions" '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"temperature":0,"logprobs":true,"top_logprobs":3,"ignore_eos":true}')
jq -e '(.choices[0].logprobs.content | length) == 4 and (.choices[0].logprobs.content | map((.top_logprobs | length) == 3 and .logprob <= 0 and (.bytes | type) == "array") | all)' \
  "$WORK/body" >/dev/null || fail "chat logprobs: $(cat "$WORK/body")"
code=$(req POST "$U/v1/completions" '{"prompt":"Hi","max_tokens":4,"temperature":0,"logprobs":2,"ignore_eos":true}')
jq -e '.choices[0].logprobs | (.tokens | length) == 4 and (.token_logprobs | length) == 4 and (.top_logprobs | map(length == 2) | all) and (.text_offset | length) == 4' \
  "$WORK/body" >/dev/null || fail "completion logprobs: $(cat "$WORK/body")"
ok "logprobs / top_logprobs in both formats"

# Each per-request sampling field reaches the sampler. Greedy: presence_penalty and
# frequency_penalty (the prompt and the answer are the history) change the answer. Sampled with a
# fixed seed: the answer differs from the greedy one, unless top_p keeps only the nucleus of one
# token or min_p = 1 keeps only the most likely one.
completion_text() {  # BODY -> the answer as JSON (every byte kept)
  [[ $(req POST "$U/v1/completions" "$1") == 200 ]] || fail "completion $1: $(cat "$WORK/body")"
  jq -c '.choices[0].text' "$WORK/body"
}
SEA='"prompt":"The sea","max_tokens":40,"ignore_eos":true'
G40=$(completion_text "{$SEA,\"temperature\":0}")
[[ $(completion_text "{$SEA,\"temperature\":0}") == "$G40" ]] || fail "greedy is not reproducible"
[[ $(completion_text "{$SEA,\"temperature\":0,\"frequency_penalty\":2}") != "$G40" ]] || fail "frequency_penalty ignored"
[[ $(completion_text "{$SEA,\"temperature\":0,\"presence_penalty\":2}") != "$G40" ]] || fail "presence_penalty ignored"
[[ $(completion_text "{$SEA,\"temperature\":0,\"repetition_penalty\":3}") != "$G40" ]] || fail "repetition_penalty ignored"
[[ $(completion_text "{$SEA,\"temperature\":1,\"seed\":3}") != "$G40" ]] || fail "seeded sampling gave the greedy answer"
[[ $(completion_text "{$SEA,\"temperature\":1,\"seed\":3,\"top_p\":0.000001}") == "$G40" ]] || fail "top_p ignored"
[[ $(completion_text "{$SEA,\"temperature\":1,\"seed\":3,\"min_p\":1}") == "$G40" ]] || fail "min_p ignored"
[[ $(completion_text "{$SEA,\"temperature\":1,\"seed\":3,\"top_k\":1}") == "$G40" ]] || fail "top_k ignored"
# The server default temperature is 1: two unseeded requests differ.
[[ $(completion_text "{$SEA}") != $(completion_text "{$SEA}") ]] || fail "default temperature: two unseeded answers are equal"
ok "top_p, min_p, top_k, presence/frequency/repetition penalties reach the sampler"

# --- Errors ---------------------------------------------------------------------------------------
expect_error 400 invalid_request_error POST "$U/v1/chat/completions" '{"messages": [}'
expect_error 400 invalid_request_error POST "$U/v1/chat/completions" '[1,2]'
expect_error 400 invalid_request_error POST "$U/v1/chat/completions" '{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}'
[[ $(jq -r .error.param "$WORK/body") == temperature ]] || fail "param not named: $(cat "$WORK/body")"
expect_error 400 invalid_request_error POST "$U/v1/chat/completions" '{"messages":[{"role":"user","content":"x"}],"max_tokens":"5"}'
[[ $(jq -r .error.param "$WORK/body") == max_tokens ]] || fail "param max_tokens"
expect_error 400 invalid_request_error POST "$U/v1/chat/completions" '{"messages":"hello"}'
[[ $(jq -r .error.param "$WORK/body") == messages ]] || fail "param messages"
expect_error 400 invalid_request_error POST "$U/v1/chat/completions" '{"messages":[{"role":"wizard","content":"x"}]}'
expect_error 400 invalid_request_error POST "$U/v1/chat/completions" '{}'
expect_error 400 invalid_request_error POST "$U/v1/chat/completions" '{"messages":[{"role":"user","content":"x"}],"n":2}'
[[ $(jq -r .error.param "$WORK/body") == n ]] || fail "param n"
expect_error 400 invalid_request_error POST "$U/v1/chat/completions" '{"messages":[{"role":"user","content":"x"}],"temperature":5}'
expect_error 400 invalid_request_error POST "$U/v1/chat/completions" '{"messages":[{"role":"user","content":"x"}],"stop":[1]}'
expect_error 400 invalid_request_error POST "$U/v1/chat/completions" '{"messages":[{"role":"user","content":"x"}],"reasoning_format":"bogus"}'
[[ $(jq -r .error.param "$WORK/body") == reasoning_format ]] || fail "param reasoning_format"
expect_error 400 invalid_request_error POST "$U/v1/completions" '{"prompt":["a","b"]}'
expect_error 400 invalid_request_error POST "$U/v1/completions" '{"prompt":[99999]}'
expect_error 404 not_found_error POST "$U/v1/chat/completions" '{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}'
[[ $(jq -r .error.code "$WORK/body") == model_not_found ]] || fail "code model_not_found"
LONG=$(python3 -c 'print("hello " * 700)')
expect_error 400 invalid_request_error POST "$U/v1/completions" "{\"prompt\":\"$LONG\",\"max_tokens\":4}"
[[ $(jq -r .error.code "$WORK/body") == context_length_exceeded ]] || fail "code context_length_exceeded: $(cat "$WORK/body")"
expect_error 400 invalid_request_error POST "$U/v1/chat/completions" "{\"messages\":[{\"role\":\"user\",\"content\":\"$LONG\"}]}"
expect_error 404 not_found_error GET "$U/v1/nothing" ""
expect_error 405 invalid_request_error GET "$U/v1/chat/completions" ""
ok "error objects: malformed JSON, wrong types (param named), ranges, n, unknown model, long prompt, 404/405"

# --- Tokenize / detokenize, models, CORS, metrics ---------------------------------------------------
[[ $(req POST "$U/tokenize" '{"content":"hello world"}') == 200 ]] || fail tokenize
TOKS=$(jq -c .tokens "$WORK/body")
jq -e '.tokens | length > 0 and all(type == "number")' "$WORK/body" >/dev/null || fail "tokens: $(cat "$WORK/body")"
[[ $(req POST "$U/detokenize" "{\"tokens\":$TOKS}") == 200 && $(jq -r .content "$WORK/body") == "hello world" ]] ||
  fail "detokenize: $(cat "$WORK/body")"
expect_error 400 invalid_request_error POST "$U/detokenize" '{"tokens":[123456789]}'
expect_error 400 invalid_request_error POST "$U/tokenize" '{"content":5}'
ok "tokenize / detokenize round trip"

[[ $(req GET "$U/v1/models" "") == 200 ]] || fail models
jq -e --arg p "$MODEL" '.object == "list" and .data[0].object == "model" and .data[0].path == $p and .data[0].loaded == true
  and .data[0].size_bytes > 0 and .data[0].dtype == "bfloat16" and .data[0].context_length > 0 and .data[0].max_context == 512' \
  "$WORK/body" >/dev/null || fail "models: $(cat "$WORK/body")"
ok "/v1/models with path, size, dtype, context"

curl -s -D "$WORK/h" -o /dev/null -X OPTIONS -H 'Origin: http://example.com' -H 'Access-Control-Request-Method: POST' "$U/v1/chat/completions"
grep -qi '^HTTP/1.1 204' "$WORK/h" && grep -qi '^access-control-allow-origin: http://example.com' "$WORK/h" &&
  grep -qi '^access-control-allow-headers:.*authorization' "$WORK/h" || fail "CORS preflight: $(cat "$WORK/h")"
curl -s -D "$WORK/h" -o /dev/null "$U/health"
grep -qi '^access-control-allow-origin: http://example.com' "$WORK/h" || fail "CORS header"
ok "CORS preflight and headers"

curl -s "$U/metrics" >"$WORK/metrics"
for m in 'sala_requests_total{endpoint="chat",status="200"}' 'sala_requests_total{endpoint="chat",status="400"}' \
  'sala_requests_total{endpoint="chat",status="404"}' sala_prompt_tokens_total sala_generation_tokens_total \
  sala_requests_waiting sala_requests_running sala_cache_usage_ratio 'sala_time_to_first_token_seconds_count' \
  'sala_request_latency_seconds_bucket{le="+Inf"}' 'sala_request_finish_total{reason="length"}'; do
  grep -qF "$m " "$WORK/metrics" || fail "metric $m missing"
done
[[ $(metric "$U" sala_generation_tokens_total) -gt 0 ]] || fail "no generated tokens counted"
ok "/metrics (Prometheus text)"

# --- Batching: 32 concurrent greedy requests == each alone; bounded load; RSS stable ---------------
$CLIENT "$U" consistency 32 || fail "batched outputs differ"
rss() { awk '/^VmRSS/ {print $2}' "/proc/$PID_main/status"; }
$CLIENT "$U" load 64 10 || fail "load round 1"
R1=$(rss)
$CLIENT "$U" load 64 10 || fail "load round 2"
R2=$(rss)
echo "VmRSS after round 1: $R1 kB, after round 2: $R2 kB"
(( R2 - R1 < 2048 )) || fail "RSS grew by $((R2 - R1)) kB over an identical round"
[[ $(metric "$U" sala_requests_running) == 0 && $(metric "$U" sala_requests_waiting) == 0 && $(metric "$U" sala_cache_tokens_used) == 0 ]] ||
  fail "work left after the load"
ok "load test without errors or RSS growth"

# --- Real client: the official openai npm package ----------------------------------------------------
if [[ ! -d $SALA_ROOT/tests/server/node_modules/openai ]]; then
  npm ci --prefix "$SALA_ROOT/tests/server" >"$WORK/npm.log" 2>&1 || { cat "$WORK/npm.log" >&2; fail "npm ci failed: the openai client is required"; }
fi
node "$SALA_ROOT/tests/server/openai_client.mjs" "$U" "" "$MODEL" || fail "openai client"
ok "openai npm client"

# --- Speculative decoding inside continuous batching ------------------------------------------------
# Concurrent greedy requests (prompts of different lengths, chat and completions, streamed or not)
# give the same outputs as on the plain server; /metrics counts drafts, acceptances, verify steps.
for mode in self lookup; do
  start_server "spec_$mode" --deterministic --max-running 8 --ctx-size 512 --speculative "$mode" --draft-layers 2 --draft-tokens 4
  V=URL_spec_$mode; V=${!V}
  wait_ready "$V"
  $CLIENT "$U" compare "$V" 12 || fail "--speculative $mode changes greedy outputs"
  curl -s "$V/metrics" >"$WORK/metrics_$mode"
  for m in sala_speculative_verify_steps_total sala_speculative_draft_tokens_total sala_speculative_accepted_tokens_total \
    sala_speculative_emitted_tokens_total 'sala_speculative_skipped_steps_total{reason="end"}' \
    'sala_speculative_skipped_steps_total{reason="boundary"}' 'sala_speculative_skipped_steps_total{reason="budget"}' \
    'sala_speculative_skipped_steps_total{reason="no_match"}'; do
    grep -qF "$m " "$WORK/metrics_$mode" || fail "metric $m missing with --speculative $mode"
  done
  (( $(metric "$V" sala_speculative_verify_steps_total) > 0 && $(metric "$V" sala_speculative_draft_tokens_total) > 0 )) ||
    fail "--speculative $mode: no verify steps counted: $(grep speculative "$WORK/metrics_$mode")"
  (( $(metric "$V" sala_speculative_accepted_tokens_total) <= $(metric "$V" sala_speculative_draft_tokens_total) )) ||
    fail "--speculative $mode: more accepted than drafted"
  grep -q "speculative $mode K 4" "$WORK/spec_$mode.log" || fail "--speculative $mode not announced"
  # Tokens emitted by verify rounds carry logprobs and top_logprobs too (the same tokens as plain).
  LP='{"prompt":"the sea the sea the sea the","max_tokens":24,"temperature":0,"logprobs":3,"ignore_eos":true}'
  req POST "$U/v1/completions" "$LP" >/dev/null && cp "$WORK/body" "$WORK/lp_plain"
  [[ $(req POST "$V/v1/completions" "$LP") == 200 ]] || fail "--speculative $mode logprobs: $(cat "$WORK/body")"
  jq -e --slurpfile p "$WORK/lp_plain" '.choices[0].logprobs | (.tokens == $p[0].choices[0].logprobs.tokens)
    and (.token_logprobs | length) == 24 and (.top_logprobs | map(length >= 1) | all)
    and (.top_logprobs | map(keys)) == ($p[0].choices[0].logprobs.top_logprobs | map(keys))
    and ([.token_logprobs, $p[0].choices[0].logprobs.token_logprobs] | transpose | map(.[0] - .[1] | fabs < 1e-3) | all)' \
    "$WORK/body" >/dev/null || fail "--speculative $mode logprobs differ: $(cat "$WORK/body") vs $(cat "$WORK/lp_plain")"
  P=PID_spec_$mode
  kill -TERM "${!P}"
  wait "${!P}" || fail "--speculative $mode server: exit $?"
done
[[ $(metric "$U" sala_speculative_verify_steps_total) == 0 ]] || fail "the plain server counted verify steps"
ok "--speculative self|lookup: same greedy outputs as the plain server, counters in /metrics"

# --- A packed checkpoint (sala quantize) serves as the dense one does -------------------------------
"$SALA" quantize "$MODEL" "$WORK/tiny-int8" --format int8 --quiet >/dev/null
start_server quant --model "$WORK/tiny-int8" --deterministic --ctx-size 512
Q=$URL_quant
wait_ready "$Q"
[[ $(req POST "$Q/v1/completions" '{"prompt":"Once upon a time","max_tokens":6,"temperature":0,"ignore_eos":true}') == 200 ]] ||
  fail "int8 checkpoint, completion: $(cat "$WORK/body")"
jq -e '.usage.completion_tokens == 6 and (.choices[0].text | type) == "string"' "$WORK/body" >/dev/null ||
  fail "int8 checkpoint, completion body: $(cat "$WORK/body")"
[[ $(req POST "$Q/v1/chat/completions" '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"temperature":0,"ignore_eos":true,"stream":true}') == 200 ]] ||
  fail "int8 checkpoint, streamed chat"
grep -q '^data: \[DONE\]' "$WORK/body" || fail "int8 checkpoint, streamed chat: no [DONE]: $(cat "$WORK/body")"
kill -TERM "$PID_quant"
wait "$PID_quant" || fail "int8 checkpoint server: exit $?"
ok "an int8 checkpoint from sala quantize serves completions and streamed chat"

# --- Server-wide defaults (--temperature, --max-tokens) and --host ----------------------------------
# --temperature 0: unseeded requests that give no temperature are greedy (the main server's
# temperature-0 answer); --max-tokens 5: requests without max_tokens end with "length" at 5 tokens.
start_server defaults --host 127.0.0.1 --deterministic --ctx-size 512 --temperature 0 --max-tokens 5
D=$URL_defaults
wait_ready "$D"
grep -q "listening on http://127.0.0.1:" "$WORK/defaults.log" || fail "--host 127.0.0.1 not announced"
[[ $(req POST "$D/v1/completions" '{"prompt":"Once upon a time","ignore_eos":true}') == 200 ]] || fail "defaults: $(cat "$WORK/body")"
jq -e '.usage.completion_tokens == 5 and .choices[0].finish_reason == "length"' "$WORK/body" >/dev/null ||
  fail "--max-tokens 5: $(cat "$WORK/body")"
[[ $(req POST "$D/v1/chat/completions" '{"messages":[{"role":"user","content":"Hi"}],"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}') == 200 ]] ||
  fail "defaults chat"
grep '^data: {' "$WORK/body" | sed 's/^data: //' | jq -s -e '.[-1].usage.completion_tokens == 5
  and (map(select(.choices | length > 0) | .choices[0].finish_reason | select(. != null)) == ["length"])' >/dev/null ||
  fail "--max-tokens 5 (streamed chat): $(cat "$WORK/body")"
[[ $(req POST "$D/v1/completions" '{"prompt":"Once upon a time","ignore_eos":true,"max_tokens":7}') == 200 ]] &&
  jq -e '.usage.completion_tokens == 7' "$WORK/body" >/dev/null || fail "max_tokens of the request: $(cat "$WORK/body")"
ok "--max-tokens: the default when a request gives none"
FULL=$(jq -c '.choices[0].text' "$WORK/full.json")  # the main server's greedy answer to "The sea"
for _ in 1 2; do
  [[ $(req POST "$D/v1/completions" '{"prompt":"The sea","max_tokens":24,"ignore_eos":true}') == 200 ]] || fail "defaults: $(cat "$WORK/body")"
  A=$(jq -c '.choices[0].text' "$WORK/body")
  [[ $A == "$FULL" ]] || fail "--temperature 0: unseeded answer $A, greedy $FULL"
done
[[ $(req POST "$D/v1/completions" '{"prompt":"The sea","max_tokens":24,"ignore_eos":true,"temperature":1,"seed":3}') == 200 &&
   $(jq -c '.choices[0].text' "$WORK/body") != "$FULL" ]] || fail "a request's temperature must win over --temperature"
ok "--temperature: the default when a request gives none"
kill -TERM "$PID_defaults"
wait "$PID_defaults" || fail "defaults server exit $?"

# --host: a server on another loopback address answers there and not on 127.0.0.1.
if python3 -c 'import socket; socket.socket().bind(("127.0.0.2", 0))' 2>/dev/null; then
  start_server host2 --host 127.0.0.2 --ctx-size 64
  H=$URL_host2
  [[ $H == http://127.0.0.2:* ]] || fail "host2 URL $H"
  wait_ready "$H"
  grep -q "listening on http://127.0.0.2:" "$WORK/host2.log" || fail "--host 127.0.0.2 not announced"
  if curl -s -m 2 -o /dev/null "http://127.0.0.1:${H##*:}/health"; then fail "--host 127.0.0.2 also answers on 127.0.0.1"; fi
  kill -TERM "$PID_host2"
  wait "$PID_host2" || fail "host2 server exit $?"
  ok "--host 127.0.0.2: listens there only"
else
  echo "note: 127.0.0.2 cannot be bound here; --host checked with 127.0.0.1 only"
fi

# --- Reasoning over HTTP: <think> split into reasoning_content, --no-think hides it ----------------
# --debug-script (tests only) replaces every answer's tokens by those of a fixed text, so the
# model "says" a think block; it goes through the worker's text stream and the HTTP formatting.
SCRIPT='<think>I ponder.</think>The answer.'
start_server think --ctx-size 256 --debug-script "$SCRIPT"
start_server nothink --ctx-size 256 --no-think --debug-script "$SCRIPT"
wait_ready "$URL_think"
wait_ready "$URL_nothink"
ASK='"messages":[{"role":"user","content":"Why?"}]'
# chat_msg URL EXTRA-FIELDS JQ-CHECK: a non-streamed chat whose message passes the check.
chat_msg() {
  [[ $(req POST "$1/v1/chat/completions" "{$ASK$2}") == 200 ]] || fail "chat $2: $(cat "$WORK/body")"
  jq -e ".choices[0] | .finish_reason == \"stop\" and (.message | $3)" "$WORK/body" >/dev/null ||
    fail "$1 chat {$2}: $(cat "$WORK/body"), expected $3"
}
# chat_sse URL EXTRA-FIELDS [raw]: streams a chat; sets REASONING and CONTENT (concatenated deltas,
# as JSON). Unless "raw" (the block asked for verbatim), no think marker may be streamed.
chat_sse() {
  curl -sN -H 'Content-Type: application/json' "$1/v1/chat/completions" -d "{$ASK,\"stream\":true$2}" >"$WORK/think.sse"
  check_sse "$WORK/think.sse" chat.completion.chunk false
  local j=$WORK/think.sse.json
  [[ ${3:-} == raw ]] || ! grep -q 'think>' "$j" || fail "a think marker was streamed: $(cat "$j")"
  REASONING=$(jq -s -c 'map(.choices[0].delta.reasoning_content // empty) | add // ""' "$j")
  CONTENT=$(jq -s -c 'map(.choices[0].delta.content // empty) | add // ""' "$j")
  # Reasoning deltas all come before the first answer text.
  jq -s -e '[.[] | .choices[0].delta | if has("reasoning_content") then "r" elif (.content // "") != "" then "c" else empty end]
    | join("") | test("^r*c*$")' "$j" >/dev/null || fail "reasoning after content: $(cat "$j")"
}
chat_msg "$URL_think" "" '.content == "The answer." and .reasoning_content == "I ponder."'
chat_sse "$URL_think" ""
[[ $REASONING == '"I ponder."' && $CONTENT == '"The answer."' ]] || fail "streamed split: $REASONING / $CONTENT"
chat_msg "$URL_think" ',"reasoning_format":"deepseek"' '.reasoning_content == "I ponder."'
ok "a think block comes back as reasoning_content (message and streamed deltas), apart from the content"
chat_msg "$URL_think" ',"reasoning_format":"raw"' ".content == \"$SCRIPT\" and (has(\"reasoning_content\") | not)"
chat_sse "$URL_think" ',"reasoning_format":"none"' raw
[[ $REASONING == '""' && $CONTENT == "\"$SCRIPT\"" ]] || fail "raw stream: $REASONING / $CONTENT"
for f in ',"reasoning_format":"hidden"' ',"include_reasoning":false'; do
  chat_msg "$URL_think" "$f" '.content == "The answer." and (has("reasoning_content") | not)'
  chat_sse "$URL_think" "$f"
  [[ $REASONING == '""' && $CONTENT == '"The answer."' ]] || fail "hidden stream {$f}: $REASONING / $CONTENT"
done
ok "reasoning_format raw leaves the block in the content; hidden / include_reasoning=false drop it"
# Stop strings apply to the answer: one inside the reasoning does not end it.
chat_msg "$URL_think" ',"stop":"ponder"' '.content == "The answer." and .reasoning_content == "I ponder."'
chat_msg "$URL_think" ',"stop":"answer"' '.content == "The " and .reasoning_content == "I ponder."'
ok "stop strings see the answer, not the reasoning"
# --no-think: the reasoning is never shown, whatever the request asks.
for f in '' ',"reasoning_format":"parsed"' ',"include_reasoning":true'; do
  chat_msg "$URL_nothink" "$f" '.content == "The answer." and (has("reasoning_content") | not)'
  chat_sse "$URL_nothink" "$f"
  [[ $REASONING == '""' && $CONTENT == '"The answer."' ]] || fail "--no-think stream {$f}: $REASONING / $CONTENT"
done
ok "--no-think hides the reasoning (message and stream)"
kill -TERM "$PID_think" "$PID_nothink"
wait "$PID_think" || fail "think server exit $?"
wait "$PID_nothink" || fail "nothink server exit $?"

# --- Auth, overload (429) and disconnects, on a one-sequence server -----------------------------------
start_server small --api-key s3cret --max-running 1 --max-queue 1 --ctx-size 16384 --no-think
S=$URL_small
wait_ready "$S"
AUTH=(-H 'Authorization: Bearer s3cret')
expect_error 401 authentication_error GET "$S/v1/models" ""
expect_error 401 authentication_error GET "$S/v1/models" "" -H 'Authorization: Bearer wrong'
expect_error 401 authentication_error POST "$S/v1/completions" '{"prompt":"x"}'
[[ $(req GET "$S/v1/models" "" "${AUTH[@]}") == 200 ]] || fail "valid key refused"
[[ $(req GET "$S/health" "") == 200 ]] || fail "/health needs no key"
ok "Bearer auth on /v1/*"

# Thinking off (--no-think, or per request chat_template_kwargs.enable_thinking=false): the prompt
# carries the empty <think> block, so it is longer.
CHAT='{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1'
req POST "$U/v1/chat/completions" "$CHAT}" >/dev/null; P_THINK=$(jq .usage.prompt_tokens "$WORK/body")
req POST "$U/v1/chat/completions" "$CHAT,\"chat_template_kwargs\":{\"enable_thinking\":false}}" >/dev/null; P_KW=$(jq .usage.prompt_tokens "$WORK/body")
req POST "$S/v1/chat/completions" "$CHAT}" "${AUTH[@]}" >/dev/null; P_NOTHINK=$(jq .usage.prompt_tokens "$WORK/body")
(( P_NOTHINK > P_THINK && P_KW == P_NOTHINK )) || fail "no-think prompts: $P_THINK / $P_KW / $P_NOTHINK tokens"
ok "--no-think and chat_template_kwargs.enable_thinking=false add the empty think block"

# A: a long stream holding the only sequence.
curl -sN "${AUTH[@]}" -H 'Content-Type: application/json' "$S/v1/completions" \
  -d '{"prompt":"go","max_tokens":16000,"ignore_eos":true,"stream":true}' >"$WORK/a.sse" &
CURL_A=$!
PIDS+=("$CURL_A")
for _ in $(seq 100); do [[ $(metric "$S" sala_requests_running) == 1 ]] && break; sleep 0.05; done
[[ $(metric "$S" sala_requests_running) == 1 ]] || fail "request A not running"
# B: waits for the sequence.
curl -s -o "$WORK/b.json" -w '%{http_code}' "${AUTH[@]}" -H 'Content-Type: application/json' "$S/v1/completions" \
  -d '{"prompt":"b","max_tokens":2}' >"$WORK/b.code" &
REQ_B=$!
PIDS+=("$REQ_B")
for _ in $(seq 100); do [[ $(metric "$S" sala_requests_waiting) == 1 ]] && break; sleep 0.05; done
[[ $(metric "$S" sala_requests_waiting) == 1 ]] || fail "request B not waiting"
# C: the queue is full.
expect_error 429 rate_limit_error POST "$S/v1/completions" '{"prompt":"c","max_tokens":2}' "${AUTH[@]}"
ok "429 when the waiting queue is full"
# Client A goes away: its request is cancelled, its sequence freed, and B runs.
kill "$CURL_A" 2>/dev/null || true
for _ in $(seq 100); do [[ $(metric "$S" 'sala_request_finish_total{reason="cancelled"}') == 1 ]] && break; sleep 0.05; done
[[ $(metric "$S" 'sala_request_finish_total{reason="cancelled"}') == 1 ]] || fail "disconnect did not cancel"
wait "$REQ_B" || true
[[ $(cat "$WORK/b.code") == 200 ]] || fail "B after A left: $(cat "$WORK/b.code")"
[[ $(metric "$S" sala_requests_running) == 0 && $(metric "$S" sala_cache_sequences_used) == 0 ]] || fail "caches not freed"
ok "a disconnected stream is cancelled at once and frees its sequence"

# Same for a non-streamed request whose client gives up.
curl -s -m 1 "${AUTH[@]}" -H 'Content-Type: application/json' "$S/v1/completions" \
  -d '{"prompt":"go","max_tokens":16000,"ignore_eos":true}' >/dev/null || true
for _ in $(seq 100); do [[ $(metric "$S" 'sala_request_finish_total{reason="cancelled"}') == 2 ]] && break; sleep 0.05; done
[[ $(metric "$S" 'sala_request_finish_total{reason="cancelled"}') == 2 ]] || fail "non-streamed disconnect did not cancel"
ok "a disconnected non-streamed request is cancelled too"

# --- Shutdown: SIGTERM with a stream in flight, SIGINT when idle -----------------------------------
curl -sN "${AUTH[@]}" -H 'Content-Type: application/json' "$S/v1/completions" \
  -d '{"prompt":"go","max_tokens":16000,"ignore_eos":true,"stream":true}' >"$WORK/term.sse" 2>/dev/null &
CURL_T=$!
PIDS+=("$CURL_T")
for _ in $(seq 100); do [[ $(metric "$S" sala_requests_running) == 1 ]] && break; sleep 0.05; done
kill -TERM "$PID_small"
for _ in $(seq 150); do kill -0 "$PID_small" 2>/dev/null || break; sleep 0.1; done
kill -0 "$PID_small" 2>/dev/null && fail "server still running 15 s after SIGTERM"
wait "$PID_small" && rc=0 || rc=$?
[[ $rc == 0 ]] || fail "exit code $rc after SIGTERM"
grep -q "SIGTERM received" "$WORK/small.log" || fail "no shutdown message"
wait "$CURL_T" || true
grep -q '^data: {"error":.*shutting down' "$WORK/term.sse" && [[ $(tail -n 2 "$WORK/term.sse" | head -n 1) == "data: [DONE]" ]] ||
  fail "the in-flight stream was not ended with an error event: $(tail -c 300 "$WORK/term.sse")"
kill -INT "$PID_main"
for _ in $(seq 150); do kill -0 "$PID_main" 2>/dev/null || break; sleep 0.1; done
wait "$PID_main" && rc=0 || rc=$?
[[ $rc == 0 ]] || fail "exit code $rc after SIGINT"
ok "SIGTERM ends the in-flight stream with an error event, exit 0; SIGINT exit 0"

# A model that cannot load: the server says why and exits 1.
mkdir -p "$WORK/broken"
echo '{}' >"$WORK/broken/config.json"
port=$(free_port)
timeout 60 "$SALA" serve --model "$WORK/broken" --port "$port" --backend cpu >"$WORK/broken.log" 2>&1 && rc=0 || rc=$?
[[ $rc == 1 ]] && grep -q '^error: ' "$WORK/broken.log" || fail "broken model: exit $rc: $(cat "$WORK/broken.log")"
ok "a model that fails to load: error message, exit 1"

echo "test_server: all passed"
