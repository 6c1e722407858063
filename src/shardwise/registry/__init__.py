"""Registries: configuration as data (``dict(type=...)``) resolved to objects, as in mmengine.

Example::

    >>> from shardwise.registry import OPTIMIZERS
    >>> import torch
    >>> opt = OPTIMIZERS.build(dict(type='SGD', lr=0.1),
    ...                        default_args=dict(params=[torch.zeros(1, requires_grad=True)]))
    >>> type(opt).__name__
    'SGD'

A ``type`` may be a class (or any callable), a name registered in the registry, a name with a
scope prefix (``'mmdet.ResNet'``: looked up in the registry of that scope in the same tree), or
a dotted import path such as ``'torch.optim.AdamW'``; with mmengine installed, also a class an
OpenMMLab package registers in mmengine's tree (under the config's ``default_scope``, or as
``'mmpretrain.ImageClassifier'``; see :mod:`shardwise.integrations.openmmlab`). Registries form
trees: a child
(``Registry('model', parent=MODELS, scope='myproj')``) finds its parent's names, and the
:class:`DefaultScope` (or a config's ``_scope_`` key) picks the registry a build resolves names
in.

The package is laid out as mmengine's: ``registry.py`` (the :class:`Registry` class),
``build_functions.py`` (``build_from_cfg`` and the other build functions), ``root.py`` (the
root registries: new registries go there), ``default_scope.py`` and ``utils.py``. It imports
nothing of shardwise but :mod:`shardwise.config`.
"""

from .build_functions import (
    build_from_cfg,
    build_model_from_cfg,
    build_runner_from_cfg,
    build_scheduler_from_cfg,
)
from .default_scope import DefaultScope
from .registry import Registry
from .root import (
    DATA_SAMPLERS,
    DATASETS,
    EVALUATOR,
    FUNCTIONS,
    HOOKS,
    LOG_PROCESSORS,
    LOOPS,
    METRICS,
    MODEL_WRAPPERS,
    MODELS,
    OPTIM_WRAPPER_CONSTRUCTORS,
    OPTIM_WRAPPERS,
    OPTIMIZERS,
    PARAM_SCHEDULERS,
    RUNNERS,
    STRATEGIES,
    TASK_UTILS,
    TRANSFORMS,
    VISBACKENDS,
    VISUALIZERS,
    WEIGHT_INITIALIZERS,
)
from .utils import init_default_scope

__all__ = [
    "Registry",
    "DefaultScope",
    "init_default_scope",
    "build_from_cfg",
    "build_model_from_cfg",
    "build_runner_from_cfg",
    "build_scheduler_from_cfg",
    "RUNNERS",
    "MODELS",
    "OPTIMIZERS",
    "OPTIM_WRAPPERS",
    "OPTIM_WRAPPER_CONSTRUCTORS",
    "PARAM_SCHEDULERS",
    "STRATEGIES",
    "MODEL_WRAPPERS",
    "FUNCTIONS",
    "HOOKS",
    "DATASETS",
    "LOOPS",
    "METRICS",
    "VISBACKENDS",
    "VISUALIZERS",
    "LOG_PROCESSORS",
    "DATA_SAMPLERS",
    "TRANSFORMS",
    "WEIGHT_INITIALIZERS",
    "TASK_UTILS",
    "EVALUATOR",
]
