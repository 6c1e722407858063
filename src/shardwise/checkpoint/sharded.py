"""The sharded format: a directory written by every rank with ``torch.distributed.checkpoint``.

Layout::

    epoch_1.pth/
        .metadata          DCP's index of every tensor (global shapes, which file holds which chunk)
        __0_0.distcp ...   each rank's shards of the model and optimizer tensors
        meta.pt            everything else, written by rank 0 with ``torch.save``: ``meta`` (with
                           every rank's RNG states), ``param_schedulers``, extras, the optimizer's
                           ``param_groups``, and a reference in place of each tensor kept by DCP

Only the tensors under ``state_dict`` and ``optimizer`` go through DCP; ``meta.pt`` holds the
rest so that it reads with ``torch.load(weights_only=True)``. DCP reshards on load: the same
directory loads on any number of ranks, into sharded (DTensor) or plain tensors.

DCP itself would read ``.metadata`` with plain ``pickle``; shardwise reads it through
:class:`~shardwise.checkpoint.safe_dcp.SafeFileSystemReader`, whose unpickler admits only the
inert classes DCP's metadata is made of, so nothing in a checkpoint is executed.

Example::

    save_sharded_checkpoint(state, staging_dir)       # on every rank
    checkpoint = load_sharded_checkpoint(final_dir)   # one process, full tensors
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from .commit import CheckpointError
from .full import load_full_checkpoint, save_full_checkpoint
from .safe_dcp import SafeFileSystemReader

__all__ = [
    "DCP_METADATA",
    "META_FILE",
    "TensorFactory",
    "load_sharded_checkpoint",
    "load_sharded_tensors",
    "read_sharded_checkpoint",
    "read_sharded_meta",
    "save_sharded_checkpoint",
]

DCP_METADATA = ".metadata"
META_FILE = "meta.pt"
_TENSOR_SECTIONS = ("state_dict", "optimizer")
_REF = "__dcp_tensor__"

#: Makes the tensor a stored tensor is loaded into: ``(path in the checkpoint, global shape,
#: dtype) -> tensor`` (a DTensor to load a shard, a plain tensor to load it whole).
TensorFactory = Callable[[tuple[str, ...], torch.Size, torch.dtype], torch.Tensor]


def _split(tree: Any, path: tuple[str, ...], tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(tree, torch.Tensor):
        key = "/".join(path)
        tensors[key] = tree
        return {_REF: key}
    if isinstance(tree, Mapping):
        return {k: _split(v, (*path, str(k)), tensors) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_split(v, (*path, str(i)), tensors) for i, v in enumerate(tree))
    return tree


def _is_ref(tree: Any) -> bool:
    return isinstance(tree, dict) and len(tree) == 1 and _REF in tree


def _refs(tree: Any, path: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """Every tensor reference of a skeleton: DCP key -> path in the checkpoint."""
    if _is_ref(tree):
        return {tree[_REF]: path}
    found: dict[str, tuple[str, ...]] = {}
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            found.update(_refs(v, (*path, str(k))))
    elif isinstance(tree, list | tuple):
        for i, v in enumerate(tree):
            found.update(_refs(v, (*path, str(i))))
    return found


def _fill(tree: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if _is_ref(tree):
        return tensors[tree[_REF]]
    if isinstance(tree, Mapping):
        return {k: _fill(v, tensors) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_fill(v, tensors) for v in tree)
    return tree


class _RecordingWriter(dcp.FileSystemWriter):
    """DCP's file writer that remembers the files this rank wrote (for the manifest)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, sync_files=True)
        self.root = path
        self.written: list[Path] = []

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)  # FileSystemWriter writes before returning
        names = {getattr(r.storage_data, "relative_path", None) for r in future.wait()}
        self.written += [self.root / name for name in sorted(n for n in names if n)]
        return future

    def finish(self, metadata: Any, results: Any) -> None:
        super().finish(metadata, results)
        self.written.append(self.root / DCP_METADATA)


def save_sharded_checkpoint(
    state: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    process_group: torch_dist.ProcessGroup | None = None,
) -> list[Path]:
    """Write ``state`` into the directory ``path``; every rank calls it (a collective, on
    ``process_group``, by default the world). Returns the files this rank wrote.

    The tensors under ``state['state_dict']`` and ``state['optimizer']`` (DTensors are saved
    shard by shard, plain tensors once) go through DCP; rank 0 writes the rest to ``meta.pt``.
    A failure DCP reports (on every rank, as DCP agrees on it) is raised as CheckpointError.
    """
    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    skeleton = {
        k: _split(v, (k,), tensors) if k in _TENSOR_SECTIONS else v for k, v in state.items()
    }
    writer = _RecordingWriter(path)
    try:
        dcp.save(tensors, storage_writer=writer, process_group=process_group)
    except CheckpointException as exc:  # a BaseException: turn it into an ordinary error
        raise CheckpointError(f"DCP could not save {path}: {exc}") from None
    rank = torch_dist.get_rank() if torch_dist.is_initialized() else 0
    if rank == 0:
        save_full_checkpoint(skeleton, path / META_FILE)
        writer.written.append(path / META_FILE)
    return writer.written


def _full_tensor(path: tuple[str, ...], shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def read_sharded_meta(
    path: str | os.PathLike[str],
) -> tuple[dict[str, Any], dict[str, tuple[tuple[str, ...], torch.Size, torch.dtype]]]:
    """The checkpoint's skeleton (``meta.pt``: everything but the DCP tensors, each replaced by
    a reference) and, for every stored tensor, its path in the checkpoint, global shape and
    dtype. Reads two small files on this process alone (no collectives)."""
    path = Path(path)
    meta_file = path / META_FILE
    if not meta_file.is_file() or not (path / DCP_METADATA).is_file():
        raise CheckpointError(
            f"{path} is not a complete sharded checkpoint: it needs {DCP_METADATA} (written by "
            f"torch.distributed.checkpoint) and {META_FILE}; found "
            f"{sorted(os.listdir(path)) if path.is_dir() else 'no directory'}"
        )
    skeleton = load_full_checkpoint(meta_file)
    refs = _refs(skeleton)
    stored = SafeFileSystemReader(path).read_metadata().state_dict_metadata
    missing = sorted(set(refs) - set(stored))
    if missing:
        raise CheckpointError(
            f"{path}: {META_FILE} refers to tensors that DCP did not store: {missing[:5]}"
        )
    specs = {key: (refs[key], stored[key].size, stored[key].properties.dtype) for key in refs}
    return skeleton, specs


def load_sharded_tensors(
    path: str | os.PathLike[str],
    skeleton: dict[str, Any],
    specs: Mapping[str, tuple[tuple[str, ...], torch.Size, torch.dtype]],
    tensor_factory: TensorFactory | None = None,
    *,
    no_dist: bool = False,
) -> dict[str, Any]:
    """Load the tensors that :func:`read_sharded_meta` listed into tensors made by
    ``tensor_factory`` and return the whole checkpoint (a collective unless ``no_dist``)."""
    factory = tensor_factory or _full_tensor
    targets = {key: factory(*spec) for key, spec in specs.items()}
    if targets:
        with warnings.catch_warnings():  # no_dist is what we asked for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(targets, storage_reader=SafeFileSystemReader(path), no_dist=no_dist)
    return _fill(skeleton, targets)


def read_sharded_checkpoint(
    path: str | os.PathLike[str],
    tensor_factory: TensorFactory | None = None,
    *,
    no_dist: bool = False,
) -> dict[str, Any]:
    """Read a sharded checkpoint into tensors made by ``tensor_factory``.

    ``tensor_factory(path, shape, dtype)`` returns the tensor each stored tensor is loaded
    into: a DTensor (each rank reads only its shard, in whatever layout the DTensor has) or
    a plain tensor (read whole). By default every tensor is read whole. ``no_dist=True``
    reads without collectives (one process, or every rank on its own).
    """
    skeleton, specs = read_sharded_meta(path)
    return load_sharded_tensors(path, skeleton, specs, tensor_factory, no_dist=no_dist)


def load_sharded_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The whole checkpoint in this process's memory, as plain tensors on the CPU (no process
    group needed): what a full checkpoint of the same state would hold."""
    return read_sharded_checkpoint(path, no_dist=True)
