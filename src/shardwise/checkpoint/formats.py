"""The checkpoint formats, one object each, told apart by what is on disk.

- :data:`FULL` (``'full'``): one file, written by rank 0 (:mod:`.full`); the state is gathered
  whole before it is saved;
- :data:`SHARDED` (``'sharded'``): a directory written by every rank through DCP
  (:mod:`.sharded`), indexed by a metadata fragment per rank and ``layout.json``
  (:mod:`.planning`; DCP's one ``.metadata`` once ``shardwise ckpt index`` wrote it) or, saved
  by DCP's central planner, by ``.metadata``;
- :data:`LOCAL` (``'local'``): a directory of ``rank{i}.pth``, each rank's own shards
  (:mod:`.local`, mmengine's layout);
- :data:`SAFETENSORS` (``'safetensors'``): an exported file of weights
  (:mod:`.safetensors_file`), read like a full checkpoint, never saved by a strategy.

A format object holds what differs between them: its shape on disk (``is_dir``), whether the
state is gathered whole (``gathered``), what a rank writes (:meth:`~CheckpointFormat.write`)
and stages for an asynchronous save (:meth:`~CheckpointFormat.stage`), how one process reads a
checkpoint whole (:meth:`~CheckpointFormat.read`) and how the ranks of a sharded run read it
onto their shards (:meth:`~CheckpointFormat.read_onto`, the strategy giving a
:class:`Placement`), and how the checkpoint tools open it to read tensor by tensor
(:meth:`~CheckpointFormat.open`, :mod:`.opened`). The rest of shardwise holds format objects:
a name becomes one once, at the boundary (:func:`format_named`), a path through
:func:`detect_format`, the one detection function.

Example::

    >>> fmt = detect_format('work_dirs/demo/epoch_1.pth')
    >>> fmt, fmt.is_dir
    (SHARDED, True)
    >>> checkpoint = read_checkpoint('work_dirs/demo/epoch_1.pth')  # full tensors, one process
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from ..tree import map_tensors, map_with_path
from .dcp_index import dcp_files
from .files import CheckpointError, require_checkpoint
from .full import (
    WrittenFile,
    check_torch_file,
    damaged_file_error,
    is_bare_state_dict,
    load_full_checkpoint,
    load_with_offsets,
    read_bytes,
    read_tensor_at,
    save_full_checkpoint,
)
from .local import load_local_checkpoint, local_ranks, rank_file, save_local_checkpoint
from .manifest import ReadCheck, checksums_checked, read_manifest, recorded_files
from .opened import MODEL, OpenCheckpoint, TensorInfo, map_infos, normalize
from .planning import LAYOUT_FILE, index_files, is_fragmented
from .safe_dcp import SafeFileSystemReader, read_dcp_metadata
from .safetensors_file import TORCH_DTYPES, is_safetensors_file, read_safetensors_header
from .sharded import (
    DCP_METADATA,
    META_FILE,
    REF,
    checked_whole,
    is_ref,
    load_sharded_checkpoint,
    load_sharded_tensors,
    read_sharded_meta,
    save_sharded_checkpoint,
)

__all__ = [
    "FORMATS",
    "FULL",
    "LOCAL",
    "SAFETENSORS",
    "SHARDED",
    "CheckpointFormat",
    "Placement",
    "detect_format",
    "format_named",
    "open_checkpoint",
    "read_checkpoint",
]


class Placement(Protocol):
    """The strategy's side of a read by the ranks of a sharded run: where each stored tensor
    goes, and how the ranks agree on the outcome of a step."""

    rank: int
    world_size: int

    def tensor_for(self, path: tuple[str, ...], shape: torch.Size, dtype: torch.dtype) -> Any:
        """The tensor a stored one is read into: this rank's shard (a DTensor), or whole."""

    def shard_of(self, name: str, tensor: torch.Tensor) -> Any:
        """A tensor of parameter ``name`` as saved by this rank, as this rank's shard."""

    def on_rank0(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on rank 0, its result (or exception) on every rank."""

    def on_every_rank(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on every rank; if it fails anywhere, it fails everywhere."""


class CheckpointFormat:
    """One checkpoint format (see the module docstring)."""

    name = ""
    is_dir = True
    gathered = False  # the state is gathered whole (full tensors) before it is saved

    def __repr__(self) -> str:
        return self.name.upper()

    def __str__(self) -> str:
        return self.name

    def writes_on(self, rank: int) -> bool:
        """Whether ``rank`` writes (and so stages) a part of the checkpoint."""
        return True

    def write(
        self,
        state: dict[str, Any],
        staging: Path,
        *,
        rank: int,
        group: Any = None,
        plan: str | None = None,
    ) -> list[Path | WrittenFile]:
        """Write this rank's part of ``state`` under the commit protocol's staging path;
        return the files written (collectives on ``group``; ``plan`` names a series of saves
        of one layout, whose DCP plan may be reused)."""
        raise NotImplementedError

    def stage(self, state: dict[str, Any], stager: Any, rank: int) -> dict[str, Any]:
        """What ``rank`` keeps in host memory for an asynchronous save (``stager``: the
        :class:`~.async_save.AsyncCheckpointer`)."""
        return stager.stage(state) if self.writes_on(rank) else {}

    def read(self, path: Path, map_location: Any = "cpu") -> dict[str, Any]:
        """The whole checkpoint in this process, as plain tensors (no collectives)."""
        raise NotImplementedError

    def read_onto(self, path: Path, placement: Placement, verify: bool) -> dict[str, Any]:
        """The checkpoint read by every rank of a sharded run onto its shards (collective),
        its files compared with their checksums meanwhile when ``verify``."""
        raise NotImplementedError

    def probe(self, path: Path) -> None:
        """Refuse, cheaply, what only looks like a checkpoint of this format."""

    def open(self, path: Path) -> OpenCheckpoint:
        """The checkpoint at ``path`` opened for reading tensor by tensor (:mod:`.opened`):
        only what describes it is read now."""
        raise NotImplementedError

    def read_tensor(
        self, opened: OpenCheckpoint, info: TensorInfo, out: torch.Tensor | None
    ) -> torch.Tensor:
        """One tensor of a checkpoint this format opened, whole (into ``out`` if given)."""
        raise NotImplementedError

    def load_tensors(
        self,
        opened: OpenCheckpoint,
        tree: Any,
        on_tensor: Callable[[TensorInfo], None] | None,
    ) -> Any:
        """``tree`` (part of ``opened.skeleton``) with every tensor read (here one by one)."""
        return opened.load_each(tree, on_tensor)

    def layout(self, files: int, ranks: int) -> str:
        """How ``ckpt inspect`` describes the layout on disk."""
        raise NotImplementedError


class _Full(CheckpointFormat):
    name, is_dir, gathered = "full", False, True

    def writes_on(self, rank: int) -> bool:
        return rank == 0

    def write(self, state, staging, *, rank, group=None, plan=None):
        if rank != 0:
            return []
        return [save_full_checkpoint(map_tensors(lambda t: t.cpu(), state), staging)]

    def read(self, path, map_location="cpu"):
        return load_full_checkpoint(path, map_location=map_location)

    def read_onto(self, path, placement, verify):
        """Rank 0 reads the file; the others get its structure, a meta-device placeholder for
        every model and optimizer tensor (loading broadcasts from rank 0)."""
        checkpoint: dict[str, Any] = {}

        def read() -> dict[str, Any]:
            with checksums_checked(path, enabled=verify):
                checkpoint.update(self.read(path, "cpu"))
            return _skeleton(checkpoint)

        skeleton = placement.on_rank0(read)
        if placement.rank == 0:
            return checkpoint
        return map_tensors(lambda spec: spec.placeholder(), skeleton, kind=_TensorSpec)

    def probe(self, path):
        check_torch_file(path)

    def open(self, path):
        """The pickle is read with every tensor on the meta device, which records each
        storage's byte offset in the file: a tensor is read from its bytes alone."""
        stored: dict[str, torch.Tensor] = {}
        try:
            tree = load_with_offsets(path)
            if tree is None:  # not a zip archive (legacy torch.save): no offsets, read it whole
                tree = load_full_checkpoint(path)
        except (CheckpointError, FileNotFoundError, PermissionError):
            raise
        except Exception as exc:  # noqa: BLE001 - damaged bytes fail zipfile in many ways
            raise damaged_file_error(path, exc) from exc

        def describe(leaf_path: tuple[str, ...], leaf: Any) -> Any:
            if not isinstance(leaf, torch.Tensor):
                return leaf
            stored["/".join(leaf_path)] = leaf
            return TensorInfo(leaf_path, tuple(leaf.shape), leaf.dtype)

        skeleton = map_with_path(describe, normalize(tree, path), is_leaf=is_ref)
        return OpenCheckpoint(path, self, skeleton, [path.name], stored)

    def read_tensor(self, opened, info, out):
        stored = opened.index[info.key]
        if stored.device.type != "meta":
            return stored if out is None else out.copy_(stored)
        storage = stored.untyped_storage()
        offset = storage._checkpoint_offset  # torch.load(map_location='meta') records it
        if stored.is_contiguous():
            start = offset + stored.storage_offset() * stored.element_size()
            return read_tensor_at(opened.path, start, info.shape, info.dtype, out)
        data = read_bytes(opened.path, offset, storage.nbytes()).view(stored.dtype)
        whole = data.as_strided(stored.shape, stored.stride(), stored.storage_offset())
        return whole.clone() if out is None else out.copy_(whole)

    def load_tensors(self, opened, tree, on_tensor):
        """Through ``torch.load(mmap=True)``: tensors that shared storage still do, and
        bytes are read only when used."""
        if any(t.device.type != "meta" for t in opened.index.values()):
            return opened.load_each(tree, on_tensor)  # read whole already
        try:
            whole = load_full_checkpoint(opened.path, map_location="cpu", mmap=True)
        except Exception as exc:  # noqa: BLE001 - the pickle read fine a moment ago
            raise CheckpointError(f"{opened.path} cannot be read: {exc}") from exc
        stored: dict[str, torch.Tensor] = {}

        def index(leaf_path: tuple[str, ...], leaf: Any) -> Any:
            if isinstance(leaf, torch.Tensor):
                stored["/".join(leaf_path)] = leaf
            return leaf

        map_with_path(index, normalize(whole, opened.path), is_leaf=is_ref)

        def fill(info: TensorInfo) -> torch.Tensor:
            if on_tensor is not None:
                on_tensor(info)
            return stored[info.key]

        return map_infos(fill, tree)

    def layout(self, files, ranks):
        return "one torch.save file"


class _Sharded(CheckpointFormat):
    name = "sharded"

    def write(self, state, staging, *, rank, group=None, plan=None):
        return save_sharded_checkpoint(state, staging, process_group=group, plan_cache=plan)

    def read(self, path, map_location="cpu"):
        checkpoint = load_sharded_checkpoint(path)
        device = map_location if isinstance(map_location, str | torch.device) else "cpu"
        if torch.device(device).type != "cpu":
            checkpoint = map_tensors(lambda t: t.to(map_location), checkpoint)
        return checkpoint

    def read_onto(self, path, placement, verify):
        """The small files on every rank (agreed), then DCP's collective load into the
        placement's tensors; meanwhile each rank checks the checksums of what it reads (the
        small files whole, the metadata fragments it reads before trusting them, and each
        chunk it reads against the checksum its fragment records, :class:`ReadCheck`: under
        resharding, part of a file), and the ranks agree on that before anything is returned
        (a mismatch also explains a failed load)."""
        check = None
        if verify and read_manifest(path) is not None:
            check = ReadCheck(path, checked_whole(recorded_files(path), path))
        checkpoint, error = None, None
        try:
            skeleton, specs = placement.on_every_rank(lambda: read_sharded_meta(path))
            checkpoint = load_sharded_tensors(
                path, skeleton, specs, placement.tensor_for, check=check
            )
        except Exception as exc:  # noqa: BLE001 - every rank failed (agreed): raised below
            error = exc
        if check is not None:
            placement.on_every_rank(check.result)
        if error is not None:
            raise error
        return checkpoint

    def probe(self, path):
        if not (path / META_FILE).is_file():
            raise CheckpointError(
                f"{path} is not a complete sharded checkpoint: it has {DCP_METADATA} but no "
                f"{META_FILE}"
            )

    def open(self, path):
        """Shapes and dtypes from DCP's index, the rest from ``meta.pt``; a tensor is read
        with DCP (no process group), its chunks gathered."""
        if not (path / META_FILE).is_file():
            raise CheckpointError(
                f"{path} is not a complete sharded checkpoint: {META_FILE} is missing (found "
                f"{sorted(os.listdir(path))}); it was not written by shardwise, or was cut short"
            )
        metadata = read_dcp_metadata(path)
        stored = metadata.state_dict_metadata
        keys: dict[str, str] = {}  # TensorInfo.key -> the key DCP stored it under
        skeleton = normalize(load_full_checkpoint(path / META_FILE), path / META_FILE)

        def describe(leaf_path: tuple[str, ...], leaf: Any) -> Any:
            if not is_ref(leaf):
                return leaf
            key = leaf[REF]
            if key not in stored or not hasattr(stored[key], "chunks"):
                raise CheckpointError(
                    f"{path}: {META_FILE} refers to tensor {key!r}, which {DCP_METADATA} does "
                    "not hold; the checkpoint is inconsistent"
                )
            md = stored[key]
            info = TensorInfo(leaf_path, tuple(md.size), md.properties.dtype)
            keys[info.key] = key
            return info

        index = index_files(path) if is_fragmented(path) else {DCP_METADATA}
        files = sorted(index | {META_FILE} | dcp_files(metadata))
        skeleton = map_with_path(describe, skeleton, is_leaf=is_ref)
        reader = SafeFileSystemReader(path, metadata=metadata)
        return OpenCheckpoint(path, self, skeleton, files, _DcpIndex(keys, metadata, reader))

    def read_tensor(self, opened, info, out):
        return self._load(opened, [info], {} if out is None else {info.key: out})[info.key]

    def load_tensors(self, opened, tree, on_tensor):
        """Every tensor of ``tree`` in one DCP load (``on_tensor`` told as each is read)."""
        infos: list[TensorInfo] = []
        map_infos(infos.append, tree)
        loaded = self._load(opened, infos, on_tensor=on_tensor)
        return map_infos(lambda info: loaded[info.key], tree)

    @staticmethod
    def _load(
        opened: OpenCheckpoint,
        infos: list[TensorInfo],
        out: Mapping[str, torch.Tensor] | None = None,
        on_tensor: Callable[[TensorInfo], None] | None = None,
    ) -> dict[str, torch.Tensor]:
        """The tensors ``infos`` in one DCP load (into ``out``'s tensors where given), by the
        reader :meth:`open` made, over the index it read (not read again per load)."""
        index: _DcpIndex = opened.index
        out = out or {}
        targets = {
            index.keys[info.key]: out[info.key]
            if info.key in out
            else torch.empty(info.shape, dtype=info.dtype)
            for info in infos
        }
        if targets:
            import torch.distributed.checkpoint as dcp

            by_key = {index.keys[info.key]: info for info in infos}
            with warnings.catch_warnings():  # one process without a process group: intended
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                planner = _ReportingPlanner(by_key, on_tensor)
                dcp.load(targets, storage_reader=index.reader, planner=planner, no_dist=True)
            planner.report_the_rest()
        return {info.key: targets[index.keys[info.key]] for info in infos}

    def layout(self, files, ranks):
        return f"DCP directory, {files} files"


class _DcpIndex(NamedTuple):
    """What :meth:`_Sharded.open` keeps to read a sharded checkpoint's tensors: the DCP key of
    each :attr:`TensorInfo.key`, DCP's index (read once, for every load), and the reader of
    every load (what it learns of the records' layout is kept from one load to the next:
    tensor by tensor, each record kind is parsed once)."""

    keys: dict[str, str]
    metadata: Any
    reader: SafeFileSystemReader


class _ReportingPlanner(DefaultLoadPlanner):
    """DCP's load planner, telling ``on_tensor(info)`` as each tensor's last chunk is read
    (a progress bar over one DCP load of many tensors)."""

    def __init__(
        self, infos: Mapping[str, TensorInfo], on_tensor: Callable[[TensorInfo], None] | None
    ) -> None:
        super().__init__()
        self._infos, self._on_tensor = infos, on_tensor
        self._left: dict[str, int] = {}  # chunks still to read, per DCP key

    def create_local_plan(self) -> Any:
        plan = super().create_local_plan()
        self._left = dict.fromkeys(self._infos, 0)
        for item in plan.items:
            self._left[item.dest_index.fqn] += 1
        return plan

    def commit_tensor(self, read_item: Any, tensor: torch.Tensor) -> None:
        super().commit_tensor(read_item, tensor)
        key = read_item.dest_index.fqn
        self._left[key] -= 1
        if self._left[key] == 0:
            self._left[key] = -1  # told
            if self._on_tensor is not None:
                self._on_tensor(self._infos[key])

    def report_the_rest(self) -> None:
        """Tell ``on_tensor`` of the tensors the plan read no chunk of (no elements)."""
        for key, left in self._left.items():
            if left == 0 and self._on_tensor is not None:
                self._on_tensor(self._infos[key])
            self._left[key] = -1  # told


class _Local(CheckpointFormat):
    name = "local"

    def write(self, state, staging, *, rank, group=None, plan=None):
        return [save_local_checkpoint(state, staging, rank)]

    def read(self, path, map_location="cpu"):
        raise CheckpointError(
            f"{path} is a local checkpoint (one rank{{i}}.pth per rank, each holding that "
            "rank's shards); it loads only under FSDPStrategy on the same number of ranks. Load "
            "it there and save it again with state_dict_cfg='sharded' or 'full' to use it "
            "elsewhere"
        )

    def read_onto(self, path, placement, verify):
        def read() -> dict[str, Any]:
            checkpoint = load_local_checkpoint(
                path, placement.rank, placement.world_size, verify_checksums=verify
            )
            checkpoint["state_dict"] = {
                k: placement.shard_of(k, v) for k, v in checkpoint.get("state_dict", {}).items()
            }
            if "optimizer" in checkpoint:
                checkpoint["optimizer"] = _map_param_states(
                    checkpoint["optimizer"], placement.shard_of
                )
            return checkpoint

        return placement.on_every_rank(read)

    def layout(self, files, ranks):
        return f"directory of {ranks} rank files"

    def open(self, path):
        """Each rank's file opened as a full checkpoint (its tensors are that rank's shards,
        ``index``: rank -> opened file); the skeleton is rank 0's. Tensors are not read whole:
        only FSDPStrategy on the same ranks can place them."""
        ranks = {rank: FULL.open(rank_file(path, rank)) for rank in local_ranks(path)}
        files = [rank_file(path, rank).name for rank in ranks]
        return OpenCheckpoint(path, self, ranks[min(ranks)].skeleton, files, ranks)

    def read_tensor(self, opened, info, out):
        return self.read(opened.path)  # refused, saying where it loads


class _Safetensors(_Full):
    """An exported safetensors file: the model weights (under ``state_dict``) and string
    metadata (under ``meta``); read like a full checkpoint (``load_from`` one, say), never
    saved by a strategy (``ckpt convert --to safetensors`` exports one)."""

    name = "safetensors"

    def write(self, state, staging, *, rank, group=None, plan=None):
        raise ValueError("a strategy does not save safetensors; export with ckpt convert")

    def read(self, path, map_location="cpu"):
        checkpoint = self.open(path).load()
        if map_location not in ("cpu", None, torch.device("cpu")):
            checkpoint = map_tensors(lambda t: t.to(map_location), checkpoint)
        return checkpoint

    def probe(self, path):
        read_safetensors_header(path)

    def open(self, path):
        header, start = read_safetensors_header(path)
        offsets: dict[str, tuple[int, int]] = {}
        state_dict: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype = TORCH_DTYPES[entry["dtype"]]
                begin, end = entry["data_offsets"]
                state_dict[name] = TensorInfo((MODEL, name), tuple(entry["shape"]), dtype)
            except (KeyError, TypeError, ValueError) as exc:
                raise CheckpointError(
                    f"{path}: the safetensors header entry for {name!r} is invalid ({entry!r})"
                ) from exc
            offsets[name] = (start + begin, start + end)
        skeleton = {MODEL: state_dict, "meta": dict(header.get("__metadata__") or {})}
        return OpenCheckpoint(path, self, skeleton, [path.name], offsets)

    def read_tensor(self, opened, info, out):
        begin, end = opened.index[info.path[1]]
        if end - begin != info.nbytes:
            raise CheckpointError(
                f"{opened.path}: tensor {info.name!r} spans {end - begin} bytes, but its shape "
                f"and dtype need {info.nbytes}"
            )
        return read_tensor_at(opened.path, begin, info.shape, info.dtype, out)

    def load_tensors(self, opened, tree, on_tensor):
        return opened.load_each(tree, on_tensor)

    def layout(self, files, ranks):
        return "safetensors file, weights only"


FULL, SHARDED, LOCAL = _Full(), _Sharded(), _Local()
SAFETENSORS = _Safetensors()
#: The formats strategies save and load, by name.
FORMATS: dict[str, CheckpointFormat] = {f.name: f for f in (FULL, SHARDED, LOCAL)}


def format_named(name: Any, what: str = "format") -> CheckpointFormat:
    """The format called ``name`` (``'full'``, ``'sharded'`` or ``'local'``)."""
    if isinstance(name, CheckpointFormat):
        return name
    if name not in FORMATS:
        raise ValueError(f"{what}={name!r} is not one of {list(FORMATS)}")
    return FORMATS[name]


def detect_format(path: str | os.PathLike[str], *, probe: bool = False) -> CheckpointFormat:
    """The format of what is at ``path``, told from what is on disk: :data:`SHARDED` for a
    directory holding ``layout.json`` or DCP's ``.metadata``, :data:`LOCAL` for a directory
    of ``rank{i}.pth``, :data:`SAFETENSORS` for a file that starts like one, else
    :data:`FULL`. With ``probe``, a cheap look that it really is one (the first bytes of a
    file, the index files of a directory); no tensor is read.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        CheckpointError: a directory that is none of these; with ``probe``, a file or
            directory that only looks like a checkpoint, saying why.
    """
    path = Path(path)
    require_checkpoint(path)
    if not path.is_dir():
        fmt = SAFETENSORS if is_safetensors_file(path) else FULL
    elif (path / DCP_METADATA).is_file() or is_fragmented(path):
        fmt = SHARDED
    elif local_ranks(path):
        fmt = LOCAL
    else:
        raise CheckpointError(
            f"{path} is a directory but not a checkpoint: a sharded checkpoint holds "
            f"{LAYOUT_FILE} or {DCP_METADATA}, a local one rank0.pth, rank1.pth, ...; it holds "
            f"{sorted(os.listdir(path))[:10]}"
        )
    if probe:
        fmt.probe(path)
    return fmt


def open_checkpoint(path: str | os.PathLike[str]) -> OpenCheckpoint:
    """Open a full, sharded or local checkpoint, or a safetensors file, for reading tensor by
    tensor (:mod:`.opened`); only its metadata is read now.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        CheckpointError: it is not a checkpoint, or is damaged.
    """
    return detect_format(path).open(Path(path))


def read_checkpoint(
    path: str | os.PathLike[str], map_location: Any = "cpu", *, verify_checksums: bool = True
) -> dict[str, Any]:
    """Read a full or sharded checkpoint whole into this process (plain tensors).

    A sharded checkpoint is read without collectives, so this works on one process and on
    every rank of a DDP run alike. A local checkpoint holds shards that only the sharded
    strategy that wrote it can place, so it is refused here. With ``verify_checksums`` every
    file is compared with the checksums its manifest recorded at save time while it is read
    (a mismatch raises :class:`CheckpointError` naming the file, and nothing read is
    returned; a checkpoint without a manifest is read as it is).
    """
    fmt = detect_format(path)
    if fmt is LOCAL:
        return fmt.read(Path(path))  # refused, saying where it loads
    with checksums_checked(path, enabled=verify_checksums):
        return fmt.read(Path(path), map_location)


class _TensorSpec:
    """Shape and dtype of a tensor that only rank 0 holds (broadcast to the others)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.shape, self.dtype = tuple(tensor.shape), tensor.dtype

    def placeholder(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device="meta")


def _skeleton(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` with a :class:`_TensorSpec` for every model and optimizer tensor (every
    tensor of a bare state dict)."""
    if is_bare_state_dict(checkpoint):
        return {k: _TensorSpec(v) for k, v in checkpoint.items()}
    return {
        k: map_tensors(_TensorSpec, v) if k in ("state_dict", "optimizer") else v
        for k, v in checkpoint.items()
    }


def _map_param_states(optim_state: Any, fn: Callable[[str, Any], Any]) -> Any:
    """Apply ``fn(param_name, value)`` to every per-parameter state value (one optimizer's
    state, or a dict of them by optimizer name)."""
    if not isinstance(optim_state, dict):
        return optim_state
    if "state" in optim_state and "param_groups" in optim_state:
        state = {
            fqn: {k: fn(fqn, v) for k, v in per_param.items()}
            for fqn, per_param in optim_state["state"].items()
        }
        return {**optim_state, "state": state}
    return {k: _map_param_states(v, fn) for k, v in optim_state.items()}
