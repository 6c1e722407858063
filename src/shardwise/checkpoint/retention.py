"""Retention: keep only the newest ``max_keep_ckpts`` checkpoints of a series.

A series is a name for checkpoints that replace each other: the periodic ones, the best one
by some metric. The strategy plans each save that has a limit before writing it: the save
joins the end of its series' list of kept checkpoints (moving there if its name was saved
before), and what falls off the front is retired. Rank 0 deletes the retired checkpoints inside
the commit protocol, after the new checkpoint is renamed into place and ``last_checkpoint``
points at it (:class:`~shardwise.checkpoint.commit.CheckpointCommit`'s ``retire``), so:

- the newest committed checkpoint is never deleted (it is at the end of the list);
- a checkpoint still being written is never deleted (one save is in flight at a time, and it
  is the one doing the deleting, once committed);
- a save that fails deletes nothing, and the list stays as it was;
- a save deletes nothing outside the directory it writes to (a run resumed from another
  run's checkpoint leaves that run's checkpoints alone).

The lists are stored in each checkpoint's ``meta['kept_checkpoints']`` (``{series: [path,
...]}``), so a run resumed from one of them goes on retiring the checkpoints saved before the
interruption.

Example::

    retention = Retention()
    kept, retire = retention.plan('work_dirs/iter_3000.pth', max_keep=2)  # before the save
    ...                      # commit with retire=retire; then, on success or failure:
    retention.settle(committed=True)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .storage import absolute

__all__ = ["Retention", "check_max_keep_ckpts"]


def check_max_keep_ckpts(value: Any) -> int:
    """``value`` if it is a valid ``max_keep_ckpts`` (-1 keeps all, N > 0 the newest N)."""
    if isinstance(value, bool) or not isinstance(value, int) or not (value == -1 or value > 0):
        raise ValueError(
            f"max_keep_ckpts must be -1 (keep every checkpoint) or a positive number of "
            f"checkpoints to keep, got {value!r}"
        )
    return value


class Retention:
    """The checkpoints saved under a ``max_keep_ckpts`` limit, by series, oldest first (see
    the module docstring)."""

    def __init__(self) -> None:
        self.kept: dict[str, list[str]] = {}
        self._planned: dict[str, list[str]] | None = None

    def plan(
        self, path: str | os.PathLike[str], max_keep: int, series: str = "periodic"
    ) -> tuple[dict[str, list[str]], list[str]]:
        """Plan the save of ``path`` into ``series`` under a limit of ``max_keep``: returns
        every series' kept checkpoints once it is committed, and the checkpoints it retires."""
        path = absolute(path)
        # a save retires only checkpoints in the directory it writes to: those of another
        # run (one this run resumed from) are forgotten, never deleted
        here = os.path.dirname(path)
        kept = [p for p in self.kept.get(series, []) if p != path and os.path.dirname(p) == here]
        kept.append(path)
        self._planned = {**self.kept, series: kept[-max_keep:]}
        return self._planned, kept[:-max_keep]

    def settle(self, committed: bool) -> None:
        """The planned save was committed (its lists become the kept ones) or failed."""
        if committed and self._planned is not None:
            self.kept = self._planned
        self._planned = None

    def restore(self, kept: Mapping[str, Sequence[str]] | None, loaded: Any) -> None:
        """After resuming from ``loaded``, take over the lists it recorded (only if it recorded
        itself: a checkpoint copied elsewhere does not retire its old neighbours)."""
        if not isinstance(kept, Mapping):
            return
        lists = {str(k): list(v) for k, v in kept.items()}
        if any(absolute(loaded) in paths for paths in lists.values()):
            self.kept = lists
