"""Optimizer wrappers, the optimizer constructor and parameter schedulers."""

from . import scheduler as _scheduler
from .amp_optim_wrapper import AmpOptimWrapper
from .constructor import (
    DefaultOptimizerConstructor,
    DefaultOptimWrapperConstructor,
    build_optim_wrapper,
)
from .optim_wrapper import OptimWrapper, clip_grad_norm_
from .optim_wrapper_dict import OptimWrapperDict
from .scheduler import *  # noqa: F401,F403

__all__ = [
    "OptimWrapper",
    "AmpOptimWrapper",
    "OptimWrapperDict",
    "DefaultOptimizerConstructor",
    "DefaultOptimWrapperConstructor",
    "build_optim_wrapper",
    "clip_grad_norm_",
    *getattr(_scheduler, "__all__", []),
]
