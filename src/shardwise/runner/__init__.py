"""The Runner: training, validation and test loops, hooks, and the ``shardwise train`` command.

Importing this package registers the hooks (``HOOKS``), loops (``LOOPS``) and metrics
(``METRICS``) under mmengine's names.
"""

from shardwise.env import set_random_seed

from .data import ResumableSampler, build_dataloader, pseudo_collate, seed_worker, start_epoch
from .evaluator import Accuracy, BaseMetric, Evaluator, MeanLoss, build_evaluator
from .hooks import (
    INTERRUPTED_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    CheckpointHook,
    DistSamplerSeedHook,
    Hook,
    Interrupted,
    IterTimerHook,
    LoggerHook,
    ParamSchedulerHook,
    Preempted,
    PreemptionHook,
    RuntimeInfoHook,
)
from .log_processor import LogProcessor
from .loops import BaseLoop, EpochBasedTrainLoop, IterBasedTrainLoop, TestLoop, ValLoop
from .message_hub import HistoryBuffer, MessageHub
from .priority import Priority, get_priority
from .runner import DEFAULT_HOOKS, Runner, parse_losses

#: mmengine's runner over strategies, whose trimmed form shardwise's :class:`Runner` is.
FlexibleRunner = Runner

__all__ = [
    "Runner",
    "FlexibleRunner",
    "set_random_seed",
    "DEFAULT_HOOKS",
    "LogProcessor",
    "parse_losses",
    "BaseLoop",
    "EpochBasedTrainLoop",
    "IterBasedTrainLoop",
    "ValLoop",
    "TestLoop",
    "Hook",
    "RuntimeInfoHook",
    "IterTimerHook",
    "LoggerHook",
    "ParamSchedulerHook",
    "DistSamplerSeedHook",
    "CheckpointHook",
    "PreemptionHook",
    "Preempted",
    "PREEMPTED_EXIT_CODE",
    "Interrupted",
    "INTERRUPTED_EXIT_CODE",
    "Priority",
    "get_priority",
    "MessageHub",
    "HistoryBuffer",
    "BaseMetric",
    "Evaluator",
    "Accuracy",
    "MeanLoss",
    "build_evaluator",
    "ResumableSampler",
    "build_dataloader",
    "start_epoch",
    "seed_worker",
    "pseudo_collate",
]
