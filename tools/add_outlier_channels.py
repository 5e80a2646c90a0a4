#!/usr/bin/env python3
"""Give a checkpoint's activations outlier channels, as real LLMs have and random weights do not.

Usage: tools/add_outlier_channels.py MODEL_DIR OUT_DIR [--channels K] [--factor F] [--seed S]
Copies MODEL_DIR to OUT_DIR and multiplies K hidden channels (the same K in every layer, drawn with
--seed) of each layer's input_layernorm and post_attention_layernorm weights by F, so the inputs
of every q/k/v/gate and gate/up product carry K channels F times the rest — the case that per-row
int8 activations (--int8-prefill) handle worst (docs/quantization.md, "fp8 prefill"). Then
`sala quant-quality OUT_DIR --formats ... [--int8-prefill | --fp8-prefill | --no-fp8-prefill]`
measures each prefill on that model against its own unquantized logits. f32, bf16 and f16 tensors.
"""
import argparse
import json
import shutil
import struct
from pathlib import Path

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16}


def scale_channels(raw, dtype, channels, factor):
    if dtype == "BF16":  # bf16: the top half of an f32
        v = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).copy()
        v[channels] *= factor
        return (v.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # exact: factors of few bits
    if dtype not in DTYPES:
        raise SystemExit(f"unsupported norm dtype {dtype}")
    v = np.frombuffer(raw, DTYPES[dtype]).copy()
    v[channels] *= factor
    return v.tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--channels", type=int, default=2)
    ap.add_argument("--factor", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    src, dst = Path(a.model), Path(a.out)
    shutil.copytree(src, dst)
    files = sorted(dst.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"{src}: no .safetensors files")
    hidden = json.loads((src / "config.json").read_text())["hidden_size"]
    channels = np.random.default_rng(a.seed).choice(hidden, a.channels, replace=False)
    touched = 0
    for path in files:
        data = bytearray(path.read_bytes())
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8 : 8 + n])
        base = 8 + n
        for name, t in header.items():
            if name == "__metadata__" or not name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight")):
                continue
            b, e = (base + o for o in t["data_offsets"])
            data[b:e] = scale_channels(bytes(data[b:e]), t["dtype"], channels, a.factor)
            touched += 1
        path.write_bytes(bytes(data))
    print(f"{dst}: channels {sorted(channels.tolist())} x {a.factor:g} in {touched} norm weights")


if __name__ == "__main__":
    main()
