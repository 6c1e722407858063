"""The commit protocol: a checkpoint is visible under its final name only once complete.

Every rank writes under a staging name beside the final name (``.NAME.partial``). When all
ranks have finished, they agree (one collective that also carries any rank's error and the
checksums of the files it wrote); rank 0 then records the manifest (:mod:`.manifest`), moves the
staging path into place and updates ``work_dir/last_checkpoint``. A crash at any moment leaves
the previous checkpoint intact and ``last_checkpoint`` pointing at it; leftovers of an
interrupted save are removed by the next save into the same folder. A rank that cannot reach
the others (one was killed) gets a :class:`CheckpointError` when the agreement fails, at the
collective timeout at the latest.

A save never deletes what it did not write: a destination that exists must be a committed
checkpoint (one with its manifest), else the save is refused before anything is written; a
retired checkpoint without a manifest is left alone, and only our own leftovers are cleaned.

Example::

    commit = CheckpointCommit(path, work_dir=work_dir)
    with commit as staging:
        if rank == 0:
            torch.save(state, staging)
            commit.record(staging)   # optional: hashed here, not re-read by rank 0

The two halves, :meth:`CheckpointCommit.begin` and :meth:`CheckpointCommit.finish`, may run
on different threads (an asynchronous save finishes in the background).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch.distributed as dist

from .agreement import gather_outcomes, raise_if_any
from .files import (
    DELETED_SUFFIX,
    LAST_CHECKPOINT,
    REPLACED_SUFFIX,
    SIDECAR_SUFFIX,
    STAGING_SUFFIX,
    CheckpointError,
    atomic_write_text,
    deleted_path,
    describe_error,
    fsync_dir,
    remove_path,
    replaced_path,
    sidecar_path,
    staging_path,
)
from .manifest import ALGORITHM, file_checksum, is_committed, is_manifest, stage_manifest

__all__ = [
    "CheckpointError",
    "CheckpointCommit",
    "staging_path",
    "clean_leftovers",
    "remove_checkpoint",
    "write_last_checkpoint",
    "LAST_CHECKPOINT",
]

#: What a rank tells the others when a save ends: its error (one line) or None, and the
#: manifest entries of the files it wrote (``{relative name: {'size', ALGORITHM}}``).
_Outcome = tuple[str | None, dict[str, dict[str, Any]]]

logger = logging.getLogger(__name__)


def remove_checkpoint(path: str | os.PathLike[str]) -> None:
    """Delete a checkpoint (file or directory) and the manifest sidecar of a file checkpoint;
    a missing path is no error. For ``max_keep_ckpts`` and the like (call it on one rank).

    A crash at any moment leaves the checkpoint whole or gone, never half-deleted with its
    manifest: a directory is renamed out of the way (``.NAME.deleted``, which the next save's
    :func:`clean_leftovers` removes) before its files are; a file goes before its manifest.
    """
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        trash = deleted_path(path)
        remove_path(trash)
        os.replace(path, trash)
        remove_path(trash)
    else:
        path.unlink(missing_ok=True)
    sidecar_path(path).unlink(missing_ok=True)
    staging_path(sidecar_path(path)).unlink(missing_ok=True)


def clean_leftovers(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove what interrupted saves left in ``directory`` (staging paths, replaced
    checkpoints, checkpoints being deleted, manifests whose checkpoint is gone); returns the
    removed paths. A replaced
    checkpoint whose successor never arrived (a crash between the two renames of an overwrite)
    is moved back to its name instead. A ``*.manifest.json`` that is not a manifest is kept."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for entry in sorted(directory.iterdir()):
        hidden = entry.name.startswith(".")
        if hidden and entry.name.endswith(REPLACED_SUFFIX):
            final = entry.with_name(entry.name[1 : -len(REPLACED_SUFFIX)])
            if not final.exists():  # crashed between the two renames: put the old one back
                os.replace(entry, final)
                continue
            remove_path(entry)
            removed.append(entry)
        elif hidden and entry.name.endswith((STAGING_SUFFIX, DELETED_SUFFIX)):
            remove_path(entry)
            removed.append(entry)
        elif entry.name.endswith(SIDECAR_SUFFIX) and entry.is_file():
            checkpoint = entry.with_name(entry.name[: -len(SIDECAR_SUFFIX)])
            if checkpoint.name and not checkpoint.exists() and is_manifest(entry):
                entry.unlink(missing_ok=True)
                removed.append(entry)
    return removed


def write_last_checkpoint(work_dir: str | os.PathLike[str], checkpoint: str | os.PathLike) -> None:
    """Point ``work_dir/last_checkpoint`` at ``checkpoint`` (atomically)."""
    atomic_write_text(Path(work_dir) / LAST_CHECKPOINT, str(Path(checkpoint).absolute()))


def check_replaceable(final: Path) -> None:
    """Refuse a destination that a save would delete although it is not a committed
    checkpoint (a user's folder or file, a checkpoint without its manifest)."""
    if not (final.exists() or final.is_symlink()) or (
        not final.is_symlink() and is_committed(final)
    ):
        return
    kind = "symlink" if final.is_symlink() else "folder" if final.is_dir() else "file"
    raise CheckpointError(
        f"refusing to save to {final}: a {kind} is there that is not a committed shardwise "
        "checkpoint (it has no manifest), and saving would replace it. Save under another "
        "name or move it away; if it is an old checkpoint you mean to overwrite, delete it or "
        f"mark it with `shardwise ckpt verify --write-manifest {final}`"
    )


def _commit_on_rank0(
    staging: Path,
    final: Path,
    work_dir: Path | None,
    digests: dict[str, dict[str, Any]],
    retire: list[Path],
    run: Mapping[str, Any] | None = None,
) -> None:
    manifest = stage_manifest(staging, final, known=digests, run=run)  # hashes the rest
    replaced = replaced_path(final)
    if final.exists():
        remove_path(replaced)
        os.replace(final, replaced)
    os.replace(staging, final)
    manifest.commit()
    fsync_dir(final.parent)
    if work_dir is not None:
        write_last_checkpoint(work_dir, final)
    remove_path(replaced)
    for old in retire:
        if old == final:
            continue
        if old.exists() and not is_committed(old):
            logger.warning("Not deleting the outdated checkpoint %s: it has no manifest", old)
            continue
        existed = old.exists()
        try:
            remove_checkpoint(old)
        except OSError as exc:  # the new checkpoint is committed: do not fail the save for it
            logger.warning("Could not delete the outdated checkpoint %s: %s", old, exc)
        else:
            if existed:
                logger.info("Deleted the outdated checkpoint %s (max_keep_ckpts)", old)


class CheckpointCommit:
    """One save through the commit protocol (a context manager, or :meth:`begin` then
    :meth:`finish`).

    Entering checks that the destination may be replaced (:func:`check_replaceable`),
    removes an earlier save's leftovers (rank 0) and yields the staging path; every rank
    writes its part there and may :meth:`record` the files it wrote. Leaving gathers every
    rank's outcome: if any rank failed, the staging path is removed and
    :class:`CheckpointError` is raised on every rank; otherwise rank 0 writes the manifest
    (from the digests the ranks recorded; it hashes only files nobody recorded), renames the
    staging path into place, updates ``work_dir/last_checkpoint`` and deletes the checkpoints
    the save ``retire``s (:mod:`.retention`). Nothing committed before is touched by a failed
    save.

    Args:
        final: the checkpoint's final path (a file or a directory).
        work_dir: where ``last_checkpoint`` lives; None leaves it alone.
        group: the process group carrying the agreement (default: the world).
        is_dir: the staging path is a directory, created on entry.
        retire: checkpoints rank 0 deletes once this one is committed (never ``final``).
        run: the saving run, recorded in the manifest (``run``).
    """

    def __init__(
        self,
        final: str | os.PathLike[str],
        *,
        work_dir: str | os.PathLike[str] | None = None,
        group: dist.ProcessGroup | None = None,
        is_dir: bool = False,
        retire: Sequence[str | os.PathLike[str]] = (),
        run: Mapping[str, Any] | None = None,
    ) -> None:
        self.run = run
        self.final = Path(final).absolute()
        self.retire = [Path(p).absolute() for p in retire]
        self.staging = staging_path(self.final)
        self.work_dir = Path(work_dir) if work_dir is not None else None
        self.group = group
        self.is_dir = is_dir
        self._written: list[Path] = []
        self._hashed: dict[Path, str] = {}

    @property
    def _rank(self) -> int:
        return dist.get_rank(self.group) if dist.is_available() and dist.is_initialized() else 0

    def record(self, *paths: str | os.PathLike[str] | Any) -> None:
        """Note files this rank wrote under the staging path: they are hashed on this rank
        before the agreement, so that rank 0 does not read them again for the manifest. A
        :class:`~shardwise.checkpoint.full.WrittenFile` brings the hash taken while writing."""
        for item in paths:
            checksum = getattr(item, "checksum", None)
            path = Path(getattr(item, "path", item)).absolute()
            self._written.append(path)
            if checksum is not None:
                self._hashed[path] = checksum

    def begin(self, error: BaseException | None = None) -> Path:
        """Rank 0 checks the destination and prepares the staging path; every rank learns
        whether that, or any rank's own ``error`` (e.g. staging to host memory failed), went
        wrong. Returns the staging path. A collective."""
        if self._rank == 0 and error is None:
            try:
                check_replaceable(self.final)
                self.final.parent.mkdir(parents=True, exist_ok=True)
                clean_leftovers(self.final.parent)
                if self.is_dir:
                    self.staging.mkdir()
            except (OSError, CheckpointError) as exc:
                error = exc
        what = f"saving {self.final}"
        message = None if error is None else describe_error(error)
        raise_if_any(gather_outcomes(message, self.group, what), what, error)
        return self.staging

    def finish(self, error: BaseException | None = None) -> None:
        """Agree on the outcome and commit (or discard) the save; ``error`` is this rank's
        failure, if any. Raises :class:`CheckpointError` on every rank when any rank failed.
        A collective."""
        digests: dict[str, dict[str, Any]] = {}
        if error is None:
            try:
                digests = self._digests()
            except Exception as exc:  # noqa: BLE001 - reported to every rank below
                error = exc
        saving = f"saving {self.final}"
        message = None if error is None else describe_error(error)
        outcomes: list[_Outcome] = gather_outcomes((message, digests), self.group, saving)
        errors = [err for err, _ in outcomes]
        commit_error = None
        if self._rank == 0:
            try:
                if any(err is not None for err in errors):
                    remove_path(self.staging)
                else:
                    merged = {k: v for _, d in outcomes for k, v in d.items()}
                    _commit_on_rank0(
                        self.staging, self.final, self.work_dir, merged, self.retire, self.run
                    )
            except Exception as exc:  # noqa: BLE001 - reported to every rank below
                commit_error = exc
        committing = f"committing {self.final}"
        message = None if commit_error is None else describe_error(commit_error)
        commit_errors = gather_outcomes(message, self.group, committing)  # staging gone or renamed
        raise_if_any(errors, saving, error)
        raise_if_any(commit_errors, committing, commit_error)

    def _digests(self) -> dict[str, dict[str, Any]]:
        digests = {}
        for path in self._written:
            if path == self.staging:
                name = self.final.name
            else:
                name = path.relative_to(self.staging).as_posix()
            checksum = self._hashed.get(path) or file_checksum(path)
            digests[name] = {"size": path.stat().st_size, ALGORITHM: checksum}
        return digests

    def __enter__(self) -> Path:
        return self.begin()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc_type is not None and not issubclass(exc_type, Exception):
            return False  # KeyboardInterrupt & co.: no collective, leave leftovers for later
        self.finish(exc)
        return False
