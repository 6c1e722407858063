"""Parameter schedulers (mmengine-compatible): learning rate, momentum, any param-group key.

Example::

    >>> import torch
    >>> from shardwise.optim.scheduler import build_param_scheduler
    >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9)
    >>> warmup, decay = build_param_scheduler(
    ...     [dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    ...      dict(type='CosineAnnealingLR', by_epoch=False, begin=100, end=1000)], opt)
"""

from .builder import build_param_scheduler
from .lr_scheduler import (
    ConstantLR,
    CosineAnnealingLR,
    CosineRestartLR,
    ExponentialLR,
    LinearLR,
    MultiStepLR,
    OneCycleLR,
    PolyLR,
    ReduceOnPlateauLR,
    StepLR,
)
from .momentum_scheduler import (
    ConstantMomentum,
    CosineAnnealingMomentum,
    CosineRestartMomentum,
    ExponentialMomentum,
    LinearMomentum,
    MultiStepMomentum,
    PolyMomentum,
    ReduceOnPlateauMomentum,
    StepMomentum,
)
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
    _ParamScheduler,
)

__all__ = [
    "build_param_scheduler",
    "_ParamScheduler",
    "ConstantParamScheduler",
    "CosineAnnealingParamScheduler",
    "CosineRestartParamScheduler",
    "ExponentialParamScheduler",
    "LinearParamScheduler",
    "MultiStepParamScheduler",
    "OneCycleParamScheduler",
    "PolyParamScheduler",
    "ReduceOnPlateauParamScheduler",
    "StepParamScheduler",
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
