#!/usr/bin/env bash
# The one script for the GPU machine. Run from the repository root:
#   scripts/device.sh            (OUT=dir for logs and JSON; default ./out)
# Configures (Release, Ninja, CUDA arch 90a, vendored headers from .carry/include when present),
# builds, runs the CUDA parity tests (sala_cuda_tests), the kernel benchmarks, then — when they
# exist — the end-to-end GPU checks (tests/cuda/e2e_*.sh, run with $SALA and $SALA_ROOT set) and
# `sala bench` (arguments from $SALA_BENCH_ARGS, time limit $SALA_BENCH_TIMEOUT s (300); default: random 9B
# weights, contexts 1k-32k), the quantized rows (quant-bench: `sala bench --compare` of every format against bf16 at 4K,
# batch 1, three interleaved rounds; then fp8, int8, int4, int4 g128 + lm_head at 4K/32K, batches 1/8/32),
# the quality of the packed formats on the 9B shape (quant-quality: `sala quant-quality`, random
# weights, lm_head kept / quantized), the packed prompt GEMM (qgemm: its kernel table, and decode batches of 128 and
# 256 sequences with it off / on; SALA_QGEMM_RUNS="FORMAT:MODE ...", SALA_QGEMM_BATCHES and SALA_QGEMM_STEPS
# choose others), prefill of bf16 against the packed formats, weight-only and W8A8 (quant-prefill: warm
# medians of 5 per context; SALA_QPREFILL_RUNS="FORMAT[+w8a8] ..."), the speculative verify/draft costs (spec-costs) and the serving benchmark (serve-bench:
# scripts/serve_bench.sh, 9B random, concurrency 1/8/32). Missing optional steps are skipped with a message.
# A short summary table is printed last. Steps can be chosen with
#   SALA_DEVICE_STEPS="build test bench product-floor e2e sala-bench quant-bench quant-quality qgemm quant-prefill decode-fusion kernel-timeline spec-costs serve-bench"
#   (default: all but product-floor, quant-quality, qgemm, quant-prefill, decode-fusion, kernel-timeline). product-floor:
#   `sala_cuda_tests --bench` with SALA_BENCH_ONLY=stream-floor (one 9B token's weight bytes streamed over its products
#   by loads alone) and =ring (the int4 / fp8 products on the register GEMV, the ring GEMV and its loads alone). kernel-timeline: batch-1 decode
#   at 4K with `sala bench --kernel-trace` (which kernels the step waits on), per format; SALA_TIMELINE_RUNS="FORMAT[+lm] ...";
#   every launch in kernels-FORMAT[-lm].csv (tools/kernel_steps.py reads it).
#   decode-fusion: batch-1 decode at 4K with the
#   mixers' small ops fused (default: lightning q/k norms in the GLA launch, sparse output gate in the attention
#   stores) and as their own launches (SALA_CUDA_MIXER_FUSION=0), per format; SALA_FUSION_RUNS="FORMAT[+lm]:0|1 ...".
# Exit status: non-zero if the build or any run step failed.
set -uo pipefail
ROOT=$(pwd)
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
BUILD=${BUILD:-$ROOT/build-device}
ARCH=${SALA_CUDA_ARCH:-90a}
STEPS=${SALA_DEVICE_STEPS:-build test bench e2e sala-bench quant-bench spec-costs serve-bench}
JOBS=$(nproc 2>/dev/null || echo 8)
declare -a SUMMARY=()
FAILED=0

want() { [[ " $STEPS " == *" $1 "* ]]; }
note() { SUMMARY+=("$(printf '%-12s %-8s %6s  %s' "$1" "$2" "$3" "$4")"); }

# run NAME LOG CMD... : runs CMD with output to LOG (and the terminal), records status and time.
run() {
  local name=$1 log=$2
  shift 2
  local t0=$SECONDS
  echo "=== $name: $*" | tee -a "$log"
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  local dt=$((SECONDS - t0))
  LAST_RC=$rc
  LAST_DT=$dt
  return $rc
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null ||
    echo "nvidia-smi: not available"
  nvcc --version 2>/dev/null | tail -1
  echo "git: $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) changed files"
} | tee "$OUT/summary.txt"

# ---- configure + build ----
if want build; then
  VENDOR_ARGS=()
  [ -d "$ROOT/.carry/include" ] && VENDOR_ARGS=(-DSALA_VENDOR_INCLUDE="$ROOT/.carry/include")
  if run configure "$OUT/build.log" cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSALA_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${VENDOR_ARGS[@]}"; then
    note configure ok "$LAST_DT" "arch $ARCH"
    run build "$OUT/build.log" ninja -C "$BUILD" -j "$JOBS" sala_cuda_tests
    if [ "$LAST_RC" -eq 0 ]; then
      note build ok "$LAST_DT" "sala_cuda_tests"
      # The CLI is optional for the kernel checks: a failure here is reported, not fatal.
      if run build-sala "$OUT/build.log" ninja -C "$BUILD" -j "$JOBS" sala; then
        note build-sala ok "$LAST_DT" "sala"
      else
        note build-sala FAIL "$LAST_DT" "see build.log"
        FAILED=1
      fi
    else
      note build FAIL "$LAST_DT" "see build.log"
      FAILED=1
    fi
  else
    note configure FAIL "$LAST_DT" "see build.log"
    FAILED=1
  fi
fi

TESTS="$BUILD/tests/cuda/sala_cuda_tests"
SALA="$BUILD/sala"

# ---- CUDA parity tests ----
if want test; then
  if [ -x "$TESTS" ]; then
    run test "$OUT/cuda_tests.log" timeout 400 "$TESTS"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/cuda_tests.log" | tail -1)
    if [ "$LAST_RC" -eq 0 ]; then note test ok "$LAST_DT" "$line"; else note test FAIL "$LAST_DT" "${line:-rc $LAST_RC}"; FAILED=1; fi
  else
    note test skipped 0 "no $TESTS"
  fi
fi

# ---- kernel benchmarks ----
if want bench; then
  if [ -x "$TESTS" ]; then
    run bench "$OUT/bench.log" timeout 300 "$TESTS" --bench --json "$OUT/bench.json"
    if [ "$LAST_RC" -eq 0 ]; then note bench ok "$LAST_DT" "bench.json"; else note bench FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
  else
    note bench skipped 0 "no $TESTS"
  fi
fi

# ---- the products' floor and the ring GEMV (optional: SALA_BENCH_ONLY=stream-floor, =ring) ----
if want product-floor; then
  if [ -x "$TESTS" ]; then
    for section in stream-floor ring; do
      run "$section" "$OUT/product_floor.log" env SALA_BENCH_ONLY=$section timeout 200 "$TESTS" --bench
      if [ "$LAST_RC" -eq 0 ]; then note "$section" ok "$LAST_DT" "product_floor.log"
      else note "$section" FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
    done
  else
    note product-floor skipped 0 "no $TESTS"
  fi
fi

# ---- end-to-end GPU checks (added by the model/engine owners) ----
if want e2e; then
  shopt -s nullglob
  e2e=("$ROOT"/tests/cuda/e2e_*.sh)
  shopt -u nullglob
  if [ ${#e2e[@]} -eq 0 ]; then
    echo "e2e: no tests/cuda/e2e_*.sh yet — skipped"
    note e2e skipped 0 "no tests/cuda/e2e_*.sh"
  elif [ ! -x "$SALA" ]; then
    note e2e skipped 0 "no sala binary"
  else
    for s in "${e2e[@]}"; do
      n=$(basename "$s" .sh)
      SALA="$SALA" SALA_ROOT="$ROOT" OUT="$OUT" run "$n" "$OUT/e2e.log" timeout 300 bash "$s"
      if [ "$LAST_RC" -eq 0 ]; then note "$n" ok "$LAST_DT" ""; else note "$n" FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
    done
  fi
fi

# ---- sala bench ----
if want sala-bench; then
  if [ -x "$SALA" ] && "$SALA" --help 2>&1 | grep -qE '^[[:space:]]+bench([[:space:]]|$)'; then
    # shellcheck disable=SC2086
    run sala-bench "$OUT/sala_bench.log" timeout "${SALA_BENCH_TIMEOUT:-300}" "$SALA" bench ${SALA_BENCH_ARGS:---random 9b --backend cuda --contexts 1k,8k,32k --batches 1,8 --decode-steps 8 --json $OUT/sala_bench.json}
    if [ "$LAST_RC" -eq 0 ]; then note sala-bench ok "$LAST_DT" "sala_bench.log"; else note sala-bench FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
  else
    echo "sala-bench: no 'sala bench' command yet — skipped"
    note sala-bench skipped 0 "no 'sala bench' command"
  fi
fi

# ---- quantized rows, speculative costs, serving (issues #8, #9, #7) ----
have_bench() { [ -x "$SALA" ] && "$SALA" --help 2>&1 | grep -qE '^[[:space:]]+bench([[:space:]]|$)'; }
if want quant-bench; then
  if have_bench; then
    # Issue #8's table: batch-1 prefill and decode at 4K of every format against bf16, interleaved rounds.
    run "quant-compare" "$OUT/quant_bench.log" timeout 400 "$SALA" bench --random 9b --backend cuda \
      --compare bf16,fp8+lm,fp8+lm+w8a8,int8+lm,int8+lm+w8a8,int8/g64+lm,int4+lm,int4+lm+w8a8,int4/g128+lm \
      --contexts 4k --decode-steps 32 --rounds 3 \
      --json "$OUT/quant-compare.json"
    if [ "$LAST_RC" -eq 0 ]; then note "quant-compare" ok "$LAST_DT" "quant-compare.json"; else note "quant-compare" FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
    for q in fp8 int8 int4; do
      run "quant-$q" "$OUT/quant_bench.log" timeout 300 "$SALA" bench --random 9b --backend cuda --quant "$q" \
        --contexts 4k,32k --batches 1,8,32 --decode-steps 32 --json "$OUT/quant-$q.json"
      if [ "$LAST_RC" -eq 0 ]; then note "quant-$q" ok "$LAST_DT" "quant-$q.json"; else note "quant-$q" FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
    done
    # The fastest 4-bit model: int4 in groups of 128 with lm_head packed too (docs/quantization.md).
    run "quant-int4-g128" "$OUT/quant_bench.log" timeout 300 "$SALA" bench --random 9b --backend cuda --quant int4 \
      --quant-group 128 --quant-lm-head --contexts 4k,32k --batches 1,8,32 --decode-steps 32 --json "$OUT/quant-int4-g128-lm.json"
    if [ "$LAST_RC" -eq 0 ]; then note "quant-i4g128" ok "$LAST_DT" "quant-int4-g128-lm.json"; else note "quant-i4g128" FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
    # fp8 with a weight-only prompt (--no-fp8-prefill; the rows above run it on fp8 tensor cores, the
    # default there): the prefill column is the point.
    run "quant-fp8-wo" "$OUT/quant_bench.log" timeout 300 "$SALA" bench --random 9b --backend cuda --quant fp8 \
      --no-fp8-prefill --contexts 4k,32k --batches 1 --decode-steps 32 --json "$OUT/quant-fp8-weight-only.json"
    if [ "$LAST_RC" -eq 0 ]; then note "quant-fp8-wo" ok "$LAST_DT" "quant-fp8-weight-only.json"; else note "quant-fp8-wo" FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
  else
    note quant-bench skipped 0 "no sala binary"
  fi
fi
# Quality of the packed formats on the full 9B shape (random weights): the dense bf16 model's
# logits against each format's, 10240 positions (sparse regime), lm_head kept and quantized (fp8's
# prompt chunks on fp8 tensor cores, the default here), and fp8 weight-only (--no-fp8-prefill).
if want quant-quality; then
  if [ -x "$SALA" ]; then
    for variant in ":fp8,int8,int4" "--lm-head:fp8,int8,int4" "--no-fp8-prefill:fp8"; do
      flag=${variant%%:*} formats=${variant#*:}
      tag=quant-quality${flag:+-${flag#--}}
      run "$tag" "$OUT/$tag.log" timeout 400 "$SALA" quant-quality --random 9b --backend cuda $flag \
        --formats "$formats" --positions 10240 --chunk 2048 --decode 64 --json "$OUT/$tag.json"
      if [ "$LAST_RC" -eq 0 ]; then note "$tag" ok "$LAST_DT" "$tag.json"; else note "$tag" FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
    done
  else
    note quant-quality skipped 0 "no sala binary"
  fi
fi
if want spec-costs; then
  if have_bench; then
    run spec-costs "$OUT/spec_costs.log" timeout 300 "$SALA" bench --random 9b --backend cuda --speculative-costs \
      --contexts 4k,32k --decode-steps 16 --json "$OUT/spec-costs.json"
    if [ "$LAST_RC" -eq 0 ]; then note spec-costs ok "$LAST_DT" "spec-costs.json"; else note spec-costs FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
  else
    note spec-costs skipped 0 "no sala binary"
  fi
fi
if want serve-bench; then
  if [ -x "$SALA" ]; then
    SALA="$SALA" OUT="$OUT" run serve-bench "$OUT/serve_bench.log" timeout 400 bash "$ROOT/scripts/serve_bench.sh"
    if [ "$LAST_RC" -eq 0 ]; then note serve-bench ok "$LAST_DT" "serve-bench.json"; else note serve-bench FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
  else
    note serve-bench skipped 0 "no sala binary"
  fi
fi

# ---- packed prompt GEMM (quant_gemm.cu): per-kernel table, then batched packed decode with it off / on ----
if want qgemm; then
  if [ -x "$TESTS" ]; then
    run qgemm-kernels "$OUT/qgemm.log" env SALA_BENCH_ONLY=qgemm timeout 200 "$TESTS" --bench
    if [ "$LAST_RC" -eq 0 ]; then note qgemm-kern ok "$LAST_DT" "qgemm.log"; else note qgemm-kern FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
  fi
  if have_bench; then
    for q in ${SALA_QGEMM_RUNS:-none:- fp8:0 fp8:1 int4:0 int4:1}; do  # FORMAT:SALA_CUDA_QGEMM
      fmt=${q%%:*} mode=${q##*:}
      [ "$mode" = - ] && mode=1
      run "qgemm-$fmt-$mode" "$OUT/qgemm.log" env SALA_CUDA_QGEMM="$mode" timeout 200 "$SALA" bench --random 9b \
        --backend cuda --quant "$fmt" --no-fp8-prefill --contexts 1k --batches ${SALA_QGEMM_BATCHES:-128,256} --batch-context 512 --decode-steps ${SALA_QGEMM_STEPS:-8} \
        --json "$OUT/qgemm-$fmt-$mode.json"
      if [ "$LAST_RC" -eq 0 ]; then note "qgemm-$fmt-$mode" ok "$LAST_DT" "SALA_CUDA_QGEMM=$mode"; else note "qgemm-$fmt-$mode" FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
    done
  fi
fi

# ---- prefill A/B, bf16 against packed weights: warm, median of 5 prefills per context ----
if want quant-prefill; then
  if have_bench; then
    # FORMAT+w8a8: with the format's W8A8 prefill flag (--fp8-prefill for fp8, --int8-prefill otherwise);
    # FORMAT alone: weight-only (fp8: --no-fp8-prefill)
    for q in ${SALA_QPREFILL_RUNS:-none fp8 fp8+w8a8 int8 int8+w8a8 int4 int4+w8a8 none}; do
      fmt=${q%+w8a8}; w8a8=()
      [ "$fmt" = fp8 ] && w8a8=(--no-fp8-prefill)
      [ "$fmt" != "$q" ] && { [ "$fmt" = fp8 ] && w8a8=(--fp8-prefill) || w8a8=(--int8-prefill); }
      run "qprefill-$q" "$OUT/quant_prefill.log" timeout 200 "$SALA" bench --random 9b --backend cuda --quant "$fmt" \
        "${w8a8[@]}" ${SALA_QPREFILL_ARGS:---contexts 4k,16k --batches 1 --decode-steps 4 --prefill-reps 5} \
        --json "$OUT/qprefill-${q/+/-}-$SECONDS.json"
      if [ "$LAST_RC" -eq 0 ]; then note "qprefill-$q" ok "$LAST_DT" ""; else note "qprefill-$q" FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
    done
  fi
fi

# ---- decode at batch 1, 4K: the mixers' small ops fused (default) against their own launches
# (SALA_CUDA_MIXER_FUSION=0), each pair on the same machine ----
if want decode-fusion; then
  if have_bench; then
    for q in ${SALA_FUSION_RUNS:-none:0 none:1 fp8:0 fp8:1 int8:0 int8:1 int4:0 int4:1 fp8+lm:1 int8+lm:1 int4+lm:1 none:1}; do
      fmt=${q%%:*} fuse=${q##*:} lm=()
      [ "${fmt%+lm}" != "$fmt" ] && { lm=(--quant-lm-head); fmt=${fmt%+lm}; }
      run "fusion-$q" "$OUT/decode_fusion.log" env SALA_CUDA_MIXER_FUSION="$fuse" timeout 200 "$SALA" bench --random 9b \
        --backend cuda --quant "$fmt" "${lm[@]}" --contexts 4k --batches 1 --decode-steps 32 \
        --json "$OUT/fusion.json"
      if [ "$LAST_RC" -eq 0 ]; then  # the decode figure in the summary table (few files come back from a device run)
        note "fusion-$q" ok "$LAST_DT" "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["rows"][0]; print("%.2f ms/step, %.1f tok/s" % (r["decode_ms_per_step"], r["decode_tok_s"]))' "$OUT/fusion.json")"
      else note "fusion-$q" FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
    done
  fi
fi

if want kernel-timeline; then
  if have_bench; then
    for q in ${SALA_TIMELINE_RUNS:-none fp8 fp8+lm int8 int4}; do
      fmt=${q%+lm} lm=()
      [ "$fmt" != "$q" ] && lm=(--quant-lm-head)
      run "timeline-$q" "$OUT/kernel_timeline.log" timeout 200 "$SALA" bench --random 9b --backend cuda --quant "$fmt" \
        "${lm[@]}" --contexts 4k --batches 1 --decode-steps 32 --kernel-trace --kernel-trace-csv "$OUT/kernels-${q/+/-}.csv"
      if [ "$LAST_RC" -eq 0 ]; then
        note "timeline-$q" ok "$LAST_DT" "$(grep '^kernel timeline' "$OUT/kernel_timeline.log" | tail -1 | grep -o 'device [0-9.]* us/step')"
      else note "timeline-$q" FAIL "$LAST_DT" "rc $LAST_RC"; FAILED=1; fi
    done
  fi
fi

# ---- summary (last) ----
{
  echo
  if [ -f "$OUT/kernel_timeline.log" ]; then  # the tables themselves: few files come back from a device run
    echo "--- kernel timelines (kernel_timeline.log) ---"
    grep -E '^=== |^kernel timeline|^  ' "$OUT/kernel_timeline.log" | sed 's/^/  /'
  fi
  if [ -f "$OUT/product_floor.log" ]; then
    echo "--- the products' floor and the ring GEMV (product_floor.log) ---"
    grep -E 'ms .*TB/s|us .*GB/s' "$OUT/product_floor.log" | sed 's/^/  /'
  fi
  if [ -f "$OUT/bench.log" ]; then
    echo "--- kernel benchmarks (bench.log) ---"
    grep -E 'us .*GB/s' "$OUT/bench.log" | sed 's/^/  /'
  fi
  if [ -f "$OUT/cuda_tests.log" ]; then
    fails=$(grep -c '^\[FAIL\]' "$OUT/cuda_tests.log")
    if [ "$fails" -gt 0 ]; then
      echo "--- failed checks ---"
      grep '^\[FAIL\]' "$OUT/cuda_tests.log" | head -30 | sed 's/^/  /'
    fi
  fi
  echo "--- summary ---"
  printf '%-12s %-8s %6s  %s\n' step status secs detail
  for l in "${SUMMARY[@]}"; do echo "$l"; done
} | tee -a "$OUT/summary.txt"
exit $FAILED
