"""The runner's hooks, under mmengine's names."""

from .checkpoint_hook import CheckpointHook
from .hook import Hook
from .iter_timer_hook import IterTimerHook
from .logger_hook import LoggerHook
from .param_scheduler_hook import ParamSchedulerHook
from .preemption_hook import PREEMPTED_EXIT_CODE, Preempted, PreemptionHook
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
]
