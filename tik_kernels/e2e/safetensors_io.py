"""Read and write the safetensors format (8-byte little-endian header length, a JSON header,
raw little-endian tensor bytes). Small enough to own rather than add a dependency for."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint file that is not valid safetensors, or lacks a tensor the model needs."""


def load_file(path: str | Path) -> dict[str, torch.Tensor]:
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise CheckpointError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise CheckpointError(f"{path}: header length {n} exceeds the file")
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: header is not JSON ({e})") from None
    body = memoryview(data)[8 + n :]
    out: dict[str, torch.Tensor] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(meta.get("dtype"))
        if dtype is None:
            raise CheckpointError(f"{path}: {name} has unsupported dtype {meta.get('dtype')}")
        start, end = meta["data_offsets"]
        shape = meta["shape"]
        numel = 1
        for s in shape:
            numel *= s
        if end - start != numel * torch.empty((), dtype=dtype).element_size() or end > len(body):
            raise CheckpointError(f"{path}: {name} byte range does not match its shape")
        raw = torch.frombuffer(bytearray(body[start:end]), dtype=torch.uint8) if end > start else torch.empty(0,
                                                                                                          dtype=torch.uint8)
        out[name] = raw.view(dtype).reshape(shape).clone()
    return out


def save_file(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    header: dict[str, dict] = {}
    blobs: list[bytes] = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
