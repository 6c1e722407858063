"""The Hook base class: callbacks the runner calls at fixed points of training, validation
and testing.

A hook overrides the methods of the stages it cares about; the runner calls every registered
hook's method in priority order (see :mod:`shardwise.runner.priority`). The names, arguments
and call order are mmengine's, so hooks written for mmengine's runner work here. As in
mmengine, the epoch and iteration points of the three loops fall back on four methods that
take the loop as ``mode`` (``'train'``, ``'val'`` or ``'test'``): override
``_before_iter(runner, batch_idx, data_batch, mode)`` to act before the iterations of every
loop.

Example::

    @HOOKS.register_module()
    class PrintLossHook(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if self.every_n_train_iters(runner, 100):
                runner.logger.info('loss %.3f', outputs['loss'].item())
"""

from __future__ import annotations

from typing import Any

__all__ = ["Hook"]

# The loop-specific methods that fall back on each mode-generic one (mmengine's mapping).
_MODE_METHODS = {
    f"_{when}_{unit}": [f"{when}_{mode}_{unit}" for mode in ("train", "val", "test")]
    for when in ("before", "after")
    for unit in ("epoch", "iter")
}


class Hook:
    """Base class of the hooks; every method does nothing (the loop-specific epoch and
    iteration methods call the mode-generic ones, which do nothing).

    ``priority`` (a class attribute; ``'NORMAL'`` by default) orders hooks: lower runs
    earlier. A config may override it: ``dict(type='MyHook', priority='LOW')``.

    The runner calls, in this order: ``before_run``; ``after_load_checkpoint`` (when it
    loads one); ``before_train``, then per epoch ``before_train_epoch``, per iteration
    ``before_train_iter`` and ``after_train_iter``, then ``after_train_epoch`` (an
    iteration-based loop is one long epoch); validation runs
    ``before_val``/``before_val_epoch``/``*_val_iter``/``after_val_epoch``/``after_val``
    after the epochs (or iterations) it follows; ``after_train``; ``after_run``. ``test()``
    runs the ``*_test*`` points the same way. ``before_save_checkpoint`` comes with every
    save (from ``CheckpointHook``, after the hooks of the stage that saves).
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
        "before_test",
        "before_test_epoch",
        "before_test_iter",
        "after_test_iter",
        "after_test_epoch",
        "after_test",
        "after_run",
    )

    # ------------------------------------------------------------------ run and checkpoints
    def before_run(self, runner) -> None:
        """Once per ``train()``, ``val()`` or ``test()``, before the checkpoint is loaded."""

    def after_run(self, runner) -> None:
        """Once per ``train()``, ``val()`` or ``test()``, after its loop ends."""

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Before a checkpoint is written; may add entries to ``checkpoint``."""

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """After a checkpoint is read (resume or load); may read entries of ``checkpoint``."""

    # ------------------------------------------------------------------ loops
    def before_train(self, runner) -> None:
        """Before the training loop (after the checkpoint is loaded)."""

    def after_train(self, runner) -> None:
        """After the training loop."""

    def before_val(self, runner) -> None:
        """Before a validation run."""

    def after_val(self, runner) -> None:
        """After a validation run."""

    def before_test(self, runner) -> None:
        """Before a test run."""

    def after_test(self, runner) -> None:
        """After a test run."""

    # ------------------------------------------------------------------ epochs
    def before_train_epoch(self, runner) -> None:
        """Before each training epoch (once in an iteration-based loop)."""
        self._before_epoch(runner, mode="train")

    def before_val_epoch(self, runner) -> None:
        """Before the pass over the validation data."""
        self._before_epoch(runner, mode="val")

    def before_test_epoch(self, runner) -> None:
        """Before the pass over the test data."""
        self._before_epoch(runner, mode="test")

    def after_train_epoch(self, runner) -> None:
        """After each training epoch (once in an iteration-based loop)."""
        self._after_epoch(runner, mode="train")

    def after_val_epoch(self, runner, metrics: dict[str, Any] | None = None) -> None:
        """After the pass over the validation data, with the evaluator's metrics."""
        self._after_epoch(runner, mode="val")

    def after_test_epoch(self, runner, metrics: dict[str, Any] | None = None) -> None:
        """After the pass over the test data, with the evaluator's metrics."""
        self._after_epoch(runner, mode="test")

    # ------------------------------------------------------------------ iterations
    def before_train_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        """Before each training iteration (``batch_idx``: within the epoch; the iteration
        itself in an iteration-based loop)."""
        self._before_iter(runner, batch_idx=batch_idx, data_batch=data_batch, mode="train")

    def before_val_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        """Before each validation iteration."""
        self._before_iter(runner, batch_idx=batch_idx, data_batch=data_batch, mode="val")

    def before_test_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        """Before each test iteration."""
        self._before_iter(runner, batch_idx=batch_idx, data_batch=data_batch, mode="test")

    def after_train_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        """After each training iteration; ``outputs``: the logged values as 0-dim tensors
        (``loss``, ...), averaged over the ranks."""
        self._after_iter(
            runner, batch_idx=batch_idx, data_batch=data_batch, outputs=outputs, mode="train"
        )

    def after_val_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        """After each validation iteration, with the model's outputs."""
        self._after_iter(
            runner, batch_idx=batch_idx, data_batch=data_batch, outputs=outputs, mode="val"
        )

    def after_test_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        """After each test iteration, with the model's outputs."""
        self._after_iter(
            runner, batch_idx=batch_idx, data_batch=data_batch, outputs=outputs, mode="test"
        )

    # ------------------------------------------------------------------ any loop (mode)
    def _before_epoch(self, runner, mode: str = "train") -> None:
        """Before each epoch of the ``mode`` loop."""

    def _after_epoch(self, runner, mode: str = "train") -> None:
        """After each epoch of the ``mode`` loop."""

    def _before_iter(
        self, runner, batch_idx: int, data_batch: Any = None, mode: str = "train"
    ) -> None:
        """Before each iteration of the ``mode`` loop."""

    def _after_iter(
        self,
        runner,
        batch_idx: int,
        data_batch: Any = None,
        outputs: Any = None,
        mode: str = "train",
    ) -> None:
        """After each iteration of the ``mode`` loop."""

    # ------------------------------------------------------------------ helpers (mmengine's)
    def every_n_epochs(self, runner, n: int, start: int = 0) -> bool:
        """Whether the epoch that just ended (``runner.epoch + 1``), counted from ``start``,
        is a multiple of ``n``."""
        done = runner.epoch + 1 - start
        return n > 0 and done >= 0 and done % n == 0

    def every_n_inner_iters(self, batch_idx: int, n: int) -> bool:
        """Whether iteration ``batch_idx + 1`` of the epoch is a multiple of ``n``."""
        return n > 0 and (batch_idx + 1) % n == 0

    def every_n_train_iters(self, runner, n: int, start: int = 0) -> bool:
        """Whether the iteration that just ran (``runner.iter + 1``), counted from ``start``,
        is a multiple of ``n``."""
        done = runner.iter + 1 - start
        return n > 0 and done >= 0 and done % n == 0

    def end_of_epoch(self, dataloader, batch_idx: int) -> bool:
        """Whether ``batch_idx`` is the last batch of ``dataloader``."""
        return batch_idx + 1 == len(dataloader)

    def is_last_train_epoch(self, runner) -> bool:
        """Whether the current epoch is the last training epoch."""
        return runner.epoch + 1 == runner.max_epochs

    def is_last_train_iter(self, runner) -> bool:
        """Whether the current iteration is the last training iteration."""
        return runner.iter + 1 == runner.max_iters

    def get_triggered_stages(self) -> list[str]:
        """The stages at which this hook does something: those whose method it overrides,
        and those that fall back on a mode-generic method it overrides (``_before_iter``:
        the ``before_*_iter`` of the three loops); in the order of :attr:`stages`."""
        overridden = {name for name in self.stages if _overrides(self, name)}
        for method, stages in _MODE_METHODS.items():
            if _overrides(self, method):
                overridden.update(stages)
        return [stage for stage in self.stages if stage in overridden]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(priority={self.priority!r})"


def _overrides(hook: Hook, name: str) -> bool:
    return getattr(type(hook), name) is not getattr(Hook, name)
