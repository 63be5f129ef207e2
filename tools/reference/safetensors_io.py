"""Minimal safetensors reader/writer (no dependency on the `safetensors` package).

File layout: u64 little-endian header length N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__"},
then the raw little-endian tensor bytes (offsets relative to the data start).
"""
import json
import struct

import numpy as np
import torch

# dtype name -> (torch dtype, bytes per element)
_DTYPES = {
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I32": (torch.int32, 4),
    "I64": (torch.int64, 8),
    "F64": (torch.float64, 8),
}
_NAME_OF = {v[0]: k for k, v in _DTYPES.items()}
# numpy views used for the raw bytes (bf16 travels as int16 bits)
_NP_VIEW = {"F32": "<f4", "F16": "<f2", "BF16": "<i2", "I32": "<i4", "I64": "<i8", "F64": "<f8"}


def _to_bytes(t):
    t = t.detach().cpu().contiguous()
    name = _NAME_OF.get(t.dtype)
    if name is None:
        raise ValueError(f"unsupported dtype {t.dtype}")
    if name == "BF16":
        arr = t.view(torch.int16).numpy()
    else:
        arr = t.numpy()
    return name, arr.astype(_NP_VIEW[name], copy=False).tobytes()


def cast_for_storage(tensors, store):
    """{name: tensor} rounded once through f32 to the torch dtype `store`.
    ValueError naming the first tensor, element and value that is not finite
    once stored (NaN, infinity, or beyond the dtype's range: 65504 for f16):
    switchserve refuses such weights, so they must not be written silently."""
    out = {}
    for name in sorted(tensors):
        t = tensors[name].detach()
        stored = t.to(torch.float32).to(store)
        bad = (~torch.isfinite(stored)).flatten().nonzero()
        if len(bad):
            i = int(bad[0])
            value = float(t.flatten()[i])
            if value != value or value in (float("inf"), float("-inf")):
                why = "is not finite"
            else:
                wider = "f32 or bf16" if store == torch.float16 else "f32"
                why = (f"is beyond {_NAME_OF[store]}'s range (largest finite {torch.finfo(store).max:g}); "
                       f"store the weights as {wider}")
            raise ValueError(f"tensor {name}: element {i} of {stored.numel()} ({value:g}) {why}")
        out[name] = stored
    return out


def save_file(tensors, path, metadata=None):
    """Writes {name: tensor} to `path`, tensors in sorted-name order."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        dtype, data = _to_bytes(tensors[name])
        header[name] = {"dtype": dtype, "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)  # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def load_file(path):
    """Returns {name: tensor} (dtypes as stored) read from `path`."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: truncated (no header length)")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} past end of file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        if dtype not in _DTYPES:
            raise ValueError(f"{path}: tensor {name}: unknown dtype {dtype}")
        tdtype, size = _DTYPES[dtype]
        shape = [int(s) for s in info["shape"]]
        begin, end = info["data_offsets"]
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * size or end > len(data):
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {begin},{end}")
        arr = np.frombuffer(data[begin:end], dtype=_NP_VIEW[dtype]).copy()
        t = torch.from_numpy(arr)
        if dtype == "BF16":
            t = t.view(torch.bfloat16)
        out[name] = t.reshape(shape)
    return out
