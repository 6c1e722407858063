"""A short Runner run with a progress bar, for tests/test_console_output.py, which reads what
it prints: ``python -m tests.console_run WORK_DIR``. 40 iterations, a console line every 10;
iteration 7 emits a Python warning and a line from a child of the ``shardwise`` logger."""

from __future__ import annotations

import logging
import sys
import time
import warnings

import tests.test_runner_support  # noqa: F401 - registers the toy model and data
from shardwise.registry import HOOKS
from shardwise.runner import Hook, Runner


@HOOKS.register_module()
class ChattyHook(Hook):
    """Sleeps a little each iteration (so that the bar redraws) and speaks at iteration 7."""

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        time.sleep(0.03)
        if runner.iter + 1 == 7:
            warnings.warn("a warning at iteration 7", UserWarning, stacklevel=1)
            logging.getLogger("shardwise.console_run").info("a module's line at iteration 7")


def main(work_dir: str) -> None:
    Runner(
        model=dict(type="DropoutRegressor"),
        work_dir=work_dir,
        train_dataloader=dict(dataset=dict(type="RegressionData", n=64), batch_size=8),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=40),
        default_hooks=dict(logger=dict(interval=10, progress_bar=True), checkpoint=None),
        custom_hooks=[dict(type="ChattyHook")],
        randomness=dict(seed=0),
    ).train()


if __name__ == "__main__":
    main(sys.argv[1])
