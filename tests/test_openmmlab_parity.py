"""Parity with mmengine's Runner on real mmpretrain 1.2.0 configs, where a recipe uses more than
the model and the data: batch augments, the optimizer wrapper's options, schedulers converted
to iterations, LR scaling, mmengine's ``EMAHook`` and mmpretrain's ``PreciseBNHook``.

Slow suite (mmpretrain on mmcv-lite from ``tools/openmmlab_env.sh``, the shared corpus; skipped
without them). Each child config of a corpus config trains 2 epochs on one process with
mmengine's Runner and with ``shardwise train`` (the same seed, tiny generated images, no worker
processes): the same starting weights, every iteration's loss to 1e-5, the same final weights
(and EMA weights); then ``shardwise train --resume`` from the first epoch's checkpoint gives
the second epoch's losses and the final weights bit for bit. The EMAHook child also trains on
2 DDP ranks (every rank's ``before_save_checkpoint`` hooks see the model's keys) and resumes
bit for bit.

The default suite runs the same paths on the stand-in package:
``tests/test_openmmlab_hooks_compat.py``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from tests.openmmlab_support import (
    CORPUS,
    Record,
    build_env,
    make_images,
    train_with_mmengine,
    train_with_shardwise,
)

pytest.importorskip("mmengine", reason="mmengine's Runner is the oracle")

LOSS_TOLERANCE = 1e-5
EPOCHS = 2
BATCH = 9
#: 36 images in batches of 9: an epoch ends where a group of 2 accumulated iterations does (a
#: resume in the middle of one loses its gradients, under mmengine's Runner as here)
EPOCH_LENGTH = 4

#: CIFAR-10's pipeline on ``CustomDataset`` folders, in the main process.
_CIFAR_DATA = """
data_preprocessor = dict(num_classes=3)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomCrop', crop_size=32, padding=4),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
"""

_LOADERS = """
train_dataloader = dict(
    batch_size={batch}, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='CustomDataset', data_root='{data}/train',
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size={batch}, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='CustomDataset', data_root='{data}/val',
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1,))
test_evaluator = val_evaluator
train_cfg = dict(max_epochs={epochs}, val_interval=1)
randomness = dict(seed=0)
"""

_RECORD = "dict(type='tests.openmmlab_hooks.RecordHook', out='{out}')"

#: The child configs, each ``_base_`` a corpus config.
CHILDREN = {
    # ResNet-18 (CIFAR) with a ConvNeXt/EfficientNet-style recipe: Mixup and CutMix as batch
    # augments with label smoothing, gradient accumulation over 2 iterations, clipping,
    # paramwise_cfg (custom_keys, no decay on norms and biases), a linear warm-up converted to
    # iterations before a cosine epoch, and the LR scaled to the batch (auto_scale_lr)
    "resnet18_recipe": _CIFAR_DATA
    + """
_base_ = '{corpus}/resnet/resnet18_8xb16_cifar10.py'
model = dict(
    head=dict(num_classes=3, loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1,
                                       mode='original', loss_weight=1.0)),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))
optim_wrapper = dict(
    optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=5e-4),
    accumulative_counts=2,
    clip_grad=dict(max_norm=1.0),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0,
                       custom_keys={{'head': dict(lr_mult=2.0)}}))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=1, by_epoch=True, begin=1, end=2),
]
auto_scale_lr = dict(base_batch_size=16, enable=True)
custom_hooks = [RECORD]
""",
    # ResNet-18 (CIFAR) with mmengine's EMAHook as ConvNeXt's configs use it
    "resnet18_ema": _CIFAR_DATA
    + """
_base_ = '{corpus}/resnet/resnet18_8xb16_cifar10.py'
model = dict(head=dict(num_classes=3))
custom_hooks = [RECORD, dict(type='EMAHook', momentum=0.01, priority='ABOVE_NORMAL')]
""",
    # RegNetX-400MF on its ImageNet pipeline (lighting noise) at 32 px with mmpretrain's
    # PreciseBNHook, which runs only under mmengine's EpochBasedTrainLoop
    "regnet_precise_bn": """
_base_ = '{corpus}/regnet/regnetx-400mf_8xb128_in1k.py'
model = dict(head=dict(num_classes=3, topk=(1,)))
data_preprocessor = dict(num_classes=3)
EIGVAL = [0.2175, 0.0188, 0.0045]  # the base's lighting parameters
EIGVEC = [[-0.5836, -0.6948, 0.4203], [-0.5808, -0.0045, -0.814], [-0.5675, 0.7192, 0.4009]]
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=32),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='Lighting', eigval=EIGVAL, eigvec=EIGVEC, alphastd=25.5, to_rgb=False),
    dict(type='PackInputs'),
]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
optim_wrapper = dict(optimizer=dict(lr=0.1))
param_scheduler = dict(_delete_=True, type='CosineAnnealingLR', T_max=2, by_epoch=True)
custom_hooks = [
    RECORD,
    dict(type='PreciseBNHook', num_samples=16, interval=1, priority='ABOVE_NORMAL'),
]
""",
}


def write_child(kind: str, folder: Path, data: Path, out: Path, name: str) -> Path:
    """The child config ``kind`` of :data:`CHILDREN` as ``folder/{name}.py``, recording into
    ``out`` (:class:`tests.openmmlab_hooks.RecordHook`)."""
    text = CHILDREN[kind].replace("RECORD", _RECORD) + _LOADERS
    text = textwrap.dedent(text).format(
        corpus=CORPUS, data=data, out=out, batch=BATCH, epochs=EPOCHS
    )
    path = folder / f"{name}.py"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def openmmlab_env() -> Path:
    env_dir, reason = build_env()
    if env_dir is None:
        pytest.skip(reason)
    return env_dir


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_images(tmp_path_factory.mktemp("images"))


def _checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def _max_difference(a: dict, b: dict) -> float:
    return max(
        (float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()),
        default=0.0,
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(CHILDREN))
def test_a_recipe_trains_as_under_mmengine_s_runner_and_resumes_bit_exactly(
    kind, openmmlab_env, images, tmp_path
):
    runs, records = {}, {}
    for name, trainer in (("mmengine", train_with_mmengine), ("shardwise", train_with_shardwise)):
        out = tmp_path / f"{name}_record"
        config = write_child(kind, tmp_path, images, out, name=f"{name}_config")
        proc = trainer(config, tmp_path / f"{name}_run", openmmlab_env)
        assert proc.returncode == 0, f"{name}:\n{proc.stderr[-4000:]}"
        records[name] = Record.read(out)
        runs[name] = _checkpoint(tmp_path / f"{name}_run" / f"epoch_{EPOCHS}.pth")
    ours, oracle = records["shardwise"], records["mmengine"]
    assert all(torch.equal(ours.init[k], oracle.init[k]) for k in oracle.init)
    assert len(ours.losses) == len(oracle.losses) == EPOCHS * EPOCH_LENGTH
    difference = max(abs(a - b) for a, b in zip(ours.losses, oracle.losses, strict=True))
    print(f"{kind}: max loss difference {difference:.3g} over {len(ours.losses)} iterations")
    assert ours.losses == pytest.approx(oracle.losses, abs=LOSS_TOLERANCE, rel=0)
    assert ours.metrics == oracle.metrics

    saved = ["state_dict"] + (["ema_state_dict"] if kind == "resnet18_ema" else [])
    for key in saved:
        mine, theirs = runs["shardwise"][key], runs["mmengine"][key]
        assert sorted(mine) == sorted(theirs), key
        weights = _max_difference(mine, theirs)
        print(f"{kind}: {key} max difference {weights:.3g}")
        assert weights <= LOSS_TOLERANCE, key
    if kind == "regnet_precise_bn":  # the hook ran after every epoch, as under mmengine's
        logs = {n: next((tmp_path / f"{n}_run").glob("*/*.log")).read_text() for n in runs}
        assert logs["shardwise"].count("Running Precise BN") == EPOCHS
        assert logs["mmengine"].count("Running Precise BN") == EPOCHS

    out = tmp_path / "resumed_record"
    config = write_child(kind, tmp_path, images, out, name="resumed_config")
    first = tmp_path / "shardwise_run" / "epoch_1.pth"
    proc = train_with_shardwise(config, tmp_path / "resumed", openmmlab_env, "--resume", str(first))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads((out / "losses.json").read_text()) == ours.losses[EPOCH_LENGTH:]
    again = _checkpoint(tmp_path / "resumed" / f"epoch_{EPOCHS}.pth")
    for key in saved:
        whole = runs["shardwise"][key]
        assert all(torch.equal(whole[k], again[key][k]) for k in whole), key


@pytest.mark.slow
def test_ema_hook_on_two_ddp_ranks_saves_the_ema_weights_and_resumes_bit_exactly(
    openmmlab_env, images, tmp_path
):
    """The EMAHook child on 2 DDP ranks: every rank's EMAHook swaps the EMA weights into the
    checkpoint as mmengine's does (rank 1 met a KeyError here), and a resume from the first
    epoch gives the second epoch's losses, weights and EMA weights bit for bit."""
    runs = {}
    for name in ("whole", "resumed"):
        out = tmp_path / f"{name}_record"
        config = write_child("resnet18_ema", tmp_path, images, out, name=f"{name}_config")
        config.write_text(config.read_text() + "strategy = dict(type='DDPStrategy')\n")
        args = ["--nproc-per-node", "2"]
        if name == "resumed":
            args += ["--resume", str(tmp_path / "whole" / "epoch_1.pth")]
        proc = train_with_shardwise(config, tmp_path / name, openmmlab_env, *args)
        assert proc.returncode == 0, f"{name}:\n{proc.stderr[-4000:]}"
        runs[name] = (
            json.loads((out / "losses.json").read_text()),
            _checkpoint(tmp_path / name / f"epoch_{EPOCHS}.pth"),
        )
    (losses, whole), (resumed, again) = runs["whole"], runs["resumed"]
    per_epoch = EPOCH_LENGTH // 2  # the images split over 2 ranks
    assert len(losses) == EPOCHS * per_epoch and resumed == losses[per_epoch:]
    weights, ema = whole["state_dict"], whole["ema_state_dict"]
    assert sorted(ema) == sorted(["steps", *(f"module.{k}" for k in weights)])
    for key in ("state_dict", "ema_state_dict"):
        assert all(torch.equal(whole[key][k], again[key][k]) for k in whole[key]), key
