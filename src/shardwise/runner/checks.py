"""The runner's config checks: everything a config can get wrong is refused before anything
is built, so that ``shardwise train`` reports it in the launching process, in one line that
names the key, the value and what fits, and exits 2 before any worker starts.

:func:`check_config` runs them all: the components the runner needs together, every registry
``type`` (model, strategy, datasets, metrics, hooks, optimizer wrapper and constructor,
optimizer, schedulers, the visualizer's ``vis_backends`` and their tracker packages), the
strategy's own arguments (:meth:`BaseStrategy.check_config`, parallel degrees against the
world size), and the optimizer and schedulers built once against
a stand-in parameter (so that their own checks of numbers and windows run).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from shardwise.checkpoint import CheckpointError
from shardwise.checkpoint.formats import detect_format
from shardwise.checkpoint.storage import check_storage, exists, is_url
from shardwise.config import Config
from shardwise.integrations import openmmlab
from shardwise.integrations.openmmlab_compat import builds_own_vis_backends, is_package_loop
from shardwise.optim import OptimWrapper
from shardwise.optim.parts import SINGLE, optim_wrapper_parts
from shardwise.optim.scheduler.builder import build_param_scheduler
from shardwise.registry import (
    DATASETS,
    HOOKS,
    METRICS,
    MODELS,
    OPTIM_WRAPPER_CONSTRUCTORS,
    OPTIM_WRAPPERS,
    OPTIMIZERS,
    PARAM_SCHEDULERS,
    STRATEGIES,
    VISUALIZERS,
    DefaultScope,
)
from shardwise.visualization import check_vis_backends

from .config_keys import check_top_level_keys
from .data import check_dataloader_cfg
from .hooks.defaults import merge_default_hooks, with_preemption

__all__ = [
    "check_components",
    "check_config",
    "check_train_cfg",
    "check_types",
    "checkpoints_hint",
]

_ERRORS = (KeyError, TypeError, ValueError)
_NOT_WRAPPER_ARGS = ("type", "optimizer", "constructor", "paramwise_cfg")


@contextlib.contextmanager
def at(key: str) -> Iterator[None]:
    """Errors raised inside name the config ``key`` they concern, on one line."""
    try:
        yield
    except _ERRORS as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        message = " ".join(str(message).split())
        kind = next(kind for kind in _ERRORS if isinstance(exc, kind))
        raise kind(message if message.startswith(f"{key}") else f"{key}: {message}") from None


def check_config(
    cfg: Config | Mapping[str, Any],
    *,
    world_size: int | None = None,
    local_world_size: int | None = None,
    strict_keys: bool = False,
) -> None:
    """Refuse a config that cannot train (see the module docstring). ``world_size`` and
    ``local_world_size``: of the run to be launched (default: this process's, from the
    environment). A top-level key that is a near miss of one the Runner reads (``train_cgf``)
    is warned about, or refused with ``strict_keys`` (:mod:`.config_keys`). Side-effect free.
    Names resolve under the config's ``default_scope``, as in the run."""
    check_top_level_keys(cfg, strict_keys=strict_keys)
    scope = cfg.get("default_scope")
    if scope is not None and not isinstance(scope, str):
        raise TypeError(
            f"default_scope={scope!r}: expected the name of a registry scope, e.g. "
            "default_scope='mmpretrain'"
        )
    mmengine_before = openmmlab.saved_mmengine_instances()  # a lookup may set its scope
    try:
        with DefaultScope.overwrite_default_scope(scope):
            _check_config(cfg, world_size, local_world_size)
    finally:
        openmmlab.restore_mmengine_instances(mmengine_before)


def _check_config(
    cfg: Config | Mapping[str, Any], world_size: int | None, local_world_size: int | None
) -> None:
    if cfg.get("model") is None:
        where = f" ({cfg.filename})" if getattr(cfg, "filename", None) else ""
        raise ValueError(
            f"the config{where} has no 'model'; add model=dict(type='YourModel', ...) "
            "naming a class registered in shardwise.registry.MODELS (or a dotted import path)"
        )
    check_components(
        model=cfg["model"],
        train_dataloader=cfg.get("train_dataloader"),
        optim_wrapper=cfg.get("optim_wrapper"),
        train_cfg=cfg.get("train_cfg"),
        val_dataloader=cfg.get("val_dataloader"),
        val_evaluator=cfg.get("val_evaluator"),
        val_cfg=cfg.get("val_cfg"),
        test_dataloader=cfg.get("test_dataloader"),
        test_evaluator=cfg.get("test_evaluator"),
        test_cfg=cfg.get("test_cfg"),
        load_from=cfg.get("load_from"),
        resume=cfg.get("resume", False),
    )
    check_types(cfg)
    if not _is_mmengine_visualizer(cfg.get("visualizer")):  # which builds its own backends
        check_vis_backends(cfg.get("visualizer"))
    check_storage(cfg.get("work_dir") or "", "work_dir")  # a URL: its store is reachable
    world = world_size or int(os.environ.get("WORLD_SIZE", "1") or 1)
    local = local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or world
    _check_strategy(cfg.get("strategy"), world, local)
    optim_wrapper = _as_strategy_builds_it(cfg.get("strategy"), cfg.get("optim_wrapper"), world)
    optimizer = _check_optim_wrapper(optim_wrapper, "optim_wrapper")
    if optimizer is not None and cfg.get("param_scheduler") is not None:
        _check_schedulers(cfg["param_scheduler"], optimizer, cfg.get("train_cfg") or {})


def _is_mmengine_visualizer(visualizer: Any) -> bool:
    """Whether a ``visualizer`` config names an OpenMMLab package's (mmengine's class)."""
    if not isinstance(visualizer, Mapping) or not isinstance(visualizer.get("type"), str):
        return False
    with at("visualizer.type"):
        return builds_own_vis_backends(VISUALIZERS.resolve(visualizer["type"]))


def _check_strategy(strategy: Any, world_size: int, local_size: int) -> None:
    if isinstance(strategy, str):  # e.g. --cfg-options "strategy={'type':'DDPStrategy'}"
        raise TypeError(
            f"strategy: expected a dict(type=...) or a built strategy, got the string "
            f"{strategy!r}; on the command line give its keys one by one "
            "(--cfg-options strategy.type=DDPStrategy)"
        )
    if not isinstance(strategy, Mapping):
        return  # absent (the default one) or an object built already
    with at("strategy"):
        cls = STRATEGIES.resolve(strategy.get("type", "SingleDeviceStrategy"))
    if isinstance(cls, type) and hasattr(cls, "check_config"):
        with at("strategy"):
            cls.check_config(strategy, world_size=world_size, local_world_size=local_size)


def _as_strategy_builds_it(strategy: Any, optim_wrapper: Any, world_size: int) -> Any:
    """The ``optim_wrapper`` config as the strategy will build it: a strategy with
    ``translate_optim_wrapper_config`` (DeepSpeedStrategy: its config's precision, clipping,
    accumulation and optimizer section) rewrites it, refusing what disagrees."""
    if not isinstance(strategy, Mapping):
        return optim_wrapper
    cls = STRATEGIES.resolve(strategy.get("type", "SingleDeviceStrategy"))
    translate = getattr(cls, "translate_optim_wrapper_config", None)
    if translate is None:
        return optim_wrapper
    with at("optim_wrapper"):
        return translate(strategy, optim_wrapper, world_size)


def _check_numbers(fn: Any, kwargs: Mapping[str, Any], key: str) -> None:
    """Refuse a value that is not a number where ``fn``'s default is one (``lr='fast'``)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    for name, value in kwargs.items():
        default = parameters[name].default if name in parameters else None
        numeric = isinstance(default, int | float) and not isinstance(default, bool)
        if numeric and (isinstance(value, bool) or not isinstance(value, int | float)):
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"{key}.{name}={value!r}: expected a number (the default is {default!r})"
                )


def _check_optim_wrapper(cfg: Any, key: str) -> torch.optim.Optimizer | None:
    """Check an ``optim_wrapper`` config; returns the optimizer it configures, built over a
    stand-in parameter (None when there is nothing to build: an object, several optimizers,
    a custom constructor)."""
    if not isinstance(cfg, Mapping):
        return None
    parts = optim_wrapper_parts(cfg)
    if SINGLE not in parts:  # several optimizers
        for name, sub in parts.items():
            _check_optim_wrapper(sub, f"{key}.{name}")
        return None
    wrapper_type = cfg.get("type", "OptimWrapper")
    with at(f"{key}.type"):
        OPTIM_WRAPPERS.resolve(wrapper_type)
    if isinstance(cfg.get("constructor"), str):
        with at(f"{key}.constructor"):
            OPTIM_WRAPPER_CONSTRUCTORS.resolve(cfg["constructor"])
    optimizer_cfg = cfg.get("optimizer")
    if not isinstance(optimizer_cfg, Mapping) or "type" not in optimizer_cfg:
        return None
    with at(f"{key}.optimizer.type"):
        optimizer_cls = OPTIMIZERS.resolve(optimizer_cfg["type"])
    hyper = {k: v for k, v in optimizer_cfg.items() if k != "type" and not k.startswith("_")}
    _check_numbers(optimizer_cls, hyper, f"{key}.optimizer")
    optimizer = dry_build(
        f"{key}.optimizer", lambda: optimizer_cls([torch.nn.Parameter(torch.zeros(1))], **hyper)
    )
    if optimizer is not None:
        wrapper_args = {k: v for k, v in cfg.items() if k not in _NOT_WRAPPER_ARGS}
        dry_build(
            key,
            lambda: OPTIM_WRAPPERS.build(
                dict(type=wrapper_type, optimizer=optimizer, **wrapper_args)
            ),
        )
    return optimizer


def _check_schedulers(cfg: Any, optimizer: torch.optim.Optimizer, train_cfg: Mapping) -> None:
    """Build each scheduler config over the stand-in optimizer (checks types, numbers and
    ``[begin, end)`` windows; a missing ``end`` is the run's length, as the strategy sets it)."""
    items = cfg if isinstance(cfg, list | tuple) else [cfg]
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue  # a built scheduler, or one list per optimizer (checked when built)
        key = f"param_scheduler[{i}]" if isinstance(cfg, list | tuple) else "param_scheduler"
        item = dict(item)
        if "type" not in item:
            continue
        with at(f"{key}.type"):
            scheduler_cls = PARAM_SCHEDULERS.resolve(item["type"])
        args = {k: v for k, v in item.items() if k not in ("type", "convert_to_iter_based")}
        _check_numbers(scheduler_cls, args, key)
        origin = None
        if "end" not in item:
            length_key = "max_epochs" if item.get("by_epoch", True) else "max_iters"
            length = train_cfg.get(length_key)
            if not isinstance(length, int):
                continue
            item["end"], origin = length, f"train_cfg.{length_key}={length}"
        build = functools.partial(build_param_scheduler, item, OptimWrapper(optimizer))
        try:
            dry_build(key, functools.partial(build, epoch_length=1))
        except ValueError as exc:
            if origin is None:
                raise
            raise ValueError(_end_from_length(str(exc), item, origin)) from None


def _end_from_length(message: str, item: Mapping[str, Any], origin: str) -> str:
    """A scheduler's refusal of the ``end`` it was given from the run's length (``origin``,
    ``'train_cfg.max_iters=20'``: the config sets no ``end``), saying so and what to change."""
    end = item["end"]
    head = message.split(f"end={end}", 1)
    if len(head) == 1:
        return f"{message} (its end={end} is from {origin}: the scheduler sets no end)"
    length_key = origin.split("=", 1)[0]
    begin = item.get("begin", 0)
    return (
        f"{head[0]}end={end} (from {origin}: the scheduler sets no end, so it ends with "
        f"training); raise {length_key} above {begin}, or give the scheduler an end of its own"
    )


def dry_build(key: str, build: Callable[[], Any]) -> Any:
    """``build()`` an object only to have its constructor check its arguments (quietly): its
    refusal names ``key``; an object that needs what only a run has (a process group, a
    device) is not judged here (None)."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with at(key):
            return build()
    except _ERRORS:
        raise
    except Exception:  # noqa: BLE001 - not a bad argument: left to the run
        return None
    finally:
        logging.disable(previous)


def check_components(
    *,
    model: Any,
    train_dataloader: Any,
    optim_wrapper: Any,
    train_cfg: Any,
    val_dataloader: Any,
    val_evaluator: Any,
    val_cfg: Any,
    load_from: Any,
    resume: Any,
    test_dataloader: Any = None,
    test_evaluator: Any = None,
    test_cfg: Any = None,
) -> None:
    """The runner's bad-input checks (no side effects)."""
    if model is None:
        raise ValueError(
            "model is None; pass an nn.Module or a config such as model=dict(type='YourModel')"
        )
    training = dict(
        train_dataloader=train_dataloader, train_cfg=train_cfg, optim_wrapper=optim_wrapper
    )
    given = [k for k, v in training.items() if v is not None]
    if given and len(given) < len(training):
        missing = [k for k in training if k not in given]
        raise ValueError(
            f"training needs train_dataloader, train_cfg and optim_wrapper together; got "
            f"{', '.join(given)} but not {', '.join(missing)}. Add "
            + " and ".join(f"{k}=..." for k in missing)
        )
    by_epoch = check_train_cfg(train_cfg) if train_cfg is not None else None
    if isinstance(train_dataloader, Mapping):
        check_dataloader_cfg(train_dataloader, "train_dataloader")
        if by_epoch:
            _check_epochs_end(train_dataloader)
    _check_evaluation("val", "validation", val_dataloader, val_evaluator, val_cfg)
    _check_evaluation("test", "testing", test_dataloader, test_evaluator, test_cfg)
    if train_cfg is not None and "val_interval" in train_cfg and val_dataloader is None:
        raise ValueError(
            f"train_cfg.val_interval={train_cfg['val_interval']!r} asks for validation, but the "
            "config has no val_dataloader; add val_dataloader=dict(dataset=..., batch_size=...) "
            "and val_evaluator=dict(type=...), or remove val_interval"
        )
    for name, path in (("load_from", load_from), ("resume", resume)):
        if is_url(path):  # on object storage: the store's access, then the checkpoint
            check_storage(path, name, write=False)
            if not exists(path):
                raise FileNotFoundError(f"{name}={str(path)!r}: no such checkpoint")
        elif isinstance(path, str | os.PathLike):
            if not Path(path).exists():
                raise FileNotFoundError(
                    f"{name}={str(path)!r}: no such checkpoint. " + checkpoints_hint(Path(path))
                )
            try:
                detect_format(path, probe=True)
            except CheckpointError as exc:
                raise ValueError(f"{name}={str(path)!r}: {exc}") from None


def _check_evaluation(
    stage: str, what: str, dataloader: Any, evaluator: Any, loop_cfg: Any
) -> None:
    """``{stage}_dataloader`` and ``{stage}_evaluator`` come together, and ``{stage}_cfg``
    (optional: ``{}`` by default) only with them, as a dict of loop options."""
    if loop_cfg is not None and not isinstance(loop_cfg, Mapping):
        loop = "ValLoop" if stage == "val" else "TestLoop"
        raise TypeError(
            f"{stage}_cfg={loop_cfg!r}: expected a dict of {loop} options, such as "
            f"{stage}_cfg=dict() or dict(fp16=True), or dict(type='MyLoop') for a loop "
            "registered in LOOPS"
        )
    if isinstance(dataloader, Mapping):
        check_dataloader_cfg(dataloader, f"{stage}_dataloader")
    required = {f"{stage}_dataloader": dataloader, f"{stage}_evaluator": evaluator}
    given = [k for k, v in {**required, f"{stage}_cfg": loop_cfg}.items() if v is not None]
    missing = [k for k, v in required.items() if v is None]
    if given and missing:
        raise ValueError(
            f"{what} needs {stage}_dataloader and {stage}_evaluator together; got "
            f"{', '.join(given)} but not {', '.join(missing)}. Add "
            + " and ".join(f"{k}=..." for k in missing)
            + ", or remove the others"
        )


def check_types(cfg: Config | Mapping[str, Any]) -> None:
    """Every ``type`` the config names by a string must resolve in its registry (a typo is a
    ``KeyError`` listing the close names), before any process is started."""

    def check(registry: Any, item: Any, key: str) -> None:
        if isinstance(item, Mapping) and isinstance(item.get("type"), str):
            with at(f"{key}.type"):
                registry.resolve(item["type"])

    check(MODELS, cfg.get("model"), "model")
    check(STRATEGIES, cfg.get("strategy"), "strategy")
    for name in ("train_dataloader", "val_dataloader", "test_dataloader"):
        loader = cfg.get(name)
        if isinstance(loader, Mapping):
            check(DATASETS, loader.get("dataset"), f"{name}.dataset")
    for name in ("val_evaluator", "test_evaluator"):
        evaluator = cfg.get(name)
        for metric in evaluator if isinstance(evaluator, list | tuple) else [evaluator]:
            if not (isinstance(metric, Mapping) and metric.get("type") == "Evaluator"):
                check(METRICS, metric, name)
    with at("preemption"):
        default_hooks = with_preemption(cfg.get("default_hooks"), cfg.get("preemption"))
    merged = merge_default_hooks(default_hooks)
    hooks = {f"default_hooks.{name}": hook for name, hook in merged.items()}
    hooks.update((f"custom_hooks[{i}]", h) for i, h in enumerate(cfg.get("custom_hooks") or []))
    for key, hook in hooks.items():
        check(HOOKS, hook, key)
        _dry_build_own_hook(hook, key)


def _dry_build_own_hook(hook: Any, key: str) -> None:
    """Build a hook of shardwise's own from its config, so that its arguments are checked
    (a user's hook is left to the run: its constructor may do more than check)."""
    if not isinstance(hook, Mapping) or not isinstance(hook.get("type"), str):
        return
    cls = HOOKS.resolve(hook["type"])
    if getattr(cls, "__module__", "").startswith("shardwise."):
        dry_build(key, lambda: HOOKS.build({k: v for k, v in hook.items() if k != "priority"}))


def checkpoints_hint(path: Path, resume: str = "resume=True") -> str:
    """What to do about a checkpoint ``path`` that is not there: the checkpoints beside it,
    or ``resume`` (the config's ``resume=True``, or the command line's flag) for the latest."""
    folder = path.parent
    found = sorted(p.name for p in folder.glob("*.pth")) if folder.is_dir() else []
    if found:
        return f"Checkpoints in {folder}: {', '.join(found)}; or {resume} for the latest."
    return f"Check the path, or use {resume} to resume from the latest checkpoint in work_dir."


def _check_own_train_loop(loop_type: Any) -> None:
    """A training loop named by ``train_cfg.type`` derives from shardwise's (its position is
    what checkpoints record and resume from); a package's own (an OpenMMLab package's, derived
    from mmengine's loops) is refused, naming it."""
    from shardwise.registry import LOOPS

    from .loops import EpochBasedTrainLoop, IterBasedTrainLoop

    cls = LOOPS.get(loop_type) if isinstance(loop_type, str) else loop_type
    ours = (EpochBasedTrainLoop, IterBasedTrainLoop)
    if is_package_loop(cls, ours):
        raise ValueError(
            f"train_cfg.type={loop_type!r} is {cls.__module__}.{cls.__qualname__}, a training "
            "loop of mmengine's kind: shardwise's Runner trains with its own loops (their "
            "position is what its checkpoints save and resume); use "
            "type='EpochBasedTrainLoop' or 'IterBasedTrainLoop' with the same max_epochs or "
            "max_iters, or train this config with mmengine's Runner"
        )


def _check_epochs_end(train_dataloader: Mapping[str, Any]) -> None:
    """Refuse an endless sampler under an epoch-based loop, whose first epoch would never end
    (under mmengine's Runner too)."""
    sampler = train_dataloader.get("sampler")
    kind = sampler.get("type") if isinstance(sampler, Mapping) else None
    if kind == "InfiniteSampler":
        raise ValueError(
            "train_dataloader.sampler type 'InfiniteSampler' never ends an epoch and train_cfg "
            "is epoch-based: the first epoch would run forever; use "
            "sampler=dict(type='DefaultSampler', shuffle=True), or an iteration-based "
            "train_cfg=dict(by_epoch=False, max_iters=N)"
        )


def check_train_cfg(train_cfg: Any) -> bool | None:
    """Refuse a ``train_cfg`` that cannot train; whether it is epoch-based (None: a loop of
    another ``type``, which checks its own arguments)."""
    if not isinstance(train_cfg, Mapping):
        raise TypeError(
            f"train_cfg must be a dict such as dict(by_epoch=True, max_epochs=10), got "
            f"{train_cfg!r}"
        )
    loop_type = train_cfg.get("type")
    if loop_type is not None and loop_type not in ("EpochBasedTrainLoop", "IterBasedTrainLoop"):
        _check_own_train_loop(loop_type)
        return None  # a custom loop checks its own arguments
    by_epoch = train_cfg.get("by_epoch")
    if loop_type is not None:
        by_epoch = loop_type == "EpochBasedTrainLoop"
    epochs = by_epoch or (by_epoch is None and "max_iters" not in train_cfg)
    key = "max_epochs" if epochs else "max_iters"
    value = train_cfg.get(key)
    if value is None:
        if by_epoch is None:
            raise ValueError(
                f"train_cfg={dict(train_cfg)} sets neither max_epochs nor max_iters; use "
                "train_cfg=dict(by_epoch=True, max_epochs=N) or dict(by_epoch=False, max_iters=N)"
            )
        other = "max_iters" if key == "max_epochs" else "max_epochs"
        raise ValueError(
            f"train_cfg={dict(train_cfg)} is {'epoch' if by_epoch else 'iteration'}-based but "
            f"has no {key}; add {key}=N"
            + (f" (or set by_epoch={not by_epoch} to use {other})" if other in train_cfg else "")
        )
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"train_cfg.{key} must be a positive int, got {value!r}")
    return bool(epochs)
