"""A run that starts from scratch (no ``resume``, no ``load_from``) in a work_dir that already
holds committed checkpoints says so once, on rank 0, naming the newest and ``--resume``: a
forgotten ``--resume`` would otherwise retrain from iteration 0 without a word."""

from __future__ import annotations

import logging

from shardwise.runner import Runner
from tests.distributed import run_distributed
from tests.test_runner_support import RegressionData  # noqa: F401 - registers the toy data


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _runner(work_dir, max_iters=8, **kwargs) -> Runner:
    return Runner(
        model=dict(type="DropoutRegressor"),
        work_dir=str(work_dir),
        train_dataloader=dict(dataset=dict(type="RegressionData", n=32), batch_size=8),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(
            logger=dict(progress_bar=False), checkpoint=dict(by_epoch=False, interval=4)
        ),
        randomness=dict(seed=0),
        **kwargs,
    )


def _warnings_of(run) -> list[str]:
    """The warnings shardwise's logger gives while ``run()`` runs, about starting afresh."""
    lines = _Lines()
    logger = logging.getLogger("shardwise")
    logger.addHandler(lines)
    try:
        run()
    finally:
        logger.removeHandler(lines)
    return [line for line in lines.lines if "from scratch" in line]


def test_a_fresh_run_over_committed_checkpoints_warns_once_naming_the_newest(tmp_path):
    _runner(tmp_path).train()  # commits iter_4.pth and iter_8.pth
    runner = _runner(tmp_path)
    warned = _warnings_of(lambda: (runner.train(), runner.train()))
    assert len(warned) == 1, warned
    assert str(tmp_path / "iter_8.pth") in warned[0] and "--resume" in warned[0]
    assert "\n" not in warned[0]


def test_no_warning_when_the_run_resumes_loads_or_the_work_dir_is_new(tmp_path):
    _runner(tmp_path / "old").train()
    resumed = _runner(tmp_path / "old", max_iters=12, resume=True)
    assert _warnings_of(resumed.train) == []
    loaded = _runner(tmp_path / "old", load_from=str(tmp_path / "old" / "iter_4.pth"))
    assert _warnings_of(loaded.train) == []
    assert _warnings_of(_runner(tmp_path / "new").train) == []


def _fresh_run_on_a_rank(work_dir: str) -> list[str]:
    return _warnings_of(_runner(work_dir).train)


def test_only_rank_0_warns(tmp_path):
    _runner(tmp_path).train()
    warned = run_distributed(_fresh_run_on_a_rank, 2, str(tmp_path))
    assert [len(w) for w in warned] == [1, 0]
