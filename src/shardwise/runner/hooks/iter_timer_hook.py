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
    """Records ``data_time`` (waiting for the batch), ``time`` (the whole iteration) and the
    throughput of all ranks together: ``tokens_per_sec`` when the inputs are integer ids of
    shape (batch, sequence), else ``samples_per_sec``; as ``train/...``, ``val/...`` and
    ``test/...`` scalars."""

    priority = "NORMAL"

    def __init__(self) -> None:
        self._start: dict[str, float] = {}

    def _reset(self, mode: str) -> None:
        self._start[mode] = time.perf_counter()

    def before_train(self, runner) -> None:
        self._reset("train")

    def _before_epoch(self, runner, mode: str = "train") -> None:
        self._reset(mode)

    def after_val(self, runner) -> None:
        self._reset("train")  # validation time is not training data time

    def _before_iter(
        self, runner, batch_idx: int, data_batch: Any = None, mode: str = "train"
    ) -> None:
        now = time.perf_counter()
        runner.message_hub.update_scalar(f"{mode}/data_time", now - self._start.get(mode, now))

    def _after_iter(
        self,
        runner,
        batch_idx: int,
        data_batch: Any = None,
        outputs: Any = None,
        mode: str = "train",
    ) -> None:
        now = time.perf_counter()
        elapsed = max(now - self._start.get(mode, now), 1e-9)
        self._start[mode] = now
        hub = runner.message_hub
        hub.update_scalar(f"{mode}/time", elapsed)
        count, unit = batch_size(data_batch)
        if count:
            replicas = runner.strategy.data_parallel_size  # tensor-parallel peers share batches
            hub.update_scalar(f"{mode}/{unit}_per_sec", count * replicas / elapsed)


def batch_size(data_batch: Any) -> tuple[int, str]:
    """``(count, unit)`` of a batch: tokens for integer (batch, sequence) inputs, else samples."""
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
