"""shardwise's strategies in mmengine's ``FlexibleRunner``.

Importing this module registers four strategies in mmengine's ``STRATEGIES`` registry, under
names that cannot clash with mmengine's own ``'DDPStrategy'``, ``'FSDPStrategy'`` and
``'DeepSpeedStrategy'`` (mmengine registers its DeepSpeedStrategy whether or not DeepSpeed is
installed; it needs DeepSpeed only when built):

=================================  ===================================================
``'ShardwiseSingleDeviceStrategy'``  :class:`~shardwise.strategies.SingleDeviceStrategy`
``'ShardwiseDDPStrategy'``           :class:`~shardwise.strategies.DDPStrategy`
``'ShardwiseFSDPStrategy'``          :class:`~shardwise.strategies.FSDPStrategy` (FSDP2)
``'ShardwiseDeepSpeedStrategy'``     :class:`~shardwise.strategies.DeepSpeedStrategy`
                                   (mmengine's DeepSpeed keywords, trained by FSDP2)
=================================  ===================================================

A DeepSpeed config moves over by renaming its strategy type only:
``strategy=dict(type='ShardwiseDeepSpeedStrategy', zero_optimization=dict(stage=3), ...)``
with ``optim_wrapper=dict(type='DeepSpeedOptimWrapper', optimizer=...)``; the strategy
builds the optimizer wrapper the DeepSpeed config asks for (shardwise's ``OptimWrapper`` or
``AmpOptimWrapper``), so mmengine's ``DeepSpeedOptimWrapper`` is never built.

An mmengine config switches to them with its usual keys; the strategy's own keywords are
shardwise's (``model_wrapper``, ``state_dict_cfg``, ``async_save``, ``max_keep_ckpts``...)::

    runner_type = 'FlexibleRunner'
    custom_imports = dict(imports=['shardwise.integrations.mmengine'])
    strategy = dict(type='ShardwiseFSDPStrategy', state_dict_cfg='full')
    launcher = 'pytorch'  # torchrun --nproc-per-node 2 tools/train.py CONFIG

``FlexibleRunner(strategy=ShardwiseDDPStrategy(...))`` takes a built strategy as well (the
runner's ``env_cfg``, ``launcher`` and ``randomness`` are then the strategy's business).

The runner and its hooks see what mmengine's strategies give them: a model config is built by
mmengine's ``MODELS`` (the project's ``BaseModel``), the logger is mmengine's ``MMLogger``
(shardwise's own log lines go to it too), the experiment name carries the timestamp, a
clipped gradient's norm reaches the message hub as ``'train/grad_norm'``, and a resume hands
back mmengine's message hub state. Optimizer wrappers and parameter schedulers are shardwise's,
built from the same config vocabulary (every ``torch.optim`` optimizer, ``OptimWrapper``,
``AmpOptimWrapper``, mmengine's scheduler names; an optimizer class the project registers in
mmengine's ``OPTIMIZERS`` is found there); checkpoints are shardwise's (commit protocol,
full / sharded / local formats, checksums). mmengine's default
``env_cfg=dict(dist_cfg=dict(backend='nccl'))`` becomes gloo on a machine without CUDA, with
a warning naming the setting, as in shardwise's own Runner.

Checkpoints hold no mmengine object: the message hub's histories are stored as plain lists
(``{'values', 'counts', 'max_length'}``, the shape of shardwise's ``MessageHub``), so a
checkpoint saved under ``FlexibleRunner`` resumes in :class:`shardwise.runner.Runner` and the
other way round.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("mmengine") is None:
    raise ImportError(
        "shardwise.integrations.mmengine plugs shardwise's strategies into mmengine's "
        "FlexibleRunner and needs the package 'mmengine', which is not installed; install it "
        "with: pip install mmengine==0.10.7"
    )

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch.nn as nn
from mmengine._strategy import BaseStrategy as MMEngineBaseStrategy
from mmengine.logging import HistoryBuffer, MessageHub, MMLogger
from mmengine.registry import MODELS, STRATEGIES
from mmengine.registry import OPTIMIZERS as MMENGINE_OPTIMIZERS

from shardwise import dist
from shardwise.registry import OPTIMIZERS
from shardwise.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, SingleDeviceStrategy

__all__ = [
    "FlexibleRunnerStrategy",
    "ShardwiseDDPStrategy",
    "ShardwiseDeepSpeedStrategy",
    "ShardwiseFSDPStrategy",
    "ShardwiseSingleDeviceStrategy",
    "message_hub_to_mmengine",
    "message_hub_to_plain",
]

_HISTORY_MAX_LENGTH = 1000000  # mmengine's HistoryBuffer default


class _ToCurrentMMLogger(logging.Handler):
    """Hands the records of shardwise's module loggers to the current ``MMLogger``; steps
    aside once shardwise's own logging is set up (a shardwise Runner later in the process)."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger("shardwise").handlers == [self]:
            MMLogger.get_current_instance().handle(record)


@MMEngineBaseStrategy.register  # FlexibleRunner(strategy=...) takes a built one too
class FlexibleRunnerStrategy:
    """What mmengine's ``FlexibleRunner`` expects of a strategy, on top of a shardwise one
    (a mixin: the registered classes put it before the shardwise strategy)."""

    def __init__(
        self,
        *,
        experiment_name: str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        env, note = dist.env_kwargs_from_cfg(env_kwargs)
        self._experiment_prefix = experiment_name
        super().__init__(experiment_name=experiment_name, env_kwargs=env, **kwargs)
        if note:
            self.logger.warning(note)

    @property
    def experiment_name(self) -> str:
        """``NAME_TIMESTAMP`` as mmengine's strategies name it (the timestamp without a name)."""
        prefix = self._experiment_prefix
        return f"{prefix}_{self.timestamp}" if prefix else self.timestamp

    def build_logger(
        self, log_level: str | int = "INFO", log_file: str | None = None, **kwargs: Any
    ) -> MMLogger:
        """mmengine's ``MMLogger`` as mmengine's strategies build it (``log_dir/TIMESTAMP.log``,
        appended to); the records of shardwise's module loggers go to it too."""
        if log_file is None:
            log_file = os.path.join(self.log_dir, f"{self.timestamp}.log")
        log_cfg = dict(log_level=log_level, log_file=log_file, **kwargs)
        log_cfg.setdefault("name", self.experiment_name)
        log_cfg.setdefault("file_mode", "a")
        logger = MMLogger.get_instance(**log_cfg)
        _route_shardwise_logs(log_level)
        return logger

    def build_model(self, model: nn.Module | Mapping[str, Any]) -> nn.Module:
        """Return ``model`` itself, or build it from a config through mmengine's ``MODELS``."""
        if not isinstance(model, Mapping):
            return super().build_model(model)
        built = MODELS.build(model)
        if not isinstance(built, nn.Module):
            raise TypeError(
                f"the model config {dict(model)} built a {type(built).__name__}, not an nn.Module"
            )
        return built

    def build_optim_wrapper(self, optim_wrapper: Any, model: nn.Module | None = None) -> Any:
        """As the shardwise strategy's; an optimizer ``type`` that only the mmengine project
        registers (in mmengine's ``OPTIMIZERS``, e.g. a LAMB) is found there."""
        return super().build_optim_wrapper(_resolve_mmengine_optimizers(optim_wrapper), model)

    def prepare(self, model: nn.Module | Mapping[str, Any], **kwargs: Any) -> Any:
        """As the shardwise strategy's; the optimizer wrappers log to the runner's message hub."""
        prepared = super().prepare(model, **kwargs)
        if hasattr(self, "optim_wrapper"):
            for wrapper in self._wrappers().values():
                wrapper.message_hub = MessageHub.get_current_instance()
        return prepared

    def save_checkpoint(
        self,
        filename: str | os.PathLike[str],
        *,
        extra_ckpt: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """As the shardwise strategy's, with mmengine's message hub stored as plain data."""
        extra = dict(extra_ckpt or {})
        if "message_hub" in extra:
            extra["message_hub"] = message_hub_to_plain(extra["message_hub"])
        return super().save_checkpoint(filename, extra_ckpt=extra, **kwargs)

    def resume(self, filename: str | os.PathLike[str], **kwargs: Any) -> dict[str, Any]:
        """As the shardwise strategy's; the checkpoint's message hub comes back as mmengine's
        ``MessageHub.load_state_dict`` takes it."""
        checkpoint = super().resume(filename, **kwargs)
        if "message_hub" in checkpoint:
            checkpoint["message_hub"] = message_hub_to_mmengine(checkpoint["message_hub"])
        return checkpoint


def _resolve_mmengine_optimizers(cfg: Any) -> Any:
    """``cfg`` with each ``optimizer.type`` that shardwise's ``OPTIMIZERS`` lacks and
    mmengine's has replaced by mmengine's class (in each optimizer of a multi-optimizer
    config too)."""
    if not isinstance(cfg, Mapping):
        return cfg
    optimizer = cfg.get("optimizer")
    if not isinstance(optimizer, Mapping):
        return {key: _resolve_mmengine_optimizers(value) for key, value in cfg.items()}
    name = optimizer.get("type")
    if isinstance(name, str) and OPTIMIZERS.get(name) is None:
        found = MMENGINE_OPTIMIZERS.get(name)
        if found is not None:
            return {**cfg, "optimizer": {**optimizer, "type": found}}
    return cfg


def _route_shardwise_logs(log_level: str | int) -> None:
    """Send what shardwise's module loggers log to the current ``MMLogger`` only (the handlers
    an earlier shardwise run left on the ``'shardwise'`` logger are closed)."""
    shardwise_logger = logging.getLogger("shardwise")
    for handler in list(shardwise_logger.handlers):
        shardwise_logger.removeHandler(handler)
        handler.close()
    shardwise_logger.addHandler(_ToCurrentMMLogger())
    shardwise_logger.setLevel(log_level)
    shardwise_logger.propagate = False


def message_hub_to_plain(state: Mapping[str, Any]) -> dict[str, Any]:
    """mmengine's ``MessageHub.state_dict()`` with each ``HistoryBuffer`` as
    ``{'values', 'counts', 'max_length'}`` (lists and an int), the shape shardwise reads."""
    scalars = {}
    for key, buffer in state.get("log_scalars", {}).items():
        values, counts = buffer.data
        scalars[key] = {
            "values": values.tolist(),
            "counts": counts.tolist(),
            "max_length": buffer.max_length,
        }
    return {**state, "log_scalars": scalars}


def message_hub_to_mmengine(state: Mapping[str, Any]) -> dict[str, Any]:
    """A message hub state in plain data (:func:`message_hub_to_plain`, shardwise's
    ``MessageHub.state_dict()``) as mmengine's ``MessageHub.load_state_dict`` takes it:
    ``HistoryBuffer`` objects, and ``resumed_keys`` (every key, when the state has none)."""
    scalars = {
        key: HistoryBuffer(
            list(buffer["values"]),
            list(buffer["counts"]),
            buffer.get("max_length", _HISTORY_MAX_LENGTH),
        )
        for key, buffer in state.get("log_scalars", {}).items()
    }
    info = dict(state.get("runtime_info", {}))
    resumed = state.get("resumed_keys") or dict.fromkeys([*scalars, *info], True)
    return {"log_scalars": scalars, "runtime_info": info, "resumed_keys": dict(resumed)}


@STRATEGIES.register_module()
class ShardwiseSingleDeviceStrategy(FlexibleRunnerStrategy, SingleDeviceStrategy):
    """shardwise's :class:`~shardwise.strategies.SingleDeviceStrategy` for ``FlexibleRunner``:
    ``strategy=dict(type='ShardwiseSingleDeviceStrategy')``."""


@STRATEGIES.register_module()
class ShardwiseDDPStrategy(FlexibleRunnerStrategy, DDPStrategy):
    """shardwise's :class:`~shardwise.strategies.DDPStrategy` for ``FlexibleRunner``:
    ``strategy=dict(type='ShardwiseDDPStrategy', model_wrapper=dict(...))``."""


@STRATEGIES.register_module()
class ShardwiseFSDPStrategy(FlexibleRunnerStrategy, FSDPStrategy):
    """shardwise's :class:`~shardwise.strategies.FSDPStrategy` (FSDP2) for ``FlexibleRunner``:
    ``strategy=dict(type='ShardwiseFSDPStrategy', state_dict_cfg='sharded')``."""


@STRATEGIES.register_module()
class ShardwiseDeepSpeedStrategy(FlexibleRunnerStrategy, DeepSpeedStrategy):
    """shardwise's :class:`~shardwise.strategies.DeepSpeedStrategy` (mmengine's DeepSpeed
    keywords or ``config='ds_config.json'``, trained by FSDP2) for ``FlexibleRunner``:
    ``strategy=dict(type='ShardwiseDeepSpeedStrategy', zero_optimization=dict(stage=2))``."""
