"""Train a tiny model with mmengine's own Runner and keep its last checkpoint, for
tests/test_mmengine_checkpoint.py.

Two epochs of three iterations on the CPU: AdamW, a LinearLR warm-up by iteration and a
MultiStepLR by epoch, and with ``--ema`` mmengine's EMAHook. The model is shardwise's test model
``DropoutRegressor(width=4)`` (``tests/test_runner_support.py``) written as an mmengine
``BaseModel``, so shardwise's Runner can load the weights. Writes into OUT_DIR:

- ``epoch_2.pth``: the checkpoint mmengine's CheckpointHook saved after the last epoch, as is;
- ``expected.pt``: what the runner held after training (the oracle the test compares with),
  tensors and plain values only: ``weights`` (the checkpoint's ``state_dict``: the EMA model's
  weights with EMAHook), ``ema_state_dict`` (with EMAHook), ``optimizer``, ``last_steps`` of the
  schedulers, ``epoch``, ``iter``, ``losses`` (the ``train/loss`` history) and
  ``mmengine_version``; in torch's legacy format, a third of the zip format's size here.

The committed fixture was made with mmengine 0.10.7, torch 2.13 and numpy 2::

    python tests/data/make_mmengine_fixture.py tests/data/mmengine_0.10.7_ema --ema
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from pathlib import Path

import mmengine
import torch
import torch.nn.functional as F
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset


class RegressionData(Dataset):
    def __init__(self, n: int = 24, dim: int = 4) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=gen)
        self.y = self.x @ torch.arange(1.0, dim + 1).unsqueeze(1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return dict(x=self.x[i], y=self.y[i])


class DropoutRegressor(BaseModel):
    def __init__(self, dim: int = 4, width: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, 1)
        )

    def forward(self, x, y=None, mode="tensor"):
        pred = self.net(x)
        return dict(loss=F.mse_loss(pred, y)) if mode == "loss" else pred


def train(work_dir: Path, ema: bool) -> Runner:
    runner = Runner(
        model=DropoutRegressor(),
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=RegressionData(),
            batch_size=8,
            sampler=dict(type="DefaultSampler", shuffle=True),
            collate_fn=dict(type="default_collate"),
        ),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=4),
            dict(type="MultiStepLR", milestones=[1], by_epoch=True),
        ],
        train_cfg=dict(by_epoch=True, max_epochs=2),
        custom_hooks=[dict(type="EMAHook")] if ema else [],
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1)),
        randomness=dict(seed=0),
    )
    runner.train()
    return runner


def expected(runner: Runner) -> dict:
    """What a load of the last checkpoint must give, from the runner's own objects."""
    ema_hooks = [hook for hook in runner.hooks if type(hook).__name__ == "EMAHook"]
    model = runner.model.state_dict()
    out = dict(
        weights=model,
        optimizer=runner.optim_wrapper.state_dict(),
        last_steps=[scheduler.last_step for scheduler in runner.param_schedulers],
        epoch=runner.epoch,
        iter=runner.iter,
        losses=torch.from_numpy(runner.message_hub.get_scalar("train/loss").data[0]),
        mmengine_version=mmengine.__version__,
    )
    if ema_hooks:  # EMAHook saves the EMA weights as state_dict and the model's in ema_state_dict
        ema_model = ema_hooks[0].ema_model
        out["weights"] = ema_model.module.state_dict()
        out["ema_state_dict"] = {
            "steps": ema_model.steps,
            **{f"module.{key}": value for key, value in model.items()},
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--ema", action="store_true", help="train with mmengine's EMAHook")
    args = parser.parse_args()
    out_dir = args.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    # mmengine appends the git hash of the working directory to the mmengine_version it saves:
    # run outside any repository
    with tempfile.TemporaryDirectory() as work_dir, contextlib.chdir(work_dir):
        runner = train(Path(work_dir), args.ema)
        shutil.copyfile(Path(work_dir) / "epoch_2.pth", out_dir / "epoch_2.pth")
        torch.save(expected(runner), out_dir / "expected.pt", _use_new_zipfile_serialization=False)


if __name__ == "__main__":
    main()
