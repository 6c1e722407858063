"""The functions a registry builds with (its ``build_func``): ``dict(type=...)`` → object."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from shardwise.config import Config

from .registry import Registry

__all__ = [
    "build_from_cfg",
    "build_model_from_cfg",
    "build_runner_from_cfg",
    "build_scheduler_from_cfg",
]

CfgType = Mapping[str, Any] | Config


def _merged_args(
    cfg: CfgType, registry: Registry, default_args: CfgType | None, needs_type: bool = True
) -> dict[str, Any]:
    """``cfg`` as a dict, with the keys of ``default_args`` it lacks; checks the arguments."""
    if not isinstance(cfg, Mapping | Config):
        raise TypeError(
            f"cfg should be a dict, ConfigDict or Config, but got {type(cfg)}: {cfg!r}; give "
            f"a config such as dict(type='ResNet', depth=50)"
        )
    if not isinstance(registry, Registry):
        raise TypeError(
            f"registry must be a mmengine.Registry object, but got {type(registry)}: "
            f"{registry!r}; here that is shardwise.registry.Registry (shardwise's "
            "mmengine-compatible Registry): pass one such as shardwise.registry.MODELS"
        )
    if not (default_args is None or isinstance(default_args, Mapping | Config)):
        raise TypeError(
            f"default_args should be a dict, ConfigDict, Config or None, but got "
            f"{type(default_args)}: {default_args!r}"
        )
    args = dict(cfg.items())
    for key, value in (default_args or {}).items():
        args.setdefault(key, value)
    if needs_type and "type" not in args:
        raise KeyError(
            f'`cfg` or `default_args` must contain the key "type", but got keys {list(cfg)} '
            f"and {list(default_args or {})}; add type= naming a class of the {registry.name} "
            f"registry"
        )
    return args


def build_from_cfg(cfg: CfgType, registry: Registry, default_args: CfgType | None = None) -> Any:
    """Build ``cfg['type']`` from ``registry`` with the rest of ``cfg`` as keyword arguments.

    ``default_args`` fill in keywords that ``cfg`` does not set. A ``_scope_`` key builds in the
    registry of that scope. A class that keeps named global instances (mmengine's
    ``ManagerMixin``: ``get_instance``) is built with ``get_instance``, so that it can be found
    by name later.

    Example::

        >>> BACKBONES = Registry('backbone')
        >>> @BACKBONES.register_module()
        ... class ResNet:
        ...     def __init__(self, depth, stages=4):
        ...         self.depth, self.stages = depth, stages
        >>> build_from_cfg(dict(type='ResNet', depth=50), BACKBONES).depth
        50
    """
    args = _merged_args(cfg, registry, default_args)
    with registry.switch_scope_and_registry(args.pop("_scope_", None)) as scoped:
        obj_cls = scoped.resolve(args.pop("type"))
        try:
            if inspect.isclass(obj_cls) and _keeps_global_instances(obj_cls):
                return obj_cls.get_instance(**args)
            return obj_cls(**args)
        except TypeError as exc:
            name = getattr(obj_cls, "__name__", repr(obj_cls))
            raise TypeError(f"building {name} from the {scoped.name} registry: {exc}") from exc


def _keeps_global_instances(cls: type) -> bool:
    return isinstance(getattr(cls, "_instance_dict", None), dict) and callable(
        getattr(cls, "get_instance", None)
    )


def build_model_from_cfg(
    cfg: CfgType | Sequence[CfgType],
    registry: Registry,
    default_args: CfgType | None = None,
) -> torch.nn.Module:
    """:func:`build_from_cfg`, but a list of configs builds an ``nn.Sequential`` of them."""
    if isinstance(cfg, list):
        return torch.nn.Sequential(*(build_from_cfg(c, registry, default_args) for c in cfg))
    return build_from_cfg(cfg, registry, default_args)


def build_runner_from_cfg(cfg: CfgType, registry: Registry) -> Any:
    """Build a runner with ``from_cfg``: the class is ``cfg['runner_type']`` (default
    ``'Runner'``), looked up in ``registry``; ``cfg`` (``runner_type`` included) is its
    argument."""
    args = _merged_args(cfg, registry, None, needs_type=False)
    with registry.switch_scope_and_registry(args.pop("_scope_", None)) as scoped:
        runner_cls = scoped.resolve(args.get("runner_type", "Runner"))
        return runner_cls.from_cfg(args)


def build_scheduler_from_cfg(
    cfg: CfgType, registry: Registry, default_args: CfgType | None = None
) -> Any:
    """Build a parameter scheduler: :func:`build_from_cfg` that also honours
    ``convert_to_iter_based=True`` (an epoch-based config turned iteration-based by the
    class's ``build_iter_from_epoch``, with ``epoch_length`` from ``cfg`` or ``default_args``).

    :func:`shardwise.optim.scheduler.build_param_scheduler` (lists, built schedulers, the
    optimizer argument) builds each config with it.
    """
    args = _merged_args(cfg, registry, default_args)
    epoch_length = args.pop("epoch_length", None)
    if not args.pop("convert_to_iter_based", False):
        return build_from_cfg(args, registry)
    with registry.switch_scope_and_registry(args.pop("_scope_", None)) as scoped:
        cls = scoped.resolve(args.pop("type"))
        if not hasattr(cls, "build_iter_from_epoch"):
            raise TypeError(
                f"{getattr(cls, '__name__', cls)!r} has no build_iter_from_epoch(), so "
                f"convert_to_iter_based=True cannot convert it; give it by_epoch=False with "
                f"iteration counts instead"
            )
        return cls.build_iter_from_epoch(epoch_length=epoch_length, **args)
