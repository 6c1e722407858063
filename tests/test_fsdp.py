"""FSDPStrategy: sharding, its configuration, optimizers and schedulers, parity with one device.

Multi-rank behaviour runs on real gloo process groups (``run_distributed``); configuration
and bad input are checked in this process (constructing an FSDPStrategy without a launcher
starts no process group).
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import (
    FullStateDictConfig,
    LocalStateDictConfig,
    StateDictType,
)
from torch.distributed.fsdp.fully_sharded_data_parallel import (
    FullOptimStateDictConfig,
    LocalOptimStateDictConfig,
)

from shardwise.optim import LinearLR, OptimWrapper
from shardwise.registry import FUNCTIONS, MODEL_WRAPPERS, MODELS
from shardwise.strategies import FSDPStrategy, SingleDeviceStrategy, select_modules_to_shard
from shardwise.strategies.fsdp_config import parse_wrap_policy
from tests.distributed import DistributedTestError, run_distributed


# ----------------------------------------------------------------------------- models
class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self, dim: int = 16, heads: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        # no qkv bias: the key bias has an exactly zero gradient (softmax ignores a shift), so
        # Adam would turn rounding noise into full-size steps and no two runs could agree
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


@MODELS.register_module()
class TinyTransformer(nn.Module):
    """A two-block GPT: token and position embeddings, blocks, final norm, LM head."""

    _no_split_modules = ["Block"]

    def __init__(self, vocab: int = 32, dim: int = 16, layers: int = 2, dropout: float = 0.0):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.empty(8, dim))
        self.blocks = nn.ModuleList(Block(dim, dropout=dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.init_weights()

    def init_weights(self) -> None:
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))


def lm_batch(step: int, batch: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    idx = torch.randint(0, 32, (batch, 9), generator=gen)
    return idx[:, :-1], idx[:, 1:]


def lm_loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(idx).flatten(0, 1), targets.flatten())


def train_lm(strategy, model, optim_wrapper, steps, rank=0, world_size=1):
    """Train on each step's batch, this rank taking its slice; returns losses and grad norms."""
    losses, norms = [], []
    for step in steps:
        idx, targets = lm_batch(step)
        per_rank = len(idx) // world_size
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        with optim_wrapper.optim_context(model):
            loss = lm_loss(model, idx[rows], targets[rows])
        optim_wrapper.update_params(loss)
        losses.append(loss.item())
        norms.append(optim_wrapper.last_grad_norm)
    return losses, norms


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every rank's view of the whole model (gathered)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def max_relative_error(got: dict, want: dict) -> float:
    assert got.keys() == want.keys()
    return max(((got[k] - want[k]).abs().max() / want[k].abs().max()).item() for k in want)


class ToyModel(nn.Module):
    """mmengine's ``ToyModel`` (mmengine.testing.runner_test_case)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(2, 2)
        self.linear2 = nn.Linear(2, 1)

    def forward(self, inputs, data_samples=None, mode="tensor"):
        outputs = self.linear2(self.linear1(inputs))
        if mode == "loss":
            return dict(loss=(data_samples - outputs).sum())
        return outputs


def linear_wrap_policy(module, recurse, nonwrapped_numel) -> bool:
    """mmengine's test policy (FSDP1 signature)."""
    if recurse:
        return True
    return isinstance(module, nn.Linear)


@FUNCTIONS.register_module()
def wrap_blocks_with_more_than(module, recurse, nonwrapped_numel, min_params=0):
    return recurse or (isinstance(module, Block) and nonwrapped_numel > min_params)


def _strategy(tmp_path, **kwargs):
    kwargs.setdefault("env_kwargs", dict(randomness=dict(seed=0)))
    return FSDPStrategy(work_dir=str(tmp_path), **kwargs)


# ----------------------------------------------------------------------------- configuration
def test_mmengine_test_init_cases(tmp_path):
    """mmengine's tests/test_strategies/test_fsdp.py::test_init, case by case."""

    def assert_local(strategy):
        assert strategy.state_dict_type == StateDictType.LOCAL_STATE_DICT
        assert isinstance(strategy.state_dict_config, LocalStateDictConfig)
        assert isinstance(strategy.optim_state_dict_config, LocalOptimStateDictConfig)

    def assert_full(strategy):
        assert strategy.state_dict_type == StateDictType.FULL_STATE_DICT
        assert isinstance(strategy.state_dict_config, FullStateDictConfig)
        assert isinstance(strategy.optim_state_dict_config, FullOptimStateDictConfig)

    assert _strategy(tmp_path).skip_init_weights is False
    assert _strategy(tmp_path).checkpoint_format == "sharded"
    assert_local(_strategy(tmp_path, state_dict_cfg="local"))
    assert_full(_strategy(tmp_path, state_dict_cfg="full"))
    assert_local(
        _strategy(tmp_path, state_dict_cfg=dict(state_dict_type=StateDictType.LOCAL_STATE_DICT))
    )
    for cfg in (
        dict(
            state_dict_type=StateDictType.FULL_STATE_DICT,
            state_dict_config=FullStateDictConfig(),
            optim_state_dict_config=FullOptimStateDictConfig(),
        ),
        dict(
            state_dict_type="FULL_STATE_DICT",
            state_dict_config=dict(type="FullStateDictConfig"),
            optim_state_dict_config=dict(type="FullOptimStateDictConfig"),
        ),
        dict(
            state_dict_type=StateDictType.FULL_STATE_DICT,
            state_dict_config=dict(type=FullStateDictConfig),
            optim_state_dict_config=dict(type=FullOptimStateDictConfig),
        ),
    ):
        assert_full(_strategy(tmp_path, state_dict_cfg=cfg))
    full = dict(type=FullOptimStateDictConfig)
    with pytest.raises(ValueError, match="'error-str' is not one of"):
        _strategy(tmp_path, state_dict_cfg="error-str")
    with pytest.raises(TypeError, match="state_dict_cfg must be a str"):
        _strategy(tmp_path, state_dict_cfg=[])
    with pytest.raises(TypeError, match="state_dict_type must be a str or torch's StateDictType"):
        _strategy(
            tmp_path,
            state_dict_cfg=dict(
                state_dict_type=[],
                state_dict_config=dict(type=FullStateDictConfig),
                optim_state_dict_config=full,
            ),
        )
    with pytest.raises(TypeError, match="state_dict_config must be a dict"):
        _strategy(
            tmp_path,
            state_dict_cfg=dict(
                state_dict_type=StateDictType.FULL_STATE_DICT,
                state_dict_config=[],
                optim_state_dict_config=full,
            ),
        )
    with pytest.raises(TypeError, match="optim_state_dict_config must be a dict"):
        _strategy(
            tmp_path,
            state_dict_cfg=dict(
                state_dict_type=StateDictType.FULL_STATE_DICT,
                state_dict_config=dict(type=FullStateDictConfig),
                optim_state_dict_config=[],
            ),
        )


def test_state_dict_config_must_fit_the_state_dict_type(tmp_path):
    with pytest.raises(ValueError, match="LocalStateDictConfig.*does not fit.*FullStateDictConfig"):
        _strategy(
            tmp_path,
            state_dict_cfg=dict(
                state_dict_type="FULL_STATE_DICT", state_dict_config=LocalStateDictConfig()
            ),
        )
    strategy = _strategy(
        tmp_path, state_dict_cfg=dict(state_dict_config=dict(type="FullStateDictConfig"))
    )
    assert strategy.checkpoint_format == "full"  # the type follows from the config object


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(skip_init_weights=1), TypeError, "skip_init_weights must be True or False, got int"),
        (dict(model_wrapper=[]), TypeError, "model_wrapper must be a dict"),
        (
            dict(model_wrapper=dict(sharding_strategy="FULL")),
            ValueError,
            "sharding_strategy='FULL' is not one of",
        ),
        (
            dict(model_wrapper=dict(auto_wrap_polcy={"Block"})),
            ValueError,
            r"unknown keys \['auto_wrap_polcy'\]",
        ),
        (
            dict(model_wrapper=dict(mixed_precision=dict(param_dtype="bf17"))),
            ValueError,
            "param_dtype='bf17' is not a dtype name",
        ),
        (
            dict(model_wrapper=dict(auto_wrap_policy=42)),
            TypeError,
            "auto_wrap_policy must be module classes or class names",
        ),
        (
            dict(model_wrapper=dict(replicate_size=2)),
            ValueError,
            "replicate_size=2 applies to HYBRID_SHARD only",
        ),
        (dict(model_wrapper=dict(type="NoSuchSharder")), KeyError, "NoSuchSharder"),
        (
            dict(activation_checkpointing=dict(use_reentrant=False)),
            ValueError,
            "needs check_fn",
        ),
        (
            dict(activation_checkpointing=[Block]),
            TypeError,
            "activation_checkpointing must be a dict",
        ),
        (
            dict(train_micro_batch_size_per_gpu=0),
            ValueError,
            "train_micro_batch_size_per_gpu must be a positive int",
        ),
    ],
)
def test_bad_configuration_is_refused_with_the_value_and_the_fix(tmp_path, kwargs, error, message):
    with pytest.raises(error, match=message):
        _strategy(tmp_path, **kwargs)


def test_model_wrapper_translates_the_fsdp1_vocabulary():
    from torch.distributed.fsdp import CPUOffloadPolicy, ShardingStrategy

    from shardwise.strategies import parse_model_wrapper

    cfg = parse_model_wrapper(
        dict(
            sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
            mixed_precision=dict(
                param_dtype="bf16", reduce_dtype=torch.float32, buffer_dtype="fp32"
            ),
            cpu_offload=dict(offload_params=True, pin_memory=False),
            use_orig_params=True,
            limit_all_gathers=True,
        )
    )
    assert cfg.reshard_after_forward is False and cfg.mesh_kind == "shard"
    assert cfg.mp_policy.param_dtype == torch.bfloat16
    assert cfg.mp_policy.reduce_dtype == torch.float32 and cfg.buffer_dtype == torch.float32
    assert isinstance(cfg.offload_policy, CPUOffloadPolicy) and not cfg.offload_policy.pin_memory
    assert cfg.ignored_fsdp1_keys == ("limit_all_gathers", "use_orig_params")
    assert parse_model_wrapper(dict(sharding_strategy="HYBRID_SHARD")).mesh_kind == "hybrid"
    no_shard = parse_model_wrapper(dict(sharding_strategy="NO_SHARD"))
    assert no_shard.mesh_kind == "replicate"
    assert parse_model_wrapper(dict(cpu_offload=False)).offload_policy.__class__.__name__ == (
        "OffloadPolicy"
    )


# ----------------------------------------------------------------------------- wrap policies
def _selected(model, policy):
    return [type(m).__name__ for m in select_modules_to_shard(model, parse_wrap_policy(policy))]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({Block}, ["Block", "Block"]),
        (["Block", "LayerNorm"], ["LayerNorm", "LayerNorm", "Block"] * 2 + ["LayerNorm"]),
        ("Embedding", ["Embedding"]),
        (linear_wrap_policy, ["Linear"] * 9),  # FSDP1 signature, as mmengine's configs use
        (lambda m: isinstance(m, Block), ["Block", "Block"]),  # a one-argument predicate
        (dict(type="wrap_blocks_with_more_than", min_params=100), ["Block", "Block"]),
        (dict(type="wrap_blocks_with_more_than", min_params=10**6), []),
        # every module with >= 1000 parameters not already claimed: fc and out (1.1k each),
        # then the rest of each block (1.2k); never the ModuleList, never the root
        (dict(min_num_params=1000), ["Linear", "Linear", "Block", "Linear", "Linear", "Block"]),
        (
            dict(
                type="torch.distributed.fsdp.wrap.size_based_auto_wrap_policy", min_num_params=3000
            ),
            ["Block", "Block"],
        ),
    ],
)
def test_auto_wrap_policy_forms_select_submodules(policy, expected):
    assert _selected(TinyTransformer(), policy) == expected


def test_auto_wrap_policy_sees_through_activation_checkpointing_wrappers():
    from shardwise.strategies import apply_activation_checkpointing

    model = apply_activation_checkpointing(TinyTransformer(), lambda m: isinstance(m, Block))
    selected = select_modules_to_shard(model, parse_wrap_policy({"Block"}))
    assert [type(m).__name__ for m in selected] == ["CheckpointWrapper"] * 2
    assert "blocks.0.qkv.weight" in model.state_dict()  # keys stay clean


@FUNCTIONS.register_module()
def checkpoint_blocks(module, min_params=0):
    return isinstance(module, Block) and sum(p.numel() for p in module.parameters()) > min_params


@pytest.mark.parametrize(
    "check_fn",
    [
        "checkpoint_blocks",  # a registered function
        dict(type="checkpoint_blocks", min_params=100),  # a config
        lambda m: isinstance(m, Block),  # a callable
        [Block],  # module classes
        ["Block"],  # class names
    ],
)
def test_activation_checkpointing_check_fn_forms_wrap_the_blocks(check_fn):
    from shardwise.strategies import apply_activation_checkpointing
    from shardwise.strategies.fsdp_config import parse_activation_checkpointing

    cfg = parse_activation_checkpointing(
        dict(check_fn=check_fn, checkpoint_impl="no_reentrant", preserve_rng_state=False)
    )
    model = TinyTransformer()
    keys = list(model.state_dict())
    apply_activation_checkpointing(model, cfg.check_fn, cfg.wrapper_kwargs)
    assert [type(b).__name__ for b in model.blocks] == ["CheckpointWrapper"] * 2
    assert list(model.state_dict()) == keys
    idx, targets = lm_batch(0)
    lm_loss(model, idx, targets).backward()  # recomputes the blocks in backward
    assert model.blocks[0]._checkpoint_wrapped_module.fc.weight.grad is not None


# ----------------------------------------------------------------------------- prepare errors
def test_a_prebuilt_optimizer_with_state_is_refused_before_anything_is_built(tmp_path):
    model = ToyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 2)).sum().backward()
    optimizer.step()
    strategy = _strategy(tmp_path)
    with pytest.raises(ValueError, match="already has state for 4 parameter.*before its first"):
        strategy.prepare(model, optim_wrapper=OptimWrapper(optimizer))
    assert not hasattr(strategy, "model")


def test_a_prebuilt_optimizer_over_another_model_is_refused(tmp_path):
    optimizer = torch.optim.SGD(ToyModel().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not parameters of the model passed to prepare"):
        _strategy(tmp_path).prepare(ToyModel(), optim_wrapper=optimizer)


def _hybrid_with_a_bad_replicate_size(work_dir):
    FSDPStrategy(
        work_dir=work_dir,
        model_wrapper=dict(sharding_strategy="HYBRID_SHARD", replicate_size=3),
    )


def test_hybrid_shard_with_a_replicate_size_not_dividing_the_world_fails_on_every_rank(tmp_path):
    with pytest.raises(DistributedTestError) as info:
        run_distributed(_hybrid_with_a_bad_replicate_size, 2, str(tmp_path))
    message = str(info.value)
    assert "rank 0 failed" in message and "rank 1 failed" in message
    assert message.count("replicate_size=3 needs a world size divisible by it, but 2 ranks") == 2


# ----------------------------------------------------------------------------- sharding
@MODEL_WRAPPERS.register_module()
def shard_blocks_only(module, *, mesh, reshard=True):
    """A custom sharder: fully_shard every block and the root by hand."""
    from torch.distributed.fsdp import fully_shard

    for block in module.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(module, mesh=mesh)
    module.sharded_by = "shard_blocks_only"
    return module


def _sharding_options(work_dir):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from torch.distributed.tensor import DTensor

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("shardwise").addHandler(handler)
    out = {}
    strategy = FSDPStrategy(
        work_dir=work_dir,
        model_wrapper=dict(
            type="MMFullyShardedDataParallel",
            auto_wrap_policy={"Block", "Conv2d"},
            use_orig_params=True,
            limit_all_gathers=True,
            mixed_precision=dict(param_dtype="bf16", reduce_dtype="fp32"),
            cpu_offload=True,
        ),
        auto_scale_lr=dict(enable=True, base_batch_size=16),
        train_micro_batch_size_per_gpu=4,
    )
    model, wrapper = strategy.prepare(
        TinyTransformer(),
        optim_wrapper=dict(type="AmpOptimWrapper", optimizer=dict(type="SGD", lr=0.1)),
    )
    out["sharded"] = [isinstance(m, FSDPModule) for m in (model, *model.blocks, model.head)]
    idx, targets = lm_batch(0, 4)
    with wrapper.optim_context(model):
        out["dtype"] = model(idx).dtype
    out["lr"] = wrapper.get_lr()["lr"]  # 0.1 * (2 ranks * 4) / 16
    out["amp_dtype"] = wrapper.cast_dtype
    out["logs"] = [r.getMessage() for r in records]

    # SHARD_GRAD_OP keeps parameters gathered between forward and backward; NO_SHARD does
    # not shard at all (a (world, 1) mesh); a pre-built AmpOptimWrapper gets the sharded scaler
    for sharding in ("SHARD_GRAD_OP", "NO_SHARD"):
        strategy = FSDPStrategy(work_dir=work_dir, model_wrapper=dict(sharding_strategy=sharding))
        model = TinyTransformer()
        from shardwise.optim import AmpOptimWrapper

        prebuilt = AmpOptimWrapper(
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dtype="float16"
        )
        model, wrapper = strategy.prepare(model, optim_wrapper=prebuilt)
        weight = model.blocks[0].qkv.weight
        out[sharding] = (
            isinstance(model.blocks[0], FSDPModule),
            tuple(strategy.mesh.shape),
            tuple(weight.to_local().shape),
            isinstance(wrapper.loss_scaler, ShardedGradScaler),
            isinstance(wrapper.optimizer.param_groups[0]["params"][0], DTensor),
        )
        train_lm(strategy, model, wrapper, range(2), strategy.rank, strategy.world_size)

    # a custom sharder registered in MODEL_WRAPPERS replaces the default one
    strategy = FSDPStrategy(
        work_dir=work_dir, model_wrapper=dict(type="shard_blocks_only", reshard=False)
    )
    model = strategy.prepare(TinyTransformer())
    out["custom"] = (model.sharded_by, isinstance(model.blocks[1], FSDPModule))
    return out


def test_model_wrapper_options_shard_the_model_as_configured(tmp_path):
    out = run_distributed(_sharding_options, 2, str(tmp_path))[0]
    # root and both blocks (named by class) are sharded; the head belongs to the root's group
    assert out["sharded"] == [True, True, True, False]
    assert out["dtype"] == torch.bfloat16  # mixed_precision param_dtype
    assert out["lr"] == [pytest.approx(0.1 * 2 * 4 / 16)]
    assert out["amp_dtype"] == torch.bfloat16
    logs = "\n".join(out["logs"])
    assert "auto_wrap_policy names ['Conv2d'], which match no module of TinyTransformer" in logs
    assert "its module classes are ['Block', 'Dropout', 'Embedding'" in logs
    assert logs.count("['limit_all_gathers', 'use_orig_params'] are FSDP1 options") == 1
    assert "cpu_offload has nothing to do on a CPU mesh" in logs
    # SHARD_GRAD_OP: 1-D mesh, half of qkv's 48 rows per rank; NO_SHARD: every rank all 48
    assert out["SHARD_GRAD_OP"] == (True, (2,), (24, 16), True, True)  # _no_split_modules
    assert out["NO_SHARD"] == (True, (2, 1), (48, 16), True, True)
    assert out["custom"] == ("shard_blocks_only", True)


# ----------------------------------------------------------------------------- parity
VARIANTS = {
    "full_shard": dict(model_wrapper=dict(auto_wrap_policy={Block})),
    "accumulate_and_clip": dict(model_wrapper=dict(auto_wrap_policy={Block})),
    "shard_grad_op": dict(model_wrapper=dict(sharding_strategy="SHARD_GRAD_OP")),
    "no_shard": dict(model_wrapper=dict(sharding_strategy="NO_SHARD")),
    "activation_checkpointing": dict(
        activation_checkpointing=dict(check_fn=["Block"], preserve_rng_state=False)
    ),
    "hybrid_shard": dict(model_wrapper=dict(sharding_strategy="HYBRID_SHARD", replicate_size=2)),
}
OPTIM = dict(optimizer=dict(type="AdamW", lr=1e-2, weight_decay=0.01))
ACCUMULATE_AND_CLIP = dict(accumulative_counts=2, clip_grad=dict(max_norm=0.3))


def _optim_cfg(variant):
    return {**OPTIM, **ACCUMULATE_AND_CLIP} if variant == "accumulate_and_clip" else OPTIM


def _train_variants(work_dir, variants, steps=10):
    results = {}
    for variant in variants:
        strategy = FSDPStrategy(
            work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=0)), **VARIANTS[variant]
        )
        model, wrapper = strategy.prepare(
            TinyTransformer(),
            optim_wrapper=_optim_cfg(variant),
            dispatch_kwargs=dict(max_iters=steps),
        )
        losses, norms = train_lm(
            strategy, model, wrapper, range(steps), strategy.rank, strategy.world_size
        )
        results[variant] = (full_weights(model), norms, sorted(model.state_dict()))
    return results


def _reference(tmp_path, variant, steps=10):
    strategy = SingleDeviceStrategy(
        work_dir=str(tmp_path), env_kwargs=dict(randomness=dict(seed=0))
    )
    model, wrapper = strategy.prepare(
        TinyTransformer(), optim_wrapper=_optim_cfg(variant), dispatch_kwargs=dict(max_iters=steps)
    )
    _, norms = train_lm(strategy, model, wrapper, range(steps))
    return full_weights(model), norms, sorted(model.state_dict())


def test_two_ranks_match_one_device_on_the_full_batch(tmp_path):
    variants = [
        "full_shard",
        "accumulate_and_clip",
        "shard_grad_op",
        "no_shard",
        "activation_checkpointing",
    ]
    results = run_distributed(_train_variants, 2, str(tmp_path), variants, timeout=180)
    for variant in variants:
        want, want_norms, want_keys = _reference(tmp_path, variant)
        for weights, norms, keys in (results[0][variant], results[1][variant]):
            assert keys == want_keys, variant  # no wrapper prefixes in state-dict keys
            error = max_relative_error(weights, want)
            assert error < 1e-5, (variant, error)
            if variant == "accumulate_and_clip":  # the global norm, on every update
                assert norms[0] is None and None not in norms[1:]
                assert norms[1:] == pytest.approx(want_norms[1:], rel=1e-5)
                assert max(want_norms[1:]) > 0.3  # above max_norm: clipping acted


@pytest.mark.slow
def test_hybrid_shard_on_four_ranks_matches_one_device(tmp_path):
    results = run_distributed(_train_variants, 4, str(tmp_path), ["hybrid_shard"], timeout=300)
    want, _, _ = _reference(tmp_path, "hybrid_shard")
    for result in results:
        assert max_relative_error(result["hybrid_shard"][0], want) < 1e-5


# ----------------------------------------------------------------------------- meta init
def _meta_init(work_dir):
    from torch.distributed.tensor import DTensor

    strategy = FSDPStrategy(
        work_dir=work_dir,
        skip_init_weights=True,
        env_kwargs=dict(randomness=dict(seed=5)),
    )
    model = strategy.prepare(dict(type="TinyTransformer", layers=2))
    weight = model.blocks[0].fc.weight
    out = dict(
        local=weight.to_local().clone(),
        is_dtensor=isinstance(weight, DTensor),
        finite=all(torch.isfinite(p.to_local()).all() for p in model.parameters()),
        ln_ones=bool((model.ln_f.weight.to_local() == 1).all()),
    )
    with strategy.init_module():
        inner = TinyTransformer()
    out["context_builds_on_meta"] = inner.head.weight.is_meta
    return out


def test_skip_init_weights_builds_on_meta_and_initialises_each_shard(tmp_path):
    rank0, rank1 = run_distributed(_meta_init, 2, str(tmp_path))
    assert rank0["is_dtensor"] and rank0["finite"] and rank0["ln_ones"]
    assert rank0["context_builds_on_meta"]
    # shard-local random init: the two halves of a weight are different draws
    assert rank0["local"].shape == rank1["local"].shape == (32, 16)
    assert not torch.equal(rank0["local"], rank1["local"])


def _without_a_launcher(work_dir):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(key)
    strategy = FSDPStrategy(work_dir=work_dir)
    model, wrapper = strategy.prepare(
        ToyModel(), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1))
    )
    loss = model(torch.ones(2, 2), torch.zeros(2, 1), mode="loss")["loss"]
    wrapper.update_params(loss)
    return strategy.launcher, strategy.world_size, tuple(strategy.mesh.shape)


def test_without_a_launcher_it_trains_on_one_rank(tmp_path):
    assert run_distributed(_without_a_launcher, 1, str(tmp_path)) == [("none", 1, (1,))]


# ----------------------------------------------------------------------------- schedulers
def _prebuilt_optimizer_and_scheduler(work_dir):
    model = ToyModel()
    groups = [dict(params=[p], lr=0.1 * (i + 1)) for i, p in enumerate(model.parameters())]
    optimizer = torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True)
    scheduler = LinearLR(optimizer, start_factor=0.5, by_epoch=False, end=2)
    strategy = FSDPStrategy(
        work_dir=work_dir, model_wrapper=dict(auto_wrap_policy=linear_wrap_policy)
    )
    model, wrapper, schedulers = strategy.prepare(
        model, optim_wrapper=optimizer, param_scheduler=scheduler
    )
    rebuilt = wrapper.optimizer
    lrs = [[g["lr"] for g in rebuilt.param_groups]]
    loss = model(torch.ones(2, 2), torch.zeros(2, 1), mode="loss")["loss"]
    wrapper.update_params(loss)
    schedulers[0].step()
    lrs.append([g["lr"] for g in rebuilt.param_groups])
    return dict(
        new_optimizer=rebuilt is not optimizer,
        kept_scheduler=schedulers[0] is scheduler and scheduler.optimizer is rebuilt,
        hyper=[(g["momentum"], g["nesterov"], g["initial_lr"]) for g in rebuilt.param_groups],
        lrs=lrs,
        state=sorted(len(s) for s in rebuilt.state.values()),
    )


def test_prebuilt_optimizer_and_scheduler_are_rebuilt_over_the_shards_and_kept(tmp_path):
    out = run_distributed(_prebuilt_optimizer_and_scheduler, 2, str(tmp_path))[0]
    assert out["new_optimizer"] and out["kept_scheduler"]
    assert out["hyper"] == [(0.9, True, pytest.approx(0.1 * (i + 1))) for i in range(4)]
    # the warm-up halved each group's LR at construction and restores it on its first step
    assert out["lrs"][0] == [pytest.approx(0.05 * (i + 1)) for i in range(4)]
    assert out["lrs"][1] == [pytest.approx(0.1 * (i + 1)) for i in range(4)]
    assert out["state"] == [1, 1, 1, 1]  # momentum buffers live on the rebuilt optimizer


def test_wrap_policy_and_activation_checkpointing_select_modules_the_same_ways():
    from shardwise.registry import FUNCTIONS
    from shardwise.strategies.fsdp_config import (
        parse_activation_checkpointing,
        parse_module_selector,
        parse_wrap_policy,
    )

    @FUNCTIONS.register_module(name="selects_blocks_for_test", force=True)
    def selects_blocks(module, kind=Block):
        return isinstance(module, kind)

    block, head = Block(16), nn.Linear(2, 2)
    for value in (
        "Block",
        Block,
        {"Block"},
        [Block],
        "selects_blocks_for_test",
        dict(type="selects_blocks_for_test", kind=Block),
        selects_blocks,
    ):
        selector = parse_module_selector(value, "test")
        check_fn = parse_activation_checkpointing(dict(check_fn=value)).check_fn
        policy = parse_wrap_policy(value)
        for module, expected in ((block, True), (head, False)):
            assert bool(selector(module)) is expected, value
            assert bool(check_fn(module)) is expected, value
            assert policy(module, False, 0) is expected, value


def test_the_root_keeps_its_parameters_gathered_from_forward_to_backward(tmp_path):
    """As torch's default and FSDP1's FULL_SHARD: resharding the root after forward would
    all-gather its parameters (embeddings, head, final norm) again when backward starts."""
    strategy = FSDPStrategy(work_dir=str(tmp_path), model_wrapper=dict(auto_wrap_policy={Block}))
    model = strategy.prepare(TinyTransformer())
    lm_loss(model, *lm_batch(0))  # forward only
    root = model._get_fsdp_state()._fsdp_param_group
    block = model.blocks[0]._get_fsdp_state()._fsdp_param_group
    assert not root.is_sharded  # still gathered for backward
    assert block.is_sharded  # FULL_SHARD: the blocks are resharded after their forward


def test_fsdp_compiles_before_sharding_and_trains(tmp_path):
    """torchtitan's order: the compiled forward is the model's before fully_shard wraps it."""
    from torch.distributed.fsdp import FSDPModule

    strategy = FSDPStrategy(work_dir=str(tmp_path), model_wrapper=dict(auto_wrap_policy={Block}))
    model, wrapper = strategy.prepare(
        TinyTransformer(), optim_wrapper=OPTIM, compile=dict(backend="eager")
    )
    assert isinstance(model, FSDPModule) and "forward" in vars(model)  # compiled, then sharded
    losses, _ = train_lm(strategy, model, wrapper, range(3))
    assert all(torch.isfinite(torch.tensor(losses)))
