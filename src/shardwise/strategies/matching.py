"""Does a checkpoint fit the model, optimizers and schedulers it is about to be loaded into?

Checked before anything is loaded, so that a load is whole or not at all:

- :func:`state_dict_diff` compares a model state dict with the model (missing and unexpected
  keys, shape mismatches); ``load_checkpoint`` skips what does not fit (or, strict, refuses);
- :func:`model_mismatches`, :func:`optimizer_mismatches` and :func:`scheduler_mismatches`
  list what keeps a resume from continuing the run: a parameter missing, unexpected or of
  another shape, an optimizer whose parameter groups hold other parameters, a different number
  of schedulers. A resume refuses the checkpoint when any list is not empty (the state objects
  of :mod:`.states` report them); optimizer moments are never attached to parameters of
  another shape.

Shapes are global shapes, so the checks agree on every rank whatever the sharding (a DTensor,
a placeholder on the meta device and a full tensor of one parameter have the same shape).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from shardwise.checkpoint.checkpointer import revise_state_dict_keys
from shardwise.checkpoint.mmengine_compat import optimizer_state_by_name

from .parallelize import clean_name

__all__ = [
    "PER_GROUP_KEYS",
    "StateDictDiff",
    "model_mismatches",
    "optimizer_mismatches",
    "optimizer_states_by_name",
    "regroup_optimizer_state",
    "regroup_scheduler_states",
    "scheduler_mismatches",
    "revise_state_dict_keys",
    "state_dict_diff",
    "unwrap_model",
]

_SHOWN = 8  # names listed per kind of mismatch


@dataclass
class StateDictDiff:
    """How a state dict differs from a model's: key lists, and ``(key, checkpoint shape,
    model shape)`` for the keys of both whose shapes differ."""

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shapes: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.shapes)


def state_dict_diff(state_dict: Mapping[str, Any], model: nn.Module) -> StateDictDiff:
    """Compare ``state_dict`` (already key-revised) with ``model.state_dict()``."""
    expected = {
        k: tuple(v.shape) for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)
    }
    return StateDictDiff(
        missing=sorted(set(expected) - set(state_dict)),
        unexpected=sorted(set(state_dict) - set(expected)),
        shapes=[
            (k, tuple(v.shape), expected[k])
            for k, v in sorted(state_dict.items())
            if k in expected and isinstance(v, torch.Tensor) and tuple(v.shape) != expected[k]
        ],
    )


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP-style wrapper (``.module``), or the model itself."""
    return model.module if isinstance(getattr(model, "module", None), nn.Module) else model


def _listed(names: Sequence[Any]) -> str:
    shown = ", ".join(map(str, names[:_SHOWN]))
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def model_mismatches(state_dict: Mapping[str, Any], model: nn.Module) -> list[str]:
    """What keeps ``state_dict`` (keys revised) from resuming ``model``; empty when it fits."""
    diff = state_dict_diff(state_dict, model)
    params = {clean_name(n) for n, _ in model.named_parameters()}
    problems = []
    missing = [k for k in diff.missing if k in params]  # a missing buffer only warns
    if missing:
        problems.append(f"model parameters the checkpoint lacks: {_listed(missing)}")
    if diff.unexpected:
        problems.append(f"checkpoint entries the model lacks: {_listed(diff.unexpected)}")
    if diff.shapes:
        shapes = [f"{k} {tuple(saved)} vs {tuple(here)}" for k, saved, here in diff.shapes]
        problems.append(f"shapes (checkpoint vs model): {_listed(shapes)}")
    return problems


def optimizer_states_by_name(
    saved: Mapping[str, Any],
    optimizers: Mapping[str, torch.optim.Optimizer],
    model: nn.Module,
    mappings: dict[str, list[int]] | None = None,
) -> dict[str, Any]:
    """The saved optimizer state of each of ``optimizers`` (``{'': optimizer}`` for a single
    one, whose state is ``saved`` itself), keyed by parameter name where the checkpoint
    numbers them (mmengine's; see :func:`optimizer_state_by_name`), its parameter groups
    regrouped as the optimizer groups its parameters (:func:`regroup_optimizer_state`; each
    regrouping's saved-group indices go into ``mappings``, by optimizer name). A state that
    does not fit its optimizer is left as it is, for :func:`optimizer_mismatches` to report."""
    states = {"": saved} if "" in optimizers else dict(saved)
    names = {id(p): clean_name(n) for n, p in model.named_parameters()}
    for key, optimizer in optimizers.items():
        if key in states:
            try:
                states[key] = optimizer_state_by_name(states[key], optimizer, model)
                states[key], mapping = regroup_optimizer_state(states[key], optimizer, names)
            except ValueError:
                continue
            if mapping is not None and mappings is not None:
                mappings[key] = mapping
    return states


#: A scheduler's lists with one entry per parameter group of its optimizer (shardwise's and
#: mmengine's schedulers; torch's own), which follow a regrouping of the optimizer's groups.
PER_GROUP_KEYS = ("base_values", "_last_value", "_eta_maxes", "base_lrs", "_last_lr")


def _settings(group: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


def _differing(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The settings (everything but ``params``) in which two parameter groups differ."""
    a, b = _settings(a), _settings(b)
    missing = object()

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            return torch.equal(x, y)
        return not isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor) and x == y

    return sorted(k for k in a.keys() | b.keys() if not same(a.get(k, missing), b.get(k, missing)))


def regroup_optimizer_state(
    state: Mapping[str, Any], optimizer: torch.optim.Optimizer, names: Mapping[int, str]
) -> tuple[dict[str, Any], list[int] | None]:
    """``state`` (keyed by parameter name) with its parameter groups laid out as
    ``optimizer``'s, and for each of them the index of the saved group its settings come from
    (None: the groups line up already, nothing changed).

    The same parameters may be grouped otherwise in the checkpoint than here: a pipeline stage
    holds its own parameters of each group, a checkpoint written by pipeline stages holds one
    group per stage and group, a run with ``paramwise_cfg`` one group per parameter. Every
    parameter keeps the settings it was saved with (learning rate, betas, ``initial_lr`` ...);
    a group here may gather parameters of several saved groups when they were saved with the
    same settings. ``names``: parameter id to name.

    Raises:
        ValueError: a parameter here is in no saved group, a saved one is in no group here, or
            a group here gathers parameters saved with different settings.
    """
    saved_groups = state["param_groups"]
    here = [[names.get(id(p), "?") for p in g["params"]] for g in optimizer.param_groups]
    if len(saved_groups) == len(here) and all(
        set(map(str, saved["params"])) == set(group) for saved, group in zip(saved_groups, here)
    ):
        return dict(state), None
    where: dict[str, int] = {}
    for index, saved in enumerate(saved_groups):
        for name in map(str, saved["params"]):
            where.setdefault(name, index)
    missing = [name for group in here for name in group if name not in where]
    extra = sorted(set(where) - {name for group in here for name in group})
    if missing or extra:
        raise ValueError(
            f"parameters only here: {_listed(missing) or '-'}; only in the checkpoint: "
            f"{_listed(extra) or '-'}"
        )
    groups, mapping = [], []
    for i, group in enumerate(here):
        sources = sorted({where[name] for name in group})
        first = sources[0] if sources else 0
        for other in sources[1:]:
            differ = _differing(saved_groups[first], saved_groups[other])
            if differ:
                raise ValueError(
                    f"group {i} here holds parameters saved in groups {first} and {other}, "
                    f"whose settings differ ({', '.join(differ)})"
                )
        groups.append({**_settings(saved_groups[first]), "params": list(group)})
        mapping.append(first)
    return {**state, "param_groups": groups}, mapping


def regroup_scheduler_states(states: Sequence[Any], mapping: Sequence[int]) -> list[Any]:
    """Scheduler states whose per-group lists (:data:`PER_GROUP_KEYS`) follow the optimizer's
    regrouping (``mapping``: for each group, the saved group it came from)."""
    regrouped = []
    for state in states:
        if isinstance(state, Mapping):
            state = dict(state)
            for key in PER_GROUP_KEYS:
                values = state.get(key)
                if isinstance(values, list | tuple) and len(values) > max(mapping, default=-1):
                    state[key] = [values[i] for i in mapping]
        regrouped.append(state)
    return regrouped


def optimizer_mismatches(
    states: Mapping[str, Any], optimizers: Mapping[str, torch.optim.Optimizer], model: nn.Module
) -> list[str]:
    """What keeps ``states`` (as :func:`optimizer_states_by_name` returns them) from resuming
    ``optimizers``; empty when they fit."""
    names = {id(p): clean_name(n) for n, p in model.named_parameters()}
    problems = []
    for key, optimizer in optimizers.items():
        label = f"optimizer {key!r}" if key else "optimizer"
        if key not in states:
            problems.append(f"{label}: the checkpoint holds no state for it")
            continue
        saved_groups = states[key]["param_groups"]
        if len(saved_groups) != len(optimizer.param_groups):
            try:
                regroup_optimizer_state(states[key], optimizer, names)
                why = ""
            except ValueError as exc:
                why = f", and they cannot be regrouped: {exc}"
            problems.append(
                f"{label}: {len(saved_groups)} parameter group(s) in the checkpoint, "
                f"{len(optimizer.param_groups)} here{why}"
            )
            continue
        for i, (saved, here) in enumerate(zip(saved_groups, optimizer.param_groups)):
            saved_names = set(map(str, saved["params"]))
            here_names = {names.get(id(p), "?") for p in here["params"]}
            if saved_names != here_names:
                problems.append(
                    f"{label} group {i}: parameters only in the checkpoint: "
                    f"{_listed(sorted(saved_names - here_names)) or '-'}; only here: "
                    f"{_listed(sorted(here_names - saved_names)) or '-'}"
                )
    return problems


def scheduler_mismatches(schedulers: Any, states: Any) -> list[str]:
    """What keeps the saved ``states`` from resuming ``schedulers``; empty when they fit."""
    if isinstance(schedulers, Mapping):
        if not isinstance(states, Mapping):
            return ["parameter schedulers: one list per optimizer here, a single list saved"]
        problems = []
        for name, scheduler_list in schedulers.items():
            if name not in states:
                problems.append(f"parameter schedulers of {name!r}: none in the checkpoint")
            else:
                problems += scheduler_mismatches(scheduler_list, states[name])
        return problems
    if not isinstance(states, Sequence) or len(states) != len(schedulers):
        saved = len(states) if isinstance(states, Sequence) else "not a list of"
        return [f"parameter schedulers: {saved} in the checkpoint, {len(schedulers)} configured"]
    return []
