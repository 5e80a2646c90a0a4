"""Minimal safetensors reader/writer on numpy (no dependency on the `safetensors` package).

File layout: 8-byte little-endian header length N, N bytes of JSON header
{name: {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
then the data section (offsets are relative to its start).

Reading converts every tensor to float32 (BF16 via uint16 << 16, F16 and F64 via numpy),
integer dtypes are returned as-is. A directory is read through model.safetensors.index.json
when present, otherwise every *.safetensors file in it is read.
"""
import json
import os

import numpy as np

_NP_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


def bf16_bits_to_f32(bits):
    """uint16 array of bfloat16 bit patterns -> float32 array (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def read_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n).decode("utf-8"))
    return header, 8 + n


def load_file(path, names=None):
    """Read one .safetensors file -> dict name -> numpy array (floats as float32)."""
    header, data_start = read_header(path)
    out = {}
    with open(path, "rb") as f:
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if names is not None and name not in names:
                continue
            dt = info["dtype"]
            if dt not in _NP_DTYPES:
                raise ValueError("%s: tensor %s has unsupported dtype %s" % (path, name, dt))
            b, e = info["data_offsets"]
            shape = tuple(int(s) for s in info["shape"])
            f.seek(data_start + b)
            raw = f.read(e - b)
            npdt = _NP_DTYPES[dt]
            count = int(np.prod(shape)) if shape else 1
            if len(raw) != count * npdt.itemsize:
                raise ValueError("%s: tensor %s: %d bytes for shape %s dtype %s"
                                 % (path, name, len(raw), shape, dt))
            arr = np.frombuffer(raw, dtype=npdt).reshape(shape)
            if dt == "BF16":
                arr = bf16_bits_to_f32(arr)
            elif dt in ("F16", "F64"):
                arr = arr.astype(np.float32)
            else:
                arr = arr.copy()
            out[name] = arr
    return out


def load_checkpoint(path):
    """A .safetensors file, or a directory (sharded through model.safetensors.index.json)."""
    if os.path.isfile(path):
        return load_file(path)
    index = os.path.join(path, "model.safetensors.index.json")
    out = {}
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        by_file = {}
        for name, fn in weight_map.items():
            by_file.setdefault(fn, set()).add(name)
        for fn, names in sorted(by_file.items()):
            part = load_file(os.path.join(path, fn), names)
            missing = names - set(part)
            if missing:
                raise ValueError("%s: index names tensors missing from %s: %s"
                                 % (path, fn, sorted(missing)[:5]))
            out.update(part)
        return out
    files = sorted(fn for fn in os.listdir(path) if fn.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError("no .safetensors files in %s" % path)
    for fn in files:
        part = load_file(os.path.join(path, fn))
        dup = set(part) & set(out)
        if dup:
            raise ValueError("%s: duplicate tensors %s" % (path, sorted(dup)[:5]))
        out.update(part)
    return out


def f32_to_bf16_bits(x):
    """float32 array -> uint16 bfloat16 bit patterns, round to nearest even (NaN kept NaN)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = rounded.astype(np.uint16)
    nan = np.isnan(x)
    bits[nan] = 0x7FC0
    return bits


def save_file(tensors, path, dtype="F32", metadata=None):
    """Write a dict name -> numpy array. dtype "F32", "BF16" or "F16" for float arrays."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        arr = np.asarray(tensors[name])
        if arr.dtype.kind == "f":
            if dtype == "F32":
                raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
            elif dtype == "F16":
                raw = np.ascontiguousarray(arr, dtype="<f2").tobytes()
            elif dtype == "BF16":
                raw = f32_to_bf16_bits(arr).astype("<u2").tobytes()
            else:
                raise ValueError("unsupported dtype " + dtype)
            dt = dtype
        else:
            inv = {v: k for k, v in _NP_DTYPES.items() if k != "BF16"}
            dt = inv[arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype]
            raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)  # align the data section to 8 bytes
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)
