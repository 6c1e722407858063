"""The registries of a stand-in OpenMMLab package, as every OpenMMLab package makes them:
children of mmengine's root registries, scope ``'fakemm'``."""

from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import METRICS as MMENGINE_METRICS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMENGINE_CONSTRUCTORS
from mmengine.registry import PARAM_SCHEDULERS as MMENGINE_SCHEDULERS
from mmengine.registry import TRANSFORMS as MMENGINE_TRANSFORMS
from mmengine.registry import Registry

MODELS = Registry("model", parent=MMENGINE_MODELS, scope="fakemm", locations=["fakemm.parts"])
DATASETS = Registry("dataset", parent=MMENGINE_DATASETS, scope="fakemm", locations=["fakemm.parts"])
TRANSFORMS = Registry(
    "transform", parent=MMENGINE_TRANSFORMS, scope="fakemm", locations=["fakemm.parts"]
)
METRICS = Registry("metric", parent=MMENGINE_METRICS, scope="fakemm", locations=["fakemm.parts"])
HOOKS = Registry("hook", parent=MMENGINE_HOOKS, scope="fakemm", locations=["fakemm.parts"])
OPTIM_WRAPPER_CONSTRUCTORS = Registry(
    "optimizer wrapper constructor",
    parent=MMENGINE_CONSTRUCTORS,
    scope="fakemm",
    locations=["fakemm.parts"],
)
PARAM_SCHEDULERS = Registry(
    "parameter scheduler", parent=MMENGINE_SCHEDULERS, scope="fakemm", locations=["fakemm.parts"]
)
