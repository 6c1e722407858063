"""SingleDeviceStrategy and DDPStrategy: prepare, full checkpoints, resume, bad input."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from shardwise.checkpoint import CheckpointError, find_last_checkpoint
from shardwise.optim import LinearLR, MultiStepLR, OptimWrapper, OptimWrapperDict, StepLR
from shardwise.strategies import DDPStrategy, SingleDeviceStrategy, build_strategy
from tests.distributed import DistributedTestError, run_distributed
from tests.toy import ToyGAN, ToyNet, final_weights, train_steps

OPTIM = dict(optimizer=dict(type="AdamW", lr=0.01, weight_decay=0.01))
SCHEDULERS = [
    dict(type="LinearLR", start_factor=0.5, by_epoch=False, begin=0, end=2),
    dict(type="CosineAnnealingLR", by_epoch=False, begin=2, end=6, eta_min=1e-4),
]


def _strategy(tmp_path, cls=SingleDeviceStrategy, **kwargs):
    kwargs.setdefault("env_kwargs", dict(randomness=dict(seed=0)))
    return cls(work_dir=str(tmp_path), **kwargs)


# ----------------------------------------------------------------------------- prepare
def test_prepare_returns_the_model_alone_without_an_optimizer(tmp_path):
    model = _strategy(tmp_path).prepare(dict(type="ToyNet", width=4))
    assert isinstance(model, ToyNet) and model.net[0].out_features == 4


def test_prepare_accepts_built_objects(tmp_path):
    model = ToyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = StepLR(optimizer, step_size=2)
    got_model, wrapper, schedulers = _strategy(tmp_path).prepare(
        model, optim_wrapper=optimizer, param_scheduler=scheduler
    )
    assert got_model is model and wrapper.optimizer is optimizer and schedulers == [scheduler]


def test_prepare_builds_from_configs_and_a_list_of_schedulers(tmp_path):
    model, wrapper, schedulers = _strategy(tmp_path).prepare(
        ToyNet(), optim_wrapper=OPTIM, param_scheduler=SCHEDULERS
    )
    assert isinstance(wrapper, OptimWrapper) and isinstance(wrapper.optimizer, torch.optim.AdamW)
    assert [type(s).__name__ for s in schedulers] == ["LinearLR", "CosineAnnealingLR"]
    assert wrapper.get_lr()["lr"] == [pytest.approx(0.005)]  # warm-up starts at half


def test_prepare_builds_a_multi_optimizer_dict(tmp_path):
    model, wrapper, schedulers = _strategy(tmp_path).prepare(
        ToyGAN(),
        optim_wrapper=dict(
            generator=dict(optimizer=dict(type="SGD", lr=0.1)),
            discriminator=dict(optimizer=dict(type="Adam", lr=0.001)),
        ),
        param_scheduler=dict(generator=dict(type="StepLR", step_size=1, by_epoch=False, end=4)),
    )
    assert isinstance(wrapper, OptimWrapperDict)
    assert wrapper["generator"].optimizer.param_groups[0]["params"][0] is model.generator.weight
    assert list(schedulers) == ["generator"] and isinstance(schedulers["generator"][0], StepLR)


def test_prepare_is_idempotent(tmp_path):
    strategy = _strategy(tmp_path)
    first = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    second = strategy.prepare(ToyNet(), optim_wrapper=dict(optimizer=dict(type="SGD", lr=1)))
    assert first[0] is second[0] and first[1] is second[1]


def test_scheduler_end_defaults_to_max_iters(tmp_path):
    _, _, schedulers = _strategy(tmp_path).prepare(
        ToyNet(),
        optim_wrapper=OPTIM,
        param_scheduler=dict(type="LinearLR", by_epoch=False),
        dispatch_kwargs=dict(max_iters=40),
    )
    assert schedulers[0].end == 40


def test_auto_scale_lr_scales_by_world_size_times_batch(tmp_path):
    strategy = _strategy(tmp_path, auto_scale_lr=dict(enable=True, base_batch_size=64))
    _, wrapper = strategy.prepare(
        ToyNet(), optim_wrapper=OPTIM, dispatch_kwargs=dict(train_micro_batch_size_per_gpu=16)
    )
    assert wrapper.get_lr()["lr"] == [pytest.approx(0.01 * 16 / 64)]


def test_compile_model_compiles_the_target_method(tmp_path):
    strategy = _strategy(tmp_path)
    model = strategy.prepare(ToyNet(), compile=dict(backend="eager"))
    assert "forward" in vars(model)  # the instance now carries the compiled forward
    model.eval()
    assert model(torch.randn(3, 4)).shape == (3, 1)


def test_sync_batchnorm_is_reverted_on_a_single_device(tmp_path):
    model = nn.SyncBatchNorm.convert_sync_batchnorm(ToyNet())
    model = _strategy(tmp_path).prepare(model)
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in model.modules())
    assert model(torch.randn(5, 4)).shape == (5, 1)


def test_mmengine_build_optim_wrapper_docstring_examples(tmp_path):
    strategy = _strategy(tmp_path)
    model = strategy.prepare(nn.Linear(2, 2))
    cfg = dict(type="OptimWrapper", optimizer=dict(type="SGD", lr=0.01))
    wrapper = strategy.build_optim_wrapper(cfg, model)
    assert isinstance(wrapper, OptimWrapper) and wrapper.optimizer.defaults["lr"] == 0.01
    wrapper = strategy.build_optim_wrapper(dict(optimizer=dict(type="SGD", lr=0.01)), model)
    assert type(wrapper) is OptimWrapper and wrapper.accumulative_counts == 1
    multi = strategy.build_optim_wrapper(
        dict(
            generator=OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01)),
            discriminator=OptimWrapper(torch.optim.Adam(model.parameters(), lr=0.001)),
        ),
        model,
    )
    assert isinstance(multi, OptimWrapperDict) and list(multi.keys()) == [
        "generator",
        "discriminator",
    ]


def test_build_optim_wrapper_with_built_wrappers_needs_no_model(tmp_path):
    """mmengine's semantics: a dict whose every value is a built OptimWrapper becomes an
    OptimWrapperDict without a model, before prepare and after it."""
    from mmengine._strategy.base import BaseStrategy as MMBaseStrategy
    from mmengine.optim import OptimWrapper as MMOptimWrapper
    from mmengine.optim import OptimWrapperDict as MMOptimWrapperDict

    gan = ToyGAN()

    def wrappers(cls):
        return dict(
            generator=cls(torch.optim.SGD(gan.generator.parameters(), lr=0.01)),
            discriminator=cls(torch.optim.Adam(gan.discriminator.parameters(), lr=0.001)),
        )

    oracle = MMBaseStrategy.build_optim_wrapper(None, wrappers(MMOptimWrapper))  # no self used
    assert isinstance(oracle, MMOptimWrapperDict)
    strategy = _strategy(tmp_path)
    before = strategy.build_optim_wrapper(wrappers(OptimWrapper))
    strategy.prepare(ToyNet())
    after = strategy.build_optim_wrapper(wrappers(OptimWrapper))
    for built in (before, after):
        assert isinstance(built, OptimWrapperDict)
        assert list(built.keys()) == list(oracle.keys()) == ["generator", "discriminator"]
        assert built["generator"].optimizer.param_groups[0]["params"][0] is gan.generator.weight


def test_build_optim_wrapper_without_a_model_for_a_config_says_so_in_one_line(tmp_path):
    strategy = _strategy(tmp_path)
    with pytest.raises(ValueError, match="needs a model") as info:
        strategy.build_optim_wrapper(dict(optimizer=dict(type="SGD", lr=0.01)))
    assert "\n" not in str(info.value) and "prepare" in str(info.value)
    with pytest.raises(ValueError, match="'discriminator'.*needs a model"):
        strategy.build_optim_wrapper(
            dict(
                generator=OptimWrapper(torch.optim.SGD(ToyNet().parameters(), lr=0.1)),
                discriminator=dict(optimizer=dict(type="Adam", lr=0.001)),
            )
        )
    built = strategy.build_optim_wrapper(
        dict(optimizer=torch.optim.SGD(ToyNet().parameters(), lr=0.1))
    )  # a built optimizer needs no model, as in mmengine
    assert isinstance(built, OptimWrapper)


def test_mmengine_build_param_scheduler_docstring_examples(tmp_path):
    strategy = _strategy(tmp_path)
    strategy.prepare(
        nn.Linear(2, 2),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        dispatch_kwargs=dict(max_epochs=3),
    )
    schedulers = strategy.build_param_scheduler(dict(type="MultiStepLR", milestones=[1, 2]))
    assert len(schedulers) == 1 and isinstance(schedulers[0], MultiStepLR)
    schedulers = strategy.build_param_scheduler(
        [dict(type="MultiStepLR", milestones=[1, 2]), dict(type="StepLR", step_size=1)]
    )
    assert [type(s) for s in schedulers] == [MultiStepLR, StepLR]


def test_build_strategy_from_a_config(tmp_path):
    strategy = build_strategy(dict(type="SingleDeviceStrategy", work_dir=str(tmp_path)))
    assert isinstance(strategy, SingleDeviceStrategy)
    assert strategy.device == torch.device("cpu") and Path(strategy.log_dir).is_dir()
    system_env, runtime_env = strategy.collect_env()
    assert "PyTorch" in system_env and runtime_env["Strategy"] == "SingleDeviceStrategy"


# ----------------------------------------------------------------------------- checkpoints
def _train_and_save(work_dir, steps_before_save, steps_after_save, resume_from=None):
    """Train; optionally resume first; save after ``steps_before_save`` steps."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    cls = DDPStrategy if int(os.environ.get("WORLD_SIZE", "1")) > 1 else SingleDeviceStrategy
    strategy = cls(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=7)))
    model, wrapper, schedulers = strategy.prepare(
        ToyNet(), optim_wrapper=OPTIM, param_scheduler=SCHEDULERS
    )
    losses = []
    if resume_from is not None:
        meta = strategy.resume(resume_from)["meta"]
        assert meta["strategy"] == cls.__name__
    else:
        losses += train_steps(model, wrapper, schedulers, range(steps_before_save), rank)
        strategy.save_checkpoint("iter_3.pth", extra_ckpt=dict(meta=dict(iter=3)))
    losses += train_steps(model, wrapper, schedulers, steps_after_save, rank)
    return losses, final_weights(strategy)


@pytest.mark.parametrize("world_size", [1, 2], ids=["single_device", "ddp_2_ranks"])
def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path, world_size):
    work_dir = str(tmp_path)
    full = run_distributed(_train_and_save, world_size, work_dir, 3, range(3, 6))
    ckpt = os.path.join(work_dir, "iter_3.pth")
    assert find_last_checkpoint(work_dir) == ckpt
    resumed = run_distributed(_train_and_save, world_size, work_dir, 0, range(3, 6), ckpt)
    for (full_losses, full_weights), (resumed_losses, resumed_weights) in zip(full, resumed):
        assert resumed_losses == full_losses[3:]
        assert resumed_weights.keys() == full_weights.keys()
        for key in full_weights:
            assert torch.equal(resumed_weights[key], full_weights[key]), key


def test_a_full_checkpoint_loads_into_a_plain_module(tmp_path):
    strategy = _strategy(tmp_path)
    model, wrapper = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    train_steps(model, wrapper, [], range(2))
    strategy.save_checkpoint("ckpt.pth")
    checkpoint = torch.load(tmp_path / "ckpt.pth", weights_only=True)
    plain = ToyNet()
    plain.load_state_dict(checkpoint["state_dict"])  # strict: same keys, no prefixes
    assert torch.equal(plain.net[0].weight, model.net[0].weight)
    assert set(checkpoint["optimizer"]["state"]) == {n for n, _ in model.named_parameters()}
    meta = checkpoint["meta"]
    assert meta["format"] == "full" and meta["world_size"] == 1 and meta["seed"] == 0
    assert len(meta["rng_states"]) == 1


def _save_under_ddp(work_dir):
    strategy = DDPStrategy(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=3)))
    model, wrapper = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    train_steps(model, wrapper, [], range(2), strategy.rank)
    strategy.save_checkpoint("ddp.pth")
    return final_weights(strategy)


def test_checkpoints_move_between_single_device_and_ddp(tmp_path):
    ddp_weights = run_distributed(_save_under_ddp, 2, str(tmp_path))[0]
    strategy = _strategy(tmp_path)
    strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    strategy.load_checkpoint(tmp_path / "ddp.pth", strict=True)
    assert all(torch.equal(v, ddp_weights[k]) for k, v in final_weights(strategy).items())
    strategy.resume(tmp_path / "ddp.pth")  # optimizer state too: keyed by name, no prefixes
    strategy.save_checkpoint("single.pth")
    results = run_distributed(_load_into_ddp, 2, str(tmp_path), str(tmp_path / "single.pth"))
    assert all(torch.equal(results[0][k], ddp_weights[k]) for k in ddp_weights)


def _load_into_ddp(work_dir, path):
    strategy = DDPStrategy(work_dir=work_dir)
    strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    strategy.resume(path)
    return final_weights(strategy)


def _kill_before_rename(work_dir):
    import shardwise.checkpoint.commit as commit

    strategy = SingleDeviceStrategy(work_dir=work_dir)
    model, wrapper = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    strategy.save_checkpoint("epoch_1.pth")

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    commit._commit_on_rank0 = die
    train_steps(model, wrapper, [], range(1))
    strategy.save_checkpoint("epoch_2.pth")


def _auto_resume(work_dir):
    strategy = SingleDeviceStrategy(work_dir=work_dir)
    strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    checkpoint = strategy.load_or_resume(resume=True)
    strategy.save_checkpoint("epoch_2.pth")
    return checkpoint["meta"]["format"], sorted(os.listdir(work_dir))


def test_a_process_killed_before_the_rename_leaves_the_previous_checkpoint(tmp_path):
    with pytest.raises(DistributedTestError, match="exit code -9"):
        run_distributed(_kill_before_rename, 1, str(tmp_path))
    assert (tmp_path / ".epoch_2.pth.partial").exists()  # written, never committed
    assert find_last_checkpoint(tmp_path) == str(tmp_path / "epoch_1.pth")
    fmt, files = run_distributed(_auto_resume, 1, str(tmp_path))[0]
    assert fmt == "full"
    assert ".epoch_2.pth.partial" not in files and {"epoch_1.pth", "epoch_2.pth"} <= set(files)


def _ddp_never_touches_cuda(work_dir):
    def refuse(*args, **kwargs):
        raise AssertionError("CUDA was initialised on a CPU run")

    torch.cuda._lazy_init = refuse
    strategy = DDPStrategy(work_dir=work_dir, sync_bn="torch")
    model, wrapper = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    assert model.device_ids is None
    train_steps(model, wrapper, [], range(2), strategy.rank)
    strategy.save_checkpoint("ckpt.pth")
    strategy.resume("ckpt.pth")
    return strategy.device.type


def test_ddp_on_cpu_never_calls_into_cuda(tmp_path):
    assert run_distributed(_ddp_never_touches_cuda, 2, str(tmp_path)) == ["cpu", "cpu"]


def _ddp_options_and_train_step(work_dir):
    class StepNet(ToyNet):
        def train_step(self, data, optim_wrapper):
            loss = self(data[0]).pow(2).mean()
            optim_wrapper.update_params(loss)
            return {"loss": loss}

    strategy = DDPStrategy(
        work_dir=work_dir,
        model_wrapper=dict(
            type="MMDistributedDataParallel", find_unused_parameters=True, broadcast_buffers=False
        ),
    )
    model, wrapper = strategy.prepare(
        StepNet(), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1))
    )
    assert model.find_unused_parameters and not model.broadcast_buffers
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(strategy.rank))
    model.train_step((x,), wrapper)
    return model.module.net[0].weight.detach().clone()


def test_ddp_model_wrapper_options_and_train_step_synchronise_gradients(tmp_path):
    w0, w1 = run_distributed(_ddp_options_and_train_step, 2, str(tmp_path))
    assert torch.equal(w0, w1)  # different data per rank, same update: gradients were averaged


# ----------------------------------------------------------------------------- bad input
def test_a_model_that_is_neither_module_nor_config_is_refused(tmp_path):
    with pytest.raises(TypeError, match="model must be an nn.Module or a config dict"):
        _strategy(tmp_path).prepare("resnet50")


def test_a_scheduler_without_an_optimizer_wrapper_is_refused(tmp_path):
    strategy = _strategy(tmp_path)
    with pytest.raises(ValueError, match="param_scheduler was given without optim_wrapper"):
        strategy.prepare(ToyNet(), param_scheduler=SCHEDULERS)
    assert not hasattr(strategy, "model")


def test_auto_scale_lr_without_base_batch_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="base_batch_size"):
        _strategy(tmp_path, auto_scale_lr=dict(enable=True))


def test_auto_scale_lr_with_built_schedulers_is_refused(tmp_path):
    model = ToyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = _strategy(tmp_path, auto_scale_lr=dict(enable=True, base_batch_size=8))
    with pytest.raises(RuntimeError, match="pre-built parameter schedulers"):
        strategy.prepare(
            model,
            optim_wrapper=optimizer,
            param_scheduler=LinearLR(optimizer),
            dispatch_kwargs=dict(train_micro_batch_size_per_gpu=4),
        )


@pytest.fixture()
def prepared(tmp_path):
    strategy = _strategy(tmp_path)
    strategy.prepare(ToyNet(), optim_wrapper=OPTIM, param_scheduler=SCHEDULERS)
    return strategy


def test_a_missing_checkpoint_path_names_it(prepared, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pth"):
        prepared.load_checkpoint(tmp_path / "nope.pth")


def test_a_truncated_checkpoint_is_refused(prepared, tmp_path):
    prepared.save_checkpoint("good.pth")
    data = (tmp_path / "good.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 2])
    before = final_weights(prepared)
    with pytest.raises(CheckpointError, match="cut.pth is not a readable checkpoint"):
        prepared.load_checkpoint(tmp_path / "cut.pth")
    assert all(torch.equal(v, before[k]) for k, v in final_weights(prepared).items())


def test_a_file_that_is_not_a_checkpoint_is_refused(prepared, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="notes.txt is not a checkpoint: torch.save writes"):
        prepared.load_checkpoint(tmp_path / "notes.txt")


def test_resume_without_optimizer_state_names_the_flag_that_skips_it(prepared, tmp_path):
    prepared.save_checkpoint("weights.pth", save_optimizer=False)
    with pytest.raises(
        KeyError, match="weights.pth has no optimizer state.*resume_optimizer=False"
    ):
        prepared.resume(tmp_path / "weights.pth")
    prepared.resume(tmp_path / "weights.pth", resume_optimizer=False)


def test_a_strict_load_lists_missing_and_unexpected_keys(prepared, tmp_path):
    state = {k: v for k, v in prepared.model_state_dict().items() if not k.startswith("net.4")}
    torch.save({"state_dict": {**state, "head.weight": torch.zeros(1)}}, tmp_path / "other.pth")
    before = final_weights(prepared)
    with pytest.raises(
        RuntimeError,
        match=r"missing keys: \['net.4.bias', 'net.4.weight'\]"
        r"(.|\n)*unexpected keys: \['head.weight'\]",
    ):
        prepared.load_checkpoint(tmp_path / "other.pth", strict=True)
    assert all(torch.equal(v, before[k]) for k, v in final_weights(prepared).items())
    prepared.load_checkpoint(tmp_path / "other.pth")  # non-strict: loads what matches


def _resume_without_optimizer_state(work_dir, path):
    strategy = DDPStrategy(work_dir=work_dir)
    strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    strategy.resume(path)


def test_bad_input_is_raised_on_every_rank(prepared, tmp_path):
    prepared.save_checkpoint("weights.pth", save_optimizer=False)
    with pytest.raises(DistributedTestError) as info:
        run_distributed(
            _resume_without_optimizer_state, 2, str(tmp_path), str(tmp_path / "weights.pth")
        )
    assert "rank 0 failed" in str(info.value) and "rank 1 failed" in str(info.value)
    assert str(info.value).count("resume_optimizer=False") == 2


def test_save_and_load_callbacks_edit_the_checkpoint(prepared, tmp_path):
    def on_save(checkpoint):
        checkpoint["note"] = "edited before writing"

    prepared.save_checkpoint("cb.pth", callback=on_save, extra_ckpt=dict(meta=dict(epoch=4)))
    seen = {}
    rest = prepared.load_checkpoint(tmp_path / "cb.pth", callback=lambda c: seen.update(c))
    assert rest["note"] == "edited before writing" and rest["meta"]["epoch"] == 4
    assert "state_dict" in seen and "state_dict" not in rest


def test_saves_and_loads_run_with_the_garbage_collector_paused(prepared, tmp_path):
    import gc

    collecting = []  # gc.isenabled() inside each call (the callbacks run in its midst)
    record = lambda _: collecting.append(gc.isenabled())  # noqa: E731
    gc.enable()
    for async_save in (False, True):
        prepared.save_checkpoint("gc.pth", callback=record, async_save=async_save)
        prepared.wait_for_checkpoint()
    prepared.load_checkpoint("gc.pth", callback=record)
    prepared.resume("gc.pth", callback=record)
    assert collecting == [False] * 4
    assert gc.isenabled()


def test_revise_keys_rename_checkpoint_keys_before_loading(prepared, tmp_path):
    state = {f"backbone.{k}": v + 1 for k, v in prepared.model_state_dict().items()}
    torch.save({"state_dict": state}, tmp_path / "prefixed.pth")
    prepared.load_checkpoint(
        tmp_path / "prefixed.pth", strict=True, revise_keys=[(r"^backbone\.", "")]
    )
    loaded = prepared.model_state_dict()
    assert all(torch.equal(loaded[k[len("backbone.") :]], v) for k, v in state.items())


def test_a_bare_state_dict_file_loads(prepared, tmp_path):
    torch.save(ToyNet().state_dict(), tmp_path / "bare.pth")
    prepared.load_checkpoint(tmp_path / "bare.pth", strict=True)


def _custom_wrapper_and_prewrapped(work_dir):
    from torch.nn.parallel import DistributedDataParallel

    from shardwise.registry import MODEL_WRAPPERS

    @MODEL_WRAPPERS.register_module(force=True)
    class TaggedDDP(DistributedDataParallel):
        tagged = True

    strategy = DDPStrategy(work_dir=work_dir, model_wrapper=dict(type="TaggedDDP"))
    custom = strategy.prepare(ToyNet())
    prewrapped = DistributedDataParallel(ToyNet())
    again = DDPStrategy(work_dir=work_dir).prepare(prewrapped)
    return type(custom).__name__, again is prewrapped


def test_ddp_uses_a_custom_registered_wrapper_and_keeps_a_wrapped_model(tmp_path):
    results = run_distributed(_custom_wrapper_and_prewrapped, 2, str(tmp_path))
    assert results == [("TaggedDDP", True)] * 2


def test_an_unknown_model_wrapper_type_is_refused_at_construction(tmp_path):
    with pytest.raises(KeyError, match="MyDDP.* is not in the .*model_wrapper registry"):
        DDPStrategy(work_dir=str(tmp_path), model_wrapper=dict(type="MyDDP"))


def _train_after_an_early_save(work_dir, save_first, resume_from=None):
    strategy = SingleDeviceStrategy(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=1)))
    model, wrapper = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    if save_first:
        strategy.save_checkpoint("before_training.pth")
    if resume_from:
        strategy.resume(resume_from)
    train_steps(model, wrapper, [], range(3))
    return final_weights(strategy)


def test_saving_before_the_first_step_leaves_training_unchanged(tmp_path):
    untouched = _train_after_an_early_save(str(tmp_path / "a"), False)
    saved = _train_after_an_early_save(str(tmp_path / "b"), True)
    resumed = _train_after_an_early_save(
        str(tmp_path / "c"), False, str(tmp_path / "b" / "before_training.pth")
    )
    for key, value in untouched.items():
        assert torch.equal(saved[key], value) and torch.equal(resumed[key], value), key
    checkpoint = torch.load(tmp_path / "b" / "before_training.pth", weights_only=True)
    assert checkpoint["optimizer"]["state"] == {}


def test_a_full_save_is_hashed_while_written_not_read_back(prepared, tmp_path, monkeypatch):
    import xxhash

    import shardwise.checkpoint.commit as commit
    import shardwise.checkpoint.manifest as manifest
    from shardwise.checkpoint.verify import verify_checkpoint

    def no_second_read(path, *args, **kwargs):
        raise AssertionError(f"{path} was read back to hash it")

    monkeypatch.setattr(manifest, "file_checksum", no_second_read)
    monkeypatch.setattr(commit, "file_checksum", no_second_read)
    prepared.save_checkpoint("hashed.pth")
    monkeypatch.undo()
    recorded = manifest.read_manifest(tmp_path / "hashed.pth")
    entry = next(iter(recorded["files"].values())) if "files" in recorded else recorded
    expected = xxhash.xxh3_64((tmp_path / "hashed.pth").read_bytes()).hexdigest()
    assert expected in str(entry)
    assert verify_checkpoint(tmp_path / "hashed.pth").ok


def test_build_param_scheduler_takes_mmengine_s_default_args(tmp_path):
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path))
    _, optim_wrapper = strategy.prepare(
        torch.nn.Linear(2, 1), optim_wrapper=dict(optimizer=dict(type="SGD", lr=1.0))
    )
    (scheduler,) = strategy.build_param_scheduler(
        dict(type="LinearLR", start_factor=0.5, by_epoch=True, convert_to_iter_based=True),
        optim_wrapper,
        default_args=dict(max_epochs=2, epoch_length=10),
    )
    assert (scheduler.by_epoch, scheduler.begin, scheduler.end) == (False, 0, 20)
    lrs = []
    for _ in range(21):
        lrs.append(optim_wrapper.get_lr()["lr"][0])
        scheduler.step()
    # mmengine's LinearLR reaches end_factor at the last step of [begin, end): step 19
    assert lrs[0] == 0.5 and lrs[10] == pytest.approx(0.5 + 0.5 * 10 / 19)
    assert lrs[19] == pytest.approx(1.0) == lrs[20]
    with pytest.raises(ValueError, match="no 'max_iters' to default it to"):
        strategy.build_param_scheduler(
            dict(type="StepLR", by_epoch=False, step_size=1), default_args=dict(max_epochs=2)
        )
