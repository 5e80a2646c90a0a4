#!/usr/bin/env python3
"""How per-row activation quantization (the W8A8 prefill) copes with outlier channels.

Usage: tools/w8a8_outliers.py [--rows N] [--in K] [--out M] [--seed S]
Activation rows x [N, K] are Gaussian except a few channels (k of K) scaled up by a factor F, the
shape of the residual stream's "massive activations" in real LLMs (random-weight models have
none, so `sala quant-quality` on them cannot show this). Each row is quantized as the backends'
W8A8 paths do (w8a8_prefill.cu, cpu_quant_matmul.cpp): int8 with s = max|x| / 127, rint (ties to
even); e4m3 with s = max|x| / 448, round to nearest even with saturation. Printed: the relative
Frobenius error of x·Wᵀ (W Gaussian, exact) against the exact product, per F, over all channels and
over the typical (non-outlier) channels' share of the product alone — what a per-row scale set by
the outliers does to everything else. The weights are left exact: the columns are the activation
rounding alone.
"""
import argparse

import numpy as np


def quant_int8(x):
    s = np.abs(x).max(axis=1, keepdims=True) / 127.0
    s[s == 0] = 1.0
    return np.clip(np.rint(x / s), -127, 127) * s


def e4m3(v):
    """Round to the nearest e4m3 value (ties to even), saturating at ±448; subnormals below 2^-6."""
    a = np.abs(v)
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -30)))
    e = np.maximum(e, -6.0)  # the subnormal range shares the quantum of the smallest normal binade
    quantum = 2.0 ** (e - 3)
    r = np.rint(a / quantum) * quantum
    return np.sign(v) * np.minimum(r, 448.0)


def quant_fp8(x):
    s = np.abs(x).max(axis=1, keepdims=True) / 448.0
    s[s == 0] = 1.0
    return e4m3(x / s) * s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--in", dest="k", type=int, default=4096)
    ap.add_argument("--out", type=int, default=1024)
    ap.add_argument("--outliers", type=int, default=4, help="outlier channels per row (the same for every row)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    w = rng.standard_normal((a.out, a.k)) / np.sqrt(a.k)
    base = rng.standard_normal((a.rows, a.k))
    channels = rng.choice(a.k, a.outliers, replace=False)
    print(f"x [{a.rows}, {a.k}] Gaussian, {a.outliers} outlier channels x F; W [{a.out}, {a.k}] exact; "
          "relative error of x·Wᵀ")
    typical = np.setdiff1d(np.arange(a.k), channels)
    print("| F (outlier / typical) | int8 per row | e4m3 per row | int8, typical channels | e4m3, typical channels |")
    print("|---|---|---|---|---|")
    for f in (1, 3, 10, 30, 100, 300):
        x = base.copy()
        x[:, channels] *= f
        y, yt = x @ w.T, x[:, typical] @ w[:, typical].T
        row = []
        for xq in (quant_int8(x), quant_fp8(x)):
            row += [np.linalg.norm(xq @ w.T - y) / np.linalg.norm(y),
                    np.linalg.norm(xq[:, typical] @ w[:, typical].T - yt) / np.linalg.norm(yt)]
        print(f"| {f} | {row[0]:.2e} | {row[2]:.2e} | {row[1]:.2e} | {row[3]:.2e} |")


if __name__ == "__main__":
    main()
