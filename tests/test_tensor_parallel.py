"""Tensor parallelism composed with FSDP/HSDP on one DeviceMesh (FSDPStrategy's ``parallelism``
and ``tp_plan``): parity with one device, plans from the model, a config or a function,
clipping over a 2-D mesh, meta-device init, and bad input refused on every rank first.

Parity runs real gloo groups of 2 and 4 CPU ranks against a single-process run of the same
global batch; it would catch FSDP2 on gloo summing instead of averaging gradients (pytorch
issue 162338) whatever the torch version does, because the reference averages.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from shardwise.registry import MODELS
from shardwise.strategies import (
    DDPStrategy,
    FSDPStrategy,
    SingleDeviceStrategy,
    parse_tp_plan,
    resolve_degrees,
    resolve_styles,
)
from tests.distributed import run_distributed
from tests.test_fsdp import TinyTransformer


# ----------------------------------------------------------------------------- the model
class TPBlock(nn.Module):
    """Pre-norm block with separate q/k/v projections that reshape by ``-1`` heads, so that a
    rank holding ``heads / tp`` of them runs the same code."""

    def __init__(self, dim: int = 16, n_head: int = 4) -> None:
        super().__init__()
        self.n_head, self.head_dim = n_head, dim // n_head
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        # no key bias: its gradient is exactly zero and Adam would amplify rounding noise
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.qkv = (self.q, self.k, self.v)
        self.proj = nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.ln1(x)
        q, k, v = (m(h).view(b, t, -1, self.head_dim).transpose(1, 2) for m in self.qkv)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, -1))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


@MODELS.register_module()
class TPTransformer(TinyTransformer):
    """test_fsdp's two-block GPT with :class:`TPBlock` blocks, whose class carries its
    tensor-parallel plan (``tp_plan='auto'``)."""

    _no_split_modules = ["TPBlock"]
    _tp_plan = {
        "tok": "embedding_rowwise",
        "blocks.*.q": "colwise",
        "blocks.*.k": "colwise",
        "blocks.*.v": "colwise",
        "blocks.*.proj": "rowwise",
        "blocks.*.fc": "colwise",
        "blocks.*.out": "rowwise",
        "head": dict(type="colwise", output_layouts="replicate"),
    }

    def __init__(self, vocab: int = 32, dim: int = 16, layers: int = 2, n_head: int = 4):
        super().__init__(vocab, dim, layers)
        self.blocks = nn.ModuleList(TPBlock(dim, n_head) for _ in range(layers))
        self.init_weights()


PLAN = dict(TPTransformer._tp_plan)


def in_float64(fn):
    """Run ``fn`` with float64 as the default dtype (the parity runs' precision)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_default_dtype(previous)

    return run


def lm_batch(step: int, batch: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    idx = torch.randint(0, 32, (batch, 9), generator=gen)
    return idx[:, :-1], idx[:, 1:]


def run_steps(strategy, model, wrapper, steps: int, start: int = 0, losses=None) -> list:
    """Train on each step's global batch, this rank taking its data-parallel share (tensor-
    parallel peers take the same); returns the gradient norm of every step (and appends the
    losses to ``losses``)."""
    norms = []
    for step in range(start, start + steps):
        idx, targets = lm_batch(step)
        share = len(idx) // strategy.data_parallel_size
        rows = slice(strategy.data_parallel_rank * share, (strategy.data_parallel_rank + 1) * share)
        with wrapper.optim_context(model):
            loss = F.cross_entropy(model(idx[rows]).flatten(0, 1), targets[rows].flatten())
        wrapper.update_params(loss)
        norms.append(wrapper.last_grad_norm)
        if losses is not None:
            losses.append(loss.detach())
    return norms


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def max_relative_error(got: dict, want: dict) -> float:
    assert got.keys() == want.keys()
    return max(((got[k] - want[k]).abs().max() / want[k].abs().max()).item() for k in want)


# The parity runs are in float64: a split matmul rounds differently from a whole one, and Adam's
# normalised step turns float32 rounding near zero gradients into visible differences. The
# gradient norms are compared too (a sum instead of an average of gradients, which Adam alone
# would hide, shows there).
OPTIM = dict(
    optimizer=dict(type="AdamW", lr=1e-2, weight_decay=0.01),
    accumulative_counts=2,
    clip_grad=dict(max_norm=0.3),
)
STEPS = 8
TOLERANCE = 1e-9


@in_float64
def _train_tp(work_dir, strategy_kwargs, steps=STEPS):
    strategy = FSDPStrategy(
        work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=0)), **strategy_kwargs
    )
    model, wrapper = strategy.prepare(
        TPTransformer(), optim_wrapper=OPTIM, dispatch_kwargs=dict(max_iters=steps)
    )
    norms = run_steps(strategy, model, wrapper, steps)
    meshes = sorted({str(p.device_mesh.mesh_dim_names) for p in model.parameters()})
    shape = dict(zip(strategy.mesh.mesh_dim_names, strategy.mesh.shape, strict=True))
    return full_weights(model), norms, meshes, shape


@in_float64
def _reference(tmp_path, steps=STEPS):
    strategy = SingleDeviceStrategy(
        work_dir=str(tmp_path), env_kwargs=dict(randomness=dict(seed=0))
    )
    model, wrapper = strategy.prepare(
        TPTransformer(), optim_wrapper=OPTIM, dispatch_kwargs=dict(max_iters=steps)
    )
    norms = run_steps(strategy, model, wrapper, steps)
    return full_weights(model), norms


def _check_parity(results, tmp_path, mesh):
    want, want_norms = _reference(tmp_path)
    assert max(want_norms[1::2]) > 0.3  # above max_norm: clipping acted
    for weights, norms, _, shape in results:
        assert shape == mesh
        assert max_relative_error(weights, want) < TOLERANCE
        assert norms[1::2] == pytest.approx(want_norms[1::2], rel=TOLERANCE)  # global norms
    return results[0][2]


def test_tp2_on_two_ranks_matches_one_device(tmp_path):
    results = run_distributed(
        _train_tp, 2, str(tmp_path), dict(parallelism=dict(tp=2), tp_plan=PLAN), timeout=240
    )
    meshes = _check_parity(results, tmp_path, {"dp_shard": 1, "tp": 2})
    # blocks on dp_shard × tp, the unsplit norms on dp_shard alone: clipping spans both
    assert meshes == ["('dp_shard', 'tp')", "('dp_shard',)"]


@pytest.mark.slow
def test_dp_shard_and_dp_replicate_with_tp2_on_four_ranks_match_one_device(tmp_path):
    for parallelism, mesh in (
        (dict(dp_shard=2, tp=2), {"dp_shard": 2, "tp": 2}),
        (dict(dp_replicate=2, tp=2), {"dp_replicate": 2, "dp_shard": 1, "tp": 2}),
    ):
        results = run_distributed(
            _train_tp, 4, str(tmp_path), dict(parallelism=parallelism, tp_plan=PLAN), timeout=300
        )
        _check_parity(results, tmp_path, mesh)


# ----------------------------------------------------------------------------- plan forms
def split_by_hand(model, mesh):
    """A ``parallelize_fn`` as in Lightning: tensor parallelism applied by the user."""
    for block in model.blocks:
        parallelize_module(
            block,
            mesh["tp"],
            {
                "q": ColwiseParallel(),
                "k": ColwiseParallel(),
                "v": ColwiseParallel(),
                "proj": RowwiseParallel(),
                "fc": ColwiseParallel(),
                "out": RowwiseParallel(),
            },
        )
    return model


@in_float64
def _plan_forms(work_dir):
    out = {}
    for name, kwargs in {
        "callable": dict(tp_plan=split_by_hand),
        "auto_on_meta": dict(tp_plan="auto", skip_init_weights=True),
    }.items():
        strategy = FSDPStrategy(
            work_dir=work_dir,
            env_kwargs=dict(randomness=dict(seed=0)),
            parallelism=dict(tp=2),
            **kwargs,
        )
        model, wrapper = strategy.prepare(
            dict(type="TPTransformer"), optim_wrapper=OPTIM, dispatch_kwargs=dict(max_iters=4)
        )
        q = model.blocks[0].q.weight
        local_rows = q.to_local().shape[0]
        norms = run_steps(strategy, model, wrapper, 4)
        out[name] = (full_weights(model), local_rows, norms)
    return out


def test_plan_from_a_function_and_the_models_own_plan_on_the_meta_device(tmp_path):
    results = run_distributed(_plan_forms, 2, str(tmp_path), timeout=240)
    want, want_norms = _reference(tmp_path, steps=4)
    for rank_result in results:
        weights, local_rows, norms = rank_result["callable"]
        assert local_rows == 8  # 16 output rows of q, half on each tensor-parallel rank
        assert max_relative_error(weights, want) < TOLERANCE
        assert norms[1::2] == pytest.approx(want_norms[1::2], rel=TOLERANCE)
        assert rank_result["auto_on_meta"][1] == 8
    # built on the meta device and initialised shard by shard: every rank holds the same
    # model (replicated parameters agree), and it trained (the norms are finite and nonzero)
    meta0, meta1 = results[0]["auto_on_meta"][0], results[1]["auto_on_meta"][0]
    assert all(torch.equal(meta0[k], meta1[k]) for k in meta0)
    assert all(n > 0 for n in results[0]["auto_on_meta"][2][1::2])
    assert meta0["blocks.0.ln1.weight"].std() > 0 or meta0["blocks.0.q.weight"].std() > 0


# ----------------------------------------------------------------------------- bad input
def test_degrees_whose_product_is_not_the_world_are_refused():
    with pytest.raises(ValueError, match=r"needs dp_replicate × dp_shard × tp = 4 ranks, but 2"):
        resolve_degrees(
            dict(dp_shard=2, tp=2),
            mesh_kind="shard",
            replicate_size=None,
            world_size=2,
            local_size=2,
        )
    with pytest.raises(ValueError, match="divisible by 3, but 4"):
        resolve_degrees(
            dict(tp=3), mesh_kind="shard", replicate_size=None, world_size=4, local_size=4
        )
    with pytest.raises(ValueError, match="at most one degree can be -1"):
        resolve_degrees(
            dict(dp_shard=-1, tp=-1),
            mesh_kind="shard",
            replicate_size=None,
            world_size=4,
            local_size=4,
        )
    with pytest.raises(ValueError, match="give them in one place"):
        resolve_degrees(
            dict(dp_shard=2), mesh_kind="hybrid", replicate_size=2, world_size=4, local_size=4
        )
    with pytest.raises(ValueError, match=r"unknown keys \['cp'\]"):
        resolve_degrees(
            dict(cp=2), mesh_kind="shard", replicate_size=None, world_size=4, local_size=4
        )
    degrees = resolve_degrees(
        dict(tp=2), mesh_kind="hybrid", replicate_size=2, world_size=8, local_size=8
    )  # HYBRID_SHARD keeps its meaning
    assert (degrees.dp_replicate, degrees.dp_shard, degrees.tp) == (2, 2, 2)
    assert degrees.dim_names == ("dp_replicate", "dp_shard", "tp")
    assert [degrees.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_plan_that_does_not_fit_the_model_is_refused_naming_the_fix():
    model = TPTransformer()
    with pytest.raises(ValueError, match=r"'colwize' is not a tensor-parallel style.*'colwise'"):
        parse_tp_plan({"blocks.*.q": "colwize"})
    with pytest.raises(ValueError, match=r"matches no module.*blocks\.\*\.q"):
        resolve_styles(model, parse_tp_plan({"blocks.*.query": "colwise"}), 2)
    with pytest.raises(ValueError, match=r"tp=3 does not divide tok\.num_embeddings=32"):
        resolve_styles(model, parse_tp_plan(PLAN), 3)
    wide = TPTransformer(dim=24, n_head=4)  # 24 columns split in 3, but 4 heads do not
    with pytest.raises(ValueError, match=r"tp=3 does not divide blocks\.0\.n_head=4"):
        resolve_styles(wide, parse_tp_plan({"blocks.*.q": "colwise"}), 3)
    with pytest.raises(ValueError, match="tp_plan='auto' needs a model that carries"):
        resolve_styles(nn.Sequential(nn.Linear(4, 4)), parse_tp_plan("auto"), 2)
    with pytest.raises(ValueError, match="layout 'sideways'"):
        parse_tp_plan({"head": dict(type="colwise", output_layouts="sideways")})
    with pytest.raises(TypeError, match="tp_plan must be 'auto'"):
        parse_tp_plan(42)


def test_tensor_parallelism_needs_fsdp_strategy_and_a_plan(tmp_path):
    for strategy in (DDPStrategy, SingleDeviceStrategy):
        with pytest.raises(ValueError, match="needs FSDPStrategy"):
            strategy(work_dir=str(tmp_path), parallelism=dict(tp=2))
        with pytest.raises(ValueError, match="needs FSDPStrategy"):
            strategy.check_config(dict(type=strategy.__name__, tp_plan="auto"), world_size=2)
    with pytest.raises(ValueError, match="no tp_plan says how to split the model"):
        FSDPStrategy.check_config(dict(type="FSDPStrategy", parallelism=dict(tp=2)), world_size=2)
    with pytest.raises(ValueError, match="needs a world size divisible by 2, but 1"):
        FSDPStrategy(work_dir=str(tmp_path), parallelism=dict(tp=2), tp_plan=PLAN)


def _prepare_with(work_dir, tp_plan):
    strategy = FSDPStrategy(work_dir=work_dir, parallelism=dict(tp=2), tp_plan=tp_plan)
    try:
        strategy.prepare(TPTransformer())
    except ValueError as exc:
        return str(exc)
    return None


def test_a_bad_plan_fails_on_every_rank_before_any_collective(tmp_path):
    # every rank refuses before building the mesh: nothing waits for a peer that failed
    errors = run_distributed(
        _prepare_with, 2, str(tmp_path), {"blocks.*.qq": "colwise"}, timeout=60
    )
    assert all(e is not None and "'blocks.*.qq' matches no module" in e for e in errors)


# ----------------------------------------------------------------------------- checkpoints
ADAMW = dict(optimizer=dict(type="AdamW", lr=1e-2, weight_decay=0.01))
SAVED_AT, MORE = 3, 2


def _global_losses(strategy, losses):
    """The loss of each step over the global batch (data-parallel shares averaged)."""
    import torch.distributed as dist

    stacked = torch.stack(losses)
    if dist.is_initialized() and strategy.world_size > 1:
        dist.all_reduce(stacked)
        stacked /= strategy.world_size  # tensor-parallel peers hold the same share's loss
    return stacked.tolist()


@in_float64
def _train_save_continue(work_dir):
    """dp_shard=2 × tp=2: train, save sharded, train on; then the same layout resumes the
    sharded checkpoint and saves it in the full format."""
    seeded = dict(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=0)))
    layout = dict(parallelism=dict(dp_shard=2, tp=2), tp_plan=PLAN)
    strategy = FSDPStrategy(**seeded, **layout)
    model, wrapper = strategy.prepare(TPTransformer(), optim_wrapper=ADAMW)
    run_steps(strategy, model, wrapper, SAVED_AT)
    strategy.save_checkpoint(f"{work_dir}/sharded")
    losses: list = []
    run_steps(strategy, model, wrapper, MORE, start=SAVED_AT, losses=losses)
    again = FSDPStrategy(**seeded, **layout, state_dict_cfg="full")
    again.prepare(TPTransformer(), optim_wrapper=ADAMW)
    again.resume(f"{work_dir}/sharded")
    again.save_checkpoint(f"{work_dir}/full.pth")
    return _global_losses(strategy, losses), full_weights(model)


@in_float64
def _resume_and_continue(work_dir, strategy_cls, kwargs):
    strategy = strategy_cls(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=0)), **kwargs)
    model, wrapper = strategy.prepare(TPTransformer(), optim_wrapper=ADAMW)
    strategy.resume(f"{work_dir}/sharded")
    losses: list = []
    run_steps(strategy, model, wrapper, MORE, start=SAVED_AT, losses=losses)
    weights = (
        full_weights(model)
        if strategy_cls is FSDPStrategy
        else {
            k: v.detach().clone() for k, v in getattr(model, "module", model).state_dict().items()
        }
    )
    return _global_losses(strategy, losses), weights


@pytest.mark.slow
def test_a_tp_checkpoint_resumes_on_other_tp_degrees_world_sizes_and_strategies(tmp_path):
    from shardwise.checkpoint.convert import convert_checkpoint
    from shardwise.checkpoint.formats import read_checkpoint

    work_dir = str(tmp_path)
    saved = run_distributed(_train_save_continue, 4, work_dir, timeout=300)
    want_losses, want_weights = saved[0]
    runs = {
        "dp_shard=4, tp=1 on 4 ranks": (4, FSDPStrategy, dict(parallelism=dict(dp_shard=4))),
        "tp=2 on 2 ranks": (2, FSDPStrategy, dict(parallelism=dict(tp=2), tp_plan=PLAN)),
        "DDP on 2 ranks": (2, DDPStrategy, {}),
    }
    for name, (world_size, cls, kwargs) in runs.items():
        results = run_distributed(
            _resume_and_continue, world_size, work_dir, cls, kwargs, timeout=300
        )
        for losses, weights in results:
            assert losses == pytest.approx(want_losses, rel=TOLERANCE), name
            assert max_relative_error(weights, want_weights) < TOLERANCE, name
    losses, weights = _resume_and_continue(work_dir, SingleDeviceStrategy, {})  # one process
    assert losses == pytest.approx(want_losses, rel=TOLERANCE)
    assert max_relative_error(weights, want_weights) < TOLERANCE
    # the full save and a safetensors export hold whole tensors, gathered from the TP shards
    full = read_checkpoint(f"{work_dir}/full.pth")["state_dict"]
    sharded = read_checkpoint(f"{work_dir}/sharded")["state_dict"]
    assert full["blocks.0.q.weight"].shape == (16, 16)
    assert all(torch.equal(full[k], sharded[k]) for k in sharded)
    from safetensors.torch import load_file

    exported = load_file(
        convert_checkpoint(f"{work_dir}/sharded", f"{work_dir}/w.safetensors", to="safetensors")
    )
    assert exported.keys() == sharded.keys()
    assert all(torch.equal(exported[k], sharded[k]) for k in sharded)


# ----------------------------------------------------------------------------- precision
def _precisions(work_dir):
    clipped = dict(optimizer=dict(type="AdamW", lr=1e-3), clip_grad=dict(max_norm=1.0))
    out = {}
    for name, model_wrapper, optim_wrapper in (
        ("fp32", {}, clipped),
        ("mixed_precision", dict(mixed_precision=dict(param_dtype="bf16")), clipped),
        ("amp", {}, dict(type="AmpOptimWrapper", dtype="bfloat16", **clipped)),
        ("cpu_offload", dict(cpu_offload=True), clipped),  # nothing to offload on a CPU mesh
    ):
        strategy = FSDPStrategy(
            work_dir=work_dir,
            env_kwargs=dict(randomness=dict(seed=0)),
            parallelism=dict(tp=2),
            tp_plan=PLAN,
            model_wrapper=model_wrapper,
        )
        model, wrapper = strategy.prepare(TPTransformer(), optim_wrapper=optim_wrapper)
        norms = run_steps(strategy, model, wrapper, 3)
        out[name] = (norms, model.blocks[0].q.weight.dtype)
    return out


def test_mixed_precision_amp_and_offload_compose_with_tensor_parallelism(tmp_path):
    results = run_distributed(_precisions, 2, str(tmp_path), timeout=240)
    for result in results:
        want, _ = result["fp32"]
        for name in ("mixed_precision", "amp", "cpu_offload"):
            norms, dtype = result[name]
            assert dtype == torch.float32, name  # the sharded parameters stay in fp32
            # bf16 compute: the same gradients to bf16's precision, not bit for bit
            tolerance = 0 if name == "cpu_offload" else 2e-2
            assert norms == pytest.approx(want, rel=tolerance), name
        assert result["mixed_precision"][0] != want and result["amp"][0] != want
