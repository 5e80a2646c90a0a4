#!/usr/bin/env bash
# sala tokenize / detokenize on the real tokenizer copy in tests/data/tokenizer.
set -euo pipefail
M="$SALA_ROOT/tests/data/tokenizer"
fail() { echo "FAIL: $*" >&2; exit 1; }

[ "$("$SALA" tokenize "$M" "Hello, my name is")" = "1 21045 59342 1863 2258 1410" ] || fail "spec example"
[ "$("$SALA" tokenize "$M" --no-special "Hello, my name is")" = "21045 59342 1863 2258 1410" ] || fail "--no-special"
[ "$("$SALA" tokenize "$M" --pieces "Hello" | sed -n 2p)" = '["<s>","▁Hello"]' ] || fail "--pieces"
[ "$("$SALA" detokenize "$M" 1 21045 59342)" = "<s> Hello," ] || fail "detokenize"
[ "$("$SALA" detokenize "$M" --skip-special 1 21045 59342)" = "Hello," ] || fail "detokenize --skip-special"

# --chat: the prompt text, then its ids with exactly one BOS.
out="$("$SALA" tokenize "$M" --chat --system "Be brief." --no-think "Hi")"
expected_prompt=$'<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n'
[ "${out%$'\n'*}" = "$expected_prompt" ] || fail "--chat prompt: $out"
ids="${out##*$'\n'}"
[ "${ids%% *}" = "1" ] || fail "--chat ids start with BOS: $ids"
[ "$(tr ' ' '\n' <<<"$ids" | grep -cx 1)" = "1" ] || fail "--chat has one BOS: $ids"

# --jsonl round trip, order kept.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
printf '%s\n' '"Hello"' '"中文 and <|im_end|>"' '""' > "$tmp/in.jsonl"
"$SALA" tokenize "$M" --jsonl "$tmp/in.jsonl" > "$tmp/ids.jsonl"
[ "$(wc -l < "$tmp/ids.jsonl")" = "3" ] || fail "--jsonl line count"
[ "$(sed -n 3p "$tmp/ids.jsonl")" = "[1]" ] || fail "--jsonl empty string"
"$SALA" detokenize "$M" --skip-special --jsonl "$tmp/ids.jsonl" > "$tmp/text.jsonl"
[ "$(sed -n 1p "$tmp/text.jsonl")" = '"Hello"' ] || fail "detokenize --jsonl"

# Errors name the path or the id.
msg="$("$SALA" tokenize "$tmp/nothing" "x" 2>&1 || true)"
grep -q "$tmp/nothing/tokenizer.json" <<<"$msg" || fail "missing tokenizer error: $msg"
msg="$("$SALA" detokenize "$M" 99999 2>&1 || true)"
grep -q "99999" <<<"$msg" || fail "bad id error: $msg"
echo "ok"
