"""Retention (``max_keep_ckpts``) in the checkpoint engine: the oldest committed checkpoints of
a series are deleted once a newer one is committed; never the newest, never one in flight,
nothing when a save fails; the lists survive a resume."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from shardwise.checkpoint import CheckpointError, find_last_checkpoint, staging_path
from shardwise.strategies import SingleDeviceStrategy
from tests.distributed import run_distributed
from tests.test_async_checkpoint import _fsdp, _slow_writes
from tests.toy import ToyNet

OPTIM = dict(optimizer=dict(type="SGD", lr=0.1))


def _strategy(work_dir, **kwargs) -> SingleDeviceStrategy:
    strategy = SingleDeviceStrategy(work_dir=str(work_dir), **kwargs)
    strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    return strategy


def _names(work_dir) -> list[str]:
    return sorted(p.name for p in Path(work_dir).iterdir() if p.name.endswith(".pth"))


def test_only_the_newest_n_are_kept_and_last_checkpoint_is_the_newest(tmp_path):
    strategy = _strategy(tmp_path, max_keep_ckpts=2)
    for i in range(1, 5):
        strategy.save_checkpoint(f"iter_{i}.pth")
    assert _names(tmp_path) == ["iter_3.pth", "iter_4.pth"]
    assert find_last_checkpoint(tmp_path) == str(tmp_path / "iter_4.pth")
    assert not list(tmp_path.glob("iter_[12].pth.manifest.json"))  # sidecars go too


def test_a_limit_per_save_and_series_that_do_not_touch_each_other(tmp_path):
    strategy = _strategy(tmp_path)  # no default limit
    for i in range(1, 4):
        strategy.save_checkpoint(f"iter_{i}.pth", max_keep_ckpts=1)
        strategy.save_checkpoint(f"best_{i}.pth", max_keep_ckpts=1, series="best_acc")
    strategy.save_checkpoint("manual.pth")  # unlimited: joins no series
    assert _names(tmp_path) == ["best_3.pth", "iter_3.pth", "manual.pth"]


def test_saving_a_name_again_moves_it_to_the_newest_end(tmp_path):
    strategy = _strategy(tmp_path, max_keep_ckpts=2)
    for name in ("a.pth", "b.pth", "a.pth", "c.pth"):
        strategy.save_checkpoint(name)
    assert _names(tmp_path) == ["a.pth", "c.pth"]  # b was the oldest once a was saved again
    strategy.save_checkpoint("c.pth", max_keep_ckpts=1)  # the newest overwrites itself
    assert _names(tmp_path) == ["c.pth"]


def test_a_failed_save_deletes_nothing_and_the_next_one_retires_as_before(tmp_path, monkeypatch):
    strategy = _strategy(tmp_path, max_keep_ckpts=2)
    strategy.save_checkpoint("iter_1.pth")
    strategy.save_checkpoint("iter_2.pth")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(strategy.checkpointer, "_write", disk_full)
        with pytest.raises(CheckpointError, match="No space left"):
            strategy.save_checkpoint("iter_3.pth")
    assert _names(tmp_path) == ["iter_1.pth", "iter_2.pth"]
    assert strategy.checkpointer.retention.kept == {
        "periodic": [str(tmp_path / f"iter_{i}.pth") for i in (1, 2)]
    }
    strategy.save_checkpoint("iter_4.pth")
    assert _names(tmp_path) == ["iter_2.pth", "iter_4.pth"]


@pytest.mark.parametrize("bad", [0, -2, "2", 1.5, True])
def test_a_bad_limit_is_refused_before_anything_is_written(tmp_path, bad):
    with pytest.raises(ValueError, match=f"max_keep_ckpts must be -1 .* got {bad!r}"):
        SingleDeviceStrategy(work_dir=str(tmp_path / "a"), max_keep_ckpts=bad)
    strategy = _strategy(tmp_path / "b")
    with pytest.raises(ValueError, match="positive number of checkpoints to keep"):
        strategy.save_checkpoint("iter_1.pth", max_keep_ckpts=bad)
    assert _names(tmp_path / "b") == []


def test_a_resumed_run_goes_on_retiring_the_checkpoints_saved_before(tmp_path):
    first = _strategy(tmp_path, max_keep_ckpts=2)
    for i in range(1, 4):
        first.save_checkpoint(f"iter_{i}.pth")
    second = _strategy(tmp_path, max_keep_ckpts=2)
    second.load_or_resume(resume=True)  # iter_3, which recorded [iter_2, iter_3]
    second.save_checkpoint("iter_4.pth")
    assert _names(tmp_path) == ["iter_3.pth", "iter_4.pth"]


def test_a_copied_checkpoint_does_not_retire_its_old_neighbours(tmp_path):
    first = _strategy(tmp_path / "a", max_keep_ckpts=2)
    for i in range(1, 3):
        first.save_checkpoint(f"iter_{i}.pth")
    copy = tmp_path / "b" / "iter_2.pth"
    copy.parent.mkdir()
    copy.write_bytes((tmp_path / "a" / "iter_2.pth").read_bytes())
    second = _strategy(tmp_path / "b", max_keep_ckpts=1)
    second.resume(copy)
    second.save_checkpoint("iter_3.pth")
    assert _names(tmp_path / "a") == ["iter_1.pth", "iter_2.pth"]
    assert _names(tmp_path / "b") == ["iter_2.pth", "iter_3.pth"]  # the copy is not tracked


def _async_retention(work_dir):
    """FSDP on two ranks, sharded, in the background, keeping one: while the third save is
    in flight (rank 1 writes slowly) the second, the newest committed, is still there and the
    first has gone; once committed, only the third is left."""
    strategy, model, wrapper = _fsdp(work_dir, "sharded", async_save=True, max_keep_ckpts=1)
    rank = int(os.environ["RANK"])
    seen = {}
    for i in (1, 2):
        strategy.save_checkpoint(f"iter_{i}.pth")
        strategy.wait_for_checkpoint()
    seen["after 2"] = _names(work_dir)
    restore = _slow_writes(rank=1, seconds=1.0)
    try:
        future = strategy.save_checkpoint("iter_3.pth")
        torch.distributed.barrier()
        seen["in flight"] = _names(work_dir)
        seen["staging"] = staging_path(Path(work_dir) / "iter_3.pth").is_dir()
        seen["done early"] = future.done()
        strategy.wait_for_checkpoint()
    finally:
        restore()
    torch.distributed.barrier()
    seen["after 3"] = _names(work_dir)
    seen["last"] = Path(find_last_checkpoint(work_dir)).name
    return seen if rank == 0 else None


def test_background_saves_retire_only_after_the_newer_one_is_committed(tmp_path):
    seen = run_distributed(_async_retention, 2, str(tmp_path))[0]
    assert seen["after 2"] == ["iter_2.pth"]
    assert seen["in flight"] == ["iter_2.pth"] and seen["staging"] and not seen["done early"]
    assert seen["after 3"] == ["iter_3.pth"] and seen["last"] == "iter_3.pth"


def test_the_runner_hook_hands_its_limit_to_the_engine(tmp_path):
    from tests.test_runner import _runner

    hooks = dict(
        logger=dict(progress_bar=False),
        checkpoint=dict(interval=1, max_keep_ckpts=2),
    )
    runner = _runner(tmp_path, default_hooks=hooks, train_cfg=dict(by_epoch=True, max_epochs=4))
    runner.train()
    assert _names(runner.work_dir) == ["epoch_3.pth", "epoch_4.pth"]


def test_background_saves_on_one_process_keep_the_newest(tmp_path):
    strategy = _strategy(tmp_path, max_keep_ckpts=1, async_save=True)
    for i in range(3):
        strategy.save_checkpoint(f"iter_{i}.pth")
    strategy.wait_for_checkpoint()
    assert _names(tmp_path) == ["iter_2.pth"]
    assert find_last_checkpoint(tmp_path) == str(tmp_path / "iter_2.pth")


def test_a_run_resumed_from_another_directory_never_deletes_its_checkpoints(tmp_path):
    import torch

    from shardwise.strategies import SingleDeviceStrategy

    def run(work_dir, name, resume=None):
        strategy = SingleDeviceStrategy(work_dir=str(work_dir))
        strategy.prepare(
            torch.nn.Linear(2, 2), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1))
        )
        if resume:
            strategy.resume(resume)
        strategy.save_checkpoint(str(work_dir / name), max_keep_ckpts=1)

    run(tmp_path / "a", "iter_1.pth")
    run(tmp_path / "b", "iter_2.pth", resume=tmp_path / "a" / "iter_1.pth")
    run(tmp_path / "b", "iter_3.pth", resume=tmp_path / "b" / "iter_2.pth")
    assert (tmp_path / "a" / "iter_1.pth").is_file()  # another run's: kept
    assert not (tmp_path / "b" / "iter_2.pth").exists()  # this run's own: retired
    assert (tmp_path / "b" / "iter_3.pth").is_file()


def test_each_checkpoint_retention_deletes_is_named_in_the_log(tmp_path):
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("shardwise.checkpoint")
    logger.addHandler(handler)
    try:
        strategy = _strategy(tmp_path, max_keep_ckpts=2)
        for i in range(1, 5):
            strategy.save_checkpoint(f"iter_{i}.pth")
    finally:
        logger.removeHandler(handler)
    deleted = [r.getMessage() for r in records if "Deleted" in r.getMessage()]
    assert deleted == [
        f"Deleted the outdated checkpoint {tmp_path / name} (max_keep_ckpts)"
        for name in ("iter_1.pth", "iter_2.pth")
    ]
    assert all(r.levelno == logging.INFO for r in records if "Deleted" in r.getMessage())
