"""Learning-rate schedulers: the generic schedulers with ``param_name='lr'``.

Example::

    >>> import torch
    >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    >>> warmup = LinearLR(opt, start_factor=0.5, end=3, by_epoch=False)
    >>> round(opt.param_groups[0]['lr'], 4)
    0.05
"""

from __future__ import annotations

from typing import Any

from shardwise.registry import PARAM_SCHEDULERS

from .param_scheduler import (
    ConstantParamScheduler,
    CosineAnnealingParamScheduler,
    CosineRestartParamScheduler,
    ExponentialParamScheduler,
    LinearParamScheduler,
    MultiStepParamScheduler,
    OneCycleParamScheduler,
    PolyParamScheduler,
    ReduceOnPlateauParamScheduler,
    StepParamScheduler,
)

__all__ = [
    "LRSchedulerMixin",
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineRestartLR",
    "ExponentialLR",
    "LinearLR",
    "MultiStepLR",
    "OneCycleLR",
    "PolyLR",
    "ReduceOnPlateauLR",
    "StepLR",
]


class LRSchedulerMixin:
    """Fixes ``param_name='lr'``: ``XxxLR(optimizer, ...)`` is ``XxxParamScheduler(optimizer,
    'lr', ...)``."""

    def __init__(self, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, "lr", *args, **kwargs)  # type: ignore[call-arg]


@PARAM_SCHEDULERS.register_module()
class ConstantLR(LRSchedulerMixin, ConstantParamScheduler):
    """:class:`ConstantParamScheduler` on the learning rate."""


@PARAM_SCHEDULERS.register_module()
class CosineAnnealingLR(LRSchedulerMixin, CosineAnnealingParamScheduler):
    """:class:`CosineAnnealingParamScheduler` on the learning rate."""


@PARAM_SCHEDULERS.register_module()
class CosineRestartLR(LRSchedulerMixin, CosineRestartParamScheduler):
    """:class:`CosineRestartParamScheduler` on the learning rate."""


@PARAM_SCHEDULERS.register_module()
class ExponentialLR(LRSchedulerMixin, ExponentialParamScheduler):
    """:class:`ExponentialParamScheduler` on the learning rate."""


@PARAM_SCHEDULERS.register_module()
class LinearLR(LRSchedulerMixin, LinearParamScheduler):
    """:class:`LinearParamScheduler` on the learning rate (the usual warm-up)."""


@PARAM_SCHEDULERS.register_module()
class MultiStepLR(LRSchedulerMixin, MultiStepParamScheduler):
    """:class:`MultiStepParamScheduler` on the learning rate."""


@PARAM_SCHEDULERS.register_module()
class OneCycleLR(LRSchedulerMixin, OneCycleParamScheduler):
    """:class:`OneCycleParamScheduler` on the learning rate."""


@PARAM_SCHEDULERS.register_module()
class PolyLR(LRSchedulerMixin, PolyParamScheduler):
    """:class:`PolyParamScheduler` on the learning rate."""


@PARAM_SCHEDULERS.register_module()
class ReduceOnPlateauLR(LRSchedulerMixin, ReduceOnPlateauParamScheduler):
    """:class:`ReduceOnPlateauParamScheduler` on the learning rate."""


@PARAM_SCHEDULERS.register_module()
class StepLR(LRSchedulerMixin, StepParamScheduler):
    """:class:`StepParamScheduler` on the learning rate."""
