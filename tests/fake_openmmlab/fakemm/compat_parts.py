"""The stand-in package's classes that test shardwise's Runner where package code tests the
runner itself (imported by a config's ``custom_imports``): a model with BatchNorm, a hook that
works only under mmengine's epoch-based loop, as mmpretrain's ``PreciseBNHook``
(``isinstance(runner.train_loop, EpochBasedTrainLoop)``), and the package's own loops
(mmengine's ``ValLoop`` and ``EpochBasedTrainLoop`` subclassed, in a ``LOOPS`` registry of its
own)."""

import itertools
import json
from pathlib import Path

import torch
import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.registry import LOOPS as MMENGINE_LOOPS
from mmengine.registry import Registry
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop, ValLoop

from .parts import TinyClassifier
from .registry import HOOKS, MODELS

LOOPS = Registry("loop", parent=MMENGINE_LOOPS, scope="fakemm", locations=["fakemm.compat_parts"])


@MODELS.register_module()
class NormClassifier(TinyClassifier):
    """``TinyClassifier`` with BatchNorm in place of its dropout (as a RegNet: nothing of it
    draws from torch's generator once initialised)."""

    def __init__(self, data_preprocessor=None, init_cfg=None):
        super().__init__(data_preprocessor=data_preprocessor)
        self.net[2] = nn.BatchNorm1d(16)


@HOOKS.register_module()
class PreciseStats(Hook):
    """After every epoch of mmengine's epoch-based loop (every iteration of its iteration-based
    one), as mmpretrain's ``PreciseBNHook``: a forward pass in training mode over the first
    ``batches`` batches of a new iterator over the training data (its dropout and the
    iterator's opening draw from torch's generator), the epoch (or iteration) recorded in
    ``out/precise.json``."""

    priority = "ABOVE_NORMAL"

    def __init__(self, out, batches=2):
        self.out = Path(out)
        self.batches = batches
        self.ran = []

    def _run(self, runner, at):
        runner.logger.info("Running Precise BN for %d batches...", self.batches)
        model = getattr(runner.model, "module", runner.model)
        with torch.no_grad():
            for data in itertools.islice(runner.train_loop.dataloader, self.batches):
                model(**model.data_preprocessor(data, False))
        self.ran.append(at)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "precise.json").write_text(json.dumps(self.ran))

    def after_train_epoch(self, runner):
        if isinstance(runner.train_loop, EpochBasedTrainLoop):
            self._run(runner, runner.epoch)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if isinstance(runner.train_loop, IterBasedTrainLoop) and (runner.iter + 1) % 4 == 0:
            self._run(runner, runner.iter)


@LOOPS.register_module()
class CountingValLoop(ValLoop):
    """mmengine's ``ValLoop``, counting its passes into ``out/val_passes.json``."""

    def __init__(self, runner, dataloader, evaluator, out, fp16=False):
        super().__init__(runner, dataloader, evaluator, fp16)
        self.out = Path(out)
        self.passes = 0

    def run(self):
        metrics = super().run()
        self.passes += 1
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "val_passes.json").write_text(json.dumps(self.passes))
        return metrics


@LOOPS.register_module()
class TaggedEpochLoop(EpochBasedTrainLoop):
    """mmengine's ``EpochBasedTrainLoop`` under another name (a package's own training loop)."""
