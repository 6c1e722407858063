"""Hooks written for mmengine run unchanged: every stage of train (with validation), val and
test is called in mmengine's order, with mmengine's arguments, as real mmengine 0.10's Runner
calls them on the same model, data and config.

The hook and the metric are written once, as an mmengine user writes them, and subclass
mmengine's base class for mmengine's Runner and shardwise's for shardwise's.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import shardwise.runner

mmengine_hooks = pytest.importorskip("mmengine.hooks", reason="the oracle is mmengine's Runner")
mmengine_runner = pytest.importorskip("mmengine.runner")
mmengine_evaluator = pytest.importorskip("mmengine.evaluator")

_names = itertools.count()


def make_recording_hook(Hook):
    """The hook a user writes to see every stage, with the arguments it is called with."""

    class RecordingHook(Hook):
        positions = ("epoch", "iter")  # where the runner is at each call (and, with
        # "epoch", the epoch helpers' answers)

        def __init__(self):
            self.calls = []

        def record(self, stage, runner, *details):
            where = tuple(getattr(runner, p) for p in self.positions)
            self.calls.append((stage, *where, *details))

        def saved(self, checkpoint):
            meta = checkpoint["meta"]
            return (*(meta[p] for p in self.positions), "state_dict" in checkpoint)

        def before_run(self, runner):
            self.record("before_run", runner)

        def after_run(self, runner):
            self.record("after_run", runner)

        def after_load_checkpoint(self, runner, checkpoint):
            self.record("after_load_checkpoint", runner, *self.saved(checkpoint))

        def before_save_checkpoint(self, runner, checkpoint):
            self.record("before_save_checkpoint", runner, *self.saved(checkpoint))

        def before_train(self, runner):
            lengths = tuple(getattr(runner, f"max_{p}s") for p in self.positions)
            self.record("before_train", runner, *lengths)

        def after_train(self, runner):
            self.record("after_train", runner)

        def before_train_epoch(self, runner):
            self.record("before_train_epoch", runner)

        def after_train_epoch(self, runner):
            epochs = self.every_n_epochs(runner, 2), self.is_last_train_epoch(runner)
            self.record("after_train_epoch", runner, *epochs if "epoch" in self.positions else ())

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            self.record("before_train_iter", runner, batch_idx, summary(data_batch))

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            self.record(
                "after_train_iter",
                runner,
                batch_idx,
                summary(data_batch),
                sorted(outputs),
                round(outputs["loss"].item(), 4),
                self.every_n_train_iters(runner, 2),
                self.every_n_inner_iters(batch_idx, 2),
                self.end_of_epoch(runner.train_dataloader, batch_idx),
                self.is_last_train_iter(runner),
            )

        def before_val(self, runner):
            self.record("before_val", runner)

        def after_val(self, runner):
            self.record("after_val", runner)

        def before_val_epoch(self, runner):
            self.record("before_val_epoch", runner)

        def after_val_epoch(self, runner, metrics=None):
            self.record("after_val_epoch", runner, rounded(metrics))

        def before_val_iter(self, runner, batch_idx, data_batch=None):
            self.record("before_val_iter", runner, batch_idx, summary(data_batch))

        def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            self.record("after_val_iter", runner, batch_idx, summary(data_batch), summary(outputs))

        def before_test(self, runner):
            self.record("before_test", runner)

        def after_test(self, runner):
            self.record("after_test", runner)

        def before_test_epoch(self, runner):
            self.record("before_test_epoch", runner)

        def after_test_epoch(self, runner, metrics=None):
            self.record("after_test_epoch", runner, rounded(metrics))

        def before_test_iter(self, runner, batch_idx, data_batch=None):
            self.record("before_test_iter", runner, batch_idx, summary(data_batch))

        def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            self.record("after_test_iter", runner, batch_idx, summary(data_batch), summary(outputs))

    return RecordingHook


def make_mode_hook(Hook):
    """A hook that acts in every loop through mmengine's mode-generic methods."""

    class ModeHook(Hook):
        priority = "LOW"

        def __init__(self):
            self.calls = []

        def _before_epoch(self, runner, mode="train"):
            self.calls.append(("_before_epoch", mode))

        def _after_epoch(self, runner, mode="train"):
            self.calls.append(("_after_epoch", mode))

        def _before_iter(self, runner, batch_idx, data_batch=None, mode="train"):
            self.calls.append(("_before_iter", mode, batch_idx))

        def _after_iter(self, runner, batch_idx, data_batch=None, outputs=None, mode="train"):
            self.calls.append(("_after_iter", mode, batch_idx, outputs is not None))

    return ModeHook


def make_accuracy(BaseMetric):
    class Accuracy(BaseMetric):
        def process(self, data_batch, data_samples):
            _, labels = data_batch
            for logits, label in zip(data_samples, labels):
                self.results.append(int(logits.argmax()) == int(label))

        def compute_metrics(self, results):
            return dict(accuracy=sum(results) / len(results))

    return Accuracy


def summary(batch):
    """A batch or the model's outputs, as something comparable: shapes and sums."""
    tensors = batch if isinstance(batch, list | tuple) else [batch]
    return tuple((tuple(t.shape), round(t.float().sum().item(), 3)) for t in tensors)


def rounded(metrics):
    return {k: round(v, 6) for k, v in metrics.items()}


class TinyClassifier(nn.Module):
    """A model with its own steps, as mmengine's Runner needs (``train_step``...)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

    def train_step(self, data, optim_wrapper):
        x, y = data
        with optim_wrapper.optim_context(self):
            loss = F.cross_entropy(self(x), y)
        optim_wrapper.update_params(loss)
        return dict(loss=loss)

    def val_step(self, data):
        return self(data[0])

    def test_step(self, data):
        return self(data[0])


def _data(n, seed):
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    return TensorDataset(torch.randn(n, 4, generator=gen) + 0.5 * y.unsqueeze(1), y)


def _loader(n, seed):
    return dict(
        dataset=_data(n, seed),
        batch_size=4,
        sampler=dict(type="DefaultSampler", shuffle=False),
        collate_fn=dict(type="default_collate"),
    )


class Framework:
    """What differs between the two runs: the Runner and the base classes."""

    def __init__(self, name, Runner, Hook, BaseMetric):
        self.name, self.Runner, self.hook = name, Runner, Hook
        self.recording_hook = make_recording_hook(Hook)
        self.mode_hook = make_mode_hook(Hook)
        self.accuracy = make_accuracy(BaseMetric)

    def runner(self, work_dir, hooks, **kwargs):
        torch.manual_seed(0)
        model = TinyClassifier()
        return self.Runner(
            model=model,
            work_dir=str(work_dir),
            experiment_name=f"{self.name}_{next(_names)}",
            custom_hooks=hooks,
            randomness=dict(seed=0),
            **kwargs,
        )

    def evaluation(self, *stages):
        cfg = {}
        for stage, n, seed in (("val", 8, 1), ("test", 6, 2)):
            if stage in stages:
                cfg[f"{stage}_dataloader"] = _loader(n, seed)
                cfg[f"{stage}_cfg"] = dict()
                cfg[f"{stage}_evaluator"] = [self.accuracy()]
        return cfg


MMENGINE = Framework(
    "mmengine", mmengine_runner.Runner, mmengine_hooks.Hook, mmengine_evaluator.BaseMetric
)
SHARDWISE = Framework(
    "shardwise", shardwise.runner.Runner, shardwise.runner.Hook, shardwise.runner.BaseMetric
)


def _training():
    return dict(
        train_dataloader=_loader(12, 0),  # 3 iterations per epoch
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.5)),
    )


LOOPS = {
    "epochs": dict(train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1)),
    "iterations": dict(
        train_cfg=dict(by_epoch=False, max_iters=5, val_interval=2),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", by_epoch=False, interval=2)),
    ),
}


def _train_then_test(framework, work_dir, loop):
    """train() with validation, then test(), on one runner; the hooks' calls."""
    recorder, modes = framework.recording_hook(), framework.mode_hook()
    runner = framework.runner(
        work_dir,
        [recorder, modes],
        **_training(),
        **LOOPS[loop],
        **framework.evaluation("val", "test"),
    )
    runner.train()
    metrics = runner.test()
    return recorder.calls, modes.calls, metrics


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_hook_sees_the_stages_of_train_and_test_as_under_mmengine(tmp_path, loop):
    expected = _train_then_test(MMENGINE, tmp_path / "mmengine", loop)
    calls, modes, metrics = _train_then_test(SHARDWISE, tmp_path / "shardwise", loop)
    assert calls == expected[0]
    assert modes == expected[1]
    assert metrics == expected[2]
    stages = [call[0] for call in calls]
    assert stages[:3] == ["before_run", "before_train", "before_train_epoch"]
    assert stages[-3:] == ["after_test_epoch", "after_test", "after_run"]
    assert {"before_save_checkpoint", "after_val_epoch", "after_test_iter"} <= set(stages)


def _evaluate_checkpoint(framework, work_dir, checkpoint):
    """val() then test() on one runner that loads ``checkpoint``; the hooks' calls."""
    recorder, modes = framework.recording_hook(), framework.mode_hook()
    evaluation = framework.evaluation("val", "test")
    runner = framework.runner(work_dir, [recorder, modes], load_from=str(checkpoint), **evaluation)
    metrics = runner.val(), runner.test()
    return recorder.calls, modes.calls, metrics


@pytest.mark.filterwarnings("ignore:Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
def test_val_and_test_after_load_from_call_the_hooks_as_under_mmengine(tmp_path, monkeypatch):
    seen = {}
    for framework in (MMENGINE, SHARDWISE):
        trained = tmp_path / framework.name / "train"
        epochs = dict(by_epoch=True, max_epochs=2)
        framework.runner(trained, [], **_training(), train_cfg=epochs).train()
        checkpoint = trained / "epoch_2.pth"
        with monkeypatch.context() as env:
            if framework is MMENGINE:  # mmengine 0.10 loads with torch.load's former default
                env.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
            seen[framework.name] = _evaluate_checkpoint(
                framework, tmp_path / framework.name, checkpoint
            )
    assert seen["shardwise"] == seen["mmengine"]
    calls = seen["shardwise"][0]
    assert [c[0] for c in calls[:3]] == ["before_run", "after_load_checkpoint", "before_val"]
    assert calls[1][1:] == (0, 0, 2, 6, True)  # loaded once: epoch 2, iteration 6 were saved
    assert [c[0] for c in calls].count("after_load_checkpoint") == 1


@pytest.mark.parametrize(
    "make",
    [make_recording_hook, make_mode_hook],
    ids=["every-stage", "mode-generic"],
)
def test_triggered_stages_are_mmengines(make):
    ours = make(shardwise.runner.Hook)().get_triggered_stages()
    theirs = make(mmengine_hooks.Hook)().get_triggered_stages()
    assert sorted(ours) == sorted(theirs)
    assert ours == [s for s in mmengine_hooks.Hook.stages if s in ours]  # mmengine's order
    assert shardwise.runner.Hook.stages == mmengine_hooks.Hook.stages


def test_the_default_hooks_have_mmengines_priorities():
    for name in (
        "RuntimeInfoHook",
        "IterTimerHook",
        "DistSamplerSeedHook",
        "LoggerHook",
        "ParamSchedulerHook",
        "CheckpointHook",
    ):
        assert getattr(shardwise.runner, name).priority == getattr(mmengine_hooks, name).priority


# ----------------------------------------------------------------------------- the message hub
def make_hub_reading_hook(Hook):
    """A hook that reads what RuntimeInfoHook and IterTimerHook publish, at every stage."""

    class HubReadingHook(Hook):
        priority = "LOWEST"  # after the default hooks have written
        info_keys = ("loop_stage", "epoch", "iter", "max_epochs", "max_iters", "eta")

        def __init__(self):
            self.seen = []

        def snapshot(self, stage, runner):
            hub = runner.message_hub
            info = {k: hub.get_info(k) for k in self.info_keys}
            scalars = {
                k: len(v._log_history)
                for k, v in hub.log_scalars.items()
                if not k.endswith(("time", "_per_sec", "grad_norm"))
            }
            self.seen.append((stage, info, scalars))

        def before_train(self, runner):
            self.snapshot("before_train", runner)

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            self.snapshot("after_train_iter", runner)

        def before_val(self, runner):
            self.snapshot("before_val", runner)

        def after_val(self, runner):
            self.snapshot("after_val", runner)

        def before_test(self, runner):
            self.snapshot("before_test", runner)

        def after_test_epoch(self, runner, metrics=None):
            self.snapshot("after_test_epoch", runner)

        def after_run(self, runner):
            self.snapshot("after_run", runner)

    return HubReadingHook


class _Clock:
    """``time`` for IterTimerHook: each ``time()`` call is one second later."""

    now = 0

    @classmethod
    def time(cls):
        cls.now += 1
        return cls.now


def _train_test_reading_the_hub(framework, work_dir, module):
    reader = make_hub_reading_hook(framework.hook)()
    runner = framework.runner(
        work_dir,
        [reader],
        **_training(),
        train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1),
        **framework.evaluation("val", "test"),
    )
    _Clock.now = 0
    with mock.patch(f"{module}.iter_timer_hook.time", _Clock):
        runner.train()
        runner.test()
    hub = runner.message_hub
    histories = {
        key: list(hub.get_scalar(key)._log_history)
        for key in ("train/time", "train/data_time", "train/lr", "val/accuracy", "test/time")
    }
    return reader.seen, histories


def test_a_hook_reads_the_message_hub_as_under_mmengine(tmp_path):
    """loop_stage, the loop counters, eta, the scalars' histories: what RuntimeInfoHook and
    IterTimerHook (timing through time.time) publish is mmengine's, stage by stage."""
    expected = _train_test_reading_the_hub(MMENGINE, tmp_path / "mmengine", "mmengine.hooks")
    seen = _train_test_reading_the_hub(SHARDWISE, tmp_path / "shardwise", "shardwise.runner.hooks")
    assert seen == expected
    stages = {stage: info for stage, info, _ in seen[0]}
    assert stages["before_val"]["loop_stage"] == "val"
    assert stages["after_val"]["loop_stage"] == "train"  # back to training after validation
    assert stages["before_test"]["loop_stage"] == "test"
    assert seen[1]["train/time"] == [2] * 6  # one second to fetch, one to step


def test_log_processor_and_the_train_loop_are_there_before_training_as_under_mmengine(tmp_path):
    """``log_processor=dict(...)`` builds ``runner.log_processor``; ``runner.train_loop`` and
    the loop counters can be read (and set, as mmengine's own tests do) before train()."""
    seen = {}
    for framework in (MMENGINE, SHARDWISE):
        runner = framework.runner(
            tmp_path / framework.name,
            [],
            **_training(),
            train_cfg=dict(by_epoch=True, max_epochs=2),
            log_processor=dict(window_size=3, by_epoch=False, num_digits=2),
        )
        processor = runner.log_processor
        runner.train_loop._epoch = 1
        seen[framework.name] = (
            (processor.window_size, processor.by_epoch, processor.num_digits),
            (runner.epoch, runner.iter, runner.max_epochs, runner.max_iters),
        )
    assert seen["shardwise"] == seen["mmengine"] == ((3, False, 2), (1, 0, 2, 6))


# ----------------------------------------------------------------------------- LoggerHook
class _Lines(logging.Handler):
    """The messages a runner's logger receives."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


_HEAD = re.compile(r"^(Epoch|Iter)\((train|val|test)\) *\[[^\]]*\](\[[^\]]*\])?")


def _logger_lines(messages):
    """What LoggerHook printed: its lines' heads and losses (the timings differ from run to
    run), and the experiment-name lines (the names differ)."""
    out = []
    for message in messages:
        if message.startswith("Exp name: "):
            out.append("Exp name")
        elif message.startswith("CUSTOM "):
            out.append(message)
        elif _HEAD.match(message):
            loss = re.search(r"(?<![\w/])loss: ([\d.]+)", message)
            out.append((_HEAD.match(message).group(0), loss and round(float(loss.group(1)), 4)))
    return out


def make_recording_log_processor(LogProcessor):
    """A user's log processor: it records how LoggerHook calls it and marks the lines."""

    class RecordingLogProcessor(LogProcessor):
        calls: list = []

        def get_log_after_iter(self, runner, batch_idx, mode):
            tag, log_str = super().get_log_after_iter(runner, batch_idx, mode)
            self.calls.append(("iter", mode, batch_idx, runner.iter, runner.epoch))
            loss = tag.get("loss")
            return tag, f"CUSTOM {mode} {batch_idx} " + (f"{loss:.4f}" if loss else "-")

        def get_log_after_epoch(self, runner, batch_idx, mode, with_non_scalar=False):
            tag, log_str = super().get_log_after_epoch(runner, batch_idx, mode, with_non_scalar)
            self.calls.append(("epoch", mode, batch_idx, with_non_scalar))
            accuracy = tag.get(f"{mode}/accuracy", tag.get("accuracy"))
            return tag, f"CUSTOM {mode} epoch {accuracy:.4f}"

    return RecordingLogProcessor


_LOG_PROCESSORS = {}


def _log_processor_class(framework):
    """The recording processor, registered once in the framework's LOG_PROCESSORS."""
    if framework.name not in _LOG_PROCESSORS:
        if framework is MMENGINE:
            from mmengine.registry import LOG_PROCESSORS
            from mmengine.runner import LogProcessor
        else:
            from shardwise.registry import LOG_PROCESSORS
            from shardwise.runner import LogProcessor
        cls = make_recording_log_processor(LogProcessor)
        LOG_PROCESSORS.register_module(name="RecordingLogProcessor", module=cls, force=True)
        _LOG_PROCESSORS[framework.name] = cls
    return _LOG_PROCESSORS[framework.name]


LOGGED_LOOPS = {
    "epochs": dict(train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1)),
    "iterations": dict(train_cfg=dict(by_epoch=False, max_iters=6, val_interval=3)),
}
# the epochs' last iterations logged too (shardwise always logs the run's last); an
# iteration-based run's first pass over the data, which mmengine's ignore_last=False also
# logs, is no epoch's end in shardwise (logger_hook._END_OF_DATA)
IGNORE_LAST = {"epochs": False, "iterations": True}


def _logged_run(framework, work_dir, loop, log_processor=None, test=True, **logger):
    """train() with validation then test(); what LoggerHook printed."""
    hooks = dict(logger=dict(type="LoggerHook", interval=2, **logger), checkpoint=None)
    kwargs = dict(**_training(), **LOGGED_LOOPS[loop], **framework.evaluation("val", "test"))
    if log_processor is not None:
        kwargs["log_processor"] = log_processor
    elif framework is MMENGINE and loop == "iterations":  # an mmengine config says so
        kwargs["log_processor"] = dict(by_epoch=False)
    runner = framework.runner(work_dir, [], default_hooks=hooks, **kwargs)
    lines = _Lines()
    runner.logger.addHandler(lines)
    try:
        runner.train()
        if test:
            runner.test()
    finally:
        runner.logger.removeHandler(lines)
    return runner, lines.messages


def _first_iteration(lines):
    """shardwise's own line: a fresh run's first iteration (its starting loss)."""
    return lines[0], lines[1:]


@pytest.mark.parametrize("loop", sorted(LOGGED_LOOPS))
def test_logger_hook_prints_the_log_processors_lines_as_under_mmengine(tmp_path, loop):
    """The default LogProcessor's lines: the same heads (``Epoch(train) [1][2/3]``,
    ``Iter(train) [2/6]``, ``Epoch(val) [1][2/2]``...) and losses at the same iterations,
    the experiment name where mmengine prints it. shardwise also prints the first
    iteration; its log processor counts by iterations when the config does not say (an
    mmengine config of an iteration-based run gives ``log_processor=dict(by_epoch=False)``)."""
    _, theirs = _logged_run(MMENGINE, tmp_path / "mmengine", loop, ignore_last=IGNORE_LAST[loop])
    _, ours = _logged_run(SHARDWISE, tmp_path / "shardwise", loop, ignore_last=IGNORE_LAST[loop])
    first, rest = _first_iteration(_logger_lines(ours))
    expected = _logger_lines(theirs)
    assert rest == expected
    assert first[0] == ("Epoch(train) [1][1/3]" if loop == "epochs" else "Iter(train) [1/6]")
    heads = {line[0].split(" ")[0] for line in expected if isinstance(line, tuple)}
    assert heads == {f"{'Epoch' if loop == 'epochs' else 'Iter'}({m})" for m in _MODES}
    assert "Exp name" in expected
    # the metrics first, as mmengine's lines (shardwise's throughput with the timings)
    firsts = [
        [m.split("]  ")[1].split()[0] for m in run if "accuracy: " in m] for run in (ours, theirs)
    ]
    assert firsts[1] and firsts[0] == firsts[1] == ["accuracy:"] * len(firsts[1])


_MODES = ("train", "val", "test")


@pytest.mark.parametrize("loop", sorted(LOGGED_LOOPS))
def test_a_custom_log_processor_makes_what_logger_hook_prints_as_under_mmengine(tmp_path, loop):
    """``log_processor=dict(type=<a registered subclass>)``: LoggerHook calls it with the
    same arguments at the same places as mmengine's and prints what it returns."""
    seen = {}
    for framework in (MMENGINE, SHARDWISE):
        cls = _log_processor_class(framework)
        cls.calls = []
        runner, messages = _logged_run(
            framework,
            tmp_path / framework.name,
            loop,
            log_processor=dict(type="RecordingLogProcessor", by_epoch=loop == "epochs"),
            ignore_last=IGNORE_LAST[loop],
        )
        assert type(runner.log_processor) is cls
        seen[framework.name] = list(cls.calls), _logger_lines(messages)
    calls, lines = seen["shardwise"]
    assert calls[0] == ("iter", "train", 0, 0, 0)  # shardwise's first-iteration line
    assert lines[0] == "CUSTOM train 0 " + lines[0].split()[-1]
    assert (calls[1:], lines[1:]) == seen["mmengine"]
    assert ("epoch", "test", 2, True) in calls  # the test metrics with their non-scalars


def test_log_processor_options_change_what_logger_hook_prints_as_under_mmengine(tmp_path):
    """``custom_cfg`` and ``window_size`` of ``log_processor=dict(...)``: the same values in
    the lines under both runners; the custom statistic also reaches the metrics records."""
    options = dict(
        window_size=1,
        custom_cfg=[
            dict(data_src="loss", method_name="max", log_name="loss_max", window_size="global")
        ],
    )
    printed = {}
    for framework in (MMENGINE, SHARDWISE):
        runner, messages = _logged_run(framework, tmp_path / framework.name, "epochs", options)
        printed[framework.name] = [
            (m.split("]  ")[0], round(float(m.split("loss_max: ")[1].split()[0]), 4))
            for m in messages
            if "loss_max: " in m
        ]
    ours, theirs = printed["shardwise"], printed["mmengine"]
    assert len(theirs) == 2 and ours[1:3] == theirs  # iterations 2 and 5
    positions = ("1][1/3", "1][2/3", "2][2/3", "2][3/3")  # and the first and the last
    assert [head for head, _ in ours] == [f"Epoch(train) [{i}" for i in positions]
    (metrics,) = (tmp_path / "shardwise").glob("*/metrics.jsonl")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    train = [r for r in records if r["mode"] == "train"]
    assert [r["iter"] for r in train] == [2, 5, 6]  # mmengine's, and the run's last
    assert [round(r["loss_max"], 4) for r in train[:2]] == [v for _, v in theirs]


def test_logger_hook_copies_the_logs_to_out_dir_as_under_mmengine(tmp_path):
    """``out_dir``: the log directory's files ending with ``out_suffix`` are copied to
    ``out_dir/<work_dir's name>/`` after the run, and removed with ``keep_local=False``."""
    kept = {}
    for framework in (MMENGINE, SHARDWISE):
        out = tmp_path / framework.name / "out"
        runner, messages = _logged_run(
            framework,
            tmp_path / framework.name / "work",
            "epochs",
            test=False,  # (mmengine's before_run joins the work dir's name again in test())
            out_dir=str(out),
            out_suffix=".log",
            keep_local=False,
        )
        logger = runner.logger
        copied = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
        local = sorted(p.name for p in Path(runner.log_dir).rglob("*.log"))
        kept[framework.name] = (copied, local, runner.timestamp)
        assert any(f"Text logs will be saved to {out / 'work'}" in m for m in messages)
        for handler in logger.handlers:  # the closed log file is not written again
            if isinstance(handler, logging.FileHandler):
                logger.removeHandler(handler)
    for name, (copied, local, timestamp) in kept.items():
        assert copied == [f"work/{timestamp}.log"], name
        assert local == [], name
