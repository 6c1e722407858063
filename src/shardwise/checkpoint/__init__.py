"""Checkpoint formats (full / sharded / local), the commit protocol and loading."""

from typing import Any

from .files import LAST_CHECKPOINT, CheckpointError, staging_path
from .latest import find_last_checkpoint

# imported when first used, so that `shardwise ckpt` and `shardwise --help` need no torch
_FROM_COMMIT = ("CheckpointCommit", "clean_leftovers", "remove_checkpoint", "write_last_checkpoint")

__all__ = [
    "LAST_CHECKPOINT",
    "CheckpointCommit",
    "CheckpointError",
    "clean_leftovers",
    "find_last_checkpoint",
    "remove_checkpoint",
    "staging_path",
    "write_last_checkpoint",
]


def __getattr__(name: str) -> Any:
    if name in _FROM_COMMIT:
        from . import commit

        return getattr(commit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
