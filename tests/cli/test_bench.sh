#!/usr/bin/env bash
# sala bench on the tiny random preset (CPU): the table and JSON with memory per row, the memory
# accounting against `sala info --context`, --plot PNGs (run and --from, with the authors' points),
# and clear errors when python/matplotlib is missing.
set -euo pipefail
SALA=${SALA:?set SALA to the sala binary}
SALA_ROOT=${SALA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
is_png() {  # FILE: exists, non-empty, PNG signature
  [ -s "$1" ] || fail "$1 missing or empty"
  [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "$1 is not a PNG"
}

$SALA bench --random tiny --backend cpu -t 2 --contexts 256,512 --batches 1,2 --batch-context 256 --decode-steps 2 \
  --chunk 128 --json "$tmp/b.json" --plot "$tmp/plots" >"$tmp/out" 2>"$tmp/err" || fail "bench --plot failed: $(cat "$tmp/err")"
grep -q "RANDOM weights" "$tmp/err" || fail "random-weights notice missing: $(cat "$tmp/err")"
grep -Eq "^context +batch .*wts MiB +K/V MiB +K1K2 MiB +state MiB +work MiB +peak MiB" "$tmp/out" ||
  fail "memory columns missing from the table: $(cat "$tmp/out")"
[ "$(grep -Ec '^(256|512) ' "$tmp/out")" -eq 3 ] || fail "expected 3 table rows: $(cat "$tmp/out")"
for p in decode ttft memory; do is_png "$tmp/plots/bench-$p.png"; done
[ ! -e "$tmp/plots/bench.json" ] || fail "--json was given, yet bench.json was written into the plot directory"
grep -q "A6000D" "$SALA_ROOT/tools/plot_bench.py" || fail "plot_bench.py lost the authors' reference"
# --batch-context takes sizes like --contexts; a bad one is an error naming it.
$SALA bench --random tiny --backend cpu -t 2 --contexts 64 --batches 2 --batch-context 0.25k --decode-steps 1 \
  >/dev/null 2>"$tmp/bc.err" && fail "--batch-context 0.25k accepted"
grep -q "bad size '0.25k'" "$tmp/bc.err" || fail "--batch-context message: $(cat "$tmp/bc.err")"
$SALA bench --random tiny --backend cpu -t 2 --contexts 64 --batches 2 --batch-context 1k --decode-steps 1 \
  >"$tmp/bc.out" 2>/dev/null || fail "--batch-context 1k refused"
grep -Eq "^1024 +2 " "$tmp/bc.out" || fail "--batch-context 1k: no 1024-token batch row: $(cat "$tmp/bc.out")"

# --prefill-reps: every timing prefills the context from empty, so TTFT = context / prefill rate
# per row (not cumulative over the rows), and the JSON says how many reps; out of range is an error.
$SALA bench --random tiny --backend cpu -t 2 --contexts 64,128 --batches 1 --decode-steps 1 --chunk 32 \
  --prefill-reps 2 --json "$tmp/reps.json" >/dev/null 2>"$tmp/reps.err" || fail "--prefill-reps 2: $(cat "$tmp/reps.err")"
/usr/bin/python3 - "$tmp/reps.json" <<'PY' || fail "--prefill-reps JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["prefill_reps"] == 2, d.get("prefill_reps")
rows = d["rows"]
assert [r["context"] for r in rows] == [64, 128], rows
for r in rows:
    assert r["prefill_tok_s"] > 0 and abs(r["context"] / r["prefill_tok_s"] - r["ttft_s"]) < 1e-6 * r["ttft_s"] + 1e-9, r
PY
$SALA bench --random tiny --backend cpu --contexts 64 --batches 1 --prefill-reps 0 >/dev/null 2>"$tmp/reps0.err" &&
  fail "--prefill-reps 0 accepted"
grep -q "prefill-reps" "$tmp/reps0.err" || fail "--prefill-reps 0 message: $(cat "$tmp/reps0.err")"

# info --context uses the same accounting: the 512-token batch-1 row's caches in f32 (CPU).
$SALA info --preset tiny --context 512 --cache-dtype f32 >"$tmp/info"
/usr/bin/python3 - "$tmp/b.json" "$tmp/info" <<'PY' || fail "JSON schema or memory accounting"
import json, re, sys
d = json.load(open(sys.argv[1]))
for k in ("model", "backend", "device", "ceilings", "memory", "rows"):
    assert k in d, k
assert d["backend"] == "cpu" and d["memory"]["workspace_from"] == "backend allocation count", d["memory"]
rows = d["rows"]
assert [(r["context"], r["batch"]) for r in rows] == [(256, 1), (512, 1), (256, 2)], rows
speed = ("prefill_tok_s", "ttft_s", "decode_tok_s", "roofline_tok_s", "pct_roofline", "decode_ms_per_step")
memory = ("weights_bytes", "kv_bytes", "compressed_keys_bytes", "lightning_state_bytes", "cache_pool_bytes",
          "workspace_bytes", "peak_memory_bytes", "device_used_bytes")
for r in rows:
    for k in speed + memory:
        assert isinstance(r.get(k), (int, float)), (k, r)
    assert r["decode_tok_s"] > 0 and r["weights_bytes"] > 0 and r["workspace_bytes"] > 0, r
    assert r["peak_memory_bytes"] >= r["device_used_bytes"] > 0, r
    assert r["kv_bytes"] + r["compressed_keys_bytes"] + r["lightning_state_bytes"] <= r["cache_pool_bytes"], r
# Caches scale with context and batch; the weights do not change.
a, b, c = rows
assert b["kv_bytes"] == 2 * a["kv_bytes"] and c["kv_bytes"] == 2 * a["kv_bytes"], rows
assert c["lightning_state_bytes"] == 2 * a["lightning_state_bytes"] == 2 * b["lightning_state_bytes"], rows
assert a["weights_bytes"] == b["weights_bytes"] == c["weights_bytes"]
info = open(sys.argv[2]).read()
def info_bytes(what):
    m = re.search(rf"^  {re.escape(what)} +\S+ \S+ \((\d+) bytes", info, re.M)
    assert m, (what, info)
    return int(m.group(1))
assert info_bytes("sparse K/V") == b["kv_bytes"], (info, b)
assert info_bytes("compressed K1/K2") == b["compressed_keys_bytes"], (info, b)
assert info_bytes("lightning states") == b["lightning_state_bytes"], (info, b)
PY

# --from: plots existing files without running (the repository's H200 results carry no memory).
$SALA bench --plot "$tmp/from" --from "$tmp/b.json,$SALA_ROOT/bench/results/2026-11-22-h200-bf16-random9b.json" \
  >"$tmp/out2" 2>&1 || fail "bench --from failed: $(cat "$tmp/out2")"
for p in decode ttft memory; do is_png "$tmp/from/bench-$p.png"; done
grep -q "| 128K | 1 |" "$tmp/out2" || fail "Markdown table of the H200 file missing: $(cat "$tmp/out2")"
# --plot without --json keeps the run's JSON beside the PNGs.
$SALA bench --random tiny --backend cpu -t 2 --contexts 256 --batches 1 --decode-steps 1 --chunk 128 \
  --plot "$tmp/p2" >/dev/null 2>&1 || fail "bench --plot without --json failed"
[ -s "$tmp/p2/bench.json" ] || fail "bench --plot without --json wrote no bench.json"
is_png "$tmp/p2/bench-memory.png"

# Missing python or matplotlib: a clear error before any run, nothing skipped silently.
if SALA_PYTHON=$tmp/no-python $SALA bench --random tiny --backend cpu --plot "$tmp/p3" >/dev/null 2>"$tmp/e1"; then
  fail "bench --plot succeeded without python"
fi
grep -q "python interpreter '$tmp/no-python' not found" "$tmp/e1" || fail "missing-python message: $(cat "$tmp/e1")"
grep -q "python3-matplotlib" "$tmp/e1" || fail "missing-python message does not say what to install"
printf '#!/bin/sh\nexit 1\n' >"$tmp/fake-python" && chmod +x "$tmp/fake-python"
if SALA_PYTHON=$tmp/fake-python $SALA bench --plot "$tmp/p3" --from "$tmp/b.json" >/dev/null 2>"$tmp/e2"; then
  fail "bench --plot succeeded without matplotlib"
fi
grep -q "cannot import matplotlib" "$tmp/e2" || fail "missing-matplotlib message: $(cat "$tmp/e2")"
[ ! -e "$tmp/p3" ] || fail "a failed --plot left output behind"

# Usage errors.
if $SALA bench --from "$tmp/b.json" >/dev/null 2>"$tmp/e3"; then fail "--from without --plot accepted"; fi
grep -q -- "--from needs --plot" "$tmp/e3" || fail "--from message: $(cat "$tmp/e3")"
if $SALA bench --plot "$tmp/p4" --from "$tmp/none.json" >/dev/null 2>"$tmp/e4"; then fail "missing --from file accepted"; fi
grep -q "no file '$tmp/none.json'" "$tmp/e4" || fail "missing file message: $(cat "$tmp/e4")"
if $SALA bench >/dev/null 2>"$tmp/e5"; then fail "bench without a model accepted"; fi
grep -q "MODEL directory or --random" "$tmp/e5" || fail "no-model message: $(cat "$tmp/e5")"
echo "bench: ok"
