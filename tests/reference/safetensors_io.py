"""Minimal safetensors reader/writer (no external package).

File layout: 8-byte little-endian u64 N, then N bytes of JSON header
{"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}},
then the raw little-endian data; offsets are relative to the first byte after the header.

read(path)  -> (dict name -> numpy array, metadata dict)   (BF16 is widened to float32)
write(path, tensors, metadata=None, dtype=None)  tensors: name -> numpy array or torch tensor
"""
import json
import struct

import numpy as np

# safetensors dtype name -> numpy dtype (little-endian). BF16 handled separately.
_NP = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_SIZE = {k: v.itemsize for k, v in _NP.items()}
_SIZE["BF16"] = 2
_FROM_NP = {np.dtype(v).newbyteorder("=") if v.itemsize > 1 else v: k for k, v in _NP.items()}


class SafetensorsError(ValueError):
    pass


def bf16_to_f32(raw_u16):
    """uint16 array of bfloat16 bit patterns -> float32 array (exact)."""
    return (raw_u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """float32 array -> uint16 bfloat16 bit patterns, round to nearest even (NaN kept NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    out = rounded.astype(np.uint16)
    out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def read_header(path):
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise SafetensorsError(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        raw = f.read(n)
        if len(raw) != n:
            raise SafetensorsError(f"{path}: header length {n} exceeds the file")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid JSON: {e}")
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    return header, 8 + n


def read(path):
    """Returns (tensors, metadata): tensors maps name -> numpy array (BF16 as float32)."""
    header, base = read_header(path)
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(base)
        data = f.read()
    meta = header.pop("__metadata__", None) or {}
    out = {}
    for name, info in header.items():
        dt = info.get("dtype")
        shape = info.get("shape")
        off = info.get("data_offsets")
        if dt not in _SIZE or not isinstance(shape, list) or not isinstance(off, list) or len(off) != 2:
            raise SafetensorsError(f"{path}: tensor '{name}': bad entry {info}")
        begin, end = off
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * _SIZE[dt] or begin < 0 or base + end > size:
            raise SafetensorsError(
                f"{path}: tensor '{name}': data_offsets {off} do not match dtype {dt} shape {shape} "
                f"(file data section is {size - base} bytes)")
        buf = data[begin:end]
        if dt == "BF16":
            arr = bf16_to_f32(np.frombuffer(buf, dtype="<u2"))
        else:
            arr = np.frombuffer(buf, dtype=_NP[dt]).astype(_NP[dt].newbyteorder("="))
        out[name] = arr.reshape(shape).copy()
    return out, meta


def read_dtypes(path):
    """name -> safetensors dtype string, as stored."""
    header, _ = read_header(path)
    header.pop("__metadata__", None)
    return {k: v["dtype"] for k, v in header.items()}


def _as_numpy(t):
    if hasattr(t, "detach"):  # torch tensor
        t = t.detach().cpu().numpy()
    return np.asarray(t)


def write(path, tensors, metadata=None, dtype=None):
    """Writes tensors (name -> numpy array / torch tensor) in sorted name order.
    dtype: None keeps each array's dtype; "F32", "F64", "BF16", ... converts floating arrays."""
    header = {}
    blobs = []
    off = 0
    for name in sorted(tensors):
        a = _as_numpy(tensors[name])
        if dtype is not None and np.issubdtype(a.dtype, np.floating):
            target = dtype
        else:
            target = _FROM_NP.get(a.dtype.newbyteorder("=") if a.dtype.itemsize > 1 else a.dtype)
            if target is None:
                raise SafetensorsError(f"tensor '{name}': unsupported dtype {a.dtype}")
        if target == "BF16":
            raw = f32_to_bf16(a.astype(np.float32)).astype("<u2").tobytes()
        else:
            raw = np.ascontiguousarray(a, dtype=_NP[target]).tobytes()
        header[name] = {"dtype": target, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)  # pad so the data section is 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
