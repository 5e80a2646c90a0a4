#!/usr/bin/env bash
# sala bench --speculative-costs on the CPU backend (tiny preset, random weights): the cost table
# and its JSON rows for a dense and a sparse context (the tiny dense_len is 256), every K from 1
# to --max-draft-tokens (default 8), positive timings, ratios and predicted speedups; usage errors.
source "$(dirname "$0")/common.sh"

"$SALA" bench --random tiny --backend cpu --speculative-costs --contexts 64,300 --decode-steps 3 --draft-layers 2 \
  --json "$tmp/s.json" >"$tmp/out" 2>"$tmp/err" || fail "bench --speculative-costs failed: $(cat "$tmp/err")"
# Decode grows the sequence by 2 warm-up + 3 timed steps per context: 64 -> 69, 300 -> 305.
grep -Eq "^context 69 \(dense\): decode [0-9.]+ ms/step .* self-draft [0-9.]+ ms/token \(2 layers\)" "$tmp/out" ||
  fail "dense context header: $(cat "$tmp/out")"
grep -Eq "^context 305 \(sparse\): decode [0-9.]+ ms/step" "$tmp/out" || fail "sparse context header: $(cat "$tmp/out")"
grep -Eq "^ +K +verify ms +/decode .*self a=.5 / .7 / .9 .*lookup a=.5 / .7 / .9" "$tmp/out" ||
  fail "table header: $(cat "$tmp/out")"
[ "$(grep -Ec '^ +[1-8] +[0-9.]+ +[0-9.]+ ' "$tmp/out")" -eq 16 ] || fail "expected 8 K rows per context: $(cat "$tmp/out")"

/usr/bin/python3 - "$tmp/s.json" <<'PY' || fail "JSON rows"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["mode"] == "speculative_costs" and doc["backend"] == "cpu" and doc["batch"] == 1, doc
assert doc["draft_layers"] == 2 and doc["max_draft_tokens"] == 8, doc
rows = doc["rows"]
assert [(r["context"], r["k"]) for r in rows] == [(c, k) for c in (69, 305) for k in range(1, 9)], rows
for r in rows:
    want = "dense" if r["context"] + r["k"] + 1 < 256 else "sparse"
    assert r["regime"] == want, r
    for f in ("decode_ms", "verify_ms", "verify_over_decode", "verify_forward_ms", "rollback_ms",
              "draft_ms_per_token", "draft_over_decode", "self_round_ms"):
        assert r[f] > 0, (f, r)
    for f in ("snapshot_ms", "draft_restore_ms"):  # a state copy of the tiny model: ~0.1 µs on the CPU
        assert r[f] >= 0, (f, r)
    assert abs(r["verify_over_decode"] - r["verify_ms"] / r["decode_ms"]) < 1e-9 * r["verify_over_decode"] + 1e-12, r
    assert [s["acceptance"] for s in r["speedup"]] == [0.5, 0.7, 0.9], r
    for s in r["speedup"]:
        a, k = s["acceptance"], r["k"]
        assert abs(s["tokens_per_round"] - (1 - a ** (k + 1)) / (1 - a)) < 1e-9, s
        assert s["self"] > 0 and s["lookup"] > 0, s
        # lookup pays no drafting, so it predicts at least the self-draft speedup
        assert s["lookup"] >= s["self"], s
print("json ok:", len(rows), "rows")
PY

# Usage errors.
if "$SALA" bench --random tiny --backend cpu --speculative-costs --max-draft-tokens 0 >/dev/null 2>&1; then
  fail "--max-draft-tokens 0 accepted"
fi
if "$SALA" bench --random tiny --backend cpu --speculative-costs --draft-layers 0 >/dev/null 2>&1; then
  fail "--draft-layers 0 accepted"
fi
echo "test_bench_speculative: ok"
