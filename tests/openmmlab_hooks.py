"""The hook the OpenMMLab parity runs record with (an mmengine ``Hook``: both mmengine's Runner
and shardwise's take it), named in their configs as ``tests.openmmlab_hooks.RecordHook``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from mmengine.hooks import Hook


class RecordHook(Hook):
    """Writes into ``out`` (rank 0): ``losses.json`` (every iteration's loss, as the step
    returned it), ``times.json`` (``time.perf_counter()`` and ``time.process_time()`` after
    each iteration: wall and this process's CPU seconds), ``init.pt``
    (the weights the first iteration starts from, on one process) and ``metrics.json`` (the
    last validation's metrics)."""

    priority = "VERY_HIGH"

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.losses: list[float] = []
        self.times: list[tuple[float, float]] = []

    def _rank0(self, runner) -> bool:
        return getattr(runner, "rank", 0) == 0

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if self.losses or not self._rank0(runner) or getattr(runner, "world_size", 1) > 1:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        model = getattr(runner.model, "module", runner.model)
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save(weights, self.out / "init.pt")

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if self._rank0(runner):
            self.times.append((time.perf_counter(), time.process_time()))
            self.losses.append(float(outputs["loss"]))
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "losses.json").write_text(json.dumps(self.losses))
            (self.out / "times.json").write_text(json.dumps(self.times))

    def after_val_epoch(self, runner, metrics=None) -> None:
        if self._rank0(runner):
            self.out.mkdir(parents=True, exist_ok=True)
            values = {k: float(v) for k, v in (metrics or {}).items()}
            (self.out / "metrics.json").write_text(json.dumps(values))
