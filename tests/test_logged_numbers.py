"""The numbers a run logs agree with each other: the validation loss on the console is the
loss of that validation pass (the one ``metrics.jsonl`` and ``shardwise plot`` record), and
each training loss on the console says how it is smoothed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import tests.test_runner_support  # noqa: F401 - registers the toy model and data
from shardwise.runner import Runner
from shardwise.runner.hooks import logger_hook

VAL_LINE = re.compile(r"Iter\(val\) \[\d+/\d+\]\s+loss: ([\d.]+)")
TRAIN_LINE = re.compile(r"Iter\(train\) \[ ?(\d+)/\d+\].*?(?<![\w/])loss: ([\d.]+)")


def _run(work_dir: Path, **logger: object) -> Runner:
    runner = Runner(
        model=dict(type="DropoutRegressor"),
        work_dir=str(work_dir),
        train_dataloader=dict(dataset=dict(type="RegressionData", n=64), batch_size=8),
        val_dataloader=dict(dataset=dict(type="RegressionData", n=32, seed=1), batch_size=8),
        val_evaluator=dict(type="MeanLoss"),
        val_cfg=dict(),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.05)),
        train_cfg=dict(by_epoch=False, max_iters=24, val_interval=8),
        log_processor=dict(window_size=4),
        default_hooks=dict(logger=dict(interval=6, **logger), checkpoint=None),
        randomness=dict(seed=0),
    )
    runner.train()
    return runner


def _log_text(runner: Runner) -> str:
    return (Path(runner.log_dir) / f"{runner.timestamp}.log").read_text()


def _records(runner: Runner, mode: str) -> list[dict]:
    lines = (Path(runner.log_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["mode"] == mode]


def test_the_logged_validation_loss_is_the_loss_of_that_pass(tmp_path):
    runner = _run(tmp_path)
    logged = [float(v) for v in VAL_LINE.findall(_log_text(runner))]
    recorded = [r["loss"] for r in _records(runner, "val")]
    assert len(recorded) == 3  # iterations 8, 16, 24
    assert len(set(recorded)) == 3  # the passes differ, so a mean of passes would show
    assert logged == pytest.approx(recorded, abs=5e-5)  # 4 digits on the console


def test_each_training_loss_says_how_it_is_smoothed(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(logger_hook, "_bar_fits_the_console", lambda: True)
    runner = _run(tmp_path, progress_bar=True)
    text = _log_text(runner)
    # the lines say once what their loss is, and what metrics.jsonl records
    assert (
        "Training loss: the log lines show it smoothed over the last 4 iterations "
        "(log_processor window_size); metrics.jsonl and shardwise plot record the mean of "
        "the iterations since the previous record (every 6)" in text
    )
    lines = {int(i): float(v) for i, v in TRAIN_LINE.findall(text)}
    buffer = runner.message_hub.get_scalar("train/loss")
    assert lines[24] == pytest.approx(buffer.mean(4), abs=5e-5)  # the window of the lines
    records = {r["iter"]: r["loss"] for r in _records(runner, "train")}
    assert records[24] == pytest.approx(buffer.mean(6))  # the mean since the last record
    assert records[24] != pytest.approx(buffer.mean(4))  # (they do differ here)
    # the bar shows the lines' number, and says so
    bar = capsys.readouterr().err.replace("\r", "\n").splitlines()
    last = [line for line in bar if "24/24" in line][-1]
    assert f"loss {lines[24]:.4f} (smoothed over 4)" in last, last
