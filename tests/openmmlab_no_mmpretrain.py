"""Hides mmpretrain from mmdetection, named in a config as
``custom_imports = dict(imports=['tests.openmmlab_no_mmpretrain'])``.

mmdet 3.3.0 imports mmpretrain where it can (``try: import mmpretrain``); with transformers >= 5
beside it, mmpretrain's multimodal models raise a ``TypeError`` on import, so ``import
mmdet.models`` fails. With ``sys.modules['mmpretrain'] = None`` that import raises the
``ImportError`` mmdet expects, and mmdet does without mmpretrain's backbones.
"""

import sys

if "mmpretrain" not in sys.modules:  # an mmpretrain imported already is left alone
    sys.modules["mmpretrain"] = None
