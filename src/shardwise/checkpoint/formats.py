"""The checkpoint formats, one object each, told apart by what is on disk.

- :data:`FULL` (``'full'``): one file, written by rank 0 (:mod:`.full`); the state is gathered
  whole before it is saved;
- :data:`SHARDED` (``'sharded'``): a directory holding DCP's ``.metadata``, written by every
  rank (:mod:`.sharded`);
- :data:`LOCAL` (``'local'``): a directory of ``rank{i}.pth``, each rank's own shards
  (:mod:`.local`, mmengine's layout).

A format object holds what differs between them: its shape on disk (``is_dir``), whether the
state is gathered whole (``gathered``), what a rank writes (:meth:`~CheckpointFormat.write`)
and stages for an asynchronous save (:meth:`~CheckpointFormat.stage`), how one process reads a
checkpoint whole (:meth:`~CheckpointFormat.read`) and how the ranks of a sharded run read it
onto their shards (:meth:`~CheckpointFormat.read_onto`, the strategy giving a
:class:`Placement`). The rest of shardwise holds format objects: a name becomes one once, at
the boundary (:func:`format_named`), a path through :func:`detect_format`.

Example::

    >>> fmt = detect_format('work_dirs/demo/epoch_1.pth')
    >>> fmt, fmt.is_dir
    (SHARDED, True)
    >>> checkpoint = read_checkpoint('work_dirs/demo/epoch_1.pth')  # full tensors, one process
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from ..tree import map_tensors
from .files import CheckpointError
from .full import (
    WrittenFile,
    check_torch_file,
    is_bare_state_dict,
    load_full_checkpoint,
    save_full_checkpoint,
)
from .local import load_local_checkpoint, local_ranks, save_local_checkpoint
from .manifest import ChecksumCheck, checksums_checked, recorded_files
from .sharded import (
    DCP_METADATA,
    META_FILE,
    load_sharded_checkpoint,
    load_sharded_tensors,
    read_sharded_meta,
    save_sharded_checkpoint,
    verification_share,
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
    "probe_checkpoint",
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
                checkpoint.update(load_full_checkpoint(path, map_location="cpu"))
            return _skeleton(checkpoint)

        skeleton = placement.on_rank0(read)
        if placement.rank == 0:
            return checkpoint
        return map_tensors(lambda spec: spec.placeholder(), skeleton, kind=_TensorSpec)

    def probe(self, path):
        check_torch_file(path)

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
        placement's tensors; meanwhile each rank checks the checksums of its share of the
        files, and the ranks agree on that before anything is returned (a mismatch also
        explains a failed load)."""
        check = None
        if verify:
            share = verification_share(recorded_files(path), placement.rank, placement.world_size)
            check = ChecksumCheck(path, share)
        checkpoint, error = None, None
        try:
            skeleton, specs = placement.on_every_rank(lambda: read_sharded_meta(path))
            checkpoint = load_sharded_tensors(path, skeleton, specs, placement.tensor_for)
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

    def layout(self, files, ranks):
        return f"DCP directory, {files} files"


class _Local(CheckpointFormat):
    name = "local"

    def write(self, state, staging, *, rank, group=None, plan=None):
        return [save_local_checkpoint(state, staging, rank)]

    def read(self, path, map_location="cpu"):
        raise CheckpointError(
            f"{path} is a local checkpoint (one rank{{i}}.pth per rank, each holding that "
            "rank's shards); it loads only under FSDPStrategy on the same number of ranks. Load "
            "it there and save it again with state_dict_cfg='full' or 'sharded' to use it "
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


class _Safetensors(CheckpointFormat):
    """An exported safetensors file: weights only, read by the checkpoint tools."""

    name, is_dir = "safetensors", False

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


def detect_format(path: str | os.PathLike[str]) -> CheckpointFormat:
    """:data:`FULL` for a file, :data:`SHARDED` for a directory holding DCP's ``.metadata``,
    :data:`LOCAL` for a directory of ``rank{i}.pth``.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        CheckpointError: a directory that is none of these.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} does not exist; give the path of a checkpoint file or "
            "directory (work_dir/last_checkpoint names the latest one)"
        )
    if not path.is_dir():
        return FULL
    if (path / DCP_METADATA).is_file():
        return SHARDED
    if local_ranks(path):
        return LOCAL
    raise CheckpointError(
        f"{path} is a directory but not a checkpoint: a sharded checkpoint holds {DCP_METADATA}, "
        f"a local one rank0.pth, rank1.pth, ...; it holds {sorted(os.listdir(path))[:10]}"
    )


def probe_checkpoint(path: str | os.PathLike[str]) -> CheckpointFormat:
    """The format of the checkpoint at ``path``, after a cheap look that it is one (the first
    bytes of a file, the index files of a directory); reads no tensor.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        CheckpointError: ``path`` is not a checkpoint, saying why.
    """
    fmt = detect_format(path)
    fmt.probe(Path(path))
    return fmt


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
