"""Reading a checkpoint from object storage: a sparse local copy, its bytes fetched on demand.

shardwise's readers (``torch.load``, DCP's reader, the checksum checks) read local files. A
checkpoint at a URL is opened as a :class:`RemoteCheckpoint`: one listing of its objects, then
a private local directory in which every object is a file of its size (holes, no bytes yet),
so that what the readers look at first (which files there are, their sizes) is already right.
Bytes come by ranged reads, in parallel, only where a reader is about to read them:

- the small files every reader needs (the manifest, ``meta.pt``, ``layout.json``,
  ``.metadata``) and a single-file checkpoint whole, when it is opened for reading
  (:meth:`RemoteCheckpoint.fetch`);
- a sharded resume fetches the metadata fragments it reads, then the byte ranges of the
  chunks (records) that overlap its own shards (:meth:`RemoteCheckpoint.fetch_chunks`,
  called by :mod:`.sharded` through :func:`mirror_of`): an FSDP rank resuming on the same
  mesh reads its own file and rank 0's fragment, not the others' bytes.

A hole read by mistake reads as zeros, which no checksum passes: never as another byte.
Every read is pinned to the version of its object listed at open (S3: its VersionId, else
its ETag, sent as If-Match): a checkpoint deleted or overwritten while it is read (by the
retention of another run writing the prefix, say) is a :class:`~.files.CheckpointError`
saying so, never a mix of two versions' bytes.

Example::

    with RemoteCheckpoint('s3://bucket/run/iter_10.pth') as remote:
        remote.fetch()                        # everything (one process reads it whole)
        state = read_checkpoint(remote.path)  # the local reader, checksums included
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from .files import SIDECAR_SUFFIX, CheckpointError
from .storage import (
    READ_BATCH,
    READ_PIECE,
    ObjectChangedError,
    ObjectURL,
    list_objects,
    location,
    object_info,
    pin,
    read_ranges,
    spool_directory,
)

__all__ = ["RemoteCheckpoint", "local_checkpoint", "mirror_of", "read_remote"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

_OPEN: dict[str, RemoteCheckpoint] = {}
_OPEN_LOCK = threading.Lock()

Range = tuple[int, int]  # [start, end)


def mirror_of(path: str | os.PathLike[str]) -> RemoteCheckpoint | None:
    """The :class:`RemoteCheckpoint` whose local copy is at ``path``, or None (a checkpoint
    on local disk: nothing to fetch)."""
    if not _OPEN:
        return None
    with _OPEN_LOCK:
        return _OPEN.get(str(path))


class RemoteCheckpoint:
    """A checkpoint at ``url`` (a single object with its ``.manifest.json`` beside it, or a
    prefix of objects) mirrored sparsely on local disk at :attr:`path` (see the module
    docstring). A context manager: leaving it removes the local copy.

    Raises:
        FileNotFoundError: no object is at ``url`` or under it.
    """

    def __init__(self, url: str) -> None:
        self.url = ObjectURL(url)
        files = self._list()
        if not files:
            raise FileNotFoundError(
                f"checkpoint {str(url)!r} does not exist; give the path of a checkpoint file or "
                "directory (work_dir/last_checkpoint names the latest one)"
            )
        self._root = spool_directory("read")
        self.is_dir = self.url.name not in files
        self.path = self._root / self.url.name
        #: object name (relative to the checkpoint, or the file's own name) -> its size
        self.sizes = {rel: int(info["size"]) for rel, info in files.items()}
        #: by object URL, the version a read asks for (:func:`~.storage.pin`)
        self.pins = {self.remote(rel): pin(info) for rel, info in files.items()}
        self._fetched: dict[str, list[Range]] = {}
        self._lock = threading.Lock()
        for rel, size in self.sizes.items():
            local = self.local(rel)
            local.parent.mkdir(parents=True, exist_ok=True)
            with open(local, "wb") as f:
                f.truncate(size)
        with _OPEN_LOCK:
            _OPEN[str(self.path)] = self

    def _list(self) -> dict[str, dict[str, Any]]:
        info = object_info(self.url)
        if info is None:
            return list_objects(self.url)
        files = {self.url.name: info}
        sidecar = object_info(self.url + SIDECAR_SUFFIX)
        if sidecar is not None:
            files[self.url.name + SIDECAR_SUFFIX] = sidecar
        return files

    @property
    def fetched(self) -> dict[str, int]:
        """Bytes fetched so far, by object."""
        with self._lock:
            return {name: sum(e - s for s, e in spans) for name, spans in self._fetched.items()}

    def local(self, name: str) -> Path:
        """Where the object ``name`` is in the local copy."""
        return self.path / name if self.is_dir else self._root / name

    def remote(self, name: str) -> ObjectURL:
        return self.url / name if self.is_dir else self.url.with_name(name)

    # ------------------------------------------------------------------ fetching
    def fetch(self, names: Iterable[str] | None = None) -> None:
        """Fetch these objects whole (None: every one); names the checkpoint lacks are
        skipped."""
        wanted = (
            self.sizes if names is None else {n: self.sizes[n] for n in names if n in self.sizes}
        )
        self.fetch_ranges({name: [(0, size)] for name, size in wanted.items()})

    def fetch_ranges(self, ranges: Mapping[str, Iterable[Range]]) -> None:
        """Fetch byte ranges of objects (what is fetched already is not read again), in
        pieces of ``READ_PIECE`` bytes read in parallel, ``READ_BATCH`` bytes at a time."""
        with self._lock:
            pieces: list[tuple[str, int, int]] = []
            for name, spans in ranges.items():
                for start, end in _missing(spans, self._fetched.get(name, [])):
                    for first in range(start, end, READ_PIECE):
                        pieces.append((name, first, min(end, first + READ_PIECE)))
            batch: list[tuple[str, int, int]] = []
            size = 0
            for piece in [*pieces, None]:
                if piece is not None:
                    batch.append(piece)
                    size += piece[2] - piece[1]
                if batch and (piece is None or size >= READ_BATCH):
                    self._fetch_batch(batch)
                    batch, size = [], 0

    def _fetch_batch(self, pieces: list[tuple[str, int, int]]) -> None:
        try:
            data = read_ranges([(self.remote(n), s, e) for n, s, e in pieces], self.pins)
        except ObjectChangedError as exc:
            raise CheckpointError(
                f"checkpoint {self.url} was deleted or overwritten while it was being read: "
                f"{exc}; another process changed it (the retention of another run writing "
                "this prefix, say): read it again, or a newer checkpoint"
            ) from None
        for (name, start, end), chunk in zip(pieces, data):
            fd = os.open(self.local(name), os.O_WRONLY)
            try:
                os.pwrite(fd, chunk, start)
            finally:
                os.close(fd)
            self._fetched[name] = _merged([*self._fetched.get(name, []), (start, end)])

    def fetch_chunks(self, metadata: Any, wanted: Mapping[str, list[Any]]) -> None:
        """Fetch the records (chunks) of a DCP ``metadata`` that overlap the ``wanted``
        chunks (``{key: [(offsets, sizes), ...]}``, :func:`.planning.wanted_chunks`): the
        byte ranges a rank's load reads (DCP reads a record whole)."""
        ranges: dict[str, list[Range]] = {}
        storage = metadata.storage_data or {}
        for key, chunks in wanted.items():
            entry = metadata.state_dict_metadata.get(key)
            for stored in getattr(entry, "chunks", ()):
                region = (tuple(stored.offsets), tuple(stored.sizes))
                if not any(_overlaps(region, chunk) for chunk in chunks):
                    continue
                info = _storage_info(storage, key, stored.offsets)
                if info is not None:
                    span = (info.offset, info.offset + info.length)
                    ranges.setdefault(info.relative_path, []).append(span)
        self.fetch_ranges(ranges)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Remove the local copy."""
        with _OPEN_LOCK:
            _OPEN.pop(str(self.path), None)
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> RemoteCheckpoint:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _storage_info(storage: Mapping[Any, Any], key: str, offsets: Any) -> Any:
    """The ``_StorageInfo`` of the chunk of ``key`` at ``offsets`` (DCP's ``MetadataIndex``
    compares by key and offsets)."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    return storage.get(MetadataIndex(key, offsets))


def _overlaps(a: tuple[Any, Any], b: tuple[Any, Any]) -> bool:
    """Whether two chunks ``(offsets, sizes)`` share an element."""
    if any(n == 0 for n in a[1]) or any(n == 0 for n in b[1]):
        return False
    return all(
        max(ao, bo) < min(ao + an, bo + bn) for ao, an, bo, bn in zip(a[0], a[1], b[0], b[1])
    )


def _merged(spans: Iterable[Range]) -> list[Range]:
    out: list[Range] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _missing(spans: Iterable[Range], have: Iterable[Range]) -> list[Range]:
    """The parts of ``spans`` not in ``have`` (both merged)."""
    have = _merged(have)
    out: list[Range] = []
    for start, end in _merged(spans):
        cursor = start
        for h_start, h_end in have:
            if h_end <= cursor or h_start >= end:
                continue
            if h_start > cursor:
                out.append((cursor, h_start))
            cursor = max(cursor, h_end)
        if cursor < end:
            out.append((cursor, end))
    return out


def read_remote(
    url: str,
    read: Callable[[Path], T],
    first: Callable[[RemoteCheckpoint], Iterable[str] | None],
) -> T:
    """``read(path)`` of a local copy of the checkpoint at ``url``: what ``first(remote)``
    names fetched before (None: everything), the rest where the readers read it; the copy is
    removed afterwards."""
    with RemoteCheckpoint(url) as remote:
        remote.fetch(first(remote))
        result = read(remote.path)
        fetched, size = sum(remote.fetched.values()), sum(remote.sizes.values())
        logger.debug("Read %s: fetched %d of its %d bytes", url, fetched, size)
        return result


@contextlib.contextmanager
def local_checkpoint(path: str | os.PathLike[str]) -> Iterator[Path]:
    """``path`` on local disk: itself, or, for a URL, the checkpoint fetched whole into a
    temporary local copy, removed on leaving (the ``shardwise ckpt`` tools)."""
    where = location(path)
    if not isinstance(where, ObjectURL):
        yield where
        return
    with RemoteCheckpoint(where) as remote:
        remote.fetch()
        yield remote.path
