"""Parity with mmengine's Runner on mmdetection 3.3.0 and mmsegmentation 1.2.2 configs, whose
models need mmcv's compiled ops: mmcv 2.1.0 built once by ``tools/build_mmcv_ops.sh`` into a
cache outside the repository, installed with the two packages by ``tools/openmmlab_ops_env.sh``
(``make mmcv-ops``'s script) into ``.openmmlab/env-ops``, before mmpretrain's
``.openmmlab/env`` on ``PYTHONPATH``.

Slow suite (skipped without the cached mmcv wheel or the packages, failing instead under
``CI``). Each child config trains on one process with mmengine's Runner and with ``shardwise
train`` (the same seed, tiny generated images, no worker processes): the same starting weights,
every iteration's loss to 1e-5, the same validation metrics and final weights; then ``shardwise
train --resume`` from the first checkpoint gives the remaining losses and the final weights bit
for bit.

- RetinaNet R-18 (mmdet): a COCO-JSON dataset of coloured rectangles, 2 epochs, validation with
  ``CocoMetric`` after each.
- FCN R-18-D8 (mmseg): label maps of the same rectangles, ``IterBasedTrainLoop`` with
  ``InfiniteSampler`` over more iterations than one pass of the data, validation with
  ``IoUMetric`` at the checkpoints.
- RetinaNet R-18 with its base's ``AspectRatioBatchSampler`` kept: expected to fail (strict)
  while shardwise refuses a dataloader's ``batch_sampler``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.openmmlab_support import (
    ENV_DIR,
    REPO,
    Record,
    build_env,
    build_folder,
    train_with_mmengine,
    train_with_shardwise,
    unavailable,
)

pytest.importorskip("mmengine", reason="mmengine's Runner is the oracle")

LOSS_TOLERANCE = 1e-5
OPS_DIR = REPO / ".openmmlab" / "env-ops"
OPS_TOOL = REPO / "tools" / "openmmlab_ops_env.sh"
MMCV_TOOL = REPO / "tools" / "build_mmcv_ops.sh"
SIZE = 64
#: the rectangles' classes and colours (RGB)
COLOURS = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (50, 70, 230)}

_HEAD = """
custom_imports = dict(imports=['tests.openmmlab_no_mmpretrain'], allow_failed_imports=False)
randomness = dict(seed=0)
custom_hooks = [dict(type='tests.openmmlab_hooks.RecordHook', out='{out}')]
"""

#: RetinaNet R-18 on a COCO-JSON folder: 8 training images in batches of 2, 2 epochs,
#: validation after each; every prediction kept (score_thr=0.0), so that the mAP is measured
#: on the untrained model's boxes rather than on none.
RETINANET = """
_base_ = '{ops}/mmdet/.mim/configs/retinanet/retinanet_r18_fpn_1x_coco.py'
model = dict(
    backbone=dict(init_cfg=None),  # no download: the weights are drawn from the seed
    bbox_head=dict(num_classes=3),
    test_cfg=dict(score_thr=0.0))
metainfo = dict(classes=('red', 'green', 'blue'))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(64, 64), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(64, 64), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
# the base's AspectRatioBatchSampler is left out (_delete_): shardwise builds no batch_sampler
train_dataloader = dict(
    _delete_=True, batch_size=2, num_workers=0, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='CocoDataset', data_root='{data}', ann_file='train.json',
                 data_prefix=dict(img='train/'), metainfo=metainfo,
                 filter_cfg=dict(filter_empty_gt=True, min_size=8), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root='{data}', ann_file='val.json', data_prefix=dict(img='val/'),
                 metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file='{data}/val.json')
test_evaluator = val_evaluator
train_cfg = dict(max_epochs=2, val_interval=1)
"""

#: FCN R-18-D8 on a BaseSegDataset folder: 8 training images in batches of 2 from mmseg's
#: InfiniteSampler, 6 iterations (one pass and a half), validation and a checkpoint every 3.
FCN = """
_base_ = '{ops}/mmseg/.mim/configs/fcn/fcn_r18-d8_4xb2-80k_cityscapes-512x1024.py'
crop_size = (64, 64)
norm_cfg = dict(type='BN', requires_grad=True)  # one process: BN in place of SyncBN
model = dict(
    pretrained=None,  # no download: the weights are drawn from the seed
    data_preprocessor=dict(size=crop_size),
    backbone=dict(norm_cfg=norm_cfg),
    decode_head=dict(num_classes=3, norm_cfg=norm_cfg),
    auxiliary_head=dict(num_classes=3, norm_cfg=norm_cfg))
metainfo = dict(classes=('background', 'red', 'green'),
                palette=[[0, 0, 0], [220, 40, 40], [40, 200, 60]])
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomResize', scale=(96, 64), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(64, 64), keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='BaseSegDataset', data_root='{data}', metainfo=metainfo,
                 data_prefix=dict(img_path='img/train', seg_map_path='ann/train'),
                 img_suffix='.png', seg_map_suffix='.png', pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='BaseSegDataset', data_root='{data}', metainfo=metainfo,
                 data_prefix=dict(img_path='img/val', seg_map_path='ann/val'),
                 img_suffix='.png', seg_map_suffix='.png', pipeline=test_pipeline))
test_dataloader = val_dataloader
train_cfg = dict(max_iters=6, val_interval=3)
default_hooks = dict(checkpoint=dict(interval=3))
"""


@dataclass(frozen=True)
class Case:
    """A child config and what its run leaves: ``iterations`` losses, the checkpoints
    ``first`` (resumed from) and ``last``, ``first`` after ``resumed_at`` iterations."""

    config: str
    data: str  # the fixture that writes its data
    iterations: int
    first: str
    last: str
    resumed_at: int


#: The RetinaNet child with the base's training loader kept: its ``AspectRatioBatchSampler``
#: (every mmdet dataset config of the corpus's kind sets one) groups the images by aspect ratio.
RETINANET_ASPECT_RATIO_BATCHES = (
    RETINANET.replace("_delete_=True, batch_size=2", "batch_size=2")
    .replace("    sampler=dict(type='DefaultSampler', shuffle=True),\n", "")
    .replace("is left out (_delete_): shardwise builds no batch_sampler", "is kept")
)

CASES = {
    "retinanet_r18": Case(RETINANET, "coco_folder", 8, "epoch_1.pth", "epoch_2.pth", 4),
    "fcn_r18": Case(FCN, "segmentation_folder", 6, "iter_3.pth", "iter_6.pth", 3),
    "retinanet_r18_aspect_ratio_batches": Case(
        RETINANET_ASPECT_RATIO_BATCHES, "coco_folder", 8, "epoch_1.pth", "epoch_2.pth", 4
    ),
}
#: Cases shardwise does not pass yet, with what was measured.
XFAIL = {
    "retinanet_r18_aspect_ratio_batches": (
        "shardwise refuses train_dataloader.batch_sampler in one line at the config check "
        "(shardwise.runner.data.check_dataloader_cfg) that mmdet's dataset configs set to "
        "AspectRatioBatchSampler; mmengine's Runner builds it around the sampler"
    ),
}


def _mmcv_wheel_cached() -> bool:
    """Whether ``tools/build_mmcv_ops.sh``'s cache holds mmcv's wheel for this torch and
    python (without it, the tool compiles mmcv for 25 to 55 minutes)."""
    cache = Path(os.environ.get("MMCV_CACHE", Path.home() / ".cache" / "shardwise"))
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return any((cache / f"mmcv-2.1.0-torch{torch.__version__}-{tag}").glob("mmcv-2.1.0-*.whl"))


@pytest.fixture(scope="session")
def ops_env() -> list[Path]:
    """``.openmmlab/env-ops`` (mmcv with its ops, mmdet, mmseg) before ``.openmmlab/env``
    (mmpretrain, torchvision), for ``PYTHONPATH``."""
    env_dir, reason = build_env()
    if env_dir is None:
        unavailable(reason)
    if not _mmcv_wheel_cached():
        unavailable(
            "mmcv 2.1.0's wheel is not cached for this torch: `make mmcv-ops` builds it once "
            "(tools/build_mmcv_ops.sh, 25 to 55 minutes)"
        )
    ops_dir, reason = build_folder(OPS_DIR, OPS_TOOL, MMCV_TOOL, what="mmdet and mmseg")
    if ops_dir is None:
        unavailable(reason)
    return [ops_dir, ENV_DIR]


def _rectangles(rng: np.random.Generator, count: int) -> tuple[np.ndarray, list]:
    """A noisy ``SIZE`` x ``SIZE`` RGB image with ``count`` coloured rectangles, and their
    ``(class index, x, y, width, height)``."""
    pixels = rng.integers(0, 60, (SIZE, SIZE, 3)).astype(np.uint8)
    boxes = []
    for _ in range(count):
        c = int(rng.integers(len(COLOURS)))
        w, h = (int(v) for v in rng.integers(12, 36, 2))
        x, y = int(rng.integers(0, SIZE - w)), int(rng.integers(0, SIZE - h))
        pixels[y : y + h, x : x + w] = list(COLOURS.values())[c]
        boxes.append((c, x, y, w, h))
    return pixels, boxes


@pytest.fixture(scope="session")
def coco_folder(tmp_path_factory) -> Path:
    """``{train,val}/{i}.png`` and ``{train,val}.json`` (COCO's format): 8 and 4 images with
    1 or 2 rectangles each, boxed."""
    from PIL import Image

    root = tmp_path_factory.mktemp("coco")
    rng = np.random.default_rng(0)
    categories = [dict(id=c + 1, name=name) for c, name in enumerate(COLOURS)]
    for split, count in (("train", 8), ("val", 4)):
        (root / split).mkdir()
        images, annotations = [], []
        for i in range(count):
            pixels, boxes = _rectangles(rng, int(rng.integers(1, 3)))
            Image.fromarray(pixels).save(root / split / f"{i}.png")
            images.append(dict(id=i + 1, file_name=f"{i}.png", width=SIZE, height=SIZE))
            for c, x, y, w, h in boxes:
                annotations.append(
                    dict(id=len(annotations) + 1, image_id=i + 1, category_id=c + 1,
                         bbox=[x, y, w, h], area=w * h, iscrowd=0)
                )  # fmt: skip
        coco = dict(images=images, annotations=annotations, categories=categories)
        (root / f"{split}.json").write_text(json.dumps(coco))
    return root


@pytest.fixture(scope="session")
def segmentation_folder(tmp_path_factory) -> Path:
    """``img/{train,val}/{i}.png`` and their label maps ``ann/{train,val}/{i}.png``: 8 and 4
    images with 1 or 2 red or green rectangles (classes 1 and 2) on background (0)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("segmentation")
    rng = np.random.default_rng(1)
    for split, count in (("train", 8), ("val", 4)):
        (root / "img" / split).mkdir(parents=True)
        (root / "ann" / split).mkdir(parents=True)
        for i in range(count):
            pixels, boxes = _rectangles(rng, int(rng.integers(1, 3)))
            labels = np.zeros((SIZE, SIZE), np.uint8)
            for c, x, y, w, h in boxes:
                if c == 2:  # blue: background here (two classes besides it)
                    continue
                labels[y : y + h, x : x + w] = c + 1
            Image.fromarray(pixels).save(root / "img" / split / f"{i}.png")
            Image.fromarray(labels).save(root / "ann" / split / f"{i}.png")
    return root


def write_child(case: Case, folder: Path, data: Path, out: Path, name: str) -> Path:
    """``case``'s child config as ``folder/{name}.py``, recording into ``out``
    (:class:`tests.openmmlab_hooks.RecordHook`)."""
    path = folder / f"{name}.py"
    path.write_text(case.config.format(ops=OPS_DIR, data=data) + _HEAD.format(out=out))
    return path


def _weights(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def _max_difference(a: dict, b: dict) -> float:
    return max(
        (float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()),
        default=0.0,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=XFAIL[k])) if k in XFAIL else k
        for k in CASES
    ],
)
def test_a_detection_or_segmentation_config_trains_as_under_mmengine_s_runner_and_resumes(
    kind, ops_env, request, tmp_path
):
    case = CASES[kind]
    data = request.getfixturevalue(case.data)
    records, weights = {}, {}
    for name, trainer in (("mmengine", train_with_mmengine), ("shardwise", train_with_shardwise)):
        out = tmp_path / f"{name}_record"
        config = write_child(case, tmp_path, data, out, name=f"{name}_config")
        proc = trainer(config, tmp_path / f"{name}_run", ops_env)
        assert proc.returncode == 0, f"{name}:\n{proc.stderr[-4000:]}"
        records[name] = Record.read(out)
        weights[name] = _weights(tmp_path / f"{name}_run" / case.last)
    ours, oracle = records["shardwise"], records["mmengine"]
    assert sorted(ours.init) == sorted(oracle.init)
    assert all(torch.equal(ours.init[k], oracle.init[k]) for k in oracle.init)
    assert len(ours.losses) == len(oracle.losses) == case.iterations
    difference = max(abs(a - b) for a, b in zip(ours.losses, oracle.losses, strict=True))
    print(f"{kind}: max loss difference {difference:.3g} over {len(ours.losses)} iterations")
    assert ours.losses == pytest.approx(oracle.losses, abs=LOSS_TOLERANCE, rel=0)
    assert ours.metrics == oracle.metrics and ours.metrics
    assert sorted(weights["shardwise"]) == sorted(weights["mmengine"])
    final = _max_difference(weights["shardwise"], weights["mmengine"])
    print(f"{kind}: final weights max difference {final:.3g}")
    assert final <= LOSS_TOLERANCE

    out = tmp_path / "resumed_record"
    config = write_child(case, tmp_path, data, out, name="resumed_config")
    first = tmp_path / "shardwise_run" / case.first
    proc = train_with_shardwise(config, tmp_path / "resumed", ops_env, "--resume", str(first))
    assert proc.returncode == 0, proc.stderr[-4000:]
    resumed = Record.read(out)
    assert resumed.losses == ours.losses[case.resumed_at :]
    assert resumed.metrics == ours.metrics
    again, whole = _weights(tmp_path / "resumed" / case.last), weights["shardwise"]
    assert all(torch.equal(whole[k], again[k]) for k in whole)
