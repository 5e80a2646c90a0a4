#!/usr/bin/env bash
# sala generate: greedy determinism, --stream == --no-stream, seeded sampling, the timing summary and
# random-weights notice on stderr, --max-tokens, stop strings, --raw/--system/--no-think, usage
# errors, and the built-in default model (when the real tokenizer files are present).
source "$(dirname "$0")/common.sh"
export LC_ALL=C  # byte-wise string slicing below
# expect_error "what" "stderr pattern" cmd...: the command fails (exit != 0) and says why.
expect_error() {
  local what=$1 pattern=$2
  shift 2
  if "$@" >"$tmp/err.out" 2>"$tmp/err.err"; then fail "$what: exit code 0"; fi
  grep -qi -- "$pattern" "$tmp/err.err" || fail "$what: stderr lacks '$pattern': $(cat "$tmp/err.err")"
  [ "$(wc -l <"$tmp/err.err")" -le 10 ] || fail "$what: error message is not short"
}

$SALA init "$tmp/m" --preset tiny --seed 1 >/dev/null
M=$tmp/m
G=(--temperature 0 -n 24 --ignore-eos)

# Greedy output is the same in two runs; the notice and the timing summary are on stderr only.
$SALA generate "$M" "Hello there" "${G[@]}" >"$tmp/a.out" 2>"$tmp/a.err"
$SALA generate "$M" "Hello there" "${G[@]}" >"$tmp/b.out" 2>/dev/null
cmp -s "$tmp/a.out" "$tmp/b.out" || fail "greedy output differs between two runs"
[ -s "$tmp/a.out" ] || fail "no output"
grep -q "RANDOM weights" "$tmp/a.err" || fail "random-weights notice missing"
grep -Eq "^timings: prompt [0-9]+ tokens, prefill [0-9.]+ s \([0-9.]+ tok/s\) \| generated 24 tokens, decode [0-9.]+ s \([0-9.]+ tok/s\)$" \
  "$tmp/a.err" || fail "timing summary missing or wrong: $(cat "$tmp/a.err")"
grep -q "timings" "$tmp/a.out" && fail "timing summary on stdout"

# --no-stream prints exactly what --stream prints.
$SALA generate "$M" "Hello there" "${G[@]}" --no-stream >"$tmp/c.out" 2>/dev/null
cmp -s "$tmp/a.out" "$tmp/c.out" || fail "--no-stream output differs from --stream"

# Seeded sampling is reproducible; different seeds usually differ (not asserted: random model).
$SALA generate "$M" "Hello there" -n 24 --ignore-eos --seed 7 --temperature 0.9 >"$tmp/s1.out" 2>/dev/null
$SALA generate "$M" "Hello there" -n 24 --ignore-eos --seed 7 --temperature 0.9 >"$tmp/s2.out" 2>/dev/null
cmp -s "$tmp/s1.out" "$tmp/s2.out" || fail "same --seed gave different samples"

# --max-tokens: exactly N tokens with --ignore-eos, at most N without; 0 gives an empty answer.
$SALA generate "$M" "Count" --temperature 0 -n 5 --ignore-eos >/dev/null 2>"$tmp/n5.err"
grep -q "generated 5 tokens" "$tmp/n5.err" || fail "--max-tokens 5 not respected: $(cat "$tmp/n5.err")"
$SALA generate "$M" "Count" --temperature 0 -n 3 >/dev/null 2>"$tmp/n3.err"
n=$(sed -n 's/.*generated \([0-9]*\) tokens.*/\1/p' "$tmp/n3.err")
[ "$n" -ge 1 ] && [ "$n" -le 3 ] || fail "--max-tokens 3 gave $n tokens"
$SALA generate "$M" "Count" -n 0 >"$tmp/n0.out" 2>/dev/null
[ "$(cat "$tmp/n0.out")" = "" ] || fail "--max-tokens 0 printed text"

# Stop strings: the output is the greedy text up to (not including) the first occurrence.
full=$(cat "$tmp/a.out")
[ ${#full} -ge 12 ] || fail "greedy text too short for the stop test: '$full'"
stop=${full:6:3}
expected=${full%%"$stop"*}
got=$($SALA generate "$M" "Hello there" "${G[@]}" --stop "$stop" 2>/dev/null)
[ "$got" = "$expected" ] || fail "--stop '$stop': got '$got', expected '$expected'"
got=$($SALA generate "$M" "Hello there" "${G[@]}" --stop "$stop" --no-stream 2>/dev/null)
[ "$got" = "$expected" ] || fail "--stop with --no-stream: got '$got'"

# Prompt modes run; the raw prompt differs from the chat prompt, so normally does the answer.
$SALA generate "$M" "Hello there" "${G[@]}" --raw >"$tmp/raw.out" 2>/dev/null
$SALA generate "$M" "Hello there" "${G[@]}" --system "Be brief." >/dev/null 2>&1
$SALA generate "$M" "Hello there" "${G[@]}" --no-think >/dev/null 2>&1
printf 'Hello there' | $SALA generate "$M" - "${G[@]}" >"$tmp/stdin.out" 2>/dev/null
cmp -s "$tmp/a.out" "$tmp/stdin.out" || fail "prompt from stdin ('-') differs from the argument"

# Usage and input errors: non-zero exit and a short message.
expect_error "missing model dir" "not found" $SALA generate "$tmp/nope" "hi"
expect_error "unknown flag" "bogus" $SALA generate "$M" "hi" --bogus
expect_error "no prompt" "prompt" $SALA generate
expect_error "bad temperature" "temperature" $SALA generate "$M" "hi" --temperature -1
expect_error "prompt longer than the context" "context" $SALA generate "$M" "a long prompt that will not fit" --ctx-size 4
expect_error "--system with --raw" "system" $SALA generate "$M" "hi" --raw --system x
mkdir "$tmp/notok" && cp "$M/config.json" "$M/model.safetensors" "$tmp/notok/"
expect_error "no tokenizer.json" "tokenizer.json" $SALA generate "$tmp/notok" "hi"

# The built-in default model (needs the real tokenizer files; created once, then reused).
if [ -f "$SALA_ROOT/tests/data/tokenizer/tokenizer.json" ] || [ -f "$SALA_ROOT/../shared/models/minicpm-sala/tokenizer.json" ]; then
  $SALA generate "Hi" --temperature 0 -n 3 >/dev/null 2>"$tmp/d1.err" || fail "default model: $(cat "$tmp/d1.err")"
  grep -q "using the built-in default model: RANDOM weights (preset small) at $SALA_HOME/default-small" "$tmp/d1.err" ||
    fail "default-model notice missing: $(cat "$tmp/d1.err")"
  grep -q "creating the built-in default model" "$tmp/d1.err" || fail "default model was not created"
  $SALA generate default "Hi" --temperature 0 -n 3 >/dev/null 2>"$tmp/d2.err"
  grep -q "creating" "$tmp/d2.err" && fail "default model created twice"
  grep -q "using the built-in default model" "$tmp/d2.err" || fail "'default' did not pick the default model"
else
  echo "skip: default model (real tokenizer files not found)"
fi

echo "test_generate: OK"
