#!/usr/bin/env bash
# Model management: id resolution (path, models directory, Hugging Face cache), `sala models
# list|download|rm` against a mock hub (tests/server/mock_hub.py: dropped connection -> resume,
# wrong checksum -> nothing installed, 401/404 -> clear messages), and the server's model
# endpoints. Loopback only; every wait bounded; servers killed on exit.
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
for tool in curl jq python3; do command -v $tool >/dev/null || fail "$tool is required"; done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

"$SALA" init "$WORK/src" --preset tiny --seed 2 >/dev/null
export SALA_MODELS_DIR=$WORK/models HF_HUB_CACHE=$WORK/hub
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN HF_HOME || true
mkdir -p "$SALA_MODELS_DIR" "$HF_HUB_CACHE"

python3 "$SALA_ROOT/tests/server/mock_hub.py" "$WORK/src" "$WORK/hub.port" "$WORK/hub.access" >"$WORK/hub.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do [[ -s $WORK/hub.port ]] && break; sleep 0.1; done
[[ -s $WORK/hub.port ]] || fail "mock hub did not start"
export HF_ENDPOINT=http://127.0.0.1:$(cat "$WORK/hub.port")

# sala_err CMD...: runs a command that must fail; its stderr lands in $WORK/err.
sala_err() { if "$SALA" "$@" >"$WORK/out" 2>"$WORK/err"; then fail "'sala $*' succeeded: $(cat "$WORK/out")"; fi; }
same_files() {  # DIR: holds exactly the source checkpoint's files, byte for byte
  for f in "$WORK"/src/*; do cmp -s "$f" "$1/$(basename "$f")" || fail "$1/$(basename "$f") differs"; done
}

# --- Download with a dropped connection: resumed with Range, verified, installed atomically --------
timeout 120 "$SALA" models download org/tiny >"$WORK/out" 2>"$WORK/err" || fail "download: $(cat "$WORK/err")"
grep -q "installed org/tiny" "$WORK/out" || fail "no install line: $(cat "$WORK/out")"
same_files "$SALA_MODELS_DIR/org/tiny"
grep -Eq '^GET /org/tiny/resolve/[0-9a-f]+/model.safetensors bytes=[1-9][0-9]*-$' "$WORK/hub.access" ||
  fail "no resumed (Range) request: $(cat "$WORK/hub.access")"
[[ ! -e $SALA_MODELS_DIR/.partial ]] || fail ".partial left behind"
jq -e '.repo == "org/tiny" and (.commit | length) == 40' "$SALA_MODELS_DIR/org/tiny/sala_download.json" >/dev/null || fail provenance
ok "download resumes a dropped file with Range, verifies sha256, installs"

# Progress on stderr: on a pipe, "N% DONE / TOTAL" lines, increasing by tens, from 0% to 100%.
python3 - "$WORK/err" <<'PY' || fail "progress lines: $(cat "$WORK/err")"
import re, sys
lines = [l for l in open(sys.argv[1]).read().splitlines() if re.match(r"^\d+% ", l)]
pat = re.compile(r"^(\d+)% ([0-9.]+ [KMGT]?B) / ([0-9.]+ [KMGT]?B)$")
assert all(pat.match(l) for l in lines), lines
pct = [int(pat.match(l).group(1)) for l in lines]
assert len(pct) >= 3 and pct[0] == 0 and pct[-1] == 100 and pct == sorted(set(pct)), pct
assert all(p % 10 == 0 for p in pct), pct
done, total = pat.match(lines[-1]).group(2, 3)
assert done == total, lines[-1]
PY
# On a terminal: one bar redrawn with \r, ending at 100% of the last file.
script -qefc "$(printf '%q ' "$SALA" models download org/tty)" /dev/null >"$WORK/tty.out" 2>&1 </dev/null ||
  fail "download on a terminal: $(cat "$WORK/tty.out")"
grep -q $'\r\[#\{30\}\] 100% .* / .*file [0-9]*/[0-9]*' "$WORK/tty.out" || fail "terminal progress bar: $(cat -A "$WORK/tty.out" | tail -c 600)"
grep -q "installed org/tty" "$WORK/tty.out" || fail "terminal download: $(cat "$WORK/tty.out")"
"$SALA" models rm org/tty >/dev/null
ok "download progress on stderr (lines on a pipe, a bar on a terminal)"

sala_err models download org/tiny
grep -q "already installed" "$WORK/err" || fail "re-download: $(cat "$WORK/err")"
ok "an installed model is not downloaded again"

# --- Failures: checksum, 404, 401 ----------------------------------------------------------------
sala_err models download org/badsum
grep -q "failed verification" "$WORK/err" || fail "bad checksum message: $(cat "$WORK/err")"
[[ ! -e $SALA_MODELS_DIR/org/badsum ]] || fail "a model with a bad checksum was installed"
ok "wrong sha256: error, nothing installed"

# A file of another size than the hub advertises (config.json: no sha256, only its size to check).
sala_err models download org/badsize
grep -q "org/badsize@main: config.json has [0-9]* bytes, the hub says [0-9]*; the file was discarded" "$WORK/err" ||
  fail "size mismatch message: $(cat "$WORK/err")"
[[ ! -e $SALA_MODELS_DIR/org/badsize ]] || fail "a model with a wrong size was installed"
! find "$SALA_MODELS_DIR/.partial" -path '*org--badsize*' -name config.json 2>/dev/null | grep -q . || fail "the wrong-size file was kept"
"$SALA" models list >"$WORK/list"
! grep -q "^org/badsize " "$WORK/list" || fail "models list shows org/badsize"
ok "size differing from the advertised one: clear error, nothing installed"

sala_err models download org/redirectbad
grep -q "failed verification" "$WORK/err" && [[ ! -e $SALA_MODELS_DIR/org/redirectbad ]] || fail "bad X-Linked-Etag: $(cat "$WORK/err")"
timeout 120 "$SALA" models download org/redirect >/dev/null 2>"$WORK/err" || fail "redirect download: $(cat "$WORK/err")"
same_files "$SALA_MODELS_DIR/org/redirect"
ok "CDN redirect with X-Linked-Etag: verified (and a wrong one rejected)"

sala_err models download missing/model
grep -q "not found on .*HTTP 404" "$WORK/err" || fail "404 message: $(cat "$WORK/err")"
sala_err models download private/tiny
grep -q "access denied (HTTP 401).*HF_TOKEN" "$WORK/err" || fail "401 message: $(cat "$WORK/err")"
HF_TOKEN=hf_test timeout 120 "$SALA" models download private/tiny >/dev/null 2>"$WORK/err" || fail "token download: $(cat "$WORK/err")"
sala_err models download "../etc"
ok "404 and 401 give clear messages; HF_TOKEN is sent"

# Revisions: org/tagged exists only at "v2" (the mock hub honours revisions).
sala_err models download org/tagged
grep -q "org/tagged@main: not found on .*(HTTP 404)" "$WORK/err" || fail "unknown revision main: $(cat "$WORK/err")"
[[ ! -e $SALA_MODELS_DIR/org/tagged ]] || fail "org/tagged installed without its revision"
sala_err models download org/tiny2 --revision v9
grep -q "org/tiny2@v9: not found on .*(HTTP 404)" "$WORK/err" || fail "revision v9: $(cat "$WORK/err")"
[[ ! -e $SALA_MODELS_DIR/org/tiny2 ]] || fail "org/tiny2 installed at an unknown revision"
timeout 120 "$SALA" models download org/tagged --revision v2 >"$WORK/out" 2>"$WORK/err" || fail "--revision v2: $(cat "$WORK/err")"
same_files "$SALA_MODELS_DIR/org/tagged"
jq -e '.revision == "v2" and .commit == "fedcba9876543210fedcba9876543210fedcba98"' "$SALA_MODELS_DIR/org/tagged/sala_download.json" >/dev/null ||
  fail "provenance of v2: $(cat "$SALA_MODELS_DIR/org/tagged/sala_download.json")"
grep -q '^GET /org/tagged/resolve/fedcba9876543210fedcba9876543210fedcba98/config.json ' "$WORK/hub.access" ||
  fail "files not fetched at the revision's commit: $(grep tagged "$WORK/hub.access")"
"$SALA" models rm org/tagged >/dev/null
ok "--revision: a repository only at v2 downloads with --revision v2 (files at its commit), not without"

# --- The Hugging Face cache layout, read-only ----------------------------------------------------
SNAP=$HF_HUB_CACHE/models--cache--tiny/snapshots/abc123
mkdir -p "$SNAP" "$HF_HUB_CACHE/models--cache--tiny/blobs" "$HF_HUB_CACHE/models--cache--tiny/refs"
for f in "$WORK"/src/*; do
  blob=$HF_HUB_CACHE/models--cache--tiny/blobs/$(sha256sum "$f" | cut -c1-64)
  cp "$f" "$blob"
  ln -s "../../blobs/$(basename "$blob")" "$SNAP/$(basename "$f")"
done
echo abc123 >"$HF_HUB_CACHE/models--cache--tiny/refs/main"

"$SALA" models list >"$WORK/list"
for id in org/tiny org/redirect private/tiny cache/tiny; do grep -q "^$id " "$WORK/list" || fail "list lacks $id: $(cat "$WORK/list")"; done
grep -q "^cache/tiny .*hf-cache" "$WORK/list" || fail "cache model source"
"$SALA" models list --json | jq -s -e 'length == 4 and (map(.size_bytes > 0 and .dtype == "bfloat16") | all)' >/dev/null || fail "list --json"
ok "models list: models directory and hub cache"

sala_err models rm cache/tiny
grep -q "only reads" "$WORK/err" || fail "rm of a cache model: $(cat "$WORK/err")"
sala_err models rm org/nothing
"$SALA" models rm org/redirect >/dev/null || fail "rm"
[[ ! -e $SALA_MODELS_DIR/org/redirect ]] || fail "rm left the directory"
ok "models rm (hub cache refused)"

# --- The server: ids resolve from the cache; model endpoints --------------------------------------
PORT=$(free_port)
"$SALA" serve --model cache/tiny --port "$PORT" --backend cpu --ctx-size 256 >"$WORK/serve.log" 2>&1 &
SERVE=$!
PIDS+=("$SERVE")
U=http://127.0.0.1:$PORT
for _ in $(seq 200); do [[ $(curl -s -o /dev/null -w '%{http_code}' "$U/health") == 200 ]] && break; sleep 0.1; done
[[ $(curl -s -o /dev/null -w '%{http_code}' "$U/health") == 200 ]] || fail "server not healthy"
curl -s "$U/v1/models" >"$WORK/models.json"
jq -e --arg snap "$SNAP" '.data[0].id == "cache/tiny" and .data[0].loaded and .data[0].source == "hf-cache" and .data[0].path == $snap
  and (.data | map(.id) | index("org/tiny") != null) and (.data | map(select(.id == "org/tiny"))[0] | .loaded == false and .size_bytes > 0 and .dtype == "bfloat16" and .context_length > 0)' \
  "$WORK/models.json" >/dev/null || fail "/v1/models: $(cat "$WORK/models.json")"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$U/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"cache/tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":3}') == 200 ]] || fail "chat on a cache model"
ok "serve --model ORG/NAME from the hub cache; /v1/models lists every local model"

[[ $(curl -s -o "$WORK/m" -w '%{http_code}' "$U/v1/models/org/tiny") == 200 ]] && jq -e '.id == "org/tiny"' "$WORK/m" >/dev/null || fail "GET model"
[[ $(curl -s -o "$WORK/m" -w '%{http_code}' "$U/v1/models/org%2Fnope") == 404 ]] && jq -e '.error.type == "not_found_error"' "$WORK/m" >/dev/null || fail "GET unknown model"
[[ $(curl -s -o "$WORK/m" -w '%{http_code}' -X DELETE "$U/v1/models/cache/tiny") == 409 ]] || fail "DELETE the served model: $(cat "$WORK/m")"

# Download through the API, then delete.
[[ $(curl -s -o "$WORK/d" -w '%{http_code}' "$U/v1/models/download" -H 'Content-Type: application/json' -d '{"model":"org/second"}') == 202 ]] ||
  fail "POST download: $(cat "$WORK/d")"
JOB=$(jq -r .id "$WORK/d")
for _ in $(seq 300); do
  curl -s "$U/v1/models/download/$JOB" >"$WORK/d"
  jq -e '.status == "done" or .status == "failed"' "$WORK/d" >/dev/null && break
  sleep 0.1
done
jq -e '.status == "done" and .files_done == .files_total and .bytes_done == .bytes_total and .bytes_total > 0' "$WORK/d" >/dev/null ||
  fail "download job: $(cat "$WORK/d")"
same_files "$SALA_MODELS_DIR/org/second"
[[ $(curl -s -o "$WORK/m" -w '%{http_code}' -X DELETE "$U/v1/models/org/second") == 200 ]] && jq -e '.deleted == true' "$WORK/m" >/dev/null ||
  fail "DELETE: $(cat "$WORK/m")"
[[ ! -e $SALA_MODELS_DIR/org/second ]] || fail "DELETE left files"
[[ $(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$U/v1/models/org/second") == 404 ]] || fail "second DELETE"

curl -s "$U/v1/models/download" -H 'Content-Type: application/json' -d '{"model":"missing/m"}' >"$WORK/d"
JOB=$(jq -r .id "$WORK/d")
for _ in $(seq 100); do
  curl -s "$U/v1/models/download/$JOB" >"$WORK/d"
  jq -e '.status == "failed"' "$WORK/d" >/dev/null && break
  sleep 0.1
done
jq -e '.status == "failed" and (.error | test("404"))' "$WORK/d" >/dev/null || fail "failed job: $(cat "$WORK/d")"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$U/v1/models/download" -H 'Content-Type: application/json' -d '{"model":5}') == 400 ]] || fail "download 400"
ok "POST /v1/models/download (async, progress), GET/DELETE /v1/models/{id}"

kill -TERM "$SERVE"
for _ in $(seq 100); do kill -0 "$SERVE" 2>/dev/null || break; sleep 0.1; done
wait "$SERVE" || fail "server exit code $?"

# A model of the models directory by id.
"$SALA" serve --model org/tiny --port "$(free_port)" --backend cpu --ctx-size 64 --debug-load-delay-ms 0 >"$WORK/serve2.log" 2>&1 &
S2=$!
PIDS+=("$S2")
for _ in $(seq 100); do grep -qs "model ready" "$WORK/serve2.log" && break; sleep 0.1; done
grep -q "model 'org/tiny' from $SALA_MODELS_DIR/org/tiny" "$WORK/serve2.log" || fail "models-dir id: $(cat "$WORK/serve2.log")"
kill -TERM "$S2"
wait "$S2" || fail "serve2 exit"
sala_err serve --model nowhere/none --port 0
grep -q "not found" "$WORK/err" || fail "unknown model message"
ok "serve resolves ids from the models directory; unknown ids fail clearly"

# --- --models-dir: wins over $SALA_MODELS_DIR, for `serve` and `models` ------------------------------
MD=$SALA_MODELS_DIR
EMPTY=$WORK/empty-models
mkdir -p "$EMPTY"
export SALA_MODELS_DIR=$EMPTY
sala_err serve --model org/tiny --port 0
grep -q "not found" "$WORK/err" || fail "org/tiny resolved without --models-dir: $(cat "$WORK/err")"
PORT=$(free_port)
"$SALA" serve --model org/tiny --models-dir "$MD" --port "$PORT" --backend cpu --ctx-size 64 >"$WORK/serve3.log" 2>&1 &
S3=$!
PIDS+=("$S3")
U3=http://127.0.0.1:$PORT
for _ in $(seq 200); do [[ $(curl -s -o /dev/null -w '%{http_code}' "$U3/health") == 200 ]] && break; sleep 0.1; done
grep -q "model 'org/tiny' from $MD/org/tiny" "$WORK/serve3.log" || fail "--models-dir: $(cat "$WORK/serve3.log")"
curl -s "$U3/v1/models" >"$WORK/models3.json"
jq -e '.data[0].id == "org/tiny" and .data[0].source == "models-dir" and .data[0].loaded
  and (.data | map(.id) | index("private/tiny") != null)' "$WORK/models3.json" >/dev/null ||
  fail "/v1/models with --models-dir: $(cat "$WORK/models3.json")"
kill -TERM "$S3"
wait "$S3" || fail "serve3 exit"

"$SALA" models list >"$WORK/list"
! grep -q "^org/tiny " "$WORK/list" || fail "models list without --models-dir shows org/tiny"
for form in "models --models-dir $MD list" "models list --models-dir $MD"; do
  "$SALA" $form >"$WORK/list" || fail "sala $form"
  grep -q "^org/tiny .*models-dir" "$WORK/list" || fail "sala $form: $(cat "$WORK/list")"
done
OTHER=$WORK/other-models
timeout 120 "$SALA" models download org/third --models-dir "$OTHER" >/dev/null 2>"$WORK/err" || fail "download --models-dir: $(cat "$WORK/err")"
same_files "$OTHER/org/third"
[[ ! -e $EMPTY/org ]] || fail "download went to \$SALA_MODELS_DIR"
"$SALA" models rm org/third --models-dir "$OTHER" >/dev/null || fail "rm --models-dir"
[[ ! -e $OTHER/org/third ]] || fail "rm --models-dir left the model"
ok "--models-dir wins over \$SALA_MODELS_DIR (serve, models list/download/rm)"

echo "test_models: all passed"
