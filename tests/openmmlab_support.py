"""Real OpenMMLab model code for the tests and the bench: mmpretrain 1.2.0 on mmcv-lite 2.2.0,
built once by ``tools/openmmlab_env.sh`` (``make openmmlab``'s script) into ``.openmmlab/env`` (git
ignores it), child configs of the corpus's mmpretrain configs on generated image folders, and
the two ways to train them: mmengine's ``Runner`` (the oracle) and ``shardwise train``.

Each run records, through :class:`tests.openmmlab_hooks.RecordHook`, every iteration's loss,
the weights and random state the first iteration starts from, and the validation metrics.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SHARDWISE_SHARED", REPO.parent / "shared"))
TOOL = REPO / "tools" / "openmmlab_env.sh"  # `make openmmlab`'s script, into a folder here
CORPUS = SHARED / "corpus" / "openmmlab-configs" / "mmpretrain" / "configs"
ENV_DIR = REPO / ".openmmlab" / "env"


def _cifar10(workers: int) -> str:
    """CIFAR-10's pipeline (random crop and flip) on ``CustomDataset`` folders, loaded by
    ``workers`` processes, 2 epochs with validation after each."""
    return """
        data_preprocessor = dict(num_classes=3)
        train_pipeline = [
            dict(type='LoadImageFromFile'),
            dict(type='RandomCrop', crop_size=32, padding=4),
            dict(type='RandomFlip', prob=0.5, direction='horizontal'),
            dict(type='PackInputs'),
        ]
        test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
        train_dataloader = dict(
            batch_size={batch}, num_workers=WORKERS,
            dataset=dict(_delete_=True, type='CustomDataset', data_root='{data}/train',
                         pipeline=train_pipeline))
        val_dataloader = dict(
            batch_size={batch}, num_workers=WORKERS,
            dataset=dict(_delete_=True, type='CustomDataset', data_root='{data}/val',
                         pipeline=test_pipeline))
        test_dataloader = val_dataloader
        train_cfg = dict(max_epochs={epochs}, val_interval=1)
        """.replace("WORKERS", str(workers))


#: The child configs: each ``_base_`` a real config of the corpus, swaps the data for a
#: ``CustomDataset`` folder with ``_delete_=True`` (a loading step first: the corpus's CIFAR
#: pipelines start from arrays), as users customise them.
CHILDREN = {
    # ResNet-18 on CIFAR-10's pipeline: random crop and flip in 2 worker processes; 2 epochs,
    # validation after each, mmpretrain's VisualizationHook drawing the validation samples
    "resnet18": """
        _base_ = '{corpus}/resnet/resnet18_8xb16_cifar10.py'
        model = dict(head=dict(num_classes=3))
        """
    + _cifar10(workers=2)
    + """
        # mmpretrain's own hook draws every validation sample into vis_data/vis_image
        default_hooks = dict(visualization=dict(type='VisualizationHook', enable=True))
        """,
    # DeiT-tiny (ViT) on ImageNet's pipeline (RandAugment, random erasing) at 32 px, with
    # Mixup/CutMix in its data preprocessor, AdamW, clipping and paramwise_cfg, mmpretrain's
    # RepeatAugSampler; an iteration-based loop (the draw before init_weights)
    "deit_tiny": """
        _base_ = '{corpus}/deit/deit-tiny_4xb256_in1k.py'
        model = dict(backbone=dict(img_size=32), head=dict(num_classes=3))
        data_preprocessor = dict(num_classes=3)
        bgr_mean = [103.53, 116.28, 123.675]
        train_pipeline = [
            dict(type='LoadImageFromFile'),
            dict(type='RandomResizedCrop', scale=32, backend='pillow', interpolation='bicubic'),
            dict(type='RandomFlip', prob=0.5, direction='horizontal'),
            dict(type='RandAugment', policies='timm_increasing', num_policies=2,
                 total_level=10, magnitude_level=9, magnitude_std=0.5,
                 hparams=dict(pad_val=[104, 116, 124], interpolation='bicubic')),
            dict(type='RandomErasing', erase_prob=0.25, mode='rand', min_area_ratio=0.02,
                 max_area_ratio=1 / 3, fill_color=bgr_mean, fill_std=[57.375, 57.12, 58.395]),
            dict(type='PackInputs'),
        ]
        test_pipeline = [
            dict(type='LoadImageFromFile'),
            dict(type='ResizeEdge', scale=37, edge='short', backend='pillow',
                 interpolation='bicubic'),
            dict(type='CenterCrop', crop_size=32),
            dict(type='PackInputs'),
        ]
        train_dataloader = dict(
            batch_size={batch}, num_workers=0,
            sampler=dict(type='RepeatAugSampler', shuffle=True),  # mmpretrain's own sampler
            dataset=dict(_delete_=True, type='CustomDataset', data_root='{data}/train',
                         pipeline=train_pipeline))
        val_dataloader = dict(
            batch_size={batch}, num_workers=0,
            dataset=dict(_delete_=True, type='CustomDataset', data_root='{data}/val',
                         pipeline=test_pipeline))
        test_dataloader = val_dataloader
        val_evaluator = dict(type='Accuracy', topk=(1,))
        test_evaluator = val_evaluator
        train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={iters},
                         val_interval={iters})
        param_scheduler = [
            dict(type='LinearLR', start_factor=1e-3, by_epoch=False, end=2),
            dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=2),
        ]
        default_hooks = dict(checkpoint=dict(by_epoch=False, interval={iters}))
        """,
    # MobileNetV3-small on CIFAR-10's pipeline, with dropout in its head (the masks follow
    # torch's generator through the epochs and the validation between them)
    "mobilenet_v3": """
        _base_ = '{corpus}/mobilenet_v3/mobilenet-v3-small_8xb16_cifar10.py'
        model = dict(head=dict(num_classes=3, dropout_rate=0.2, topk=(1,)))
        """
    + _cifar10(workers=0)
    + """
        """,
}

#: What every child adds: a seed and the recording hook.
_COMMON = """
randomness = dict(seed=0)
custom_hooks = [dict(type='tests.openmmlab_hooks.RecordHook', out='{out}')]
"""


@dataclass
class Record:
    """What :class:`tests.openmmlab_hooks.RecordHook` wrote for one run."""

    losses: list[float]
    metrics: dict[str, float]
    init: dict  # the weights the first iteration started from

    @classmethod
    def read(cls, out: Path) -> Record:
        import torch

        losses = json.loads((out / "losses.json").read_text())
        metrics = json.loads((out / "metrics.json").read_text())
        return cls(losses, metrics, torch.load(out / "init.pt"))


def unavailable(reason: str, *, module: bool = False) -> NoReturn:
    """Skip a test whose OpenMMLab environment cannot be had here, with ``reason``; under CI
    (``CI`` set) fail instead: CI builds the environment (``make openmmlab``) and must not stay
    green without it. ``module``: called at a test module's top level."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so this does not skip: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module)


def import_or_unavailable(name: str, reason: str) -> ModuleType:
    """``importlib.import_module(name)``, or :func:`unavailable` (at a module's top level too)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        unavailable(f"{name} cannot be imported ({exc}): {reason}", module=True)


def build_env() -> tuple[Path | None, str]:
    """The OpenMMLab folder for ``PYTHONPATH`` (built once, while the tool's text is the
    same), or None with the reason it cannot be had here (the children's corpus included)."""
    if not CORPUS.is_dir():
        return None, f"{CORPUS} is not here (the shared corpus; set SHARDWISE_SHARED)"
    return build_folder(ENV_DIR, TOOL, what="mmpretrain")


def build_folder(
    folder: Path, tool: Path, *sources: Path, what: str, timeout: float = 900
) -> tuple[Path | None, str]:
    """``bash TOOL FOLDER`` once, while the text of ``tool`` and of the ``sources`` it runs
    is the same (a ``.ready`` stamp), one build at a time; the folder, or None with the reason
    it could not be built (``what``: what the tool installs, for that reason)."""
    stamp = hashlib.sha256(b"".join(p.read_bytes() for p in (tool, *sources))).hexdigest()
    ready = folder / ".ready"
    folder.parent.mkdir(exist_ok=True)
    with open(folder.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build, whoever asks first
        if ready.is_file() and ready.read_text() == stamp:
            return folder, ""
        shutil.rmtree(folder, ignore_errors=True)
        proc = subprocess.run(
            ["bash", str(tool), str(folder)],
            env={**os.environ, "PYTHON": sys.executable},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            return None, f"tools/{tool.name} could not build {what} here: {tail}"
        ready.write_text(stamp)
    return folder, ""


def make_images(root: Path, per_class: int = 12, classes: int = 3, size: int = 32) -> Path:
    """``root/{train,val}/class{c}/{i}.png``: noisy images whose class is the channel that is
    brighter (learnable, not at once). Deterministic."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = rng.integers(0, 160, (size, size, 3))
                pixels[..., c] += 60
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i}.png")
    return root


def child_config(
    kind: str,
    folder: Path,
    data: Path,
    out: Path,
    *,
    batch: int = 8,
    epochs: int = 2,
    iters: int = 4,
    extra: str = "",
    name: str | None = None,
) -> Path:
    """Write the child config ``kind`` of :data:`CHILDREN` into ``folder``; its recording
    hook writes into ``out``; ``extra`` lines are appended (a strategy...); the file is
    ``{name or kind}.py``."""
    text = textwrap.dedent(CHILDREN[kind]).format(
        corpus=CORPUS, data=data, batch=batch, epochs=epochs, iters=iters
    )
    text += _COMMON.format(out=out) + textwrap.dedent(extra)
    path = folder / f"{name or kind}.py"
    path.write_text(text)
    return path


def run_env(env_dir: Path | Sequence[Path]) -> dict[str, str]:
    """The environment of a training subprocess: the OpenMMLab folder (or folders, the first
    first) and the repository on ``PYTHONPATH`` (for ``tests.openmmlab_hooks``), one thread
    each."""
    folders = [env_dir] if isinstance(env_dir, Path) else list(env_dir)
    path = os.pathsep.join([*map(str, folders), str(REPO)])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


MMENGINE_TRAIN = """
import sys
from mmengine.config import Config
from mmengine.runner import Runner
cfg = Config.fromfile(sys.argv[1])
cfg.work_dir = sys.argv[2]
Runner.from_cfg(cfg).train()
"""


def train_with_mmengine(
    config: Path, work_dir: Path, env_dir: Path | Sequence[Path], timeout: float = 600
):
    """mmengine's ``Runner.from_cfg(cfg).train()`` on one process (the oracle)."""
    return subprocess.run(
        [sys.executable, "-c", MMENGINE_TRAIN, str(config), str(work_dir)],
        cwd=REPO,
        env=run_env(env_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def train_with_shardwise(
    config: Path, work_dir: Path, env_dir: Path | Sequence[Path], *args: str, timeout: float = 600
):
    """``shardwise train CONFIG --work-dir WORK_DIR ARGS``."""
    return subprocess.run(
        [sys.executable, "-m", "shardwise.cli", "train", str(config), "--work-dir", str(work_dir)]
        + list(args),
        cwd=REPO,
        env=run_env(env_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
