"""shardwise's root registries. New registries go here (one line each, with the build function
and the ``locations`` that register into them), and their names into the import and
``__all__`` of ``shardwise/registry/__init__.py``.

``locations`` are modules imported by name the first time a registry is looked up (so that
``OPTIMIZERS.get('AdamW')`` works without importing ``shardwise.optim`` first); they are not
imports of this module, which imports nothing above the registry package.
"""

from __future__ import annotations

from .build_functions import build_model_from_cfg, build_runner_from_cfg, build_scheduler_from_cfg
from .registry import Registry

RUNNERS = Registry("runner", build_func=build_runner_from_cfg, locations=["shardwise.runner"])
MODELS = Registry("model", build_func=build_model_from_cfg)
OPTIMIZERS = Registry("optimizer", locations=["shardwise.optim"])  # with torch.optim's
OPTIM_WRAPPERS = Registry("optim_wrapper", locations=["shardwise.optim"])
OPTIM_WRAPPER_CONSTRUCTORS = Registry("optim_wrapper_constructor", locations=["shardwise.optim"])
PARAM_SCHEDULERS = Registry(
    "param_scheduler", build_func=build_scheduler_from_cfg, locations=["shardwise.optim"]
)
STRATEGIES = Registry("strategy", locations=["shardwise.strategies"])
MODEL_WRAPPERS = Registry("model_wrapper", locations=["shardwise.strategies"])
FUNCTIONS = Registry("function")
HOOKS = Registry("hook", locations=["shardwise.runner"])
DATASETS = Registry("dataset")
LOOPS = Registry("loop", locations=["shardwise.runner"])
METRICS = Registry("metric", locations=["shardwise.runner"])
VISBACKENDS = Registry("vis_backend", locations=["shardwise.visualization"])
VISUALIZERS = Registry("visualizer", locations=["shardwise.visualization"])
LOG_PROCESSORS = Registry("log_processor", locations=["shardwise.runner"])
