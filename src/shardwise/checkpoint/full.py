"""The full format: one file, written by rank 0, readable with plain ``torch.load``.

``{'state_dict', 'optimizer', 'param_schedulers', 'meta', ...extras}``: model keys are the
plain module's keys, optimizer state is keyed by parameter name. It loads with
``torch.load(path, weights_only=True)`` into a plain ``nn.Module`` without shardwise.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .commit import CheckpointError

__all__ = ["WrittenFile", "save_full_checkpoint", "load_full_checkpoint"]


class WrittenFile(NamedTuple):
    """A file a save wrote, with the SHA-256 of its bytes taken while writing them."""

    path: Path
    sha256: str


class _HashingWriter:
    """A write-only stream that hashes what passes through it (no second read for checksums)."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.digest = hashlib.sha256()

    def write(self, data: Any) -> int:
        self.digest.update(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()


def save_full_checkpoint(state: dict[str, Any], path: str | os.PathLike[str]) -> WrittenFile:
    """Write ``state`` to ``path``, hashing it on the way, and flush it to disk before
    returning."""
    with open(path, "wb") as f:
        writer = _HashingWriter(f)
        torch.save(state, writer)
        f.flush()
        os.fsync(f.fileno())
    return WrittenFile(Path(path), writer.digest.hexdigest())


def load_full_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict:
    """Read a full checkpoint with ``weights_only=True``: nothing in it is executed."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} does not exist; give the path of a checkpoint file or "
            "directory (work_dir/last_checkpoint names the latest one)"
        )
    if path.is_dir():
        raise CheckpointError(
            f"{path} is a directory, not a full checkpoint file; this strategy reads the "
            "full format only"
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path} needs arbitrary unpickling, which shardwise refuses (weights_only=True): "
            f"{str(exc).splitlines()[0]}"
        ) from exc
    except PermissionError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch.load fails in many ways on a bad file
        raise CheckpointError(
            f"{path} is not a readable checkpoint (truncated, or not written by torch.save): "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path} holds a {type(checkpoint).__name__}, not a checkpoint dict")
    return checkpoint
