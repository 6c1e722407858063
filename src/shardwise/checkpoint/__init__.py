"""Checkpoint formats (full / sharded / local), the commit protocol and loading."""

from .commit import (
    LAST_CHECKPOINT,
    CheckpointCommit,
    CheckpointError,
    clean_leftovers,
    find_last_checkpoint,
    remove_checkpoint,
    staging_path,
    write_last_checkpoint,
)

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
