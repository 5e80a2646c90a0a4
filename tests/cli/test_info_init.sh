#!/usr/bin/env bash
# `sala info` and `sala init`: the real config's layout, random checkpoints, usage errors.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The published config (no weights beside it): 32 layers, 8 sparse at the spec's indices, ~9.5B.
out=$("$SALA" info "$SALA_ROOT/tests/data/model/config.json")
grep -q "layers: 32 (8 sparse at 0, 9, 16, 17, 22, 29, 30, 31; 24 lightning)" <<<"$out" || fail "layout: $out"
grep -q "parameters: 9.47" <<<"$out" || fail "parameter count: $out"
grep -q "SLLLLLLLLSLLLLLLSSLLLLSLLLLLLSSS" <<<"$("$SALA" info --preset 9b)" || fail "9b preset layout"
# Cache memory at 1M tokens (engine/memory.h, the accounting `sala bench` reports per row): bf16 K/V
# 2 x 8 layers x 1M x 2 heads x 128 x 2 B = 8 GiB; K1/K2 5 rows per 64-token page: 320 MiB.
mem=$("$SALA" info --preset 9b --context 1048576)
grep -q "lightning states  48.00 MiB" <<<"$mem" || fail "memory accounting: $mem"
grep -q "sparse K/V        8.00 GiB (8589934592 bytes)" <<<"$mem" || fail "K/V accounting: $mem"
grep -q "compressed K1/K2  320.00 MiB (335544320 bytes)" <<<"$mem" || fail "K1/K2 accounting: $mem"
grep -q "sparse K/V        16.00 GiB" <<<"$("$SALA" info --preset 9b --context 1048576 --cache-dtype f32)" ||
  fail "--cache-dtype f32"
# Whole pages: 65 tokens hold two 64-token pages (2 x 64 x 512 B x K,V x 8 layers = 1 MiB).
grep -q "sparse K/V        1.00 MiB (1048576 bytes)" <<<"$("$SALA" info --preset 9b --context 65)" || fail "page rounding"

# init: tiny checkpoint, marked random in config and safetensors, loads and describes itself.
"$SALA" init "$tmp/tiny" --preset tiny --seed 3 --dtype f32 >/dev/null
grep -q '"sala_random_weights": true' "$tmp/tiny/config.json" || fail "config not marked random"
grep -q "RANDOM weights" <<<"$("$SALA" info "$tmp/tiny")" || fail "info does not say random"
grep -q "model.layers.3.self_attn.o_gate.weight" <<<"$("$SALA" info "$tmp/tiny" --tensors)" || fail "tensor table"
"$SALA" logits "$tmp/tiny" --tokens 1,5,6,7 --out "$tmp/l.npy" 2>"$tmp/err"
grep -q "RANDOM weights" "$tmp/err" || fail "logits does not say random"
# Same seed, same bytes; another seed, other bytes.
"$SALA" init "$tmp/tiny2" --preset tiny --seed 3 --dtype f32 >/dev/null
cmp -s "$tmp/tiny/model.safetensors" "$tmp/tiny2/model.safetensors" || fail "init is not deterministic"
"$SALA" init "$tmp/tiny3" --preset tiny --seed 4 --dtype f32 >/dev/null
! cmp -s "$tmp/tiny/model.safetensors" "$tmp/tiny3/model.safetensors" || fail "seed ignored"

# Usage and input errors: short message, non-zero exit.
! "$SALA" init 2>"$tmp/err" || fail "init without OUT succeeded"
grep -q "OUT is required" "$tmp/err" || fail "init usage: $(cat "$tmp/err")"
! "$SALA" info "$tmp/none" 2>"$tmp/err" || fail "info on a missing dir succeeded"
grep -q "not found" "$tmp/err" || fail "missing model message"
! "$SALA" init "$tmp/x" --preset huge 2>/dev/null || fail "unknown preset accepted"
! "$SALA" info --bogus 2>/dev/null || fail "unknown flag accepted"
echo '{"hidden_size": "big"}' >"$tmp/bad.json"
! "$SALA" init "$tmp/x" --config "$tmp/bad.json" 2>"$tmp/err" || fail "bad config accepted"
grep -q "hidden_size" "$tmp/err" || fail "bad config message: $(cat "$tmp/err")"
# A checkpoint that lacks a tensor: one error naming it.
cp -r "$tmp/tiny" "$tmp/broken"
python3 - "$tmp/broken/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["intermediate_size"] = 96
json.dump(c, open(sys.argv[1], "w"))
PY
! "$SALA" logits "$tmp/broken" --tokens 1,2 --out "$tmp/l.npy" 2>"$tmp/err" || fail "shape mismatch accepted"
grep -q "wrong shape" "$tmp/err" || fail "shape mismatch message: $(cat "$tmp/err")"
echo "test_info_init: ok"
