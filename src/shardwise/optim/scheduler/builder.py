"""Build parameter schedulers from config, with mmengine's ``convert_to_iter_based`` key.

Example::

    >>> import torch
    >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    >>> scheds = build_param_scheduler(
    ...     [dict(type='LinearLR', start_factor=0.1, by_epoch=False, end=10),
    ...      dict(type='CosineAnnealingLR', begin=1, end=5, convert_to_iter_based=True)],
    ...     opt, epoch_length=10)
    >>> [(s.begin, s.end, s.by_epoch) for s in scheds]
    [(0, 10, False), (10, 50, False)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, overload

from torch.optim import Optimizer

from shardwise.integrations.openmmlab_compat import scheduler_optimizer
from shardwise.registry import PARAM_SCHEDULERS, Registry, build_scheduler_from_cfg

from .param_scheduler import OptimizerType, _ParamScheduler

__all__ = ["build_param_scheduler"]

SchedulerCfg = Mapping[str, Any] | _ParamScheduler


@overload
def build_param_scheduler(
    cfg: SchedulerCfg,
    optimizer: OptimizerType | None = None,
    epoch_length: int | None = None,
    *,
    registry: Registry = PARAM_SCHEDULERS,
) -> _ParamScheduler: ...


@overload
def build_param_scheduler(
    cfg: Sequence[SchedulerCfg],
    optimizer: OptimizerType | None = None,
    epoch_length: int | None = None,
    *,
    registry: Registry = PARAM_SCHEDULERS,
) -> list[_ParamScheduler]: ...


def build_param_scheduler(
    cfg: SchedulerCfg | Sequence[SchedulerCfg],
    optimizer: OptimizerType | None = None,
    epoch_length: int | None = None,
    *,
    registry: Registry = PARAM_SCHEDULERS,
) -> _ParamScheduler | list[_ParamScheduler]:
    """Build a scheduler from ``cfg`` (a dict with ``type``), or a list from a list of them.

    A built scheduler is passed through. ``convert_to_iter_based=True`` in a config turns an
    epoch-based config into an iteration-based scheduler through the class's
    ``build_iter_from_epoch``; it needs ``epoch_length``, the number of iterations per epoch
    (a config's own ``epoch_length`` wins over the argument). ``optimizer`` may be a torch
    optimizer or an optimizer wrapper (with ``.optimizer``; an OpenMMLab package's scheduler,
    mmengine's class, gets the wrapper's torch optimizer); a config's own ``optimizer`` wins.
    Each config is built by ``PARAM_SCHEDULERS``' build function
    (:func:`shardwise.registry.build_scheduler_from_cfg`).
    """
    if isinstance(cfg, _ParamScheduler):
        return cfg
    if isinstance(cfg, Sequence) and not isinstance(cfg, str):
        return [build_param_scheduler(c, optimizer, epoch_length, registry=registry) for c in cfg]
    if not isinstance(cfg, Mapping):
        raise TypeError(
            f"a param_scheduler config must be a dict with a 'type' key (or a list of them, or a "
            f"built scheduler), got {type(cfg).__name__}: {cfg!r}"
        )
    args = dict(cfg)
    if optimizer is not None:
        args.setdefault("optimizer", _for_scheduler(args, optimizer, registry))
    if epoch_length is not None:
        args.setdefault("epoch_length", epoch_length)
    return build_scheduler_from_cfg(args, registry)


def _for_scheduler(cfg: Mapping[str, Any], optimizer: Any, registry: Registry) -> Any:
    """The optimizer to hand the scheduler ``cfg`` names: an OpenMMLab package's scheduler
    (mmengine's class) takes a torch optimizer, not shardwise's wrapper, so it gets the
    wrapper's own (whose parameter groups it schedules)."""
    if not isinstance(getattr(optimizer, "optimizer", None), Optimizer):
        return optimizer  # a torch optimizer: every scheduler takes it
    kind = cfg.get("type")
    with registry.switch_scope_and_registry(cfg.get("_scope_")) as scoped:
        cls = scoped.get(kind) if isinstance(kind, str) else kind
    return scheduler_optimizer(cls, optimizer)
