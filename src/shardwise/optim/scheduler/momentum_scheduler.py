"""Momentum schedulers: the generic schedulers with ``param_name='momentum'``.

On optimizers with a ``momentum`` hyper-parameter (SGD, RMSprop) the group's ``momentum`` is
scheduled; on Adam-type optimizers (``betas``) ``betas[0]`` is: a ``momentum`` entry mirroring
it is added to every param group, scheduled, and written back into ``betas`` after each step,
as mmengine does.

Example::

    >>> import torch
    >>> opt = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], betas=(0.9, 0.999))
    >>> sched = ConstantMomentum(opt, factor=0.5, end=2)
    >>> opt.param_groups[0]['betas']
    (0.45, 0.999)
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
    PolyParamScheduler,
    ReduceOnPlateauParamScheduler,
    StepParamScheduler,
    unwrap_optimizer,
)

__all__ = [
    "MomentumSchedulerMixin",
    "ConstantMomentum",
    "CosineAnnealingMomentum",
    "CosineRestartMomentum",
    "ExponentialMomentum",
    "LinearMomentum",
    "MultiStepMomentum",
    "PolyMomentum",
    "ReduceOnPlateauMomentum",
    "StepMomentum",
]


class MomentumSchedulerMixin:
    """Fixes ``param_name='momentum'`` and maps it to ``betas[0]`` on Adam-type optimizers."""

    optimizer: Any
    use_betas: bool

    def __init__(self, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, "momentum", *args, **kwargs)  # type: ignore[call-arg]

    def _prepare_param_groups(self) -> None:
        torch_optimizer = unwrap_optimizer(self.optimizer)
        defaults = torch_optimizer.defaults
        if "momentum" in defaults:
            self.use_betas = False
        elif "betas" in defaults:
            self.use_betas = True
            for group in self.optimizer.param_groups:
                group["momentum"] = group["betas"][0]
        else:
            raise ValueError(
                f"{type(self).__name__} schedules momentum, but {type(torch_optimizer).__name__} "
                f"has neither 'momentum' nor 'betas' among its hyper-parameters "
                f"{sorted(defaults)}; use an optimizer with momentum (SGD, RMSprop) or betas "
                f"(Adam, AdamW), or a *ParamScheduler with param_name set to the key to schedule"
            )
        super()._prepare_param_groups()  # type: ignore[misc]

    def step(self, *args: Any, **kwargs: Any) -> None:
        super().step(*args, **kwargs)  # type: ignore[misc]
        if self.use_betas:
            for group in self.optimizer.param_groups:
                group["betas"] = (group["momentum"], *group["betas"][1:])


@PARAM_SCHEDULERS.register_module()
class ConstantMomentum(MomentumSchedulerMixin, ConstantParamScheduler):
    """:class:`ConstantParamScheduler` on the momentum."""


@PARAM_SCHEDULERS.register_module()
class CosineAnnealingMomentum(MomentumSchedulerMixin, CosineAnnealingParamScheduler):
    """:class:`CosineAnnealingParamScheduler` on the momentum."""


@PARAM_SCHEDULERS.register_module()
class CosineRestartMomentum(MomentumSchedulerMixin, CosineRestartParamScheduler):
    """:class:`CosineRestartParamScheduler` on the momentum."""


@PARAM_SCHEDULERS.register_module()
class ExponentialMomentum(MomentumSchedulerMixin, ExponentialParamScheduler):
    """:class:`ExponentialParamScheduler` on the momentum."""


@PARAM_SCHEDULERS.register_module()
class LinearMomentum(MomentumSchedulerMixin, LinearParamScheduler):
    """:class:`LinearParamScheduler` on the momentum."""


@PARAM_SCHEDULERS.register_module()
class MultiStepMomentum(MomentumSchedulerMixin, MultiStepParamScheduler):
    """:class:`MultiStepParamScheduler` on the momentum."""


@PARAM_SCHEDULERS.register_module()
class PolyMomentum(MomentumSchedulerMixin, PolyParamScheduler):
    """:class:`PolyParamScheduler` on the momentum."""


@PARAM_SCHEDULERS.register_module()
class ReduceOnPlateauMomentum(MomentumSchedulerMixin, ReduceOnPlateauParamScheduler):
    """:class:`ReduceOnPlateauParamScheduler` on the momentum."""


@PARAM_SCHEDULERS.register_module()
class StepMomentum(MomentumSchedulerMixin, StepParamScheduler):
    """:class:`StepParamScheduler` on the momentum."""
