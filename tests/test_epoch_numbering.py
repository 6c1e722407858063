"""One epoch numbering everywhere, mmengine's: ``runner.epoch`` and a checkpoint's
``meta['epoch']`` count completed epochs (an iteration-based run is one epoch: 0, as
mmengine's IterBasedTrainLoop keeps it), the console shows ``Epoch(train) [epoch + 1]``, and
a resume's line, the checkpoint's meta and ``shardwise ckpt inspect`` give the same numbers.
(Every hook stage's epoch and iter against mmengine's Runner:
tests/test_runner_hooks_mmengine.py.)"""

from __future__ import annotations

import json
import re

import pytest
import torch

from shardwise.checkpoint.inspect import inspect_checkpoint
from shardwise.runner import Runner
from tests.test_runner_support import RegressionData  # noqa: F401 - registers the toy data


def _runner(work_dir, train_cfg, checkpoint, batch_size=8, resume=False) -> Runner:
    return Runner(
        model=dict(type="DropoutRegressor"),
        work_dir=str(work_dir),
        train_dataloader=dict(dataset=dict(type="RegressionData", n=64), batch_size=batch_size),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        train_cfg=train_cfg,
        default_hooks=dict(logger=dict(interval=5, progress_bar=False), checkpoint=checkpoint),
        randomness=dict(seed=0),
        resume=resume,
    )


def _continued(stdout: str) -> tuple[int, int]:
    found = re.findall(r"Continuing at epoch (\d+), iteration (\d+)", stdout)
    assert len(found) == 1, stdout
    return int(found[0][0]), int(found[0][1])


def test_an_iteration_based_resume_logs_the_epoch_and_iter_that_meta_and_inspect_give(
    tmp_path, capsys
):
    """Saved with 8 batches per epoch at iteration 10, resumed with 4 (another batch size,
    as another world size would give): one epoch number throughout, mmengine's 0."""
    iters = dict(by_epoch=False, max_iters=12)
    _runner(tmp_path, iters, dict(by_epoch=False, interval=10)).train()
    capsys.readouterr()
    meta = torch.load(tmp_path / "iter_10.pth", weights_only=True)["meta"]
    assert (meta["epoch"], meta["iter"]) == (0, 10)
    summary = inspect_checkpoint(str(tmp_path / "iter_10.pth"))
    assert summary["position"] == {"epoch": 0, "iter": 10}

    resumed = _runner(
        tmp_path,
        dict(by_epoch=False, max_iters=14),
        None,
        batch_size=16,
        resume=str(tmp_path / "iter_10.pth"),
    )
    resumed.train()
    assert _continued(capsys.readouterr().out) == (0, 10)
    assert resumed.epoch == 0 and resumed.max_epochs == 1  # mmengine's IterBasedTrainLoop
    records = [
        json.loads(line)
        for log in sorted(tmp_path.glob("*/metrics.jsonl"))
        for line in log.read_text().splitlines()
    ]
    assert {r["epoch"] for r in records} == {0}


def test_an_epoch_based_resume_counts_completed_epochs_as_meta_and_inspect_do(tmp_path, capsys):
    epochs = dict(by_epoch=True, max_epochs=2)
    _runner(tmp_path, epochs, dict(by_epoch=True, interval=1)).train()
    meta = torch.load(tmp_path / "epoch_1.pth", weights_only=True)["meta"]
    assert (meta["epoch"], meta["iter"]) == (1, 8)  # one epoch completed, as mmengine writes
    assert inspect_checkpoint(str(tmp_path / "epoch_1.pth"))["position"] == {"epoch": 1, "iter": 8}
    capsys.readouterr()
    _runner(
        tmp_path, dict(by_epoch=True, max_epochs=2), None, resume=str(tmp_path / "epoch_1.pth")
    ).train()
    out = capsys.readouterr().out
    assert _continued(out) == (1, 8)
    assert "Epoch(train) [2][" in out and "Epoch(train) [1][" not in out  # epoch + 1 shown


@pytest.mark.parametrize("by_epoch", [True, False])
def test_a_mid_epoch_checkpoint_records_the_epoch_in_progress_as_completed_count(
    tmp_path, by_epoch
):
    """A save after iteration 13 of an 8-batch epoch loop: 1 epoch completed (mmengine);
    of an iteration loop: 0."""
    train_cfg = (
        dict(by_epoch=True, max_epochs=2) if by_epoch else dict(by_epoch=False, max_iters=16)
    )
    _runner(tmp_path, train_cfg, dict(by_epoch=False, interval=13)).train()
    meta = torch.load(tmp_path / "iter_13.pth", weights_only=True)["meta"]
    assert (meta["epoch"], meta["iter"]) == ((1 if by_epoch else 0), 13)
