#!/usr/bin/env bash
# sala needle on a tiny random model: the random-weights message, the table, the JSON schema (one
# cell per context x depth, exact prompt lengths, host RSS peak, device peak null on the CPU
# backend), the PNGs; plus usage errors.
source "$(dirname "$0")/common.sh"

$SALA init "$tmp/m" --preset tiny --seed 1 >/dev/null
M=$tmp/m

$SALA needle "$M" --context 256,512 --depth 0,50,95 -n 4 --chunk 128 --backend cpu -t 2 \
  --json "$tmp/n.json" --png "$tmp/heat.png" >"$tmp/out" 2>"$tmp/err" || fail "needle failed: $(cat "$tmp/err")"
grep -q "RANDOM weights cannot find needles" "$tmp/err" || fail "random-weights message missing: $(cat "$tmp/err")"
grep -q "harness" "$tmp/err" || fail "random-weights message does not say it is a harness check"
grep -Eq "^context +depth" "$tmp/out" || fail "table header missing: $(cat "$tmp/out")"
grep -q "peak RSS MiB" "$tmp/out" && grep -q "peak dev MiB" "$tmp/out" || fail "memory columns: $(head -1 "$tmp/out")"
# On the CPU backend the device column is '-' in every row (RSS is the only memory).
[ "$(grep -E '^(256|512) ' "$tmp/out" | awk '$9 == "-"' | wc -l)" -eq 6 ] || fail "device column on CPU: $(cat "$tmp/out")"
[ "$(grep -Ec '^(256|512) ' "$tmp/out")" -eq 6 ] || fail "expected 6 table rows: $(cat "$tmp/out")"
grep -Eq "^found [0-9]+ of 6 cells" "$tmp/out" || fail "summary line missing"
[ -s "$tmp/heat.png" ] || fail "heatmap PNG missing or empty"
[ -s "$tmp/heat-speed.png" ] || fail "speed PNG missing or empty"
for png in "$tmp/heat.png" "$tmp/heat-speed.png"; do
  [ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "$png is not a PNG"
done

/usr/bin/python3 - "$tmp/n.json" <<'PY' || fail "JSON schema"
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("model", "backend", "random_weights", "needle", "question", "answer", "match", "max_tokens", "found", "cells",
          "device_memory", "device_total_bytes"):
    assert k in d, k
assert d["random_weights"] is True and d["backend"] == "cpu" and d["match"] == "contains"
# CPU backend: no device memory, host RSS only.
assert d["device_memory"] is False and d["device_total_bytes"] is None, d
cells = d["cells"]
assert len(cells) == 6, len(cells)
keys = ("context", "prompt_tokens", "depth", "actual_depth", "needle_token", "found", "output", "prefill_s",
        "prefill_tok_s", "decode_tok_s", "peak_rss_bytes", "peak_device_bytes")
for c in cells:
    for k in keys:
        assert k in c, k
    assert c["prompt_tokens"] == c["context"], c
    assert isinstance(c["found"], bool)
    assert c["prefill_tok_s"] > 0 and c["peak_rss_bytes"] > 0
    assert c["peak_device_bytes"] is None, c
# The host RSS peak is the process's high-water mark since it started: never decreasing over cells.
rss = [c["peak_rss_bytes"] for c in cells]
assert rss == sorted(rss), rss
assert sorted({(c["context"], c["depth"]) for c in cells}) == [(256, 0), (256, 50), (256, 95), (512, 0), (512, 50), (512, 95)]
assert d["found"] == sum(c["found"] for c in cells)
PY

# --match exact/regex and a filler file run; a bad regex or too small a context fails clearly.
printf 'Some filler text about rivers and hills.\n' >"$tmp/filler.txt"
$SALA needle "$M" --context 200 --depth 50 -n 2 --match regex --answer '^[0-9]+$' --filler "$tmp/filler.txt" \
  --backend cpu >"$tmp/out2" 2>/dev/null || fail "needle with --filler/--match regex failed"
[ "$(grep -Ec '^200 ' "$tmp/out2")" -eq 1 ] || fail "expected one row: $(cat "$tmp/out2")"
if $SALA needle "$M" --context 200 --depth 50 --match regex --answer '(' >/dev/null 2>"$tmp/e1"; then fail "bad regex accepted"; fi
grep -qi "regular expression" "$tmp/e1" || fail "bad regex message: $(cat "$tmp/e1")"
if $SALA needle "$M" --context 16 --depth 50 >/dev/null 2>"$tmp/e2"; then fail "tiny context accepted"; fi
grep -qi "too small" "$tmp/e2" || fail "too-small message: $(cat "$tmp/e2")"
if $SALA needle "$M" --context 256 --depth 120 >/dev/null 2>"$tmp/e3"; then fail "depth 120 accepted"; fi
echo "needle: ok"
