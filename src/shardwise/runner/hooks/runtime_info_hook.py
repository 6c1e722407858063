"""RuntimeInfoHook: keeps the message hub current (loop stage, epoch, iteration, LR, logged
values), under mmengine's keys."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import shardwise
from shardwise.config import redact_secrets
from shardwise.registry import HOOKS

from .hook import Hook

__all__ = ["RuntimeInfoHook"]


@HOOKS.register_module()
class RuntimeInfoHook(Hook):
    """Publishes, as mmengine's ``RuntimeInfoHook`` does:

    - runtime information: ``cfg``, ``seed``, ``experiment_name`` (before the run);
      ``loop_stage`` (``'train'``, ``'val'`` or ``'test'`` while that loop runs; back to
      ``'train'`` after a validation inside training, removed after the loop); ``epoch``,
      ``iter``, ``max_epochs``, ``max_iters`` and the training dataset's ``dataset_meta``
      (its ``metainfo``, when it has one);
    - scalars: the learning rates before each training iteration (``train/lr``, or
      ``train/<name>.lr`` per optimizer of an ``OptimWrapperDict``), the training step's
      logged values (``train/<name>``), and the validation and test metrics
      (``val/<name>``, ``test/<name>``; a metric that is not one number goes into the
      runtime information under the same key).
    """

    priority = "VERY_HIGH"

    def __init__(self) -> None:
        self.last_loop_stage: str | None = None

    def before_run(self, runner) -> None:
        runner.message_hub.update_info_dict(
            dict(
                cfg=redact_secrets(runner.cfg).pretty_text,
                seed=runner.seed,
                experiment_name=runner.experiment_name,
                shardwise_version=shardwise.__version__,
            )
        )
        self.last_loop_stage = None

    def before_train(self, runner) -> None:
        hub = runner.message_hub
        hub.update_info("loop_stage", "train")
        hub.update_info_dict(
            dict(
                epoch=runner.epoch,
                iter=runner.iter,
                max_epochs=runner.max_epochs,
                max_iters=runner.max_iters,
            )
        )
        dataset = getattr(runner.train_dataloader, "dataset", None)
        if hasattr(dataset, "metainfo"):
            hub.update_info("dataset_meta", dataset.metainfo)

    def after_train(self, runner) -> None:
        runner.message_hub.pop_info("loop_stage")

    def before_train_epoch(self, runner) -> None:
        runner.message_hub.update_info("epoch", runner.epoch)

    def before_train_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        hub = runner.message_hub
        hub.update_info("iter", runner.iter)
        lr_dict = runner.optim_wrapper.get_lr()
        if not isinstance(lr_dict, dict):
            raise AssertionError(
                "`runner.optim_wrapper.get_lr()` should return a dict of learning rate when "
                "training with OptimWrapper(single optimizer) or OptimWrapperDict(multiple "
                f"optimizer), but got {type(lr_dict)}: check that the optimizer constructor "
                "returns an OptimWrapper or an OptimWrapperDict"
            )
        for name, lrs in lr_dict.items():
            hub.update_scalar(f"train/{name}", lrs[0])

    def after_train_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        if outputs is not None:
            for key, value in outputs.items():
                runner.message_hub.update_scalar(f"train/{key}", value)

    def before_val(self, runner) -> None:
        self.last_loop_stage = runner.message_hub.get_info("loop_stage")
        runner.message_hub.update_info("loop_stage", "val")

    def after_val_epoch(self, runner, metrics: dict[str, Any] | None = None) -> None:
        _record_metrics(runner, metrics, "val")

    def after_val(self, runner) -> None:
        if self.last_loop_stage == "train":
            runner.message_hub.update_info("loop_stage", self.last_loop_stage)
            self.last_loop_stage = None
        else:
            runner.message_hub.pop_info("loop_stage")

    def before_test(self, runner) -> None:
        runner.message_hub.update_info("loop_stage", "test")

    def after_test(self, runner) -> None:
        runner.message_hub.pop_info("loop_stage")

    def after_test_epoch(self, runner, metrics: dict[str, Any] | None = None) -> None:
        _record_metrics(runner, metrics, "test")


def _record_metrics(runner, metrics: dict[str, Any] | None, mode: str) -> None:
    """One-number metrics as ``{mode}/<name>`` scalars, the others as runtime information."""
    for key, value in (metrics or {}).items():
        if _is_scalar(value):
            runner.message_hub.update_scalar(f"{mode}/{key}", value)
        else:
            runner.message_hub.update_info(f"{mode}/{key}", value)


def _is_scalar(value: Any) -> bool:
    """A number, a numpy scalar, or a one-element array or tensor (mmengine's rule)."""
    if isinstance(value, np.ndarray):
        return value.size == 1
    if isinstance(value, int | float | np.number):
        return True
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return False
