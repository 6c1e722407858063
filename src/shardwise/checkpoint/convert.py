"""Convert a checkpoint between formats on the CPU, in one process (no process group).

- ``to='full'``: one ``torch.save`` file, what ``SingleDeviceStrategy``/``DDPStrategy`` save;
- ``to='sharded'``: a DCP directory (written by this one process), which every strategy
  loads on any number of ranks;
- ``to='safetensors'``: the model weights alone, for serving, streamed tensor by tensor
  (memory: the largest tensor, not the model).

The source is a full or sharded checkpoint (or a safetensors file); a local one holds shards
that only ``FSDPStrategy`` on the same number of ranks can place, so it is refused with that
way out. ``dtype`` casts the floating-point model weights (the optimizer state keeps its
precision: its step counters and moments need it); ``model_only`` keeps only the weights and
``meta``. The output is written through the commit protocol — nothing appears under ``dst``
until it is complete — with a manifest of its checksums.

Example::

    >>> convert_checkpoint('work_dirs/gpt/iter_1000.pth', 'gpt.safetensors',
    ...                    to='safetensors', dtype='bf16')
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from ..dtypes import parse_dtype
from ..env import gc_paused
from ..tree import map_with_path
from .commit import CheckpointCommit, check_replaceable
from .files import CheckpointError, require_checkpoint
from .formats import FULL, LOCAL, SAFETENSORS, SHARDED, CheckpointFormat, open_checkpoint
from .manifest import check_checksums
from .opened import MODEL, OpenCheckpoint, TensorInfo
from .progress import progress_bar
from .safetensors_export import export_safetensors, safetensors_header

__all__ = ["CAST_DTYPES", "TARGETS", "convert_checkpoint"]

logger = logging.getLogger(__name__)

#: The formats :func:`convert_checkpoint` writes, by name.
TARGETS = {fmt.name: fmt for fmt in (FULL, SHARDED, SAFETENSORS)}
#: The dtype names ``dtype`` may cast model weights to (``--dtype bf16|fp16|fp32``).
CAST_DTYPES = ("bf16", "fp16", "fp32", "bfloat16", "float16", "float32")
_KEPT_BY_MODEL_ONLY = (MODEL, "meta")


def _check_destination(src: Path, dst: Path, overwrite: bool) -> None:
    if dst.exists() or dst.is_symlink():
        if not overwrite:
            raise FileExistsError(
                f"destination {str(dst)!r} already exists; choose another path, or pass "
                "--overwrite (overwrite=True) to replace it"
            )
        if dst.resolve() == src.resolve():
            raise ValueError(
                f"destination {str(dst)!r} is the source checkpoint; write the conversion to "
                "another path"
            )
        try:
            check_replaceable(dst.absolute())
        except CheckpointError as exc:
            raise FileExistsError(str(exc)) from None
    if src.is_dir() and dst.resolve().is_relative_to(src.resolve()):
        raise ValueError(
            f"destination {str(dst)!r} is inside the source checkpoint {str(src)!r}; write the "
            "conversion beside it instead"
        )


def _converted_meta(reader: OpenCheckpoint, meta: Any, **record: Any) -> dict[str, Any]:
    meta = dict(meta) if isinstance(meta, dict) else {}
    meta["converted_from"] = dict(
        path=str(reader.path.absolute()),
        format=reader.format.name,
        time=time.strftime("%Y-%m-%d %H:%M:%S"),
        **record,
    )
    return meta


def _safetensors_metadata(reader: OpenCheckpoint, dtype: torch.dtype | None) -> dict[str, str]:
    """String metadata for the safetensors header: what a serving stack or a reader of the
    file wants to know about where the weights came from."""
    metadata = {"format": "pt", "source_format": reader.format.name}
    for key in ("shardwise_version", "strategy", "world_size", "seed", "epoch", "iter", "step"):
        value = reader.meta.get(key)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            metadata[key] = str(value)
    if dtype is not None:
        metadata["dtype"] = str(dtype).removeprefix("torch.")
    return metadata


def _load_state(
    reader: OpenCheckpoint,
    tree: dict[str, Any],
    *,
    dtype: torch.dtype | None,
    on_tensor: Callable[[TensorInfo], None],
) -> dict[str, Any]:
    state = reader.load(tree, on_tensor=on_tensor)
    if dtype is not None and MODEL in state:

        def cast(_: tuple[str, ...], leaf: Any) -> Any:
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                return leaf.to(dtype)
            return leaf

        state[MODEL] = map_with_path(cast, state[MODEL])
    return state


def _write(state: dict[str, Any], staging: Path, target: CheckpointFormat) -> list[Any]:
    """The files written, each with the checksum taken while writing it."""
    with warnings.catch_warnings():  # one process without a process group: intended
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return target.write(state, staging, rank=0)


@gc_paused()  # a conversion makes enough objects to set off full collections: 0.2 s each
def convert_checkpoint(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    to: str,
    dtype: str | torch.dtype | None = None,
    model_only: bool = False,
    overwrite: bool = False,
    progress: bool = False,
    verify_checksums: bool = True,
) -> Path:
    """Convert the checkpoint ``src`` into format ``to`` at ``dst``; returns ``dst``.

    Args:
        to: ``'full'``, ``'sharded'`` or ``'safetensors'``.
        dtype: cast floating-point model weights to ``'bf16'``, ``'fp16'`` or ``'fp32'``.
        model_only: keep the weights and ``meta``, drop the optimizer, schedulers and extras
            (a safetensors file always holds the weights only).
        overwrite: replace ``dst`` if it is a checkpoint (atomically: the old one stays until
            the new one is complete); anything else there is never replaced.
        progress: show a progress bar on stderr (drawn only when stderr is a terminal).
        verify_checksums: first compare ``src`` with the checksums recorded when it was saved
            (a damaged checkpoint must not come out converted, with a fresh manifest).

    Raises:
        ValueError: an unknown ``to`` or ``dtype``, or ``dst`` is (inside) ``src``.
        FileNotFoundError: ``src`` does not exist.
        FileExistsError: ``dst`` exists and ``overwrite`` is False, or it is not a committed
            checkpoint (no manifest).
        CheckpointError: ``src`` is damaged (its checksums differ), or a local checkpoint.
        RuntimeError: called inside a process group of more than one rank.
    """
    distributed = torch_dist.is_available() and torch_dist.is_initialized()
    if distributed and torch_dist.get_world_size() > 1:
        raise RuntimeError(
            "convert_checkpoint runs in one process, without a process group; this one is "
            f"rank {torch_dist.get_rank()} of {torch_dist.get_world_size()}. Run "
            "`shardwise ckpt convert` outside the training job"
        )
    target = TARGETS.get(to)
    if target is None:
        raise ValueError(
            f"to={to!r} is not a format convert writes; use one of {', '.join(TARGETS)}"
        )
    cast_to = parse_dtype(dtype, "dtype", names=CAST_DTYPES)
    src, dst = Path(src), Path(dst)
    require_checkpoint(src)
    _check_destination(src, dst, overwrite)
    if verify_checksums:
        check_checksums(src)
    reader = open_checkpoint(src)
    if reader.format is LOCAL:
        LOCAL.read(src)  # refused, saying where it loads
    if target is SAFETENSORS:  # checks every tensor can be stored before anything is written
        metadata = _safetensors_metadata(reader, cast_to)
        safetensors_header(reader.tensors(MODEL), dtype=cast_to, metadata=metadata)
    tree = reader.skeleton
    if model_only or target is SAFETENSORS:
        tree = {k: v for k, v in tree.items() if k in _KEPT_BY_MODEL_ONLY}
    start = time.perf_counter()
    written = (MODEL,) if target is SAFETENSORS else tuple(tree)
    total = sum(info.nbytes for info in reader.tensors(*written))
    bar = progress_bar(total, f"{to} {dst.name}", enabled=progress)

    def on_tensor(info: TensorInfo) -> None:
        bar.update(info.nbytes)

    commit = CheckpointCommit(dst, is_dir=target.is_dir)
    try:
        with bar, commit as staging:
            if target is SAFETENSORS:
                commit.record(
                    export_safetensors(
                        reader, staging, dtype=cast_to, metadata=metadata, on_tensor=on_tensor
                    )
                )
            else:
                state = _load_state(reader, tree, dtype=cast_to, on_tensor=on_tensor)
                state["meta"] = _converted_meta(
                    reader,
                    state.get("meta"),
                    dtype=None if cast_to is None else str(cast_to).removeprefix("torch."),
                    model_only=model_only,
                )
                state["meta"]["format"] = target.name
                commit.record(*_write(state, staging, target))  # hashed: not read again
                del state
    except CheckpointError as exc:
        if isinstance(exc.__context__, Exception):  # the staging files are gone: say why
            raise exc.__context__ from None
        raise
    logger.info(
        "Converted %s (%s) to %s (%s) in %.2f s",
        src,
        reader.format,
        dst,
        to,
        time.perf_counter() - start,
    )
    return dst
