"""Optimizer wrappers, the optimizer constructor and parameter schedulers.

``ZeroRedundancyOptimizer`` is an attribute too, created at first use (see
:mod:`shardwise.optim.zero_optimizer`).
"""

from typing import Any

from shardwise.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIMIZERS

from . import scheduler as _scheduler
from . import zero_optimizer as _zero_optimizer
from .amp_optim_wrapper import AmpOptimWrapper
from .base import BaseOptimWrapper
from .constructor import (
    TORCH_OPTIMIZERS,
    DefaultOptimizerConstructor,
    DefaultOptimWrapperConstructor,
    build_optim_wrapper,
)
from .deepspeed_optim_wrapper import DeepSpeedOptimWrapper
from .optim_wrapper import OptimWrapper, clip_grad_norm_
from .optim_wrapper_dict import OptimWrapperDict
from .scheduler import *  # noqa: F401,F403

__all__ = [
    "BaseOptimWrapper",
    "OptimWrapper",
    "AmpOptimWrapper",
    "DeepSpeedOptimWrapper",
    "OptimWrapperDict",
    "DefaultOptimizerConstructor",
    "DefaultOptimWrapperConstructor",
    "build_optim_wrapper",
    "clip_grad_norm_",
    "TORCH_OPTIMIZERS",
    "OPTIMIZERS",  # the registries, where mmengine.optim has them too
    "OPTIM_WRAPPER_CONSTRUCTORS",
    *getattr(_scheduler, "__all__", []),
]


def __getattr__(name: str) -> Any:
    if name == "ZeroRedundancyOptimizer":
        return _zero_optimizer.ZeroRedundancyOptimizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
