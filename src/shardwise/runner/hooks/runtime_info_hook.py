"""RuntimeInfoHook: keeps the message hub current (epoch, iteration, LR, logged values)."""

from __future__ import annotations

from typing import Any

from shardwise.registry import HOOKS

from .hook import Hook

__all__ = ["RuntimeInfoHook"]


@HOOKS.register_module()
class RuntimeInfoHook(Hook):
    """Records ``epoch``, ``iter``, ``max_epochs`` and ``max_iters`` as runtime information,
    and the learning rates (``train/lr``), the training step's logged values
    (``train/<name>``) and the validation and test metrics (``val/<name>``,
    ``test/<name>``) as scalars."""

    priority = "VERY_HIGH"

    def before_run(self, runner) -> None:
        runner.message_hub.update_info_dict(
            dict(max_epochs=runner.max_epochs, max_iters=runner.max_iters)
        )

    def before_train(self, runner) -> None:
        runner.message_hub.update_info_dict(dict(epoch=runner.epoch, iter=runner.iter))

    def before_train_epoch(self, runner) -> None:
        runner.message_hub.update_info("epoch", runner.epoch)

    def before_train_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        hub = runner.message_hub
        hub.update_info("iter", runner.iter)
        for name, lrs in _learning_rates(runner).items():
            hub.update_scalar(f"train/{name}", lrs[0])

    def after_train_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        if outputs:
            runner.message_hub.update_scalars(outputs, prefix="train/")

    def after_val_epoch(self, runner, metrics: dict[str, float] | None = None) -> None:
        _record_metrics(runner, metrics, "val")

    def after_test_epoch(self, runner, metrics: dict[str, float] | None = None) -> None:
        _record_metrics(runner, metrics, "test")


def _record_metrics(runner, metrics: dict[str, Any] | None, mode: str) -> None:
    """The numeric metrics as ``{mode}/<name>`` scalars."""
    if metrics:
        runner.message_hub.update_scalars(
            {k: v for k, v in metrics.items() if _is_number(v)}, prefix=f"{mode}/"
        )


def _learning_rates(runner) -> dict[str, list[float]]:
    """``{'lr': [...]}`` for one optimizer; ``{'<name>.lr': [...]}`` for several."""
    wrapper = runner.optim_wrapper
    if wrapper is None or not hasattr(wrapper, "get_lr"):
        return {}
    lrs = wrapper.get_lr()
    return {k: v for k, v in lrs.items() if k == "lr" or k.endswith(".lr")}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
