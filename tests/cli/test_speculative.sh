#!/usr/bin/env bash
# sala generate/batch --speculative self|lookup: at --temperature 0 the text is the same as without
# (exact rollback), the timing summary reports acceptance and tokens per verify step, bad flags fail.
set -euo pipefail
SALA=${SALA:?set SALA to the sala binary}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SALA_HOME=$tmp/home

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

$SALA init "$tmp/m" --preset tiny --seed 3 >/dev/null
M=$tmp/m
G=(--temperature 0 -n 200 --ignore-eos)
P="Once upon a time there was a speculative decoder"

$SALA generate "$M" "$P" "${G[@]}" >"$tmp/plain.out" 2>/dev/null
[ -s "$tmp/plain.out" ] || fail "no output"
for mode in self lookup; do
  $SALA generate "$M" "$P" "${G[@]}" --speculative $mode --draft-layers 2 --draft-tokens 4 \
    >"$tmp/$mode.out" 2>"$tmp/$mode.err"
  cmp -s "$tmp/plain.out" "$tmp/$mode.out" || fail "--speculative $mode changes greedy output"
  grep -Eq "^speculative $mode \(K 4.*\): [0-9]+ verify steps, acceptance [0-9.]+% \([0-9]+/[0-9]+ drafts\), [0-9.]+ tokens per verify step" \
    "$tmp/$mode.err" || fail "speculative summary missing: $(cat "$tmp/$mode.err")"
  grep -Eq "generated 200 tokens" "$tmp/$mode.err" || fail "$mode: wrong token count: $(cat "$tmp/$mode.err")"
done
# Other K and draft depths, and a no-stream run, still give the same text.
$SALA generate "$M" "$P" "${G[@]}" --speculative self --draft-layers 1 --draft-tokens 7 --no-stream \
  >"$tmp/k7.out" 2>/dev/null
cmp -s "$tmp/plain.out" "$tmp/k7.out" || fail "--draft-tokens 7 --draft-layers 1 changes greedy output"

# batch: same answers with and without speculation (requests run one after another).
printf '%s\n' '{"prompt": "a b c"}' '{"prompt": "hello hello hello", "max_tokens": 30}' >"$tmp/in.jsonl"
$SALA batch "$M" --prompts "$tmp/in.jsonl" --parallel 1 --temperature 0 -n 40 --ignore-eos >"$tmp/b0.jsonl" 2>/dev/null
$SALA batch "$M" --prompts "$tmp/in.jsonl" --temperature 0 -n 40 --ignore-eos --speculative lookup >"$tmp/b1.jsonl" 2>/dev/null
cmp -s "$tmp/b0.jsonl" "$tmp/b1.jsonl" || fail "batch --speculative lookup changes greedy output"

# Usage errors.
if $SALA generate "$M" "$P" --speculative nonsense >/dev/null 2>&1; then fail "bad --speculative accepted"; fi
if $SALA generate "$M" "$P" --speculative self --draft-tokens 0 >/dev/null 2>&1; then fail "--draft-tokens 0 accepted"; fi
echo "test_speculative: ok"
