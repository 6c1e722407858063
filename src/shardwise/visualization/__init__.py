"""Experiment trackers: mmengine's ``visualizer=dict(type='Visualizer', vis_backends=[...])``
for scalars and the config. Importing this package registers ``Visualizer`` in
``VISUALIZERS`` and the backends in ``VISBACKENDS`` under mmengine's names; a tracker's
library is imported only when its backend starts.
"""

from .vis_backend import (
    BaseVisBackend,
    LocalVisBackend,
    MLflowVisBackend,
    TensorboardVisBackend,
    WandbVisBackend,
)
from .visualizer import Visualizer, build_vis_backend, check_vis_backends, tracked_scalars

__all__ = [
    "Visualizer",
    "BaseVisBackend",
    "LocalVisBackend",
    "TensorboardVisBackend",
    "WandbVisBackend",
    "MLflowVisBackend",
    "build_vis_backend",
    "check_vis_backends",
    "tracked_scalars",
]
