"""The full format: one file, written by rank 0, readable with plain ``torch.load``.

``{'state_dict', 'optimizer', 'param_schedulers', 'meta', ...extras}``: model keys are the
plain module's keys, optimizer state is keyed by parameter name. It loads with
``torch.load(path, weights_only=True)`` into a plain ``nn.Module`` without shardwise.
:func:`load_full_checkpoint` also reads files written by mmengine (see
:mod:`shardwise.checkpoint.mmengine_compat`).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .files import CheckpointError, describe_error, require_checkpoint
from .manifest import new_checksum
from .mmengine_compat import mmengine_safe_globals, mmengine_to_plain

__all__ = [
    "HashingWriter",
    "check_torch_file",
    "damaged_file_error",
    "is_bare_state_dict",
    "WrittenFile",
    "load_full_checkpoint",
    "load_with_offsets",
    "read_bytes",
    "read_tensor_at",
    "save_full_checkpoint",
]


def is_bare_state_dict(checkpoint: Mapping[str, Any]) -> bool:
    """Whether ``checkpoint`` is a bare ``torch.save(model.state_dict())``: tensors under
    module keys and nothing else (no ``'state_dict'``, ``'meta'``, ... entries)."""
    return bool(checkpoint) and all(isinstance(v, torch.Tensor) for v in checkpoint.values())


class WrittenFile(NamedTuple):
    """A file a save wrote, with the checksum of its bytes (:mod:`.manifest`) taken while
    writing them."""

    path: Path
    checksum: str


#: Bytes written between two requests to start writing them to disk (see ``HashingWriter``).
WRITEBACK_BYTES = 32 << 20
_SYNC_FILE_RANGE_WRITE = 2


def _sync_file_range() -> Any:
    """Linux's ``sync_file_range`` (not in :mod:`os`), or None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_START_WRITEBACK = _sync_file_range()


class HashingWriter:
    """A write-only stream that checksums what passes through it (in the writing thread: XXH3
    hashes ~28 GB/s, ten times the pace of a write to the page cache) and has the kernel start
    writing it to disk as it goes.

    Every ``WRITEBACK_BYTES`` written to a real file, the kernel is asked to start writing
    them out (``sync_file_range(SYNC_FILE_RANGE_WRITE)`` on Linux, which does not wait for the
    write to finish), so that the disk works while torch serializes the rest and the closing
    ``fsync`` finds little left to write (the technique of RocksDB's ``bytes_per_sync``). The
    fsync still decides durability; this only moves the disk's work earlier.
    """

    def __init__(self, f: Any) -> None:
        self._f = f
        self._fd = _file_descriptor(f) if _START_WRITEBACK is not None else None
        self._written = self._started = 0
        self._digest = new_checksum()

    def write(self, data: Any) -> int:
        self._digest.update(data)
        written = self._f.write(data)
        self._written += written
        if self._fd is not None and self._written - self._started >= WRITEBACK_BYTES:
            self._start_writeback()
        return written

    def _start_writeback(self) -> None:
        self._f.flush()
        length = self._written - self._started
        if _START_WRITEBACK(self._fd, self._started, length, _SYNC_FILE_RANGE_WRITE) != 0:
            self._fd = None  # not supported here (e.g. a pipe): the fsync does it all
        self._started = self._written

    def flush(self) -> None:
        self._f.flush()

    def hexdigest(self) -> str:
        """The checksum of everything written."""
        return self._digest.hexdigest()


def _file_descriptor(f: Any) -> int | None:
    """The descriptor of a regular file opened at its start, else None."""
    try:
        fd = f.fileno()
        return fd if f.tell() == 0 else None
    except (AttributeError, OSError, ValueError):
        return None


def save_full_checkpoint(state: dict[str, Any], path: str | os.PathLike[str]) -> WrittenFile:
    """Write ``state`` to ``path``, hashing it on the way, and flush it to disk before
    returning."""
    with open(path, "wb") as f:
        writer = HashingWriter(f)
        torch.save(state, writer)
        digest = writer.hexdigest()
        f.flush()
        os.fsync(f.fileno())
    return WrittenFile(Path(path), digest)


def load_full_checkpoint(
    path: str | os.PathLike[str], map_location: Any = "cpu", *, mmap: bool | None = None
) -> dict:
    """Read a full checkpoint with ``weights_only=True``: nothing in it is executed.

    Tensors, plain Python values and numpy arrays and scalars load; so does mmengine's
    ``message_hub``, its HistoryBuffers coming back as plain dicts
    (:mod:`~shardwise.checkpoint.mmengine_compat`). ``map_location='meta'`` reads the pickle
    alone; ``mmap=True`` maps the file instead of reading its tensors (None: torch's
    default).
    """
    path = Path(path)
    require_checkpoint(path)
    if path.is_dir():
        raise CheckpointError(
            f"{path} is a directory, not a full checkpoint file; this strategy reads the "
            "full format only"
        )
    check_torch_file(path)
    try:
        with mmengine_safe_globals():
            checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path} holds an object shardwise will not unpickle (it loads with "
            f"weights_only=True, so that no code in a checkpoint runs): {_refusal(exc)}. "
            "Only tensors, plain Python values, numpy arrays and mmengine's message hub load. "
            "If you trust the file's source, load it with torch.load(path, weights_only=False) "
            "and save the tensors and plain values you need with torch.save"
        ) from exc
    except PermissionError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch.load fails in many ways on a bad file
        raise CheckpointError(
            f"{path} is not a readable checkpoint (truncated, or not written by torch.save): "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path} holds a {type(checkpoint).__name__}, not a checkpoint dict")
    try:
        return mmengine_to_plain(checkpoint)
    except ValueError as exc:
        raise CheckpointError(f"{path} holds a malformed mmengine object: {exc}") from exc


def check_torch_file(path: str | os.PathLike[str]) -> None:
    """Refuse a file that ``torch.save`` did not write, from its first bytes: neither a zip
    archive (torch's format since 1.6) nor a pickle (the legacy one)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"\x80"):
        return
    raise CheckpointError(
        f"{path} is not a checkpoint: torch.save writes a zip archive (or, before torch 1.6, a "
        f"pickle), and this file starts with {head!r}. Check the path; a checkpoint is a .pth "
        "file or directory written by a training run"
    )


_BOILERPLATE = (
    "Weights only load failed",
    "In PyTorch",
    "(1)",
    "(2)",
    "Please file an issue",
    "Check the documentation",
)


def _refusal(exc: pickle.UnpicklingError) -> str:
    """The line of torch's weights_only error that says what was refused (torch wraps it in
    paragraphs of advice about ``weights_only=False``)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reasons = [line for line in lines if not line.startswith(_BOILERPLATE)]
    reason = (reasons or lines or [type(exc).__name__])[0]
    reason = reason.removeprefix("WeightsUnpickler error: ")
    return reason.split(" Please use `torch.serialization", 1)[0].rstrip(".")


# ----------------------------------------------------------------------------- reading by offset
def load_with_offsets(path: Path) -> Any:
    """The checkpoint with every tensor on the meta device (nothing but the pickle is read),
    or None for a file ``torch.load`` cannot give offsets for (not a zip, big-endian)."""
    try:
        with zipfile.ZipFile(path) as archive:
            byteorder = [n for n in archive.namelist() if n.endswith("/byteorder")]
            if byteorder and archive.read(byteorder[0]) != b"little":
                return None
    except zipfile.BadZipFile:  # (a damaged directory may fail otherwise: the reader says so)
        with open(path, "rb") as f:
            head = f.read(2)
        if head == b"PK":  # a zip whose directory is damaged: truncated or overwritten
            raise CheckpointError(
                f"{path} is a damaged torch.save archive (truncated or overwritten): its zip "
                "directory cannot be read; restore it from a copy or save it again"
            ) from None
        return None
    return load_full_checkpoint(path, map_location="meta")


def damaged_file_error(path: Path, exc: BaseException) -> CheckpointError:
    """One line for a file whose bytes fail to parse (``exc``: zipfile's or pickle's error,
    whatever the damaged byte made of it)."""
    return CheckpointError(
        f"{path} is damaged: it cannot be read as a torch.save archive ({describe_error(exc)}); "
        "its bytes changed after the save (bit rot, a bad copy): restore it from a copy"
    )


def read_tensor_at(
    path: Path,
    start: int,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The contiguous tensor of ``shape`` and ``dtype`` whose bytes start at ``start`` (into
    ``out`` if given)."""
    if out is None:
        out = torch.empty(shape, dtype=dtype)
    read_bytes(path, start, out.numel() * out.element_size(), out.view(-1).view(torch.uint8))
    return out


def read_bytes(
    path: Path, start: int, length: int, data: torch.Tensor | None = None
) -> torch.Tensor:
    """``length`` bytes at ``start`` (into the uint8 tensor ``data`` if given)."""
    if data is None:
        data = torch.empty(length, dtype=torch.uint8)
    with open(path, "rb") as f:
        f.seek(start)
        got = f.readinto(memoryview(data.numpy())) if length else 0
    if got != length:
        raise CheckpointError(
            f"{path} is truncated: a tensor needs bytes {start}..{start + length}, the file "
            f"has {os.path.getsize(path)}"
        )
    return data
