#!/usr/bin/env python3
"""The median decode step, launch by launch, from `sala bench --kernel-trace --kernel-trace-csv F`.

Usage: tools/kernel_steps.py F.csv [--row R] [--from I] [--to J]
Steps with the launch count of the row's first step (a decode step replays the same kernels) are
lined up by launch index; per index it prints the kernel, its CTAs and the medians over the steps
of start, end and exposed µs (from the step's first kernel start). Exposed: how far the launch
pushes the step's completion frontier (engine/kernel_timeline.h) — a layer's chain of kernels
reads off as consecutive lines, e.g. where a product's CTAs start (before their dependency wait)
against where the kernel before it ends.
"""
import csv
import statistics
import sys
from collections import defaultdict


def arg(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    row = arg("--row", 0)
    with open(sys.argv[1], newline="") as f:
        launches = [r for r in csv.DictReader(f) if int(r["row"]) == row]
    if not launches:
        sys.exit(f"{sys.argv[1]}: no launches of row {row}")
    steps = defaultdict(list)
    for r in launches:
        steps[int(r["step"])].append(r)
    count = len(steps[min(steps)])
    same = [s for s in steps.values() if len(s) == count]
    print(f"row {row}: {len(same)} of {len(steps)} steps with {count} launches")
    print(f"{'index':>5} {'kernel':<28} {'CTAs':>6} {'start us':>9} {'end us':>9} {'exposed':>8}")
    for i in range(arg("--from", 0), min(arg("--to", count), count)):
        at = [s[i] for s in same]
        med = lambda key: statistics.median(float(r[key]) for r in at)
        print(f"{i:>5} {at[0]['kernel'][:28]:<28} {at[0]['ctas']:>6} {med('start_us'):>9.2f} {med('end_us'):>9.2f} "
              f"{med('exposed_us'):>8.2f}")


if __name__ == "__main__":
    main()
