"""The runner's hooks, under mmengine's names."""

from .checkpoint_hook import CheckpointHook
from .hook import Hook
from .iter_timer_hook import IterTimerHook
from .logger_hook import LoggerHook
from .param_scheduler_hook import ParamSchedulerHook
from .preemption_hook import (
    INTERRUPTED_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    Interrupted,
    Preempted,
    PreemptionHook,
)
from .runtime_info_hook import RuntimeInfoHook
from .sampler_seed_hook import DistSamplerSeedHook

__all__ = [
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
]
