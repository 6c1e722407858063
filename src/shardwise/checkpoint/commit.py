"""The commit protocol: a checkpoint is visible under its final name only once complete.

Every rank writes under a staging name beside the final name (``.NAME.partial``). When all
ranks have finished, they agree (one collective that also carries any rank's error); rank 0
then moves the staging path into place and updates ``work_dir/last_checkpoint``. A crash at any
moment leaves the previous checkpoint intact and ``last_checkpoint`` pointing at it; leftovers
of an interrupted save are removed by the next save into the same folder.

Example::

    with CheckpointCommit(path, work_dir=work_dir) as staging:
        if rank == 0:
            torch.save(state, staging)
"""

from __future__ import annotations

import os
import shutil
import traceback
from pathlib import Path
from types import TracebackType

import torch.distributed as dist

__all__ = [
    "CheckpointError",
    "CheckpointCommit",
    "staging_path",
    "clean_leftovers",
    "write_last_checkpoint",
    "find_last_checkpoint",
    "LAST_CHECKPOINT",
]

LAST_CHECKPOINT = "last_checkpoint"
_STAGING_SUFFIX = ".partial"
_REPLACED_SUFFIX = ".replaced"


class CheckpointError(RuntimeError):
    """A save or load failed on at least one rank; raised on every rank."""


def staging_path(final: str | os.PathLike[str]) -> Path:
    """The temporary name a checkpoint is written under, beside its final name."""
    final = Path(final)
    return final.with_name(f".{final.name}{_STAGING_SUFFIX}")


def _replaced_path(final: Path) -> Path:
    return final.with_name(f".{final.name}{_REPLACED_SUFFIX}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clean_leftovers(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove what interrupted saves left in ``directory``; returns the removed paths."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for entry in directory.iterdir():
        if entry.name.startswith(".") and entry.name.endswith((_STAGING_SUFFIX, _REPLACED_SUFFIX)):
            _remove(entry)
            removed.append(entry)
    return removed


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}{_STAGING_SUFFIX}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_last_checkpoint(work_dir: str | os.PathLike[str], checkpoint: str | os.PathLike) -> None:
    """Point ``work_dir/last_checkpoint`` at ``checkpoint`` (atomically)."""
    _atomic_write_text(Path(work_dir) / LAST_CHECKPOINT, str(Path(checkpoint).absolute()))


def find_last_checkpoint(work_dir: str | os.PathLike[str]) -> str | None:
    """The latest committed checkpoint recorded in ``work_dir``, or None if there is none."""
    record = Path(work_dir) / LAST_CHECKPOINT
    if not record.is_file():
        return None
    target = record.read_text().strip()
    if not target:
        return None
    path = Path(target)
    if not path.is_absolute():
        path = Path(work_dir) / path
    return str(path) if path.exists() else None


def _commit_on_rank0(staging: Path, final: Path, work_dir: Path | None) -> None:
    replaced = _replaced_path(final)
    if final.exists():
        _remove(replaced)
        os.replace(final, replaced)
    os.replace(staging, final)
    _fsync_dir(final.parent)
    if work_dir is not None:
        write_last_checkpoint(work_dir, final)
    _remove(replaced)


def _gather_errors(error: str | None, group: dist.ProcessGroup | None) -> list[str | None]:
    if not (dist.is_available() and dist.is_initialized()):
        return [error]
    errors: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(errors, error, group=group)
    return errors


def _raise_if_any(errors: list[str | None], what: str) -> None:
    failed = [(rank, err) for rank, err in enumerate(errors) if err is not None]
    if failed:
        details = "\n".join(f"--- rank {rank} ---\n{err}" for rank, err in failed)
        ranks = ", ".join(str(rank) for rank, _ in failed)
        raise CheckpointError(f"{what} failed on rank(s) {ranks}:\n{details}")


class CheckpointCommit:
    """Context manager running one save through the commit protocol.

    Entering removes an earlier save's leftovers (rank 0) and yields the staging path;
    every rank writes its part there. Leaving gathers every rank's outcome: if any rank
    failed, the staging path is removed and :class:`CheckpointError` is raised on every
    rank; otherwise rank 0 renames the staging path into place and updates
    ``work_dir/last_checkpoint``. Nothing committed before is touched by a failed save.

    Args:
        final: the checkpoint's final path (a file or a directory).
        work_dir: where ``last_checkpoint`` lives; None leaves it alone.
        group: the process group carrying the agreement (default: the world).
        is_dir: the staging path is a directory, created on entry.
    """

    def __init__(
        self,
        final: str | os.PathLike[str],
        *,
        work_dir: str | os.PathLike[str] | None = None,
        group: dist.ProcessGroup | None = None,
        is_dir: bool = False,
    ) -> None:
        self.final = Path(final).absolute()
        self.staging = staging_path(self.final)
        self.work_dir = Path(work_dir) if work_dir is not None else None
        self.group = group
        self.is_dir = is_dir

    @property
    def _rank(self) -> int:
        return dist.get_rank(self.group) if dist.is_available() and dist.is_initialized() else 0

    def __enter__(self) -> Path:
        error = None
        if self._rank == 0:
            try:
                self.final.parent.mkdir(parents=True, exist_ok=True)
                clean_leftovers(self.final.parent)
                if self.is_dir:
                    self.staging.mkdir()
            except OSError:
                error = traceback.format_exc()
        _raise_if_any(_gather_errors(error, self.group), f"preparing {self.final}")
        return self.staging

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc_type is not None and not issubclass(exc_type, Exception):
            return False  # KeyboardInterrupt & co.: no collective, leave leftovers for later
        error = "".join(traceback.format_exception(exc_type, exc, tb)) if exc else None
        errors = _gather_errors(error, self.group)
        commit_error = None
        if self._rank == 0:
            try:
                if any(err is not None for err in errors):
                    _remove(self.staging)
                else:
                    _commit_on_rank0(self.staging, self.final, self.work_dir)
            except OSError:
                commit_error = traceback.format_exc()
        _raise_if_any(errors, f"saving {self.final}")
        _raise_if_any(_gather_errors(commit_error, self.group), f"committing {self.final}")
        return False
