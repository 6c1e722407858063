"""How a strategy builds what ``prepare`` returns, and checks its arguments: plain functions
over explicit inputs, which ``BaseStrategy`` calls (the order of the steps is written once, in
``BaseStrategy.prepare``).
"""

from __future__ import annotations

import copy
import difflib
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from shardwise import dist, launch_env
from shardwise.checkpoint.memory import parse_memory_checkpoint
from shardwise.checkpoint.retention import check_max_keep_ckpts
from shardwise.env import set_multi_processing, set_resource_limit
from shardwise.optim import (
    OptimWrapper,
    OptimWrapperDict,
    build_optim_wrapper,
    build_param_scheduler,
)
from shardwise.optim.parts import SINGLE, optim_wrapper_parts, part_optimizer
from shardwise.optim.scheduler import _ParamScheduler
from shardwise.registry import MODELS, OPTIM_WRAPPERS
from shardwise.tree import contains

__all__ = [
    "build_model",
    "build_schedulers",
    "compile_model",
    "set_up_environment",
    "build_wrapper_part",
    "check_auto_scale_lr",
    "check_base_kwargs",
    "check_flags",
    "check_keywords",
    "check_prepare_args",
    "scale_lr",
]


def check_prepare_args(
    model: Any,
    optim_wrapper: Any,
    param_scheduler: Any,
    dispatch_kwargs: Mapping[str, Any],
    auto_scale_lr: Mapping[str, Any] | None,
) -> None:
    """Refuse bad input to ``prepare`` before anything is built (``dispatch_kwargs``: those
    the strategy has, updated with the call's)."""
    if not isinstance(model, nn.Module | Mapping):
        raise TypeError(
            f"model must be an nn.Module or a config dict with a 'type' key, got "
            f"{type(model).__name__}: {model!r}"
        )
    if param_scheduler is not None and optim_wrapper is None:
        raise ValueError(
            "param_scheduler was given without optim_wrapper: schedulers act on an "
            "optimizer, so pass optim_wrapper=... to prepare() as well"
        )
    if auto_scale_lr and auto_scale_lr.get("enable", False):
        if "train_micro_batch_size_per_gpu" not in dispatch_kwargs:
            raise ValueError(
                "auto_scale_lr is enabled but dispatch_kwargs has no "
                "'train_micro_batch_size_per_gpu'; pass it to prepare(dispatch_kwargs=...)"
            )
        if contains(_ParamScheduler, param_scheduler):
            raise RuntimeError(
                "auto_scale_lr cannot scale the LR of pre-built parameter schedulers: "
                "they have recorded their initial LR already; pass scheduler configs"
            )
    parts = optim_wrapper_parts(optim_wrapper) if optim_wrapper is not None else {}
    for part in parts.values():
        counts = getattr(part, "_accumulative_counts", None)
        if isinstance(part, Mapping):
            counts = part.get("accumulative_counts")
        if counts not in (None, 1) and "max_iters" not in dispatch_kwargs:
            raise ValueError(
                f"accumulative_counts={counts} needs dispatch_kwargs['max_iters'] to scale "
                "the last, incomplete accumulation window; pass it to "
                "prepare(dispatch_kwargs=...)"
            )


def build_wrapper_part(name: str, part: Any, model: nn.Module | None) -> OptimWrapper:
    """One optimizer wrapper of :meth:`BaseStrategy.build_optim_wrapper` (``name``: the
    submodule it optimizes, ``''`` for the whole model; ``model`` None: none given yet, which
    only a built wrapper or optimizer can do without)."""
    if isinstance(part, OptimWrapper):
        return part
    if isinstance(part, torch.optim.Optimizer):
        return OptimWrapper(part)
    if model is None and isinstance(part, Mapping) and part_optimizer(part) is not None:
        return OPTIM_WRAPPERS.build({"type": "OptimWrapper", **part})
    if model is None:
        where = "optim_wrapper" if name == SINGLE else f"optim_wrapper key {name!r}"
        raise ValueError(
            f"{where} is a config ({part!r}) that needs a model to build its optimizer from, "
            "and none was given: pass build_optim_wrapper(cfg, model), call it after "
            "prepare(model), or give a built OptimWrapper"
        )
    target = model if name == SINGLE else getattr(model, name, None)
    if not isinstance(part, Mapping) or not isinstance(target, nn.Module):
        raise ValueError(
            f"optim_wrapper key {name!r}: a multi-optimizer dict needs, for each key, an "
            "OptimWrapper or a config with 'optimizer' for the submodule of that name; "
            f"got {part!r} and the model has "
            f"{'no' if target is None else 'a non-module'} attribute {name!r}"
        )
    if part_optimizer(part) is not None:
        return OPTIM_WRAPPERS.build({"type": "OptimWrapper", **part})
    return build_optim_wrapper(target, copy.deepcopy(dict(part)))


def check_base_kwargs(kwargs: Mapping[str, Any]) -> None:
    """``BaseStrategy``'s keywords in a config, checked as its constructor would."""
    check_flags(**{k: kwargs[k] for k in ("async_save", "verify_checksums") if k in kwargs})
    check_max_keep_ckpts(kwargs.get("max_keep_ckpts", -1))
    check_auto_scale_lr(kwargs.get("auto_scale_lr"))
    parse_memory_checkpoint(kwargs.get("memory_checkpoint"))
    for name in ("env_kwargs", "log_kwargs"):
        if not isinstance(kwargs.get(name) or {}, Mapping):
            raise TypeError(f"{name} must be a dict, got {kwargs[name]!r}")


def check_flags(**flags: Any) -> None:
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")


def _keywords(cls: type) -> list[str]:
    """The keyword arguments ``cls(...)`` accepts, up the classes whose ``**kwargs`` pass
    them on."""
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(vars(klass)["__init__"]).parameters.values()
        names += [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return names


def check_keywords(cls: type, kwargs: Mapping[str, Any]) -> None:
    """Refuse a keyword ``cls(...)`` does not take, naming the nearest ones (and, for the
    tensor-parallel keywords, the strategy that takes them)."""
    accepted = _keywords(cls)
    for name in kwargs:
        if name in ("parallelism", "tp_plan") and name not in accepted:
            raise ValueError(
                f"{cls.__name__} keeps a whole model on every rank and takes no {name}="
                f"{kwargs[name]!r}: tensor parallelism (parallelism=dict(tp=...), tp_plan) "
                "needs FSDPStrategy, which composes it with data parallelism"
            )
        if name not in accepted:
            close = difflib.get_close_matches(name, accepted, n=3)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise TypeError(
                f"{cls.__name__} has no keyword {name!r}{hint}; it takes {', '.join(accepted)}"
            )


def check_auto_scale_lr(cfg: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if cfg is None:
        return None
    if not isinstance(cfg, Mapping):
        raise TypeError(
            f"auto_scale_lr must be a dict(enable=..., base_batch_size=...), got {cfg!r}"
        )
    cfg = dict(cfg)
    if cfg.get("enable", False):
        base = cfg.get("base_batch_size")
        if not isinstance(base, int) or isinstance(base, bool) or base <= 0:
            raise ValueError(
                f"auto_scale_lr needs a positive integer base_batch_size (the batch size its LR "
                f"was tuned for), got {base!r}; e.g. auto_scale_lr=dict(enable=True, "
                "base_batch_size=256)"
            )
    return cfg


def _build_one_scheduler(
    cfg: Mapping[str, Any], optim_wrapper: Any, default_args: Mapping[str, Any]
) -> _ParamScheduler:
    """One scheduler from its config and :meth:`BaseStrategy.build_param_scheduler`'s
    ``default_args``."""
    cfg, defaults = copy.deepcopy(dict(cfg)), dict(default_args)
    lengths = {key: defaults.pop(key, None) for key in ("max_epochs", "max_iters")}
    epoch_length = defaults.pop("epoch_length", None)
    if "end" not in cfg:
        key = "max_epochs" if cfg.get("by_epoch", True) else "max_iters"
        if lengths[key] is None:
            raise ValueError(
                f"{cfg.get('type')} has no 'end' and there is no {key!r} to default it to; "
                f"set end=..., or pass {key} in default_args or dispatch_kwargs"
            )
        cfg["end"] = lengths[key]
    for key, value in defaults.items():
        cfg.setdefault(key, value)
    return build_param_scheduler(cfg, optim_wrapper, epoch_length=epoch_length)


def scale_lr(wrappers: Mapping[str, Any], base: int, real: int, logger: Any) -> None:
    """Scale every LR of ``wrappers`` by ``real / base`` (``auto_scale_lr``'s linear rule:
    the global batch size against the ``base_batch_size`` the LR was tuned for)."""
    ratio = real / base
    logger.info(
        "auto_scale_lr: batch size %d against base_batch_size %d; scaling every LR by %.4g",
        real,
        base,
        ratio,
    )
    for wrapper in wrappers.values():
        for group in wrapper.optimizer.param_groups:
            group["lr"] = group["lr"] * ratio


def build_schedulers(
    scheduler: Any,
    optim_wrapper: Any,
    default_args: Mapping[str, Any],
    adopt: Callable[[_ParamScheduler, Any], _ParamScheduler],
) -> list[_ParamScheduler] | dict[str, list[_ParamScheduler]]:
    """``BaseStrategy.build_param_scheduler`` for a built ``optim_wrapper``: a list for one
    optimizer, a dict of lists (one per optimizer name) for an ``OptimWrapperDict``;
    ``adopt(scheduler, optim_wrapper)`` keeps a pre-built scheduler (a sharding strategy
    rebinds it to the optimizer it rebuilt)."""
    if not isinstance(optim_wrapper, OptimWrapperDict):
        return _build_scheduler_list(scheduler, optim_wrapper, default_args, adopt)
    per_name = isinstance(scheduler, Mapping) and "type" not in scheduler
    if per_name:
        unknown = set(scheduler) - set(optim_wrapper.keys())
        if unknown:
            raise KeyError(
                f"param_scheduler keys {sorted(unknown)} name no optimizer; the optimizers "
                f"are {sorted(optim_wrapper.keys())}"
            )
    return {
        name: _build_scheduler_list(
            scheduler[name] if per_name else scheduler, wrapper, default_args, adopt
        )
        for name, wrapper in optim_wrapper.items()
        if not per_name or name in scheduler
    }


def _build_scheduler_list(
    scheduler: Any,
    optim_wrapper: Any,
    default_args: Mapping[str, Any],
    adopt: Callable[[_ParamScheduler, Any], _ParamScheduler],
) -> list[_ParamScheduler]:
    items = scheduler if isinstance(scheduler, Sequence) else [scheduler]
    built = []
    for item in items:
        if isinstance(item, _ParamScheduler):
            built.append(adopt(item, optim_wrapper))
        elif isinstance(item, Mapping):
            built.append(_build_one_scheduler(item, optim_wrapper, default_args))
        else:
            raise TypeError(
                f"a param_scheduler must be a scheduler object or a config dict, got "
                f"{type(item).__name__}: {item!r}"
            )
    return built


def set_up_environment(
    *,
    launcher: str | None = None,
    cudnn_benchmark: bool = False,
    mp_cfg: Mapping[str, Any] | None = None,
    dist_cfg: Mapping[str, Any] | None = None,
    resource_limit: int = 4096,
) -> tuple[str, bool, str]:
    """Set up what a run needs from its process: the launcher (inferred when None) and its
    process group, multiprocessing, cuDNN's benchmark mode, the open-file limit. Returns
    ``(launcher, distributed, timestamp)``, the timestamp rank 0's (every rank names the run
    the same).

    A process group already initialised (Ray Train, user code, a notebook) is adopted: the
    strategy uses it, its backend and device, and never destroys it; ``distributed`` is then
    True whatever the launcher, which stays the one the environment names (``'none'`` where
    no launcher variable is set). The launcher's variables are checked before any collective
    (:func:`shardwise.launch_env.read_launch_env`, :func:`shardwise.dist.check_adopted_group`):
    inconsistent ones raise a ``ValueError`` naming them on every rank.
    """
    explicit = launcher is not None
    launcher = launch_env.infer_launcher() if launcher is None else launcher
    if launcher not in launch_env.LAUNCHERS:
        raise ValueError(
            f"Unknown launcher {launcher!r}; expected one of {list(launch_env.LAUNCHERS)}."
        )
    if dist.is_distributed():
        if not dist.owns_process_group():
            dist.check_adopted_group(launcher if explicit else None)
        distributed = True
    else:
        if launcher == "none" and not explicit:
            launch_env.check_no_missed_launcher()
        elif launcher != "none":
            launch_env.read_launch_env(launcher)
        distributed = launcher != "none"
    set_multi_processing(**(mp_cfg or {}), distributed=distributed)
    if distributed and not dist.is_distributed():
        dist.init_dist(launcher, **(dist_cfg or {}))
    if cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
    set_resource_limit(resource_limit)
    stamp = torch.tensor(time.time(), dtype=torch.float64)
    dist.broadcast(stamp, src=0)
    return launcher, distributed, time.strftime("%Y%m%d_%H%M%S", time.localtime(stamp.item()))


def build_model(model: nn.Module | Mapping[str, Any]) -> nn.Module:
    """``model`` itself, or built from a config through ``MODELS``."""
    if isinstance(model, nn.Module):
        return model
    if isinstance(model, Mapping):
        built = MODELS.build(model)
        if not isinstance(built, nn.Module):
            raise TypeError(
                f"the model config {dict(model)} built a {type(built).__name__}, not an nn.Module"
            )
        return built
    raise TypeError(f"model must be an nn.Module or a config dict, got {type(model).__name__}")


def compile_model(model: nn.Module, compile: bool | Mapping[str, Any], logger: Any) -> nn.Module:
    """``torch.compile`` the model's ``target`` method (see ``BaseStrategy.compile_model``)."""
    if not compile:
        return model
    cfg = {} if compile is True else dict(compile)
    target = cfg.pop("target", "forward")
    setattr(model, target, torch.compile(getattr(model, target), **cfg))
    logger.info("Compiled %s.%s; the first iterations will be slow.", type(model).__name__, target)
    return model
