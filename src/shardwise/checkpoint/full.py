"""The full format: one file, written by rank 0, readable with plain ``torch.load``.

``{'state_dict', 'optimizer', 'param_schedulers', 'meta', ...extras}``: model keys are the
plain module's keys, optimizer state is keyed by parameter name. It loads with
``torch.load(path, weights_only=True)`` into a plain ``nn.Module`` without shardwise.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch

from .commit import CheckpointError

__all__ = ["save_full_checkpoint", "load_full_checkpoint"]


def save_full_checkpoint(state: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``state`` to ``path`` and flush it to disk before returning."""
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


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
