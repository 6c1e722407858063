"""A module that warns when imported, as mmcv-lite's ``mmcv.cnn.bricks.transformer`` does
(named in a config's ``custom_imports``: imported by the launcher's config check and by every
rank)."""

import warnings

MESSAGE = (
    "Fail to import ``MultiScaleDeformableAttention`` from ``mmcv.ops.multi_scale_deform_attn``"
    " (a stand-in: tests/warns_on_import.py)"
)
warnings.warn(MESSAGE, UserWarning, stacklevel=1)
