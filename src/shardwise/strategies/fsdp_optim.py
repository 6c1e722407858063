"""Pre-built optimizers moved onto a sharded model: FSDP2 replaces the parameters, so an
optimizer (alone, in an ``OptimWrapper`` or in a config) built before sharding is rebuilt over
the new ones, matched by name, with the same param groups and hyper-parameters; an
``AmpOptimWrapper`` gets FSDP's ``ShardedGradScaler``; a pre-built scheduler follows its
optimizer."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from shardwise.optim import AmpOptimWrapper, OptimWrapper, OptimWrapperDict
from shardwise.optim.parts import SINGLE, optim_wrapper_parts, part_optimizer
from shardwise.optim.scheduler import _ParamScheduler
from shardwise.optim.scheduler.param_scheduler import unwrap_optimizer, watch_first_step

from .parallelize import clean_name

__all__ = ["OptimizerRebinder", "rebuild_optimizer"]


def rebuild_optimizer(
    optimizer: torch.optim.Optimizer,
    names: Mapping[int, str],
    params: Mapping[str, nn.Parameter],
) -> torch.optim.Optimizer:
    """The same optimizer over other parameter objects: each parameter is replaced by the one
    of the same name (``names``: ``id(old parameter) -> name``; ``params``: name -> new
    parameter). Param groups keep every hyper-parameter; the optimizer must have no state.

    Example::

        >>> names = {id(p): n for n, p in model.named_parameters()}
        >>> fully_shard(model)
        >>> optimizer = rebuild_optimizer(optimizer, names, dict(model.named_parameters()))
    """
    groups = []
    for group in optimizer.param_groups:
        new_params = []
        for param in group["params"]:
            name = names.get(id(param))
            if name not in params:
                raise ValueError(
                    f"the pre-built {type(optimizer).__name__} holds a parameter of shape "
                    f"{tuple(param.shape)} that is not a parameter of the model (name "
                    f"{name!r}); build the optimizer over model.parameters()"
                )
            new_params.append(params[name])
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": new_params})
    cls = type(optimizer)
    signature = inspect.signature(cls.__init__).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.values())
    defaults = {k: v for k, v in optimizer.defaults.items() if takes_all or k in signature}
    return cls(groups, **defaults)


def _is_amp(cfg: Mapping[str, Any]) -> bool:
    return cfg.get("type") in ("AmpOptimWrapper", AmpOptimWrapper)


class OptimizerRebinder:
    """Rebinds what :meth:`FSDPStrategy.build_optim_wrapper` is given to the sharded model,
    remembering which optimizer became which (for the schedulers built on them)."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}  # id(parameter before sharding) -> its name
        self._rebuilt: dict[int, torch.optim.Optimizer] = {}  # by the old and the new id

    def remember(self, model: nn.Module) -> None:
        """The parameters' names before the model is sharded."""
        self._names = {id(p): clean_name(n) for n, p in model.named_parameters()}

    def rebind(self, optim_wrapper: Any, model: nn.Module, device_type: str) -> Any:
        """``optim_wrapper`` (object or config) with every pre-built optimizer over
        ``model``'s (sharded) parameters."""
        if optim_wrapper is None:
            return None
        parts = {
            name: self._part(part, model, device_type)
            for name, part in optim_wrapper_parts(optim_wrapper).items()
        }
        if isinstance(optim_wrapper, OptimWrapperDict):
            return optim_wrapper  # its wrappers were rebound in place
        return parts[SINGLE] if SINGLE in parts else parts

    def adopt(self, scheduler: _ParamScheduler) -> _ParamScheduler:
        """Point a pre-built scheduler at the rebuilt optimizer (kept, with its state)."""
        current = unwrap_optimizer(scheduler.optimizer)
        new = self._rebuilt.get(id(current))
        if new is None:
            return scheduler
        if scheduler.optimizer is current:  # built on the bare optimizer, not on a wrapper
            scheduler.optimizer = new
        watch_first_step(new)  # the step-order check watches the optimizer that steps
        return scheduler

    def _part(self, part: Any, model: nn.Module, device_type: str) -> Any:
        if isinstance(part, torch.optim.Optimizer):
            return self._rebuild(part, model)
        if isinstance(part, OptimWrapper):
            part.optimizer = self._rebuild(part.optimizer, model)
            if isinstance(part, AmpOptimWrapper):
                _use_sharded_scaler(part, device_type)
            return part
        cfg = dict(part)
        if part_optimizer(cfg) is not None:
            cfg["optimizer"] = self._rebuild(cfg["optimizer"], model)
        if _is_amp(cfg):
            cfg.setdefault("use_fsdp", True)
        return cfg

    def _rebuild(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
        current = {clean_name(n): p for n, p in model.named_parameters()}
        current_ids = {id(p) for p in current.values()}
        if all(id(p) in current_ids for g in optimizer.param_groups for p in g["params"]):
            return optimizer  # already over the sharded parameters
        rebuilt = rebuild_optimizer(optimizer, self._names, current)
        self._rebuilt[id(optimizer)] = self._rebuilt[id(rebuilt)] = rebuilt
        return rebuilt


def _use_sharded_scaler(wrapper: AmpOptimWrapper, device_type: str) -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    wrapper.device_type = device_type
    scaler = wrapper.loss_scaler
    if scaler is None or isinstance(scaler, ShardedGradScaler):
        return
    sharded = ShardedGradScaler(device_type, enabled=scaler.is_enabled())
    state = scaler.state_dict()
    if state:
        sharded.load_state_dict(state)
    wrapper.loss_scaler = sharded
