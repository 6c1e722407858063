#!/usr/bin/env bash
# mmcv 2.1.0 with its compiled CPU ops (mmcv._ext), which mmdetection 3.3.0, mmsegmentation 1.2.2,
# mmpose and mmocr import to build their models; mmcv-lite has no ops and mmdet/mmseg refuse mmcv
# 2.2.0. PyPI has only mmcv's source. The wheel is built once, for the torch and python of PYTHON,
# into CACHE_DIR (outside the repository), then installed into PYTHON's environment in place of
# mmcv-lite. The build compiles 77 files, 23 minutes of one core's time (54 minutes on 2 shared,
# busy cores with MAX_JOBS=1 and nice -n 19, 2026-12-06); installing a cached wheel takes seconds.
#
#   PYTHON=.venv/bin/python bash tools/build_mmcv_ops.sh [CACHE_DIR]        # build if absent, install
#   PYTHON=.venv/bin/python bash tools/build_mmcv_ops.sh CACHE_DIR DIR      # into DIR, for PYTHONPATH=DIR
#                                                                           # before mmcv-lite's folder
#   INSTALL=0 PYTHON=... bash tools/build_mmcv_ops.sh [CACHE_DIR]            # build if absent, print the wheel
#
# MAX_JOBS (default 1) and NICE (default 19) set the compile's parallelism and priority.
#
# CACHE_DIR defaults to ~/.cache/shardwise; the wheel lies in
# CACHE_DIR/mmcv-2.1.0-torch<torch version>-<cpXY>/. Why it is built this way:
# - without build isolation, so that it compiles against the torch that is installed (pip's isolated
#   build has no torch, and fails first on `pkg_resources`, which mmcv's setup.py imports and
#   setuptools >= 70 no longer has): a throw-away venv with setuptools 65.5.0 and wheel
#   0.48.0 that sees PYTHON's packages (torch) through a .pth file;
# - CPU only: MMCV_WITH_OPS=1, FORCE_CUDA=0 and no visible GPU (mmcv's setup.py builds the CUDA
#   ops whenever torch.cuda.is_available());
# - mmcv compiles with -std=c++17, torch 2.13's headers ask for C++20: g++ 12 compiles them with
#   warnings (-Wc++20-extensions) only.
set -euo pipefail
py=${PYTHON:-.venv/bin/python}
cache=${1:-$HOME/.cache/shardwise}
target=${2:-}
version=2.1.0

torch_version=$("$py" -c 'import torch; print(torch.__version__)')
pytag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
dir="$cache/mmcv-$version-torch$torch_version-$pytag"
wheel=$(ls "$dir"/mmcv-$version-*.whl 2>/dev/null | head -n 1 || true)

if [ -z "$wheel" ]; then
  echo "build_mmcv_ops: building mmcv $version's CPU ops for torch $torch_version ($pytag) into $dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$py" -m venv "$tmp/venv"
  bpy="$tmp/venv/bin/python"
  # PYTHON's packages (torch), after the build venv's own setuptools
  echo "$site" > "$("$bpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_target.pth"
  "$bpy" -m pip install --quiet setuptools==65.5.0 wheel==0.48.0
  "$bpy" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
    "mmcv==$version" -d "$tmp"
  tar -xzf "$tmp/mmcv-$version.tar.gz" -C "$tmp"
  start=$(date +%s)
  (cd "$tmp/mmcv-$version" &&
    MMCV_WITH_OPS=1 FORCE_CUDA=0 CUDA_VISIBLE_DEVICES= MAX_JOBS=${MAX_JOBS:-1} \
      nice -n "${NICE:-19}" "$bpy" -m pip wheel --quiet --no-build-isolation --no-deps \
      -w "$tmp/wheel" .)
  mkdir -p "$dir"
  built=$(ls "$tmp"/wheel/mmcv-$version-*.whl)
  cp "$built" "$dir/.$(basename "$built").part"
  mv "$dir/.$(basename "$built").part" "$dir/$(basename "$built")"  # never a half-written wheel
  wheel="$dir/$(basename "$built")"
  echo "build_mmcv_ops: built $wheel in $(( $(date +%s) - start )) s"
fi

if [ "${INSTALL:-1}" = 0 ]; then
  echo "$wheel"
  exit 0
fi
if [ -n "$target" ]; then
  "$py" -m pip install --quiet --no-deps --upgrade --target "$target" "$wheel"
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
else
  # mmcv-lite installs the same `mmcv` package: removed first, so no file of 2.2.0 stays behind
  if "$py" -m pip show --quiet mmcv-lite >/dev/null 2>&1; then
    "$py" -m pip uninstall --quiet --yes mmcv-lite
  fi
  # every file again (uninstalling mmcv-lite also takes the files the two share), then mmcv's
  # requirements where missing (they are mmcv-lite's: mmengine, opencv, ...)
  "$py" -m pip install --quiet --no-deps --force-reinstall "$wheel"
  "$py" -m pip install --quiet "$wheel"
fi
"$py" - <<'PY'
import torch
from mmcv.ops import nms, roi_align
boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]], dtype=torch.float32)
_, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
assert keep.tolist() == [0, 2], keep
out = roi_align(torch.ones(1, 1, 8, 8), torch.tensor([[0.0, 0, 0, 4, 4]]), (2, 2), 1.0, 0)
assert torch.allclose(out, torch.ones(1, 1, 2, 2)), out
print("build_mmcv_ops: mmcv", __import__("mmcv").__version__, "with its CPU ops, torch",
      torch.__version__, "ready")
PY
