"""A run that is about to overwrite a checkpoint another run committed in the same work dir
says so first, naming the checkpoint and the run it came from (the quickstart under DDP,
run after the one-process quickstart with the same default work dir, replaced its
``iter_100.pth`` without a word). A run saving a name again, or a run that resumed from the
checkpoint it replaces, goes on quietly."""

from __future__ import annotations

import logging

from shardwise.strategies import SingleDeviceStrategy
from tests.toy import ToyNet

OPTIM = dict(optimizer=dict(type="SGD", lr=0.1))


class _Said:
    """The warnings the ``shardwise`` logger gives while the block runs."""

    def __enter__(self) -> list[str]:
        self.lines: list[str] = []
        self.handler = logging.Handler(logging.WARNING)
        self.handler.emit = lambda record: self.lines.append(record.getMessage())  # type: ignore[method-assign]
        logging.getLogger("shardwise").addHandler(self.handler)
        return self.lines

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("shardwise").removeHandler(self.handler)


def _strategy(work_dir) -> SingleDeviceStrategy:
    strategy = SingleDeviceStrategy(work_dir=str(work_dir))
    strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    return strategy


def test_overwriting_another_runs_checkpoint_names_it_and_that_run(tmp_path):
    first = _strategy(tmp_path)
    first.save_checkpoint("iter_100.pth")
    second = _strategy(tmp_path)
    with _Said() as said:
        second.save_checkpoint("iter_100.pth")
    overwriting = [line for line in said if "Overwriting" in line]
    assert overwriting == [
        f"Overwriting {tmp_path / 'iter_100.pth'}, which another run committed in this work "
        f"dir (the run logged in {first.log_dir}); give each run its own work_dir "
        "(--work-dir) to keep both"
    ]


def test_a_run_saving_a_name_again_or_resuming_goes_on_quietly(tmp_path):
    first = _strategy(tmp_path)
    first.save_checkpoint("latest.pth")
    with _Said() as said:
        first.save_checkpoint("latest.pth")  # the same run
        resumed = _strategy(tmp_path)
        resumed.resume("latest.pth")
        resumed.save_checkpoint("latest.pth")  # the run it continues
    assert not [line for line in said if "Overwriting" in line], said
