"""Optimizer wrappers, the optimizer constructor and parameter schedulers."""

from .scheduler import *  # noqa: F401,F403
