#!/usr/bin/env bash
# OpenMMLab beside shardwise: mmengine 0.10.7, mmpretrain 1.2.0, mmcv-lite 2.2.0 (mmcv without its
# compiled ops: PyPI has only the full mmcv 2.2.0's source, whose build fails on torch 2.13) and
# torchvision 0.28.0 (torch 2.13's), from PyPI; the installed torch is kept as it is.
#
#   PYTHON=.venv/bin/python bash tools/openmmlab_env.sh      # into that python's venv (make openmmlab)
#   PYTHON=.venv/bin/python bash tools/openmmlab_env.sh DIR  # into DIR, for PYTHONPATH=DIR (the
#                                                            # tests; mmengine installed already)
#
# torchvision's compiled ops must match torch's build. Where they do not (PyPI's only torchvision
# 0.28.0 for Linux is a CUDA build; torch here is the CPU build), its extension cannot load and
# `import torchvision` then fails registering fake kernels for ops that were never loaded
# (`operator torchvision::nms does not exist`). mmpretrain imports torchvision but its models use
# no torchvision op, so there the extension is removed and its fake-kernel module emptied.
# Then mmpretrain builds a ResNet-18 and runs it once, or the script fails.
set -euo pipefail
py=${PYTHON:-.venv/bin/python}
dir=${1:-}
pins=(mmcv-lite==2.2.0 mmpretrain==1.2.0 torchvision==0.28.0)

if [ -z "$dir" ]; then
  # the torch that is installed, pinned: torchvision must not bring another one
  torch_pin="torch==$("$py" -c 'import torch; print(torch.__version__)')"
  "$py" -m pip install --quiet mmengine==0.10.7 "${pins[@]}" "$torch_pin"
else
  # mmpretrain's and mmcv-lite's own requirements that the venv lacks, listed: --no-deps
  "$py" -m pip install --quiet --no-deps --target "$dir" "${pins[@]}" \
    model-index==0.1.11 modelindex==0.0.2 ordered-set==4.1.0 einops==0.8.2 mat4py==0.6.0
  export PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}"
fi

if ! error=$("$py" -c 'import torchvision' 2>&1); then
  case "$error" in
    *"torchvision::"*) ;;  # its compiled ops did not load: another build than torch's
    *) echo "$error" >&2; exit 1 ;;
  esac
  tv_dir=$("$py" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torchvision").origin))')
  builds=$("$py" -c 'import torch; print("torch", torch.__version__)')
  echo "openmmlab_env: torchvision $(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$tv_dir/version.py")" \
    "does not load beside $builds: removing its compiled ops (mmpretrain's models use none)"
  rm -f "$tv_dir/_C.so"
  echo "# emptied: torchvision's compiled ops do not match torch's build (tools/openmmlab_env.sh)" \
    > "$tv_dir/_meta_registrations.py"
fi

"$py" - <<'PY'
import torch
from mmpretrain import get_model
model = get_model("resnet18_8xb32_in1k")
out = model(torch.randn(1, 3, 32, 32), mode="tensor")
assert out.shape == (1, 1000), out.shape
print("openmmlab_env: mmpretrain", __import__("mmpretrain").__version__, "on mmcv-lite",
      __import__("mmcv").__version__, "and mmengine", __import__("mmengine").__version__, "ready")
PY
