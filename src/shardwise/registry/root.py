"""shardwise's root registries. New registries go here (one line each, with the build function
and the ``locations`` that register into them), and their names into the import and
``__all__`` of ``shardwise/registry/__init__.py``.

``locations`` are modules imported by name the first time a registry is looked up (so that
``OPTIMIZERS.get('AdamW')`` works without importing ``shardwise.optim`` first); they are not
imports of this module, which imports nothing above the registry package.

``fallback`` names the registry of the same kind in mmengine's tree, where OpenMMLab packages
register their classes (:mod:`shardwise.integrations.openmmlab`): every registry a run builds
from has one. Strategies, model wrappers, optimizer wrappers and runners have none: shardwise's
own drive the run; nor have backends: shardwise's visualizer takes shardwise's, and a package's
visualizer (mmengine's) builds its own from mmengine's registry. ``TRANSFORMS``,
``DATA_SAMPLERS``, ``WEIGHT_INITIALIZERS``, ``EVALUATOR`` and ``TASK_UTILS`` hold nothing of
shardwise's: they give mmengine's names a home here.
"""

from __future__ import annotations

from .build_functions import build_model_from_cfg, build_runner_from_cfg, build_scheduler_from_cfg
from .registry import Registry

RUNNERS = Registry("runner", build_func=build_runner_from_cfg, locations=["shardwise.runner"])
MODELS = Registry("model", build_func=build_model_from_cfg, fallback="MODELS")
OPTIMIZERS = Registry(  # with torch.optim's
    "optimizer", locations=["shardwise.optim"], fallback="OPTIMIZERS"
)
OPTIM_WRAPPERS = Registry("optim_wrapper", locations=["shardwise.optim"])
OPTIM_WRAPPER_CONSTRUCTORS = Registry(
    "optim_wrapper_constructor",
    locations=["shardwise.optim"],
    fallback="OPTIM_WRAPPER_CONSTRUCTORS",
)
PARAM_SCHEDULERS = Registry(
    "param_scheduler",
    build_func=build_scheduler_from_cfg,
    locations=["shardwise.optim"],
    fallback="PARAM_SCHEDULERS",
)
STRATEGIES = Registry("strategy", locations=["shardwise.strategies"])
MODEL_WRAPPERS = Registry("model_wrapper", locations=["shardwise.strategies"])
FUNCTIONS = Registry("function", locations=["shardwise.runner"], fallback="FUNCTIONS")
HOOKS = Registry("hook", locations=["shardwise.runner"], fallback="HOOKS")
DATASETS = Registry("dataset", fallback="DATASETS")
DATA_SAMPLERS = Registry("data sampler", fallback="DATA_SAMPLERS")
TRANSFORMS = Registry("transform", fallback="TRANSFORMS")
WEIGHT_INITIALIZERS = Registry("weight initializer", fallback="WEIGHT_INITIALIZERS")
TASK_UTILS = Registry("task util", fallback="TASK_UTILS")
LOOPS = Registry("loop", locations=["shardwise.runner"], fallback="LOOPS")
METRICS = Registry("metric", locations=["shardwise.runner"], fallback="METRICS")
EVALUATOR = Registry("evaluator", locations=["shardwise.runner"], fallback="EVALUATOR")
VISBACKENDS = Registry("vis_backend", locations=["shardwise.visualization"])
VISUALIZERS = Registry("visualizer", locations=["shardwise.visualization"], fallback="VISUALIZERS")
LOG_PROCESSORS = Registry(
    "log_processor", locations=["shardwise.runner"], fallback="LOG_PROCESSORS"
)
