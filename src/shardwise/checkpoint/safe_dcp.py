"""Reading DCP checkpoints without executing anything from them, and only the bytes needed.

``torch.distributed.checkpoint``'s ``FileSystemReader`` reads a checkpoint's ``.metadata`` with
plain ``pickle.load``: a crafted ``.metadata`` could run code. :class:`SafeFileSystemReader`
reads it with :func:`.dcp_index.load_dcp_metadata` (an allow-list of the inert classes DCP's
metadata is made of), or, for a checkpoint saved without a central gather (:mod:`.planning`),
merges the metadata fragments of every rank.

It also reads less when resharding. DCP stores each saved shard as one ``torch.save`` record,
and its reader loads a record whole even when this rank needs a slice of it (a checkpoint
saved on 1 rank, loaded on 2: every rank would read every tensor whole, twice the bytes of a
same-size load). :class:`SafeFileSystemReader` reads the record's pickle alone (its tensor on
the meta device, which gives the data's offset), then only the byte range of the slice when
that range is contiguous (a slice along the first dimension, FSDP's sharding), and falls back
to DCP's whole-record read otherwise.

Example::

    dcp.load(state_dict, storage_reader=SafeFileSystemReader(path))
    metadata = read_dcp_metadata(path)   # the index of every chunk, checked
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from .dcp_index import DCP_METADATA, check_dcp_metadata, load_dcp_metadata
from .files import CheckpointError
from .planning import LAYOUT_FILE, is_fragmented, merged_metadata
from .records import chunk_checksum

__all__ = ["SafeFileSystemReader", "read_dcp_metadata"]


#: Bytes after a stored tensor's data in its torch.save record (measured: 841–873), and the
#: margin :meth:`SafeFileSystemReader._prefetch` adds around the range it asks for.
_TRAILER = 860
_SLACK = 4096
#: Record frames :meth:`SafeFileSystemReader._layout` keeps per record length.
_FRAMES_PER_LENGTH = 4


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` is read by :func:`.dcp_index.load_dcp_metadata`
    (or given: ``metadata``, an index already read, for several loads) and which reads only
    the byte range a rank needs of each stored tensor (see the module docstring).

    ``check``: a :class:`~.manifest.ReadCheck` told of every stored chunk read (hashed beside
    the reads): a chunk's own checksum where the index records one (:mod:`.records`), else
    its whole file (a checkpoint saved before chunks had checksums)."""

    def __init__(
        self, path: str | os.PathLike[str], *, check: Any = None, metadata: Metadata | None = None
    ) -> None:
        super().__init__(path)
        self.check = check
        self._known = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's index: the ``metadata`` given at construction (read once for
        several loads), else ``.metadata`` or, saved without a gather, every rank's fragment
        merged; a rank's own fragment with ``rank=``."""
        path = self._get_metadata_path(kwargs.get("rank"))
        if self._known is not None and kwargs.get("rank") is None:
            metadata = self._known
        elif kwargs.get("rank") is None and not os.path.exists(path) and is_fragmented(self.path):
            metadata = merged_metadata(self.path)  # saved without a gather: its fragments
        else:
            with self.fs.create_stream(path, "rb") as stream:
                metadata = load_dcp_metadata(stream, source=str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _note_reads(self, plan: LoadPlan) -> None:
        """Tell the check which stored chunks this plan reads (each once)."""
        chunks: dict[str, dict[tuple[int, int], tuple[int, int, str, str]]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            recorded = chunk_checksum(info)
            if recorded is None:
                self.check.whole(info.relative_path)
            else:
                chunks.setdefault(info.relative_path, {})[(info.offset, info.length)] = (
                    info.offset,
                    info.length,
                    recorded,
                    item.storage_index.fqn,
                )
        for name, ranges in chunks.items():
            self.check.chunks(name, ranges.values())

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if self.check is not None:
            self._note_reads(plan)
        if any(self.storage_data[r.storage_index].transform_descriptors for r in plan.items):
            return super().read_data(plan, planner)  # compressed & co.: DCP's own reader
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:  # load_dcp_metadata admits tensors only
                raise CheckpointError(f"{self.path}: a pickled object, not a tensor, was requested")
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(
                item
            )
        for relative_path, items in per_file.items():
            items.sort(key=lambda i: self.storage_data[i.storage_index].offset)
            with self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb") as f:
                self._prefetch(f, items)
                # one rank wrote the file, in its byte order: the first record tells
                orders = self.__dict__.setdefault("_byte_orders", {})  # (kept over loads)
                little = orders.get(relative_path)
                if little is None:
                    first = self._slice_file(f, self.storage_data[items[0].storage_index])
                    little = orders[relative_path] = _little_endian(first)
                for item in items:
                    target = planner.resolve_tensor(item).detach()
                    self._read_slice(f, item, little, target)
                    planner.commit_tensor(item, target)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args)
        self._tensors = metadata.state_dict_metadata

    def _prefetch(self, stream: Any, items: list[ReadItem]) -> None:
        """Have the kernel start reading, all at once and in the background, the bytes these
        items need (``POSIX_FADV_WILLNEED``): a rank that reads every other slice of a file
        (a resharded load) would otherwise wait for each read in turn, readahead stopping at
        every gap. A record's data ends ``_TRAILER`` bytes before the record does (torch.save's
        last entries and zip directory); the range is taken from there, widened by
        ``_SLACK`` on each side, and the record's first and last ``_SLACK`` bytes (its pickle
        and zip directory, read first). Only a hint: a wrong range costs time, never data."""
        if not hasattr(os, "posix_fadvise") or not hasattr(stream, "fileno"):
            return
        fd = stream.fileno()
        wanted: list[tuple[int, int]] = []
        for item in items:
            info = self.storage_data[item.storage_index]
            begin, end = info.offset, info.offset + info.length
            ranges = [(begin, end)]  # the whole record, unless the part is one run
            stored = self._stored_chunk(item)
            run = (
                None
                if stored is None
                else _contiguous_run(stored, item.storage_offsets, item.lengths)
            )
            if run is not None:
                itemsize = stored.element_size()
                data = end - _TRAILER - stored.numel() * itemsize + run[0] * itemsize
                ranges = [
                    (begin, begin + _SLACK),  # torch.load reads the pickle ...
                    (end - _SLACK, end),  # ... after the zip directory at the end
                    (data - _SLACK, data + run[1] * itemsize + _SLACK),
                ]
            for first, last in ranges:
                first, last = max(first, begin), min(last, end)
                if last > first:  # a length of 0 would mean: to the end of the file
                    wanted.append((first, last))
        # one call per run of nearby ranges: a rank reading a file whole asks once
        for first, last in _merged(wanted, _SLACK):
            os.posix_fadvise(fd, first, last - first, os.POSIX_FADV_WILLNEED)

    def _stored_chunk(self, item: ReadItem) -> torch.Tensor | None:
        """The stored chunk ``item`` reads from, as a meta tensor (its shape and dtype)."""
        entry = getattr(self, "_tensors", {}).get(item.storage_index.fqn)
        if not isinstance(entry, TensorStorageMetadata):
            return None
        offsets = list(item.storage_index.offset)
        hint = item.storage_index.index  # DCP's guess of the chunk's position
        candidates = entry.chunks
        if hint is not None and 0 <= hint < len(candidates):
            candidates = [candidates[hint], *candidates]
        chunk = next((c for c in candidates if list(c.offsets) == offsets), None)
        if chunk is None:
            return None
        return torch.empty(chunk.sizes, dtype=entry.properties.dtype, device="meta")

    def _read_slice(
        self, stream: Any, item: ReadItem, little_endian: bool, target: torch.Tensor
    ) -> None:
        """Read the part of a stored tensor ``item`` asks for into ``target``: its byte range
        alone when the record is little-endian and the part is one contiguous run (straight
        into ``target``'s memory when it is a contiguous CPU tensor of the stored dtype), else
        the whole record, narrowed."""
        info = self.storage_data[item.storage_index]
        record = self._slice_file(stream, info)
        stored, offset = self._layout(record, info.length)
        run = _contiguous_run(stored, item.storage_offsets, item.lengths)
        if offset is None or run is None or not little_endian:
            record.seek(0)
            whole = torch.load(record, map_location="cpu", weights_only=True)
            for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths)):
                whole = whole.narrow(dim, start, length)
            target.copy_(whole)
            return
        start, count = run
        direct = (
            target.device.type == "cpu" and target.dtype == stored.dtype and target.is_contiguous()
        )
        data = target if direct else torch.empty(count, dtype=stored.dtype)
        raw = memoryview(data.reshape(-1).view(torch.uint8).numpy()) if count else memoryview(b"")
        record.seek(offset + start * stored.element_size())
        if count and record.readinto(raw) != raw.nbytes:
            raise CheckpointError(
                f"{self.path}: the record of {item.storage_index.fqn} is truncated"
            )
        if not direct:
            target.copy_(data.view(item.lengths))

    def _layout(self, record: Any, length: int) -> tuple[torch.Tensor, int | None]:
        """The stored tensor of a ``torch.save`` record of ``length`` bytes (on the meta
        device: shape, stride, dtype, storage offset) and where its storage's bytes start in
        the record.

        ``torch.load`` (``weights_only``) of every record costs ~0.1 ms of Python each, most
        of a resume's time beside the reads at ~1,000 records per rank; records whose pickle
        (``data.pkl``) is byte for byte one already loaded describe the same tensor, so only
        the storage offset is looked up for them (``torch.load`` takes it from the same zip
        directory). The first record of each kind goes through ``torch.load``.

        Parsing the zip directory is then most of the rest (~14 small reads a record). A
        record whose bytes before and after its tensor's data (its *frame*: pickle, zip
        headers, directory) are those of a record parsed already holds the same tensor at the
        same offset, the zip reader reading nothing else; records written from one template
        (:mod:`.records`) share their frame, so two small reads and two comparisons replace
        the parse. Where the frames of one kind differ (torch's CRC-32s, in a header, differ
        with the data), records of that length are parsed."""
        frames = self.__dict__.setdefault("_frames", {})
        for head, tail, stored, offset in frames.get(length) or ():
            record.seek(0)
            if record.read(len(head)) == head:
                record.seek(length - len(tail))
                if record.read(len(tail)) == tail:
                    return stored, offset
        cache = self.__dict__.setdefault("_layouts", {})
        record.seek(0)
        try:
            archive = torch._C.PyTorchFileReader(record)
            pickled = archive.get_record("data.pkl")
        except RuntimeError:  # not a zip record: torch.load says what it is
            archive = pickled = None
        known = cache.get(pickled) if pickled is not None else None
        if known is not None:
            stored, name = known
            if frames.get(length):  # a kind seen, its frame not: frames differ at this length
                frames[length] = None
            return stored, archive.get_record_offset(name)
        record.seek(0)
        stored = torch.load(record, map_location="meta", weights_only=True)
        offset = getattr(stored.untyped_storage(), "_checkpoint_offset", None)
        if archive is None or offset is None:
            return stored, offset
        names = [n for n in archive.get_all_records() if n.startswith("data/")]
        if len(names) == 1 and archive.get_record_offset(names[0]) == offset:
            cache[pickled] = (stored, names[0])
            self._remember_frame(record, length, stored, offset)
        return stored, offset

    def _remember_frame(self, record: Any, length: int, stored: torch.Tensor, offset: int) -> None:
        """Keep the frame of a parsed record (see :meth:`_layout`): a few kinds per length."""
        kinds = self._frames.setdefault(length, [])
        end = offset + stored.untyped_storage().nbytes()
        if kinds is None or len(kinds) >= _FRAMES_PER_LENGTH or not offset <= end <= length:
            return
        record.seek(0)
        head = record.read(offset)
        record.seek(end)
        tail = record.read(length - end)
        if len(head) == offset and len(tail) == length - end:
            kinds.append((head, tail, stored, offset))


def _merged(ranges: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """``ranges`` sorted, those less than ``gap`` bytes apart merged into one."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def _contiguous_run(
    stored: torch.Tensor, offsets: Sequence[int], lengths: Sequence[int]
) -> tuple[int, int] | None:
    """``(first element, element count)`` in the storage of the slice of ``stored`` starting at
    ``offsets`` with ``lengths`` when it is one contiguous run, else None."""
    if not stored.is_contiguous():
        return None
    shape = list(stored.shape)
    partial = [d for d, (n, k) in enumerate(zip(shape, lengths)) if n != k]
    if partial and (
        any(k != n for n, k in zip(shape[partial[0] + 1 :], lengths[partial[0] + 1 :]))
        or any(n != 1 for n in shape[: partial[0]])
    ):
        return None
    start = stored.storage_offset() + sum(o * s for o, s in zip(offsets, stored.stride()))
    return start, math.prod(lengths)


def _little_endian(record: Any) -> bool:
    """Whether a ``torch.save`` record holds little-endian data (this machine's order)."""
    if sys.byteorder != "little":
        return False
    record.seek(0)
    archive = torch._C.PyTorchFileReader(record)
    return not archive.has_record("byteorder") or archive.get_record("byteorder") == b"little"


def read_dcp_metadata(path: str | os.PathLike[str]) -> Metadata:
    """DCP's index of the sharded checkpoint directory ``path``: ``.metadata``, or every
    rank's metadata fragment merged, read safely and checked field by field.

    Raises:
        CheckpointError: the index cannot be read, naming the file (a damaged or missing
            ``.metadata`` or fragment).
    """
    path = Path(path)
    try:
        metadata = SafeFileSystemReader(path).read_metadata()
        check_dcp_metadata(metadata)
        return metadata
    except Exception as exc:  # noqa: BLE001 - a damaged .metadata fails in many ways
        where = path / DCP_METADATA
        if not where.is_file() and (path / LAYOUT_FILE).is_file():
            where = path / "__{rank}.metadata"  # the fragments, which the message names
        raise CheckpointError(
            f"{where} cannot be read ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); the sharded checkpoint "
            "is damaged or was cut short"
        ) from exc
