"""ParamSchedulerHook: steps the parameter schedulers after each iteration or epoch."""

from __future__ import annotations

from typing import Any

from shardwise.registry import HOOKS

from .hook import Hook

__all__ = ["ParamSchedulerHook"]


@HOOKS.register_module()
class ParamSchedulerHook(Hook):
    """Steps iteration-based schedulers (``by_epoch=False``, or converted with
    ``convert_to_iter_based``) after every training iteration, and epoch-based ones after
    every training epoch."""

    priority = "LOW"

    def after_train_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        for scheduler in _schedulers(runner):
            if not scheduler.by_epoch:
                scheduler.step()

    def after_train_epoch(self, runner) -> None:
        for scheduler in _schedulers(runner):
            if scheduler.by_epoch:
                scheduler.step()


def _schedulers(runner) -> list[Any]:
    schedulers = runner.param_schedulers
    if not schedulers:
        return []
    if isinstance(schedulers, dict):
        return [s for group in schedulers.values() for s in group]
    return list(schedulers)
