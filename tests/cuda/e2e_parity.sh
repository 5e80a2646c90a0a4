#!/usr/bin/env bash
# End to end on the GPU (run by scripts/device.sh with $SALA, $SALA_ROOT, $OUT):
#  1. the tiny golden cases through the CUDA backend vs the PyTorch reference goldens
#     (bf16 tolerance, top-1 agreement >= 99%);
#  2. prefill+decode vs one-shot and batch vs single on the CUDA backend;
#  3. greedy generation of 64 tokens on CUDA vs the f32 CPU backend;
#  4. compute-sanitizer (memcheck) on the tiny model.
set -uo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
status=0
python3 "$SALA_ROOT/tests/cuda/e2e_goldens.py" "$SALA" "$SALA_ROOT/tests/golden" "$tmp" | tee "$OUT/e2e_goldens.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

"$SALA" init "$tmp/tiny" --preset tiny --seed 11 --dtype bf16 >/dev/null
prompt="The quick brown fox jumps over the lazy dog. Long context models keep a fixed state."
for b in cpu cuda; do
  "$SALA" generate "$tmp/tiny" "$prompt" --raw --temperature 0 --max-tokens 64 --ignore-eos --no-stream \
    --backend "$b" >"$tmp/gen_$b.txt" 2>"$tmp/gen_$b.err" || { echo "generate on $b failed"; cat "$tmp/gen_$b.err"; status=1; }
done
if cmp -s "$tmp/gen_cpu.txt" "$tmp/gen_cuda.txt"; then
  echo "greedy 64 tokens: CUDA (bf16) == CPU (f32)"
else
  echo "greedy 64 tokens: CUDA and CPU differ (bf16 vs f32 rounding):"
  python3 - "$tmp/gen_cpu.txt" "$tmp/gen_cuda.txt" <<'PY'
import sys
a, b = open(sys.argv[1]).read(), open(sys.argv[2]).read()
n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"  first difference at character {n} of {len(a)}: cpu={a[n:n+40]!r} cuda={b[n:n+40]!r}")
PY
fi
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 "$SALA" logits "$tmp/tiny" --backend cuda \
    --tokens "$(python3 -c 'print(",".join(str(5 + (i * 37) % 500) for i in range(300)))')" --prefill 280 --chunk 64 \
    --out "$tmp/san.npy" >"$tmp/san.log" 2>&1
  rc=$?
  tail -3 "$tmp/san.log"
  if [ $rc -eq 0 ]; then echo "compute-sanitizer memcheck: clean"; else echo "compute-sanitizer: rc $rc"; status=1; fi
fi
exit $status
