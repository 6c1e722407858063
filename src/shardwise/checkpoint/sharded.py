"""The sharded format: a directory written by every rank with ``torch.distributed.checkpoint``.

Layout::

    epoch_1.pth/
        layout.json        every tensor's global shape, dtype, mesh and placements (rank 0)
        __0.metadata ...   each rank's metadata fragment: DCP's index of the chunks it wrote
        __0_0.distcp ...   each rank's shards of the model and optimizer tensors
        meta.pt            everything else, written by rank 0 with ``torch.save``: ``meta`` (with
                           every rank's RNG states), ``param_schedulers``, extras, the optimizer's
                           ``param_groups``, and a reference in place of each tensor kept by DCP

Only the tensors under ``state_dict`` and ``optimizer`` go through DCP; ``meta.pt`` holds the
rest so that it reads with ``torch.load(weights_only=True)``. DCP reshards on load: the same
directory loads on any number of ranks, into sharded (DTensor) or plain tensors.

Each rank plans its own writes (:mod:`.planning`): nothing goes through rank 0, and a resume
reads only the fragments whose chunks overlap its shards. DCP's one ``.metadata`` (every
chunk), which torch's own tools read (``dcp_to_torch_save``, ``dcp.load``), is written on
demand: ``shardwise ckpt index PATH``. A state each rank cannot plan alone (a DTensor on a
sub-mesh), or ``central_plan=True``, is saved by DCP's central planner with ``.metadata``.

DCP itself would read ``.metadata`` with plain ``pickle``; shardwise reads it through
:class:`~shardwise.checkpoint.safe_dcp.SafeFileSystemReader`, whose unpickler admits only the
inert classes DCP's metadata is made of, so nothing in a checkpoint is executed.

Example::

    save_sharded_checkpoint(state, staging_dir)       # on every rank
    checkpoint = load_sharded_checkpoint(final_dir)   # one process, full tensors
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import (
    DEFAULT_SUFFIX,
    FileSystem,
    SerializationFormat,
    _StoragePrefix,
)
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.futures import Future
from torch.utils._pytree import SUPPORTED_NODES

from ..tree import map_leaves, map_with_path
from . import planning
from .agreement import on_every_rank
from .dcp_index import DCP_METADATA
from .files import CheckpointError, describe_error, file_identity
from .full import HashingWriter, WrittenFile, load_full_checkpoint, save_full_checkpoint
from .manifest import ReadCheck
from .records import forget as forget_records
from .records import write_records
from .remote_read import mirror_of
from .safe_dcp import SafeFileSystemReader

__all__ = [
    "DCP_METADATA",
    "META_FILE",
    "TensorFactory",
    "checked_whole",
    "load_sharded_checkpoint",
    "load_sharded_tensors",
    "read_sharded_checkpoint",
    "read_sharded_meta",
    "save_sharded_checkpoint",
    "tensor_refs",
]

META_FILE = "meta.pt"
_TENSOR_SECTIONS = ("state_dict", "optimizer")
REF = "__dcp_tensor__"
_WRITER = re.compile(r"^__(\d+)(?:_\d+\.distcp|\.metadata)$")  # the files rank N writes

#: Makes the tensor a stored tensor is loaded into: ``(path in the checkpoint, global shape,
#: dtype) -> tensor`` (a DTensor to load a shard, a plain tensor to load it whole).
TensorFactory = Callable[[tuple[str, ...], torch.Size, torch.dtype], torch.Tensor]


def _split(section: str, tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """``tree`` (a checkpoint's ``section``) with each tensor moved into ``tensors`` under its
    DCP key (its path) and replaced by a reference to that key."""

    def refer(path: tuple[str, ...], leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        key = "/".join((section, *path))
        tensors[key] = leaf
        return {REF: key}

    return map_with_path(refer, tree)


def is_ref(tree: Any) -> bool:
    """Whether ``tree`` is a skeleton's reference to a tensor DCP stores."""
    return isinstance(tree, dict) and len(tree) == 1 and REF in tree


def pytree_node(node: Any) -> bool:
    """Whether torch's pytree walks into ``node`` (a registered container, a named tuple)."""
    return type(node) in SUPPORTED_NODES or (
        isinstance(node, tuple) and hasattr(type(node), "_fields")
    )


#: The containers a skeleton (``torch.load(weights_only=True)`` of ``meta.pt``) is walked
#: through directly; any other container goes through :mod:`shardwise.tree` (torch's pytree),
#: which names its children the same way (a dict's keys, a sequence's indices).
_PLAIN = (dict, OrderedDict, list, tuple)


def tensor_refs(tree: Any) -> dict[str, tuple[str, ...]]:
    """Every tensor reference of a skeleton: DCP key -> path in the checkpoint.

    A plain recursion over dicts, lists and tuples (the per-node cost of torch's pytree was
    ~0.03 s of a 100M resume), torch's pytree for anything else."""
    found: dict[str, tuple[str, ...]] = {}

    def note(path: tuple[str, ...], leaf: Any) -> Any:
        if is_ref(leaf):
            found[leaf[REF]] = path
        return leaf

    def walk(path: tuple[str, ...], node: Any) -> None:
        kind = type(node)
        if kind is dict or kind is OrderedDict:
            if len(node) == 1 and REF in node:
                found[node[REF]] = path
                return
            for key, value in node.items():
                walk((*path, str(key)), value)
        elif kind is list or kind is tuple:
            for index, value in enumerate(node):
                walk((*path, str(index)), value)
        elif isinstance(node, _PLAIN) or pytree_node(node):
            map_with_path(lambda p, leaf: note((*path, *p), leaf), node, is_leaf=is_ref)

    walk((), tree)
    return found


def _fill(tree: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """``tree`` with every reference replaced by its tensor (containers rebuilt, same
    types); plain dicts, lists and tuples directly, other containers by torch's pytree."""

    def fill(leaf: Any) -> Any:
        return tensors[leaf[REF]] if is_ref(leaf) else leaf

    def rebuild(node: Any) -> Any:
        kind = type(node)
        if kind is dict or kind is OrderedDict:
            if len(node) == 1 and REF in node:
                return tensors[node[REF]]
            return kind((key, rebuild(value)) for key, value in node.items())
        if kind is list:
            return [rebuild(value) for value in node]
        if kind is tuple:
            return tuple(rebuild(value) for value in node)
        if isinstance(node, _PLAIN) or pytree_node(node):
            return map_leaves(fill, node, is_leaf=is_ref)
        return node

    return rebuild(tree)


class _HashingStream(HashingWriter):
    """A file DCP writes into, hashed on the way (:class:`~.full.HashingWriter`, whose
    ``write`` DCP calls directly), reporting the checksum when closed."""

    def __init__(self, f: Any, on_close: Callable[[str], None]) -> None:
        super().__init__(f)
        self._on_close = on_close
        self.closed = False

    def tell(self) -> int:
        return self._f.tell()

    def fileno(self) -> int:
        # DCP fsyncs ``fileno()`` before it closes the stream: what the buffer still holds
        # must reach the file first, or the fsync would miss a file's last bytes
        self._f.flush()
        return self._f.fileno()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._f.close()
            self._on_close(self.hexdigest())


class _HashingFileSystem(FileSystem):
    """DCP's local file system, hashing every file as it is written (``digests``: path ->
    checksum), so that the manifest needs no second read of the checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[Path, str] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        path = Path(path)
        stream = _HashingStream(
            open(path, "wb"),  # noqa: SIM115 - closed by the stream
            lambda digest: self.digests.__setitem__(path, digest),
        )
        try:
            yield stream
        finally:
            stream.close()

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        if Path(path) in self.digests:
            self.digests[Path(new_path)] = self.digests.pop(Path(path))


class _RecordingWriter(dcp.FileSystemWriter):
    """DCP's file writer that hashes the files this rank writes as it writes them, and
    remembers them (for the manifest)."""

    def __init__(self, path: Path, rewrite: bool = False) -> None:
        super().__init__(path, sync_files=True)
        self.fs = _HashingFileSystem()
        self.root = path
        self.rewrite = rewrite  # see write_records
        self.names: list[str] = []

    def write_data(self, plan: Any, planner: Any) -> Any:
        """The rank's one data file, written by :func:`.records.write_records` (DCP's records,
        each with its checksum); DCP's own writer where its options ask for more files or
        stream transforms."""
        if (
            self.thread_count != 1
            or not self.single_file_per_rank
            or self.transforms.extensions
            or self.serialization_format != SerializationFormat.TORCH_SAVE
        ):
            future = super().write_data(plan, planner)  # FileSystemWriter writes at once
            names = {getattr(r.storage_data, "relative_path", None) for r in future.wait()}
            self.names += sorted(n for n in names if n)
            return future
        results = []
        if plan.items:  # DCP would leave an empty data file behind, which no index names
            name = f"{plan.storage_data.prefix}0{DEFAULT_SUFFIX}"
            file = Path(self.fs.concat_path(self.path, name))
            results, digest = write_records(
                file,
                name,
                plan.items,
                planner,
                self.sync_files,
                self.per_thread_copy_ahead,
                self.rewrite,
            )
            self.fs.digests[file] = digest
            self.names.append(name)
        future: Future[list[Any]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Any, results: Any) -> None:
        super().finish(metadata, results)
        local = not getattr(self, "use_collectives", True) and self.rank is not None
        self.names.append(Path(self._get_metadata_path(self.rank if local else None)).name)

    @property
    def written(self) -> list[WrittenFile]:
        return [WrittenFile(self.root / n, self.fs.digests[self.root / n]) for n in self.names]


def _save_planner(plan_cache: str | None) -> DefaultSavePlanner:
    if plan_cache is None:
        return DefaultSavePlanner()
    try:
        planner = DefaultSavePlanner(enable_plan_caching=True)
    except TypeError:  # torch without plan caching
        return DefaultSavePlanner()
    planner._cached_plans_key = f"shardwise:{plan_cache}"  # DCP's default: the class name
    return planner


@contextmanager
def _records_without_crc32() -> Iterator[None]:
    """DCP's records written without torch's CRC-32 of each record, on the main thread.

    DCP stores every tensor as a small ``torch.save`` archive, which torch computes a CRC-32
    for (``torch.load`` never checks it); shardwise records the checksum of each record and
    of each whole file while writing them (:mod:`.records`, whose record templates need the
    CRC-32s off). torch's CRC-32 alone costs ~0.1 s of a sharded save of 0.6 GB per rank.
    torch's switch is process-wide, so it is turned off only on the main thread, which the
    save blocks; a save written in the background keeps torch's CRC-32s, since the training
    thread may ``torch.save`` meanwhile.
    """
    get = getattr(torch.serialization, "get_crc32_options", None)
    if get is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = get()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(previous)


def save_sharded_checkpoint(
    state: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    process_group: torch_dist.ProcessGroup | None = None,
    plan_cache: str | None = None,
    central_plan: bool = False,
    rewrite: bool = False,
) -> list[Path | WrittenFile]:
    """Write ``state`` into the directory ``path``; every rank calls it (a collective, on
    ``process_group``, by default the world). Returns the files this rank wrote, each with
    the checksum of its bytes, taken while writing them.

    Each rank plans its own writes (:mod:`.planning`: no gather, no scatter, a metadata
    fragment per rank and ``layout.json``) when every tensor is a DTensor on a mesh of the
    whole group or a plain tensor (:func:`.planning.plannable`); otherwise, or with
    ``central_plan=True`` (bench/planning.py's baseline), DCP plans centrally through rank 0
    and writes one ``.metadata``.

    ``plan_cache`` (DCP's central planning only) names a series of saves of the same state
    layout (e.g. one strategy's periodic saves): DCP then reuses the save plan of the
    previous save of the series when no rank's local plan changed, instead of gathering,
    merging and scattering every rank's plan again (DCP checks the local plans, so a changed
    layout is planned anew).

    The tensors under ``state['state_dict']`` and ``state['optimizer']`` (DTensors are saved
    shard by shard, plain tensors once) go through DCP; rank 0 writes the rest to ``meta.pt``.
    A failure DCP reports is raised as CheckpointError (planned centrally: on every rank, as
    DCP agrees on it; planned alone: on the failing rank, and the commit agrees).
    On the main thread DCP's records are written without torch's per-record CRC-32 (see
    :func:`_records_without_crc32`): the returned checksums cover every byte.

    ``rewrite``: ``path`` is written again and again with a state of the same layout (a
    memory snapshot's slot): a data file this process wrote there last with the same records
    gets only its tensors' bytes written over (:func:`.records.write_records`).
    """
    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    skeleton = {k: _split(k, v, tensors) if k in _TENSOR_SECTIONS else v for k, v in state.items()}
    distributed = torch_dist.is_available() and torch_dist.is_initialized()
    world = torch_dist.get_world_size() if distributed else 1
    rank = torch_dist.get_rank() if distributed else 0
    in_world = process_group is None or torch_dist.get_world_size(process_group) == world
    alone = not central_plan and in_world and planning.plannable(tensors, world)
    digest = planning.signature(tensors) if rewrite or (distributed and not central_plan) else 0
    if distributed and not central_plan:
        alone = _every_rank_can_plan_alone(digest, alone, process_group)
    if alone:
        written = _save_without_gather(tensors, path, rank, world, digest if rewrite else None)
        if rank == 0:
            written.append(save_full_checkpoint(skeleton, path / META_FILE))
        return written
    writer = _RecordingWriter(path, rewrite)
    try:
        with _records_without_crc32():
            dcp.save(
                tensors,
                storage_writer=writer,
                planner=_save_planner(plan_cache),
                process_group=process_group,
            )
    except CheckpointException as exc:  # a BaseException: turn it into an ordinary error
        raise dcp_error("save", path, exc) from None
    written: list[Path | WrittenFile] = list(writer.written)
    if rank == 0:
        written.append(save_full_checkpoint(skeleton, path / META_FILE))
    return written


def _every_rank_can_plan_alone(
    digest: int, here: bool, group: torch_dist.ProcessGroup | None
) -> bool:
    """Whether every rank can plan alone and holds the same entries (the same
    :func:`.planning.signature`, ``digest`` here): one all-reduce of three integers, the
    save's only exchange before the commit. Otherwise (a pipeline stage holding its own
    layers, a DTensor on a sub-mesh) the ranks save through DCP's central planner, all of
    them."""
    from torch.distributed.distributed_c10d import _get_object_coll_device

    device = _get_object_coll_device(group)
    votes = torch.tensor([digest, -digest, 0 if here else 1], dtype=torch.int64, device=device)
    torch_dist.all_reduce(votes, op=torch_dist.ReduceOp.MAX, group=group)
    same = int(votes[0]) == -int(votes[1]) == digest
    return same and int(votes[2]) == 0


#: A directory saved into again and again (``rewrite``: a memory snapshot's slot) -> its last
#: save's plan: ``(rank, world, signature)``, the planned items, the metadata fragment and
#: rank 0's ``layout.json`` (with the file's identity then), reused by a save of the same key.
_PLANS: dict[Path, tuple[tuple[int, int, int], Any, Any, tuple[WrittenFile, tuple] | None]] = {}


def _save_without_gather(
    tensors: dict[str, torch.Tensor], path: Path, rank: int, world: int, repeat: int | None = None
) -> list[Path | WrittenFile]:
    """This rank's part of a save planned alone (:mod:`.planning`): its chunks to
    ``__{rank}_0.distcp`` and its metadata fragment to ``__{rank}.metadata`` through DCP's
    writer in its rank-local mode, ``layout.json`` on rank 0. No collective: the commit that
    follows is the one agreement. A failed write raises on this rank (the commit agrees).

    ``repeat``: the state's signature, for a directory saved into again and again
    (``rewrite``): a save of the same layout as the last one there reuses its plan and its
    ``layout.json``, and writes only the tensors' bytes over its data file."""
    writer = _RecordingWriter(path, repeat is not None)
    planner = DefaultSavePlanner()  # resolves each write item to its tensor (DTensor: local)
    planner.set_up_planner(
        state_dict=tensors, storage_meta=writer.storage_meta(), is_coordinator=rank == 0
    )
    writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=False)
    key = (rank, world, repeat)
    last = _PLANS.pop(path, None)
    if last is not None and last[0] == key:
        _, plan, fragment, layout = last
    else:
        plan, fragment = planning.plan_save(tensors, rank)
        # what FileSystemWriter.prepare_local_plan does in its rank-local mode, without its
        # check for another save's index (rank 0's fragment may already be there: this save's)
        plan = planner.finish_plan(replace(plan, storage_data=_StoragePrefix(f"__{rank}_")))
        layout = None
    writer.fs.mkdir(writer.path)
    with _records_without_crc32():
        results = writer.write_data(plan, planner).value()
    writer.finish(fragment, [results])
    written: list[Path | WrittenFile] = list(writer.written)
    if rank == 0:
        file = path / planning.LAYOUT_FILE
        if layout is None or file_identity(file) != layout[1]:
            layout = (_write_layout(file, planning.describe(tensors, world)), file_identity(file))
        written.append(layout[0])
    if repeat is not None:
        _PLANS[path] = (key, plan, fragment, layout)
    return written


def _write_layout(file: Path, layout: planning.SaveLayout) -> WrittenFile:
    with open(file, "wb") as f:
        hashing = HashingWriter(f)
        hashing.write(layout.to_json().encode())
        f.flush()
        os.fsync(f.fileno())
    return WrittenFile(file, hashing.hexdigest())


def forget(directory: str | os.PathLike[str]) -> None:
    """Drop what saves with ``rewrite`` keep of the directories under ``directory`` (their
    plans, their data files' layouts and mapped pages): a memory tier's directory that is
    removed."""
    prefix = os.path.join(os.fspath(directory), "")
    for path in [p for p in _PLANS if os.path.join(os.fspath(p), "").startswith(prefix)]:
        del _PLANS[path]
    forget_records(directory)


def checked_whole(names: Sequence[str], path: str | os.PathLike[str]) -> list[str]:
    """The files of a sharded checkpoint every rank checks whole before trusting what it
    reads (:func:`load_sharded_tensors` with a ``check``): ``meta.pt``, ``layout.json``, and
    ``.metadata`` where it is the index (a checkpoint planned centrally). The metadata
    fragments a rank reads, and the chunks, are checked as they are read."""
    fragmented = planning.is_fragmented(path)
    return [
        name
        for name in names
        if _WRITER.match(name) is None and not (fragmented and name == DCP_METADATA)
    ]


def dcp_error(
    action: str, path: Path | str, exc: CheckpointException, *, rank: int | None = None
) -> CheckpointError:
    """DCP's failure (a ``BaseException`` carrying each failed rank's traceback) as one line
    naming the checkpoint and, for each rank that failed, its error (``rank``: this rank's
    number, for a DCP call without collectives, which numbers itself 0)."""
    failures = "; ".join(
        f"rank {rank if rank is not None else r}: {describe_error(error)}"
        for r, (error, _) in sorted(exc.failures.items())
    )
    return CheckpointError(f"DCP could not {action} {path} ({failures})")


def _full_tensor(path: tuple[str, ...], shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def read_sharded_meta(
    path: str | os.PathLike[str],
) -> tuple[dict[str, Any], dict[str, tuple[tuple[str, ...], torch.Size, torch.dtype]]]:
    """The checkpoint's skeleton (``meta.pt``: everything but the DCP tensors, each replaced by
    a reference) and, for every stored tensor, its path in the checkpoint, global shape and
    dtype. Reads two small files on this process alone (no collectives)."""
    path = Path(path)
    meta_file = path / META_FILE
    if planning.is_fragmented(path) and meta_file.is_file():
        return _read_meta_with_layout(path)
    if not meta_file.is_file() or not (path / DCP_METADATA).is_file():
        raise CheckpointError(
            f"{path} is not a complete sharded checkpoint: it needs {DCP_METADATA} (written by "
            f"torch.distributed.checkpoint) and {META_FILE}; found "
            f"{sorted(os.listdir(path)) if path.is_dir() else 'no directory'}"
        )
    skeleton = load_full_checkpoint(meta_file)
    refs = tensor_refs(skeleton)
    stored = SafeFileSystemReader(path).read_metadata().state_dict_metadata
    missing = sorted(set(refs) - set(stored))
    if missing:
        raise CheckpointError(
            f"{path}: {META_FILE} refers to tensors that DCP did not store: {missing[:5]}"
        )
    specs = {key: (refs[key], stored[key].size, stored[key].properties.dtype) for key in refs}
    return skeleton, specs


def _read_meta_with_layout(
    path: Path,
) -> tuple[dict[str, Any], dict[str, tuple[tuple[str, ...], torch.Size, torch.dtype]]]:
    """:func:`read_sharded_meta` of a checkpoint saved without a gather: shapes and dtypes
    from ``layout.json`` (O(tensors), whatever the number of ranks that wrote it)."""
    skeleton = load_full_checkpoint(path / META_FILE)
    refs = tensor_refs(skeleton)
    layout = planning.read_layout(path)
    missing = sorted(set(refs) - set(layout.tensors))
    if missing:
        raise CheckpointError(
            f"{path}: {META_FILE} refers to tensors that {planning.LAYOUT_FILE} does not "
            f"list: {missing[:5]}"
        )
    specs = {
        key: (
            refs[key],
            torch.Size(layout.tensors[key].shape),
            planning._dtype(layout.tensors[key].dtype),
        )
        for key in refs
    }
    return skeleton, specs


class _FragmentReader(SafeFileSystemReader):
    """:class:`SafeFileSystemReader` over metadata already merged from the fragments a rank
    needs (:mod:`.planning`), instead of a ``.metadata`` file."""

    def __init__(self, path: Path, metadata: Any, check: ReadCheck | None = None) -> None:
        super().__init__(path, check=check)
        self._merged = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        self._merged.storage_meta = self._merged.storage_meta or StorageMeta()
        self._merged.storage_meta.load_id = self.load_id
        return self._merged


def _load_from_fragments(
    path: Path, targets: dict[str, torch.Tensor], check: ReadCheck | None = None
) -> None:
    """Read ``targets`` from a checkpoint saved without a gather, on this rank alone: only the
    metadata fragments whose chunks overlap this rank's targets, then DCP's load without
    collectives (its plans need no coordinator: each rank reads what it needs). ``check``:
    the fragments are checked against the manifest before they are trusted, and the chunks
    read against the checksums the fragments record (:class:`~.manifest.ReadCheck`)."""
    wanted = planning.wanted_chunks(targets)
    layout = planning.read_layout(path)
    ranks = planning.fragments_for(layout, wanted)
    remote = mirror_of(path)  # a checkpoint on object storage: fetch what is read, first
    if remote is not None:
        remote.fetch(planning.fragment_name(rank) for rank in ranks)
    if check is not None:
        check.check_now(planning.fragment_name(rank) for rank in ranks)
    metadata = planning.read_fragments(path, ranks)
    planning.check_coverage(metadata, wanted, str(path))
    planning.list_empty(metadata, layout, wanted)
    if remote is not None:
        remote.fetch_chunks(metadata, wanted)
    with warnings.catch_warnings():  # no_dist is what we asked for
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            reader = _FragmentReader(path, metadata, check)
            dcp.load(targets, storage_reader=reader, no_dist=True)
        except CheckpointException as exc:  # a BaseException: turn it into an ordinary error
            rank = torch_dist.get_rank() if torch_dist.is_initialized() else 0
            raise dcp_error("load", path, exc, rank=rank) from None


def load_sharded_tensors(
    path: str | os.PathLike[str],
    skeleton: dict[str, Any],
    specs: Mapping[str, tuple[tuple[str, ...], torch.Size, torch.dtype]],
    tensor_factory: TensorFactory | None = None,
    *,
    no_dist: bool = False,
    check: ReadCheck | None = None,
) -> dict[str, Any]:
    """Load the tensors that :func:`read_sharded_meta` listed into tensors made by
    ``tensor_factory`` and return the whole checkpoint (a collective unless ``no_dist``).
    ``check``: told of every index file and chunk this rank reads, to compare them with
    their recorded checksums (:class:`~.manifest.ReadCheck`; its ``result()`` is the
    caller's to wait for)."""
    factory = tensor_factory or _full_tensor
    targets = {key: factory(*spec) for key, spec in specs.items()}
    path = Path(path)
    if targets and planning.is_fragmented(path):
        distributed = torch_dist.is_available() and torch_dist.is_initialized()
        if no_dist or not distributed:
            _load_from_fragments(path, targets, check)
        else:  # each rank reads alone; one small agreement on the outcome
            on_every_rank(lambda: _load_from_fragments(path, targets, check), f"loading {path}")
    elif targets:
        remote = mirror_of(path)  # a checkpoint on object storage: fetch what is read, first
        if remote is not None:
            index = SafeFileSystemReader(path).read_metadata()
            remote.fetch_chunks(index, planning.wanted_chunks(targets))
        with warnings.catch_warnings():  # no_dist is what we asked for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            try:
                reader = SafeFileSystemReader(path, check=check)
                dcp.load(targets, storage_reader=reader, no_dist=no_dist)
            except CheckpointException as exc:  # a BaseException: turn it into an ordinary error
                raise dcp_error("load", path, exc) from None
    return _fill(skeleton, targets)


def read_sharded_checkpoint(
    path: str | os.PathLike[str],
    tensor_factory: TensorFactory | None = None,
    *,
    no_dist: bool = False,
) -> dict[str, Any]:
    """Read a sharded checkpoint into tensors made by ``tensor_factory``.

    ``tensor_factory(path, shape, dtype)`` returns the tensor each stored tensor is loaded
    into: a DTensor (each rank reads only its shard, in whatever layout the DTensor has) or
    a plain tensor (read whole). By default every tensor is read whole. ``no_dist=True``
    reads without collectives (one process, or every rank on its own).
    """
    skeleton, specs = read_sharded_meta(path)
    return load_sharded_tensors(path, skeleton, specs, tensor_factory, no_dist=no_dist)


def load_sharded_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The whole checkpoint in this process's memory, as plain tensors on the CPU (no process
    group needed): what a full checkpoint of the same state would hold."""
    return read_sharded_checkpoint(path, no_dist=True)
