"""Pipeline stages and checkpoints: one sharded checkpoint of the unsplit model's names,
written by every stage, and a stage's own part of any checkpoint.

- :class:`PipelineShardedFormat` writes it: every rank its stage's tensors through DCP, rank 0
  the skeleton (``meta.pt``) of every stage merged (:func:`merge_stage_states`);
- :class:`StagePart` loads a stage's part of a checkpoint written by stages, or by a run
  without them (FSDP, DDP, one device), or by another pipeline degree.

Optimizers keep one set of parameter groups per stage, which a run without stages (or with
others) groups otherwise: the merged checkpoint holds every stage's groups (a group split over
stages, as one group of the whole model, is one group per stage, with the same settings), and
each scheduler's per-group values in the same order. A resume lays the saved groups out as its
optimizer groups its parameters (:func:`~.matching.regroup_optimizer_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as torch_dist

from shardwise.checkpoint.checkpointer import OPTIMIZER, SCHEDULERS
from shardwise.checkpoint.formats import SHARDED
from shardwise.checkpoint.full import save_full_checkpoint
from shardwise.checkpoint.sharded import META_FILE, _split
from shardwise.tree import leaves as pytree_leaves
from shardwise.tree import map_tensors

from .matching import PER_GROUP_KEYS

__all__ = ["PipelineShardedFormat", "StagePart", "merge_stage_states"]

_TENSOR_SECTIONS = ("state_dict", OPTIMIZER)


class PipelineShardedFormat(type(SHARDED)):  # type: ignore[misc]
    """The sharded format written and read by pipeline stages: one checkpoint of the unsplit
    model's names, as a run without stages writes it.

    Every rank writes its stage's tensors through DCP as usual; the skeleton (``meta.pt``,
    which names every tensor) is every rank's skeleton merged by rank 0
    (:func:`merge_stage_states`), so that the checkpoint loads without stages, on one device,
    or under another pipeline degree (where :class:`StagePart` takes each stage's part of it).
    """

    def write(self, state, staging, *, rank, group=None, plan=None):  # type: ignore[override]
        written = super().write(state, staging, rank=rank, group=group, plan=plan)
        parts = {k: _split(k, state[k], {}) for k in _TENSOR_SECTIONS if k in state}
        if SCHEDULERS in state:
            parts[SCHEDULERS] = state[SCHEDULERS]
        size = torch_dist.get_world_size(group)
        gathered: list[Any] = [None] * size if rank == 0 else []
        torch_dist.gather_object(parts, gathered or None, group=group, group_dst=0)
        if rank != 0:
            return written
        skeleton = {**state, **merge_stage_states(gathered)}
        meta = staging / META_FILE
        kept = [w for w in written if getattr(w, "path", w) != meta]
        return [*kept, save_full_checkpoint(skeleton, meta)]


def merge_stage_states(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every rank's model and optimizer skeletons and scheduler states (``parts``, in rank
    order) as one checkpoint's: the weights' names of every stage; each optimizer's state of
    every stage, the parameter groups of every stage (ranks of one stage hold the same groups:
    once), each scheduler's per-group values in that order."""
    merged: dict[str, Any] = {}
    if "state_dict" in parts[0]:
        merged["state_dict"] = _union([p["state_dict"] for p in parts])
    if OPTIMIZER not in parts[0]:
        return merged
    optimizers = [p[OPTIMIZER] for p in parts]
    schedulers = [p.get(SCHEDULERS) for p in parts]
    if "param_groups" in optimizers[0]:  # one optimizer
        merged[OPTIMIZER], orders = _merge_optimizer(optimizers)
        if schedulers[0] is not None:
            merged[SCHEDULERS] = _merge_schedulers(schedulers, orders)
        return merged
    merged[OPTIMIZER] = {}
    merged_schedulers = dict(schedulers[0]) if isinstance(schedulers[0], Mapping) else None
    for name, first in optimizers[0].items():
        if not (isinstance(first, Mapping) and "param_groups" in first):
            merged[OPTIMIZER][name] = first
            continue
        merged[OPTIMIZER][name], orders = _merge_optimizer([o[name] for o in optimizers])
        if merged_schedulers is not None and name in merged_schedulers:
            merged_schedulers[name] = _merge_schedulers([s[name] for s in schedulers], orders)
    if merged_schedulers is not None:
        merged[SCHEDULERS] = merged_schedulers
    return merged


def _union(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    return merged


def _merge_optimizer(
    parts: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """One optimizer's merged skeleton, and where each merged group came from: ``(rank, index
    of the group on that rank)``."""
    groups, order, seen = [], [], set()
    for rank, part in enumerate(parts):
        for index, group in enumerate(part["param_groups"]):
            names = tuple(map(str, group["params"]))
            if names in seen:  # another rank of the same stage
                continue
            seen.add(names)
            groups.append(group)
            order.append((rank, index))
    merged = {**parts[0], "state": _union([p.get("state", {}) for p in parts])}
    merged["param_groups"] = groups
    return merged, order


def _merge_schedulers(parts: Sequence[Any], order: Sequence[tuple[int, int]]) -> Any:
    """The schedulers' states of rank 0, each per-group list laid out as the merged groups."""
    if not all(isinstance(p, list) and len(p) == len(parts[0]) for p in parts):
        return parts[0]
    merged = []
    for j, state in enumerate(parts[0]):
        if not isinstance(state, Mapping):
            merged.append(state)
            continue
        state = dict(state)
        for key in PER_GROUP_KEYS:
            if isinstance(state.get(key), list | tuple):
                state[key] = [parts[rank][j][key][index] for rank, index in order]
        merged.append(state)
    return merged


def _own_optimizer(optim: Mapping[str, Any], own: set[str]) -> Any:
    if "param_groups" not in optim:  # several optimizers, by name
        return {
            k: _own_optimizer(v, own) if isinstance(v, Mapping) else v for k, v in optim.items()
        }
    result = dict(optim)
    state = optim.get("state")
    if isinstance(state, Mapping):
        result["state"] = {k: v for k, v in state.items() if not isinstance(k, str) or k in own}
    result["param_groups"] = [
        {**g, "params": [p for p in g["params"] if not isinstance(p, str) or p in own]}
        for g in optim["param_groups"]
    ]
    return result


def _from_rank0(state: Any, device: torch.device) -> Any:
    """``state`` with rank 0's tensors on every rank when some rank holds placeholders (a full
    checkpoint is read by rank 0 only; the others get meta tensors of its shapes): every
    stage needs its own part of it. Unchanged otherwise. A collective of the world group."""
    placeholders = any(isinstance(t, torch.Tensor) and t.is_meta for t in pytree_leaves(state))
    flag = torch.tensor([int(placeholders)], device=device)
    torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MAX)
    if not flag.item():
        return state

    def send(tensor: torch.Tensor) -> torch.Tensor:
        out = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
        if torch_dist.get_rank() == 0:
            out.copy_(tensor)
        torch_dist.broadcast(out, src=0)
        return out.cpu()

    return map_tensors(send, state)


class StagePart:
    """A registered checkpoint state (the model's or the optimizers') of a pipeline stage:
    what it saves is its own, and of a checkpoint of the whole model it fits and loads the
    entries that name this rank's parameters (``own_names()``), dropping the other stages'
    (an optimizer's groups keep their place: the groups of other stages are left empty, and
    the resume regroups them). A full checkpoint (read by rank 0 alone) is first sent to every
    rank (on ``device``).

    Every other call goes to ``state``."""

    def __init__(
        self,
        key: str,
        state: Any,
        own_names: Callable[[], set[str]],
        device: torch.device | str = "cpu",
    ) -> None:
        self._key, self._state, self._own_names = key, state, own_names
        self._device = torch.device(device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)

    def _own(self, saved: Any) -> Any:
        own = self._own_names()
        own |= {f"module.{name}" for name in own}
        if self._key == OPTIMIZER and isinstance(saved, Mapping):
            return _own_optimizer(saved, own)
        if isinstance(saved, Mapping):
            return {k: v for k, v in saved.items() if not isinstance(k, str) or k in own}
        return saved

    def state_dict(self) -> Any:
        return self._state.state_dict()

    def load_state_dict(self, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        state_dict = _from_rank0(state_dict, self._device)
        return self._state.load_state_dict(self._own(state_dict), *args, **kwargs)

    def fit_state_dict(self, saved: Any) -> tuple[Any, list[str]]:
        return self._state.fit_state_dict(self._own(_from_rank0(saved, self._device)))
