"""Training, validation and test loops: epoch-based, iteration-based, and one pass over
the validation or test data.

The loops call the runner's hooks at mmengine's points and with mmengine's arguments, keep
the position (``epoch``, ``iter``) that checkpoints record, and continue a resumed run with
exactly the next batch: the data epoch and the number of batches consumed in it follow
from ``iter`` and the epoch length, and the sampler starts there without loading the
batches before it.

A dataloader built for a dataset of mmengine's reports each of its openings to the Runner's
compatibility policy (``runner.compat``, :mod:`shardwise.integrations.openmmlab_compat`), which
makes the draws mmengine's Runner makes there; a resumed run tells it where the run it
continues stood: the training position and the validation passes made. The loops hand the
dataset's ``metainfo`` to the evaluator and the visualizer, as mmengine's loops do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from shardwise.registry import LOOPS

from .data import set_sampler_seed, start_epoch

__all__ = [
    "BaseLoop",
    "EpochBasedTrainLoop",
    "IterBasedTrainLoop",
    "ValLoop",
    "TestLoop",
    "share_metainfo",
]


def share_metainfo(runner: Any, dataloader: Any, evaluator: Any = None) -> None:
    """The dataset's ``metainfo`` (an mmengine dataset's classes...) to the evaluator and
    its metrics and to the runner's visualizer, as mmengine's loops hand it over."""
    metainfo = getattr(getattr(dataloader, "dataset", None), "metainfo", None)
    if metainfo is None:
        return
    if evaluator is not None:
        evaluator.dataset_meta = metainfo
    visualizer = getattr(runner, "visualizer", None)
    if visualizer is not None and hasattr(visualizer, "dataset_meta"):
        visualizer.dataset_meta = metainfo


class BaseLoop:
    """A loop over ``dataloader`` driven by ``runner``; subclasses implement :meth:`run`."""

    def __init__(self, runner, dataloader) -> None:
        self.runner = runner
        self.dataloader = dataloader

    def run(self) -> Any:
        raise NotImplementedError


class _TrainLoop(BaseLoop):
    by_epoch: bool
    #: Whether mmengine's loop of this kind opens its data iterator when it is built (before
    #: the model's ``init_weights``): its ``IterBasedTrainLoop`` does.
    opens_data_when_built = False

    def __init__(self, runner, dataloader, val_begin: int, val_interval: int) -> None:
        super().__init__(runner, dataloader)
        self.epoch_length = len(dataloader)
        if self.epoch_length == 0:
            raise ValueError(
                "the training dataloader yields no batch (an empty dataset, or fewer samples "
                "than batch_size * world_size with drop_last=True)"
            )
        self.val_begin = val_begin
        self.val_interval = val_interval
        self.stop_training = False
        self._epoch = 0
        self._iter = 0
        self._skip = 0  # batches of the current data epoch consumed before a resume
        self._validating = False
        share_metainfo(runner, dataloader)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def iter(self) -> int:
        return self._iter

    @property
    def max_epochs(self) -> int:
        return self._max_epochs

    @property
    def max_iters(self) -> int:
        return self._max_iters

    @property
    def data_epoch(self) -> int:
        """The epoch the sampler shuffles for (the epoch of the current batch)."""
        return self._iter // self.epoch_length if not self.by_epoch else self._epoch

    def state_dict(self) -> dict[str, Any]:
        """The position a checkpoint's ``meta`` records (mmengine's ``epoch`` and ``iter``,
        with the epoch length it was reached with; ``in_validation`` for a save made during
        a validation pass whose opening drew, see :meth:`_replay_validation_draw`)."""
        state = dict(epoch=self._epoch, iter=self._iter, epoch_length=self.epoch_length)
        val_loop = self.runner.val_loop
        if self._validating and self.runner.compat.draws_at_open(val_loop.dataloader):
            state["in_validation"] = True
        return state

    def load_state_dict(self, meta: dict[str, Any]) -> None:
        """Continue from a checkpoint's ``meta``: the position (:meth:`restore`) and the
        sampler's seed (the random state is restored first: the strategy's states load before
        the runner's)."""
        self.restore(meta.get("epoch", 0), meta.get("iter", 0), meta.get("epoch_length"))
        set_sampler_seed(self.dataloader, self.runner._data_seed())
        self.runner.compat.resume_train(self, epoch=self.data_epoch, skip=self._skip)
        self._replay_validation_draw(meta)
        self.runner.logger.info(
            "Continuing at epoch %d, iteration %d (completed, as the checkpoint's meta and "
            "shardwise ckpt inspect count them)",
            self.epoch,
            self.iter,
        )

    def _replay_validation_draw(self, meta: dict[str, Any]) -> None:
        """Tell the policy which validation passes the run this one continues made: those
        before the checkpoint's position, and the one due at it (the checkpoint was saved
        before it, or during it: ``in_validation``), which this run does not repeat; the
        policy replays that pass's draw, so that the random state continues as that run's."""
        val_loop = self.runner.val_loop
        if val_loop is None:
            return
        count = self._iter if not self.by_epoch else self._epoch
        at_boundary = not self.by_epoch or self._skip == 0
        last = self._max_count()
        due = count > 0 and self._validate_now(count, count == last)
        replay = due and at_boundary and not meta.get("in_validation")
        earlier = any(self._validate_now(k, k == last) for k in range(1, count))
        self.runner.compat.resume_eval_passes(
            val_loop.dataloader, opened_before=earlier or (due and not replay), replay=replay
        )

    def _max_count(self) -> int:
        return self._max_epochs if self.by_epoch else self._max_iters

    def _validate(self) -> None:
        self._validating = True
        try:
            self.runner.val_loop.run()
        finally:
            self._validating = False

    def restore(self, epoch: int, iteration: int, epoch_length: int | None = None) -> None:
        """Continue from a checkpoint's position: ``epoch`` and ``iteration`` as its ``meta``
        records them; ``epoch_length`` is the number of batches per epoch it was saved with."""
        self._epoch, self._iter = int(epoch), int(iteration)
        if epoch_length is not None and epoch_length != self.epoch_length:
            self.runner.logger.warning(
                "The checkpoint was saved with %d batches per epoch and this run has %d (another "
                "world size or batch size?): the resumed epoch starts from its first batch.",
                epoch_length,
                self.epoch_length,
            )
            self._skip = 0
            return
        consumed = self._iter - self._epoch * self.epoch_length if self.by_epoch else None
        if consumed is None:
            consumed = self._iter % self.epoch_length
        self._skip = consumed if 0 <= consumed <= self.epoch_length else 0

    def run_iter(self, batch_idx: int, data_batch: Any) -> None:
        runner = self.runner
        runner.call_hook("before_train_iter", batch_idx=batch_idx, data_batch=data_batch)
        outputs = runner.train_step(data_batch)
        runner.call_hook(
            "after_train_iter", batch_idx=batch_idx, data_batch=data_batch, outputs=outputs
        )
        runner.snapshot_to_memory()
        self._iter += 1

    def _validate_now(self, count: int, last: bool) -> bool:
        return (
            self.runner.val_loop is not None
            and count >= self.val_begin
            and (count % self.val_interval == 0 or last)
        )


@LOOPS.register_module()
class EpochBasedTrainLoop(_TrainLoop):
    """Train for ``max_epochs`` passes over the data; validate every ``val_interval`` epochs
    from epoch ``val_begin`` on (and after the last one)."""

    by_epoch = True

    def __init__(
        self,
        runner,
        dataloader,
        max_epochs: int,
        val_begin: int = 1,
        val_interval: int = 1,
    ) -> None:
        super().__init__(runner, dataloader, val_begin, val_interval)
        self._max_epochs = int(max_epochs)
        self._max_iters = self._max_epochs * self.epoch_length

    def run(self) -> Any:
        runner = self.runner
        runner.call_hook("before_train")
        while self._epoch < self._max_epochs and not self.stop_training:
            self.run_epoch()
            if self._validate_now(self._epoch, self._epoch == self._max_epochs):
                self._validate()
        runner.call_hook("after_train")
        return runner.model

    def run_epoch(self) -> None:
        runner = self.runner
        runner.call_hook("before_train_epoch")
        runner.model.train()
        skip, self._skip = self._skip, 0
        batches = start_epoch(self.dataloader, self._epoch, skip_batches=skip)
        for batch_idx, data_batch in enumerate(batches, start=skip):
            self.run_iter(batch_idx, data_batch)
            if self.stop_training:
                break
        runner.call_hook("after_train_epoch")
        self._epoch += 1


class _EndlessBatches:
    """Batches of data epoch after data epoch, starting at a given position (a new iterator
    at each new data epoch)."""

    def __init__(self, loader, epoch: int, skip: int) -> None:
        self.loader = loader
        self.epoch = epoch
        self._batches: Iterator[Any] = start_epoch(loader, epoch, skip_batches=skip)

    def __next__(self) -> Any:
        try:
            return next(self._batches)
        except StopIteration:
            self.epoch += 1
            self._batches = start_epoch(self.loader, self.epoch)
            return next(self._batches)


@LOOPS.register_module()
class IterBasedTrainLoop(_TrainLoop):
    """Train for ``max_iters`` iterations, going round the data as often as needed;
    validate every ``val_interval`` iterations from ``val_begin`` on (and after the last)."""

    by_epoch = False
    opens_data_when_built = True

    def __init__(
        self,
        runner,
        dataloader,
        max_iters: int,
        val_begin: int = 1,
        val_interval: int = 1000,
    ) -> None:
        super().__init__(runner, dataloader, val_begin, val_interval)
        self._max_iters = int(max_iters)
        # mmengine's numbering: the whole run is one epoch, so ``epoch`` stays 0 (or what a
        # resumed checkpoint's meta says) and ``max_epochs`` is 1; the sampler's epoch is
        # ``data_epoch``
        self._max_epochs = 1

    def run(self) -> Any:
        runner = self.runner
        runner.call_hook("before_train")
        runner.call_hook("before_train_epoch")
        skip, self._skip = self._skip, 0
        batches = _EndlessBatches(self.dataloader, self._iter // self.epoch_length, skip)
        while self._iter < self._max_iters and not self.stop_training:
            runner.model.train()
            data_batch = next(batches)
            self.run_iter(self._iter, data_batch)
            if self._validate_now(self._iter, self._iter == self._max_iters):
                self._validate()
        runner.call_hook("after_train_epoch")
        runner.call_hook("after_train")
        return runner.model


class _EvalLoop(BaseLoop):
    """One pass over ``dataloader``: the model's outputs go to the evaluator, whose metrics
    dict :meth:`run` returns. Subclasses name the stage (``mode``): its hooks
    (``before_{mode}``, ``before_{mode}_epoch``, ``before_{mode}_iter``...) and the runner's
    step (``{mode}_step``)."""

    mode: str

    def __init__(self, runner, dataloader, evaluator, fp16: bool = False) -> None:
        super().__init__(runner, dataloader)
        self.evaluator = evaluator
        self.fp16 = fp16
        share_metainfo(runner, dataloader, evaluator)

    def run(self) -> dict[str, Any]:
        runner, mode = self.runner, self.mode
        runner.call_hook(f"before_{mode}")
        runner.call_hook(f"before_{mode}_epoch")
        was_training = runner.model.training
        runner.model.eval()
        for batch_idx, data_batch in enumerate(start_epoch(self.dataloader, 0)):
            self.run_iter(batch_idx, data_batch)
        try:
            size = len(self.dataloader.dataset)
        except TypeError:  # an IterableDataset: keep every result
            size = 0
        metrics = self.evaluator.evaluate(size)
        runner.call_hook(f"after_{mode}_epoch", metrics=metrics)
        runner.call_hook(f"after_{mode}")
        runner.model.train(was_training)
        return metrics

    @torch.no_grad()
    def run_iter(self, batch_idx: int, data_batch: Any) -> None:
        runner, mode = self.runner, self.mode
        runner.call_hook(f"before_{mode}_iter", batch_idx=batch_idx, data_batch=data_batch)
        with self._autocast():
            outputs = getattr(runner, f"{mode}_step")(data_batch)
        self.evaluator.process(data_samples=outputs, data_batch=data_batch)
        runner.call_hook(
            f"after_{mode}_iter", batch_idx=batch_idx, data_batch=data_batch, outputs=outputs
        )

    def _autocast(self):
        if not self.fp16:
            return contextlib.nullcontext()
        device = self.runner.strategy.device.type
        dtype = torch.float16 if device == "cuda" else torch.bfloat16
        return torch.autocast(device, dtype=dtype)


@LOOPS.register_module()
class ValLoop(_EvalLoop):
    """One pass over the validation data (``runner.val_step``, the ``*_val*`` hooks).

    Args:
        fp16: run under autocast (float16 on CUDA, bfloat16 on CPU).
    """

    mode = "val"


@LOOPS.register_module()
class TestLoop(_EvalLoop):
    """One pass over the test data (``runner.test_step``, the ``*_test*`` hooks).

    Args:
        fp16: run under autocast (float16 on CUDA, bfloat16 on CPU).
    """

    __test__ = False  # not a pytest test class
    mode = "test"
