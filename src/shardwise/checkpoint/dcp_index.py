"""DCP's index of a sharded checkpoint directory (``.metadata``): read safely (an allow-list
unpickler, :mod:`.safe_dcp`) and checked, so that a damaged index is named where it is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .files import CheckpointError
from .safe_dcp import SafeFileSystemReader
from .sharded import DCP_METADATA

__all__ = ["dcp_files", "read_dcp_metadata"]


def read_dcp_metadata(path: Path) -> Any:
    """DCP's index of a sharded checkpoint directory (``.metadata``; read with pickle)."""
    try:
        metadata = SafeFileSystemReader(path).read_metadata()
        _check_dcp_metadata(metadata)
        return metadata
    except Exception as exc:  # noqa: BLE001 - a damaged .metadata fails in many ways
        where = path / DCP_METADATA
        if not where.is_file() and (path / "layout.json").is_file():
            where = path / "__{rank}.metadata"  # the fragments, which the message names
        raise CheckpointError(
            f"{where} cannot be read ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); the sharded checkpoint "
            "is damaged or was cut short"
        ) from exc


def _check_dcp_metadata(metadata: Any) -> None:
    """Check the type of every field the readers use, so that a ``.metadata`` whose pickle a
    damaged byte left readable but wrong (a memo reference pointing elsewhere) fails here,
    where the file is named, rather than later with an unrelated error."""

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
