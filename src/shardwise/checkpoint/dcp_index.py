"""DCP's index of a sharded checkpoint (``.metadata``, or a rank's metadata fragment), read
without executing anything from it and checked field by field, so that a damaged index is
named where it is read.

``torch.distributed.checkpoint`` reads its index with plain ``pickle.load``: a crafted
``.metadata`` could run code. :func:`load_dcp_metadata` unpickles it with an allow-list of the
inert classes DCP's metadata is made of (its own dataclasses, ``torch.Size``, dtypes, layouts,
paths) and refuses entries that DCP would unpickle as arbitrary objects: shardwise stores only
tensors in DCP. :func:`check_dcp_metadata` then checks the type of every field the readers use.

This module is the bottom of the sharded format's modules: :mod:`.planning` (the fragments),
:mod:`.safe_dcp` (the reader) and :mod:`.sharded` import it, it imports none of them.

Example::

    with open(path / DCP_METADATA, 'rb') as f:
        metadata = load_dcp_metadata(f, source=str(path / DCP_METADATA))
    check_dcp_metadata(metadata)
"""

from __future__ import annotations

import inspect
import pickle
from typing import Any

import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from .files import CheckpointError

__all__ = ["DCP_METADATA", "check_dcp_metadata", "dcp_files", "load_dcp_metadata"]

#: DCP's one index of every chunk (written by its central planner, or ``shardwise ckpt index``).
DCP_METADATA = ".metadata"

_ALLOWED_MODULE_CLASSES = {
    name
    for name, obj in vars(dcp_metadata).items()
    if inspect.isclass(obj) and obj.__module__ == dcp_metadata.__name__
}
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # maps a layout's name to the layout object
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == dcp_metadata.__name__ and name in _ALLOWED_MODULE_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return super().find_class(module, name)
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"{module}.{name} is not one of the classes a DCP .metadata file is made of"
        )


def load_dcp_metadata(stream: Any, source: str = DCP_METADATA) -> Metadata:
    """Unpickle a DCP ``.metadata`` stream with the allow-list; check it indexes tensors only."""
    try:
        metadata = _MetadataUnpickler(stream).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as exc:
        raise CheckpointError(
            f"{source} is not a DCP metadata file shardwise can read safely: {exc}"
        ) from exc
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{source} holds a {type(metadata).__name__}, not DCP Metadata")
    objects = sorted(
        key
        for key, entry in metadata.state_dict_metadata.items()
        if not isinstance(entry, TensorStorageMetadata)
    )
    if objects:
        raise CheckpointError(
            f"{source} indexes pickled objects under {objects[:5]}: DCP would unpickle them "
            "with arbitrary code execution; shardwise checkpoints store only tensors in DCP"
        )
    return metadata


def check_dcp_metadata(metadata: Any) -> None:
    """Check the type of every field the readers use, so that a ``.metadata`` whose pickle a
    damaged byte left readable but wrong (a memo reference pointing elsewhere) fails here,
    where the file is named, rather than later with an unrelated error (TypeError)."""

    def ints(value: Any, what: str) -> None:
        if not (isinstance(value, tuple | list) and all(type(v) is int for v in value)):
            raise TypeError(f"{what} is {value!r}, not a tuple of ints")

    for key, md in metadata.state_dict_metadata.items():
        if not isinstance(key, str):
            raise TypeError(f"a key is {key!r}, not a string")
        if hasattr(md, "chunks") or hasattr(md, "properties"):  # a tensor's entry
            if not isinstance(md.properties.dtype, torch.dtype):
                raise TypeError(f"{key!r}: dtype is {md.properties.dtype!r}")
            ints(md.size, f"{key!r}: size")
            for chunk in md.chunks:
                ints(chunk.offsets, f"{key!r}: a chunk's offsets")
                ints(chunk.sizes, f"{key!r}: a chunk's sizes")
    for index, info in (metadata.storage_data or {}).items():
        if not isinstance(index.fqn, str) or not isinstance(info.relative_path, str):
            raise TypeError(f"a storage entry is {index!r}: {info!r}")
        if type(info.offset) is not int or type(info.length) is not int:
            raise TypeError(f"{index.fqn!r}: offset {info.offset!r}, length {info.length!r}")
        checksum = getattr(info, "checksum", None)  # .records.CHECKSUM
        if checksum is not None and not isinstance(checksum, str):
            raise TypeError(f"{index.fqn!r}: its chunk's checksum is {checksum!r}")


def dcp_files(metadata: Any) -> set[str]:
    """The data files (``__0_0.distcp`` ...) that a DCP ``.metadata`` refers to."""
    return {info.relative_path for info in (metadata.storage_data or {}).values()}
