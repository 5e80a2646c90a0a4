#!/usr/bin/env python3
"""Plots a `sala needle --json` result: a context x depth heatmap of found / not found, and the
prefill / decode speed per context. Debian's python3-matplotlib (scripts/setup.sh).

usage: /usr/bin/python3 tools/plot_needle.py RESULT.json --heatmap heat.png [--speed speed.png]
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402


def size_label(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}K"
    return str(n)


def title_of(d):
    model = os.path.basename(os.path.normpath(d.get("model", "?"))) or d.get("model", "?")
    t = f"{model} ({d.get('backend', '?')})"
    if d.get("random_weights"):
        t += "\nRANDOM weights: harness check only"
    return t


def heatmap(d, out):
    cells = d["cells"]
    contexts = sorted({c["context"] for c in cells})
    depths = sorted({c["depth"] for c in cells})
    grid = [[float("nan")] * len(contexts) for _ in depths]
    for c in cells:
        grid[depths.index(c["depth"])][contexts.index(c["context"])] = 1.0 if c["found"] else 0.0
    fig, ax = plt.subplots(figsize=(max(4.0, 1.0 + 0.9 * len(contexts)), max(3.0, 1.2 + 0.5 * len(depths))))
    ax.imshow(grid, cmap=ListedColormap(["#d9534f", "#5cb85c"]), vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(contexts)), [size_label(x) for x in contexts])
    ax.set_yticks(range(len(depths)), [f"{x:g}%" for x in depths])
    for i in range(len(depths)):
        for j in range(len(contexts)):
            v = grid[i][j]
            if v == v:
                ax.text(j, i, "found" if v else "missed", ha="center", va="center", color="white", fontsize=8)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("needle depth")
    found = sum(1 for c in cells if c["found"])
    ax.set_title(f"needle: {found}/{len(cells)} found\n{title_of(d)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def speed(d, out):
    cells = d["cells"]
    contexts = sorted({c["context"] for c in cells})

    def mean(key, ctx):
        v = [c[key] for c in cells if c["context"] == ctx and c.get(key, 0) > 0]
        return sum(v) / len(v) if v else float("nan")

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.plot(contexts, [mean("prefill_tok_s", x) for x in contexts], "o-", label="prefill tok/s")
    a1.plot(contexts, [mean("decode_tok_s", x) for x in contexts], "s-", label="decode tok/s")
    a1.set_ylabel("tokens/s (mean over depths)")
    a2.plot(contexts, [mean("prefill_s", x) for x in contexts], "o-", label="prefill time (s)")
    a2.set_ylabel("prefill time (s)")
    def peak(key, ctx):  # the largest over depths; None (CPU: no device memory) counts as 0
        return max((c.get(key) or 0 for c in cells if c["context"] == ctx), default=0) / 2**30

    rss = [peak("peak_rss_bytes", x) for x in contexts]
    dev = [peak("peak_device_bytes", x) for x in contexts]
    if any(rss) or any(dev):
        a3 = a2.twinx()
        if any(dev):  # a device backend: its memory, device-wide, per cell
            a3.plot(contexts, dev, "v--", color="tab:red", label="peak device memory (GiB)")
        if any(rss):  # host process, since it started
            a3.plot(contexts, rss, "^--", color="gray", label="peak host RSS (GiB)")
        a3.set_ylabel("peak memory (GiB)")
        a3.set_ylim(0, 1.25 * max(rss + dev))
        a3.legend(loc="lower right", fontsize=8)
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xticks(contexts, [size_label(x) for x in contexts])
        a.set_xlabel("context (tokens)")
        a.grid(True, alpha=0.3)
        a.legend(loc="upper left", fontsize=8)
    fig.suptitle(title_of(d), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json")
    p.add_argument("--heatmap", required=True)
    p.add_argument("--speed")
    a = p.parse_args()
    with open(a.json) as f:
        d = json.load(f)
    if not d.get("cells"):
        sys.exit("plot_needle: no cells in " + a.json)
    heatmap(d, a.heatmap)
    if a.speed:
        speed(d, a.speed)


if __name__ == "__main__":
    main()
