"""The local format (mmengine's layout): a directory with one ``rank{i}.pth`` per rank.

Each file is a complete checkpoint dict whose tensors are that rank's own shards (the local
part of every DTensor, on the CPU); ``meta``, schedulers and extras are in every file. It is the
fastest format to write and read, and it loads only on the same number of ranks with the same
sharding; ``'sharded'`` is the format that reshards.

Example::

    save_local_checkpoint(state, staging_dir, rank)   # on every rank
    checkpoint = load_local_checkpoint(final_dir, rank)
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ..tree import map_tensors
from .files import CheckpointError
from .full import WrittenFile, load_full_checkpoint, save_full_checkpoint
from .manifest import checksums_checked

__all__ = ["load_local_checkpoint", "local_ranks", "rank_file", "save_local_checkpoint"]

_RANK_FILE = re.compile(r"^rank(\d+)\.pth$")


def rank_file(path: str | os.PathLike[str], rank: int) -> Path:
    """``path/rank{rank}.pth``."""
    return Path(path) / f"rank{rank}.pth"


def local_ranks(path: str | os.PathLike[str]) -> list[int]:
    """The ranks that have a file in the local checkpoint directory ``path``, sorted."""
    ranks = []
    for entry in os.listdir(path):
        match = _RANK_FILE.match(entry)
        if match:
            ranks.append(int(match.group(1)))
    return sorted(ranks)


def _local_copy(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor`` on the CPU (a DTensor's local shard, copied)."""
    if isinstance(tensor, DTensor):
        return tensor.to_local().detach().to("cpu", copy=True)
    return tensor.detach().cpu()


def save_local_checkpoint(
    state: dict[str, Any], path: str | os.PathLike[str], rank: int
) -> WrittenFile:
    """Write this rank's part of ``state`` (DTensors as their local shards) to
    ``path/rank{rank}.pth`` and return that file with its hash; every rank calls it."""
    return save_full_checkpoint(map_tensors(_local_copy, state), rank_file(path, rank))


def load_local_checkpoint(
    path: str | os.PathLike[str],
    rank: int,
    world_size: int,
    map_location: Any = "cpu",
    *,
    verify_checksums: bool = True,
) -> dict[str, Any]:
    """Read ``path/rank{rank}.pth`` (checked against the manifest's checksum as it is read,
    with ``verify_checksums``); the directory must hold exactly one file per rank of
    ``world_size`` ranks (local checkpoints do not reshard)."""
    ranks = local_ranks(path)
    if ranks != list(range(world_size)):
        raise CheckpointError(
            f"{path} is a local checkpoint with files for ranks {ranks}, but this run has "
            f"{world_size} rank(s): a local checkpoint loads only on the number of ranks that "
            "saved it. Resume on that many ranks, or convert it: load it there with FSDPStrategy "
            "and save with state_dict_cfg='sharded', which loads on any number of ranks"
        )
    with checksums_checked(path, [rank_file(path, rank).name], enabled=verify_checksums):
        return load_full_checkpoint(rank_file(path, rank), map_location=map_location)
