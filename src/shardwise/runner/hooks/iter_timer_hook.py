"""IterTimerHook: data time, step time and throughput of every iteration."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from shardwise.registry import HOOKS

from .hook import Hook

__all__ = ["IterTimerHook"]


@HOOKS.register_module()
class IterTimerHook(Hook):
    """Records, as mmengine's ``IterTimerHook`` does (through ``time.time``):
    ``{mode}/data_time`` (waiting for the batch) and ``{mode}/time`` (the whole iteration)
    as scalars, and the estimated seconds left in the loop as the runtime information
    ``eta``; plus the throughput of all ranks together: ``{mode}/tokens_per_sec`` when the
    inputs are integer ids of shape (batch, sequence), else ``{mode}/samples_per_sec``.
    ``mode`` is ``train``, ``val`` or ``test``."""

    priority = "NORMAL"

    def __init__(self) -> None:
        self.time_sec_tot = 0.0  # training seconds since before_train
        self.time_sec_test_val = 0.0  # seconds of the current validation or test epoch
        self.start_iter = 0
        self.t = time.time()

    def before_train(self, runner) -> None:
        self.start_iter = runner.iter  # after a resume: the ETA counts this run's iterations

    def _before_epoch(self, runner, mode: str = "train") -> None:
        self.t = time.time()

    def _after_epoch(self, runner, mode: str = "train") -> None:
        self.time_sec_test_val = 0.0

    def after_val(self, runner) -> None:
        self.t = time.time()  # validation time is not the next training batch's data time

    def _before_iter(
        self, runner, batch_idx: int, data_batch: Any = None, mode: str = "train"
    ) -> None:
        runner.message_hub.update_scalar(f"{mode}/data_time", time.time() - self.t)

    def _after_iter(
        self,
        runner,
        batch_idx: int,
        data_batch: Any = None,
        outputs: Any = None,
        mode: str = "train",
    ) -> None:
        hub = runner.message_hub
        elapsed = time.time() - self.t
        hub.update_scalar(f"{mode}/time", elapsed)
        self.t = time.time()
        if mode == "train":
            self.time_sec_tot += elapsed
            average = self.time_sec_tot / (runner.iter - self.start_iter + 1)
            hub.update_info("eta", average * (runner.max_iters - runner.iter - 1))
        else:
            loader = runner.val_dataloader if mode == "val" else runner.test_dataloader
            self.time_sec_test_val += elapsed
            average = self.time_sec_test_val / (batch_idx + 1)
            try:
                length = len(loader)
            except TypeError:  # an iterable dataset has no length, and no ETA
                length = None
            if length is not None:
                hub.update_info("eta", average * (length - batch_idx - 1))
        count, unit = batch_size(data_batch)
        if count and elapsed > 0:
            replicas = runner.strategy.data_parallel_size  # tensor-parallel peers share batches
            hub.update_scalar(f"{mode}/{unit}_per_sec", count * replicas / elapsed)


def batch_size(data_batch: Any) -> tuple[int, str]:
    """``(count, unit)`` of a batch: tokens for integer (batch, sequence) inputs, else samples
    (a list of inputs, as mmengine's ``pseudo_collate`` leaves them: one sample each)."""
    listed = data_batch.get("inputs") if isinstance(data_batch, Mapping) else None
    if isinstance(listed, list | tuple) and listed and isinstance(listed[0], torch.Tensor):
        return len(listed), "samples"
    inputs = _first_tensor(data_batch)
    if inputs is None:
        return 0, "samples"
    if not inputs.is_floating_point() and inputs.dim() >= 2:
        return inputs.numel(), "tokens"
    return (inputs.shape[0] if inputs.dim() else 1), "samples"


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        obj = [obj["inputs"]] if "inputs" in obj else list(obj.values())
    if isinstance(obj, Sequence) and not isinstance(obj, str):
        for item in obj:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None
