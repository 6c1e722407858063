"""ParamSchedulerHook: steps the parameter schedulers after each iteration or epoch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardwise.optim.scheduler import _ParamScheduler
from shardwise.registry import HOOKS

from .hook import Hook

__all__ = ["ParamSchedulerHook"]


@HOOKS.register_module()
class ParamSchedulerHook(Hook):
    """Steps iteration-based schedulers (``by_epoch=False``, or converted with
    ``convert_to_iter_based``) after every training iteration, epoch-based ones after every
    training epoch, and the epoch-based ones that need the validation metrics
    (``need_val_args``, e.g. ``ReduceOnPlateauLR``) after every validation epoch.

    ``runner.param_schedulers`` is None, a list of schedulers, or a dict of such lists (one
    per optimizer); anything else is a ``TypeError``, as in mmengine.
    """

    priority = "LOW"

    def after_train_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        _step_each(runner, lambda scheduler: not scheduler.by_epoch, lambda s: s.step())

    def after_train_epoch(self, runner) -> None:
        _step_each(runner, lambda scheduler: scheduler.by_epoch, lambda s: s.step())

    def after_val_epoch(self, runner, metrics: dict[str, Any] | None = None) -> None:
        if metrics is None:
            return

        def wants_metrics(scheduler: Any) -> bool:
            return scheduler.by_epoch and getattr(scheduler, "need_val_args", False)

        _step_each(runner, wants_metrics, lambda s: s.step(metrics), real_only=True)


def _step_each(
    runner,
    select: Callable[[Any], bool],
    step: Callable[[Any], None],
    real_only: bool = False,
) -> None:
    """``step`` every scheduler of ``runner.param_schedulers`` that ``select`` picks;
    ``real_only``: only lists made of ``_ParamScheduler`` objects (mmengine's rule for the
    validation step)."""
    schedulers = runner.param_schedulers
    if schedulers is None:
        return
    if isinstance(schedulers, list):
        groups = [schedulers]
    elif isinstance(schedulers, dict):
        groups = list(schedulers.values())
    else:
        raise TypeError(
            "runner.param_schedulers should be list of ParamScheduler or a dict containing "
            f"list of ParamScheduler, but got {schedulers!r}"
        )
    for group in groups:
        if not isinstance(group, list):
            raise TypeError(
                "runner.param_schedulers should be list of ParamScheduler or a dict containing "
                f"list of ParamScheduler, but got a {type(group).__name__} in the dict: {group!r}"
            )
        if real_only and not all(isinstance(s, _ParamScheduler) for s in group):
            continue
        for scheduler in group:
            if select(scheduler):
                step(scheduler)
