"""Reading DCP checkpoints without executing anything from them.

``torch.distributed.checkpoint``'s ``FileSystemReader`` reads a checkpoint's ``.metadata`` with
plain ``pickle.load``: a crafted ``.metadata`` could run code. :class:`SafeFileSystemReader`
unpickles it with an allow-list of the inert classes DCP's metadata is made of (its own
dataclasses, ``torch.Size``, dtypes, layouts, paths) and refuses entries that DCP would
unpickle as arbitrary objects: shardwise stores only tensors in DCP.

Example::

    dcp.load(state_dict, storage_reader=SafeFileSystemReader(path))
"""

from __future__ import annotations

import inspect
import pickle
from typing import Any

import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from .commit import CheckpointError

__all__ = ["SafeFileSystemReader", "load_dcp_metadata"]

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


def load_dcp_metadata(stream: Any, source: str = ".metadata") -> Metadata:
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


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` is read by :func:`load_dcp_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = load_dcp_metadata(stream, source=str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
