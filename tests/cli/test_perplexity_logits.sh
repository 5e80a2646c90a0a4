#!/usr/bin/env bash
# `sala perplexity` against an independent computation from `sala logits` (issue #10): the text is
# tokenized with `sala tokenize` (the same ids `sala perplexity` scores: BOS + the file's bytes), the
# windows of the Hugging Face sliding-window recipe are derived here in Python, each window's ids
# go through `sala logits` on a fresh sequence, and numpy computes log-softmax and the mean
# negative log-likelihood of every scored next token. The result must equal the JSON of
# `sala perplexity` on the same file:
#   * same prefill chunks on both sides (--chunk C): the same f32 forwards, so the logits are
#     bit-identical and only the summation (C++ double vs numpy float64) could differ: rel. diff
#     < 1e-9 (measured: 0);
#   * whole-window forwards for `sala logits` vs chunks of C for `sala perplexity`: other f32 GEMM
#     shapes and accumulation orders, so the logits differ in their last bits (f32 eps 6e-8, grown
#     by the depth of the model), and the mean over ~340 tokens averages that out: rel. diff of
#     nll and ppl < 1e-6 (measured: ~2e-9; the f32 CPU path would justify up to 1e-4).
# Cases: overlapping windows (stride < ctx, every token after the first scored once) and disjoint
# windows (stride == ctx, each window's first token unscored), with a short last window.
source "$(dirname "$0")/common.sh"

$SALA init "$tmp/m" --preset tiny --seed 1 >/dev/null
for i in $(seq 1 6); do echo "The river town woke slowly in the early spring, and boats drifted past the bridge."; done >"$tmp/t.txt"
printf 'Nobody was in a hurry; the days followed one another like a mill wheel.' >>"$tmp/t.txt"  # no final newline

# Token ids of the exact file content (a JSON string per line keeps newlines and the missing final one).
/usr/bin/python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1], encoding="utf-8").read()))' "$tmp/t.txt" \
  >"$tmp/t.jsonl"
$SALA tokenize "$tmp/m" --jsonl "$tmp/t.jsonl" >"$tmp/ids.json" || fail "tokenize failed"

check() {  # ctx stride perplexity-chunk logits-chunk(0 = whole window) tolerance
  local ctx=$1 stride=$2 chunk=$3 lchunk=$4 tol=$5 tag=$1-$2-$3-$4
  $SALA perplexity "$tmp/m" "$tmp/t.txt" --ctx "$ctx" --stride "$stride" --chunk "$chunk" --backend cpu -t 2 \
    --json "$tmp/p-$tag.json" >/dev/null 2>"$tmp/err" || fail "perplexity $tag: $(cat "$tmp/err")"
  /usr/bin/python3 - "$SALA" "$tmp" "$tag" "$ctx" "$stride" "$lchunk" "$tol" <<'PY' || fail "perplexity vs logits ($tag)"
import json, math, subprocess, sys
import numpy as np

sala, tmp, tag = sys.argv[1:4]
ctx, stride, lchunk = (int(x) for x in sys.argv[4:7])
tol = float(sys.argv[7])
ids = json.load(open(f"{tmp}/ids.json"))
res = json.load(open(f"{tmp}/p-{tag}.json"))
n = len(ids)
assert res["text_tokens"] == n, ("perplexity tokenized differently", res["text_tokens"], n)
assert n > ctx, "the text must need several windows"

# The HF recipe (transformers docs, "Perplexity of fixed-length models"): windows of ctx tokens
# every stride tokens; a window scores its last (end - prev_end) targets, labels shifted by one, so
# its first token never is a target.
nll_sum, scored, windows, prev_end = 0.0, 0, 0, 0
for begin in range(0, n, stride):
    end = min(begin + ctx, n)
    first_target = max(prev_end, begin + 1)
    if first_target < end:
        window = ids[begin:end]
        out = f"{tmp}/w.npy"
        cmd = [sala, "logits", f"{tmp}/m", "--tokens", ",".join(map(str, window)), "--out", out, "--backend", "cpu", "-t", "2"]
        if lchunk > 0:
            cmd += ["--chunk", str(lchunk)]
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
        logits = np.load(out).astype(np.float64)
        assert logits.shape[0] == len(window), logits.shape
        m = logits.max(axis=1, keepdims=True)
        logp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
        for t in range(first_target, end):  # target t is predicted by the row of t - 1
            nll_sum -= logp[t - 1 - begin, ids[t]]
            scored += 1
        windows += 1
    prev_end = end
    if end == n:
        break
nll = nll_sum / scored
ppl = math.exp(nll)
expect_scored = n - 1 if stride < ctx else n - windows
assert scored == expect_scored, (scored, expect_scored)
assert res["tokens"] == scored, ("scored tokens", res["tokens"], scored)
assert res["windows"] == windows, ("windows", res["windows"], windows)
rel_nll = abs(res["nll"] - nll) / nll
rel_ppl = abs(res["ppl"] - ppl) / ppl
print(f"ctx {ctx} stride {stride} logits chunk {lchunk or 'window'}: {windows} windows, {scored} tokens; "
      f"sala ppl {res['ppl']:.6f} numpy ppl {ppl:.6f}; rel diff nll {rel_nll:.2e} ppl {rel_ppl:.2e} (tol {tol:g})")
assert rel_nll < tol and rel_ppl < tol, (res["nll"], nll, res["ppl"], ppl)
PY
}

# Overlapping windows, same chunks on both sides: bit-identical logits.
check 64 24 16 16 1e-9
# Disjoint windows (stride == ctx), the last one shorter.
check 100 100 32 32 1e-9
# Different chunking (f32 rounding differs): the CPU f32 path's tolerance.
check 64 24 16 0 1e-6
echo "perplexity vs logits: ok"
