#!/usr/bin/env bash
# sala batch: every prompt decoded together gives what it gives alone (greedy), results in input
# order, JSONL overrides, --max-tokens / finish_reason, --parallel independence, throughput line,
# and input errors naming the line.
source "$(dirname "$0")/common.sh"
PY=/usr/bin/python3

$SALA init "$tmp/m" --preset tiny --seed 1 >/dev/null
M=$tmp/m

prompts=("Hello there" "What is the capital of France?" "Write a haiku about the sea." "x"
  "A somewhat longer prompt, so that prompts of different lengths are prefilled in the same steps as others decode.")
printf '%s\n' "${prompts[@]}" >"$tmp/prompts.txt"
printf '\n' >>"$tmp/prompts.txt"  # blank lines are skipped

# Each prompt alone (greedy, same max tokens); the batch must give the same text. --deterministic:
# the CPU backend's batch-invariant mode (OpenBLAS rounds differently with the batch size).
for mode in chat raw; do
  extra=()
  [ $mode = raw ] && extra=(--raw)
  for i in "${!prompts[@]}"; do
    $SALA generate "$M" "${prompts[$i]}" --deterministic --temperature 0 -n 20 --no-stream "${extra[@]}" >"$tmp/$mode.$i.out" 2>/dev/null
  done
  $SALA batch "$M" --prompts "$tmp/prompts.txt" --deterministic --temperature 0 -n 20 "${extra[@]}" >"$tmp/$mode.jsonl" 2>"$tmp/$mode.err"
  $PY - "$tmp" "$mode" "${#prompts[@]}" <<'EOF' || fail "batch ($mode) differs from running each prompt alone"
import json, sys
tmp, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(f"{tmp}/{mode}.jsonl", encoding="utf-8", newline="")]
assert len(rows) == n, f"{len(rows)} results for {n} prompts"
prompts = open(f"{tmp}/prompts.txt", encoding="utf-8", newline="").read().split("\n")
for i, r in enumerate(rows):
    assert set(r) == {"index", "prompt", "text", "tokens", "finish_reason"}, r
    assert r["index"] == i and r["prompt"] == prompts[i], r
    alone = open(f"{tmp}/{mode}.{i}.out", encoding="utf-8", newline="").read()
    assert r["text"] + "\n" == alone, f"prompt {i}: batch {r['text']!r} alone {alone!r}"
    assert 1 <= r["tokens"] <= 20 and r["finish_reason"] in ("stop", "length"), r
    assert (r["finish_reason"] == "length") == (r["tokens"] == 20), r
EOF
done
grep -Eq "^batch: 5 prompts, 5 at once: [0-9]+ generated tokens in [0-9.]+ s = [0-9.]+ tok/s$" "$tmp/chat.err" ||
  fail "throughput line missing: $(cat "$tmp/chat.err")"
grep -q "^timings: " "$tmp/chat.err" || fail "timing summary missing"
grep -q "RANDOM weights" "$tmp/chat.err" || fail "random-weights notice missing"

# Fewer sequences at once than prompts: same results (continuous batching admits the rest later).
$SALA batch "$M" --prompts "$tmp/prompts.txt" --deterministic --temperature 0 -n 20 --parallel 2 --out "$tmp/p2.jsonl" 2>/dev/null
cmp -s "$tmp/chat.jsonl" "$tmp/p2.jsonl" || fail "--parallel 2 changed the results"

# JSONL input: per-prompt overrides, "id" echoed, --ignore-eos gives exactly max_tokens.
cat >"$tmp/prompts.jsonl" <<'EOF'
{"prompt": "Hello there", "max_tokens": 3, "id": "a"}
{"prompt": "Hello there", "temperature": 0.9, "seed": 5}
plain text line
{"prompt": "Hello there", "max_tokens": 0}
{"prompt": "Hello there", "stop": ["@@never@@"], "top_k": 1}
EOF
$SALA batch "$M" --prompts "$tmp/prompts.jsonl" --temperature 0 -n 7 --ignore-eos >"$tmp/j.jsonl" 2>/dev/null
$SALA generate "$M" "Hello there" -n 7 --ignore-eos --temperature 0.9 --seed 5 --no-stream >"$tmp/seed5.out" 2>/dev/null
$PY - "$tmp" <<'EOF' || fail "JSONL overrides"
import json, sys
tmp = sys.argv[1]
rows = [json.loads(l) for l in open(f"{tmp}/j.jsonl", encoding="utf-8", newline="")]
assert [r["index"] for r in rows] == [0, 1, 2, 3, 4], rows
assert rows[0]["id"] == "a" and rows[0]["tokens"] == 3 and rows[0]["finish_reason"] == "length", rows[0]
assert rows[1]["tokens"] == 7 and rows[1]["text"] + "\n" == open(f"{tmp}/seed5.out", encoding="utf-8", newline="").read(), rows[1]
assert rows[2]["prompt"] == "plain text line" and rows[2]["tokens"] == 7, rows[2]
assert rows[3]["tokens"] == 0 and rows[3]["text"] == "" and rows[3]["finish_reason"] == "length", rows[3]
assert rows[4]["tokens"] == 7, rows[4]
EOF

# Input errors name the file and line; usage errors exit non-zero.
printf 'ok\n{"prompt": "x", "tempreature": 1}\n' >"$tmp/bad1.jsonl"
if $SALA batch "$M" --prompts "$tmp/bad1.jsonl" >/dev/null 2>"$tmp/e1"; then fail "unknown field accepted"; fi
grep -q 'bad1.jsonl:2: unknown field "tempreature"' "$tmp/e1" || fail "unknown-field message: $(cat "$tmp/e1")"
printf '{"prompt": 3}\n' >"$tmp/bad2.jsonl"
if $SALA batch "$M" --prompts "$tmp/bad2.jsonl" >/dev/null 2>"$tmp/e2"; then fail "non-string prompt accepted"; fi
grep -q 'bad2.jsonl:1: missing string field "prompt"' "$tmp/e2" || fail "bad-prompt message: $(cat "$tmp/e2")"
printf '{"prompt": "x",\n' >"$tmp/bad3.jsonl"
if $SALA batch "$M" --prompts "$tmp/bad3.jsonl" >/dev/null 2>"$tmp/e3"; then fail "broken JSON accepted"; fi
grep -q 'bad3.jsonl:1: not a JSON object' "$tmp/e3" || fail "broken-JSON message: $(cat "$tmp/e3")"
if $SALA batch "$M" >/dev/null 2>"$tmp/e4"; then fail "missing --prompts accepted"; fi
grep -q -- "--prompts" "$tmp/e4" || fail "missing --prompts message: $(cat "$tmp/e4")"
if $SALA batch "$M" --prompts "$tmp/none.txt" >/dev/null 2>"$tmp/e5"; then fail "missing file accepted"; fi
grep -q "none.txt" "$tmp/e5" || fail "missing-file message: $(cat "$tmp/e5")"

echo "test_batch: OK"
