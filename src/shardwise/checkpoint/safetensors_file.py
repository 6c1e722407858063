"""The safetensors file layout that shardwise reads and writes: an 8-byte header length, a
JSON header (each tensor's dtype, shape and byte range; ``__metadata__``), then the data."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import torch

from .files import CheckpointError

__all__ = ["SAFETENSORS_DTYPES", "TORCH_DTYPES", "is_safetensors_file", "read_safetensors_header"]

#: safetensors' dtype names (the header's ``dtype`` field) for torch dtypes.
SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    dtype: name
    for name, dtype in {
        "F64": torch.float64,
        "F32": torch.float32,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "I64": torch.int64,
        "I32": torch.int32,
        "I16": torch.int16,
        "I8": torch.int8,
        "U8": torch.uint8,
        "BOOL": torch.bool,
        "C64": torch.complex64,
        "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
        "F8_E5M2": getattr(torch, "float8_e5m2", None),
        "U16": getattr(torch, "uint16", None),
        "U32": getattr(torch, "uint32", None),
        "U64": getattr(torch, "uint64", None),
    }.items()
    if dtype is not None
}
TORCH_DTYPES = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}


def is_safetensors_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts like a safetensors file (header length, then ``{``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and 2 <= struct.unpack("<Q", head[:8])[0] < 2**28


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
    """A safetensors file's JSON header and the offset its data starts at."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        raw = f.read(length)
    if len(raw) != length:
        raise CheckpointError(f"{path} is truncated inside its safetensors header")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"{path} has a damaged safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} has a damaged safetensors header (not a JSON object)")
    return header, 8 + length
