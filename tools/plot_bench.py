#!/usr/bin/env python3
"""Plots `sala bench --json` results: decode tok/s vs context (with each run's roofline), TTFT vs
context, and memory vs context when the rows carry it, next to the published reference points of
the model's authors (A6000D). Prints a Markdown table of every file's rows on stdout.
Debian's python3-matplotlib (scripts/setup.sh).

usage: /usr/bin/python3 tools/plot_bench.py RESULT.json [MORE.json ...] --out docs/img/ [--prefix bench]
       [--labels "LABEL,LABEL"]
writes OUT/PREFIX-decode.png, OUT/PREFIX-ttft.png and, if any row has memory, OUT/PREFIX-memory.png
(`sala bench --plot DIR` runs this with /usr/bin/python3 or $SALA_PYTHON)
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

K = 1024
# Published by the model's authors (MiniCPM-SALA, A6000D GPU): TTFT in seconds by context, and a
# decode speed of about 56 tok/s that stays flat over context.
AUTHORS_LABEL = "A6000D (authors)"
AUTHORS_TTFT = {64 * K: 12.3, 128 * K: 25.2, 256 * K: 51.6, 512 * K: 109.9, 1024 * K: 250.3}
AUTHORS_DECODE = 56.0
# Memory of a row (`sala bench` since issue #6): what the model's state is made of, stacked, and
# the measured peak of the device (CPU: process RSS).
MEMORY_PARTS = (("weights_bytes", "weights"), ("kv_bytes", "sparse K/V"), ("compressed_keys_bytes", "K1/K2"),
                ("lightning_state_bytes", "lightning states"), ("workspace_bytes", "activations/workspace"))
CACHE_PARTS = ("kv_bytes", "compressed_keys_bytes", "lightning_state_bytes")
X_TICKS = [4 * K, 8 * K, 16 * K, 32 * K, 64 * K, 128 * K, 256 * K, 512 * K, 1024 * K]


def size_label(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= K and n % K == 0:
        return f"{n >> 10}K"
    return str(n)


def load(path, label=None):
    with open(path) as f:
        d = json.load(f)
    d["_path"] = path
    hw = d.get("device") or d.get("backend", "?")
    d["_label"] = label or f"{d.get('model', '?')}, {hw} ({os.path.basename(path)})"
    d["_rows1"] = sorted((r for r in d.get("rows", []) if r.get("batch", 1) == 1), key=lambda r: r["context"])
    return d


def memory_of(row):
    return row.get("peak_memory_bytes")


def has_parts(rows):
    return rows and all(all(r.get(k) is not None for k, _ in MEMORY_PARTS) for r in rows)


def setup_axes(ax, xs, ylabel):
    ax.set_xscale("log", base=2)
    ticks = sorted(set(X_TICKS) | set(xs))
    lo, hi = min(xs + [4 * K]), max(xs + [1024 * K])
    ticks = [t for t in ticks if lo <= t <= hi]
    ax.set_xticks(ticks, [size_label(t) for t in ticks], rotation=45)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def plot_decode(docs, out):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = []
    for d in docs:
        rows = d["_rows1"]
        if not rows:
            continue
        x = [r["context"] for r in rows]
        xs += x
        line, = ax.plot(x, [r["decode_tok_s"] for r in rows], "o-", label=d["_label"])
        if all("roofline_tok_s" in r for r in rows):
            ax.plot(x, [r["roofline_tok_s"] for r in rows], "--", color=line.get_color(), alpha=0.7,
                    label=f"roofline of {d['_label']}")
    ax.axhline(AUTHORS_DECODE, color="black", linestyle=":", label=f"{AUTHORS_LABEL}: ~{AUTHORS_DECODE:g} tok/s")
    ax.set_ylim(bottom=0)
    setup_axes(ax, xs, "decode tok/s (batch 1)")
    ax.set_title("decode speed vs context")
    ax.legend(fontsize=7, loc="best")  # a fixed spot hid the 512K point of the 1M runs
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_ttft(docs, out):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = list(AUTHORS_TTFT)
    for d in docs:
        rows = d["_rows1"]
        if rows:
            x = [r["context"] for r in rows]
            xs += x
            ax.plot(x, [r["ttft_s"] for r in rows], "o-", label=d["_label"])
    ax.plot(list(AUTHORS_TTFT), list(AUTHORS_TTFT.values()), "k^:", label=AUTHORS_LABEL)
    for x, y in AUTHORS_TTFT.items():
        ax.annotate(f"{y:g} s", (x, y), textcoords="offset points", xytext=(-6, 6), ha="right", fontsize=7)
    ax.set_yscale("log")
    setup_axes(ax, xs, "time to first token (s)")
    ax.set_title("TTFT (prefill of the whole context) vs context")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_memory(docs, out):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows_all = [r for d in docs for r in d["_rows1"]]
    values = [memory_of(r) or 0 for r in rows_all] + [sum(max(r.get(k) or 0, 0) for k, _ in MEMORY_PARTS) for r in rows_all]
    unit, div = ("GiB", 2**30) if max(values, default=0) >= 2**30 else ("MiB", 2**20)
    xs = []
    stacked = False
    for d in docs:
        rows = d["_rows1"]
        if not stacked and has_parts(rows):  # the first run's parts, stacked (one stack stays readable)
            x = [r["context"] for r in rows]
            series = [[max(r[k], 0) / div for r in rows] for k, _ in MEMORY_PARTS]
            labels = [f"{name} ({d.get('backend', '?')})" for _, name in MEMORY_PARTS]
            # What the device also holds, so that the stack adds up to the measured use: the part of
            # the cache pools not yet filled (the batch-1 pool is sized for the largest context from
            # the start) and, on CUDA, the use before the model was loaded (context, cuBLAS).
            if all(r.get("cache_pool_bytes") is not None for r in rows):
                series.append([max(r["cache_pool_bytes"] - sum(r[k] for k in CACHE_PARTS), 0) / div for r in rows])
                labels.append(f"cache pool, not yet filled ({d.get('backend', '?')})")
            before = (d.get("memory") or {}).get("before_model_used_bytes")
            if before:
                series.append([before / div] * len(rows))
                labels.append(f"device use before the model ({d.get('backend', '?')})")
            ax.stackplot(x, *series, labels=labels, alpha=0.6)
            stacked = True
        peak = [r for r in rows if memory_of(r)]
        if peak:
            x = [r["context"] for r in peak]
            xs += x
            ax.plot(x, [memory_of(r) / div for r in peak], "ko-" if len(docs) == 1 else "o-",
                    label=f"peak {'process RSS' if d.get('backend') == 'cpu' else 'device memory'}: {d['_label']}")
    setup_axes(ax, xs, f"memory ({unit})")
    ax.set_title("memory vs context (batch 1)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def table(d):
    lines = [f"`{d['_path']}`: {d.get('model', '?')}, backend {d.get('backend', '?')}", ""]
    c = d.get("ceilings", {})
    if c:
        lines += [f"ceilings: {c.get('bandwidth_bytes_s', 0) / 1e9:.1f} GB/s, {c.get('matmul_flop_s', 0) / 1e12:.3f} TFLOP/s", ""]
    mem = any(memory_of(r) for r in d.get("rows", []))
    head = "| context | batch | prefill tok/s | TTFT s | decode tok/s | roofline tok/s | % roofline |"
    rule = "|---:|---:|---:|---:|---:|---:|---:|"
    if mem:
        head += " K/V+K1/K2 MiB | states MiB | workspace MiB | peak MiB |"
        rule += "---:|---:|---:|---:|"
    lines += [head, rule]
    for r in d.get("rows", []):
        line = (f"| {size_label(r['context'])} | {r['batch']} | {r.get('prefill_tok_s', 0):.0f} | "
                f"{r.get('ttft_s', 0):.3f} | {r.get('decode_tok_s', 0):.1f} | {r.get('roofline_tok_s', 0):.1f} | "
                f"{r.get('pct_roofline', 0):.1f} |")
        if mem:
            mib = lambda v: "–" if v is None else f"{v / 2**20:.1f}"  # noqa: E731
            line += (f" {mib((r.get('kv_bytes') or 0) + (r.get('compressed_keys_bytes') or 0))} |"
                     f" {mib(r.get('lightning_state_bytes'))} | {mib(r.get('workspace_bytes'))} |"
                     f" {mib(memory_of(r))} |")
        lines.append(line)
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--prefix", default="bench", help="file name prefix (default: bench)")
    p.add_argument("--labels", help="comma-separated legend labels, one per JSON file (default: model, device, file)")
    a = p.parse_args()
    labels = a.labels.split(",") if a.labels else [None] * len(a.json)
    if len(labels) != len(a.json):
        p.error(f"--labels has {len(labels)} labels for {len(a.json)} files")
    docs = [load(f, lb) for f, lb in zip(a.json, labels)]
    os.makedirs(a.out, exist_ok=True)
    written = []
    for name, fn in (("decode", plot_decode), ("ttft", plot_ttft)):
        path = os.path.join(a.out, f"{a.prefix}-{name}.png")
        fn(docs, path)
        written.append(path)
    if any(memory_of(r) for d in docs for r in d["_rows1"]):
        path = os.path.join(a.out, f"{a.prefix}-memory.png")
        plot_memory(docs, path)
        written.append(path)
    else:
        print("no row has peak_memory_bytes (results older than the memory accounting): no memory plot")
    for d in docs:
        print(table(d))
        print()
    print("wrote " + ", ".join(written))


if __name__ == "__main__":
    main()
