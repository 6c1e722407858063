"""A rank's DCP data file, written by shardwise: the records DCP's reader expects, byte for byte,
each with its own checksum.

DCP's ``FileSystemWriter`` stores each write item of a rank as one ``torch.save`` archive (a
*record*) in the rank's ``.distcp`` file, at the offset and length its index (``_StorageInfo``)
records; ``FileSystemReader`` (``dcp.load``, ``dcp_to_torch_save``) reads each record back with
``torch.load(weights_only=True)``. :func:`write_records` writes the same file, with two changes
no reader sees:

- **a checksum per record** (per chunk): each record's XXH3-64 is kept in its
  ``_StorageInfo`` (an extra attribute, :data:`CHECKSUM`, which DCP's readers ignore and its
  pickle carries into the metadata fragment and ``.metadata``), so that a rank that reads some
  of a file's chunks (a resume under resharding) checks only those
  (:class:`~.manifest.ReadCheck`); the file's own checksum (the manifest's) is taken on the way;
- **records from templates**: a ``torch.save`` of a plain contiguous tensor written without
  CRC-32s is, apart from the tensor's bytes, the same for every tensor of one dtype, shape and
  stride (its pickle, zip entries, directory and serialization id). The first record of each
  kind is written by ``torch.save`` and kept as a :class:`_Template`; the next are its head,
  the tensor's bytes and its tail: three writes instead of a pickler and a zip writer per
  record (a ~10M-parameter AdamW state is 768 records per rank on 2 ranks). The templates are
  written without CRC-32s on any thread, torch's process-wide switch left alone (a snapshot
  written in the background). Anything else (a subclass, ``requires_grad``, an empty tensor)
  goes through ``torch.save``;
- **a file written again** (``rewrite=True``: a memory snapshot's slot, rewritten every step
  with a state of the same layout): where this process wrote the file last with records of
  the same kinds at the same places, only the tensors' bytes are copied into its mapped pages,
  and the checksums are taken over the bytes in the file. A file changed since by another
  writer (its identity: inode, size, modification time) is written whole.

Example::

    results, digest = write_records(path, "__0_0.distcp", plan.items, planner, sync=True)
    results[0].storage_data.checksum      # 'xxh3_64:9f86d081884c7d65'
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import (
    _item_size,
    _OverlappingCpuLoader,
    _SerialCpuLoader,
    _StorageInfo,
)
from torch.distributed.checkpoint.planner import SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from .files import file_identity
from .full import HashingWriter
from .manifest import ALGORITHM, new_checksum

__all__ = ["CHECKSUM", "chunk_checksum", "forget", "write_records"]

#: The ``_StorageInfo`` attribute holding a record's checksum, ``"xxh3_64:<hex>"``.
CHECKSUM = "checksum"


def chunk_checksum(info: Any) -> str | None:
    """The checksum recorded for one stored chunk (``"algorithm:hex"``), or None (a record
    written by DCP's own writer, or before shardwise recorded them)."""
    value = getattr(info, CHECKSUM, None)
    return value if isinstance(value, str) else None


class _Template:
    """A ``torch.save`` record of one kind of tensor, split around the tensor's bytes."""

    def __init__(self, head: bytes, tail: bytes) -> None:
        self.head, self.tail = head, tail


#: (dtype, shape, stride, storage alignment) -> the template, or None (that kind's records
#: are not template-shaped: always torch.save)
_TEMPLATES: dict[tuple[Any, ...], _Template | None] = {}


def _crc32_on() -> bool:
    get = getattr(torch.serialization, "get_crc32_options", None)
    return True if get is None else bool(get())


def _alignment() -> int:
    try:
        from torch.utils.serialization import config
    except ImportError:  # torch before its serialization config
        return 64
    return int(getattr(config.save, "storage_alignment", 64))


def _plain(tensor: torch.Tensor) -> bool:
    """Whether ``torch.save(tensor)`` depends on nothing but its dtype, shape, stride and
    bytes: a dense CPU tensor owning exactly its storage, with no autograd or Python state."""
    return (
        type(tensor) is torch.Tensor
        and tensor.layout == torch.strided
        and tensor.device.type == "cpu"
        and tensor.numel() > 0
        and tensor.is_contiguous()
        and tensor.storage_offset() == 0
        and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
        and not tensor.requires_grad
        and not tensor.is_quantized
        and not tensor.is_conj()
        and not tensor.is_neg()
        and not tensor.__dict__
    )


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """A view of a contiguous CPU tensor's bytes (no copy)."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def _saved_without_crc32(tensor: torch.Tensor) -> memoryview | None:
    """``torch.save(tensor)`` as torch writes it with its CRC-32s off, on any thread (torch's
    switch is process-wide, and a background save must not turn it off under the training
    thread); None where this torch's writer takes other arguments."""
    buffer = io.BytesIO()
    try:
        writer = torch._C.PyTorchFileWriter(buffer, False, _alignment())
        torch.serialization._save(
            tensor, writer, pickle, torch.serialization.DEFAULT_PROTOCOL, False
        )
        writer.write_end_of_file()
    except TypeError:
        return None
    return buffer.getbuffer()


def _record(tensor: torch.Tensor, put: Callable[[Any], None]) -> None:
    """Write ``tensor``'s record through ``put``: from its template, or by ``torch.save``
    (keeping a template of it when it is the first of its kind)."""
    if _plain(tensor):
        key = (tensor.dtype, tuple(tensor.shape), tensor.stride(), _alignment())
        if key not in _TEMPLATES:
            record = _saved_without_crc32(tensor)
            if record is None and not _crc32_on():
                record = _saved(tensor)
            if record is not None:
                _TEMPLATES[key] = _template(record, tensor)
                put(record)
                return
        template = _TEMPLATES.get(key)
        if template is not None:
            put(template.head)
            put(_bytes_of(tensor))
            put(template.tail)
            return
    put(_saved(tensor))


def _saved(tensor: torch.Tensor) -> memoryview:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getbuffer()


def _template(record: memoryview, tensor: torch.Tensor) -> _Template | None:
    """``record`` split around ``tensor``'s bytes, if it holds them once, in one data entry."""
    try:
        archive = torch._C.PyTorchFileReader(io.BytesIO(bytes(record)))
        entries = [n for n in archive.get_all_records() if n.startswith("data/")]
        if len(entries) != 1:
            return None
        offset = archive.get_record_offset(entries[0])
    except RuntimeError:
        return None
    data = _bytes_of(tensor)
    end = offset + data.nbytes
    if record[offset:end] != data:
        return None
    return _Template(bytes(record[:offset]), bytes(record[end:]))


def _on_cpu(
    items: list[WriteItem], planner: SavePlanner, copy_ahead: int
) -> Iterator[tuple[torch.Tensor, WriteItem]]:
    """The items' tensors on the CPU, by DCP's own loaders as its writer picks them: copied
    from an accelerator ahead of the writes where one is available, else one by one (a view
    made compact)."""
    backend = getattr(torch, torch._C._get_privateuse1_backend_name(), None)
    accelerator = torch.cuda.is_available() or (backend is not None and backend.is_available())
    loader: Any
    if accelerator and copy_ahead > 0:
        loader = _OverlappingCpuLoader(planner.resolve_data, inflight_threshhold=copy_ahead)
    else:
        loader = _SerialCpuLoader(planner.resolve_data)
    for item in items:
        loader.add(_item_size(item), item)
    loader.start_loading()
    for tensor, item in loader.values():
        yield tensor if tensor.is_cpu else tensor.cpu(), item


class _Put:
    """Writes one record's bytes to the file, counting and hashing them."""

    def __init__(self, out: HashingWriter) -> None:
        self.out, self.digest, self.length = out, new_checksum(), 0

    def __call__(self, data: Any) -> None:
        self.digest.update(data)
        self.length += self.out.write(data)


def write_records(
    path: str | os.PathLike[str],
    storage_key: str,
    items: Sequence[WriteItem],
    planner: SavePlanner,
    sync: bool = True,
    copy_ahead: int = 10_000_000,
    rewrite: bool = False,
) -> tuple[list[WriteResult], str]:
    """Write ``items`` (one rank's plan) to the data file ``path`` (``storage_key``: its name
    in the index) as DCP's ``FileSystemWriter`` would, in its order (byte items first, then
    the tensors as its loader hands them over); return the write results, each record's
    checksum in its ``_StorageInfo``, and the file's checksum. ``sync``: fsync the file
    before returning; ``copy_ahead``: bytes copied from an accelerator ahead of the writes
    (DCP's ``per_thread_copy_ahead``). ``rewrite``: the file is written again and again with
    the same records (a memory snapshot's slot): where this process wrote it last with
    records of the same kinds, only the tensors' bytes are written over (:func:`_rewrite`)."""
    path = os.fspath(path)
    if rewrite:
        done = _rewrite(path, storage_key, items, planner, sync)
        if done is not None:
            return done
    _LAYOUTS.pop(path, None)
    byte_items = [i for i in items if i.type == WriteItemType.BYTE_IO]
    tensor_items = [i for i in items if i.type != WriteItemType.BYTE_IO]
    results: list[WriteResult] = []
    # an existing file is written over, not truncated first: its pages are reused (a memory
    # snapshot's slot, rewritten every step), and it is cut to its new length at the end
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT, 0o666), "wb") as f:
        out = HashingWriter(f)
        position = 0
        resolved = ((planner.resolve_data(i), i) for i in byte_items)
        for data, item in chain(resolved, _on_cpu(tensor_items, planner, copy_ahead)):
            put = _Put(out)
            if item.type == WriteItemType.BYTE_IO:
                put(data.getbuffer())
            else:
                _record(data, put)
            info = _StorageInfo(storage_key, position, put.length)
            setattr(info, CHECKSUM, f"{ALGORITHM}:{put.digest.hexdigest()}")
            results.append(
                WriteResult(index=item.index, size_in_bytes=put.length, storage_data=info)
            )
            position += put.length
        f.flush()
        f.truncate(position)
        if sync:
            os.fsync(f.fileno())
    if rewrite and not byte_items:
        _remember(path, results, planner)
    return results, out.hexdigest()


def record_bytes(tensor: torch.Tensor) -> bytes:
    """The record :func:`write_records` writes for ``tensor`` (for tests: it must equal
    ``torch.save``'s)."""
    chunks: list[bytes] = []
    _record(tensor, lambda data: chunks.append(bytes(data)))
    return b"".join(chunks)


class _Layout:
    """Where :func:`write_records` put each tensor record of a file it may write again: in the
    file's order, each record's index, template key and offset; the file as it left it, and
    its pages mapped once written again (a copy into them costs half a ``pwrite``)."""

    def __init__(self, records: list[tuple[Any, tuple[Any, ...], int]], identity: tuple) -> None:
        self.records, self.identity = records, identity
        self.mapped: torch.Tensor | None = None


#: data file -> its layout, for the files written with ``rewrite`` (a memory tier's slots)
_LAYOUTS: dict[str, _Layout] = {}


def forget(directory: str | os.PathLike[str]) -> None:
    """Drop what :func:`write_records` keeps of the files under ``directory`` (their pages
    mapped): a memory tier's directory that is removed."""
    prefix = os.path.join(os.fspath(directory), "")
    for path in [p for p in _LAYOUTS if p.startswith(prefix)]:
        del _LAYOUTS[path]


def _kind(tensor: torch.Tensor, alignment: int) -> tuple[Any, ...] | None:
    """The template key of a tensor written from a template, else None."""
    if not _plain(tensor):
        return None
    key = (tensor.dtype, tuple(tensor.shape), tensor.stride(), alignment)
    return key if _TEMPLATES.get(key) is not None else None


def _local(planner: SavePlanner, fqn: str) -> torch.Tensor:
    """The tensor an item writes: a plain tensor, or this rank's shard of a DTensor (what the
    planner resolves it to, without its per-item lookup and autograd call)."""
    value = planner.state_dict[fqn]  # type: ignore[attr-defined]
    return getattr(value, "_local_tensor", value)


def _remember(path: str, results: list[WriteResult], planner: SavePlanner) -> None:
    records, alignment = [], _alignment()
    for result in results:
        kind = _kind(_local(planner, result.index.fqn), alignment)
        if kind is None:
            return  # a record not from a template: written whole next time
        records.append((result.index, kind, result.storage_data.offset))
    _LAYOUTS[path] = _Layout(records, file_identity(path))


def _rewrite(
    path: str, storage_key: str, items: Sequence[WriteItem], planner: SavePlanner, sync: bool
) -> tuple[list[WriteResult], str] | None:
    """The file written again with only its tensors' bytes (each between its template's head
    and tail, where the last write put them), when this process wrote it last with the same
    records: every item's index and kind as then. The checksums are those of the bytes in the
    file, taken as :func:`write_records` takes them; the results are the same. None where it
    cannot be."""
    layout = _LAYOUTS.pop(path, None)
    if layout is None or len(items) != len(layout.records):
        return None
    if file_identity(path) != layout.identity:
        return None  # written by another since (a replica, a recovery's copy)
    by_index = {item.index: item for item in items}
    planned, alignment = [], _alignment()
    for index, kind, offset in layout.records:
        item = by_index.get(index)
        if item is None or item.type == WriteItemType.BYTE_IO:
            return None
        tensor = _local(planner, index.fqn)
        if _kind(tensor, alignment) != kind:
            return None
        planned.append((item, tensor, _TEMPLATES[kind], offset))
    if layout.mapped is None:
        size = layout.identity[2]
        layout.mapped = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    results = []
    whole = new_checksum()
    for item, tensor, template, offset in planned:
        start = offset + len(template.head)
        source = tensor.reshape(-1).view(torch.uint8)
        stored = layout.mapped[start : start + source.numel()]
        stored.copy_(source)
        digest = new_checksum()
        for part in (template.head, memoryview(stored.numpy()), template.tail):
            digest.update(part)
            whole.update(part)
        length = len(template.head) + source.numel() + len(template.tail)
        info = _StorageInfo(storage_key, offset, length)
        setattr(info, CHECKSUM, f"{ALGORITHM}:{digest.hexdigest()}")
        results.append(WriteResult(index=item.index, size_in_bytes=length, storage_data=info))
    if sync:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    layout.identity = file_identity(path)
    _LAYOUTS[path] = layout
    return results, whole.hexdigest()
