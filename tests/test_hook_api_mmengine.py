"""The pieces of mmengine's hook API a custom hook touches, against mmengine 0.10.7 itself:
the same calls give the same values, attributes, exceptions and messages.

(The hooks running inside both Runners are in ``test_runner_hooks_mmengine.py``.)
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from unittest.mock import Mock

import numpy as np
import pytest
import torch

import shardwise.runner as sw
from shardwise.optim.scheduler import _ParamScheduler

mm_hooks = pytest.importorskip("mmengine.hooks", reason="the oracle is mmengine")
mm_runner = pytest.importorskip("mmengine.runner")
mm_logging = pytest.importorskip("mmengine.logging")
mm_optim = pytest.importorskip("mmengine.optim")


def _raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the exception is what is compared
        return exc
    raise AssertionError("no exception")


# ----------------------------------------------------------------------------- priorities
@pytest.mark.parametrize("bad", [-1, 101, [10], 1.5, "NOT_A_PRIORITY"])
def test_get_priority_refuses_what_mmengine_refuses_with_its_exception_and_message(bad):
    theirs = _raised(lambda: mm_runner.get_priority(bad))
    ours = _raised(lambda: sw.get_priority(bad))
    assert isinstance(ours, type(theirs))
    if not isinstance(theirs, KeyError):  # mmengine's KeyError says only the name
        assert str(theirs) in str(ours)
    assert repr(bad) in str(ours) or str(bad) in str(ours)  # and ours names the value


def test_get_priority_accepts_what_mmengine_accepts():
    for good in (0, 100, 45, "highest", "VERY_LOW", sw.Priority.HIGH):
        theirs = good if not isinstance(good, sw.Priority) else mm_runner.Priority.HIGH
        assert sw.get_priority(good) == mm_runner.get_priority(theirs)


# ----------------------------------------------------------------------------- history, hub
def test_history_buffer_gives_mmengines_statistics():
    ours, theirs = sw.HistoryBuffer(), mm_logging.HistoryBuffer()
    for value, count in [(1.0, 1), (4.0, 2), (2.5, 1), (9, 3), (0.5, 1)]:
        ours.update(value, count)
        theirs.update(value, count)
    for window in (None, 1, 2, 3, 10):
        for method in ("mean", "max", "min"):
            assert getattr(ours, method)(window) == pytest.approx(
                getattr(theirs, method)(window)
            ), (method, window)
            assert ours.statistics(method, window) == pytest.approx(
                theirs.statistics(method, window)
            )
    assert ours.current() == theirs.current()
    np.testing.assert_array_equal(ours._log_history, theirs._log_history)
    np.testing.assert_array_equal(ours._count_history, theirs._count_history)
    for a, b in zip(ours.data, theirs.data):
        np.testing.assert_array_equal(a, b)


def test_history_buffer_keeps_the_newest_max_length_values():
    buffer = sw.HistoryBuffer(max_length=3)
    for value in range(5):
        buffer.update(value)
    assert list(buffer._log_history) == [2, 3, 4]
    with pytest.raises(ValueError, match="empty"):
        sw.HistoryBuffer().current()


@pytest.mark.parametrize(
    "value",
    [np.float32(5), np.int32(5), np.uint8(5), np.array([5]), torch.tensor(5.0), torch.tensor([5])],
    ids=["f32", "i32", "u8", "ndarray", "tensor", "tensor1"],
)
def test_message_hub_takes_numpy_and_tensor_scalars_as_mmengines(value):
    ours, theirs = sw.MessageHub(), mm_logging.MessageHub("hub_scalars")
    for hub in (ours, theirs):
        hub.update_scalar("val/acc", value)
        hub.update_scalars({"train/loss": value, "train/n": dict(value=value, count=2)})
    for key in ("val/acc", "train/loss", "train/n"):
        assert ours.get_scalar(key).current() == theirs.get_scalar(key).current() == 5
        assert ours.get_scalar(key).mean() == theirs.get_scalar(key).mean()


def test_message_hub_refuses_a_tensor_of_several_values_by_name():
    with pytest.raises(ValueError, match="'train/loss'.*2"):
        sw.MessageHub().update_scalar("train/loss", torch.tensor([1.0, 2.0]))


def test_message_hub_pop_info_and_unresumed_keys_stay_out_of_checkpoints():
    hub = sw.MessageHub()
    hub.update_info("kept", 1)
    hub.update_info("dropped", 2, resumed=False)
    hub.update_scalar("train/x", 1.0, resumed=False)
    state = hub.state_dict()
    assert state["runtime_info"] == {"kept": 1} and state["log_scalars"] == {}
    assert hub.pop_info("kept") == 1 and hub.pop_info("kept", "gone") == "gone"


# ----------------------------------------------------------------------------- ParamSchedulerHook
def _mock_runner(param_schedulers):
    runner = Mock()
    runner.param_schedulers = param_schedulers
    return runner


@pytest.mark.parametrize("stage", ["after_train_iter", "after_train_epoch", "after_val_epoch"])
def test_param_scheduler_hook_refuses_what_mmengine_refuses(stage):
    args = {"after_train_iter": (0,), "after_train_epoch": (), "after_val_epoch": ({"a": 1},)}
    scheduler = Mock(by_epoch=stage != "after_train_iter", need_val_args=True)
    theirs = _raised(
        lambda: getattr(mm_hooks.ParamSchedulerHook(), stage)(_mock_runner(scheduler), *args[stage])
    )
    ours = _raised(
        lambda: getattr(sw.ParamSchedulerHook(), stage)(_mock_runner(scheduler), *args[stage])
    )
    assert type(ours) is type(theirs) is TypeError
    message = "runner.param_schedulers should be list of ParamScheduler or a dict containing"
    assert message in str(ours) and message in str(theirs)


def _real_scheduler(by_epoch, need_val_args=False):
    class Plateau(_ParamScheduler):  # a scheduler that wants the metrics
        def __init__(self):
            self.by_epoch, self.need_val_args = by_epoch, need_val_args
            self.step = Mock()

        def _get_value(self):
            return []

    return Plateau()


def test_param_scheduler_hook_steps_each_kind_at_its_point():
    per_iter, per_epoch = _real_scheduler(False), _real_scheduler(True)
    plateau = _real_scheduler(True, need_val_args=True)
    hook = sw.ParamSchedulerHook()
    runner = _mock_runner(dict(a=[per_iter, per_epoch], b=[plateau]))
    hook.after_train_iter(runner, 0)
    hook.after_train_epoch(runner)
    hook.after_val_epoch(runner, {"loss": 0.5})
    assert per_iter.step.call_count == 1
    assert per_epoch.step.call_count == 1  # not with the metrics: it does not ask for them
    plateau.step.assert_called_with({"loss": 0.5})
    hook.after_val_epoch(_mock_runner(None), {"loss": 0.5})  # no schedulers: nothing to do


# ----------------------------------------------------------------------------- RuntimeInfoHook
def test_runtime_info_hook_refuses_an_optim_wrapper_whose_get_lr_is_not_a_dict():
    runner = SimpleNamespace(message_hub=sw.MessageHub(), iter=0)
    runner.optim_wrapper = Mock(get_lr=Mock(return_value="not a dict"))
    with pytest.raises(AssertionError, match=re.escape("runner.optim_wrapper.get_lr()")):
        sw.RuntimeInfoHook().before_train_iter(runner, batch_idx=0)


def test_runtime_info_hook_keeps_a_metric_that_is_not_a_number_as_information():
    runner = SimpleNamespace(message_hub=sw.MessageHub())
    sw.RuntimeInfoHook().after_val_epoch(runner, {"acc": np.float32(0.5), "per_class": [1, 2]})
    assert runner.message_hub.get_scalar("val/acc").current() == 0.5
    assert runner.message_hub.get_info("val/per_class") == [1, 2]


# ----------------------------------------------------------------------------- CheckpointHook
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(save_best="acc"),
        dict(save_best=["acc", "mIoU"]),
        dict(save_best=["FID", "IS"], rule=["less", "greater"]),
        dict(save_best="loss_cls", less_keys="loss_cls"),
        dict(save_best="score", greater_keys=["score"]),
        dict(save_best="auto", by_epoch=False, interval=2),
        dict(interval=3, published_keys="meta", save_begin=2, filename_tmpl="ckpt_{}.pth"),
    ],
)
def test_checkpoint_hook_has_mmengines_attributes(kwargs):
    ours, theirs = sw.CheckpointHook(**kwargs), mm_hooks.CheckpointHook(**kwargs)
    for name in (
        "interval",
        "by_epoch",
        "save_last",
        "save_best",
        "greater_keys",
        "less_keys",
        "filename_tmpl",
        "published_keys",
        "save_begin",
        "out_dir",
        "last_ckpt",
    ):
        assert getattr(ours, name) == getattr(theirs, name), name
    for name in ("key_indicators", "rules", "best_ckpt_path", "best_ckpt_path_dict"):
        assert hasattr(ours, name) == hasattr(theirs, name), name
        if hasattr(theirs, name):
            assert getattr(ours, name) == getattr(theirs, name), name


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(save_best=dict(acc="acc")),
        dict(save_best=["auto", "acc"]),
        dict(save_best=["acc", "acc"]),
        dict(save_best=["acc"], rule=1),
        dict(save_best=["acc"], rule=["greater", "less"]),
        dict(save_best="acc", rule="bigger"),
        dict(save_best="something"),
        dict(published_keys=1),
        dict(save_begin=-1),
        dict(file_client_args={"backend": "disk"}, backend_args={"backend": "local"}),
    ],
)
def test_checkpoint_hook_refuses_what_mmengine_refuses(kwargs):
    theirs = _raised(lambda: mm_hooks.CheckpointHook(**kwargs))
    ours = _raised(lambda: sw.CheckpointHook(**kwargs))
    assert isinstance(ours, type(theirs))
    first = str(theirs).split(",")[0].split(".")[0].strip("'\"")
    assert first in str(ours)


def test_checkpoint_hook_resolves_out_dir_and_the_best_paths_as_mmengine(tmp_path):
    hub = sw.MessageHub()
    hub.update_info("best_ckpt_acc", "best_acc.pth")
    runner = SimpleNamespace(
        work_dir=str(tmp_path / "exp"), message_hub=hub, logger=Mock(), epoch=0, iter=0
    )
    hook = sw.CheckpointHook(save_best=["acc", "mIoU"])
    hook.before_train(runner)
    assert hook.out_dir == runner.work_dir
    assert hook.best_ckpt_path_dict == dict(acc="best_acc.pth", mIoU=None)
    hook = sw.CheckpointHook(out_dir=str(tmp_path / "elsewhere"))
    hook.before_train(runner)
    assert hook.out_dir == str(tmp_path / "elsewhere" / "exp")  # out_dir/<work_dir's name>
    assert hook.file_backend.join_path("a", "b") == "a/b"


def test_checkpoint_hook_refuses_a_remote_backend_by_name():
    with pytest.raises(ValueError, match="petrel.*local"):
        sw.CheckpointHook(backend_args=dict(backend="petrel"))


def test_checkpoint_hook_warns_about_empty_metrics_and_saves_nothing_outside_training():
    runner = SimpleNamespace(logger=Mock(), save_checkpoint=Mock())
    hook = sw.CheckpointHook(save_best="auto")
    hook.after_val_epoch(runner, {})
    runner.logger.warning.assert_called_once()
    hook.after_val_epoch(runner, {"acc": 1.0})  # a val() run: before_train never came
    runner.save_checkpoint.assert_not_called()


# ----------------------------------------------------------------------------- LoggerHook
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(interval="100"),
        dict(interval=-1),
        dict(ignore_last="False"),
        dict(interval_exp_name="100"),
        dict(interval_exp_name=-1),
        dict(out_suffix=[100]),
        dict(out_dir=1),
        dict(keep_local=0),
        dict(file_client_args=dict(enable_mc=True)),
        dict(out_dir="d", file_client_args=dict(enable_mc=True), backend_args=dict(a=1)),
    ],
)
def test_logger_hook_refuses_what_mmengine_refuses(kwargs):
    theirs = _raised(lambda: mm_hooks.LoggerHook(**kwargs))
    ours = _raised(lambda: sw.LoggerHook(**kwargs))
    assert type(ours) is type(theirs)
    assert str(theirs)[:28] in str(ours)


def test_logger_hook_keeps_mmengines_arguments_as_attributes():
    kwargs = dict(interval=7, ignore_last=False, interval_exp_name=50, keep_local=False)
    ours, theirs = sw.LoggerHook(**kwargs), mm_hooks.LoggerHook(**kwargs)
    for name in ("interval", "ignore_last", "interval_exp_name", "out_suffix", "keep_local"):
        assert getattr(ours, name) == getattr(theirs, name), name


# ----------------------------------------------------------------------------- LogProcessor
def _hubs():
    """The same logged values in shardwise's hub and in mmengine's."""
    ours, theirs = sw.MessageHub(), mm_logging.MessageHub(f"hub_{id(object())}")
    for hub in (ours, theirs):
        for i in range(12):
            hub.update_scalar("train/lr", 0.1 / (i + 1))
            hub.update_scalar("train/loss", 3.0 - 0.1 * i)
            hub.update_scalar("train/loss_cls", 1.0 + (i % 3))
            hub.update_scalar("train/time", 0.2 + 0.01 * i)
            hub.update_scalar("train/data_time", 0.01 * i)
            hub.update_scalar("train/accuracy", 0.5 + 0.01 * i)
            hub.update_scalar("val/time", 0.1 * (i + 1))
            hub.update_scalar("val/data_time", 0.05)
            hub.update_scalar("val/loss", 1.0 / (i + 1))
        hub.update_scalar("val/acc", 0.75)
        hub.update_info("eta", 123.4)
        hub.update_info("val/confusion", [[1, 0], [0, 1]])
    return ours, theirs


def _mock_loop_runner(hub, *, trained: bool):
    runner = Mock()
    runner.message_hub = hub
    runner.iter, runner.epoch, runner.max_iters, runner.max_epochs = 11, 3, 40, 10
    runner._train_loop = Mock() if trained else None
    for loop in ("train_loop", "val_loop", "test_loop"):
        getattr(runner, loop).dataloader = list(range(12))
    return runner


CUSTOM = [
    dict(data_src="loss", method_name="max", log_name="loss_max", window_size="global"),
    dict(data_src="loss_cls", method_name="min", window_size=5),
]


@pytest.mark.parametrize("by_epoch", [True, False])
@pytest.mark.parametrize("mode", ["train", "val", "test"])
@pytest.mark.parametrize("hierarchy", [False, True])
@pytest.mark.parametrize("trained", [True, False])
def test_log_processor_gives_mmengines_values_and_line_after_an_iteration(
    by_epoch, mode, hierarchy, trained
):
    kwargs = dict(window_size=4, by_epoch=by_epoch, log_with_hierarchy=hierarchy)
    ours_hub, theirs_hub = _hubs()
    ours = sw.LogProcessor(**kwargs, custom_cfg=CUSTOM if by_epoch else CUSTOM[1:])
    theirs = mm_runner.LogProcessor(**kwargs, custom_cfg=CUSTOM if by_epoch else CUSTOM[1:])
    got = ours.get_log_after_iter(_mock_loop_runner(ours_hub, trained=trained), 5, mode)
    want = theirs.get_log_after_iter(_mock_loop_runner(theirs_hub, trained=trained), 5, mode)
    assert got[1] == want[1]
    assert got[0] == pytest.approx(dict(want[0]))
    assert list(got[0]) == list(want[0])


@pytest.mark.parametrize("by_epoch", [True, False])
@pytest.mark.parametrize("mode", ["val", "test"])
@pytest.mark.parametrize("with_non_scalar", [False, True])
def test_log_processor_gives_mmengines_values_and_line_after_an_epoch(
    by_epoch, mode, with_non_scalar
):
    ours_hub, theirs_hub = _hubs()
    ours, theirs = sw.LogProcessor(by_epoch=by_epoch), mm_runner.LogProcessor(by_epoch=by_epoch)
    got = ours.get_log_after_epoch(
        _mock_loop_runner(ours_hub, trained=True), 11, mode, with_non_scalar
    )
    want = theirs.get_log_after_epoch(
        _mock_loop_runner(theirs_hub, trained=True), 11, mode, with_non_scalar
    )
    if mode == "val":  # a deliberate difference: the epoch's own loss, not a mean of epochs
        mean, latest = theirs_hub.get_scalar("val/loss").mean(10), 1.0 / 12
        want = ({**want[0], "loss": latest}, want[1].replace(f"loss: {mean:.4f}", "loss: 0.0833"))
        assert got[0]["loss"] == pytest.approx(latest) and mean != pytest.approx(latest)
    assert got[1] == want[1]
    assert list(got[0]) == list(want[0])
    for key, value in want[0].items():
        assert got[0][key] == (value if isinstance(value, list) else pytest.approx(value)), key
    assert ("confusion" in got[0]) == (with_non_scalar and mode == "val")  # not a number


@pytest.mark.parametrize(
    "custom_cfg, by_epoch",
    [
        ([dict(data_src="loss", window_size="epoch")], False),
        ([dict(data_src="loss", log_name="l"), dict(data_src="loss", log_name="l")], True),
        ([dict(data_src="loss"), dict(data_src="loss")], True),
    ],
)
def test_log_processor_refuses_the_custom_cfg_mmengine_refuses(custom_cfg, by_epoch):
    with pytest.raises(AssertionError):
        mm_runner.LogProcessor(custom_cfg=custom_cfg, by_epoch=by_epoch)
    with pytest.raises(AssertionError):
        sw.LogProcessor(custom_cfg=custom_cfg, by_epoch=by_epoch)


def test_log_processor_refuses_an_unknown_window_size():
    with pytest.raises(TypeError, match="window_size should be int, epoch or global"):
        sw.LogProcessor()._parse_windows_size(Mock(iter=3), 1, [dict(data_src="x", window_size=[])])


# ----------------------------------------------------------------------------- LoggerHook calls
def _logger_runner(loader_length, **attrs):
    """A runner as mmengine's LoggerHook tests mock it; its log processor gives fixed lines."""
    runner = Mock(experiment_name="exp", timestamp="20260101_000000", **attrs)
    runner.iter, runner.epoch, runner.max_iters = 0, 0, 1000
    runner.train_dataloader = list(range(loader_length))
    runner.val_dataloader = runner.test_dataloader = list(range(12))
    runner.log_processor.get_log_after_iter.return_value = ({"loss": 1.0}, "iter line")
    runner.log_processor.get_log_after_epoch.return_value = (
        {"acc": 0.8, "time": 1.0},
        "epoch line",
    )
    return runner


def _what_logger_hook_did(runner):
    """The log processor's, logger's and visualizer's calls, the runner named as such."""
    out = []
    for name, args, kwargs in runner.mock_calls:
        if name.split(".")[0] in ("log_processor", "logger", "visualizer"):
            args = tuple("runner" if a is runner else a for a in args)
            out.append((name, args, kwargs))
    return out


@pytest.mark.parametrize(
    "kwargs, loader_length",
    [
        (dict(), 25),  # every 10 iterations of an epoch; its tail ignored
        (dict(ignore_last=False), 25),  # and the epoch's last iteration
        (dict(), 9),  # an epoch shorter than the interval: its end
        (dict(interval=3, interval_exp_name=7), 8),
    ],
)
def test_logger_hook_calls_the_log_processor_logger_and_visualizer_as_mmengines(
    kwargs, loader_length
):
    """Training iterations (two epochs), then validation and test iterations: the same calls
    at the same places (mmengine's LoggerHook unit tests, run on both hooks)."""
    seen = []
    for hook in (mm_hooks.LoggerHook(**kwargs), sw.LoggerHook(**kwargs, progress_bar=False)):
        runner = _logger_runner(loader_length)
        for step in range(1, 2 * loader_length):  # (shardwise adds iteration 0's line)
            runner.iter, runner.epoch = step, step // loader_length
            hook.after_train_iter(runner, step % loader_length)
        for batch_idx in range(12):
            hook.after_val_iter(runner, batch_idx)
            hook.after_test_iter(runner, batch_idx)
        seen.append(_what_logger_hook_did(runner))
    assert seen[1] == seen[0]
    assert any(name == "visualizer.add_scalars" for name, _, _ in seen[0])


@pytest.mark.parametrize("by_epoch", [True, False])
@pytest.mark.parametrize("trained", [True, False])
def test_logger_hook_after_val_epoch_without_its_files_sends_the_tag_as_mmengines(
    by_epoch, trained
):
    seen = []
    for hook in (
        mm_hooks.LoggerHook(log_metric_by_epoch=by_epoch),
        sw.LoggerHook(log_metric_by_epoch=by_epoch),
    ):
        runner = _logger_runner(4, _train_loop=Mock() if trained else None)
        runner.iter, runner.epoch = 7, 2
        hook.after_val_epoch(runner)
        seen.append(_what_logger_hook_did(runner))
    assert seen[1] == seen[0]
    step = (2 if by_epoch else 7) if trained else 0
    assert seen[0][-1][2] == dict(step=step, file_path=None)


def test_logger_hook_writes_the_test_tag_as_mmengines(tmp_path):
    """after_test_epoch: the log processor's line, and its tag (non-scalars included, tensors
    as lists) in ``log_dir/<timestamp>.json``."""
    written = []
    for name, hook in (("mmengine", mm_hooks.LoggerHook()), ("shardwise", sw.LoggerHook())):
        runner = _logger_runner(4, log_dir=str(tmp_path / name), work_dir=str(tmp_path / name))
        (tmp_path / name).mkdir()
        runner.log_processor.get_log_after_epoch.return_value = (
            {"acc": 0.8, "conf": torch.tensor([1, 2]), "time": 1.0},
            "epoch line",
        )
        hook.before_run(runner)
        hook.after_test_epoch(runner)
        hook.after_run(runner)
        calls = [c for c in _what_logger_hook_did(runner) if not c[0].startswith("visualizer")]
        written.append((calls, json.loads((tmp_path / name / "20260101_000000.json").read_text())))
    assert written[1] == written[0]
    assert written[0][1] == {"acc": 0.8, "conf": [1, 2], "time": 1.0}
