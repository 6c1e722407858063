"""What the Runner builds from its config, as plain functions: its constructor's arguments from
mmengine's config keys, the strategy, the log processor, the visualizer, the loops, and the
config it dumps into ``work_dir``."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shardwise import dist, launch_env
from shardwise.checkpoint.storage import ObjectURL, is_url, write_object
from shardwise.config import Config
from shardwise.registry import LOG_PROCESSORS, LOOPS, STRATEGIES, VISUALIZERS
from shardwise.strategies import BaseStrategy
from shardwise.visualization import Visualizer

from .evaluator import build_evaluator
from .ft_loop import FaultTolerantTrainLoop, ft_config_of
from .hooks.defaults import with_preemption
from .log_processor import LogProcessor
from .loops import EpochBasedTrainLoop, IterBasedTrainLoop

__all__ = [
    "build_eval_loop",
    "build_log_processor",
    "build_strategy",
    "build_train_loop",
    "build_visualizer",
    "dump_config",
    "runner_kwargs",
    "with_data_preprocessor",
]

#: Runner arguments read from the config key of the same name, with their defaults.
_KEYS = dict.fromkeys(
    (
        "experiment_name strategy train_dataloader optim_wrapper param_scheduler train_cfg "
        "val_dataloader val_cfg val_evaluator test_dataloader test_cfg test_evaluator "
        "custom_hooks load_from launcher env_cfg randomness auto_scale_lr visualizer "
        "log_processor default_scope data_preprocessor"
    ).split()
)
_KEYS.update(work_dir="work_dirs", resume=False, log_level="INFO", compile=False)


def runner_kwargs(cfg: Config) -> dict[str, Any]:
    """The Runner's arguments from a config in mmengine's keys (``preemption=dict(...)``
    gives the options of the ``preemption`` default hook)."""
    kwargs = {key: cfg.get(key, default) for key, default in _KEYS.items()}
    kwargs["default_hooks"] = with_preemption(cfg.get("default_hooks"), cfg.get("preemption"))
    return dict(kwargs, model=cfg["model"], cfg=cfg)


def build_strategy(
    strategy: BaseStrategy | Mapping[str, Any] | None,
    *,
    work_dir: str | os.PathLike[str],
    experiment_name: str | None,
    launcher: str | None,
    env_cfg: Mapping[str, Any] | None,
    randomness: Mapping[str, Any] | None,
    log_level: str | int,
    auto_scale_lr: Mapping[str, Any] | None,
) -> BaseStrategy:
    """The strategy object, or one built from its config with the runner's settings as
    defaults (``work_dir``, ``env_kwargs`` from ``env_cfg``/``launcher``/``randomness``,
    ``log_kwargs``, ``auto_scale_lr``); None: ``DDPStrategy`` under a launcher or in an
    initialised group of several ranks, else ``SingleDeviceStrategy``."""
    if isinstance(strategy, BaseStrategy):
        return strategy
    launcher_name = launcher or launch_env.infer_launcher()
    if strategy is None:
        several = launcher_name != "none" or dist.get_world_size() > 1  # an adopted group
        strategy = dict(type="DDPStrategy" if several else "SingleDeviceStrategy")
    if not isinstance(strategy, Mapping):
        raise TypeError(
            f"strategy must be a strategy object or a config dict such as "
            f"dict(type='DDPStrategy'), got {type(strategy).__name__}: {strategy!r}"
        )
    cfg = dict(strategy)
    env, note = dist.env_kwargs_from_cfg(env_cfg)
    if randomness is not None:
        env["randomness"] = dict(randomness)
    if launcher is not None:
        env["launcher"] = launcher
    cfg["env_kwargs"] = {**env, **dict(cfg.get("env_kwargs") or {})}
    cfg.setdefault("work_dir", str(work_dir))
    if experiment_name is not None:
        cfg.setdefault("experiment_name", experiment_name)
    cfg.setdefault("log_kwargs", dict(log_level=log_level))
    if auto_scale_lr is not None:
        cfg.setdefault("auto_scale_lr", auto_scale_lr)
    built = STRATEGIES.build(cfg)
    if note:  # OpenMMLab's default backend on a machine without CUDA: not the user's choice
        built.logger.debug(note)
    return built


def build_log_processor(log_processor: LogProcessor | Mapping[str, Any] | None) -> LogProcessor:
    """The log processor object, or one built from its options (``type`` optional, from
    ``LOG_PROCESSORS``; default ``LogProcessor``). Options without ``by_epoch``: it follows
    the training loop (``by_epoch_follows_loop``; set by ``LoggerHook`` before training)."""
    if isinstance(log_processor, LogProcessor):
        return log_processor
    if log_processor is not None and not isinstance(log_processor, Mapping):
        raise TypeError(
            "log_processor must be a LogProcessor or its options such as "
            f"dict(window_size=10, by_epoch=True), got {type(log_processor).__name__}: "
            f"{log_processor!r}"
        )
    options = dict(log_processor or {})
    built = LOG_PROCESSORS.build({"type": "LogProcessor", **options})
    if "by_epoch" not in options:
        built.by_epoch_follows_loop = True
    return built


def build_visualizer(
    visualizer: Visualizer | Mapping[str, Any] | None,
    *,
    name: str,
    save_dir: str,
    logger: logging.Logger,
) -> Visualizer:
    """The visualizer object, or one built from its config with ``name`` (the experiment
    name) and ``save_dir`` (the log directory) as defaults; None: one without trackers.
    An OpenMMLab package's (``UniversalVisualizer`` under ``default_scope='mmpretrain'``) is
    built as mmengine builds it, as the current instance its hooks look up; a ``type``
    found nowhere (a task library's ``DetLocalVisualizer`` without the library...) is
    warned about and its ``vis_backends`` go to shardwise's ``Visualizer``."""
    if isinstance(visualizer, Visualizer):
        return visualizer
    if visualizer is None:
        return Visualizer(name=name)
    if not isinstance(visualizer, Mapping):
        raise TypeError(
            f"visualizer must be a Visualizer or a config such as dict(type='Visualizer', "
            f"vis_backends=[dict(type='LocalVisBackend')]), got {visualizer!r}"
        )
    cfg = dict(visualizer)
    cfg.setdefault("name", name)
    cfg.setdefault("save_dir", save_dir)
    kind = cfg.pop("type", "Visualizer")
    cls = VISUALIZERS.get(kind)
    if cls is None:
        logger.warning(
            "visualizer.type=%r is not in shardwise's VISUALIZERS (%s): its vis_backends "
            "go to shardwise's Visualizer, which records scalars and the config (no drawing)",
            kind,
            ", ".join(sorted(VISUALIZERS.module_dict)),
        )
        cls = Visualizer
    # built as a registry builds it: a package's (mmengine's) by name, as its hooks find it
    # (get_current_instance); a config from a package's base carries its _scope_
    return VISUALIZERS.build({**cfg, "type": cls})


def build_train_loop(
    runner: Any, train_cfg: Mapping[str, Any] | None, dataloader: Any
) -> EpochBasedTrainLoop | IterBasedTrainLoop:
    """The training loop from ``train_cfg`` (``type``, or ``by_epoch`` to choose)."""
    cfg = dict(train_cfg or {})
    loop_type = cfg.pop("type", None)
    by_epoch = cfg.pop("by_epoch", "max_epochs" in cfg)
    cfg.pop("dynamic_intervals", None)
    args = dict(runner=runner, dataloader=dataloader)
    if ft_config_of(runner.strategy) is not None:  # each step started by torchft's quorum
        if loop_type is not None:
            raise ValueError(
                f"train_cfg type={loop_type!r} with the strategy's fault_tolerance: a "
                "fault-tolerant run trains with its own loop (each step started by the "
                "quorum); drop train_cfg's type and give by_epoch with max_epochs or max_iters"
            )
        return FaultTolerantTrainLoop(**args, by_epoch=by_epoch, **cfg)
    if loop_type is not None:
        return LOOPS.build({"type": loop_type, **cfg}, default_args=args)
    cls = EpochBasedTrainLoop if by_epoch else IterBasedTrainLoop
    return cls(**args, **cfg)


def build_eval_loop(
    runner: Any,
    default: type,
    loop_cfg: Mapping[str, Any] | None,
    dataloader: Any,
    evaluator: Any,
) -> Any:
    """A ``type`` from ``LOOPS`` named by ``loop_cfg``, else ``default``, with its options."""
    cfg = dict(loop_cfg or {})
    built = build_evaluator(evaluator, runner.compat)
    args = dict(runner=runner, dataloader=dataloader, evaluator=built)
    if "type" in cfg:
        return LOOPS.build(cfg, default_args=args)
    return default(**args, **cfg)


def dump_config(cfg: Config, work_dir: str, timestamp: str) -> None:
    """Write the config into ``work_dir`` (under its file's name, else the timestamp's; a
    work_dir on object storage gets it as an object beside the checkpoints)."""
    name = Path(cfg.filename).name if cfg.filename else f"{timestamp}.py"
    if is_url(work_dir):
        with tempfile.TemporaryDirectory() as local:
            dump_config(cfg, local, timestamp)
            write_object(ObjectURL(work_dir) / name, (Path(local) / name).read_bytes())
        return
    path = Path(work_dir) / name
    try:
        cfg.dump(path)
    except (TypeError, ValueError):  # objects in the config: keep a readable copy
        path.write_text(cfg.pretty_text, encoding="utf-8")


def with_data_preprocessor(model: Any, data_preprocessor: Any) -> Any:
    """The model config with the top-level ``data_preprocessor`` where it has none, as
    mmengine's Runner merges the two keys (a built model is returned as it is)."""
    if isinstance(model, Mapping) and data_preprocessor is not None:
        return {**model, "data_preprocessor": model.get("data_preprocessor", data_preprocessor)}
    return model
