#!/usr/bin/env bash
# mmdetection 3.3.0 and mmsegmentation 1.2.2 beside shardwise: mmcv 2.1.0 with its compiled CPU
# ops (tools/build_mmcv_ops.sh: built once into CACHE_DIR, installed in seconds), then the two
# packages and their requirements that mmengine's and mmpretrain's environment lacks, with
# --no-deps so that nothing else (torch, numpy, mmengine) moves.
#
#   PYTHON=.venv/bin/python bash tools/openmmlab_ops_env.sh      # into that python's venv, in
#                                                                # place of mmcv-lite (make mmcv-ops)
#   PYTHON=.venv/bin/python bash tools/openmmlab_ops_env.sh DIR  # into DIR, for PYTHONPATH=DIR
#                                                                # before mmcv-lite's folder (the tests)
#
# MMCV_CACHE (default ~/.cache/shardwise) holds the built wheel.
#
# With mmpretrain and transformers >= 5 both installed, `import mmdet.models` fails: mmdet imports
# mmpretrain where it can, and mmpretrain's multimodal models raise a TypeError on import with
# transformers 5. A config that trains an mmdet model there hides mmpretrain first, e.g.
# custom_imports = dict(imports=['tests.openmmlab_no_mmpretrain']) (sys.modules['mmpretrain'] =
# None: mmdet's `import mmpretrain` then raises the ImportError it expects).
set -euo pipefail
py=${PYTHON:-.venv/bin/python}
dir=${1:-}
cache=${MMCV_CACHE:-$HOME/.cache/shardwise}
# (six: mmdet's models; regex: mmseg's tokenizer; neither is in a venv `make openmmlab` made)
pins=(mmdet==3.3.0 mmsegmentation==1.2.2 pycocotools==2.0.11 shapely==2.2.0
  terminaltables==3.1.10 prettytable==3.19.0 ftfy==6.3.1 wcwidth==0.9.5 six==1.17.0
  regex==2026.12.2)

if [ -z "$dir" ]; then
  bash "$(dirname "$0")/build_mmcv_ops.sh" "$cache"
  "$py" -m pip install --quiet --no-deps "${pins[@]}"
else
  bash "$(dirname "$0")/build_mmcv_ops.sh" "$cache" "$dir"
  "$py" -m pip install --quiet --no-deps --upgrade --target "$dir" "${pins[@]}"
  export PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}"
fi

"$py" - <<'PY'
import sys

sys.modules["mmpretrain"] = None  # see above: mmdet then does without it
import torch
from mmdet.models import RetinaNet  # noqa: F401  (mmdet's models import mmcv.ops)
from mmseg.models import EncoderDecoder  # noqa: F401

import mmdet
import mmseg

print("openmmlab_ops_env: mmdet", mmdet.__version__, "and mmseg", mmseg.__version__, "on mmcv",
      __import__("mmcv").__version__, "(CPU ops), torch", torch.__version__, "ready")
PY
