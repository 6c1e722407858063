"""The Hook base class: callbacks the runner calls at fixed points of training and validation.

A hook overrides the methods of the stages it cares about; the runner calls every registered
hook's method in priority order (see :mod:`shardwise.runner.priority`). The names and
arguments are mmengine's, so hooks written for mmengine's runner work here.

Example::

    @HOOKS.register_module()
    class PrintLossHook(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if self.every_n_train_iters(runner, 100):
                runner.logger.info('loss %.3f', outputs['loss'])
"""

from __future__ import annotations

from typing import Any

__all__ = ["Hook"]


class Hook:
    """Base class of the hooks; every method does nothing.

    ``priority`` (a class attribute; ``'NORMAL'`` by default) orders hooks: lower runs
    earlier. A config may override it: ``dict(type='MyHook', priority='LOW')``.
    """

    priority: int | str = "NORMAL"
    stages = (
        "before_run",
        "after_load_checkpoint",
        "before_train",
        "before_train_epoch",
        "before_train_iter",
        "after_train_iter",
        "after_train_epoch",
        "before_val",
        "before_val_epoch",
        "before_val_iter",
        "after_val_iter",
        "after_val_epoch",
        "after_val",
        "before_save_checkpoint",
        "after_train",
        "after_run",
    )

    def before_run(self, runner) -> None:
        """Once, before the first loop starts (after the checkpoint is loaded)."""

    def after_run(self, runner) -> None:
        """Once, after the last loop ends."""

    def before_train(self, runner) -> None:
        """Before the training loop."""

    def after_train(self, runner) -> None:
        """After the training loop."""

    def before_train_epoch(self, runner) -> None:
        """Before each training epoch (once in an iteration-based loop)."""

    def after_train_epoch(self, runner) -> None:
        """After each training epoch (once in an iteration-based loop)."""

    def before_train_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        """Before each training iteration."""

    def after_train_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        """After each training iteration; ``outputs`` are the logged values (``loss``, ...)."""

    def before_val(self, runner) -> None:
        """Before a validation run."""

    def after_val(self, runner) -> None:
        """After a validation run."""

    def before_val_epoch(self, runner) -> None:
        """Before the pass over the validation data."""

    def after_val_epoch(self, runner, metrics: dict[str, float] | None = None) -> None:
        """After the pass over the validation data, with the evaluator's metrics."""

    def before_val_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        """Before each validation iteration."""

    def after_val_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        """After each validation iteration, with the model's outputs."""

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Before a checkpoint is written; may add entries to ``checkpoint``."""

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """After a checkpoint is read (resume or load); may read entries of ``checkpoint``."""

    # ------------------------------------------------------------------ helpers (mmengine's)
    def every_n_epochs(self, runner, n: int, start: int = 0) -> bool:
        """Whether the epoch that just ended (``runner.epoch + 1``) is a multiple of ``n``."""
        done = runner.epoch + 1 - start
        return n > 0 and done >= 0 and done % n == 0

    def every_n_inner_iters(self, batch_idx: int, n: int) -> bool:
        """Whether iteration ``batch_idx + 1`` of the epoch is a multiple of ``n``."""
        return n > 0 and (batch_idx + 1) % n == 0

    def every_n_train_iters(self, runner, n: int, start: int = 0) -> bool:
        """Whether the iteration that just ran (``runner.iter + 1``) is a multiple of ``n``."""
        done = runner.iter + 1 - start
        return n > 0 and done >= 0 and done % n == 0

    def end_of_epoch(self, dataloader, batch_idx: int) -> bool:
        """Whether ``batch_idx`` is the last batch of ``dataloader``."""
        return batch_idx + 1 == len(dataloader)

    def is_last_train_epoch(self, runner) -> bool:
        return runner.epoch + 1 == runner.max_epochs

    def is_last_train_iter(self, runner) -> bool:
        return runner.iter + 1 == runner.max_iters

    def get_triggered_stages(self) -> list[str]:
        """The stages whose method this hook overrides."""
        return [s for s in self.stages if getattr(type(self), s) is not getattr(Hook, s)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(priority={self.priority!r})"
