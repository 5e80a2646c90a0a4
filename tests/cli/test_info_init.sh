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
grep -q "lightning states  48.00 MiB" <<<"$("$SALA" info --preset 9b --context 1048576)" || fail "memory accounting"

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
