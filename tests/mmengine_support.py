"""An mmengine project in miniature, for tests/test_integration_mmengine.py: a ``BaseModel`` and
a dataset registered in mmengine's registries, a hook that records what a run did (it is both
an mmengine and a shardwise hook, so both runners take it), the project's config, and the
scenario every strategy goes through under mmengine's ``FlexibleRunner``.

Importing this module needs mmengine; tests import it after ``pytest.importorskip('mmengine')``.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.hooks import Hook as MMEngineHook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, MODELS, OPTIMIZERS
from mmengine.runner import FlexibleRunner
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import Dataset

from shardwise.runner import Hook as ShardwiseHook

TOTAL_ITERS = 6  # two checkpoints (CheckpointHook every 3 iterations), across an epoch's end
HALF = 3
OPTIM_WRAPPER = dict(optimizer=dict(type="AdamW", lr=0.01))
PARAM_SCHEDULER = [
    dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=4),
    dict(type="MultiStepLR", milestones=[5], gamma=0.5, by_epoch=False),
]

CONFIG = """
custom_imports = dict(imports=['shardwise.integrations.mmengine', 'tests.mmengine_support'])
model = dict(type='IntegrationRegressor')
strategy = dict(type={strategy!r})
launcher = {launcher!r}
train_dataloader = dict(
    dataset=dict(type='IntegrationData', n=16),
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    batch_size={batch_size})
optim_wrapper = {optim_wrapper!r}
param_scheduler = {param_scheduler!r}
train_cfg = dict(by_epoch=False, max_iters={max_iters})
default_hooks = dict(
    checkpoint=dict(type='CheckpointHook', interval={half}, by_epoch=False),
    logger=dict(type='LoggerHook', interval=1))
# mmengine's default_runtime.py: NCCL, which a machine without CUDA cannot run
env_cfg = dict(cudnn_benchmark=False, mp_cfg=dict(mp_start_method='fork'),
               dist_cfg=dict(backend='nccl'))
randomness = dict(seed=0)
"""


def write_config(path: Path, strategy: str, *, launcher: str = "none", batch_size: int = 4) -> Path:
    """The project's config file, with ``strategy=dict(type=strategy)``."""
    path.write_text(
        CONFIG.format(
            strategy=strategy,
            launcher=launcher,
            batch_size=batch_size,
            optim_wrapper=OPTIM_WRAPPER,
            param_scheduler=PARAM_SCHEDULER,
            max_iters=TOTAL_ITERS,
            half=HALF,
        )
    )
    return path


@DATASETS.register_module()
class IntegrationData(Dataset):
    """``n`` fixed samples ``dict(x, y)`` with ``y = x @ (1, 2, 3, 4)``."""

    def __init__(self, n: int = 16) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=gen)
        self.y = self.x @ torch.arange(1.0, 5.0).unsqueeze(1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return dict(x=self.x[i], y=self.y[i])


@MODELS.register_module()
class IntegrationRegressor(BaseModel):
    """A regression ``BaseModel``; dropout makes a resume depend on the restored RNG states."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(4, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, 1)
        )

    def forward(self, x, y=None, mode="tensor"):
        pred = self.net(x)
        return dict(loss=F.mse_loss(pred, y)) if mode == "loss" else pred


class Interrupted(Exception):
    """Raised by :class:`RecordRun` to stop a run as a crash would."""


@OPTIMIZERS.register_module()
class IntegrationSGD(torch.optim.SGD):
    """An optimizer the project registers in mmengine's registry only."""


@HOOKS.register_module()
class RecordRun(MMEngineHook, ShardwiseHook):
    """Records what a run did; rank 0 writes it to ``out`` (``torch.save``) when the run ends.

    ``start``/``end``: the iteration, weights and optimizer state when training starts (after
    ``load_from`` or ``resume``) and ends; ``lrs`` and ``losses`` of each iteration; ``history``:
    the message hub's ``train/loss`` history at the end. With ``stop_at``, the run ends after
    that iteration (after the checkpoint hook's save) with :class:`Interrupted`.
    """

    priority = "LOWEST"

    def __init__(
        self, out: str | os.PathLike[str] | None = None, stop_at: int | None = None
    ) -> None:
        self.out = out
        self.stop_at = stop_at
        self.lrs: list[float] = []
        self.losses: list[float] = []

    def before_train(self, runner) -> None:  # after load_from or resume in both runners
        self.start = _snapshot(runner)

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.lrs.append(runner.optim_wrapper.get_lr()["lr"][0])

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.losses.append(float(torch.as_tensor(outputs["loss"]).detach()))
        if runner.iter + 1 == self.stop_at:
            self.after_train(runner)
            raise Interrupted(f"stopped after iteration {self.stop_at}")

    def after_train(self, runner) -> None:
        self.end = _snapshot(runner)
        history = runner.message_hub.get_scalar("train/loss").data[0]
        self.history = [float(v) for v in history]
        if self.out is not None and runner.rank == 0:
            torch.save(self.record(), self.out)

    def record(self) -> dict[str, Any]:
        return dict(
            start=self.start,
            end=self.end,
            lrs=self.lrs,
            losses=self.losses,
            history=self.history,
        )


def _snapshot(runner) -> dict[str, Any]:
    """The runner's position and a copy of its whole state, FSDP's shards gathered (a
    collective: every rank calls it)."""
    return dict(
        iter=runner.iter,
        weights=_full_copy(runner.strategy.model_state_dict()),
        optimizer=_full_copy(runner.strategy.optim_state_dict()),
    )


def _full_copy(tree: Any) -> Any:
    if isinstance(tree, DTensor):
        return tree.full_tensor()
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if isinstance(tree, dict):
        return {key: _full_copy(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_full_copy(value) for value in tree)
    return copy.deepcopy(tree)


def train_flexible(
    config: str | os.PathLike[str],
    work_dir: Path,
    *,
    max_iters: int,
    record: Path,
    resume: bool | str = False,
    load_from: str | os.PathLike[str] | None = None,
    stop_at: int | None = None,
) -> None:
    """Train the config's run under mmengine's FlexibleRunner into ``work_dir``, recording it
    (``stop_at``: interrupted after that iteration)."""
    cfg = Config.fromfile(str(config))  # imports custom_imports: registers the strategies
    cfg.work_dir = str(work_dir)
    cfg.experiment_name = record.stem
    cfg.train_cfg.max_iters = max_iters
    cfg.resume = resume
    cfg.load_from = None if load_from is None else str(load_from)
    cfg.custom_hooks = [dict(type="RecordRun", out=str(record), stop_at=stop_at)]
    runner = FlexibleRunner.from_cfg(cfg)
    try:
        runner.train()
    except Interrupted:
        pass


def run_scenario(config: str | os.PathLike[str], root: Path) -> None:
    """``full``: TOTAL_ITERS iterations; ``first_half``: the same run in ``halves``, interrupted
    after HALF iterations; ``resumed``: ``resume=True`` in ``halves``; ``loaded``: one
    iteration from ``load_from`` the full run's last checkpoint. Each writes ``root/NAME.pt``."""
    halves = root / "halves"
    train_flexible(config, root / "full", max_iters=TOTAL_ITERS, record=root / "full.pt")
    train_flexible(
        config, halves, max_iters=TOTAL_ITERS, stop_at=HALF, record=root / "first_half.pt"
    )
    train_flexible(config, halves, max_iters=TOTAL_ITERS, resume=True, record=root / "resumed.pt")
    last = root / "full" / f"iter_{TOTAL_ITERS}.pth"
    train_flexible(config, root / "loaded", max_iters=1, load_from=last, record=root / "loaded.pt")
