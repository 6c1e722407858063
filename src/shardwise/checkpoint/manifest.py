"""Checksums recorded at save time: a manifest of every file of a checkpoint.

A directory checkpoint (sharded, local) holds ``manifest.json``; a single-file checkpoint
(full, safetensors) has a sidecar ``NAME.manifest.json`` beside it. Either maps each file,
relative to the checkpoint, to its size and checksum::

    {"manifest_version": 1, "algorithm": "xxh3_64", "created": "2025-01-01 12:00:00",
     "files": {"__0_0.distcp": {"size": 1048576, "xxh3_64": "9f86d081884c7d65"}, ...}}

The checksum is XXH3's 64-bit hash (the ``xxhash`` package; ~28 GB/s on one core, four times
zlib's CRC-32 and over ten times SHA-256, so that the writing thread checksums what it writes
as it goes at little cost): it catches what a manifest is for, bytes that changed after the
save (bit rot, truncation, a partial overwrite, a bad copy). It is no defence against
tampering (a tamperer rewrites the manifest too); nothing in a checkpoint is executed anyway.
Manifests recorded with CRC-32 or SHA-256 by earlier versions verify as before.

:func:`verify_manifest` re-reads every listed file and reports each one that is missing or
whose size or checksum changed. In the commit protocol, :func:`stage_manifest` records the
manifest of the staging path just before it is renamed into place, so that a manifest never
describes anything but the checkpoint beside it.

Example::

    >>> write_manifest('work_dirs/demo/epoch_1.pth')
    PosixPath('work_dirs/demo/epoch_1.pth/manifest.json')
    >>> verify_manifest('work_dirs/demo/epoch_1.pth')
    []
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import queue
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from .files import (
    CheckpointError,
    atomic_write_text,
    fsync_dir,
    sidecar_path,
    staging_path,
    write_synced,
)

__all__ = [
    "MANIFEST",
    "PendingManifest",
    "Problem",
    "ReadCheck",
    "build_manifest",
    "ChecksumCheck",
    "check_checksums",
    "checksums_checked",
    "is_committed",
    "is_manifest",
    "recorded_files",
    "ALGORITHM",
    "Checksum",
    "file_checksum",
    "new_checksum",
    "manifest_path",
    "read_manifest",
    "stage_manifest",
    "verify_manifest",
    "write_manifest",
]

MANIFEST = "manifest.json"
_VERSION = 1
_CHUNK = 1 << 20
#: The checksum new manifests record; ``crc32`` and ``sha256`` ones (earlier versions) still
#: verify.
ALGORITHM = "xxh3_64"
#: Each checksum algorithm's name in messages.
LABELS = {"xxh3_64": "XXH3-64", "crc32": "CRC-32", "sha256": "SHA-256"}
_LABELS = LABELS

#: Called with the number of bytes just read (drives a progress bar).
OnBytes = Callable[[int], None]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint: the file (relative to a directory checkpoint, or
    the file's own name) and what is wrong with it."""

    file: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.reason}"


def manifest_path(checkpoint: str | os.PathLike[str]) -> Path:
    """Where the manifest of ``checkpoint`` lives: ``DIR/manifest.json`` for a directory,
    ``NAME.manifest.json`` beside a file."""
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        return checkpoint / MANIFEST
    return sidecar_path(checkpoint)


class Checksum:
    """A running CRC-32 (the checksum of earlier manifests) with ``hashlib``'s interface
    (``update``, ``hexdigest``)."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: Any) -> None:
        self._value = zlib.crc32(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value:08x}"


def new_checksum(algorithm: str = ALGORITHM) -> Any:
    """An empty running checksum of ``algorithm`` (one of ``_LABELS``), with ``hashlib``'s
    interface."""
    if algorithm == "xxh3_64":
        return xxhash.xxh3_64()
    return Checksum() if algorithm == "crc32" else hashlib.sha256()


def file_checksum(
    path: str | os.PathLike[str], on_bytes: OnBytes | None = None, algorithm: str = ALGORITHM
) -> str:
    """The checksum of a file, read in chunks of 1 MiB."""
    digest = new_checksum(algorithm)
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
            if on_bytes is not None:
                on_bytes(n)
    return digest.hexdigest()


#: Bytes of a file mapped at a time by :func:`_mapped_checksum`.
_WINDOW = 16 << 20


def _mapped_checksum(
    path: str | os.PathLike[str], on_bytes: OnBytes | None = None, algorithm: str = ALGORITHM
) -> str:
    """:func:`file_checksum`, hashing the file's pages where they lie (``mmap``, 16 MiB at a
    time) instead of copying them into a buffer: one call per window, which releases the GIL
    for the page faults and the hash alike, so that a :class:`ChecksumCheck` beside a
    ``torch.load`` neither copies the file a second time nor waits for the GIL after every
    MiB (``torch.load``'s unpickler holds it). Its sequential faults also read the file
    ahead of the load. Falls back to :func:`file_checksum` where a file cannot be mapped.

    The file must not shrink while it is hashed (a page past its new end faults with
    SIGBUS, as under ``torch.load(mmap=True)``); a checkpoint's files never do: a commit
    writes new files and renames them, and retention unlinks them (a mapping keeps an
    unlinked file readable)."""
    digest = new_checksum(algorithm)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            for offset in range(0, size, _WINDOW):
                length = min(_WINDOW, size - offset)
                with mmap.mmap(
                    f.fileno(), length, offset=offset, access=mmap.ACCESS_READ
                ) as window:
                    if hasattr(window, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
                        window.madvise(mmap.MADV_SEQUENTIAL)
                    digest.update(window)
                if on_bytes is not None:
                    on_bytes(length)
    except (OSError, ValueError):  # not mappable here (e.g. a special file system)
        return file_checksum(path, on_bytes, algorithm)
    return digest.hexdigest()


def _checkpoint_files(checkpoint: Path) -> list[str]:
    """Every file of a directory checkpoint (relative, POSIX), the manifest excluded."""
    files = []
    for root, _, names in os.walk(checkpoint):
        for name in names:
            rel = (Path(root) / name).relative_to(checkpoint).as_posix()
            if rel != MANIFEST:
                files.append(rel)
    return sorted(files)


def build_manifest(
    checkpoint: str | os.PathLike[str],
    *,
    name: str | None = None,
    on_bytes: OnBytes | None = None,
    known: Mapping[str, Mapping[str, Any]] | None = None,
    run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest of ``checkpoint`` (a directory, or a file recorded as ``name``, by
    default its own name). ``known`` holds entries hashed already (by the rank that wrote
    the file, in the commit protocol): a file listed there with the size on disk is not read
    again; every other file is hashed here. ``run``: the run that saves it (recorded as
    ``run``; see :class:`~.object_commit.RunClaims`)."""
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        entries = {rel: checkpoint / rel for rel in _checkpoint_files(checkpoint)}
    else:
        entries = {name or checkpoint.name: checkpoint}
    known = known or {}
    files = {}
    for rel, path in entries.items():
        size = path.stat().st_size
        recorded = known.get(rel)
        if recorded is not None and recorded.get("size") == size:
            files[rel] = {"size": size, ALGORITHM: recorded[ALGORITHM]}
        else:
            files[rel] = {"size": size, ALGORITHM: file_checksum(path, on_bytes)}
    manifest = dict(
        manifest_version=_VERSION,
        algorithm=ALGORITHM,
        created=time.strftime("%Y-%m-%d %H:%M:%S"),
        files=files,
    )
    if run:
        manifest["run"] = dict(run)
    return manifest


def _dump(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=1, sort_keys=False) + "\n"


def write_manifest(checkpoint: str | os.PathLike[str], *, on_bytes: OnBytes | None = None) -> Path:
    """Record the size and checksum of every file of ``checkpoint`` (atomically); returns the
    manifest's path. For a checkpoint saved without one, or after a deliberate edit."""
    checkpoint = Path(checkpoint)
    if not checkpoint.exists():
        raise FileNotFoundError(f"checkpoint {str(checkpoint)!r} does not exist")
    target = manifest_path(checkpoint)
    atomic_write_text(target, _dump(build_manifest(checkpoint, on_bytes=on_bytes)))
    return target


def _parse(target: Path) -> dict[str, Any]:
    manifest = json.loads(target.read_text())
    files = manifest["files"]
    algorithm = manifest.get("algorithm")
    if algorithm not in _LABELS or not all(
        isinstance(v.get("size"), int) and isinstance(v.get(algorithm), str) for v in files.values()
    ):
        raise ValueError("unknown algorithm or malformed file entries")
    return manifest


def is_manifest(path: str | os.PathLike[str]) -> bool:
    """Whether the file at ``path`` is a manifest (of any checkpoint)."""
    try:
        _parse(Path(path))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def is_committed(checkpoint: str | os.PathLike[str]) -> bool:
    """Whether ``checkpoint`` is a committed checkpoint: it has a valid manifest (the commit
    protocol records one with every checkpoint it commits)."""
    return is_manifest(manifest_path(checkpoint))


def read_manifest(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of ``checkpoint``, or None when it has none.

    Raises:
        CheckpointError: the manifest exists but is not a valid manifest.
    """
    target = manifest_path(checkpoint)
    if not target.is_file():
        return None
    try:
        return _parse(target)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"{target} is not a valid manifest ({exc}); delete it, or record a new one with "
            "`shardwise ckpt verify --write-manifest` once the checkpoint is known to be good"
        ) from exc


def verify_manifest(
    checkpoint: str | os.PathLike[str],
    *,
    on_bytes: OnBytes | None = None,
    files: Iterable[str] | None = None,
) -> list[Problem]:
    """Compare every file the manifest lists (or the listed ones among ``files``, names
    relative to a directory checkpoint) with what is on disk; return what differs (an empty
    list: every file is present, with the recorded size and checksum).

    Raises:
        FileNotFoundError: ``checkpoint`` has no manifest.
        CheckpointError: its manifest is damaged.
    """
    return _verify(checkpoint, on_bytes, files, file_checksum)


def _verify(
    checkpoint: str | os.PathLike[str],
    on_bytes: OnBytes | None,
    files: Iterable[str] | None,
    checksum: Callable[..., str],
) -> list[Problem]:
    """:func:`verify_manifest`, each file hashed by ``checksum`` (``file_checksum``'s
    signature)."""
    checkpoint = Path(checkpoint)
    manifest = read_manifest(checkpoint)
    if manifest is None:
        raise FileNotFoundError(
            f"{checkpoint} has no manifest ({manifest_path(checkpoint).name}); record one with "
            "write_manifest() or `shardwise ckpt verify --write-manifest`"
        )
    return _compare(checkpoint, manifest, on_bytes, files, checksum)


def _compare(
    checkpoint: Path,
    manifest: dict[str, Any],
    on_bytes: OnBytes | None,
    files: Iterable[str] | None,
    checksum: Callable[..., str],
) -> list[Problem]:
    """:func:`_verify` against a manifest already read."""
    recorded_files = manifest["files"]
    if checkpoint.is_file() and checkpoint.name not in recorded_files and len(recorded_files) == 1:
        recorded_files = {checkpoint.name: next(iter(recorded_files.values()))}  # renamed
    if files is not None:
        wanted = set(files)
        recorded_files = {k: v for k, v in recorded_files.items() if k in wanted}
    algorithm = manifest["algorithm"]
    problems = []
    for rel, recorded in recorded_files.items():
        path = checkpoint / rel if checkpoint.is_dir() else checkpoint.with_name(rel)
        if not path.is_file():
            problems.append(Problem(rel, "missing (the manifest lists it)"))
            continue
        size = path.stat().st_size
        if size != recorded["size"]:
            problems.append(
                Problem(rel, f"size is {size} bytes, the manifest recorded {recorded['size']}")
            )
            continue
        digest = checksum(path, on_bytes, algorithm)
        if digest != recorded[algorithm]:
            problems.append(
                Problem(
                    rel,
                    f"{_LABELS[algorithm]} {digest[:12]} differs from the recorded "
                    f"{recorded[algorithm][:12]} (its bytes changed after the save)",
                )
            )
    return problems


def recorded_files(checkpoint: str | os.PathLike[str]) -> list[str]:
    """The files the manifest of ``checkpoint`` lists (relative names; none without one)."""
    manifest = read_manifest(checkpoint)
    return sorted(manifest["files"]) if manifest is not None else []


def check_checksums(checkpoint: str | os.PathLike[str], files: Iterable[str] | None = None) -> None:
    """Before loading: raise :class:`CheckpointError` naming every file of ``checkpoint``
    (among ``files``, default all) whose bytes differ from its manifest. A checkpoint without
    a manifest (written before manifests, or by another tool) has nothing to compare with and
    passes."""
    if manifest_path(checkpoint).is_file():
        _raise_if_damaged(checkpoint, verify_manifest(checkpoint, files=files))


def _raise_if_damaged(checkpoint: str | os.PathLike[str], problems: list[Problem]) -> None:
    if problems:
        raise CheckpointError(
            f"refusing to load {checkpoint}: its bytes differ from the checksums recorded when "
            f"it was saved ({'; '.join(map(str, problems))}). Load an older checkpoint, or "
            "pass verify_checksums=False to load it anyway"
        )


class ChecksumCheck:
    """:func:`check_checksums` in a background thread, while the caller reads the same files:
    the hashing (which releases the GIL) runs beside the load, and the page cache serves both
    reads of each byte; the thread hashes the pages where they lie (:func:`_mapped_checksum`:
    no second copy of the file, one GIL hand-off per 16 MiB). :meth:`result` waits and raises
    as :func:`check_checksums` does; call it before anything read is used.

    Example::

        check = ChecksumCheck(path)
        state = torch.load(path, weights_only=True)
        check.result()          # CheckpointError if the bytes differ from the manifest
        model.load_state_dict(state['state_dict'])
    """

    def __init__(
        self, checkpoint: str | os.PathLike[str], files: Iterable[str] | None = None
    ) -> None:
        self.checkpoint = Path(checkpoint)
        self._files = None if files is None else list(files)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="shardwise-verify", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if manifest_path(self.checkpoint).is_file():
                problems = _verify(self.checkpoint, None, self._files, _mapped_checksum)
                _raise_if_damaged(self.checkpoint, problems)
        except BaseException as exc:  # noqa: BLE001 - raised by result() in the caller's thread
            self._error = exc

    def result(self) -> None:
        """Wait for the check; raise its :class:`CheckpointError` (or its own failure)."""
        self._thread.join()
        if self._error is not None:
            raise self._error


@contextlib.contextmanager
def checksums_checked(
    checkpoint: str | os.PathLike[str], files: Iterable[str] | None = None, enabled: bool = True
) -> Iterator[None]:
    """Compare ``checkpoint``'s files with their manifest while the body reads them
    (:class:`ChecksumCheck`); raise on leaving if they differ. When the body fails, a
    mismatch is raised instead, since it explains the failure (the body's error chained)."""
    if not enabled:
        yield
        return
    check = ChecksumCheck(checkpoint, files)
    try:
        yield
    except Exception:
        check.result()
        raise
    check.result()


class ReadCheck:
    """What one rank reads of a checkpoint, compared with the checksums recorded at save time:
    whole files (:meth:`whole`) and chunks of files (:meth:`chunks`: byte ranges whose
    checksums the checkpoint's index records, :mod:`.records`) in a background thread beside
    the reads, and files checked at once (:meth:`check_now`: an index the caller is about to
    trust). Under resharding a rank reads some chunks of a file: it hashes those alone.
    :meth:`result` waits and raises :class:`CheckpointError` naming every damaged file, as
    :func:`check_checksums` does; call it before anything read is used. ``hashed``: the
    bytes hashed so far.

    Example::

        check = ReadCheck(path, ["meta.pt"])
        check.chunks("__0_0.distcp", [(0, 1024, "xxh3_64:9f86d081884c7d65", "w")])
        ...                                     # read those bytes meanwhile
        check.result()                          # CheckpointError if any differ
    """

    def __init__(self, checkpoint: str | os.PathLike[str], files: Iterable[str] = ()) -> None:
        self.checkpoint = Path(checkpoint)
        manifest = read_manifest(self.checkpoint)
        if manifest is None:
            raise FileNotFoundError(f"{self.checkpoint} has no manifest to check reads against")
        self._manifest = manifest
        self.hashed = 0
        self._counting = threading.Lock()  # the caller's thread and the checking thread count
        self._problems: list[Problem] = []
        self._queued: set[str] = set()
        self._tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="shardwise-verify", daemon=True)
        self._thread.start()
        for name in files:
            self.whole(name)

    def whole(self, name: str) -> None:
        """Check the file ``name`` (relative to the checkpoint) whole, once."""
        if name not in self._queued:
            self._queued.add(name)
            self._tasks.put((name, None))

    def chunks(self, name: str, ranges: Iterable[tuple[int, int, str, str]]) -> None:
        """Check byte ranges of the file ``name``: ``(offset, length, recorded checksum
        'algorithm:hex', what the range holds)`` each."""
        self._tasks.put((name, list(ranges)))

    def check_now(self, names: Iterable[str]) -> None:
        """Check the files ``names`` whole, now; raise at once if any differ."""
        names = list(names)
        problems = _compare(self.checkpoint, self._manifest, self._count, names, _mapped_checksum)
        self._queued.update(names)
        _raise_if_damaged(self.checkpoint, problems)

    def result(self) -> None:
        """Wait for the checks queued so far; raise :class:`CheckpointError` if any failed."""
        self._tasks.put(None)
        self._thread.join()
        _raise_if_damaged(self.checkpoint, self._problems)

    def _count(self, n: int) -> None:
        with self._counting:
            self.hashed += n

    def _run(self) -> None:
        while (task := self._tasks.get()) is not None:
            name, ranges = task
            try:
                if ranges is None:
                    self._problems += _compare(
                        self.checkpoint, self._manifest, self._count, [name], _mapped_checksum
                    )
                else:
                    self._problems += self._check_chunks(name, ranges)
            except Exception as exc:  # noqa: BLE001 - reported by result()
                self._problems.append(Problem(name, f"cannot be checked ({exc})"))

    def _check_chunks(self, name: str, ranges: list[tuple[int, int, str, str]]) -> list[Problem]:
        path = self.checkpoint / name
        if not path.is_file():
            return [Problem(name, "missing (the index refers to it)")]
        problems = []
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            for offset, length, recorded, what in sorted(ranges):
                algorithm, _, expected = recorded.partition(":")
                if algorithm not in _LABELS:
                    problems.append(
                        Problem(name, f"the chunk of {what!r}: unknown checksum {recorded!r}")
                    )
                    continue
                if offset + length > size:
                    problems.append(
                        Problem(
                            name,
                            f"truncated: the chunk of {what!r} ends at byte {offset + length}, "
                            f"the file has {size}",
                        )
                    )
                    continue
                digest = _range_checksum(f, offset, length, algorithm)
                self._count(length)
                if digest != expected:
                    problems.append(
                        Problem(
                            name,
                            f"the chunk of {what!r} at bytes {offset}-{offset + length}: "
                            f"{_LABELS[algorithm]} {digest[:12]} differs from the recorded "
                            f"{expected[:12]} (its bytes changed after the save)",
                        )
                    )
        return problems


def _range_checksum(f: Any, offset: int, length: int, algorithm: str) -> str:
    """The checksum of ``length`` bytes of the open file ``f`` from ``offset``, hashed where
    they lie (``mmap``, 16 MiB at a time, the GIL released), or read where a file cannot be
    mapped."""
    digest = new_checksum(algorithm)
    try:
        for first in range(offset, offset + length, _WINDOW):
            last = min(first + _WINDOW, offset + length)
            base = first - first % mmap.ALLOCATIONGRANULARITY
            with mmap.mmap(f.fileno(), last - base, offset=base, access=mmap.ACCESS_READ) as m:
                with memoryview(m) as view:
                    digest.update(view[first - base :])
    except (OSError, ValueError):  # not mappable here (e.g. a special file system)
        digest = new_checksum(algorithm)
        f.seek(offset)
        left = length
        while left > 0:
            data = f.read(min(left, _CHUNK))
            if not data:
                break
            digest.update(data)
            left -= len(data)
    return digest.hexdigest()


class PendingManifest:
    """A manifest staged by :func:`stage_manifest`; :meth:`commit` moves a file
    checkpoint's sidecar into place (a directory's manifest travels with the directory).
    Committing twice, or after another stage-and-commit of the same save, is harmless."""

    def __init__(self, staged: Path | None = None, final: Path | None = None) -> None:
        self._staged = staged
        self._final = final

    def commit(self) -> None:
        if self._staged is not None and self._final is not None and self._staged.exists():
            os.replace(self._staged, self._final)
            fsync_dir(self._final.parent)


def stage_manifest(
    staging: str | os.PathLike[str],
    final: str | os.PathLike[str],
    *,
    known: Mapping[str, Mapping[str, Any]] | None = None,
    run: Mapping[str, Any] | None = None,
) -> PendingManifest:
    """The commit-protocol hook: record the manifest of ``staging`` before it is renamed to
    ``final``; call ``.commit()`` on the result after the rename. ``known``: entries the
    writing ranks hashed already (see :func:`build_manifest`).

    A directory gets ``manifest.json`` inside, so the rename publishes both at once. A file's
    sidecar is written under a staging name, and the old sidecar (which describes the file
    about to be replaced) is removed first: at every moment the checkpoint has either no
    manifest or the one that describes it.
    """
    staging, final = Path(staging), Path(final)
    sidecar = sidecar_path(final)
    if staging.is_dir():
        write_synced(staging / MANIFEST, _dump(build_manifest(staging, known=known, run=run)))
        sidecar.unlink(missing_ok=True)  # left by a file checkpoint this directory replaces
        return PendingManifest()
    staged = staging_path(sidecar)
    write_synced(staged, _dump(build_manifest(staging, name=final.name, known=known, run=run)))
    sidecar.unlink(missing_ok=True)
    return PendingManifest(staged, sidecar)
