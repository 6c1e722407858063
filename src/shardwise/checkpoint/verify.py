"""Check a checkpoint on disk: every file present and intact, its metadata consistent.

Two kinds of checks, reported together, each problem naming the file it is about:

- against the manifest recorded at save time (:mod:`shardwise.checkpoint.manifest`): each
  listed file exists with its recorded size and checksum;
- structural, from the checkpoint itself: a full file's zip archive and pickle read, and
  (without a manifest) every stored record passes its CRC-32; every data file a sharded
  checkpoint's ``.metadata`` refers to exists and is long enough, ``meta.pt`` reads and
  refers only to stored tensors, each tensor's chunks cover it (and, without a manifest,
  pass their CRC-32); a local checkpoint has one rank file per rank of the world size its
  ``meta`` records; a safetensors file's header describes exactly its bytes.

A checkpoint saved without a manifest gets the structural checks only, and a note saying so.

Example::

    >>> report = verify_checkpoint('work_dirs/demo/epoch_1.pth')
    >>> report.ok, [str(p) for p in report.problems]
    (False, ['__1_0.distcp: missing (the manifest lists it)'])
"""

from __future__ import annotations

import io
import os
import zipfile
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

from .dcp_index import DCP_METADATA, dcp_files
from .files import CheckpointError, describe_error
from .formats import FULL, LOCAL, SAFETENSORS, SHARDED, CheckpointFormat, detect_format
from .local import local_ranks, rank_file
from .manifest import (
    LABELS,
    OnBytes,
    Problem,
    manifest_path,
    new_checksum,
    read_manifest,
    verify_manifest,
)
from .opened import OpenCheckpoint
from .records import chunk_checksum
from .safe_dcp import read_dcp_metadata
from .safetensors_file import read_safetensors_header
from .sharded import META_FILE, tensor_refs

__all__ = ["VerifyReport", "verify_checkpoint"]

_CHUNK = 8 << 20


@dataclass
class VerifyReport:
    """What :func:`verify_checkpoint` found.

    Attributes:
        path: the checkpoint.
        format: the :class:`~shardwise.checkpoint.formats.CheckpointFormat`, or None when it
            could not be told.
        manifest: the manifest checked against, or None when the checkpoint has none.
        problems: everything wrong, each naming its file; empty when the checkpoint is good.
        notes: what was not checked, and harmless oddities (files nothing refers to).
    """

    path: Path
    format: CheckpointFormat | None = None
    manifest: Path | None = None
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_checkpoint(
    path: str | os.PathLike[str], *, on_bytes: OnBytes | None = None
) -> VerifyReport:
    """Verify the checkpoint at ``path`` (see the module docstring); ``on_bytes(n)`` is
    called as data is read (a progress bar).

    Raises:
        FileNotFoundError: nothing is at ``path``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} does not exist; give the path of a checkpoint file or "
            "directory"
        )
    report = VerifyReport(path)
    try:
        if read_manifest(path) is not None:
            report.manifest = manifest_path(path)
            report.problems += verify_manifest(path, on_bytes=on_bytes)
        else:
            report.notes.append(
                f"no manifest ({manifest_path(path).name}): checksums were not recorded at save "
                "time, so only structural checks ran (and CRC-32s where the format has them); "
                "record one with --write-manifest once the checkpoint is known to be good"
            )
    except CheckpointError as exc:
        report.problems.append(Problem(manifest_path(path).name, str(exc)))
    try:
        report.format = detect_format(path)
    except CheckpointError as exc:
        report.problems.append(_undetected(path, exc))
        return report
    # with a manifest whose checksums match, the data is what was saved: no need to read
    # it all again for the CRCs
    deep = report.manifest is None
    checks = {
        FULL: _check_full,
        SHARDED: _check_sharded,
        LOCAL: _check_local,
        SAFETENSORS: _check_safetensors,
    }
    checks[report.format](path, report, deep, on_bytes)
    return report


def _undetected(path: Path, exc: CheckpointError) -> Problem:
    """A directory that is no checkpoint: name what is missing when it looks like one."""
    names = set(os.listdir(path)) if path.is_dir() else set()
    if META_FILE in names or any(name.endswith(".distcp") for name in names):
        return Problem(
            DCP_METADATA,
            f"missing: the directory holds DCP data files ({sorted(names)[:5]}) but not the "
            "index DCP needs to read them",
        )
    return Problem(path.name if path.is_file() else "", str(exc))


# ----------------------------------------------------------------------------- full
def _check_full(
    path: Path, report: VerifyReport, deep: bool, on_bytes: OnBytes | None, name: str = ""
) -> OpenCheckpoint | None:
    name = name or path.name
    try:
        with zipfile.ZipFile(path) as archive:
            if deep:
                for info in archive.infolist():
                    bad = _crc_fails(archive, info, on_bytes)
                    if bad:
                        report.problems.append(Problem(name, bad))
                        return None
    except Exception as exc:  # noqa: BLE001 - a damaged directory fails zipfile in many ways
        report.problems.append(
            Problem(
                name,
                f"not a readable torch.save archive ({describe_error(exc)}): truncated, "
                "overwritten or its bytes changed after the save",
            )
        )
        return None
    try:
        return FULL.open(path)
    except CheckpointError as exc:
        report.problems.append(Problem(name, str(exc)))
        return None


def _crc_fails(archive: zipfile.ZipFile, info: zipfile.ZipInfo, on_bytes: OnBytes | None):
    """Why the record ``info`` fails to read back with its CRC-32, or None."""
    try:
        with archive.open(info) as f:
            while chunk := f.read(_CHUNK):
                if on_bytes is not None:
                    on_bytes(len(chunk))
    except Exception as exc:  # noqa: BLE001 - damaged bytes fail zlib and zipfile in many ways
        record = info.filename.split("/", 1)[-1]
        return (
            f"record {record!r} is damaged ({describe_error(exc)}): its bytes changed after "
            "the save"
        )
    return None


# ----------------------------------------------------------------------------- sharded
def _check_sharded(path: Path, report: VerifyReport, deep: bool, on_bytes: OnBytes | None):
    try:
        metadata = read_dcp_metadata(path)
    except CheckpointError as exc:
        report.problems.append(Problem(DCP_METADATA, str(exc)))
        return
    stored = metadata.state_dict_metadata
    # every data file .metadata refers to exists and holds the byte ranges it expects
    needed: dict[str, int] = {}
    tensors_in: dict[str, list[str]] = {}
    for index, info in (metadata.storage_data or {}).items():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
        tensors_in.setdefault(info.relative_path, []).append(index.fqn)
    for rel, end in sorted(needed.items()):
        file = path / rel
        if not file.is_file():
            example = tensors_in[rel][0]
            report.problems.append(
                Problem(
                    rel,
                    f"missing; {DCP_METADATA} stores {len(tensors_in[rel])} tensor "
                    f"chunk(s) in it (e.g. {example!r})",
                )
            )
        elif file.stat().st_size < end:
            report.problems.append(
                Problem(
                    rel,
                    f"truncated: {DCP_METADATA} expects at least {end} bytes, it has "
                    f"{file.stat().st_size}",
                )
            )
    # each tensor's chunks cover it
    for key, md in stored.items():
        if not hasattr(md, "chunks"):
            continue
        covered = sum(prod(chunk.sizes) for chunk in md.chunks)
        if covered != prod(md.size):
            report.problems.append(
                Problem(
                    DCP_METADATA,
                    f"tensor {key!r}: its chunks cover {covered} of {prod(md.size)} elements",
                )
            )
    # meta.pt reads and refers only to stored tensors
    meta = path / META_FILE
    if not meta.is_file():
        report.problems.append(Problem(META_FILE, "missing (it holds meta, schedulers, extras)"))
    else:
        reader = _check_full(meta, report, deep, on_bytes, name=META_FILE)
        if reader is not None:
            missing = sorted(set(tensor_refs(reader.skeleton)) - set(stored))
            if missing:
                report.problems.append(
                    Problem(
                        META_FILE, f"refers to tensors {DCP_METADATA} does not store: {missing[:5]}"
                    )
                )
    unreferenced = sorted(
        p.name for p in path.glob("*.distcp") if p.name not in dcp_files(metadata)
    )
    if unreferenced:
        report.notes.append(f"data files {DCP_METADATA} does not refer to: {unreferenced}")
    if deep:
        _check_dcp_crcs(path, metadata, report, on_bytes)


def _check_dcp_crcs(path: Path, metadata: Any, report: VerifyReport, on_bytes: OnBytes | None):
    """DCP stores each tensor chunk as a small ``torch.save`` archive: check each against the
    checksum its index records (:mod:`.records`) or, for records without one, their CRC-32s
    (records written without either are counted in a note)."""
    by_file: dict[str, list[tuple[Any, Any]]] = {}
    unchecked: dict[str, int] = {}  # records written without a CRC-32, per file
    for index, info in (metadata.storage_data or {}).items():
        by_file.setdefault(info.relative_path, []).append((index, info))
    for rel, items in sorted(by_file.items()):
        file = path / rel
        if not file.is_file() or any(p.file == rel for p in report.problems):
            continue
        with open(file, "rb") as f:
            for index, info in sorted(items, key=lambda item: item[1].offset):
                f.seek(info.offset)
                data = f.read(info.length)
                if on_bytes is not None:
                    on_bytes(len(data))
                recorded = chunk_checksum(info)
                if recorded is not None:
                    algorithm, _, expected = recorded.partition(":")
                    digest = new_checksum(algorithm) if algorithm in LABELS else None
                    if digest is not None:
                        digest.update(data)
                    if digest is None or digest.hexdigest() != expected:
                        report.problems.append(
                            Problem(
                                rel,
                                f"the chunk of tensor {index.fqn!r} at byte {info.offset} "
                                f"differs from the checksum {recorded!r} its index records",
                            )
                        )
                        break
                    continue
                if not data.startswith(b"PK"):
                    continue  # not a torch.save archive (bytes, or a newer DCP layout)
                try:
                    with zipfile.ZipFile(io.BytesIO(data)) as archive:
                        if all(i.CRC == 0 for i in archive.infolist()):
                            unchecked[rel] = unchecked.get(rel, 0) + 1
                            continue
                        bad = next(
                            (b for i in archive.infolist() if (b := _crc_fails(archive, i, None))),
                            None,
                        )
                except Exception as exc:  # noqa: BLE001 - as in _crc_fails
                    bad = f"damaged ({describe_error(exc)})"
                if bad:
                    report.problems.append(
                        Problem(
                            rel,
                            f"the chunk of tensor {index.fqn!r} at byte {info.offset} "
                            f"fails its check: {bad}",
                        )
                    )
                    break
    if unchecked:
        report.notes.append(
            f"{sum(unchecked.values())} records in {sorted(unchecked)} carry no CRC-32 "
            "(shardwise's synchronous sharded saves leave it to the manifest, which is missing): "
            "their bytes were not checked"
        )


# ----------------------------------------------------------------------------- local
def _check_local(path: Path, report: VerifyReport, deep: bool, on_bytes: OnBytes | None):
    ranks = local_ranks(path)
    readers = {}
    for rank in ranks:
        reader = _check_full(rank_file(path, rank), report, deep, on_bytes)
        if reader is not None:
            readers[rank] = reader
    world_sizes = {
        rank: reader.meta.get("world_size")
        for rank, reader in readers.items()
        if isinstance(reader.meta.get("world_size"), int)
    }
    world_size = max(world_sizes.values(), default=max(ranks) + 1)
    for rank, recorded in sorted(world_sizes.items()):
        if recorded != world_size:
            report.problems.append(
                Problem(
                    rank_file(path, rank).name,
                    f"meta records world_size {recorded}, another rank file {world_size}",
                )
            )
    expected = set(range(world_size))
    for rank in sorted(expected - set(ranks)):
        report.problems.append(
            Problem(
                rank_file(path, rank).name,
                f"missing: meta records world_size {world_size}, "
                f"so rank0.pth .. rank{world_size - 1}.pth must all exist; found "
                f"{[rank_file(path, r).name for r in ranks]}",
            )
        )
    for rank in sorted(set(ranks) - expected):
        report.problems.append(
            Problem(rank_file(path, rank).name, f"extra: meta records world_size {world_size}")
        )
    keys = {rank: {info.key for info in reader.tensors()} for rank, reader in readers.items()}
    if keys:
        first = min(keys)
        for rank, rank_keys in sorted(keys.items()):
            if rank_keys != keys[first]:
                diff = sorted(rank_keys ^ keys[first])[:3]
                report.problems.append(
                    Problem(
                        rank_file(path, rank).name,
                        f"holds other tensors than {rank_file(path, first).name} (e.g. {diff})",
                    )
                )


# ----------------------------------------------------------------------------- safetensors
def _check_safetensors(path: Path, report: VerifyReport, deep: bool, on_bytes: OnBytes | None):
    try:
        header, start = read_safetensors_header(path)
    except CheckpointError as exc:
        report.problems.append(Problem(path.name, str(exc)))
        return
    spans = sorted(
        (tuple(entry.get("data_offsets", (0, 0))), name)
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict)
    )
    end = 0
    for (begin, stop), name in spans:
        if begin != end or stop < begin:
            report.problems.append(
                Problem(
                    path.name,
                    f"the header's data_offsets of {name!r} ({begin}, {stop}) "
                    f"leave a gap or overlap at byte {end}",
                )
            )
            return
        end = stop
    size = path.stat().st_size
    if size != start + end:
        report.problems.append(
            Problem(
                path.name,
                f"is {size} bytes but its header describes {start + end} "
                "(truncated, or bytes appended)",
            )
        )
    if deep:
        report.notes.append("safetensors files carry no checksums of their own")
