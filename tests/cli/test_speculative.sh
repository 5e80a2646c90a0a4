#!/usr/bin/env bash
# sala generate/chat/batch --speculative self|lookup [--adaptive-draft]: at --temperature 0 the text
# is the same as without (exact rollback), also over several chat turns and with several prompts
# decoded together (speculation inside continuous batching); the timing summary reports acceptance, tokens per verify step and the steps without
# drafts; bad flags fail.
source "$(dirname "$0")/common.sh"

$SALA init "$tmp/m" --preset tiny --seed 3 >/dev/null
M=$tmp/m
# --deterministic: the CPU backend's batch-invariant numerics, so that "identical" is exact on any
# CPU (OpenBLAS rounds a verify of K+1 rows differently from a 1-row decode step).
G=(--deterministic --temperature 0 -n 200 --ignore-eos)
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

# Adaptive K (--adaptive-draft): the same text; the summary names it and the mean drafts per step.
for mode in self lookup; do
  $SALA generate "$M" "$P" "${G[@]}" --speculative $mode --draft-layers 2 --draft-tokens 8 --adaptive-draft \
    >"$tmp/ad-$mode.out" 2>"$tmp/ad-$mode.err"
  cmp -s "$tmp/plain.out" "$tmp/ad-$mode.out" || fail "--adaptive-draft ($mode) changes greedy output"
  grep -Eq "^speculative $mode \(K 8 adaptive, mean [0-9.]+ drafts.*\): [0-9]+ verify steps, acceptance" \
    "$tmp/ad-$mode.err" || fail "adaptive summary missing: $(cat "$tmp/ad-$mode.err")"
done

# chat through a pipe: two turns (the second sees the first) and a third after `clear`; the answers
# with --speculative equal the plain chat's, and the summary line follows the timings.
C=(--deterministic --temperature 0 -n 80 --ignore-eos)
chat_in=$'hello there\nand then what\nclear\nthe cat sat on the mat and the cat\nquit\n'
printf '%s' "$chat_in" | $SALA chat "$M" "${C[@]}" >"$tmp/chat0.out" 2>"$tmp/chat0.err" ||
  fail "plain chat: $(cat "$tmp/chat0.err")"
[ "$(wc -l <"$tmp/chat0.out")" -ge 3 ] || fail "plain chat: expected three answers: $(cat "$tmp/chat0.out")"
for mode in self lookup; do
  for extra in "" "--adaptive-draft"; do
    # shellcheck disable=SC2086
    printf '%s' "$chat_in" | $SALA chat "$M" "${C[@]}" --speculative $mode --draft-layers 2 $extra \
      >"$tmp/chat-$mode.out" 2>"$tmp/chat-$mode.err" || fail "chat --speculative $mode $extra: $(cat "$tmp/chat-$mode.err")"
    cmp -s "$tmp/chat0.out" "$tmp/chat-$mode.out" ||
      fail "chat --speculative $mode $extra changes greedy answers: $(diff "$tmp/chat0.out" "$tmp/chat-$mode.out" | head)"
    grep -q "^timings: .*generated 240 tokens" "$tmp/chat-$mode.err" || fail "chat: timings: $(cat "$tmp/chat-$mode.err")"
    grep -Eq "^speculative $mode \(K 4.*\): [0-9]+ verify steps, acceptance [0-9.]+% \([0-9]+/[0-9]+ drafts\), [0-9.]+ tokens per verify step" \
      "$tmp/chat-$mode.err" || fail "chat: speculative summary missing: $(cat "$tmp/chat-$mode.err")"
  done
done

# batch: prompts of different lengths (one long enough to prefill over several steps and to run in
# the sparse regime) decoded together, speculating inside continuous batching: the same answers as
# plain decoding one prompt at a time.
long=$(for i in $(seq 150); do printf 'token%d ' $((i % 13)); done)
printf '%s\n' '{"prompt": "a b c"}' '{"prompt": "hello hello hello", "max_tokens": 30}' \
  "{\"prompt\": \"$long\", \"max_tokens\": 90}" '{"prompt": "the cat sat on the mat and the cat"}' \
  '{"prompt": "one two three four five", "max_tokens": 70, "repeat_penalty": 1.2}' >"$tmp/in.jsonl"
B=(--deterministic --temperature 0 -n 120 --ignore-eos)
$SALA batch "$M" --prompts "$tmp/in.jsonl" --parallel 1 "${B[@]}" >"$tmp/b0.jsonl" 2>/dev/null
for mode in self lookup; do
  $SALA batch "$M" --prompts "$tmp/in.jsonl" --parallel 3 "${B[@]}" --speculative $mode --draft-layers 2 \
    >"$tmp/b-$mode.jsonl" 2>"$tmp/b-$mode.err"
  cmp -s "$tmp/b0.jsonl" "$tmp/b-$mode.jsonl" || fail "batch --parallel 3 --speculative $mode changes greedy output"
  grep -Eq "^speculative $mode \(K 4.*\): [0-9]+ verify steps, .* decode steps without drafts \(end [0-9]+, boundary [0-9]+, budget [0-9]+, no_match [0-9]+\)" \
    "$tmp/b-$mode.err" || fail "batch: speculative summary missing: $(cat "$tmp/b-$mode.err")"
done
grep -q '"tokens":90' "$tmp/b0.jsonl" || fail "the long prompt's answer is missing: $(cat "$tmp/b0.jsonl")"

# Usage errors.
if $SALA generate "$M" "$P" --speculative nonsense >/dev/null 2>&1; then fail "bad --speculative accepted"; fi
if $SALA generate "$M" "$P" --speculative self --draft-tokens 0 >/dev/null 2>&1; then fail "--draft-tokens 0 accepted"; fi
echo "test_speculative: ok"
