"""Checkpoint formats (full / sharded / local), the commit protocol and loading."""

from .commit import CheckpointCommit, clean_leftovers, remove_checkpoint, write_last_checkpoint
from .files import LAST_CHECKPOINT, CheckpointError, staging_path
from .latest import find_last_checkpoint

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
