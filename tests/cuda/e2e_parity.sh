#!/usr/bin/env bash
# End to end on the GPU (run by scripts/device.sh with $SALA, $SALA_ROOT, $OUT):
#  1. the tiny golden cases through the CUDA backend vs the PyTorch reference goldens
#     (bf16 tolerance, top-1 agreement >= 99%);
#  2. prefill+decode vs one-shot and batch vs single on the CUDA backend;
#  3. greedy generation of 64 tokens on CUDA vs the f32 CPU backend;
#  4. compute-sanitizer (memcheck) on the tiny model;
#  5. fp8's default prefill (W8A8 on fp8 tensor cores) against the CPU's and the weight-only one.
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
# 5. fp8 checkpoints prefill on fp8 tensor cores by default (W8A8, the CLI's choice where the GPU has
#    them), --no-fp8-prefill keeps the prompt weight-only; the CUDA W8A8 logits track the CPU's
#    (--fp8-prefill there) and the weight-only ones stay close.
"$SALA" quantize "$tmp/tiny" "$tmp/tiny-fp8" --format fp8 --quiet >/dev/null || { echo "quantize fp8 failed"; status=1; }
toks=$(python3 -c 'print(",".join(str(5 + (i * 53) % 500) for i in range(130)))')
"$SALA" logits "$tmp/tiny-fp8" --backend cuda --tokens "$toks" --out "$tmp/fp8_gpu.npy" 2>"$tmp/fp8_gpu.err" &&
  "$SALA" logits "$tmp/tiny-fp8" --backend cuda --no-fp8-prefill --tokens "$toks" --out "$tmp/fp8_gpu_wo.npy" 2>"$tmp/fp8_gpu_wo.err" &&
  "$SALA" logits "$tmp/tiny-fp8" --backend cpu --fp8-prefill --tokens "$toks" --out "$tmp/fp8_cpu.npy" 2>/dev/null &&
  "$SALA" logits "$tmp/tiny-fp8" --backend cpu --tokens "$toks" --out "$tmp/fp8_cpu_wo.npy" 2>/dev/null ||
  { echo "fp8 logits failed"; cat "$tmp"/fp8_gpu*.err; status=1; }
grep -q "fp8 prefill: on by default" "$tmp/fp8_gpu.err" || { echo "fp8 default: no note: $(cat "$tmp/fp8_gpu.err")"; status=1; }
grep -q "fp8 prefill: off (weight-only" "$tmp/fp8_gpu_wo.err" || { echo "--no-fp8-prefill: no note: $(cat "$tmp/fp8_gpu_wo.err")"; status=1; }
python3 - "$tmp" <<'PY' || status=1
import sys, numpy as np
t = sys.argv[1]
gpu, wo, cpu, cpu_wo = (np.load(f"{t}/{n}.npy").astype(np.float64) for n in ("fp8_gpu", "fp8_gpu_wo", "fp8_cpu", "fp8_cpu_wo"))
rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)
top1 = lambda a, b: float(np.mean(a.argmax(-1) == b.argmax(-1)))
# bf16 (CUDA) against f32 (CPU) activations: the weight-only pair sets the scale of the difference;
# e4m3 rounding of slightly different activations adds to it, a broken W8A8 path would not be near.
base, r_cpu, r_wo = rel(wo, cpu_wo), rel(gpu, cpu), rel(gpu, wo)
print(f"fp8 default prefill (W8A8) on CUDA vs CPU --fp8-prefill: rel {r_cpu:.3e}, top-1 {top1(gpu, cpu):.3f} "
      f"(weight-only CUDA vs CPU: rel {base:.3e}, top-1 {top1(wo, cpu_wo):.3f}); "
      f"vs CUDA --no-fp8-prefill: rel {r_wo:.3e}, top-1 {top1(gpu, wo):.3f}")
ok = r_cpu < 0.1 and top1(gpu, cpu) >= 0.85 and 0 < r_wo < 0.3 and top1(gpu, wo) >= 0.5
sys.exit(0 if ok else 1)
PY

if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 "$SALA" logits "$tmp/tiny" --backend cuda \
    --tokens "$(python3 -c 'print(",".join(str(5 + (i * 37) % 500) for i in range(300)))')" --prefill 280 --chunk 64 \
    --out "$tmp/san.npy" >"$tmp/san.log" 2>&1
  rc=$?
  tail -3 "$tmp/san.log"
  if [ $rc -eq 0 ]; then echo "compute-sanitizer memcheck: clean"; else echo "compute-sanitizer: rc $rc"; status=1; fi
fi
exit $status
