"""What tests/test_torchft_runner.py's config trains: a tiny dataset (each sample returns its
index), a tiny model, and a hook recording what each replica group read, its losses, its
heals and its final state."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map

from shardwise.registry import DATASETS, HOOKS, MODELS
from shardwise.runner.hooks import Hook


@DATASETS.register_module()
class FTTinyRegression(torch.utils.data.Dataset):
    """``n`` generated samples ``(x, y, index)``."""

    def __init__(self, n: int = 96) -> None:
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True).sin()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], torch.tensor(i)


@MODELS.register_module()
class FTTinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x, y, index):
        return dict(loss=nn.functional.mse_loss(self.net(x), y))


@HOOKS.register_module()
class FTRecordHook(Hook):
    """One JSON line per rank and iteration that ran to its end (loss, the sample indices,
    how many data-parallel parts the step's data was split into and this rank's: under fault
    tolerance the ranks of the quorum's replica groups) in ``OUT/NAME.jsonl``; the final
    state in ``OUT/NAME[rank].pt`` (this rank's shard of a sharded state). While the file
    ``hold`` exists, the run waits before its first quorum and before each iteration; each
    iteration sleeps ``sleep`` seconds."""

    priority = "VERY_LOW"

    def __init__(self, out: str, name: str, sleep: float = 0.0, hold: str | None = None):
        self.out, self.name, self.sleep, self.hold = Path(out), name, sleep, hold
        self.log = None

    def _wait(self) -> None:
        while self.hold and Path(self.hold).exists():
            time.sleep(0.05)

    def before_train(self, runner) -> None:
        self.log = open(self.out / f"{self.name}.jsonl", "a", buffering=1)
        self.log.write(json.dumps(dict(ready=True, pid=os.getpid())) + "\n")
        self._wait()

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self._wait()
        time.sleep(self.sleep)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        s = runner.strategy
        ft, dp, dp_rank = s.fault_tolerance, s.data_parallel_size, s.data_parallel_rank
        rec = dict(iter=runner.iter, loss=float(outputs["loss"]), idx=data_batch[2].tolist())
        rec.update(pid=os.getpid(), lr=runner.optim_wrapper.get_lr()["lr"][0])
        if ft is not None:  # the ranks of the live groups split the step's data
            rec.update(parts=ft.num_replicas * dp, part=ft.replica_rank * dp + dp_rank)
        else:
            rec.update(parts=dp, part=dp_rank)
        self.log.write(json.dumps(rec) + "\n")

    def after_train(self, runner) -> None:
        s = runner.strategy
        state = dict(
            model={k: v.clone() for k, v in s.model_state_dict().items()},
            optimizer=s.optim_state_dict(),
            schedulers=s.scheduler_state_dict(),
        )
        state = tree_map(lambda v: v.to_local() if isinstance(v, DTensor) else v, state)
        torch.save(state, self.out / f"{self.name}{runner.rank or ''}.pt")
        done = dict(done=True, pid=os.getpid(), iter=runner.iter)
        if s.fault_tolerance is not None:
            ft = s.fault_tolerance
            done.update(heal_steps=ft.heal_steps, failed_commits=ft.failed_commits)
        self.log.write(json.dumps(done) + "\n")
