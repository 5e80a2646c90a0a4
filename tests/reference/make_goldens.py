"""Create (or check) the golden logits in tests/golden/ with the PyTorch reference.

  /usr/bin/python3 tests/reference/make_goldens.py --sala build/sala      # (re)create
  /usr/bin/python3 tests/reference/make_goldens.py --check                # verify committed ones

The checkpoint is made by the engine's own tool:
  sala init OUTDIR --preset tiny --config tests/golden/tiny_config.json --seed SEED --dtype f32
and copied to tests/golden/tiny/ (config.json + safetensors). Each case is written as
tests/golden/<case>/case.json + logits*.npy (float32). See tests/golden/README.md.
--python-init writes the checkpoint with tests/reference/random_model.py instead (development
only; the committed goldens must come from `sala init`).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import random_model  # noqa: E402
import sala_ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
GOLDEN = os.path.join(ROOT, "tests", "golden")
MODEL_SUBDIR = "tiny"
DEFAULT_SEED = 20260522

ROW_SEMANTICS = ("logits file row r holds the logits computed at absolute position rows[r] "
                 "(the forward pass after token tokens[rows[r]]; they predict token rows[r]+1)")

SCHEDULE_SEMANTICS = (
    "The first `prefill` tokens are processed in forward calls of `chunk` tokens (the last "
    "call may be shorter), starting from an empty cache; every later token is one decode call "
    "of one token. Prefill calls decide dense/sparse with T_regime = regime_len "
    "(null: the cache length after the call, i.e. the per-call rule); decode calls always use "
    "the per-call rule (sparse iff cache length after the call >= dense_len).")


def seq_spec(n, seed, prefill, chunk, regime="final", vocab=512):
    tokens = [int(t) for t in np.random.RandomState(seed).randint(5, vocab, size=n)]
    regime_len = prefill if regime == "final" else regime
    return {"tokens": tokens, "seed": seed, "prefill": prefill, "chunk": chunk,
            "regime_len": regime_len}


# name -> (description, [sequence specs])
def case_table():
    return [
        ("a_oneshot_40", "one-shot prefill of 40 tokens (dense regime)",
         [seq_spec(40, 101, 40, 40)]),
        ("b_prefill30_decode20", "prefill 30 tokens in one call, then 20 single-token decode "
         "steps (dense); checks lightning state and KV cache carry-over",
         [seq_spec(50, 102, 30, 30)]),
        ("c_chunked100_by7", "chunked prefill of 100 tokens in calls of 7 (dense); every call "
         "after the first is a multi-token call with a cache",
         [seq_spec(100, 103, 100, 7)]),
        ("d_sparse_prefill300_decode100", "400 tokens: prefill of 300 in one call (sparse "
         "regime because 300 >= dense_len 256), then 100 sparse decode steps; positions >= 128 "
         "(qb >= topk + window/block = 8) really drop blocks",
         [seq_spec(400, 104, 300, 300)]),
        ("e_sparse_chunked300_by64", "the first 300 tokens of case d as a chunked prefill in "
         "calls of 64 with the regime decided by the final prompt length (300): every call is "
         "sparse; must equal case d's first 300 rows",
         [dict(seq_spec(400, 104, 300, 64), tokens=seq_spec(400, 104, 300, 64)["tokens"][:300])]),
        ("f_two_sequences", "two independent sequences of 50 and 290 tokens run as one batch "
         "(`sala logits --prefill 270 --chunk 64`, a prompt is min(prefill, length)): step 1 "
         "holds seq 0's whole prompt (50 tokens, dense) and seq 1's first chunk of 64 (sparse, "
         "regime by its final prompt length 270) - per-sequence regimes in one batch; seq 1 "
         "then prefills 64+64+64+14 and decodes 20 sparse steps alone; goldens per sequence",
         [seq_spec(50, 106, 50, 64), seq_spec(290, 107, 270, 64)]),
        ("g_regime_switch_decode", "prefill 250 (dense, 250 < 256), then decode to 280 "
         "tokens: decode calls reaching T = 251..255 are dense, from T = 256 (position 255) on "
         "sparse by the per-call rule",
         [seq_spec(280, 108, 250, 250)]),
        ("h_chunked300_per_call_regime", "optional (SGLang parity, spec §4.2): chunked prefill "
         "of 300 tokens (case d's tokens) in calls of 64 with the PER-CALL regime rule "
         "(regime_len null): calls ending at T = 64, 128, 192 are dense, T = 256 and 300 sparse; "
         "equals case e below position 128 and differs from 128 on (dense attention at "
         "128..191 changes those rows and, through the caches, every later one)",
         [dict(seq_spec(300, 104, 300, 64, regime=None),
               tokens=seq_spec(400, 104, 300, 64)["tokens"][:300])]),
    ]


def run_sequence(model, spec):
    """Run one sequence with its schedule; returns (logits [n, V] float64, call end rows)."""
    toks, prefill, chunk = spec["tokens"], spec["prefill"], spec["chunk"]
    state = model.new_state()
    outs, call_last = [], []
    for s0 in range(0, prefill, chunk):
        e = min(s0 + chunk, prefill)
        outs.append(model.forward(state, toks[s0:e], regime_len=spec["regime_len"]))
        call_last.append(e - 1)
    for t in range(prefill, len(toks)):
        outs.append(model.forward(state, toks[t:t + 1]))
        call_last.append(t)
    return torch.cat(outs, 0), call_last


def stored_rows(n, call_last):
    if n <= 100:
        return list(range(n))
    return sorted(set(range(0, n, 4)) | set(call_last))


def rel_err(a, b):
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-300))


def make_checkpoint(args, outdir):
    """Create the tiny checkpoint in outdir (emptied first)."""
    cfg_path = os.path.join(GOLDEN, "tiny_config.json")
    with open(cfg_path) as f:
        want = json.load(f)
    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    if args.python_init:
        random_model.write_checkpoint(outdir, want, args.seed, dtype="F32")
        return "random_model.write_checkpoint(seed=%d) [development stand-in]" % args.seed
    tmp = tempfile.mkdtemp(prefix="sala_init_")
    try:
        init_dir = os.path.join(tmp, "ckpt")
        cmd = [args.sala, "init", init_dir, "--preset", "tiny", "--config", cfg_path,
               "--seed", str(args.seed), "--dtype", "f32"]
        print("+", " ".join(cmd))
        subprocess.check_call(cmd)
        os.makedirs(outdir)
        for fn in sorted(os.listdir(init_dir)):
            if fn == "config.json" or fn.endswith(".safetensors") or fn.endswith(".index.json"):
                shutil.copy(os.path.join(init_dir, fn), os.path.join(outdir, fn))
    finally:
        shutil.rmtree(tmp)
    # The checkpoint's config must mean the same as tiny_config.json.
    with open(os.path.join(outdir, "config.json")) as f:
        got = json.load(f)
    a, b = sala_ref.Config(want), sala_ref.Config(got)
    diffs = [k for k in vars(a) if k != "raw" and getattr(a, k) != getattr(b, k)]
    if diffs:
        raise SystemExit("sala init wrote a config that differs from tiny_config.json in: %s"
                         % ", ".join("%s (%r vs %r)" % (k, getattr(a, k), getattr(b, k))
                                     for k in diffs))
    return " ".join(["sala", "init", "OUTDIR", "--preset", "tiny", "--config",
                     "tests/golden/tiny_config.json", "--seed", str(args.seed), "--dtype", "f32"])


def compute_cases(model):
    """All cases -> {name: (description, [(spec, logits, call_last)])}, with self-checks."""
    results = {}
    for name, desc, specs in case_table():
        runs = []
        for spec in specs:
            logits, call_last = run_sequence(model, spec)
            runs.append((spec, logits, call_last))
        results[name] = (desc, runs)
    # Self-consistency checks of the reference (two independent code paths).
    def full(toks, regime_len=None):
        return model.forward_full(toks, regime_len=regime_len)
    checks = []
    for name, (desc, runs) in results.items():
        for spec, logits, _ in runs:
            toks = spec["tokens"]
            if name.startswith("h_"):
                continue
            # one-shot equivalence holds when the prefill regime is the final-length rule and
            # decode does not cross dense_len (cases a-f); g: check the dense prefill part only
            if name.startswith("g_"):
                checks.append((name + " prefill", rel_err(logits[:spec["prefill"]],
                                                          full(toks[:spec["prefill"]]))))
            else:
                checks.append((name, rel_err(logits, full(toks))))
    d = results["d_sparse_prefill300_decode100"][1][0][1]
    e = results["e_sparse_chunked300_by64"][1][0][1]
    h = results["h_chunked300_per_call_regime"][1][0][1]
    checks.append(("e == d[:300]", rel_err(e, d[:300])))
    for what, err in checks:
        if not err < 1e-9:
            raise SystemExit("reference self-check failed: %s rel err %.3g" % (what, err))
    if not float((h[128:192] - e[128:192]).abs().max()) > 1e-6:
        raise SystemExit("case h does not differ from case e at 128..191")
    if not float((h[:128] - e[:128]).abs().max() / e[:128].abs().max()) < 1e-9:
        raise SystemExit("case h differs from case e below 128")
    return results


def write_cases(results):
    for name, (desc, runs) in results.items():
        cdir = os.path.join(GOLDEN, name)
        if os.path.isdir(cdir):
            shutil.rmtree(cdir)
        os.makedirs(cdir)
        seqs = []
        for si, (spec, logits, call_last) in enumerate(runs):
            rows = stored_rows(len(spec["tokens"]), call_last)
            fn = "logits.npy" if len(runs) == 1 else "logits_%d.npy" % si
            arr = logits[rows].numpy().astype(np.float32)
            np.save(os.path.join(cdir, fn), arr)
            seqs.append({"tokens": spec["tokens"], "prefill": spec["prefill"],
                         "chunk": spec["chunk"], "regime_len": spec["regime_len"],
                         "token_seed": spec["seed"], "rows": rows,
                         "argmax": [int(x) for x in logits[rows].argmax(-1).tolist()],
                         "logits": fn})
        case = {"case": name, "description": desc, "model": MODEL_SUBDIR,
                "schedule": SCHEDULE_SEMANTICS, "row_semantics": ROW_SEMANTICS,
                "numerics": "PyTorch reference in float64, no bf16 rounding; stored as float32",
                "sequences": len(seqs), "seq": seqs}
        # Arguments of `sala logits` that replay the case: one prefill/chunk for all sequences
        # (a sequence's prompt is min(prefill, its length)).
        case["prefill"] = max(s["prefill"] for s in seqs)
        case["chunk"] = max(s["chunk"] for s in seqs)
        case["regime"] = "per-call" if seqs[0]["regime_len"] is None else "final"
        for sq in seqs:  # the tool's rule reproduces every sequence's schedule
            assert sq["prefill"] == min(case["prefill"], len(sq["tokens"]))
            assert sq["chunk"] == case["chunk"] or sq["prefill"] <= case["chunk"]
            assert sq["regime_len"] == (None if case["regime"] == "per-call" else sq["prefill"])
        if len(seqs) == 1:  # flat copy of the single sequence's fields
            case.update({k: seqs[0][k] for k in ("tokens", "prefill", "chunk", "regime_len",
                                                 "rows", "logits")})
        with open(os.path.join(cdir, "case.json"), "w") as f:
            json.dump(case, f, indent=1)
            f.write("\n")


README = """# Golden logits (CPU parity tests)

Generated by `tests/reference/make_goldens.py` with the independent PyTorch reference
`tests/reference/sala_ref.py` (written from `shared/spec/minicpm-sala.md`). Do not edit by hand.

* Date: {date}
* Command: `/usr/bin/python3 tests/reference/make_goldens.py {cmd}`
* Checkpoint `tiny/` (config.json + model.safetensors, f32, RANDOM weights) made by:
  `{made_by}`
  from `tiny_config.json` (vocab 512, hidden 64, intermediate 128, 4 layers
  S L L S, 4 heads, 2 KV heads, head_dim 16, lightning 4/4/16, sparse_config block 16,
  kernel 8/4 (K2 32/16), window 64 (W = 4 local blocks), topk 4 (budget K = 8 blocks),
  init_blocks 1, dense_len 256).
* Reference numerics: float64 everywhere, no bf16 rounding; RoPE inv_freq and angle in fp32,
  slopes stored as fp32 (spec §3.3, §3.5). Logits stored as float32. Compare the f32 CPU
  engine at relative error < 1e-4 (suggested measure: max |diff| / max |golden|).
* Verify freshness: `/usr/bin/python3 tests/reference/make_goldens.py --check`
  (also run by `tests/reference/test_goldens.py`).
* Compare an engine build: `/usr/bin/python3 tests/reference/compare_engine.py --sala build/sala`
  (replays every case with `sala logits`, prints rel error and argmax mismatches per case).

## Files of a case

`<case>/case.json`:

* `seq`: list of sequences (one per independent sequence); each has `tokens` (seeded RNG,
  ids in [5, 512)), `prefill` (prompt tokens), `chunk` (prefill call size), `regime_len`
  (T used for the dense/sparse decision of every prefill call; `null` = per-call rule),
  `rows` (absolute positions of the stored logits rows), `argmax` (argmax of each stored
  row), `logits` (the .npy file, float32 `[len(rows), 512]`).
* Single-sequence cases repeat `tokens`, `prefill`, `chunk`, `regime_len`, `rows`, `logits`
  at top level. `prefill`, `chunk`, `regime` (`final` / `per-call`) at top level are the
  arguments of `sala logits MODEL --tokens ... --prefill P --chunk C --regime R`, which
  replays every case (a sequence's prompt is min(P, its length)).
* Schedule: {schedule}
* Rows: {rows}. Cases with at most 100 tokens store every row; longer ones every 4th
  position plus the last position of every forward call (so every decode step).

## Cases

{cases}
"""


def write_readme(made_by, seed, sala=None):
    cmd = "--python-init" if sala is None else "--sala " + os.path.relpath(sala, ROOT)
    if seed != DEFAULT_SEED:
        cmd += " --seed %d" % seed
    cases = "\n".join("* `%s`: %s." % (n, d) for n, d, _ in case_table())
    text = README.format(date=time.strftime("%Y-%m-%d", time.gmtime()), cmd=cmd,
                         made_by=made_by, schedule=SCHEDULE_SEMANTICS, rows=ROW_SEMANTICS,
                         cases=cases)
    with open(os.path.join(GOLDEN, "README.md"), "w") as f:
        f.write(text)


def git_head():
    try:
        return subprocess.check_output(["git", "-C", ROOT, "rev-parse", "HEAD"],
                                       stderr=subprocess.DEVNULL, universal_newlines=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def check_committed(tol):
    """Recompute every committed case from the committed checkpoint; compare."""
    model = sala_ref.Model(os.path.join(GOLDEN, MODEL_SUBDIR))
    names = [n for n, _, _ in case_table()]
    worst = 0.0
    for name in names:
        with open(os.path.join(GOLDEN, name, "case.json")) as f:
            case = json.load(f)
        for seq in case["seq"]:
            logits, _ = run_sequence(model, seq)
            want = np.load(os.path.join(GOLDEN, name, seq["logits"]))
            got = logits[seq["rows"]].numpy()
            err = float(np.abs(got - want).max() / np.abs(want).max())
            worst = max(worst, err)
            if not err < tol:
                raise SystemExit("golden %s/%s is stale: rel err %.3g" % (name, seq["logits"], err))
    print("all %d golden cases reproduce (worst rel err %.2g)" % (len(names), worst))


def main():
    global GOLDEN
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sala", help="path to the sala binary (for `sala init`)")
    ap.add_argument("--python-init", action="store_true",
                    help="write the checkpoint with random_model.py instead of `sala init`")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--check", action="store_true",
                    help="only verify that the committed goldens reproduce")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--out", default=GOLDEN, help="golden directory (default tests/golden)")
    args = ap.parse_args()
    if os.path.abspath(args.out) != GOLDEN:
        os.makedirs(args.out, exist_ok=True)
        src = os.path.join(GOLDEN, "tiny_config.json")
        GOLDEN = os.path.abspath(args.out)
        if not os.path.exists(os.path.join(GOLDEN, "tiny_config.json")):
            shutil.copy(src, GOLDEN)
    torch.set_num_threads(1)  # tiny ops: threads only add overhead
    if args.check:
        check_committed(args.tol)
        return
    if not args.sala and not args.python_init:
        ap.error("--sala PATH (or --python-init for development) is required")
    made_by = make_checkpoint(args, os.path.join(GOLDEN, MODEL_SUBDIR))
    model = sala_ref.Model(os.path.join(GOLDEN, MODEL_SUBDIR))
    results = compute_cases(model)
    write_cases(results)
    with open(os.path.join(GOLDEN, "MANIFEST.json"), "w") as f:
        json.dump({"made_by": "tests/reference/make_goldens.py",
                   "checkpoint": made_by,
                   "seed": args.seed,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "sala_binary": None if args.python_init else os.path.relpath(
                       os.path.abspath(args.sala), ROOT),
                   "source_commit": git_head(),
                   "torch": torch.__version__, "numpy": np.__version__,
                   "cases": [n for n, _, _ in case_table()]}, f, indent=1)
        f.write("\n")
    write_readme(made_by, args.seed, None if args.python_init else os.path.abspath(args.sala))
    total = 0
    for dp, _, fns in os.walk(GOLDEN):
        total += sum(os.path.getsize(os.path.join(dp, fn)) for fn in fns)
    print("goldens written to %s (%.2f MB in total)" % (GOLDEN, total / 1e6))


if __name__ == "__main__":
    main()
