#!/usr/bin/env bash
# sala bench --compare on the tiny random preset (CPU): every format's rows in the table and the
# JSON (prefill and decode), the first format as the reference of the × columns, W8A8 prefill per
# format, the rounds interleaved (round 1 of every format before round 2 of any), and clear errors
# for malformed format specs and conflicting flags.
source "$(dirname "$0")/common.sh"

"$SALA" bench --random tiny --backend cpu -t 2 --compare bf16,fp8+lm,int8/g32,int4/g32+lm+w8a8 --contexts 96,192 \
  --chunk 96 --decode-steps 3 --rounds 2 --json "$tmp/c.json" >"$tmp/out" 2>"$tmp/err" || fail "bench --compare: $(cat "$tmp/err")"
for label in "f32 " "fp8 + lm_head " "int8 g32 " "int4 g32 + lm_head, W8A8 prefill"; do
  [ "$(grep -c "^$label" "$tmp/out")" = 2 ] || fail "bench --compare: not two rows (contexts 96, 192) of '$label': $(cat "$tmp/out")"
done
grep -q "× f32" "$tmp/out" || fail "bench --compare: no × column named after the first format"
[ "$(grep -c '^f32 .* 1\.000x .* 1\.000x  *[0-9.][0-9.]*  *[0-9.][0-9.]*%$' "$tmp/out")" = 2 ] ||
  fail "bench --compare: the reference rows are not 1.000x (then SoL ms, %SoL): $(cat "$tmp/out")"
grep -q "^speed of light (SoL): .* at [0-9]* GB/s" "$tmp/out" || fail "bench --compare: no speed-of-light line: $(cat "$tmp/out")"
# W8A8 for the int4 row only: the note when its model loads (prompt chunks of 96 rows take it).
[ "$(grep -c "int8 prefill: on" "$tmp/err")" = 2 ] || fail "bench --compare: +w8a8 not applied once per round"
# Interleaved: the last format's round 1 comes before the first format's round 2.
last_r1=$(grep -n "round 1/2  int4 g32 + lm_head" "$tmp/err" | tail -1 | cut -d: -f1)
first_r2=$(grep -n "round 2/2  f32" "$tmp/err" | head -1 | cut -d: -f1)
[ -n "$last_r1" ] && [ -n "$first_r2" ] && [ "$last_r1" -lt "$first_r2" ] || fail "bench --compare: rounds not interleaved"
python3 - "$tmp/c.json" <<'PY' || fail "bench --compare: JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["rounds"] == 2 and d["reference"] == "f32" and d["backend"] == "cpu", d
rows = d["rows"]
assert [r["format"] for r in rows] == ["bf16", "bf16", "fp8+lm", "fp8+lm", "int8/g32", "int8/g32", "int4/g32+lm+w8a8", "int4/g32+lm+w8a8"], rows
assert [r["context"] for r in rows[:2]] == [96, 192]
for r in rows:
    assert len(r["ms_per_step_rounds"]) == 2 and all(v > 0 for v in r["ms_per_step_rounds"]), r
    assert r["ms_per_step"] in r["ms_per_step_rounds"]
    base = rows[rows.index(r) % 2]
    assert abs(r["speedup_vs_first"] - base["ms_per_step"] / r["ms_per_step"]) < 1e-9, r
    assert abs(r["decode_tok_s"] - 1e3 / r["ms_per_step"]) < 1e-6, r
    assert len(r["prefill_tok_s_rounds"]) == 2 and all(v > 0 for v in r["prefill_tok_s_rounds"]), r
    assert abs(r["prefill_vs_first"] - r["prefill_tok_s"] / base["prefill_tok_s"]) < 1e-9, r
# Packed weights hold fewer bytes than the dense f32 model's.
assert rows[6]["weights_bytes"] < rows[2]["weights_bytes"] < rows[0]["weights_bytes"], rows
# The speed of light: each row's bytes per step at the bandwidth measured in the run; fewer bytes
# for packed weights, more for the longer context (its K/V), the same for one format's rounds.
bw = d["bandwidth_bytes_s"]
assert bw > 1e8, d
for r in rows:
    assert r["bytes_per_step"] > 0, r
    assert abs(r["sol_ms_per_step"] - r["bytes_per_step"] / bw * 1e3) < 1e-9 * r["sol_ms_per_step"] + 1e-12, r
    assert abs(r["pct_sol"] - 100 * r["sol_ms_per_step"] / r["ms_per_step"]) < 1e-6, r
assert rows[6]["bytes_per_step"] < rows[2]["bytes_per_step"] < rows[0]["bytes_per_step"], rows
assert rows[0]["bytes_per_step"] < rows[1]["bytes_per_step"], rows
PY

# Without --contexts: the targets' context, 4K.
"$SALA" bench --random tiny --backend cpu -t 2 --compare bf16 --decode-steps 1 --rounds 1 --chunk 1024 >"$tmp/d.out" \
  2>"$tmp/d.err" || fail "bench --compare (default context): $(cat "$tmp/d.err")"
grep -q "^f32 .* 4096 " "$tmp/d.out" || fail "bench --compare: default context not 4096: $(cat "$tmp/d.out")"

expect_error() {  # MESSAGE-PART ARGS...: the command fails and says MESSAGE-PART
  local want=$1
  shift
  if "$SALA" bench "$@" >"$tmp/eo" 2>"$tmp/ee"; then fail "bench $* succeeded"; fi
  grep -qF -- "$want" "$tmp/ee" || fail "bench $*: expected '$want', got: $(cat "$tmp/ee")"
}
expect_error "'int5': unknown format 'int5'" --random tiny --backend cpu --compare bf16,int5
expect_error "the group is written /gN (e.g. int4/g128), not '/128'" --random tiny --backend cpu --compare int4/128
expect_error "'int4/g48': group 48 (known: 32, 64, 128, 256)" --random tiny --backend cpu --compare int4/g48
expect_error "'fp8/g64': fp8 has one scale per row" --random tiny --backend cpu --compare fp8/g64
expect_error "'bf16+lm': bf16 has no groups" --random tiny --backend cpu --compare bf16+lm
expect_error "'int4+xx': unknown suffix '+xx'" --random tiny --backend cpu --compare int4+xx
expect_error "'fp8+lm+lm': '+lm' twice" --random tiny --backend cpu --compare fp8+lm+lm
expect_error "drop --fp8-prefill and --int8-prefill" --random tiny --backend cpu --compare bf16,fp8 --fp8-prefill
expect_error "drop --quant, --quant-lm-head and --quant-group" --random tiny --backend cpu --compare bf16,fp8 --quant int4
expect_error "batch-1 rows only; drop --batches" --random tiny --backend cpu --compare bf16,fp8 --batches 8
expect_error "give --random PRESET" "$tmp" --backend cpu --compare bf16,fp8
expect_error "not with --kernel-trace" --random tiny --backend cpu --compare bf16 --kernel-trace
expect_error "--chunk: Value 0 not in range 1 to 16777216" --random tiny --backend cpu --compare bf16 --chunk 0
expect_error "--decode-steps: Value 0 not in range 1 to 1048576" --random tiny --backend cpu --compare bf16 --decode-steps 0
# An unwritable --json fails before the run (no round printed).
expect_error "cannot write '$tmp/no/such/dir/c.json'" --random tiny --backend cpu --compare bf16 --json "$tmp/no/such/dir/c.json"
! grep -q "round 1" "$tmp/ee" || fail "bench --compare: ran before failing on --json"
# A group the preset's widths cannot take names the tensor (tiny: 64 columns).
expect_error "lm_head.weight has 64 columns, not a multiple of group 128" --random tiny --backend cpu --compare int4/g128+lm \
  --contexts 64 --decode-steps 1 --rounds 1
echo "bench --compare: ok"
