"""How the ranks agree on the outcome of a step of a save or a load: one collective carries
every rank's error (one line, :func:`~.files.describe_error`), and every rank raises when any
rank failed (the rank that failed its own exception, the others a :class:`CheckpointError`
naming every rank that failed), so no rank goes on alone into a collective the others left.

Without a process group the step runs alone and nothing is exchanged.

Example::

    meta = on_rank0(lambda: read_meta(path))                 # read once, shared
    shards = on_every_rank(lambda: read_mine(path), f"reading {path}")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch.distributed as dist

from .files import CheckpointError, describe_error

__all__ = ["gather_outcomes", "on_every_rank", "on_rank0", "raise_if_any"]

T = TypeVar("T")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def gather_outcomes(obj: Any, group: dist.ProcessGroup | None, what: str) -> list[Any]:
    """Every rank's ``obj``; a rank that cannot reach the others (one crashed or was killed:
    gloo fails on the closed connection, or at the collective timeout) gets CheckpointError."""
    if not _distributed():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size(group)
    try:
        dist.all_gather_object(gathered, obj, group=group)
    except Exception as exc:  # noqa: BLE001 - gloo/NCCL raise RuntimeError & co.
        raise CheckpointError(
            f"{what}: this rank could not reach the others to agree on the outcome (a rank "
            f"crashed, was killed, or the collective timed out): {describe_error(exc)}"
        ) from exc
    return gathered


def raise_if_any(
    errors: Sequence[str | None], what: str, cause: BaseException | None = None
) -> None:
    """Raise :class:`CheckpointError` naming every rank that failed, one line each (the
    rank's own exception, ``cause``, chained where this rank is one of them)."""
    failed = [(rank, err) for rank, err in enumerate(errors) if err is not None]
    if not failed:
        return
    if len(failed) == 1:
        message = f"{what} failed on rank {failed[0][0]}: {failed[0][1]}"
    else:
        message = f"{what} failed on {len(failed)} ranks:\n" + "\n".join(
            f"  rank {rank}: {err}" for rank, err in failed
        )
    raise CheckpointError(message) from cause


def on_every_rank(
    fn: Callable[[], T], what: str = "reading the checkpoint", group: Any = None
) -> T:
    """``fn()`` on every rank; if it fails anywhere, it fails everywhere (the failed rank
    raises its own exception, the others :class:`CheckpointError`). A collective."""
    result: Any = None
    error: BaseException | None = None
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
        error = exc
    errors = gather_outcomes(None if error is None else describe_error(error), group, what)
    if error is not None:
        raise error
    raise_if_any(errors, what)
    return result


def on_rank0(fn: Callable[[], T], group: Any = None) -> T:
    """``fn()`` on rank 0, its result (or its exception) on every rank. A collective."""
    if not _distributed():
        return fn()
    result: Any = None
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
            error = exc
    holder = [(error, result)]
    dist.broadcast_object_list(holder, src=0, group=group)
    error, result = holder[0]
    if error is not None:
        raise error
    return result
