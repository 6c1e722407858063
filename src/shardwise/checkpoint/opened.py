"""A checkpoint opened for reading tensor by tensor, whatever its format.

``fmt.open(path)`` (:mod:`.formats`; :func:`~.formats.open_checkpoint` detects the format
first) reads only what describes a checkpoint — the pickle of a full file (its tensors come
back as shapes, dtypes and file offsets), DCP's index and ``meta.pt`` of a sharded directory,
the JSON header of a ``.safetensors`` file — and returns an :class:`OpenCheckpoint`. Its
``skeleton`` is the checkpoint dict with a :class:`TensorInfo` in place of every tensor;
:meth:`OpenCheckpoint.read` loads one tensor, :meth:`OpenCheckpoint.load` a whole (sub)tree,
each through the format object. This is what lets ``shardwise ckpt inspect`` answer without
reading the weights and the safetensors export stream tensor by tensor.

Example::

    >>> opened = open_checkpoint('work_dirs/demo/epoch_1.pth')
    >>> opened.format, len(opened.tensors())
    (SHARDED, 42)
    >>> info = opened.tensors('state_dict')[0]
    >>> opened.read(info).shape == info.shape
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import torch

from ..tree import map_with_path
from .files import CheckpointError
from .full import is_bare_state_dict
from .sharded import is_ref

__all__ = ["MODEL", "OPTIMIZER", "TENSOR_SECTIONS", "OpenCheckpoint", "TensorInfo"]

MODEL = "state_dict"
OPTIMIZER = "optimizer"
#: The sections of a checkpoint that hold model and optimizer tensors.
TENSOR_SECTIONS = (MODEL, OPTIMIZER)


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


def normalize(checkpoint: Any, path: Path) -> dict[str, Any]:
    """A bare ``torch.save(model.state_dict())`` becomes ``{'state_dict': ...}``."""
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path} holds a {type(checkpoint).__name__}, not a checkpoint dict")
    if MODEL not in checkpoint and is_bare_state_dict(checkpoint):
        return {MODEL: checkpoint}
    return checkpoint


def map_infos(fn: Callable[[TensorInfo], Any], tree: Any) -> Any:
    """``tree`` with every :class:`TensorInfo` replaced by ``fn(info)``."""
    return map_with_path(
        lambda _, leaf: fn(leaf) if isinstance(leaf, TensorInfo) else leaf, tree, is_leaf=is_ref
    )


class OpenCheckpoint:
    """A checkpoint opened by its format (see the module docstring).

    Attributes:
        path: the checkpoint (file or directory).
        format: the :class:`~shardwise.checkpoint.formats.CheckpointFormat` that opened it
            (``FULL``, ``SHARDED``, ``LOCAL`` or ``SAFETENSORS``), which reads its tensors.
        skeleton: the checkpoint dict with a :class:`TensorInfo` in place of each tensor.
        files: the files that make up the checkpoint, relative to ``path`` for a directory.
        index: what the format keeps to find the tensors (offsets, DCP keys, rank files).
    """

    def __init__(
        self, path: Path, fmt: Any, skeleton: dict[str, Any], files: list[str], index: Any
    ) -> None:
        self.path, self.format, self.skeleton, self.files, self.index = (
            path,
            fmt,
            skeleton,
            files,
            index,
        )

    @property
    def meta(self) -> dict[str, Any]:
        meta = self.skeleton.get("meta")
        return meta if isinstance(meta, dict) else {}

    def tensors(self, *sections: str) -> list[TensorInfo]:
        """The stored tensors of ``sections`` (default: model and optimizer), in order."""
        wanted = sections or TENSOR_SECTIONS
        found: list[TensorInfo] = []
        for key, section in self.skeleton.items():  # only those walked: meta can be large
            if str(key) in wanted:
                map_infos(found.append, {key: section})
        return found

    def read(self, info: TensorInfo, out: torch.Tensor | None = None) -> torch.Tensor:
        """One tensor, whole, as a plain CPU tensor (reads only its bytes); into ``out``
        (contiguous, of its shape and dtype) when given, so that a caller streaming many
        tensors can reuse one buffer."""
        return self.format.read_tensor(self, info, out)

    def load(self, tree: Any = None, *, on_tensor: Callable[[TensorInfo], None] | None = None):
        """``tree`` (default: the whole skeleton) with every :class:`TensorInfo` read;
        ``on_tensor(info)`` is called after each (a progress bar)."""
        return self.format.load_tensors(self, self.skeleton if tree is None else tree, on_tensor)

    def load_each(self, tree: Any, on_tensor: Callable[[TensorInfo], None] | None) -> Any:
        """:meth:`load` tensor by tensor, through :meth:`read` (what a format without a
        faster whole-tree read does)."""

        def read(info: TensorInfo) -> torch.Tensor:
            tensor = self.read(info)
            if on_tensor is not None:
                on_tensor(info)
            return tensor

        return map_infos(read, tree)
