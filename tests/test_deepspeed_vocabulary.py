"""DeepSpeed's configuration vocabulary on FSDP2 (shardwise.strategies.deepspeed).

A DeepSpeed config (mmengine's ``DeepSpeedStrategy`` keywords, or a DeepSpeed JSON file given
as ``config=``) with ``optim_wrapper=dict(type='DeepSpeedOptimWrapper', ...)`` trains as the
FSDPStrategy it maps to. Oracles: a single-process run of the same model and batches (float32:
ZeRO stage 2 and 3, clipping, accumulation, to 1e-5), the hand-written FSDPStrategy config
the DeepSpeed config means (bfloat16: bit for bit, since bf16 rounding differs between one
process on the whole batch and two ranks on halves), and the same run uninterrupted (a save
and resume, bit for bit). Keys that cannot be honoured are refused by name in the config
check, before any worker starts; tuning knobs are named in one warning.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from shardwise.cli import main
from shardwise.runner.checks import check_config
from shardwise.strategies import DeepSpeedStrategy, FSDPStrategy, deepspeed_to_fsdp
from shardwise.strategies.deepspeed import translate_optim_wrapper
from shardwise.strategies.fsdp_config import parse_model_wrapper
from tests.distributed import run_distributed

STEPS = 10  # with gradient_accumulation_steps=2: 5 optimizer steps
OPTIM = dict(type="DeepSpeedOptimWrapper", optimizer=dict(type="AdamW", lr=1e-2, weight_decay=0.01))
CLIP_AND_ACCUMULATE = dict(gradient_clipping=0.3, gradient_accumulation_steps=2)


# ----------------------------------------------------------------------------- translation
@pytest.mark.parametrize(
    ("stage", "sharding", "reshard_after_forward"),
    [(3, "FULL_SHARD", True), (2, "SHARD_GRAD_OP", False), (1, "SHARD_GRAD_OP", False)],
)
def test_zero_stages_map_onto_fsdp2_sharding(stage, sharding, reshard_after_forward):
    translation = deepspeed_to_fsdp(zero_optimization=dict(stage=stage))
    wrapper = translation.strategy_kwargs["model_wrapper"]
    assert wrapper == {"sharding_strategy": sharding}
    fsdp = parse_model_wrapper(wrapper)
    assert (fsdp.reshard_after_forward, fsdp.mesh_kind) == (reshard_after_forward, "shard")
    # stage 1 says what it runs as, and why
    assert any("stage=1 runs as stage 2" in n for n in translation.notes) == (stage == 1)


def test_without_zero_optimization_every_rank_keeps_the_whole_model():
    # DeepSpeed's default stage is 0: data parallelism without sharding
    assert deepspeed_to_fsdp().strategy_kwargs["model_wrapper"] == {"sharding_strategy": "NO_SHARD"}


def test_precision_clipping_accumulation_and_batch_size_are_translated():
    bf16 = deepspeed_to_fsdp(
        bf16=dict(enabled=True),
        train_micro_batch_size_per_gpu=4,
        **CLIP_AND_ACCUMULATE,
    )
    assert bf16.strategy_kwargs == {
        "model_wrapper": {
            "sharding_strategy": "NO_SHARD",
            "mixed_precision": dict(param_dtype="bfloat16", reduce_dtype="float32"),
        },
        "train_micro_batch_size_per_gpu": 4,
    }
    assert bf16.optim_wrapper == dict(
        type="OptimWrapper", clip_grad=dict(max_norm=0.3), accumulative_counts=2
    )
    fp16 = deepspeed_to_fsdp(
        fp16=dict(enabled=True, initial_scale_power=12, loss_scale_window=500),
        communication_data_type="fp16",
    )
    assert fp16.strategy_kwargs["model_wrapper"]["mixed_precision"] == dict(
        param_dtype="float16", reduce_dtype="float16"
    )
    assert fp16.optim_wrapper == dict(
        type="AmpOptimWrapper",
        dtype="float16",
        loss_scale=dict(init_scale=4096.0, growth_interval=500),
    )
    static = deepspeed_to_fsdp(fp16=dict(enabled=True, loss_scale=128))
    assert static.optim_wrapper["loss_scale"] == 128.0
    # a section without enabled=True is off, as in DeepSpeed, and says so
    off = deepspeed_to_fsdp(fp16=dict(loss_scale=0))
    assert off.optim_wrapper == dict(type="OptimWrapper")
    assert off.ignored == (
        "fp16: ['loss_scale'] are off, as in DeepSpeed: fp16.enabled is not True",
    )
    amp = deepspeed_to_fsdp(amp=dict(enabled=True, opt_level="O1"))
    assert amp.optim_wrapper == dict(type="AmpOptimWrapper", dtype="float16")
    assert "mixed_precision" not in amp.strategy_kwargs["model_wrapper"]
    # train_batch_size = micro batch x accumulation x ranks: checked, or gives the micro batch
    derived = deepspeed_to_fsdp(
        dict(train_batch_size=32, gradient_accumulation_steps=2), world_size=4
    )
    assert derived.strategy_kwargs["train_micro_batch_size_per_gpu"] == 4
    with pytest.raises(ValueError, match=r"train_batch_size=30 is not .* = 32"):
        deepspeed_to_fsdp(
            dict(train_batch_size=30, train_micro_batch_size_per_gpu=4),
            gradient_accumulation_steps=2,
            world_size=4,
        )


def test_offload_activation_checkpointing_and_the_optimizer_section_are_translated():
    offload = deepspeed_to_fsdp(
        zero_optimization=dict(
            stage=3,
            offload_param=dict(device="cpu", pin_memory=False),
            offload_optimizer=dict(device="cpu"),
        )
    )
    assert offload.strategy_kwargs["model_wrapper"]["cpu_offload"] == dict(
        offload_params=True, pin_memory=False
    )
    alone = deepspeed_to_fsdp(zero_optimization=dict(stage=2, offload_optimizer=dict(device="cpu")))
    assert alone.strategy_kwargs["model_wrapper"]["cpu_offload"]["offload_params"] is True
    assert any("FSDP2 offloads parameters, gradients and optimizer" in n for n in alone.notes)
    mics = deepspeed_to_fsdp(zero_optimization=dict(stage=3, mics_shard_size=2))
    assert mics.strategy_kwargs["parallelism"] == dict(dp_shard=2, dp_replicate=-1)

    ac = deepspeed_to_fsdp(
        activation_checkpointing=dict(check_fn=["Block"], partition_activations=True)
    )
    assert ac.strategy_kwargs["activation_checkpointing"] == dict(check_fn=["Block"])
    assert any(i.startswith("activation_checkpointing.partition_activations") for i in ac.ignored)
    without = deepspeed_to_fsdp(activation_checkpointing=dict(partition_activations=True))
    assert "activation_checkpointing" not in without.strategy_kwargs
    assert any("add check_fn={'Block'}" in i for i in without.ignored)

    adam = deepspeed_to_fsdp(
        dict(optimizer=dict(type="Adam", params=dict(lr=3e-4, betas=[0.9, 0.95], torch_adam=True)))
    )
    assert adam.optimizer == dict(type="AdamW", lr=3e-4, betas=[0.9, 0.95])
    assert any("runs as torch's AdamW" in n for n in adam.notes)
    plain_adam = deepspeed_to_fsdp(
        dict(optimizer=dict(type="Adam", params=dict(lr=1e-3, adam_w_mode=False)))
    )
    assert plain_adam.optimizer == dict(type="Adam", lr=1e-3)


def test_the_optim_wrapper_gets_the_deepspeed_settings_and_disagreements_are_refused():
    translation = deepspeed_to_fsdp(fp16=dict(enabled=True), **CLIP_AND_ACCUMULATE)
    built = translate_optim_wrapper(OPTIM, translation)
    assert built == dict(
        type="AmpOptimWrapper",
        optimizer=OPTIM["optimizer"],
        dtype="float16",
        loss_scale=dict(init_scale=65536.0, growth_interval=1000),
        clip_grad=dict(max_norm=0.3),
        accumulative_counts=2,
    )
    with pytest.raises(ValueError, match=r"accumulative_counts=4 disagrees .* gradient_accum"):
        translate_optim_wrapper({**OPTIM, "accumulative_counts": 4}, translation)
    with pytest.raises(ValueError, match="optim_wrapper has no optimizer"):
        translate_optim_wrapper(dict(type="DeepSpeedOptimWrapper"), translation)
    section = deepspeed_to_fsdp(dict(optimizer=dict(type="AdamW", params=dict(lr=0.1))))
    assert translate_optim_wrapper(dict(type="DeepSpeedOptimWrapper"), section) == dict(
        type="OptimWrapper", optimizer=dict(type="AdamW", lr=0.1)
    )
    with pytest.raises(ValueError, match="both optim_wrapper.optimizer and the DeepSpeed"):
        translate_optim_wrapper(OPTIM, section)


def test_a_deepspeed_json_file_and_the_keywords_translate_alike(tmp_path):
    keys = dict(
        zero_optimization=dict(stage=3, overlap_comm=True),
        bf16=dict(enabled=True),
        train_micro_batch_size_per_gpu=4,
        **CLIP_AND_ACCUMULATE,
    )
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(keys))
    assert deepspeed_to_fsdp(str(path)) == deepspeed_to_fsdp(**keys)
    # mmengine's keywords replace the file's entries of the same name
    stage2 = deepspeed_to_fsdp(str(path), zero_optimization=dict(stage=2))
    assert stage2.strategy_kwargs["model_wrapper"]["sharding_strategy"] == "SHARD_GRAD_OP"


# ----------------------------------------------------------------------------- refusals
TINY = """
custom_imports = dict(imports=["tests.test_runner_support"])
model = dict(type="DropoutRegressor")
train_dataloader = dict(dataset=dict(type="RegressionData", n=64), batch_size=4)
optim_wrapper = dict(type="DeepSpeedOptimWrapper", optimizer=dict(type="AdamW", lr=0.01))
train_cfg = dict(by_epoch=False, max_iters=4)
"""
REFUSED = {
    "nvme-offload": (
        dict(zero_optimization=dict(stage=3, offload_param=dict(device="nvme", nvme_path="/x"))),
        ["zero_optimization.offload_param.device='nvme'", "ZeRO-Infinity", "device='cpu'"],
    ),
    "scheduler-section": (
        dict(config=dict(scheduler=dict(type="WarmupLR", params=dict(warmup_num_steps=10)))),
        ["scheduler", "param_scheduler", "LinearLR"],
    ),
    "unknown-key": (
        dict(config=dict(zero_optimisation=dict(stage=3))),
        ["'zero_optimisation'", "did you mean 'zero_optimization'"],
    ),
    "unknown-zero-key": (
        dict(zero_optimization=dict(stage=3, overlap_com=True)),
        ["zero_optimization.'overlap_com'", "'overlap_comm'"],
    ),
    "stage-4": (dict(zero_optimization=dict(stage=4)), ["zero_optimization.stage", "0, 1, 2 or 3"]),
    "fp16-and-bf16": (
        dict(fp16=dict(enabled=True), bf16=dict(enabled=True)),
        ["fp16 and bf16", "enable one precision"],
    ),
    "hf-auto-placeholder": (
        dict(gradient_accumulation_steps="auto"),
        ["gradient_accumulation_steps='auto'", "Hugging Face"],
    ),
    "onebit-optimizer": (
        dict(config=dict(optimizer=dict(type="OneBitAdam", params=dict(lr=1e-3)))),
        ["optimizer.type='OneBitAdam'", "1-bit", "'AdamW'"],
    ),
    "pipeline-parallelism": (dict(config=dict(pipeline=dict(stages=2))), ["pipeline", "tp"]),
    "train-batch-size-mismatch": (
        dict(train_micro_batch_size_per_gpu=4, config=dict(train_batch_size=16)),
        ["train_batch_size=16", "= 8"],
    ),
    "optimizer-given-twice": (
        dict(config=dict(optimizer=dict(type="AdamW", params=dict(lr=1e-3)))),
        ["both optim_wrapper.optimizer and the DeepSpeed config's optimizer"],
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_key_that_cannot_be_honoured_is_one_line_before_any_worker_starts(tmp_path, capsys, name):
    strategy, words = REFUSED[name]
    config = tmp_path / "config.py"
    config.write_text(TINY + f"strategy = dict(type='DeepSpeedStrategy', **{strategy!r})\n")
    args = ["train", str(config), "--work-dir", str(tmp_path / "never"), "--nproc-per-node", "2"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardwise train: error:") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)
    assert not (tmp_path / "never").exists()


def test_keys_not_honoured_are_named_with_the_reason_in_one_warning(caplog):
    cfg = dict(
        model=dict(type="ToyNet"),
        strategy=dict(
            type="DeepSpeedStrategy",
            config=dict(wall_clock_breakdown=True, aio=dict(block_size=1048576)),
            zero_optimization=dict(stage=2, reduce_bucket_size=5e8, contiguous_gradients=True),
            fp16=dict(enabled=True, hysteresis=2, min_loss_scale=1),
            inputs_to_half=["inputs"],
        ),
    )
    import tests.toy  # noqa: F401 - registers ToyNet

    with caplog.at_level(logging.WARNING, logger="shardwise"):
        check_config(cfg, world_size=2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    for key in (
        "wall_clock_breakdown",
        "aio: it configures NVMe offload I/O",
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.contiguous_gradients",
        "fp16.hysteresis: torch's GradScaler lowers the scale at the first overflow",
        "fp16.min_loss_scale",
        "inputs_to_half",
    ):
        assert key in warnings[0], key


def test_deepspeed_strategy_takes_fsdp_keywords_and_refuses_contradictions(tmp_path):
    check = DeepSpeedStrategy.check_config
    check(
        dict(
            type="DeepSpeedStrategy",
            zero_optimization=dict(stage=3),
            model_wrapper=dict(auto_wrap_policy={"Block"}),
            state_dict_cfg="full",
        )
    )
    with pytest.raises(ValueError, match=r"model_wrapper.sharding_strategy='NO_SHARD' disagrees"):
        check(
            dict(
                type="DeepSpeedStrategy",
                zero_optimization=dict(stage=3),
                model_wrapper=dict(sharding_strategy="NO_SHARD"),
            )
        )
    with pytest.raises(TypeError, match="no keyword 'zero_optimisation'"):
        check(dict(type="DeepSpeedStrategy", zero_optimisation=dict(stage=3)))


# ----------------------------------------------------------------------------- training
def _fsdp_equivalent(dtype: str | None) -> dict:
    """The FSDPStrategy config a stage-3 DeepSpeed config with clipping and accumulation
    means, written by hand."""
    wrapper: dict = dict(sharding_strategy="FULL_SHARD")
    if dtype is not None:
        wrapper["mixed_precision"] = dict(param_dtype=dtype, reduce_dtype="float32")
    return wrapper


def _strategy_runs(work_dir: str, ds_json: str) -> dict:
    """Each variant trained on this rank: rank-averaged losses, the whole weights."""
    import torch.distributed as dist

    from tests.test_fsdp import TinyTransformer, full_weights, train_lm

    variants = {
        "stage2": (DeepSpeedStrategy, dict(zero_optimization=dict(stage=2), **CLIP_AND_ACCUMULATE)),
        "stage3": (DeepSpeedStrategy, dict(zero_optimization=dict(stage=3), **CLIP_AND_ACCUMULATE)),
        "stage3_json": (DeepSpeedStrategy, dict(config=ds_json)),
        "stage3_bf16": (
            DeepSpeedStrategy,
            dict(zero_optimization=dict(stage=3), bf16=dict(enabled=True), **CLIP_AND_ACCUMULATE),
        ),
        "fsdp_bf16": (FSDPStrategy, dict(model_wrapper=_fsdp_equivalent("bfloat16"))),
    }
    out = {}
    for name, (cls, kwargs) in variants.items():
        strategy = cls(
            work_dir=f"{work_dir}/{name}", env_kwargs=dict(randomness=dict(seed=0)), **kwargs
        )
        optim = OPTIM
        if cls is FSDPStrategy:
            optim = dict(
                optimizer=OPTIM["optimizer"], clip_grad=dict(max_norm=0.3), accumulative_counts=2
            )
        model, wrapper = strategy.prepare(
            TinyTransformer(), optim_wrapper=optim, dispatch_kwargs=dict(max_iters=STEPS)
        )
        losses, norms = train_lm(
            strategy, model, wrapper, range(STEPS), strategy.rank, strategy.world_size
        )
        mean = torch.tensor(losses, dtype=torch.float64)
        dist.all_reduce(mean)
        out[name] = dict(
            losses=(mean / strategy.world_size).tolist(),
            norms=norms,
            weights=full_weights(model),
            wrapper=type(wrapper).__name__,
            param_dtype=str(model.blocks[0].qkv.weight.dtype),  # the sharded master copy
            compute_dtype=str(model(torch.zeros(1, 8, dtype=torch.long)).dtype),
        )
    return out


def _reference(work_dir: str) -> dict:
    """One process, the whole batch, float32, the same clipping and accumulation."""
    from shardwise.strategies import SingleDeviceStrategy
    from tests.test_fsdp import TinyTransformer, full_weights, train_lm

    strategy = SingleDeviceStrategy(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=0)))
    model, wrapper = strategy.prepare(
        TinyTransformer(),
        optim_wrapper=dict(
            optimizer=OPTIM["optimizer"], clip_grad=dict(max_norm=0.3), accumulative_counts=2
        ),
        dispatch_kwargs=dict(max_iters=STEPS),
    )
    losses, norms = train_lm(strategy, model, wrapper, range(STEPS))
    return dict(losses=losses, norms=norms, weights=full_weights(model))


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepspeed")
    ds_json = root / "ds_config.json"
    ds_json.write_text(
        json.dumps(
            dict(
                zero_optimization=dict(stage=3, overlap_comm=True, contiguous_gradients=True),
                gradient_clipping=0.3,
                gradient_accumulation_steps=2,
                train_micro_batch_size_per_gpu=4,
                train_batch_size=16,
                steps_per_print=100,
            )
        )
    )
    ranks = run_distributed(_strategy_runs, 2, str(root), str(ds_json), timeout=300)
    return ranks, _reference(str(root / "reference"))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["stage2", "stage3", "stage3_json"])
def test_a_deepspeed_config_on_two_ranks_trains_as_one_process(two_rank_runs, variant):
    from tests.test_fsdp import max_relative_error

    ranks, want = two_rank_runs
    for got in (ranks[0][variant], ranks[1][variant]):
        assert got["wrapper"] == "OptimWrapper"
        assert got["losses"] == pytest.approx(want["losses"], rel=1e-5)
        assert got["norms"][1::2] == pytest.approx(want["norms"][1::2], rel=1e-5)
        assert max(want["norms"][1::2]) > 0.3  # clipping acted
        assert max_relative_error(got["weights"], want["weights"]) < 1e-5


@pytest.mark.slow
def test_a_deepspeed_json_file_gives_the_same_run_as_its_keywords(two_rank_runs):
    ranks, _ = two_rank_runs
    for rank in ranks:
        assert rank["stage3_json"]["losses"] == rank["stage3"]["losses"]
        for key, tensor in rank["stage3"]["weights"].items():
            assert torch.equal(rank["stage3_json"]["weights"][key], tensor), key


@pytest.mark.slow
def test_bf16_trains_exactly_as_fsdp_mixed_precision_and_close_to_float32(two_rank_runs):
    ranks, want = two_rank_runs
    for rank in ranks:
        got, fsdp = rank["stage3_bf16"], rank["fsdp_bf16"]
        assert (got["compute_dtype"], got["param_dtype"]) == ("torch.bfloat16", "torch.float32")
        assert got["losses"] == fsdp["losses"]
        for key, tensor in fsdp["weights"].items():
            assert torch.equal(got["weights"][key], tensor), key
        # bf16 rounding: close to the float32 run, not equal to it
        assert got["losses"] == pytest.approx(want["losses"], abs=3e-2)
        assert got["losses"] != pytest.approx(want["losses"], rel=1e-5)


# ----------------------------------------------------------------------------- save and resume
def _runner_run(work_dir: str, strategy: dict, stop_at: int | None, resume: bool) -> dict:
    import tests.test_runner_support  # noqa: F401 - registers the model, data and hooks
    from shardwise.runner import Hook, Runner
    from tests.test_fsdp import full_weights

    class StartsAt(Hook):
        def before_train(self, runner) -> None:
            self.iter = runner.iter

    starts_at = StartsAt()

    runner = Runner(
        model=dict(type="DropoutRegressor"),
        work_dir=work_dir,
        strategy=strategy,
        train_dataloader=dict(dataset=dict(type="RegressionData", n=64), batch_size=4),
        optim_wrapper=dict(type="DeepSpeedOptimWrapper", optimizer=dict(type="AdamW", lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=8),
        default_hooks=dict(
            logger=dict(interval=1, progress_bar=False),
            checkpoint=dict(by_epoch=False, interval=2),
        ),
        custom_hooks=[starts_at]
        + ([dict(type="StopAfterHook", at_iter=stop_at)] if stop_at else []),
        randomness=dict(seed=0),
        resume=resume,
    )
    try:
        runner.train()
    except SystemExit:
        return {}
    losses = runner.message_hub.get_scalar("train/loss").data[0].tolist()
    return dict(weights=full_weights(runner.model), losses=losses, start=starts_at.iter)


def _whole_then_interrupted_and_resumed(root: str, strategy: dict) -> tuple[dict, dict]:
    whole = _runner_run(f"{root}/whole", strategy, None, False)
    _runner_run(f"{root}/parts", strategy, 5, False)  # checkpoints at 2 and 4, stops at 5
    resumed = _runner_run(f"{root}/parts", strategy, None, True)
    return whole, resumed


@pytest.mark.slow
def test_a_deepspeed_run_saves_and_resumes_bit_exactly(tmp_path):
    strategy = dict(
        type="DeepSpeedStrategy",
        zero_optimization=dict(stage=3),
        bf16=dict(enabled=True),
        gradient_clipping=0.5,
        gradient_accumulation_steps=2,
    )
    ranks = run_distributed(
        _whole_then_interrupted_and_resumed, 2, str(tmp_path), strategy, init_pg=True, timeout=300
    )
    assert (Path(tmp_path) / "parts" / "iter_4.pth").exists()
    for whole, resumed in ranks:
        assert (whole["start"], resumed["start"]) == (0, 4)  # from iter_4.pth
        assert resumed["losses"][-4:] == whole["losses"][-4:]  # iterations 5-8
        for key, tensor in whole["weights"].items():
            assert torch.equal(resumed["weights"][key], tensor), key


# ----------------------------------------------------------------------------- FlexibleRunner
@pytest.fixture
def mmengine_support():
    """tests/mmengine_support.py and the integration registered; the 'shardwise' logger,
    which the integration routes to mmengine's MMLogger, put back afterwards."""
    pytest.importorskip("mmengine")
    import importlib

    shardwise_logger = logging.getLogger("shardwise")
    saved = shardwise_logger.handlers[:], shardwise_logger.level, shardwise_logger.propagate
    importlib.import_module("shardwise.integrations.mmengine")
    yield importlib.import_module("tests.mmengine_support")
    for handler in shardwise_logger.handlers:
        if handler not in saved[0]:
            handler.close()
    shardwise_logger.handlers[:], shardwise_logger.level, shardwise_logger.propagate = saved


def test_flexible_runner_trains_with_the_deepspeed_vocabulary(mmengine_support, tmp_path):
    from mmengine._strategy import DeepSpeedStrategy as MMEngineDeepSpeedStrategy
    from mmengine.registry import STRATEGIES
    from mmengine.runner import FlexibleRunner

    from shardwise.integrations.mmengine import ShardwiseDeepSpeedStrategy

    # beside mmengine's own DeepSpeedStrategy (registered even without DeepSpeed installed)
    assert STRATEGIES.get("DeepSpeedStrategy") is MMEngineDeepSpeedStrategy
    assert STRATEGIES.get("ShardwiseDeepSpeedStrategy") is ShardwiseDeepSpeedStrategy
    runner = FlexibleRunner(
        model=dict(type="IntegrationRegressor"),
        work_dir=str(tmp_path),
        strategy=dict(
            type="ShardwiseDeepSpeedStrategy",
            zero_optimization=dict(stage=3),
            gradient_clipping=0.01,
            gradient_accumulation_steps=2,
        ),
        train_dataloader=dict(
            dataset=dict(type="IntegrationData"),
            sampler=dict(type="DefaultSampler", shuffle=False),
            collate_fn=dict(type="default_collate"),
            batch_size=4,
        ),
        optim_wrapper=dict(type="DeepSpeedOptimWrapper", optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=4),
        default_hooks=dict(checkpoint=None),
    )
    runner.train()
    wrapper = runner.strategy.optim_wrapper
    assert type(wrapper).__name__ == "OptimWrapper"
    assert (wrapper.clip_grad_kwargs, wrapper._accumulative_counts) == (dict(max_norm=0.01), 2)
    norms = runner.message_hub.get_scalar("train/grad_norm").data[0]
    assert len(norms) == 2 and all(norm > 0.01 for norm in norms)  # clipped, every 2 iters
