"""Open a checkpoint and read its tensors one at a time, without loading the rest.

:func:`open_checkpoint` reads only what describes a checkpoint — the pickle of a full file
(its tensors come back as shapes, dtypes and file offsets), DCP's ``.metadata`` and
``meta.pt`` of a sharded directory, the JSON header of a ``.safetensors`` file — and
returns a :class:`CheckpointReader`. Its ``skeleton`` is the checkpoint dict with a
:class:`TensorInfo` in place of every tensor; :meth:`CheckpointReader.read` loads one
tensor, :meth:`CheckpointReader.load` a whole (sub)tree. This is what lets ``shardwise ckpt
inspect`` answer without reading the weights and the safetensors export stream tensor by
tensor.

Example::

    >>> reader = open_checkpoint('work_dirs/demo/epoch_1.pth')
    >>> reader.format, len(reader.tensors())
    ('sharded', 42)
    >>> info = reader.tensors('state_dict')[0]
    >>> reader.read(info).shape == info.shape
    True
"""

from __future__ import annotations

import json
import os
import struct
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from ..tree import map_with_path
from .files import CheckpointError, describe_error
from .formats import FULL, LOCAL, SAFETENSORS, SHARDED, CheckpointFormat, detect_format
from .full import is_bare_state_dict, load_full_checkpoint
from .local import local_ranks, rank_file
from .safe_dcp import SafeFileSystemReader
from .sharded import DCP_METADATA, META_FILE, REF, is_ref

__all__ = [
    "MODEL",
    "OPTIMIZER",
    "TENSOR_SECTIONS",
    "CheckpointReader",
    "TensorInfo",
    "is_safetensors_file",
    "local_checkpoint_error",
    "open_checkpoint",
    "read_safetensors_header",
    "SAFETENSORS_DTYPES",
]

MODEL = "state_dict"
OPTIMIZER = "optimizer"
#: The sections of a checkpoint that hold model and optimizer tensors.
TENSOR_SECTIONS = (MODEL, OPTIMIZER)

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
_SAFETENSORS_TORCH = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """A stored tensor's place in the checkpoint, global shape and dtype (no data).

    ``path`` is its position in the checkpoint dict, e.g. ``('state_dict', 'fc.weight')`` or
    ``('optimizer', 'state', 'fc.weight', 'exp_avg')``; ``key`` joins it with ``/`` (the
    name DCP stores it under).
    """

    path: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def key(self) -> str:
        return "/".join(self.path)

    @property
    def section(self) -> str:
        return self.path[0]

    @property
    def name(self) -> str:
        """The name within its section (a model state dict key for ``state_dict``)."""
        return "/".join(self.path[1:]) if len(self.path) > 1 else self.path[0]

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def _normalize(checkpoint: Any, path: Path) -> dict[str, Any]:
    """A bare ``torch.save(model.state_dict())`` becomes ``{'state_dict': ...}``."""
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path} holds a {type(checkpoint).__name__}, not a checkpoint dict")
    if MODEL not in checkpoint and is_bare_state_dict(checkpoint):
        return {MODEL: checkpoint}
    return checkpoint


class CheckpointReader:
    """A checkpoint opened for reading tensor by tensor (see :func:`open_checkpoint`).

    Attributes:
        path: the checkpoint (file or directory).
        format: the :class:`~shardwise.checkpoint.formats.CheckpointFormat` (``FULL``,
            ``SHARDED``, ``LOCAL`` or ``SAFETENSORS``).
        skeleton: the checkpoint dict with a :class:`TensorInfo` in place of each tensor.
        files: the files that make up the checkpoint, relative to ``path`` for a directory.
    """

    format: CheckpointFormat

    def __init__(self, path: Path, skeleton: dict[str, Any], files: list[str]) -> None:
        self.path = path
        self.skeleton = skeleton
        self.files = files

    @property
    def meta(self) -> dict[str, Any]:
        meta = self.skeleton.get("meta")
        return meta if isinstance(meta, dict) else {}

    def tensors(self, *sections: str) -> list[TensorInfo]:
        """The stored tensors of ``sections`` (default: model and optimizer), in order."""
        wanted = sections or TENSOR_SECTIONS
        found: list[TensorInfo] = []

        def collect(_: tuple[str, ...], leaf: Any) -> Any:
            if isinstance(leaf, TensorInfo) and leaf.section in wanted:
                found.append(leaf)
            return leaf

        map_with_path(collect, self.skeleton, is_leaf=is_ref)
        return found

    def read(self, info: TensorInfo, out: torch.Tensor | None = None) -> torch.Tensor:
        """One tensor, whole, as a plain CPU tensor (reads only its bytes); into ``out``
        (contiguous, of its shape and dtype) when given, so that a caller streaming many
        tensors can reuse one buffer."""
        raise NotImplementedError

    def load(self, tree: Any = None, *, on_tensor: Callable[[TensorInfo], None] | None = None):
        """``tree`` (default: the whole skeleton) with every :class:`TensorInfo` read;
        ``on_tensor(info)`` is called after each (a progress bar)."""

        def fill(_: tuple[str, ...], leaf: Any) -> Any:
            if not isinstance(leaf, TensorInfo):
                return leaf
            tensor = self.read(leaf)
            if on_tensor is not None:
                on_tensor(leaf)
            return tensor

        return map_with_path(fill, self.skeleton if tree is None else tree, is_leaf=is_ref)


# ----------------------------------------------------------------------------- full
class FullReader(CheckpointReader):
    """A ``torch.save`` file: the pickle is read with every tensor on the meta device, which
    records each storage's byte offset in the file; :meth:`read` reads those bytes only."""

    format = FULL

    def __init__(self, path: Path) -> None:
        self._stored: dict[str, torch.Tensor] = {}
        try:
            tree = _load_meta(path)
            if tree is None:  # not a zip archive (legacy torch.save): no offsets, read it whole
                tree = load_full_checkpoint(path)
        except (CheckpointError, FileNotFoundError, PermissionError):
            raise
        except Exception as exc:  # noqa: BLE001 - damaged bytes fail zipfile in many ways
            raise damaged_file_error(path, exc) from exc
        tree = _normalize(tree, path)

        def describe(leaf_path: tuple[str, ...], leaf: Any) -> Any:
            if not isinstance(leaf, torch.Tensor):
                return leaf
            key = "/".join(leaf_path)
            self._stored[key] = leaf
            return TensorInfo(leaf_path, tuple(leaf.shape), leaf.dtype)

        super().__init__(path, map_with_path(describe, tree, is_leaf=is_ref), [path.name])

    def load(self, tree: Any = None, *, on_tensor: Callable[[TensorInfo], None] | None = None):
        """Through ``torch.load(mmap=True)``: tensors that shared storage still do, and
        bytes are read only when used."""
        if any(t.device.type != "meta" for t in self._stored.values()):
            return super().load(tree, on_tensor=on_tensor)  # read whole already
        try:
            whole = load_full_checkpoint(self.path, map_location="cpu", mmap=True)
        except Exception as exc:  # noqa: BLE001 - the pickle read fine a moment ago
            raise CheckpointError(f"{self.path} cannot be read: {exc}") from exc
        stored: dict[str, torch.Tensor] = {}

        def index(leaf_path: tuple[str, ...], leaf: Any) -> Any:
            if isinstance(leaf, torch.Tensor):
                stored["/".join(leaf_path)] = leaf
            return leaf

        map_with_path(index, _normalize(whole, self.path), is_leaf=is_ref)

        def fill(_: tuple[str, ...], leaf: Any) -> Any:
            if not isinstance(leaf, TensorInfo):
                return leaf
            if on_tensor is not None:
                on_tensor(leaf)
            return stored[leaf.key]

        return map_with_path(fill, self.skeleton if tree is None else tree, is_leaf=is_ref)

    def read(self, info: TensorInfo, out: torch.Tensor | None = None) -> torch.Tensor:
        stored = self._stored[info.key]
        if stored.device.type != "meta":
            return stored if out is None else out.copy_(stored)
        storage = stored.untyped_storage()
        offset = storage._checkpoint_offset
        itemsize = stored.element_size()
        if stored.is_contiguous():
            start = offset + stored.storage_offset() * itemsize
            return _read_tensor(self.path, start, info, out)
        data = _read_bytes(self.path, offset, storage.nbytes()).view(stored.dtype)
        whole = data.as_strided(stored.shape, stored.stride(), stored.storage_offset())
        return whole.clone() if out is None else out.copy_(whole)


def _load_meta(path: Path) -> Any:
    """The checkpoint with every tensor on the meta device (nothing but the pickle is read),
    or None for a file ``torch.load`` cannot give offsets for (not a zip, big-endian)."""
    try:
        with zipfile.ZipFile(path) as archive:
            byteorder = [n for n in archive.namelist() if n.endswith("/byteorder")]
            if byteorder and archive.read(byteorder[0]) != b"little":
                return None
    except zipfile.BadZipFile:  # (a damaged directory may fail otherwise: FullReader says so)
        with open(path, "rb") as f:
            head = f.read(2)
        if head == b"PK":  # a zip whose directory is damaged: truncated or overwritten
            raise CheckpointError(
                f"{path} is a damaged torch.save archive (truncated or overwritten): its zip "
                "directory cannot be read; restore it from a copy or save it again"
            ) from None
        return None
    return load_full_checkpoint(path, map_location="meta")


def damaged_file_error(path: Path, exc: BaseException) -> CheckpointError:
    """One line for a file whose bytes fail to parse (``exc``: zipfile's or pickle's error,
    whatever the damaged byte made of it)."""
    return CheckpointError(
        f"{path} is damaged: it cannot be read as a torch.save archive ({describe_error(exc)}); "
        "its bytes changed after the save (bit rot, a bad copy): restore it from a copy"
    )


def _read_tensor(
    path: Path, start: int, info: TensorInfo, out: torch.Tensor | None
) -> torch.Tensor:
    """The contiguous tensor ``info`` from its bytes at ``start`` (into ``out`` if given)."""
    if out is None:
        out = torch.empty(info.shape, dtype=info.dtype)
    _read_bytes(path, start, info.nbytes, out.view(-1).view(torch.uint8))  # view: no copy
    return out


def _read_bytes(
    path: Path, start: int, length: int, data: torch.Tensor | None = None
) -> torch.Tensor:
    """``length`` bytes at ``start`` (into the uint8 tensor ``data`` if given)."""
    if data is None:
        data = torch.empty(length, dtype=torch.uint8)
    with open(path, "rb") as f:
        f.seek(start)
        got = f.readinto(memoryview(data.numpy())) if length else 0
    if got != length:
        raise CheckpointError(
            f"{path} is truncated: a tensor needs bytes {start}..{start + length}, the file "
            f"has {os.path.getsize(path)}"
        )
    return data


# ----------------------------------------------------------------------------- sharded
class ShardedReader(CheckpointReader):
    """A DCP directory: shapes and dtypes from ``.metadata``, the rest from ``meta.pt``;
    :meth:`read` loads one tensor with DCP (no process group), gathering its chunks."""

    format = SHARDED

    def __init__(self, path: Path) -> None:
        if not (path / META_FILE).is_file():
            raise CheckpointError(
                f"{path} is not a complete sharded checkpoint: {META_FILE} is missing (found "
                f"{sorted(os.listdir(path))}); it was not written by shardwise, or was cut short"
            )
        self.metadata = read_dcp_metadata(path)
        stored = self.metadata.state_dict_metadata
        self._dcp_keys: dict[str, str] = {}  # TensorInfo.key -> the key DCP stored it under
        skeleton = _normalize(load_full_checkpoint(path / META_FILE), path / META_FILE)

        def describe(leaf_path: tuple[str, ...], leaf: Any) -> Any:
            if not is_ref(leaf):
                return leaf
            key = leaf[REF]
            if key not in stored or not hasattr(stored[key], "chunks"):
                raise CheckpointError(
                    f"{path}: {META_FILE} refers to tensor {key!r}, which {DCP_METADATA} does "
                    "not hold; the checkpoint is inconsistent"
                )
            md = stored[key]
            info = TensorInfo(leaf_path, tuple(md.size), md.properties.dtype)
            self._dcp_keys[info.key] = key
            return info

        files = sorted({DCP_METADATA, META_FILE} | dcp_files(self.metadata))
        super().__init__(path, map_with_path(describe, skeleton, is_leaf=is_ref), files)

    def read(self, info: TensorInfo, out: torch.Tensor | None = None) -> torch.Tensor:
        return self._load({info.key: info}, {} if out is None else {info.key: out})[info.key]

    def load(self, tree: Any = None, *, on_tensor: Callable[[TensorInfo], None] | None = None):
        if on_tensor is not None:  # tensor by tensor, so that progress can be shown
            return super().load(tree, on_tensor=on_tensor)
        infos: dict[str, TensorInfo] = {}

        def collect(_: tuple[str, ...], leaf: Any) -> Any:
            if isinstance(leaf, TensorInfo):
                infos[leaf.key] = leaf
            return leaf

        tree = self.skeleton if tree is None else tree
        map_with_path(collect, tree, is_leaf=is_ref)
        loaded = self._load(infos)
        return map_with_path(
            lambda _, leaf: loaded[leaf.key] if isinstance(leaf, TensorInfo) else leaf,
            tree,
            is_leaf=is_ref,
        )

    def _load(
        self, infos: Mapping[str, TensorInfo], out: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        out = out or {}
        targets = {
            self._dcp_keys[key]: out[key]
            if key in out
            else torch.empty(info.shape, dtype=info.dtype)
            for key, info in infos.items()
        }
        if targets:
            with warnings.catch_warnings():  # one process without a process group: intended
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(targets, storage_reader=SafeFileSystemReader(self.path), no_dist=True)
        return {key: targets[self._dcp_keys[key]] for key in infos}


def read_dcp_metadata(path: Path) -> Any:
    """DCP's index of a sharded checkpoint directory (``.metadata``; read with pickle)."""
    try:
        metadata = SafeFileSystemReader(path).read_metadata()
        _check_dcp_metadata(metadata)
        return metadata
    except Exception as exc:  # noqa: BLE001 - a damaged .metadata fails in many ways
        raise CheckpointError(
            f"{path / DCP_METADATA} cannot be read ({type(exc).__name__}: "
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


def dcp_files(metadata: Any) -> set[str]:
    """The data files (``__0_0.distcp`` ...) that a DCP ``.metadata`` refers to."""
    return {info.relative_path for info in (metadata.storage_data or {}).values()}


# ----------------------------------------------------------------------------- local
class LocalReader(CheckpointReader):
    """A directory of ``rank{i}.pth``: each rank's file is a :class:`FullReader` (its tensors
    are that rank's shards); the skeleton and tensors are rank 0's."""

    format = LOCAL

    def __init__(self, path: Path) -> None:
        self.ranks = {rank: FullReader(rank_file(path, rank)) for rank in local_ranks(path)}
        first = self.ranks[min(self.ranks)]
        files = [rank_file(path, rank).name for rank in self.ranks]
        super().__init__(path, first.skeleton, files)

    def read(self, info: TensorInfo, out: torch.Tensor | None = None) -> torch.Tensor:
        raise local_checkpoint_error(self.path)


def local_checkpoint_error(path: Path) -> CheckpointError:
    """Why a local checkpoint cannot be read whole, and the way out."""
    return CheckpointError(
        f"{path} is a local checkpoint (one rank{{i}}.pth per rank, each holding that rank's "
        "shards); only FSDPStrategy on the same number of ranks can place them. Load it there "
        "and save it with state_dict_cfg='sharded' or 'full' to convert it"
    )


# ----------------------------------------------------------------------------- safetensors
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


class SafetensorsReader(CheckpointReader):
    """A ``.safetensors`` file: the model weights under ``state_dict``, its string
    metadata under ``meta``."""

    format = SAFETENSORS

    def __init__(self, path: Path) -> None:
        header, self._start = read_safetensors_header(path)
        self._offsets: dict[str, tuple[int, int]] = {}
        state_dict: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype = _SAFETENSORS_TORCH[entry["dtype"]]
                begin, end = entry["data_offsets"]
                state_dict[name] = TensorInfo((MODEL, name), tuple(entry["shape"]), dtype)
            except (KeyError, TypeError, ValueError) as exc:
                raise CheckpointError(
                    f"{path}: the safetensors header entry for {name!r} is invalid ({entry!r})"
                ) from exc
            self._offsets[name] = (begin, end)
        skeleton = {MODEL: state_dict, "meta": dict(header.get("__metadata__") or {})}
        super().__init__(path, skeleton, [path.name])

    def read(self, info: TensorInfo, out: torch.Tensor | None = None) -> torch.Tensor:
        begin, end = self._offsets[info.path[1]]
        if end - begin != info.nbytes:
            raise CheckpointError(
                f"{self.path}: tensor {info.name!r} spans {end - begin} bytes, but its shape "
                f"and dtype need {info.nbytes}"
            )
        return _read_tensor(self.path, self._start + begin, info, out)


# ----------------------------------------------------------------------------- open
def checkpoint_format(path: str | os.PathLike[str]) -> CheckpointFormat:
    """:func:`~shardwise.checkpoint.formats.detect_format`, plus :data:`SAFETENSORS`."""
    fmt = detect_format(path)
    return SAFETENSORS if fmt is FULL and is_safetensors_file(path) else fmt


def open_checkpoint(path: str | os.PathLike[str]) -> CheckpointReader:
    """Open a full, sharded or local checkpoint, or a safetensors file, for reading tensor by
    tensor; only its metadata is read now.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        CheckpointError: it is not a checkpoint, or is damaged.
    """
    path = Path(path)
    fmt = checkpoint_format(path)
    readers = (FullReader, ShardedReader, LocalReader, SafetensorsReader)
    return next(reader for reader in readers if reader.format is fmt)(path)
