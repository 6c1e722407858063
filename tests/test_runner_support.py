"""Tiny datasets, models and hooks for the runner tests (importable by worker processes
through a config's ``custom_imports=dict(imports=['tests.test_runner_support'])``)."""

from __future__ import annotations

import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

from shardwise.registry import DATASETS, HOOKS, MODELS
from shardwise.runner import Hook


@DATASETS.register_module()
class RegressionData(Dataset):
    """``n`` fixed samples ``(x, y)`` with ``y = x @ w + noise``."""

    def __init__(self, n: int = 64, dim: int = 4, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=gen)
        self.y = self.x @ torch.arange(1.0, dim + 1).unsqueeze(1) + 0.1 * torch.randn(
            n, 1, generator=gen
        )

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


@DATASETS.register_module()
class BlobData(Dataset):
    """Two Gaussian blobs, labels 0/1, for classification."""

    def __init__(self, n: int = 64, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.y = torch.arange(n) % 2
        self.x = torch.randn(n, 4, generator=gen) + 3.0 * self.y.unsqueeze(1).float()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


@MODELS.register_module()
class DropoutRegressor(nn.Module):
    """forward(x, y) -> dict(loss=...); dropout makes the RNG state matter for resumes."""

    def __init__(self, dim: int = 4, width: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, 1)
        )

    def forward(self, x, y=None):
        pred = self.net(x)
        if y is None:
            return pred
        return dict(loss=F.mse_loss(pred, y))


@MODELS.register_module()
class BlobClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x, y=None):
        logits = self.net(x)
        if y is None:
            return logits
        return dict(loss=F.cross_entropy(logits, y), logits=logits)


@MODELS.register_module()
class LosslessModel(nn.Module):
    """A model whose forward returns no loss (the runner must refuse it clearly)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x, y=None):
        return dict(pred=self.fc(x))


@MODELS.register_module()
class OwnStepModel(nn.Module):
    """mmengine BaseModel style: its own train_step, val_step and test_step."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.steps = 0

    def forward(self, x):
        return self.fc(x)

    def train_step(self, data, optim_wrapper):
        x, y = data
        with optim_wrapper.optim_context(self):
            loss = F.mse_loss(self(x), y)
        optim_wrapper.update_params(loss)
        self.steps += 1
        return dict(loss=loss.detach(), loss_twice=2 * loss.detach())

    def val_step(self, data):
        x, y = data
        return dict(logits=torch.cat([self(x), -self(x)], dim=1))

    def test_step(self, data):
        return self.val_step(data)


@HOOKS.register_module()
class CrashOnceHook(Hook):
    """Kill this process (``os._exit``) on ``rank`` after iteration ``at_iter`` — on the
    first attempt only (``TORCHELASTIC_RESTART_COUNT`` is 0), to test elastic restarts."""

    def __init__(self, at_iter: int, rank: int = 1) -> None:
        self.at_iter, self.rank = at_iter, rank

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first_attempt and runner.rank == self.rank and runner.iter + 1 == self.at_iter:
            os._exit(17)


@HOOKS.register_module()
class StopAfterHook(Hook):
    """Interrupt the run after iteration ``at_iter`` (``SystemExit(3)``), as a user stopping
    it or a job running out of time would."""

    def __init__(self, at_iter: int) -> None:
        self.at_iter = at_iter

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 == self.at_iter:
            raise SystemExit(3)


@HOOKS.register_module()
class RecordLossHook(Hook):
    """Rank 0 appends each iteration's loss to ``work_dir/losses.jsonl`` (exactly, as
    ``float.hex``); every rank writes its pid to ``work_dir/pid_rank{r}`` and its latest
    iteration to ``work_dir/iter_rank{r}``; each iteration sleeps ``seconds`` (so that a test
    can act mid-run)."""

    priority = "LOW"  # after RuntimeInfoHook has logged the loss, before checkpoints

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds

    def before_train(self, runner) -> None:
        with open(os.path.join(runner.work_dir, f"pid_rank{runner.rank}"), "w") as f:
            f.write(str(os.getpid()))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        import json
        import time

        if runner.rank == 0:
            loss = float(runner.message_hub.get_scalar("train/loss").current())
            with open(os.path.join(runner.work_dir, "losses.jsonl"), "a") as f:
                f.write(json.dumps(dict(iter=runner.iter + 1, loss=loss.hex())) + "\n")
        with open(os.path.join(runner.work_dir, f"iter_rank{runner.rank}"), "w") as f:
            f.write(str(runner.iter + 1))
        time.sleep(self.seconds)
