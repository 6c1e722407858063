"""What every part of the checkpoint package shares: its error, the names a save writes beside
a checkpoint, and durable file operations.

Names beside a checkpoint ``NAME``:

- ``.NAME.partial``: the staging path a save writes under (:func:`staging_path`);
- ``.NAME.replaced``: the previous ``NAME`` while an overwrite renames the new one into place;
- ``.NAME.deleted``: a checkpoint directory being deleted (renamed first, so that it vanishes
  whole: a crash while its files are removed leaves no half-deleted checkpoint that looks
  committed);
- ``NAME.manifest.json``: the manifest of a single-file checkpoint (:func:`sidecar_path`; a
  directory checkpoint holds its manifest inside).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

__all__ = [
    "file_identity",
    "LAST_CHECKPOINT",
    "CheckpointError",
    "atomic_write_text",
    "deleted_path",
    "describe_error",
    "fsync_dir",
    "remove_path",
    "replaced_path",
    "require_checkpoint",
    "sidecar_path",
    "staging_path",
    "write_synced",
]

#: The file in a work_dir naming the checkpoint committed last (:mod:`.latest`).
LAST_CHECKPOINT = "last_checkpoint"
STAGING_SUFFIX = ".partial"
REPLACED_SUFFIX = ".replaced"
DELETED_SUFFIX = ".deleted"
SIDECAR_SUFFIX = ".manifest.json"


class CheckpointError(RuntimeError):
    """A save or load failed on at least one rank; raised on every rank."""


def file_identity(path: str | os.PathLike[str]) -> tuple[int, ...]:
    """A file as it is now: device, inode, size and modification time (an inode number alone
    is reused at once); an empty tuple where there is none."""
    try:
        stat = os.stat(path)
    except OSError:
        return ()
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def describe_error(exc: BaseException) -> str:
    """One line for ``exc``: its type and the first line of its message (what a rank tells the
    others about its failure; the full traceback stays with the rank that failed)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def require_checkpoint(path: Any, what: str = "checkpoint", *, also: Any = None) -> None:
    """Raise FileNotFoundError naming ``path`` when nothing is there: the first thing to say
    about a checkpoint that is not there, before any other complaint (a strategy not prepared
    yet, a launch's collectives). A local check, so every rank sees it alike. ``what`` says
    which argument named it (``'load_from'``, ``'resume'``); ``also``: where else a relative
    ``path`` was looked for (inside the work_dir). Only a local path (a :class:`Path`) is
    checked: a checkpoint on object storage is the reader's to find.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    if not isinstance(path, Path) or path.exists():
        return
    nor = f" (nor does {str(also)!r})" if also is not None and str(also) != str(path) else ""
    raise FileNotFoundError(
        f"{what} {str(path)!r} does not exist{nor}; give the path of a checkpoint file or "
        "directory (work_dir/last_checkpoint names the latest one)"
    )


def staging_path(final: str | os.PathLike[str]) -> Path:
    """The temporary name a checkpoint is written under, beside its final name."""
    final = Path(final)
    return final.with_name(f".{final.name}{STAGING_SUFFIX}")


def deleted_path(checkpoint: str | os.PathLike[str]) -> Path:
    """Where a checkpoint directory is moved to be deleted."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(f".{checkpoint.name}{DELETED_SUFFIX}")


def replaced_path(final: str | os.PathLike[str]) -> Path:
    """Where an overwrite keeps the previous checkpoint until the new one is in place."""
    final = Path(final)
    return final.with_name(f".{final.name}{REPLACED_SUFFIX}")


def sidecar_path(checkpoint: str | os.PathLike[str]) -> Path:
    """The manifest beside a single-file checkpoint."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.name + SIDECAR_SUFFIX)


def remove_path(path: Path) -> None:
    """Delete a file, a symlink or a directory tree; a missing path is no error."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def fsync_dir(directory: Path) -> None:
    """Make the entries of ``directory`` (renames, new files) durable, where the OS allows."""
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


def write_synced(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` and flush it to disk."""
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically: readers see the old or the new text, whole."""
    tmp = staging_path(path)
    write_synced(tmp, text)
    os.replace(tmp, path)
    fsync_dir(path.parent)
