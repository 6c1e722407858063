"""The Runner: loops, hooks, logging, checkpoints, exact resume, validation, testing, bad
input. (Hook stages against mmengine's Runner: tests/test_runner_hooks_mmengine.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from shardwise.checkpoint import find_last_checkpoint
from shardwise.registry import HOOKS, LOOPS
from shardwise.runner import (
    CheckpointHook,
    Hook,
    LoggerHook,
    ResumableSampler,
    Runner,
    TestLoop,
    build_dataloader,
)
from tests.distributed import run_distributed
from tests.test_runner_support import RegressionData


def _runner(tmp_path, name="run", **overrides) -> Runner:
    """A small regression run: 60 samples, batch 8 -> 8 iterations per epoch."""
    kwargs = dict(
        model=dict(type="DropoutRegressor"),
        work_dir=str(tmp_path / name),
        train_dataloader=dict(dataset=dict(type="RegressionData", n=60), batch_size=8),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        param_scheduler=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, end=5)],
        train_cfg=dict(by_epoch=True, max_epochs=2),
        default_hooks=dict(logger=dict(interval=3, progress_bar=False)),
        randomness=dict(seed=0),
    )
    kwargs.update(overrides)
    return Runner(**kwargs)


def _records(work_dir, mode="train") -> dict[int, dict]:
    """The JSONL records of every run in ``work_dir``, by iteration (later runs win)."""
    out = {}
    for log in sorted(Path(work_dir).glob("*/metrics.jsonl")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if record["mode"] == mode:
                out[record["iter"]] = record
    return out


# ----------------------------------------------------------------------------- loops and logs
def test_epoch_loop_logs_one_json_object_per_logged_iteration(tmp_path):
    runner = _runner(tmp_path)
    runner.train()
    assert (runner.epoch, runner.iter, runner.max_iters) == (2, 16, 16)
    records = _records(runner.work_dir)
    # every 3 iterations of an epoch (mmengine's LoggerHook: 8 per epoch), and the last one
    assert sorted(records) == [3, 6, 11, 14, 16]
    first = records[3]
    assert list(first)[:4] == ["mode", "iter", "epoch", "lr"]
    assert first["epoch"] == 0 and records[11]["epoch"] == 1
    assert first["lr"] == pytest.approx(0.01 * (0.1 + 0.9 * 2 / 4))  # the LR iteration 3 used
    for key in ("loss", "time", "data_time", "samples_per_sec"):
        assert isinstance(first[key], float)
    assert sorted(p.name for p in Path(runner.work_dir).glob("*.pth")) == [
        "epoch_1.pth",
        "epoch_2.pth",
    ]


def test_iteration_loop_runs_max_iters_across_epochs(tmp_path):
    runner = _runner(
        tmp_path,
        train_cfg=dict(by_epoch=False, max_iters=20),
        default_hooks=dict(
            logger=dict(interval=5, progress_bar=False),
            checkpoint=dict(by_epoch=False, interval=10),
        ),
    )
    runner.train()
    assert runner.iter == 20
    records = _records(runner.work_dir)
    assert sorted(records) == [5, 10, 15, 20]
    # the data goes round 2.5 times (8 batches each); mmengine counts the run as one epoch
    assert [records[i]["epoch"] for i in (5, 10, 15, 20)] == [0, 0, 0, 0]
    assert {p.name for p in Path(runner.work_dir).glob("*.pth")} == {"iter_10.pth", "iter_20.pth"}


def test_loss_falls_and_the_optimizer_and_schedulers_are_driven(tmp_path):
    runner = _runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=6))
    runner.train()
    records = _records(runner.work_dir)
    assert records[max(records)]["loss"] < records[min(records)]["loss"]
    assert [records[i]["lr"] for i in (3, 6)] == [pytest.approx(0.0055), pytest.approx(0.01)]


class _Recorder(Hook):
    def __init__(self, name, calls, priority="NORMAL"):
        self.name, self.calls, self.priority = name, calls, priority

    def before_run(self, runner):
        self.calls.append(self.name)


def test_hooks_run_by_priority_then_registration_order(tmp_path):
    calls = []
    runner = _runner(
        tmp_path,
        custom_hooks=[
            _Recorder("low", calls, "LOW"),
            _Recorder("first", calls, 0),
            _Recorder("normal-a", calls),
            _Recorder("normal-b", calls),
        ],
        train_cfg=dict(by_epoch=True, max_epochs=1),
    )
    runner.train()
    assert calls == ["first", "normal-a", "normal-b", "low"]
    names = [type(h).__name__ for h in runner.hooks]
    assert names.index("RuntimeInfoHook") < names.index("IterTimerHook")
    assert (
        names.index("LoggerHook")
        < names.index("ParamSchedulerHook")
        < names.index("CheckpointHook")
    )


def test_default_hooks_merge_options_and_none_removes_a_hook(tmp_path):
    runner = _runner(
        tmp_path,
        default_hooks=dict(
            checkpoint=None,
            logger=dict(interval=7, progress_bar=False),
            timer=dict(type="IterTimerHook", priority="VERY_LOW"),
        ),
    )
    names = [type(h).__name__ for h in runner.hooks]
    assert "CheckpointHook" not in names
    logger_hook = next(h for h in runner.hooks if isinstance(h, LoggerHook))
    assert logger_hook.interval == 7
    assert names[-2:] == ["IterTimerHook", "PreemptionHook"]  # VERY_LOW, then LOWEST


def test_a_hook_config_from_the_registry_is_built(tmp_path):
    @HOOKS.register_module(force=True)
    class CountItersHook(Hook):
        count = 0

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            type(self).count += 1
            assert "loss" in outputs

    _runner(tmp_path, custom_hooks=[dict(type="CountItersHook", priority="LOW")]).train()
    assert CountItersHook.count == 16


def test_the_model_own_train_step_and_val_step_are_used(tmp_path):
    runner = _runner(
        tmp_path,
        model=dict(type="OwnStepModel"),
        val_dataloader=dict(dataset=dict(type="RegressionData", n=20), batch_size=10),
        val_evaluator=dict(type="Accuracy"),
        train_cfg=dict(by_epoch=True, max_epochs=1),
    )
    runner.train()
    assert runner.model.steps == 8
    record = _records(runner.work_dir)[8]
    assert record["loss_twice"] == pytest.approx(2 * record["loss"])
    assert set(_records(runner.work_dir, "val")[8]) >= {"accuracy"}


# ----------------------------------------------------------------------------- exact resume
@pytest.mark.parametrize("by_epoch", [True, False], ids=["epochs", "iterations"])
def test_an_interrupted_run_resumes_with_exactly_the_losses_of_an_uninterrupted_one(
    tmp_path, by_epoch
):
    train_cfg = (
        dict(by_epoch=True, max_epochs=3) if by_epoch else dict(by_epoch=False, max_iters=20)
    )
    hooks = dict(
        logger=dict(interval=3, progress_bar=False),  # logging windows straddle the resume
        checkpoint=dict(by_epoch=False, interval=5),  # mid-epoch checkpoints
    )
    _runner(tmp_path, "whole", train_cfg=train_cfg, default_hooks=hooks).train()

    stop = [dict(type="StopAfterHook", at_iter=13)]
    with pytest.raises(SystemExit):
        _runner(
            tmp_path, "parts", train_cfg=train_cfg, default_hooks=hooks, custom_hooks=stop
        ).train()
    resumed = _runner(tmp_path, "parts", train_cfg=train_cfg, default_hooks=hooks, resume=True)
    resumed.train()

    whole, parts = _records(tmp_path / "whole"), _records(tmp_path / "parts")
    assert sorted(parts) == sorted(whole)
    assert [parts[i]["loss"] for i in sorted(parts)] == [whole[i]["loss"] for i in sorted(whole)]
    assert [parts[i]["lr"] for i in sorted(parts)] == [whole[i]["lr"] for i in sorted(whole)]


class _CountingData(RegressionData):
    def __init__(self, n):
        super().__init__(n=n)
        self.loaded = []

    def __getitem__(self, i):
        self.loaded.append(i)
        return super().__getitem__(i)


def test_a_resume_skips_the_consumed_batches_without_loading_them(tmp_path):
    data = _CountingData(60)
    loader = dict(dataset=data, batch_size=8)
    hooks = dict(logger=dict(progress_bar=False), checkpoint=dict(by_epoch=False, interval=5))
    whole = _CountingData(60)
    _runner(
        tmp_path, "whole", train_dataloader=dict(dataset=whole, batch_size=8), default_hooks=hooks
    ).train()
    with pytest.raises(SystemExit):
        _runner(
            tmp_path,
            "parts",
            train_dataloader=loader,
            default_hooks=hooks,
            custom_hooks=[dict(type="StopAfterHook", at_iter=7)],
        ).train()
    data.loaded.clear()
    _runner(tmp_path, "parts", train_dataloader=loader, default_hooks=hooks, resume=True).train()
    # resumed at iteration 5 of 16: 3 batches of epoch 0 (the last one has 4 samples), then 8
    assert len(data.loaded) == 8 + 8 + 4 + 8 * 7 + 4
    assert data.loaded == whole.loaded[5 * 8 :]


def test_resume_from_an_explicit_checkpoint_path(tmp_path):
    hooks = dict(logger=dict(interval=3, progress_bar=False), checkpoint=dict(interval=1))
    first = _runner(tmp_path, default_hooks=hooks, train_cfg=dict(by_epoch=True, max_epochs=1))
    first.train()
    ckpt = Path(first.work_dir) / "epoch_1.pth"
    second = _runner(
        tmp_path,
        "other",
        default_hooks=hooks,
        resume=str(ckpt),
        train_cfg=dict(by_epoch=True, max_epochs=2),
    )
    second.train()
    assert sorted(_records(second.work_dir)) == [11, 14, 16]  # continued from iteration 8


def test_load_from_loads_weights_and_starts_at_iteration_zero(tmp_path):
    first = _runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=1))
    first.train()
    second = _runner(
        tmp_path,
        "other",
        load_from=str(Path(first.work_dir) / "epoch_1.pth"),
        train_cfg=dict(by_epoch=True, max_epochs=1),
    )
    second.train()
    assert sorted(_records(second.work_dir)) == [3, 6, 8]


# ----------------------------------------------------------------------------- validation
def test_validation_reports_accuracy_and_keeps_only_the_best_checkpoint(tmp_path):
    runner = _runner(
        tmp_path,
        model=dict(type="BlobClassifier"),
        train_dataloader=dict(dataset=dict(type="BlobData", n=64), batch_size=16),
        val_dataloader=dict(dataset=dict(type="BlobData", n=30, seed=1), batch_size=8),
        val_evaluator=dict(type="Accuracy"),
        train_cfg=dict(by_epoch=True, max_epochs=4, val_interval=1),
        default_hooks=dict(
            logger=dict(progress_bar=False),
            checkpoint=dict(interval=1, max_keep_ckpts=2, save_best="auto"),
        ),
    )
    runner.train()
    val = _records(runner.work_dir, "val")
    assert sorted(val) == [4, 8, 12, 16]
    assert val[16]["accuracy"] >= 0.9
    names = sorted(p.name for p in Path(runner.work_dir).glob("*.pth"))
    best = [n for n in names if n.startswith("best_accuracy_epoch_")]
    assert len(best) == 1 and runner.message_hub.get_info("best_ckpt").endswith(best[0])
    assert [n for n in names if n.startswith("epoch_")] == ["epoch_3.pth", "epoch_4.pth"]


def test_runner_val_evaluates_a_checkpoint(tmp_path):
    trained = _runner(
        tmp_path,
        model=dict(type="BlobClassifier"),
        train_dataloader=dict(dataset=dict(type="BlobData", n=64), batch_size=16),
        train_cfg=dict(by_epoch=True, max_epochs=3),
    )
    trained.train()
    evaluator = Runner(
        model=dict(type="BlobClassifier"),
        work_dir=str(tmp_path / "val"),
        val_dataloader=dict(dataset=dict(type="BlobData", n=30, seed=1), batch_size=8),
        val_evaluator=[dict(type="Accuracy", topk=(1, 2))],
        load_from=str(Path(trained.work_dir) / "epoch_3.pth"),
        default_hooks=dict(logger=dict(progress_bar=False)),
    )
    metrics = evaluator.val()
    assert metrics["accuracy/top2"] == 1.0 and metrics["accuracy/top1"] > 0.8


def _gather_accuracy(n):
    from shardwise import dist
    from shardwise.runner import Accuracy

    dist.init_dist("pytorch")
    metric = Accuracy()
    data = torch.arange(n)
    sampler = ResumableSampler(data, shuffle=False)
    mine = [int(i) for i in sampler]
    # sample i is correct iff i is even; rank 1 gets the padded duplicate of sample 0
    logits = torch.tensor([[1.0, 0.0] if i % 2 == 0 else [0.0, 1.0] for i in mine])
    metric.process((data[mine], torch.zeros(len(mine), dtype=torch.long)), logits)
    return metric.evaluate(n)


def test_metrics_gather_every_rank_and_drop_the_sampler_padding():
    results = run_distributed(_gather_accuracy, 2, 5)
    assert results == [{"accuracy": 3 / 5}] * 2


# ----------------------------------------------------------------------------- data
def test_the_sampler_shuffles_per_epoch_identically_on_every_rank_and_splits_the_data():
    data = list(range(10))
    ranks = [ResumableSampler(data, seed=3, num_replicas=2, rank=r) for r in (0, 1)]
    epoch0 = [list(s) for s in ranks]
    assert sorted(epoch0[0] + epoch0[1]) == data
    for s in ranks:
        s.set_epoch(1)
    epoch1 = [list(s) for s in ranks]
    assert epoch1 != epoch0 and sorted(epoch1[0] + epoch1[1]) == data
    again = ResumableSampler(data, seed=3, num_replicas=2, rank=0)
    again.set_epoch(1)
    again.skip(2)
    assert list(again) == epoch1[0][2:] and list(again) == epoch1[0]  # the skip lasts one pass


def _worker_seed(i):
    import numpy as np

    return np.random.randint(1 << 30)


class _SeedData(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor(_worker_seed(i))


def test_worker_processes_are_seeded_from_the_seed_and_the_epoch():
    def draws(seed, epoch):
        loader = build_dataloader(
            dict(dataset=_SeedData(), batch_size=2, num_workers=2, shuffle=False), seed=seed
        )
        loader.sampler.set_epoch(epoch)
        return torch.cat(list(loader)).tolist()

    assert draws(0, 0) == draws(0, 0)
    assert draws(0, 1) != draws(0, 0) and draws(1, 0) != draws(0, 0)


# ----------------------------------------------------------------------------- checkpoints
def _spy_on_saves(runner, seen):
    original = runner.strategy.checkpointer.save

    def spy(filename, **kwargs):
        result = original(filename, **kwargs)
        seen.append(kwargs["async_save"] if result is None else "future")
        return result

    runner.strategy.checkpointer.save = spy
    return runner


def test_an_unset_async_save_leaves_the_strategys_default(tmp_path):
    seen = []
    _spy_on_saves(_runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=1)), seen).train()
    assert seen == [None]  # synchronous: the strategy's default
    runner = _runner(
        tmp_path,
        "b",
        train_cfg=dict(by_epoch=True, max_epochs=1),
        strategy=dict(type="SingleDeviceStrategy", async_save=True),
    )
    seen = []
    _spy_on_saves(runner, seen).train()
    assert seen == ["future"]


def test_background_saves_keep_the_newest_checkpoints_and_commit_before_the_run_ends(tmp_path):
    seen = []
    hooks = dict(
        logger=dict(progress_bar=False), checkpoint=dict(async_save=True, max_keep_ckpts=1)
    )
    runner = _runner(tmp_path, default_hooks=hooks, train_cfg=dict(by_epoch=True, max_epochs=3))
    _spy_on_saves(runner, seen).train()
    assert seen == ["future"] * 3
    assert sorted(p.name for p in Path(runner.work_dir).glob("*.pth")) == ["epoch_3.pth"]
    assert find_last_checkpoint(runner.work_dir).endswith("epoch_3.pth")


def test_checkpoints_record_the_loop_position_and_the_message_hub(tmp_path):
    runner = _runner(tmp_path, default_hooks=dict(checkpoint=dict(by_epoch=False, interval=5)))
    runner.train()
    ckpt = torch.load(Path(runner.work_dir) / "iter_5.pth", weights_only=True)
    assert {k: ckpt["meta"][k] for k in ("epoch", "iter", "epoch_length")} == dict(
        epoch=0, iter=5, epoch_length=8
    )
    assert len(ckpt["message_hub"]["log_scalars"]["train/loss"]["values"]) == 5


def test_checkpoint_hook_rejects_an_unknown_rule():
    with pytest.raises(ValueError, match="greater"):
        CheckpointHook(save_best="acc", rule="bigger")


# ----------------------------------------------------------------------------- testing
def _trained_classifier(tmp_path) -> Path:
    trained = _runner(
        tmp_path,
        "trained",
        model=dict(type="BlobClassifier"),
        train_dataloader=dict(dataset=dict(type="BlobData", n=64), batch_size=16),
        train_cfg=dict(by_epoch=True, max_epochs=3),
    )
    trained.train()
    return Path(trained.work_dir) / "epoch_3.pth"


def _tester(tmp_path, **overrides) -> Runner:
    kwargs = dict(
        model=dict(type="BlobClassifier"),
        work_dir=str(tmp_path / "test"),
        test_dataloader=dict(dataset=dict(type="BlobData", n=30, seed=2), batch_size=8),
        test_evaluator=dict(type="Accuracy"),
        default_hooks=dict(logger=dict(progress_bar=False)),
    )
    return Runner(**{**kwargs, **overrides})


def test_runner_test_evaluates_a_checkpoint_and_logs_the_metrics(tmp_path):
    runner = _tester(tmp_path, load_from=str(_trained_classifier(tmp_path)))
    metrics = runner.test()
    assert list(metrics) == ["accuracy"] and metrics["accuracy"] > 0.8
    assert _records(runner.work_dir, "test") == {0: dict(mode="test", iter=0, epoch=0, **metrics)}
    hub = runner.message_hub
    assert hub.get_scalar("test/accuracy").current() == metrics["accuracy"]
    assert len(hub.get_scalar("test/time")) == 4  # IterTimerHook times every test iteration
    assert "train/time" not in hub.log_scalars


def test_runner_test_without_a_checkpoint_tests_the_initial_weights(tmp_path):
    metrics = _tester(tmp_path).test()
    assert 0.0 <= metrics["accuracy"] <= 1.0


@LOOPS.register_module(force=True)
class _TaggedTestLoop(TestLoop):
    def __init__(self, runner, dataloader, evaluator, tag, fp16=False):
        super().__init__(runner, dataloader, evaluator, fp16=fp16)
        self.tag = tag

    def run(self):
        return {**super().run(), "tag": self.tag}


def test_test_cfg_may_name_a_loop_from_the_registry(tmp_path):
    runner = _tester(tmp_path, test_cfg=dict(type="_TaggedTestLoop", tag="mine"))
    assert runner.test()["tag"] == "mine"
    assert isinstance(runner.test_loop, _TaggedTestLoop)
    assert runner.test_evaluator is runner.test_loop.evaluator


def test_runner_test_needs_the_test_components(tmp_path):
    runner = _runner(tmp_path)
    with pytest.raises(RuntimeError, match="test_dataloader and test_evaluator"):
        runner.test()


def test_train_after_test_on_the_same_runner_is_refused_clearly(tmp_path):
    runner = _runner(
        tmp_path,
        model=dict(type="BlobClassifier"),
        train_dataloader=dict(dataset=dict(type="BlobData", n=64), batch_size=16),
        test_dataloader=dict(dataset=dict(type="BlobData", n=30, seed=2), batch_size=8),
        test_evaluator=dict(type="Accuracy"),
    )
    runner.test()
    with pytest.raises(RuntimeError, match="train first, or train with a new Runner"):
        runner.train()


def test_a_hook_method_with_the_wrong_signature_is_named(tmp_path):
    class OldStyleHook(Hook):
        def after_train_iter(self, runner):  # mmengine passes batch_idx, data_batch, outputs
            pass

    with pytest.raises(TypeError, match=r"OldStyleHook\(priority='NORMAL'\)\.after_train_iter"):
        _runner(tmp_path, custom_hooks=[OldStyleHook()]).train()


def test_train_outputs_reach_hooks_as_tensors(tmp_path):
    seen = []

    class LossHook(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            seen.append(outputs["loss"].item())  # as hooks written for mmengine read it

    hook = LossHook()
    _runner(tmp_path, custom_hooks=[hook], train_cfg=dict(by_epoch=True, max_epochs=1)).train()
    assert len(seen) == 8 and all(isinstance(loss, float) for loss in seen)


# ----------------------------------------------------------------------------- bad input
def _cfg(**overrides):
    cfg = dict(
        model=dict(type="DropoutRegressor"),
        train_dataloader=dict(dataset=dict(type="RegressionData"), batch_size=8),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
    )
    cfg.update(overrides)
    return {k: v for k, v in cfg.items() if v is not None}


@pytest.mark.parametrize(
    "overrides, error, words",
    [
        (dict(model=None), ValueError, ["no 'model'", "model=dict(type="]),
        (dict(train_cfg=dict(by_epoch=True)), ValueError, ["max_epochs", "add max_epochs=N"]),
        (dict(train_cfg=dict(val_begin=1)), ValueError, ["neither max_epochs nor max_iters"]),
        (dict(train_cfg=dict(by_epoch=False, max_epochs=3)), ValueError, ["max_iters"]),
        (
            dict(train_cfg=dict(max_epochs=2, val_interval=1)),
            ValueError,
            ["val_interval=1", "no val_dataloader", "val_dataloader=dict("],
        ),
        (
            dict(val_dataloader=dict(dataset=dict(type="BlobData"), batch_size=4)),
            ValueError,
            ["val_evaluator"],
        ),
        (dict(optim_wrapper=None), ValueError, ["optim_wrapper=..."]),
        (
            dict(train_dataloader=dict(dataset=dict(type="RegressionData"))),
            ValueError,
            ["batch_size"],
        ),
        (
            dict(test_dataloader=dict(dataset=dict(type="BlobData"), batch_size=4)),
            ValueError,
            ["got test_dataloader", "not test_evaluator", "test_evaluator=..."],
        ),
        (
            dict(test_evaluator=dict(type="Accuracy"), test_cfg=dict()),
            ValueError,
            ["got test_evaluator, test_cfg", "not test_dataloader", "test_dataloader=..."],
        ),
        (
            dict(
                test_dataloader=dict(dataset=dict(type="BlobData"), batch_size=4),
                test_evaluator=dict(type="Accuracy"),
                test_cfg="TestLoop",
            ),
            TypeError,
            ["test_cfg='TestLoop'", "a dict of TestLoop options", "test_cfg=dict()"],
        ),
        (
            dict(
                test_dataloader=dict(dataset=dict(type="BlobDatta"), batch_size=4),
                test_evaluator=dict(type="Accuracy"),
            ),
            KeyError,
            ["test_dataloader.dataset.type", "BlobDatta"],
        ),
        (
            dict(
                val_dataloader=dict(dataset=dict(type="BlobData"), batch_size=4),
                val_evaluator=dict(type="Accuracy"),
                val_cfg=["ValLoop"],
            ),
            TypeError,
            ["val_cfg=['ValLoop']", "a dict of ValLoop options"],
        ),
        (dict(resume="/nowhere/iter_5.pth"), FileNotFoundError, ["/nowhere/iter_5.pth"]),
        (dict(load_from="/nowhere/x.pth"), FileNotFoundError, ["load_from"]),
    ],
    ids=[
        "no-model",
        "epochs-without-max-epochs",
        "no-max-at-all",
        "iterations-without-max-iters",
        "val-interval-without-val-data",
        "val-data-without-evaluator",
        "no-optimizer",
        "no-batch-size",
        "test-data-without-evaluator",
        "test-evaluator-without-data",
        "test-cfg-not-a-dict",
        "test-dataset-unknown-type",
        "val-cfg-not-a-dict",
        "resume-missing-path",
        "load-missing-path",
    ],
)
def test_bad_configs_are_refused_before_anything_is_built(tmp_path, overrides, error, words):
    cfg = _cfg(work_dir=str(tmp_path / "never"), **overrides)
    with pytest.raises(error) as info:
        Runner.from_cfg(cfg)
    for word in words:
        assert word in str(info.value)
    assert not (tmp_path / "never").exists()  # nothing was created


def test_a_model_whose_forward_returns_no_loss_is_refused_before_any_update(tmp_path):
    runner = _runner(tmp_path, model=dict(type="LosslessModel"))
    with pytest.raises(ValueError, match=r"keys \['pred'\].*contains 'loss'.*train_step"):
        runner.train()
    assert runner.optim_wrapper.optimizer.state == {}


def test_a_train_step_without_loss_is_refused(tmp_path):
    class NoLossStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def train_step(self, data, optim_wrapper):
            return {"acc": 1.0}

    with pytest.raises(ValueError, match="'loss' entry"):
        _runner(tmp_path, model=NoLossStep()).train()


# ----------------------------------------------------------------------------- compatibility
def test_an_mmengine_style_config_trains(tmp_path):
    cfg = dict(
        default_scope="mmengine",
        model=dict(type="OwnStepModel"),
        work_dir=str(tmp_path / "mm"),
        train_dataloader=dict(
            batch_size=8,
            num_workers=0,
            sampler=dict(type="DefaultSampler", shuffle=True),
            collate_fn=dict(type="default_collate"),
            dataset=dict(type="RegressionData", n=32),
        ),
        train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1),
        val_dataloader=dict(
            batch_size=8,
            sampler=dict(type="DefaultSampler", shuffle=False),
            dataset=dict(type="RegressionData", n=16),
        ),
        val_cfg=dict(),
        val_evaluator=dict(type="Accuracy"),
        test_dataloader=dict(
            batch_size=8,
            sampler=dict(type="DefaultSampler", shuffle=False),
            dataset=dict(type="RegressionData", n=24, seed=2),
        ),
        test_cfg=dict(),
        test_evaluator=dict(type="Accuracy"),
        optim_wrapper=dict(type="OptimWrapper", optimizer=dict(type="SGD", lr=0.01, momentum=0.9)),
        param_scheduler=dict(type="MultiStepLR", by_epoch=True, milestones=[1], gamma=0.1),
        default_hooks=dict(
            timer=dict(type="IterTimerHook"),
            logger=dict(type="LoggerHook", interval=2, interval_exp_name=1000),
            param_scheduler=dict(type="ParamSchedulerHook"),
            checkpoint=dict(type="CheckpointHook", interval=1, published_keys=["meta"]),
            sampler_seed=dict(type="DistSamplerSeedHook"),
        ),
        env_cfg=dict(
            cudnn_benchmark=False,
            mp_cfg=dict(mp_start_method="fork", opencv_num_threads=0),
            dist_cfg=dict(backend="nccl"),
        ),
        log_processor=dict(window_size=10, by_epoch=True),
        visualizer=dict(type="Visualizer", vis_backends=[dict(type="LocalVisBackend")]),
        log_level="INFO",
        load_from=None,
        resume=False,
        randomness=dict(seed=0),
    )
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.epoch == 2 and runner.model.steps == 8
    records = _records(runner.work_dir)
    assert records[4]["lr"] == pytest.approx(0.01) and records[8]["lr"] == pytest.approx(0.001)
    assert sorted(_records(runner.work_dir, "val")) == [4, 8]
    metrics = runner.test()
    assert list(metrics) == ["accuracy"]
    assert list(_records(runner.work_dir, "test").values()) == [
        dict(mode="test", iter=8, epoch=2, accuracy=metrics["accuracy"])
    ]


def test_rank_zero_shows_a_progress_bar_with_loss_and_lr(tmp_path, capsys, monkeypatch):
    from shardwise.runner.hooks import logger_hook

    monkeypatch.setattr(logger_hook, "_is_terminal", lambda stream: True)  # as in a terminal
    _runner(tmp_path, default_hooks=dict(logger=dict(interval=4))).train()
    err = capsys.readouterr().err
    assert "16/16" in err and "(smoothed over 10)" in err and "lr " in err
    monkeypatch.undo()  # captured output is no terminal: no bar, the console lines only
    _runner(tmp_path, "plain", default_hooks=dict(logger=dict(interval=4))).train()
    assert "16/16" not in capsys.readouterr().err


def test_an_unknown_hook_argument_is_refused():
    with pytest.raises(TypeError, match="intervall"):
        CheckpointHook(intervall=3)
    with pytest.raises(TypeError, match="intervall"):
        LoggerHook(intervall=3)
