"""The three checkpoint formats, told apart by what is on disk.

- ``'full'``: one file written by rank 0 (:mod:`shardwise.checkpoint.full`);
- ``'sharded'``: a directory with DCP's ``.metadata`` (:mod:`shardwise.checkpoint.sharded`);
- ``'local'``: a directory of ``rank{i}.pth`` (:mod:`shardwise.checkpoint.local`).

Example::

    >>> detect_format('work_dirs/demo/epoch_1.pth')
    'sharded'
    >>> checkpoint = read_checkpoint('work_dirs/demo/epoch_1.pth')  # full tensors, one process
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import torch

from ..tree import map_tensors
from .files import CheckpointError
from .full import check_torch_file, load_full_checkpoint
from .local import local_ranks
from .manifest import checksums_checked
from .sharded import DCP_METADATA, META_FILE, load_sharded_checkpoint

__all__ = ["FORMATS", "CheckpointFormat", "detect_format", "probe_checkpoint", "read_checkpoint"]

CheckpointFormat = Literal["full", "sharded", "local"]
FORMATS: tuple[CheckpointFormat, ...] = ("full", "sharded", "local")


def detect_format(path: str | os.PathLike[str]) -> CheckpointFormat:
    """``'full'`` for a file, ``'sharded'`` for a directory holding DCP's ``.metadata``,
    ``'local'`` for a directory of ``rank{i}.pth``.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        CheckpointError: a directory that is none of these.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} does not exist; give the path of a checkpoint file or "
            "directory (work_dir/last_checkpoint names the latest one)"
        )
    if not path.is_dir():
        return "full"
    if (path / DCP_METADATA).is_file():
        return "sharded"
    if local_ranks(path):
        return "local"
    raise CheckpointError(
        f"{path} is a directory but not a checkpoint: a sharded checkpoint holds {DCP_METADATA}, "
        f"a local one rank0.pth, rank1.pth, ...; it holds {sorted(os.listdir(path))[:10]}"
    )


def probe_checkpoint(path: str | os.PathLike[str]) -> CheckpointFormat:
    """The format of the checkpoint at ``path``, after a cheap look that it is one (the first
    bytes of a file, the index files of a directory); reads no tensor.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        CheckpointError: ``path`` is not a checkpoint, saying why.
    """
    fmt = detect_format(path)
    if fmt == "full":
        check_torch_file(path)
    elif fmt == "sharded" and not (Path(path) / META_FILE).is_file():
        raise CheckpointError(
            f"{path} is not a complete sharded checkpoint: it has {DCP_METADATA} but no "
            f"{META_FILE}"
        )
    return fmt


def read_checkpoint(
    path: str | os.PathLike[str], map_location: Any = "cpu", *, verify_checksums: bool = True
) -> dict[str, Any]:
    """Read a full or sharded checkpoint whole into this process (plain tensors).

    A sharded checkpoint is read without collectives, so this works on one process and on
    every rank of a DDP run alike. A local checkpoint holds shards that only the sharded
    strategy that wrote it can place, so it is refused here. With ``verify_checksums`` every
    file is compared with the checksums its manifest recorded at save time while it is read
    (a mismatch raises :class:`CheckpointError` naming the file, and nothing read is
    returned; a checkpoint without a manifest is read as it is).
    """
    fmt = detect_format(path)
    if fmt == "local":
        raise CheckpointError(
            f"{path} is a local checkpoint (one rank{{i}}.pth per rank, each holding that "
            "rank's shards); it loads only under FSDPStrategy on the same number of ranks. Load "
            "it there and save it again with state_dict_cfg='full' or 'sharded' to use it "
            "elsewhere"
        )
    with checksums_checked(path, enabled=verify_checksums):
        if fmt == "full":
            return load_full_checkpoint(path, map_location=map_location)
        checkpoint = load_sharded_checkpoint(path)
    device = map_location if isinstance(map_location, str | torch.device) else "cpu"
    if torch.device(device).type != "cpu":
        checkpoint = map_tensors(lambda t: t.to(map_location), checkpoint)
    return checkpoint
