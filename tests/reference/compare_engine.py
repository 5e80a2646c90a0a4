"""Replay every golden case with the engine's `sala logits` and compare with the goldens.

  /usr/bin/python3 tests/reference/compare_engine.py --sala build/sala [--golden tests/golden]
      [--tol 1e-4] [-- extra sala logits args, e.g. --backend cpu]

Per case and sequence: rel = max |engine - golden| / max |golden| over the stored rows, and
the number of stored rows whose argmax differs. Exit status 1 if any rel >= tol.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(os.path.dirname(HERE), "golden")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sala", required=True)
    ap.add_argument("--golden", default=GOLDEN)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("extra", nargs="*", help="extra arguments for `sala logits`")
    args = ap.parse_args()
    with open(os.path.join(args.golden, "MANIFEST.json")) as f:
        names = json.load(f)["cases"]
    worst, failed = 0.0, []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            cdir = os.path.join(args.golden, name)
            with open(os.path.join(cdir, "case.json")) as f:
                case = json.load(f)
            out = os.path.join(tmp, name + ".npy")
            cmd = [args.sala, "logits", os.path.join(args.golden, case["model"])]
            for sq in case["seq"]:
                cmd += ["--tokens", ",".join(str(t) for t in sq["tokens"])]
            cmd += ["--prefill", str(case["prefill"]), "--chunk", str(case["chunk"]),
                    "--regime", case["regime"], "--out", out] + args.extra
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True)
            if r.returncode != 0:
                print("%-32s FAILED to run: %s" % (name, r.stdout.strip()[-500:]))
                failed.append(name)
                continue
            got_all = np.load(out)
            base = 0
            for si, sq in enumerate(case["seq"]):
                n = len(sq["tokens"])
                got = got_all[base:base + n][sq["rows"]].astype(np.float64)
                base += n
                want = np.load(os.path.join(cdir, sq["logits"])).astype(np.float64)
                rel = float(np.abs(got - want).max() / np.abs(want).max())
                amax = int((got.argmax(-1) != want.argmax(-1)).sum())
                # first stored position whose row error exceeds tol (where things go wrong)
                row_rel = np.abs(got - want).max(-1) / np.abs(want).max()
                bad = np.nonzero(row_rel >= args.tol)[0]
                first = sq["rows"][int(bad[0])] if len(bad) else None
                worst = max(worst, rel)
                ok = rel < args.tol
                if not ok:
                    failed.append("%s[%d]" % (name, si))
                print("%-32s seq %d  rel %.2e  argmax diffs %d/%d%s  %s"
                      % (name, si, rel, amax, len(sq["rows"]),
                         "" if first is None else "  first bad position %d" % first,
                         "ok" if ok else "FAIL"))
    print("worst rel %.2e; %s" % (worst, "all ok" if not failed else "FAILED: " + ", ".join(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
