#!/usr/bin/env bash
# sala perplexity on a tiny random model: output line, JSON {ppl, nll, tokens, windows}, the
# window count of the sliding-window recipe, and usage errors.
source "$(dirname "$0")/common.sh"

$SALA init "$tmp/m" --preset tiny --seed 1 >/dev/null
for i in $(seq 1 12); do echo "The river town woke slowly in the early spring, and boats drifted past the bridge."; done >"$tmp/t.txt"

$SALA perplexity "$tmp/m" "$tmp/t.txt" --ctx 128 --stride 64 --chunk 64 --backend cpu --json "$tmp/p.json" \
  >"$tmp/out" 2>"$tmp/err" || fail "perplexity failed: $(cat "$tmp/err")"
grep -Eq "^perplexity [0-9.]+ \(nll [0-9.]+ nats/token\) over [0-9]+ tokens, [0-9]+ windows of 128 \(stride 64\)$" "$tmp/out" ||
  fail "result line: $(cat "$tmp/out")"
grep -q "RANDOM weights" "$tmp/err" || fail "random-weights notice missing"
grep -q "window 1/" "$tmp/err" || fail "progress missing: $(cat "$tmp/err")"
/usr/bin/python3 - "$tmp/p.json" <<'PY' || fail "JSON"
import json, math, sys
d = json.load(open(sys.argv[1]))
for k in ("ppl", "nll", "tokens", "windows"):
    assert k in d, k
n = d["text_tokens"]
assert d["tokens"] == n - 1, d
assert abs(math.exp(d["nll"]) - d["ppl"]) < 1e-6 * d["ppl"]
# windows start every 64 tokens until one reaches the end
w, b = 0, 0
while True:
    w += 1
    if b + 128 >= n: break
    b += 64
assert d["windows"] == w, (d["windows"], w)
# a random model over 512 ids: near-uniform, ppl within a loose band around 512
assert 50 < d["ppl"] < 5000, d["ppl"]
PY
# stride == ctx (disjoint windows) also works; the same text gives the same result twice.
$SALA perplexity "$tmp/m" "$tmp/t.txt" --ctx 128 --stride 128 --backend cpu --json "$tmp/a.json" >/dev/null 2>&1
$SALA perplexity "$tmp/m" "$tmp/t.txt" --ctx 128 --stride 128 --backend cpu --json "$tmp/b.json" >/dev/null 2>&1
/usr/bin/python3 -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); assert a['ppl']==b['ppl'], (a,b)" \
  "$tmp/a.json" "$tmp/b.json" || fail "not deterministic"
if $SALA perplexity "$tmp/m" "$tmp/missing.txt" >/dev/null 2>"$tmp/e"; then fail "missing file accepted"; fi
grep -qi "cannot read" "$tmp/e" || fail "missing-file message: $(cat "$tmp/e")"
echo "perplexity: ok"
