"""Model, optimizer and scheduler state in and out of a (wrapped, maybe sharded) model,
through torch's ``torch.distributed.checkpoint.state_dict`` helpers.

A strategy says only *how*: the ``StateDictOptions`` its state is taken with (full tensors on
the CPU, or DTensor shards) and loaded with (shard to shard, or full tensors broadcast from
rank 0); these functions do the rest, the same for every strategy. Optimizer state is keyed by
parameter name, with the wrapper's own state (a loss scaler) beside it. :func:`saved_layout`
describes the mesh and placements a checkpoint is saved from, for its ``meta``.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from shardwise.optim import OptimWrapper
from shardwise.optim.parts import SINGLE
from shardwise.optim.scheduler import _ParamScheduler

from .matching import revise_state_dict_keys, state_dict_diff, unwrap_model
from .parallelize import clean_name

#: Modules whose state-dict keys differ from their parameters' clean names, or that shard
#: them (FSDP1): their state goes through torch's helpers.
_WRAPPERS: tuple[type, ...] = (torch._dynamo.eval_frame.OptimizedModule,)
try:
    from torch.distributed.fsdp import FullyShardedDataParallel

    _WRAPPERS += (FullyShardedDataParallel,)
except ImportError:  # pragma: no cover - torch built without distributed
    pass

__all__ = [
    "fitting_model_state",
    "get_optim_state",
    "holds_tensor_state",
    "load_model_state",
    "load_optim_state",
    "load_optim_states",
    "load_scheduler_states",
    "load_schedulers",
    "map_schedulers",
    "model_state",
    "saved_layout",
]


def model_state(model: nn.Module, options: StateDictOptions) -> dict[str, Any]:
    """The model's state dict, keyed as the plain module's keys.

    torch's helper checks the model's structure on every call (~4 ms of Python for the 25M
    GPT of bench/, paid by a memory snapshot every step). Where, with options that take the
    state as it is (:func:`_as_it_is`), it returned the model's own ``state_dict()`` (the same
    keys, the same tensors: FSDP2, TP, a plain module), the next calls take ``state_dict()``
    while its keys are those."""
    if _as_it_is(options):
        known = _SAME_KEYS.get(model)
        if known is not None:
            state = model.state_dict()
            if tuple(state) == known:
                return state
    state = get_model_state_dict(model, options=options)
    if _as_it_is(options):
        own = model.state_dict()
        if list(own) == list(state) and all(_same(own[k], v) for k, v in state.items()):
            _SAME_KEYS[model] = tuple(own)
        else:
            _SAME_KEYS.pop(model, None)
    return state


#: model -> the keys of its ``state_dict()`` when torch's helper returned it as it is
_SAME_KEYS: weakref.WeakKeyDictionary[nn.Module, tuple[str, ...]] = weakref.WeakKeyDictionary()
#: optimizer -> (its parameters' ids, the model's id, each parameter index's name) when
#: torch's helper returned its ``state_dict()`` only renamed
_NAMES: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[tuple[int, ...], int, dict]] = (
    weakref.WeakKeyDictionary()
)


def _as_it_is(options: StateDictOptions) -> bool:
    """Options under which torch's helpers only rename what ``state_dict()`` returns (no
    gather, offload, broadcast or filter)."""
    return not (
        options.full_state_dict
        or options.cpu_offload
        or options.ignore_frozen_params
        or options.broadcast_from_rank0
        or options.flatten_optimizer_state_dict
    )


def _same(a: Any, b: Any) -> bool:
    """Whether two state entries are one tensor's views (a DTensor's: of its shard)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return a is b
    if type(a) is not type(b) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = (t._local_tensor if isinstance(t, DTensor) else t for t in (a, b))
    return a.device == b.device and (a.numel() == 0 or a.data_ptr() == b.data_ptr())


def _dim_names(mesh: DeviceMesh) -> list[str]:
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    return [str(name) for name in names]


def saved_layout(strategy: Any) -> dict[str, Any]:
    """The layout a checkpoint is saved from, for its ``meta`` (plain strings, lists and
    dicts; no collective): ``mesh`` (dimension name -> size) when the strategy has a
    ``DeviceMesh``, and ``placements`` of every DTensor parameter of its prepared model, by
    state-dict key: ``dict(mesh=[dimension names], placements=['Shard(dim=0)', ...])``
    (``repr``: ``str`` is torch's short form, ``S(0)``)."""
    layout: dict[str, Any] = {}
    mesh = getattr(strategy, "mesh", None)
    if isinstance(mesh, DeviceMesh):
        layout["mesh"] = dict(zip(_dim_names(mesh), (int(n) for n in mesh.shape), strict=True))
    model = getattr(strategy, "model", None)
    if not getattr(strategy, "_prepared", False) or not isinstance(model, nn.Module):
        return layout
    placements = {
        clean_name(name): dict(
            mesh=_dim_names(param.device_mesh), placements=[repr(p) for p in param.placements]
        )
        for name, param in unwrap_model(model).named_parameters(remove_duplicate=False)
        if isinstance(param, DTensor)
    }
    if placements:
        layout["placements"] = placements
    return layout


def fitting_model_state(
    state_dict: Mapping[str, Any],
    model: nn.Module,
    strict: bool,
    revise_keys: Sequence[tuple[str, str]],
    logger: Any,
) -> dict[str, Any]:
    """The entries of ``state_dict`` (keys revised) that fit ``model``; with ``strict`` any
    missing or unexpected key or shape mismatch is an error naming them, else they are
    skipped with a warning."""
    state_dict = revise_state_dict_keys(state_dict, revise_keys)
    diff = state_dict_diff(state_dict, model)
    if strict and diff:
        raise RuntimeError(
            "strict load: the checkpoint does not match the model.\n"
            f"  missing keys: {diff.missing}\n  unexpected keys: {diff.unexpected}\n"
            f"  shape mismatches (checkpoint, model): {diff.shapes}\n"
            "Pass strict=False to load what matches, or revise_keys=[(pattern, repl)] to "
            "rename keys."
        )
    if diff:
        logger.warning(
            "loading a state dict that does not match the model: missing keys %s, "
            "unexpected keys %s, shape mismatches (skipped) %s",
            diff.missing,
            diff.unexpected,
            [k for k, _, _ in diff.shapes],
        )
    skipped = set(diff.unexpected) | {k for k, _, _ in diff.shapes}
    usable = {k: v for k, v in state_dict.items() if k not in skipped}
    return usable


def load_model_state(model: nn.Module, state: dict[str, Any], options: StateDictOptions) -> None:
    """Put checked, matching entries into the model.

    A model of plain tensors (no DTensor, nothing on the meta device, no compiled or FSDP1
    submodule inside its DDP-style wrapper) takes them with its own ``load_state_dict``: what
    torch's ``set_model_state_dict`` ends up calling there, without the per-key name mapping
    and device checks it spends ~6 ms of Python on for a 25M-parameter GPT."""
    inner = _plain_module(model, options)
    if inner is not None and not any(isinstance(v, DTensor) for v in state.values()):
        inner.load_state_dict(state, strict=False)
        return
    set_model_state_dict(model, state, options=dataclasses.replace(options, strict=False))


def _plain_module(model: nn.Module, options: StateDictOptions) -> nn.Module | None:
    """The user's module inside ``model``'s DDP-style wrapper when its state loads with
    plain ``load_state_dict`` under the keys :func:`model_state` gives (see
    :func:`load_model_state`); None when torch's helpers must map names or place tensors."""
    if options.broadcast_from_rank0:
        return None
    inner = unwrap_model(model)
    for module in inner.modules():
        if isinstance(module, _WRAPPERS):
            return None
    for tensor in (*inner.parameters(), *inner.buffers()):
        if isinstance(tensor, DTensor) or tensor.is_meta:
            return None
    return inner


def get_optim_state(
    model: nn.Module, wrapper: OptimWrapper, options: StateDictOptions
) -> dict[str, Any]:
    """One wrapper's optimizer state keyed by parameter name, with the wrapper's own state.

    torch's helper creates missing state with a zero-gradient step (Adam's step count becomes
    1); an optimizer that has not stepped yet stays as it was."""
    fresh = not wrapper.optimizer.state
    state = _optimizer_state(model, wrapper.optimizer, options)
    if fresh:
        wrapper.optimizer.state.clear()
        state = {**state, "state": {}}
    extras = {k: v for k, v in wrapper.state_dict().items() if k not in ("state", "param_groups")}
    return {**state, **extras}


def _optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, options: StateDictOptions
) -> dict[str, Any]:
    """torch's ``get_optimizer_state_dict``; where it returned the optimizer's own
    ``state_dict()`` with each parameter index replaced by its name (see :func:`model_state`),
    the next calls with the same parameters in the groups rename ``state_dict()`` as it did."""
    params = tuple(id(p) for group in optimizer.param_groups for p in group["params"])
    if _as_it_is(options) and optimizer.state:
        known = _NAMES.get(optimizer)
        renamed = None
        if known is not None and known[:2] == (params, id(model)):
            renamed = _renamed(optimizer.state_dict(), known[2])
        if renamed is not None:
            return renamed
    state = get_optimizer_state_dict(model, optimizer, options=options)
    _NAMES.pop(optimizer, None)
    if _as_it_is(options) and optimizer.state:
        own = optimizer.state_dict()
        names = {
            index: name
            for ours, theirs in zip(own["param_groups"], state["param_groups"], strict=False)
            for index, name in zip(ours["params"], theirs["params"], strict=False)
        }
        renamed = _renamed(own, names) if len(names) == len(params) else None
        if renamed is not None and _same_optimizer_state(renamed, state):
            _NAMES[optimizer] = (params, id(model), names)
    return state


def _renamed(own: Mapping[str, Any], names: Mapping[int, str]) -> dict[str, Any] | None:
    """An optimizer's ``state_dict()`` keyed by parameter name (None: an index unnamed)."""
    try:
        return {
            "state": {names[index]: value for index, value in own["state"].items()},
            "param_groups": [
                {**group, "params": [names[i] for i in group["params"]]}
                for group in own["param_groups"]
            ],
        }
    except KeyError:
        return None


def _same_optimizer_state(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> bool:
    """Whether two optimizer state dicts hold the same entries, the same tensors."""
    try:
        if set(ours) != set(theirs) or ours["param_groups"] != theirs["param_groups"]:
            return False
    except RuntimeError:  # a tensor hyperparameter of several elements
        return False
    state, other = ours["state"], theirs["state"]
    if list(state) != list(other):
        return False
    for name, entry in state.items():
        if list(entry) != list(other[name]):
            return False
        if not all(_same(v, other[name][k]) for k, v in entry.items()):
            return False
    return True


def load_optim_state(
    model: nn.Module, wrapper: OptimWrapper, state: Mapping[str, Any], options: StateDictOptions
) -> None:
    """Load what :func:`get_optim_state` returned into ``wrapper``."""
    optim_state = {"state": state["state"], "param_groups": state["param_groups"]}
    if options.full_state_dict and not holds_tensor_state(optim_state):
        # torch's full-state-dict load needs a tensor (it fails on SGD without momentum); a
        # state of param_groups alone loads the same as a sharded one
        options = dataclasses.replace(options, full_state_dict=False, broadcast_from_rank0=False)
    by_index = _by_index(model, wrapper.optimizer, optim_state, options)
    if by_index is not None:
        wrapper.optimizer.load_state_dict(by_index)
    elif optim_state["state"] or not _load_hyperparameters(wrapper.optimizer, optim_state):
        set_optimizer_state_dict(model, wrapper.optimizer, optim_state, options=options)
    if not optim_state["state"]:  # saved before the first step: no state to create
        wrapper.optimizer.state.clear()
    extras = {k: v for k, v in state.items() if k not in ("state", "param_groups")}
    if extras:
        wrapper.load_state_dict({**wrapper.optimizer.state_dict(), **extras})


def _load_hyperparameters(optimizer: torch.optim.Optimizer, optim_state: Mapping[str, Any]) -> bool:
    """Load a state without per-parameter entries: the groups' hyperparameters, group by
    group (the resume checked that the groups hold the same parameters). torch's helper would
    first create the state it expects with a zero-gradient step, a ``zeros_like`` of every
    parameter (1.7-5.4 s for a 1B model's SGD). False when the groups do not line up."""
    saved_groups = optim_state["param_groups"]
    if len(saved_groups) != len(optimizer.param_groups) or any(
        len(saved["params"]) != len(here["params"])
        for saved, here in zip(saved_groups, optimizer.param_groups)
    ):
        return False
    for saved, here in zip(saved_groups, optimizer.param_groups):
        here.update({k: v for k, v in saved.items() if k != "params"})
    return True


def _by_index(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    optim_state: Mapping[str, Any],
    options: StateDictOptions,
) -> dict[str, Any] | None:
    """``optim_state`` (keyed by parameter name) as ``optimizer.load_state_dict`` takes it,
    when the model is plain (:func:`_plain_module`) and the saved groups name exactly the
    optimizer's parameters, group by group: each group's parameters in the optimizer's order,
    its hyperparameters and every parameter's state from the checkpoint. This is what torch's
    ``set_optimizer_state_dict`` loads there, without its flattening and re-mapping of every
    value (~7 ms of Python for the 25M GPT's AdamW). None: torch's helper does it."""
    inner = _plain_module(model, options)
    saved_groups = optim_state["param_groups"]
    if inner is None or len(saved_groups) != len(optimizer.param_groups):
        return None
    names = {id(p): clean_name(n) for n, p in inner.named_parameters(remove_duplicate=False)}
    saved_state = optim_state["state"]
    groups, state = [], {}
    for saved, here in zip(saved_groups, optimizer.param_groups):
        params = [names.get(id(p)) for p in here["params"]]
        if None in params or set(params) != set(map(str, saved["params"])):
            return None
        groups.append({**saved, "params": params})
        state.update((n, saved_state[n]) for n in params if n in saved_state)
    if len(state) != len(saved_state) or any(
        isinstance(v, DTensor) for s in state.values() for v in s.values()
    ):
        return None
    return {"state": state, "param_groups": groups}


def load_optim_states(
    model: nn.Module,
    wrappers: Mapping[str, OptimWrapper],
    state_dict: Mapping[str, Any],
    options_for: Callable[[Any], StateDictOptions],
) -> None:
    """Load every wrapper's state (``wrappers`` as ``optim_wrapper_parts`` gives them; the
    state of a single one is ``state_dict`` itself), with ``options_for(per-param state)``."""
    if SINGLE not in wrappers:
        missing = sorted(set(wrappers) - set(state_dict))
        if missing:
            raise KeyError(f"the optimizer state has no entry for optimizer(s) {missing}")
    for name, wrapper in wrappers.items():
        state = state_dict if name == SINGLE else state_dict[name]
        load_optim_state(model, wrapper, state, options_for(state["state"]))


def holds_tensor_state(optim_state: Mapping[str, Any]) -> bool:
    """Whether an optimizer state holds per-parameter tensors (SGD without momentum does
    not)."""
    return any(
        isinstance(v, torch.Tensor) and v.dim() > 0
        for per_param in optim_state.get("state", {}).values()
        for v in per_param.values()
    )


def map_schedulers(fn: Callable[[_ParamScheduler], Any], schedulers: Any) -> Any:
    """``fn`` of each scheduler: a list, or a dict of lists by optimizer name."""
    if isinstance(schedulers, dict):
        return {name: [fn(s) for s in group] for name, group in schedulers.items()}
    return [fn(s) for s in schedulers]


def load_scheduler_states(schedulers: Any, states: Any) -> None:
    """Load what :func:`map_schedulers` of ``state_dict`` gave (a list, or lists by name)."""
    if isinstance(schedulers, dict):
        for name, group in schedulers.items():
            load_schedulers(group, states[name])
    else:
        load_schedulers(schedulers, states)


def load_schedulers(schedulers: Sequence[_ParamScheduler], states: Sequence[Any]) -> None:
    """Load each scheduler's state, in order."""
    if len(schedulers) != len(states):
        raise ValueError(
            f"the checkpoint holds {len(states)} parameter scheduler states but "
            f"{len(schedulers)} schedulers are configured; resume with "
            "resume_param_scheduler=False or use the same param_scheduler config"
        )
    for scheduler, state in zip(schedulers, states):
        scheduler.load_state_dict(state)
