#!/usr/bin/env bash
# `sala quantize`: every format converts a tiny checkpoint, prints per-tensor errors and a total,
# writes the quantization section, copies the tokenizer; the result loads and runs; usage errors.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$SALA" init "$tmp/f32" --preset tiny --seed 2 --dtype f32 >/dev/null
"$SALA" logits "$tmp/f32" --tokens 1,5,6,7,8,9 --out "$tmp/ref.npy" 2>/dev/null
for fmt in fp8 int8 int4; do
  out=$("$SALA" quantize "$tmp/f32" "$tmp/$fmt" --format "$fmt")
  grep -q "model.layers.0.mlp.gate_proj.weight" <<<"$out" || fail "$fmt: no per-tensor row: $out"
  grep -q "model.embed_tokens.weight .*kept (embedding)" <<<"$out" || fail "$fmt: embedding not kept: $out"
  grep -q "model.norm.weight .*kept (norm)" <<<"$out" || fail "$fmt: norm not kept"
  grep -Eq "^total: 32 tensors quantized \($fmt.*rel_fro [0-9.]+e-0[1-3]" <<<"$out" || fail "$fmt: total: $out"
  grep -q "\"quantization\"" "$tmp/$fmt/config.json" || fail "$fmt: no quantization section"
  grep -q "\"format\": \"$fmt\"" "$tmp/$fmt/config.json" || fail "$fmt: format not recorded"
  [ -f "$tmp/$fmt/tokenizer.json" ] || fail "$fmt: tokenizer not copied"
  [ "$(stat -c %s "$tmp/$fmt/model.safetensors")" -lt "$(stat -c %s "$tmp/f32/model.safetensors")" ] || fail "$fmt: not smaller"
  "$SALA" logits "$tmp/$fmt" --tokens 1,5,6,7,8,9 --out "$tmp/$fmt.npy" 2>"$tmp/$fmt.err" || fail "$fmt: does not load"
  # The matrices stay packed (fp8 -> fp8, int8 -> q8, int4 -> q4) and the loader says so.
  packed=$(case $fmt in fp8) echo "fp8 (per row)";; int8) echo "q8 (per row)";; int4) echo "q4 (group 64)";; esac)
  grep -q "weights on cpu: .*32 $packed" "$tmp/$fmt.err" || fail "$fmt: not loaded packed: $(cat "$tmp/$fmt.err")"
  # info: the format, and the model's parameters (not the stored codes' and scales' element counts).
  info=$("$SALA" info "$tmp/$fmt") || fail "$fmt: info fails"
  grep -q "^quantization: $fmt" <<<"$info" || fail "$fmt: info has no quantization line: $info"
  grep -q "^parameters: .*(238336)" <<<"$info" || fail "$fmt: info's parameter count is not the model's: $info"
  grep -q "^stored as:" <<<"$info" || fail "$fmt: info has no storage breakdown: $info"
done
grep -q "^quantization: int4, groups of 64, zero points" <<<"$("$SALA" info "$tmp/int4")" || fail "info: int4 line"
grep -q '"group_size": 64' "$tmp/int4/config.json" || fail "int4 group not recorded"
grep -q '"zero_points": true' "$tmp/int4/config.json" || fail "int4 default is not zero points"
out=$("$SALA" quantize "$tmp/f32" "$tmp/int4sym" --format int4 --symmetric --quiet)
grep -q "symmetric" <<<"$out" || fail "symmetric: $out"
grep -aq "weight_zero" "$tmp/int4/model.safetensors" || fail "int4 default wrote no zero points"
! grep -aq "weight_zero" "$tmp/int4sym/model.safetensors" || fail "symmetric wrote zero points"
"$SALA" logits "$tmp/int4sym" --tokens 1,5,6 --out "$tmp/sym.npy" 2>/dev/null || fail "int4 symmetric does not load"
! "$SALA" quantize "$tmp/f32" "$tmp/x" --format int8 --symmetric 2>/dev/null || fail "--symmetric accepted for int8"

# --lm-head: lm_head packed too (33 matrices), and the loader keeps it packed.
out=$("$SALA" quantize "$tmp/f32" "$tmp/fp8lm" --format fp8 --lm-head --quiet)
grep -q "^total: 33 tensors quantized" <<<"$out" || fail "--lm-head: not 33 tensors: $out"
"$SALA" logits "$tmp/fp8lm" --tokens 1,5,6 --out "$tmp/lm.npy" 2>"$tmp/lm.err" || fail "--lm-head: does not load"
grep -q "weights on cpu: 33 fp8 (per row)" "$tmp/lm.err" || fail "--lm-head: lm_head not packed: $(cat "$tmp/lm.err")"

# A packed checkpoint runs where a dense one does: text in and out through its tokenizer
# (generate; the server's test serves an int8 one).
"$SALA" generate "$tmp/int4" "Hello there" --temperature 0 -n 6 --ignore-eos >"$tmp/gen.out" 2>"$tmp/gen.err" ||
  fail "int4: generate fails: $(cat "$tmp/gen.err")"
[ -s "$tmp/gen.out" ] || fail "int4: generate printed nothing"
grep -q "generated 6 tokens" "$tmp/gen.err" || fail "int4: generate's summary: $(cat "$tmp/gen.err")"

# sala quant-quality: the packed formats against the dense model, one table row each.
out=$("$SALA" quant-quality "$tmp/f32" --formats fp8,int8,int4 --positions 96 --chunk 32 --decode 8 --backend cpu \
  --json "$tmp/qq.json" 2>"$tmp/qq.err") || fail "quant-quality: $(cat "$tmp/qq.err")"
for f in "fp8" "int8" "int4 g64"; do
  row=$(grep "^| $f |" <<<"$out") || fail "quant-quality: no $f row: $out"
  # | format | bytes/param | rel | top-1 | KL | max KL |: 0 < rel < 0.3, top-1 > 0.5
  awk -F'|' '{ exit !($4 > 0 && $4 < 0.3 && $5 > 0.5 && $5 <= 1) }' <<<"$row" || fail "quant-quality $f: $row"
done
grep -q '"top1"' "$tmp/qq.json" || fail "quant-quality: no JSON rows"
out=$("$SALA" quant-quality --random tiny --formats int4-sym --lm-head --positions 40 --chunk 16 --decode 4 \
  --backend cpu 2>/dev/null) || fail "quant-quality --random"
grep -q "^| int4-sym g64 | 0.625 |" <<<"$out" || fail "quant-quality --random --lm-head: $out"
# --text: the first --positions tokens of a text file (the model's tokenizer) instead of random ids.
printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 40) >"$tmp/text.txt"
out=$("$SALA" quant-quality "$tmp/f32" --text "$tmp/text.txt" --formats int8 --positions 64 --chunk 32 --decode 4 \
  --backend cpu --json "$tmp/qt.json" 2>"$tmp/qt.err") || fail "quant-quality --text: $(cat "$tmp/qt.err")"
grep -q "64 positions ($tmp/text.txt)" <<<"$out" || fail "quant-quality --text: header: $out"
grep -q "\"text\": \"$tmp/text.txt\"" "$tmp/qt.json" || fail "quant-quality --text: JSON"
printf 'short' >"$tmp/short.txt"
out=$("$SALA" quant-quality "$tmp/f32" --text "$tmp/short.txt" --formats int8 --positions 64 --chunk 32 --decode 1 \
  --backend cpu 2>/dev/null) || fail "quant-quality --text short"
grep -Eq "[0-9]+ positions \($tmp/short.txt\)" <<<"$out" && ! grep -q "64 positions" <<<"$out" ||
  fail "quant-quality --text: a short text is not truncated to its tokens: $out"
! "$SALA" quant-quality --random tiny --text "$tmp/text.txt" 2>"$tmp/err" || fail "--text with --random accepted"
grep -q "needs a MODEL directory" "$tmp/err" || fail "--text --random message: $(cat "$tmp/err")"
# --fp8-prefill: W8A8 prompt chunks for fp8 (a different, still close, row), said in the header;
# models without fp8 weights get a warning.
out=$("$SALA" quant-quality "$tmp/f32" --formats fp8 --positions 200 --chunk 100 --decode 4 --backend cpu \
  --fp8-prefill 2>/dev/null) || fail "quant-quality --fp8-prefill"
grep -q "fp8 prefill (W8A8" <<<"$out" || fail "--fp8-prefill not in the header: $out"
w8a8=$(grep "^| fp8 |" <<<"$out")
wo=$("$SALA" quant-quality "$tmp/f32" --formats fp8 --positions 200 --chunk 100 --decode 4 --backend cpu 2>/dev/null |
  grep "^| fp8 |")
[ "$w8a8" != "$wo" ] || fail "--fp8-prefill changed nothing: $w8a8"
awk -F'|' '{ exit !($4 > 0 && $4 < 0.3 && $5 > 0.5) }' <<<"$w8a8" || fail "--fp8-prefill row: $w8a8"
"$SALA" logits "$tmp/fp8" --tokens 1,5,6 --fp8-prefill --out "$tmp/pf.npy" 2>"$tmp/pf.err" || fail "logits --fp8-prefill"
grep -q "fp8 prefill: on" "$tmp/pf.err" || fail "fp8 model: no fp8 prefill note: $(cat "$tmp/pf.err")"
"$SALA" logits "$tmp/int8" --tokens 1,5,6 --fp8-prefill --out "$tmp/pf8.npy" 2>"$tmp/pf8.err" || fail "int8 --fp8-prefill"
grep -q "warning: --fp8-prefill has no effect" "$tmp/pf8.err" || fail "int8 model: no warning: $(cat "$tmp/pf8.err")"
# By default the fp8 prefill is on where the backend has fp8 tensor cores (CUDA 8.9+; checked by
# tests/cuda/e2e_parity.sh): the CPU has none, so its fp8 prompts stay weight-only, and it says so.
grep -q "fp8 prefill: off (weight-only prompt products: bf16 activations; this backend has no fp8 tensor cores)" \
  "$tmp/fp8.err" || fail "fp8 model on cpu: no weight-only note: $(cat "$tmp/fp8.err")"
"$SALA" logits "$tmp/f32" --tokens 1,5,6 --out "$tmp/np.npy" 2>"$tmp/np.err" || fail "f32 logits"
! grep -q "fp8 prefill" "$tmp/np.err" || fail "f32 model: an fp8 prefill note: $(cat "$tmp/np.err")"
"$SALA" logits "$tmp/fp8" --tokens 1,5,6,7,8,9 --no-fp8-prefill --out "$tmp/nopf.npy" 2>/dev/null || fail "--no-fp8-prefill"
cmp -s "$tmp/nopf.npy" "$tmp/fp8.npy" || fail "--no-fp8-prefill changed the cpu's weight-only logits"
! "$SALA" logits "$tmp/fp8" --tokens 1,5,6 --fp8-prefill --no-fp8-prefill --out "$tmp/x.npy" 2>"$tmp/err" ||
  fail "--fp8-prefill with --no-fp8-prefill accepted"
grep -q "excludes" "$tmp/err" || fail "--fp8-prefill --no-fp8-prefill message: $(cat "$tmp/err")"
# --int8-prefill: the same for int8 and int4 (requantized per row); fp8 models get a warning.
out=$("$SALA" quant-quality "$tmp/f32" --formats int8 --positions 200 --chunk 100 --decode 4 --backend cpu \
  --int8-prefill 2>/dev/null) || fail "quant-quality --int8-prefill"
grep -q "int8 prefill (W8A8" <<<"$out" || fail "--int8-prefill not in the header: $out"
w8a8=$(grep "^| int8 |" <<<"$out")
wo=$("$SALA" quant-quality "$tmp/f32" --formats int8 --positions 200 --chunk 100 --decode 4 --backend cpu 2>/dev/null |
  grep "^| int8 |")
[ "$w8a8" != "$wo" ] || fail "--int8-prefill changed nothing: $w8a8"
awk -F'|' '{ exit !($4 > 0 && $4 < 0.3 && $5 > 0.5) }' <<<"$w8a8" || fail "--int8-prefill row: $w8a8"
"$SALA" logits "$tmp/int8" --tokens 1,5,6 --int8-prefill --out "$tmp/pi.npy" 2>"$tmp/pi.err" || fail "logits --int8-prefill"
grep -q "int8 prefill: on for" "$tmp/pi.err" || fail "int8 model: no int8 prefill note: $(cat "$tmp/pi.err")"
"$SALA" logits "$tmp/int4" --tokens 1,5,6 --int8-prefill --out "$tmp/pi4.npy" 2>"$tmp/pi4.err" || fail "int4 --int8-prefill"
grep -Eq "int8 prefill: on for 0 int8 matrices \(exact\) and [1-9][0-9]* int4" "$tmp/pi4.err" ||
  fail "int4 model: no int8 prefill note: $(cat "$tmp/pi4.err")"
"$SALA" logits "$tmp/fp8" --tokens 1,5,6 --int8-prefill --out "$tmp/pi8.npy" 2>"$tmp/pi8.err" || fail "fp8 --int8-prefill"
grep -q "warning: --int8-prefill has no effect" "$tmp/pi8.err" || fail "fp8 model: no warning: $(cat "$tmp/pi8.err")"
! "$SALA" quant-quality "$tmp/f32" --formats int5 2>"$tmp/err" || fail "quant-quality: int5 accepted"
grep -q "unknown format 'int5'" "$tmp/err" || fail "quant-quality format message: $(cat "$tmp/err")"
! "$SALA" quant-quality "$tmp/int8" 2>"$tmp/err" || fail "quant-quality: quantized MODEL accepted"
grep -q "already quantized" "$tmp/err" || fail "quant-quality quantized message: $(cat "$tmp/err")"
! "$SALA" bench --random tiny --quant-lm-head --backend cpu 2>/dev/null || fail "bench --quant-lm-head without --quant"
"$SALA" bench --random tiny --quant int8 --quant-lm-head --backend cpu --contexts 64 --batches 1 --decode-steps 2 \
  >/dev/null 2>"$tmp/blm.err" || fail "bench --quant-lm-head: $(cat "$tmp/blm.err")"
grep -q "weights on cpu: 33 q8 (per row)" "$tmp/blm.err" || fail "bench --quant-lm-head: lm_head not packed"

# Random packed weights for benchmarks (`sala bench --random PRESET --quant FORMAT`).
for q in fp8 int8 int4; do
  "$SALA" bench --random tiny --quant $q --backend cpu --contexts 64 --batches 1 --decode-steps 2 \
    >"$tmp/bench_$q.out" 2>"$tmp/bench_$q.err" || fail "bench --quant $q: $(cat "$tmp/bench_$q.err")"
  grep -q "weights on cpu: .* $q\|weights on cpu: .*q[48] (" "$tmp/bench_$q.err" || fail "bench --quant $q: no weights line"
done
! "$SALA" bench --random tiny --quant int3 --backend cpu 2>/dev/null || fail "bench --quant int3 accepted"
"$SALA" bench --random tiny --quant int4 --quant-group 32 --backend cpu --contexts 64 --batches 1 --decode-steps 2 \
  >/dev/null 2>"$tmp/bg.err" || fail "bench --quant-group 32: $(cat "$tmp/bg.err")"
grep -q "weights on cpu: .*q4 (group 32)" "$tmp/bg.err" || fail "bench --quant-group 32: $(cat "$tmp/bg.err")"
"$SALA" bench --random tiny --quant int8 --quant-group 32 --backend cpu --contexts 64 --batches 1 --decode-steps 2 \
  >/dev/null 2>"$tmp/bg.err" || fail "bench int8 --quant-group 32: $(cat "$tmp/bg.err")"
grep -q "weights on cpu: .*q8 (group 32)" "$tmp/bg.err" || fail "bench int8 --quant-group 32: $(cat "$tmp/bg.err")"
! "$SALA" bench --random tiny --quant fp8 --quant-group 32 --backend cpu 2>"$tmp/err" || fail "bench: fp8 with a group"
grep -q "int4 or int8" "$tmp/err" || fail "bench --quant-group message: $(cat "$tmp/err")"

# Errors: bad format, group that does not divide the tiny model's 64 columns, already quantized.
! "$SALA" quantize "$tmp/f32" "$tmp/x" --format int3 2>/dev/null || fail "int3 accepted"
! "$SALA" quantize "$tmp/f32" "$tmp/x" --format int4 --group 128 2>"$tmp/err" || fail "group 128 accepted on tiny"
grep -q "not a multiple of the group size 128" "$tmp/err" || fail "group message: $(cat "$tmp/err")"
! "$SALA" quantize "$tmp/int8" "$tmp/x" --format int4 2>"$tmp/err" || fail "re-quantized"
grep -q "already quantized" "$tmp/err" || fail "already quantized message: $(cat "$tmp/err")"
# An unknown format in config.json: the loader names the field.
sed -i 's/"format": "int8"/"format": "int3"/' "$tmp/int8/config.json"
! "$SALA" logits "$tmp/int8" --tokens 1,2 --out "$tmp/x.npy" 2>"$tmp/err" || fail "int3 config loaded"
grep -q "quantization.format" "$tmp/err" || fail "unknown format message: $(cat "$tmp/err")"
echo OK
