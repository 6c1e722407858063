"""Pipeline parallelism composed with FSDP on one DeviceMesh (FSDPStrategy's ``parallelism=
dict(pp=...)`` and ``pipeline=dict(...)``): parity of torch's schedules with one device, the
split's bad input refused on every rank before anything is split, and a sharded checkpoint
written by the stages resuming on one device.

Parity runs real gloo groups of 2 and 4 CPU ranks in float64 against a single-process run of the
same global batches, with gradient accumulation (2 steps a window) and clipping by the global
norm (which acts: the norms exceed max_norm), so a stage that clipped by its own norm, or a
loss not averaged over microbatches, would show.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shardwise.strategies import FSDPStrategy, SingleDeviceStrategy, resolve_degrees
from shardwise.strategies.pipeline import (
    check_microbatches,
    check_split_backward,
    parse_pipeline,
    plan_pipeline,
    split_model,
    stage_ids_of_rank,
)
from tests.distributed import run_distributed
from tests.test_fsdp import TinyTransformer
from tests.test_tensor_parallel import (
    TPTransformer,
    full_weights,
    in_float64,
    lm_batch,
    max_relative_error,
)

OPTIM = dict(
    optimizer=dict(type="AdamW", lr=1e-2, weight_decay=0.01),
    accumulative_counts=2,
    clip_grad=dict(max_norm=0.3),
)
STEPS = 6
TOLERANCE = 1e-6


class PipeTransformer(TinyTransformer):
    """test_fsdp's GPT written to be split: a stage skips the modules it lacks (``None``) and
    runs the blocks it has; the loss is the model's ``pipeline_loss``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None:
            x = self.tok(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(self.ln_f(x))
        return x

    def pipeline_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class PipeTPTransformer(TPTransformer):
    """test_tensor_parallel's GPT (its blocks split by heads, with its own tensor-parallel plan)
    written to be split into stages as :class:`PipeTransformer` is."""

    forward = PipeTransformer.forward
    pipeline_loss = PipeTransformer.pipeline_loss


@in_float64
def _reference(work_dir, layers=2, steps=STEPS, model_cls=PipeTransformer):
    strategy = SingleDeviceStrategy(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=0)))
    model, wrapper = strategy.prepare(
        model_cls(layers=layers), optim_wrapper=OPTIM, dispatch_kwargs=dict(max_iters=steps)
    )
    losses, norms = [], []
    for step in range(steps):
        idx, targets = lm_batch(step)
        with wrapper.optim_context(model):
            loss = model.pipeline_loss(model(idx), targets)
        wrapper.update_params(loss)
        losses.append(loss.item())
        norms.append(wrapper.last_grad_norm)
    return losses, norms, full_weights(model)


def _merged_weights(model) -> dict:
    """Every stage's full weights, gathered over the stage mesh, merged over the pipeline."""
    import torch.distributed as dist

    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, full_weights(model))
    merged: dict = {}
    for part in parts:
        merged.update(part)
    return merged


def _mesh_of(param) -> str:
    """The mesh dimensions a parameter is a DTensor on, or 'plain'."""
    from torch.distributed.tensor import DTensor

    return str(param.device_mesh.mesh_dim_names) if isinstance(param, DTensor) else "plain"


@in_float64
def _train_pipelined(
    work_dir, parallelism, pipeline, layers=2, steps=STEPS, model_cls=PipeTransformer, **kwargs
):
    strategy = FSDPStrategy(
        work_dir=work_dir,
        env_kwargs=dict(randomness=dict(seed=0)),
        parallelism=parallelism,
        pipeline=pipeline,
        **kwargs,
    )
    model, wrapper = strategy.prepare(
        model_cls(layers=layers), optim_wrapper=OPTIM, dispatch_kwargs=dict(max_iters=steps)
    )
    losses, norms = [], []
    for step in range(steps):
        idx, targets = lm_batch(step)
        share = len(idx) // strategy.data_parallel_size
        rows = slice(strategy.data_parallel_rank * share, (strategy.data_parallel_rank + 1) * share)
        log_vars = strategy.pipeline.train_step((idx[rows], targets[rows]), wrapper)
        losses.append(log_vars["loss"].item())
        norms.append(wrapper.last_grad_norm)
    own = sorted(n for n, _ in model.named_parameters())
    meshes = sorted({_mesh_of(p) for p in model.parameters()})
    return losses, norms, _merged_weights(model), own, strategy.pipeline.stage_ids, meshes


# ----------------------------------------------------------------------------- the split
def test_pp_is_the_outermost_mesh_dimension():
    degrees = resolve_degrees(
        dict(pp=2, tp=2), mesh_kind="shard", replicate_size=None, world_size=8, local_size=8
    )
    assert degrees.dim_names == ("pp", "dp_shard", "tp") and degrees.shape == (2, 2, 2)
    assert degrees.stage_dim_names == ("dp_shard", "tp")
    assert [degrees.pp_rank(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [degrees.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    rest = resolve_degrees(
        dict(pp=-1, dp_shard=2), mesh_kind="shard", replicate_size=None, world_size=8, local_size=8
    )
    assert (rest.pp, rest.dp_shard, rest.world_size) == (4, 2, 8)


def test_stages_keep_the_unsplit_names_and_chain_to_the_whole_model():
    torch.manual_seed(0)
    model = PipeTransformer(layers=4).double()
    plan = plan_pipeline(
        model, parse_pipeline(dict(split_points=["blocks.1", "blocks.3"], schedule="GPipe")), pp=3
    )
    assert plan.units == (
        ("tok", "blocks.0"),
        ("blocks.1", "blocks.2"),
        ("blocks.3", "ln_f", "head"),
    )
    _, stages = split_model(model, plan, [0])
    first = stages[0]
    _, (middle,) = split_model(model, plan, [1])
    _, (last,) = split_model(model, plan, [2])
    names = [sorted(n for n, _ in s.named_parameters()) for s in (first, middle, last)]
    assert "pos" in names[0] and "blocks.2.qkv.weight" in names[1] and "head.weight" in names[2]
    assert sorted(sum(names, [])) == sorted(n for n, _ in model.named_parameters())
    idx, _ = lm_batch(0)
    torch.testing.assert_close(last(middle(first(idx))), model(idx), rtol=0, atol=0)


def test_several_stages_per_rank_share_one_part_with_unsplit_names():
    model = PipeTransformer(layers=4)
    plan = plan_pipeline(model, parse_pipeline(dict(schedule="Interleaved1F1B")), pp=2)
    assert plan.units == (
        ("tok", "blocks.0"),
        ("blocks.1",),
        ("blocks.2",),
        ("blocks.3", "ln_f", "head"),
    )
    part, views = split_model(model, plan, plan.stage_ids(1))
    assert plan.stage_ids(1) == (1, 3)
    assert sorted(
        {
            n.split(".")[0] + "." + n.split(".")[1]
            for n, _ in part.named_parameters()
            if n.startswith("blocks")
        }
    ) == ["blocks.1", "blocks.3"]
    assert part.tok is None and part.pos is None and part.head is not None
    assert [list(v.blocks._modules) for v in views] == [["1"], ["3"]]
    assert views[0].head is None and views[1].head is part.head


def test_split_points_come_from_the_config_a_function_the_model_or_an_even_split():
    model = PipeTransformer(layers=4)

    def units(config, pp=2):
        return plan_pipeline(model, parse_pipeline(config), pp=pp).units

    even = units(None)
    assert even == (("tok", "blocks.0", "blocks.1"), ("blocks.2", "blocks.3", "ln_f", "head"))
    assert units(dict(split_points=["blocks.1"]))[1][0] == "blocks.1"
    assert units(dict(split_fn=lambda m, n: ["blocks.3"]))[1][0] == "blocks.3"
    model.pipeline_split_points = ["blocks.1"]
    assert units(None)[1][0] == "blocks.1"
    model.pipeline_split_points = lambda n_stages: [f"blocks.{i}" for i in range(1, n_stages)]
    assert [u[0] for u in units(None, pp=4)] == ["tok", "blocks.1", "blocks.2", "blocks.3"]


def test_stage_placement_is_looped_or_v_shaped():
    assert [stage_ids_of_rank(r, 2, 2, False) for r in range(2)] == [(0, 2), (1, 3)]
    assert [stage_ids_of_rank(r, 2, 2, True) for r in range(2)] == [(0, 3), (1, 2)]


# ----------------------------------------------------------------------------- bad input
def test_unknown_schedule_lists_the_known_ones():
    with pytest.raises(
        ValueError,
        match=r"schedule '1f2b' does not exist; .*'GPipe', '1F1B', "
        r"'Interleaved1F1B'",
    ):
        parse_pipeline(dict(schedule="1f2b"))
    assert parse_pipeline(dict(schedule="gpipe")).schedule == "GPipe"


@pytest.mark.parametrize("schedule", ["InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"])
def test_zero_bubble_schedules_are_refused_on_sharded_stages_naming_why_and_the_others(schedule):
    config = parse_pipeline(dict(schedule=schedule))
    check_split_backward(config, [])  # plain stages (pp alone) run them
    with pytest.raises(
        ValueError,
        match=r"splits the backward .* sharded because of dp_shard=2: use one of \['GPipe', "
        r"'1F1B', 'Interleaved1F1B', 'LoopedBFS'\], or run the zero-bubble schedules with pp alone",
    ):
        check_split_backward(config, ["dp_shard=2"])
    check_split_backward(parse_pipeline(dict(schedule="1F1B")), ["dp_shard=2"])


def test_a_split_point_naming_no_module_names_the_nearest():
    model = PipeTransformer(layers=2)
    with pytest.raises(
        ValueError, match=r"'block.1' names no module .*nearest names: \['blocks.1'"
    ):
        plan_pipeline(model, parse_pipeline(dict(split_points=["block.1"])), pp=2)
    with pytest.raises(ValueError, match=r"'ln_f' is not a layer"):
        plan_pipeline(model, parse_pipeline(dict(split_points=["ln_f"])), pp=2)
    with pytest.raises(ValueError, match=r"2 pipeline stages need 1 split point\(s\), got 2"):
        plan_pipeline(model, parse_pipeline(dict(split_points=["blocks.0", "blocks.1"])), pp=2)


def test_more_stages_than_layers_is_refused():
    model = PipeTransformer(layers=2)
    with pytest.raises(ValueError, match=r"4 pipeline stages need at least 4 layers, .* has 2"):
        plan_pipeline(model, parse_pipeline(dict(schedule="Interleaved1F1B")), pp=2)
    points = dict(split_points=["blocks.1", "blocks.1", "blocks.1"], schedule="Interleaved1F1B")
    with pytest.raises(ValueError, match=r"4 pipeline stages need at least 4 layers"):
        plan_pipeline(model, parse_pipeline(points), pp=2)


def test_n_microbatches_that_do_not_divide_the_batch_are_refused():
    model = PipeTransformer(layers=2)
    with pytest.raises(ValueError, match=r"n_microbatches=3 does not divide the batch of 8"):
        plan_pipeline(model, parse_pipeline(dict(n_microbatches=3)), pp=2, batch_size=8)
    with pytest.raises(ValueError, match=r"n_microbatches=3 does not divide the batch of 4"):
        check_microbatches(4, 3)


def test_a_model_without_a_loss_needs_loss_fn():
    with pytest.raises(ValueError, match=r"no pipeline_loss\(outputs, targets\) .* loss_fn"):
        plan_pipeline(TinyTransformer(), parse_pipeline(None), pp=2)


def test_pipeline_saves_the_sharded_format_only():
    kwargs = dict(parallelism=dict(pp=2), state_dict_cfg="full")
    with pytest.raises(
        ValueError, match=r"saves the 'sharded' format only .* state_dict_cfg='sharded'"
    ):
        FSDPStrategy._check_kwargs(kwargs, world_size=2, local_size=2)


def _prepare_with(work_dir, pipeline, **kwargs):
    try:
        strategy = FSDPStrategy(
            work_dir=work_dir, parallelism=dict(pp=2), pipeline=pipeline, **kwargs
        )
    except ValueError as exc:
        return str(exc), None
    try:
        strategy.prepare(PipeTransformer(), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)))
    except ValueError as exc:
        return str(exc), strategy.mesh
    return None, strategy.mesh


def _step_with_batch(work_dir, batch):
    strategy = FSDPStrategy(
        work_dir=work_dir, parallelism=dict(pp=2), pipeline=dict(n_microbatches=4)
    )
    _, wrapper = strategy.prepare(
        PipeTransformer(), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1))
    )
    idx, targets = lm_batch(0, batch=batch)
    try:
        strategy.pipeline.train_step((idx, targets), wrapper)
    except ValueError as exc:
        return str(exc)
    return None


def test_a_batch_the_microbatches_do_not_divide_is_refused_on_every_rank(tmp_path):
    results = run_distributed(_step_with_batch, 2, str(tmp_path), 6)
    assert results[0] == results[1] and "n_microbatches=4 does not divide the batch of 6" in (
        results[0] or ""
    )


def test_bad_split_points_are_refused_on_every_rank_before_anything_is_split(tmp_path):
    results = run_distributed(_prepare_with, 2, str(tmp_path), dict(split_points=["blocks.7"]))
    messages = {message for message, _ in results}
    assert len(messages) == 1 and "'blocks.7' names no module" in messages.pop()
    assert [mesh for _, mesh in results] == [None, None]  # refused before the mesh was built


def test_a_zero_bubble_schedule_on_stages_kept_sharded_is_refused_on_every_rank(tmp_path):
    mixed = dict(mixed_precision=dict(param_dtype="bfloat16"))
    results = run_distributed(
        _prepare_with, 2, str(tmp_path), dict(schedule="DualPipeV"), model_wrapper=mixed
    )
    messages = {message for message, _ in results}
    assert len(messages) == 1
    assert "sharded because of model_wrapper's mixed_precision" in messages.pop()
    assert [mesh for _, mesh in results] == [None, None]  # refused at construction


# ----------------------------------------------------------------------------- parity
def _check_parity(results, want):
    want_losses, want_norms, want_weights = want
    assert max(n for n in want_norms if n is not None) > OPTIM["clip_grad"]["max_norm"]
    # each rank logs its data-parallel share's loss (the last stage's, broadcast to the others)
    mean = [sum(r[0][i] for r in results) / len(results) for i in range(len(want_losses))]
    assert mean == pytest.approx(want_losses, rel=TOLERANCE, abs=0)
    for _, norms, weights, *_ in results:
        assert norms[0] is None and norms[1:] == pytest.approx(want_norms[1:], rel=TOLERANCE)
        assert max_relative_error(weights, want_weights) < TOLERANCE


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_two_stages_match_one_device(tmp_path, schedule):
    results = run_distributed(
        _train_pipelined,
        2,
        str(tmp_path),
        dict(pp=2),
        dict(schedule=schedule, n_microbatches=4),
        timeout=240,
    )
    _check_parity(results, _reference(str(tmp_path)))
    (_, _, _, first, ids0, meshes), (_, _, _, last, ids1, _) = results
    assert meshes == ["plain"]  # pp alone: nothing to shard, no fully_shard
    assert (ids0, ids1) == ((0,), (1,))
    assert "tok.weight" in first and "blocks.0.qkv.weight" in first and "head.weight" in last
    assert not set(first) & set(last)


@pytest.mark.parametrize(
    # the zero-bubble schedules run on plain stages (pp alone) only
    "schedule",
    ["Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"],
)
def test_two_stages_per_rank_match_one_device(tmp_path, schedule):
    results = run_distributed(
        _train_pipelined,
        2,
        str(tmp_path),
        dict(pp=2),
        dict(schedule=schedule, stages_per_rank=2, n_microbatches=4),
        layers=4,
        timeout=240,
    )
    _check_parity(results, _reference(str(tmp_path), layers=4))
    v_shaped = schedule in ("ZBVZeroBubble", "DualPipeV")  # rank 0 holds the first and last
    assert [r[4] for r in results] == ([(0, 3), (1, 2)] if v_shaped else [(0, 2), (1, 3)])
    assert all(r[5] == ["plain"] for r in results)
    other_block = "blocks.3.qkv.weight" if v_shaped else "blocks.2.qkv.weight"
    assert other_block in results[0][3] and "pos" in results[0][3]


@pytest.mark.slow
@pytest.mark.parametrize(
    "parallelism, meshes",
    [
        (dict(pp=2, dp_shard=2), ["('dp_shard',)"]),
        (dict(pp=2, dp_replicate=2, dp_shard=1), ["('dp_replicate', 'dp_shard')"]),  # HSDP
    ],
    ids=["fsdp", "hsdp"],
)
def test_two_stages_times_two_data_parallel_ranks_match_one_device(tmp_path, parallelism, meshes):
    results = run_distributed(
        _train_pipelined,
        4,
        str(tmp_path),
        parallelism,
        dict(schedule="1F1B", n_microbatches=2),
        timeout=300,
    )
    _check_parity(results, _reference(str(tmp_path)))
    stages = [r[4] for r in results]
    assert stages == [(0,), (0,), (1,), (1,)]  # pp outermost: ranks 0, 1 hold stage 0
    assert all(r[5] == meshes for r in results)


@pytest.mark.slow
def test_two_stages_times_tensor_parallel_two_match_one_device(tmp_path):
    results = run_distributed(
        _train_pipelined,
        4,
        str(tmp_path),
        dict(pp=2, tp=2),
        dict(schedule="GPipe", n_microbatches=2),
        model_cls=PipeTPTransformer,
        tp_plan="auto",
        timeout=300,
    )
    _check_parity(results, _reference(str(tmp_path), model_cls=PipeTPTransformer))
    assert all("('dp_shard', 'tp')" in r[5] for r in results)  # each stage split by TP


def _stage_parameters(work_dir, model_wrapper):
    """The kinds of this rank's stage parameters and of its optimizer's state."""
    strategy = FSDPStrategy(
        work_dir=work_dir,
        parallelism=dict(pp=2),
        pipeline=dict(n_microbatches=2),
        model_wrapper=model_wrapper,
    )
    optim_wrapper = dict(optimizer=dict(type="AdamW", lr=1e-2))
    model, wrapper = strategy.prepare(PipeTransformer(), optim_wrapper=optim_wrapper)
    strategy.pipeline.train_step(lm_batch(0), wrapper)
    state = [v for s in wrapper.optimizer.state.values() for v in s.values() if v.dim()]
    return sorted({_mesh_of(p) for p in model.parameters()}), sorted({_mesh_of(v) for v in state})


def test_a_pp_only_stage_is_plain_unless_fsdp_settings_are_asked_for(tmp_path):
    plain = run_distributed(_stage_parameters, 2, str(tmp_path), None)
    assert plain == [(["plain"], ["plain"])] * 2  # plain parameters, a plain optimizer
    mixed = dict(mixed_precision=dict(param_dtype="bf16", reduce_dtype="fp32"))
    sharded = run_distributed(_stage_parameters, 2, str(tmp_path), mixed)
    assert sharded == [(["('dp_shard',)"], ["('dp_shard',)"])] * 2  # kept for the policy


# ----------------------------------------------------------------------------- checkpoints
SAVED_AT, MORE = 2, 2


@in_float64
def _pipelined_save_continue(work_dir, parallelism, pipeline):
    """Train under pipeline stages, save a sharded checkpoint, train on; returns the losses
    after the save."""
    strategy = FSDPStrategy(
        work_dir=work_dir,
        env_kwargs=dict(randomness=dict(seed=0)),
        parallelism=parallelism,
        pipeline=pipeline,
    )
    _, wrapper = strategy.prepare(
        PipeTransformer(), optim_wrapper=OPTIM, dispatch_kwargs=dict(max_iters=SAVED_AT + MORE)
    )
    losses = []
    for step in range(SAVED_AT + MORE):
        if step == SAVED_AT:
            strategy.save_checkpoint(f"{work_dir}/sharded")
        idx, targets = lm_batch(step)
        share = len(idx) // strategy.data_parallel_size
        rows = slice(strategy.data_parallel_rank * share, (strategy.data_parallel_rank + 1) * share)
        losses.append(strategy.pipeline.train_step((idx[rows], targets[rows]), wrapper)["loss"])
    return [float(x) for x in losses[SAVED_AT:]]


@in_float64
def _resume_on_one_device(work_dir):
    strategy = SingleDeviceStrategy(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=0)))
    model, wrapper = strategy.prepare(
        PipeTransformer(), optim_wrapper=OPTIM, dispatch_kwargs=dict(max_iters=SAVED_AT + MORE)
    )
    strategy.resume(f"{work_dir}/sharded")
    losses = []
    for step in range(SAVED_AT, SAVED_AT + MORE):
        idx, targets = lm_batch(step)
        with wrapper.optim_context(model):
            loss = model.pipeline_loss(model(idx), targets)
        wrapper.update_params(loss)
        losses.append(loss.item())
    return losses


@in_float64
def _one_device_save_continue(work_dir):
    """Train on one device, save a full checkpoint, train on; returns the losses after it."""
    strategy = SingleDeviceStrategy(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=0)))
    model, wrapper = strategy.prepare(
        PipeTransformer(), optim_wrapper=OPTIM, dispatch_kwargs=dict(max_iters=SAVED_AT + MORE)
    )
    losses = []
    for step in range(SAVED_AT + MORE):
        if step == SAVED_AT:
            strategy.save_checkpoint(f"{work_dir}/full.pth")
        idx, targets = lm_batch(step)
        with wrapper.optim_context(model):
            loss = model.pipeline_loss(model(idx), targets)
        wrapper.update_params(loss)
        losses.append(loss.item())
    return losses[SAVED_AT:]


@in_float64
def _resume_pipelined(work_dir, parallelism, pipeline, name="sharded"):
    """Resume the checkpoint ``name`` under ``parallelism`` (with pipeline stages or without)
    and train on; returns this rank's losses (its data-parallel share's)."""
    strategy = FSDPStrategy(
        work_dir=work_dir,
        env_kwargs=dict(randomness=dict(seed=0)),
        parallelism=parallelism,
        pipeline=pipeline,
    )
    model, wrapper = strategy.prepare(
        PipeTransformer(), optim_wrapper=OPTIM, dispatch_kwargs=dict(max_iters=SAVED_AT + MORE)
    )
    strategy.resume(f"{work_dir}/{name}")
    losses = []
    for step in range(SAVED_AT, SAVED_AT + MORE):
        idx, targets = lm_batch(step)
        share = len(idx) // strategy.data_parallel_size
        rows = slice(strategy.data_parallel_rank * share, (strategy.data_parallel_rank + 1) * share)
        batch = (idx[rows], targets[rows])
        if strategy.pipeline is not None:
            losses.append(float(strategy.pipeline.train_step(batch, wrapper)["loss"]))
            continue
        with wrapper.optim_context(model):
            loss = model.pipeline_loss(model(batch[0]), batch[1])
        wrapper.update_params(loss)
        losses.append(loss.item())
    return losses


def _mean_over_ranks(per_rank):
    return [sum(losses[i] for losses in per_rank) / len(per_rank) for i in range(MORE)]


def test_a_two_stage_checkpoint_resumes_on_one_device_under_another_schedule_and_sharded(
    tmp_path,
):
    work_dir = str(tmp_path)
    continued = run_distributed(
        _pipelined_save_continue,
        2,
        work_dir,
        dict(pp=2),
        dict(schedule="1F1B", n_microbatches=2),
        timeout=240,
    )
    assert continued[0] == continued[1]
    on_one_device = _resume_on_one_device(work_dir)
    assert on_one_device == pytest.approx(continued[0], rel=TOLERANCE, abs=0)
    again = run_distributed(
        _resume_pipelined,
        2,
        work_dir,
        dict(pp=2),
        dict(schedule="GPipe", n_microbatches=4),
        timeout=240,
    )
    assert again[0] == pytest.approx(continued[0], rel=TOLERANCE, abs=0)
    # the plain stages' tensors, read into the shards of a run without stages
    sharded = run_distributed(_resume_pipelined, 2, work_dir, dict(dp_shard=2), None, timeout=240)
    assert _mean_over_ranks(sharded) == pytest.approx(continued[0], rel=TOLERANCE, abs=0)


# ----------------------------------------------------------------------------- the Runner
class LMData(torch.utils.data.Dataset):
    """32 fixed token sequences: ``(inputs, targets)`` shifted by one."""

    def __init__(self) -> None:
        self.idx = torch.randint(0, 32, (32, 9), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i: int):
        return self.idx[i, :-1], self.idx[i, 1:]


class LossTransformer(PipeTransformer):
    """The one-device reference for the Runner: the same model, its forward returning the
    loss (the default train step's contract)."""

    def forward(self, x, targets):  # type: ignore[override]
        return dict(loss=self.pipeline_loss(super().forward(x), targets))


@in_float64
def _run(work_dir, model_cls, strategy):
    import json
    from pathlib import Path

    from shardwise.runner import Runner

    runner = Runner(
        model=model_cls(),
        work_dir=work_dir,
        strategy=strategy,
        launcher="pytorch" if strategy["type"] == "FSDPStrategy" else "none",
        train_dataloader=dict(
            dataset=LMData(), batch_size=8, sampler=dict(type="DefaultSampler", shuffle=False)
        ),
        optim_wrapper=OPTIM,
        train_cfg=dict(by_epoch=False, max_iters=4),
        default_hooks=dict(logger=dict(interval=1, progress_bar=False), checkpoint=None),
        randomness=dict(seed=0),
    )
    runner.train()
    log = Path(runner.log_dir) / "metrics.jsonl"
    if not log.exists():
        return []
    return [
        {k: r[k] for k in ("iter", "loss", "grad_norm") if k in r}
        for r in map(json.loads, log.read_text().splitlines())
        if r["mode"] == "train"
    ]


@pytest.mark.slow  # two spawned Runner ranks
def test_the_runner_drives_a_pipelined_step_with_the_logs_of_one_device(tmp_path):
    strategy = dict(
        type="FSDPStrategy",
        parallelism=dict(pp=2),
        pipeline=dict(schedule="1F1B", n_microbatches=2),
    )
    records = run_distributed(
        _run, 2, str(tmp_path / "pp"), PipeTransformer, strategy, timeout=300
    )[0]  # rank 0's log
    want = _run(str(tmp_path / "one"), LossTransformer, dict(type="SingleDeviceStrategy"))
    assert [r["iter"] for r in records] == [1, 2, 3, 4]
    assert [r["iter"] for r in want] == [1, 2, 3, 4] and "grad_norm" in want[1]
    for got, ref in zip(records, want, strict=True):
        assert got.keys() == ref.keys()
        for key in ref:
            assert got[key] == pytest.approx(ref[key], rel=1e-6), (key, got, ref)


@pytest.mark.slow  # 4 ranks, then 2 ranks twice
def test_a_two_stage_two_shard_checkpoint_resumes_without_stages_with_stages_and_on_one_device(
    tmp_path,
):
    work_dir = str(tmp_path)
    continued = run_distributed(
        _pipelined_save_continue,
        4,
        work_dir,
        dict(pp=2, dp_shard=2),
        dict(schedule="1F1B", n_microbatches=2),
        timeout=300,
    )
    want = _mean_over_ranks(continued)
    for parallelism, pipeline in [(dict(dp_shard=2), None), (dict(pp=2), dict(schedule="GPipe"))]:
        got = run_distributed(_resume_pipelined, 2, work_dir, parallelism, pipeline, timeout=300)
        assert _mean_over_ranks(got) == pytest.approx(want, rel=TOLERANCE, abs=0), parallelism
    assert _resume_on_one_device(work_dir) == pytest.approx(want, rel=TOLERANCE, abs=0)


def test_a_full_checkpoint_of_one_device_resumes_under_two_stages(tmp_path):
    """Rank 0 alone reads a full checkpoint; every stage takes its part of it."""
    work_dir = str(tmp_path)
    want = _one_device_save_continue(work_dir)
    got = run_distributed(
        _resume_pipelined, 2, work_dir, dict(pp=2), dict(n_microbatches=2), "full.pth"
    )
    assert got[0] == got[1] == pytest.approx(want, rel=TOLERANCE, abs=0)


@pytest.mark.slow  # 4 ranks
def test_a_full_checkpoint_of_one_device_resumes_under_two_stages_times_two_shards(tmp_path):
    work_dir = str(tmp_path)
    want = _one_device_save_continue(work_dir)
    got = run_distributed(
        _resume_pipelined, 4, work_dir, dict(pp=2, dp_shard=2), None, "full.pth", timeout=300
    )
    assert _mean_over_ranks(got) == pytest.approx(want, rel=TOLERANCE, abs=0)
