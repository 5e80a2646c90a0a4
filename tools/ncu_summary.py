#!/usr/bin/env python3
"""Per-kernel time summary of an Nsight Compute CSV (`ncu --csv --metrics gpu__time_duration.sum`).

Usage: tools/ncu_summary.py ncu.csv [--top N]
Prints, per kernel name (template arguments dropped), the launches, the mean and total device time,
sorted by total: where a profiled run spends its GPU time, kernel by kernel (each launch measured
alone, serialized by the profiler, so the sum exceeds a graph replay that overlaps kernels).
"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"\([^()]*\)$", "", name.strip())  # drop the parameter list
    name = re.sub(r"<[^<>]*>$", "", name)  # and the template arguments of the kernel itself
    return name.split("::")[-1].split()[-1]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 30
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own messages before the CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(r.get("Metric Unit", ""), 1.0)
        rows.append((short(r["Kernel Name"]), float(r["Metric Value"].replace(",", "")) * scale))
    if not rows:
        sys.exit(f"{sys.argv[1]}: no gpu__time_duration.sum rows")
    agg = defaultdict(list)
    for name, us in rows:
        agg[name].append(us)
    total = sum(us for _, us in rows)
    print(f"{'kernel':44s} {'launches':>8s} {'mean us':>10s} {'total us':>11s} {'share':>7s}")
    for name, v in sorted(agg.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"{name[:44]:44s} {len(v):8d} {sum(v) / len(v):10.2f} {sum(v):11.1f} {100 * sum(v) / total:6.1f}%")
    print(f"{'all':44s} {len(rows):8d} {'':10s} {total:11.1f}")


if __name__ == "__main__":
    main()
