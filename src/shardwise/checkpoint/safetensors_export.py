"""Export a checkpoint's model weights to a ``.safetensors`` file, one tensor at a time.

The file is written here, in the safetensors format: an 8-byte little-endian header length,
a JSON header (each tensor's ``dtype``, ``shape`` and ``data_offsets``, plus string
``__metadata__``) padded with spaces to a multiple of 8 bytes, then every tensor's raw
little-endian bytes, back to back. The header needs only shapes and dtypes, which a
:class:`~shardwise.checkpoint.opened.OpenCheckpoint` knows without reading the weights;
each tensor is then read from the source, cast and written before the next one is read, so
the memory the export needs is that of the largest tensor, not of the model. The output
loads with ``safetensors.torch.load_file`` (the ``safetensors`` package is not needed to
write it).

Example::

    >>> reader = open_checkpoint('work_dirs/gpt/iter_1000.pth')    # full or sharded
    >>> export_safetensors(reader, 'gpt.safetensors', dtype=torch.bfloat16)
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Mapping
from math import prod
from pathlib import Path

import torch

from .files import CheckpointError
from .full import HashingWriter, WrittenFile
from .opened import MODEL, OpenCheckpoint, TensorInfo
from .safetensors_file import SAFETENSORS_DTYPES

__all__ = ["export_safetensors", "safetensors_header"]


def _output_dtype(info: TensorInfo, dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None and info.dtype.is_floating_point else info.dtype


def safetensors_header(
    infos: list[TensorInfo],
    *,
    dtype: torch.dtype | None = None,
    metadata: Mapping[str, str] | None = None,
) -> tuple[bytes, list[TensorInfo]]:
    """The header (length prefix included, padded to 8 bytes) for the model tensors
    ``infos``, and the order their data must follow in (widest dtype first, so every
    tensor's data is aligned to its element size)."""
    order = sorted(infos, key=lambda info: -_output_dtype(info, dtype).itemsize)
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for info in order:
        out = _output_dtype(info, dtype)
        if out not in SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"tensor {info.name!r} has dtype {out}, which safetensors cannot store; "
                "convert with --dtype bf16|fp16|fp32 if it is a floating-point tensor"
            )
        if info.name in header:
            raise CheckpointError(f"two model tensors are both named {info.name!r}")
        size = info.numel * out.itemsize
        header[info.name] = dict(
            dtype=SAFETENSORS_DTYPES[out],
            shape=list(info.shape),
            data_offsets=[offset, offset + size],
        )
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, order


def export_safetensors(
    reader: OpenCheckpoint,
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    metadata: Mapping[str, str] | None = None,
    on_tensor: Callable[[TensorInfo], None] | None = None,
) -> WrittenFile:
    """Write the model weights (``state_dict``) of ``reader`` to the safetensors file
    ``path``, reading one tensor at a time; floating-point tensors are cast to ``dtype``
    when it is given. ``on_tensor(info)`` is called after each tensor is written. Returns
    the file with the checksum of its bytes, taken while writing them."""
    infos = reader.tensors(MODEL)
    if not infos:
        raise CheckpointError(
            f"{reader.path} holds no model weights (no tensors under 'state_dict'): "
            "there is nothing to export"
        )
    header, order = safetensors_header(infos, dtype=dtype, metadata=metadata)
    # one buffer for what is read and one for what is cast, reused for every tensor: the
    # memory is that of the largest tensor, however the allocator treats freed blocks
    read_buffer = torch.empty(max(info.nbytes for info in order), dtype=torch.uint8)
    cast_nbytes = [
        info.numel * out.itemsize
        for info in order
        if (out := _output_dtype(info, dtype)) != info.dtype
    ]
    cast_buffer = torch.empty(max(cast_nbytes, default=0), dtype=torch.uint8)
    with open(Path(path), "wb") as file:
        f = HashingWriter(file)
        f.write(header)
        for info in order:
            tensor = reader.read(info, out=_view(read_buffer, info.shape, info.dtype))
            out = _output_dtype(info, dtype)
            if out != info.dtype:
                tensor = _view(cast_buffer, info.shape, out).copy_(tensor)
            if tensor.numel():
                f.write(tensor.view(-1).view(torch.uint8).numpy().data)
            if on_tensor is not None:
                on_tensor(info)
        f.flush()
        os.fsync(file.fileno())
    return WrittenFile(Path(path), f.hexdigest())


def _view(buffer: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The first bytes of the uint8 ``buffer`` as a contiguous tensor of ``shape``/``dtype``."""
    return buffer[: prod(shape) * dtype.itemsize].view(dtype).view(shape)
