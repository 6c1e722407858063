"""Sharded saves planned without a central gather, and resumes that read only the index they need.

DCP plans a save through rank 0: every rank sends its local plan, rank 0 deduplicates them,
builds the global ``.metadata`` (one chunk entry per shard: N x T entries for T sharded tensors
on N ranks), scatters the plans back, gathers every rank's write results and broadcasts the
metadata; a resume reads that whole ``.metadata`` on every rank. All of it grows with N.

Yet the layout of every rank's shards follows from the mesh and the placements, which every
rank knows. Here each rank plans alone (:func:`plan_save`):

- a DTensor's chunk is written by the ranks whose mesh coordinates on its non-sharded dims are
  0 (one rank per distinct chunk: no dedup needed), a plain (replicated) tensor by rank 0;
- rank ``r`` writes its chunks to ``__{r}_0.distcp`` with DCP's own ``FileSystemWriter`` and
  its *metadata fragment* (a DCP :class:`Metadata` of its chunks alone) to
  ``__{r}.metadata``, torch's name for a rank's own metadata;
- rank 0 also writes ``layout.json`` (:data:`LAYOUT_FILE`): each tensor's global shape, dtype,
  mesh and placements, O(T) and independent of the data, from which any process can tell which
  rank wrote which chunk.

Nothing is exchanged while planning or writing; the commit protocol's agreement commits.

A resume (:func:`fragments_for`, :func:`read_fragments`) computes, from ``layout.json`` and the
chunks its own tensors need, which ranks' chunks overlap them, reads those fragments only
(an FSDP rank resuming on the same mesh: its own and rank 0's), and loads through DCP with the
merged partial metadata, checked to cover every element it needs (:func:`check_coverage`).

torch's own tools (``dcp_to_torch_save``, ``dcp.load``) read the one ``.metadata`` of every
chunk. It is written **on demand**, off the critical path, by :func:`write_merged_metadata`
(``shardwise ckpt index PATH``); shardwise's one-process readers merge the fragments in
memory instead (:class:`~.safe_dcp.SafeFileSystemReader`). A checkpoint whose state a rank
cannot plan alone (a DTensor on a sub-mesh, a process group other than the world) is saved
by DCP's central planner as before (:func:`plannable` says which).

Example::

    plan, fragment = plan_save(tensors, rank=dist.get_rank())   # on every rank, no collectives
    ranks = fragments_for(read_layout(path), wanted_chunks(targets))
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from functools import lru_cache
from itertools import product
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard

from .dcp_index import DCP_METADATA, check_dcp_metadata, load_dcp_metadata
from .files import CheckpointError

__all__ = [
    "LAYOUT_FILE",
    "SaveLayout",
    "TensorLayout",
    "check_coverage",
    "describe",
    "list_empty",
    "fragment_name",
    "fragments_for",
    "index_files",
    "is_fragmented",
    "merge_fragments",
    "plan_save",
    "plannable",
    "read_fragments",
    "read_layout",
    "signature",
    "wanted_chunks",
    "write_merged_metadata",
]

LAYOUT_FILE = "layout.json"
LAYOUT_VERSION = 1

Chunk = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes)


def fragment_name(rank: int) -> str:
    """The metadata fragment rank ``rank`` writes (torch's name for a rank's own metadata)."""
    return f"__{rank}.metadata"


# ----------------------------------------------------------------------------- placements
def _placement_code(placement: Any) -> list[Any]:
    if isinstance(placement, _StridedShard):
        return ["SS", placement.dim, placement.split_factor]
    if isinstance(placement, Shard):
        return ["S", placement.dim]
    if isinstance(placement, Replicate):
        return ["R"]
    raise ValueError(f"placement {placement!r} cannot be saved (a Partial is reduced first)")


def _placement(code: list[Any] | tuple[Any, ...]) -> Any:
    if code[0] == "SS":
        return _StridedShard(code[1], split_factor=code[2])
    if code[0] == "S":
        return Shard(code[1])
    if code[0] == "R":
        return Replicate()
    raise CheckpointError(f"{LAYOUT_FILE}: unknown placement {code!r} (expected S, SS or R)")


@dataclasses.dataclass(frozen=True)
class TensorLayout:
    """How one stored tensor was laid out: global shape, dtype, and for a DTensor the index of
    its mesh in :attr:`SaveLayout.meshes` and its placements (codes: ``["S", dim]``,
    ``["SS", dim, split]``, ``["R"]``); ``mesh`` None for a plain tensor (rank 0 wrote it)."""

    shape: tuple[int, ...]
    dtype: str
    mesh: int | None = None
    placements: tuple[tuple[Any, ...], ...] = ()


@dataclasses.dataclass
class SaveLayout:
    """Every stored tensor's layout, and the meshes (shape, the global ranks in mesh order)."""

    world_size: int
    meshes: list[tuple[tuple[int, ...], tuple[int, ...]]]
    tensors: dict[str, TensorLayout]

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": LAYOUT_VERSION,
                "world_size": self.world_size,
                "meshes": [{"shape": list(s), "ranks": _ranks_code(r)} for s, r in self.meshes],
                "tensors": {
                    key: [list(t.shape), t.dtype, t.mesh, [list(p) for p in t.placements]]
                    for key, t in self.tensors.items()
                },
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str, source: str = LAYOUT_FILE) -> SaveLayout:
        try:
            raw = json.loads(text)
            if raw.get("version") != LAYOUT_VERSION:
                raise ValueError(f"version {raw.get('version')!r}, expected {LAYOUT_VERSION}")
            meshes = [
                (tuple(int(n) for n in m["shape"]), _ranks_decode(m["ranks"]))
                for m in raw["meshes"]
            ]
            tensors = {
                key: TensorLayout(
                    tuple(int(n) for n in shape),
                    str(dtype),
                    None if mesh is None else int(mesh),
                    tuple(tuple(p) for p in placements),
                )
                for key, (shape, dtype, mesh, placements) in raw["tensors"].items()
            }
            layout = cls(int(raw["world_size"]), meshes, tensors)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(
                f"{source} is not a shardwise shard layout ({type(exc).__name__}: {exc}): "
                "damaged, or written by another tool"
            ) from exc
        for key, t in layout.tensors.items():
            if t.mesh is not None and not 0 <= t.mesh < len(meshes):
                raise CheckpointError(f"{source}: {key!r} names mesh {t.mesh}, not one of them")
            _dtype(t.dtype, source)
        return layout


def _ranks_code(ranks: tuple[int, ...]) -> Any:
    if ranks == tuple(range(len(ranks))):
        return {"range": len(ranks)}  # the common case in O(1) bytes
    return list(ranks)


def _ranks_decode(code: Any) -> tuple[int, ...]:
    if isinstance(code, dict):
        return tuple(range(int(code["range"])))
    return tuple(int(r) for r in code)


def _dtype(name: str, source: str = LAYOUT_FILE) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"{source}: {name!r} is not a torch dtype")
    return dtype


# ----------------------------------------------------------------------------- save
def plannable(tensors: Mapping[str, Any], world_size: int) -> bool:
    """Whether every rank can plan ``tensors`` alone: tensors only, each DTensor on a mesh of
    the whole group (``world_size`` ranks) with Shard/Replicate placements. The answer is the
    same on every rank (it depends on the state's structure only)."""
    sizes: dict[int, int] = {}
    for value in tensors.values():
        if isinstance(value, DTensor):
            mesh = value.device_mesh
            if id(mesh) not in sizes:
                sizes[id(mesh)] = mesh.size()
            if sizes[id(mesh)] != world_size or any(
                not isinstance(p, Shard | Replicate) for p in value.placements
            ):
                return False
        elif not isinstance(value, torch.Tensor):
            return False
    return True


def signature(tensors: Mapping[str, Any]) -> int:
    """A 63-bit digest of the state's structure as this rank sees it: every key, and each
    tensor's global shape, dtype, mesh and placements. Equal on every rank when every rank
    holds the same entries (not so under pipeline parallelism, where a stage holds its own
    layers: there rank 0 could not write the others' plain tensors)."""
    import hashlib

    digest = hashlib.blake2b(digest_size=8)
    meshes: dict[int, str] = {}  # a mesh's shape and ranks, once per mesh (torch computes them)
    for key in sorted(tensors):
        value = tensors[key]
        parts = [key, str(getattr(value, "dtype", type(value).__name__))]
        if isinstance(value, torch.Tensor):
            parts.append(str(tuple(value.shape)))
        if isinstance(value, DTensor):
            mesh = value.device_mesh
            if id(mesh) not in meshes:
                meshes[id(mesh)] = f"{tuple(mesh.shape)}{mesh.mesh.tolist()}"
            parts.append(meshes[id(mesh)])
            parts += [
                str(_placement_code(p))
                for p in value.placements
                if isinstance(p, Shard | Replicate)
            ]
        digest.update("\x1f".join(parts).encode() + b"\x1e")
    return int.from_bytes(digest.digest(), "little") >> 1


def describe(tensors: Mapping[str, torch.Tensor], world_size: int) -> SaveLayout:
    """The :class:`SaveLayout` of ``tensors`` (the same on every rank; O(T))."""
    meshes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    seen: dict[int, int] = {}
    layouts: dict[str, TensorLayout] = {}
    for key, value in tensors.items():
        dtype = str(value.dtype).removeprefix("torch.")
        if isinstance(value, DTensor):
            mesh = value.device_mesh
            index = seen.get(id(mesh))
            if index is None:
                entry = (tuple(mesh.shape), tuple(int(r) for r in mesh.mesh.flatten().tolist()))
                index = seen[id(mesh)] = meshes.index(entry) if entry in meshes else len(meshes)
                if index == len(meshes):
                    meshes.append(entry)
            codes = tuple(tuple(_placement_code(p)) for p in value.placements)
            layouts[key] = TensorLayout(tuple(value.shape), dtype, index, codes)
        else:
            layouts[key] = TensorLayout(tuple(value.shape), dtype)
    return SaveLayout(world_size, meshes, layouts)


@lru_cache(maxsize=4096)
def _chunk(
    shape: tuple[int, ...], mesh_shape: tuple[int, ...], coordinate: tuple[int, ...], codes: Any
) -> Chunk:
    placements = [_placement(c) for c in codes]
    sizes, offsets = _compute_local_shape_and_global_offset(
        shape, mesh_shape, list(coordinate), placements
    )
    return tuple(offsets), tuple(sizes)


def _writes(coordinate: Iterable[int], codes: Iterable[tuple[Any, ...]]) -> bool:
    """Whether the rank at ``coordinate`` writes its chunk: it is at 0 on every mesh dim over
    which the tensor is replicated (one writer per distinct chunk)."""
    return all(c == 0 for c, p in zip(coordinate, codes) if p[0] == "R")


def plan_save(tensors: Mapping[str, torch.Tensor], rank: int) -> tuple[SavePlan, Metadata]:
    """This rank's write items and metadata fragment, computed alone (no collectives).

    A DTensor's chunk is planned where this rank is its writer (:func:`_writes`) unless it
    is empty (an empty tensor: by the rank at coordinates 0), a plain tensor on rank 0. The
    fragment lists exactly the chunks planned (the writer fills in its ``storage_data``).
    Works on meta tensors and on meshes made without a process group (the benchmark)."""
    items: list[WriteItem] = []
    md: dict[str, TensorStorageMetadata] = {}
    meshes: dict[int, tuple[tuple[int, ...], tuple[int, ...] | None]] = {}
    for key, value in tensors.items():
        if isinstance(value, DTensor):
            mesh = value.device_mesh
            seen = meshes.get(id(mesh))
            if seen is None:  # torch computes a mesh's shape and coordinate on every call
                where = mesh.get_coordinate()
                seen = meshes[id(mesh)] = (
                    tuple(mesh.shape),
                    None if where is None else tuple(where),
                )
            mesh_shape, coordinate = seen
            codes = tuple(tuple(_placement_code(p)) for p in value.placements)
            if coordinate is None or not _writes(coordinate, codes):
                continue
            offsets, sizes = _chunk(tuple(value.shape), mesh_shape, coordinate, codes)
            if 0 in sizes and (value.numel() or any(coordinate)):
                continue  # an empty shard (uneven sharding) holds nothing to read back
            local = value._local_tensor
            kind = WriteItemType.SHARD
        else:
            if rank != 0:
                continue
            offsets, sizes = (0,) * value.dim(), tuple(value.shape)
            local, kind = value, WriteItemType.TENSOR
        offsets_, sizes_ = torch.Size(offsets), torch.Size(sizes)
        properties = TensorProperties.create_from_tensor(local)
        chunk = ChunkStorageMetadata(offsets=offsets_, sizes=sizes_)
        size = value.size()
        items.append(
            WriteItem(
                index=MetadataIndex(key, offsets_, 0),
                type=kind,
                tensor_data=TensorWriteData(chunk=chunk, properties=properties, size=size),
            )
        )
        md[key] = TensorStorageMetadata(properties=properties, size=size, chunks=[chunk])
    plan = SavePlan(items, planner_data={key: (key,) for key in md})
    fragment = Metadata(state_dict_metadata=md, planner_data={key: (key,) for key in md})
    return plan, fragment


# ----------------------------------------------------------------------------- resume
def read_layout(path: str | os.PathLike[str]) -> SaveLayout:
    """The checkpoint's ``layout.json``."""
    file = Path(path) / LAYOUT_FILE
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file} cannot be read ({type(exc).__name__}: {exc})") from exc
    return SaveLayout.from_json(text, str(file))


def is_fragmented(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a checkpoint saved without a central gather (it has a layout)."""
    return (Path(path) / LAYOUT_FILE).is_file()


def _stored_chunks(layout: SaveLayout, key: str, table: dict[Any, Any]) -> list[tuple[int, Chunk]]:
    """``(writer rank, chunk)`` of every chunk stored for ``key``, from the layout alone
    (memoised per (shape, mesh, placements) in ``table``)."""
    t = layout.tensors[key]
    if t.mesh is None:
        return [(0, ((0,) * len(t.shape), t.shape))]
    signature = (t.shape, t.mesh, t.placements)
    found = table.get(signature)
    if found is None:
        mesh_shape, ranks = layout.meshes[t.mesh]
        axes = [
            range(1) if code[0] == "R" else range(n) for n, code in zip(mesh_shape, t.placements)
        ]
        found = []
        for coordinate in product(*axes):
            flat = 0
            for c, n in zip(coordinate, mesh_shape):
                flat = flat * n + c
            found.append((ranks[flat], _chunk(t.shape, mesh_shape, coordinate, t.placements)))
        table[signature] = found
    return found


def _overlap(a: Chunk, b: Chunk) -> int:
    """Elements two chunks share."""
    n = 1
    for ao, an, bo, bn in zip(a[0], a[1], b[0], b[1]):
        n *= max(0, min(ao + an, bo + bn) - max(ao, bo))
    return n


def wanted_chunks(targets: Mapping[str, torch.Tensor]) -> dict[str, list[Chunk]]:
    """The part of each stored tensor this rank reads: a DTensor target's local chunk (as DCP
    computes it), a plain target whole."""
    wanted: dict[str, list[Chunk]] = {}
    meshes: dict[int, tuple[tuple[int, ...], tuple[int, ...] | None]] = {}
    for key, target in targets.items():
        if isinstance(target, DTensor):
            mesh = target.device_mesh
            seen = meshes.get(id(mesh))
            if seen is None:
                where = mesh.get_coordinate()
                seen = meshes[id(mesh)] = (
                    tuple(mesh.shape),
                    None if where is None else tuple(where),
                )
            mesh_shape, coordinate = seen
            if coordinate is None:
                wanted[key] = []
                continue
            codes = tuple(tuple(_placement_code(p)) for p in target.placements)
            wanted[key] = [_chunk(tuple(target.shape), mesh_shape, coordinate, codes)]
        else:
            wanted[key] = [((0,) * target.dim(), tuple(target.shape))]
    return wanted


def fragments_for(layout: SaveLayout, wanted: Mapping[str, list[Chunk]]) -> list[int]:
    """The ranks whose metadata fragments hold the chunks that overlap ``wanted``."""
    table: dict[Any, Any] = {}
    ranks: set[int] = set()
    by_region: dict[Any, set[int]] = {}
    for key, chunks in wanted.items():
        if key not in layout.tensors:
            raise CheckpointError(f"{LAYOUT_FILE} has no tensor {key!r}")
        t = layout.tensors[key]
        for chunk in chunks:
            if math.prod(chunk[1]) == 0:
                continue
            region = (t.shape, t.mesh, t.placements, chunk)
            writers = by_region.get(region)
            if writers is None:
                writers = by_region[region] = {
                    writer
                    for writer, stored in _stored_chunks(layout, key, table)
                    if _overlap(stored, chunk)
                }
            ranks |= writers
    return sorted(ranks)


def list_empty(metadata: Metadata, layout: SaveLayout, wanted: Mapping[str, list[Chunk]]) -> None:
    """Give ``metadata`` an entry without chunks for every wanted tensor this rank needs no
    element of and no fragment it read lists: its shard is empty (fewer rows than ranks: a
    1-output bias, a ``[1, 1, D]`` token on 2 ranks), yet DCP's planner wants every key of
    the state it loads in the metadata, and plans no read for an entry without chunks."""
    md = metadata.state_dict_metadata
    for key, chunks in wanted.items():
        if key in md or any(math.prod(chunk[1]) for chunk in chunks):
            continue  # an entry, or elements to read: check_coverage judges it
        t = layout.tensors[key]
        properties = TensorProperties(dtype=_dtype(t.dtype))
        md[key] = TensorStorageMetadata(properties=properties, size=torch.Size(t.shape), chunks=[])


def merge_fragments(fragments: Iterable[Metadata]) -> Metadata:
    """One DCP :class:`Metadata` of every chunk the fragments list (in their order)."""
    merged = Metadata(state_dict_metadata={}, planner_data={}, storage_data={})
    for fragment in fragments:
        _merge_into(merged, fragment)
    return merged


def _merge_into(merged: Metadata, fragment: Metadata) -> None:
    """Add ``fragment``'s chunks, storage entries and planner data to ``merged``."""
    md, storage, planner_data = merged.state_dict_metadata, merged.storage_data, merged.planner_data
    for key, entry in fragment.state_dict_metadata.items():
        have = md.get(key)
        if have is None:
            md[key] = TensorStorageMetadata(entry.properties, entry.size, list(entry.chunks))
        else:
            if have.size != entry.size or have.properties.dtype != entry.properties.dtype:
                raise CheckpointError(
                    f"metadata fragments disagree on {key!r}: {tuple(have.size)} "
                    f"{have.properties.dtype} against {tuple(entry.size)} "
                    f"{entry.properties.dtype}"
                )
            have.chunks.extend(entry.chunks)
    storage.update(fragment.storage_data or {})
    planner_data.update(fragment.planner_data or {})
    if merged.storage_meta is None:
        merged.storage_meta = fragment.storage_meta
    merged.version = fragment.version


def read_fragments(path: str | os.PathLike[str], ranks: Iterable[int]) -> Metadata:
    """The fragments of ``ranks``, merged (read with shardwise's safe unpickler, each checked
    field by field: a fragment a flipped byte left unpicklable but wrong is named)."""
    merged = merge_fragments([])
    for rank in ranks:
        file = Path(path) / fragment_name(rank)
        try:
            stream = open(file, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise CheckpointError(
                f"{file} cannot be read ({type(exc).__name__}: {exc}): the checkpoint is incomplete"
            ) from exc
        try:
            with stream:
                fragment = load_dcp_metadata(stream, source=str(file))
            check_dcp_metadata(fragment)
            _merge_into(merged, fragment)
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged pickle fails in many ways
            raise CheckpointError(
                f"{file} cannot be read ({type(exc).__name__}: {exc}): a damaged metadata fragment"
            ) from exc
    return merged


def check_coverage(metadata: Metadata, wanted: Mapping[str, list[Chunk]], where: str) -> None:
    """Raise CheckpointError unless the chunks in ``metadata`` cover every wanted element
    (stored chunks do not overlap one another, so the overlaps add up)."""
    for key, chunks in wanted.items():
        entry = metadata.state_dict_metadata.get(key)
        for chunk in chunks:
            need = math.prod(chunk[1])
            if need == 0:
                continue
            have = 0
            if entry is not None:
                for stored in entry.chunks:
                    have += _overlap((tuple(stored.offsets), tuple(stored.sizes)), chunk)
            if have != need:
                raise CheckpointError(
                    f"{where}: the metadata fragments cover {have} of the {need} elements of "
                    f"{key!r} this rank reads (offsets {chunk[0]}, sizes {chunk[1]}): a "
                    "fragment is missing or does not match layout.json"
                )


def index_files(path: str | os.PathLike[str]) -> set[str]:
    """The index files of a checkpoint saved without a gather: ``layout.json`` and every
    rank's fragment (``.metadata`` too, once ``shardwise ckpt index`` wrote it)."""
    names = {LAYOUT_FILE} | {fragment_name(r) for r in all_fragment_ranks(path)}
    if (Path(path) / DCP_METADATA).is_file():
        names.add(DCP_METADATA)
    return names


def all_fragment_ranks(path: str | os.PathLike[str]) -> list[int]:
    """Every rank that wrote a fragment, from ``layout.json``'s world size (all must exist)."""
    return list(range(read_layout(path).world_size))


def merged_metadata(path: str | os.PathLike[str]) -> Metadata:
    """Every fragment of the checkpoint merged: what DCP's ``.metadata`` would hold."""
    merged = read_fragments(path, all_fragment_ranks(path))
    layout = read_layout(path)
    missing = sorted(set(layout.tensors) - set(merged.state_dict_metadata))
    if missing:
        raise CheckpointError(f"{path}: no fragment stores {missing[:5]}")
    return merged


def write_merged_metadata(path: str | os.PathLike[str]) -> Path:
    """Write DCP's ``.metadata`` (every fragment merged) into the checkpoint, atomically, for
    torch's own tools (``dcp_to_torch_save``, ``dcp.load``); returns its path. Off the
    critical path: ``shardwise ckpt index PATH`` runs it."""
    import pickle

    path = Path(path)
    merged = merged_metadata(path)
    full = {key: e for key, e in merged.state_dict_metadata.items()}
    check_coverage(
        merged,
        {key: [((0,) * len(e.size), tuple(e.size))] for key, e in full.items()},
        str(path),
    )
    target = path / DCP_METADATA
    tmp = path / f"{DCP_METADATA}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(merged, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target
