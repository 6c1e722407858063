"""FSDPStrategy checkpoints: the three formats, resume, loading elsewhere, skip_init_weights.

One two-rank run (the ``two_ranks`` fixture) trains, saves in every format, resumes and
reloads; the tests below each check one behaviour of its results.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from shardwise.checkpoint import CheckpointError, find_last_checkpoint
from shardwise.checkpoint.formats import detect_format, read_checkpoint
from shardwise.optim import LinearLR, OptimWrapper
from shardwise.strategies import FSDPStrategy, SingleDeviceStrategy
from tests.distributed import DistributedTestError, run_distributed
from tests.test_fsdp import (
    Block,
    TinyTransformer,
    ToyModel,
    full_weights,
    linear_wrap_policy,
    lm_batch,
    train_lm,
)

FORMATS = ("full", "sharded", "local")
OPTIM = dict(optimizer=dict(type="AdamW", lr=1e-2, weight_decay=0.01))
SCHEDULERS = [
    dict(type="LinearLR", start_factor=0.5, by_epoch=False, begin=0, end=2),
    dict(type="CosineAnnealingLR", by_epoch=False, begin=2, end=6, eta_min=1e-4),
]
MODEL = dict(type="TinyTransformer", dropout=0.1)  # dropout: the RNG state matters


def _prepare(work_dir, fmt, **kwargs):
    strategy = FSDPStrategy(
        work_dir=work_dir,
        state_dict_cfg=fmt,
        model_wrapper=dict(auto_wrap_policy={Block}),
        env_kwargs=dict(randomness=dict(seed=7)),
        **kwargs,
    )
    model, wrapper, schedulers = strategy.prepare(
        MODEL, optim_wrapper=OPTIM, param_scheduler=SCHEDULERS
    )
    return strategy, model, wrapper, schedulers


def _steps(strategy, model, wrapper, schedulers, steps):
    losses = []
    for step in steps:
        losses += train_lm(strategy, model, wrapper, [step], strategy.rank, strategy.world_size)[0]
        for scheduler in schedulers:
            scheduler.step()
    return losses


def _outputs(model):
    model.eval()
    with torch.no_grad():
        outputs = model(lm_batch(99)[0]).clone()
    model.train()
    return outputs


def _save_resume_and_reload(work_dir):
    rank = int(os.environ["RANK"])
    out = {}
    for fmt in FORMATS:
        # uninterrupted: 3 steps, save, 3 steps
        strategy, model, wrapper, schedulers = _prepare(work_dir, fmt)
        _steps(strategy, model, wrapper, schedulers, range(3))
        strategy.save_checkpoint(f"{fmt}.ckpt", extra_ckpt=dict(meta=dict(iter=3)))
        saved = full_weights(model)
        outputs = _outputs(model)
        path = os.path.join(work_dir, f"{fmt}.ckpt")
        layout = "file" if os.path.isfile(path) else sorted(os.listdir(path))
        full_losses = _steps(strategy, model, wrapper, schedulers, range(3, 6))
        full = full_weights(model)
        # resumed: prepare afresh, resume, the same 3 steps
        strategy, model, wrapper, schedulers = _prepare(work_dir, fmt)
        meta = strategy.resume(f"{fmt}.ckpt")["meta"]
        resumed_losses = _steps(strategy, model, wrapper, schedulers, range(3, 6))
        # skip_init_weights: built on the meta device, then filled from the checkpoint
        strategy = FSDPStrategy(
            work_dir=work_dir,
            skip_init_weights=True,
            model_wrapper=dict(auto_wrap_policy={Block}),
        )
        meta_model = strategy.prepare(MODEL)
        strategy.load_checkpoint(path)
        out[fmt] = dict(
            saved=saved,
            layout=layout,
            meta=(meta["format"], meta["world_size"], meta["iter"], len(meta["rng_states"])),
            full_losses=full_losses,
            resumed_losses=resumed_losses,
            full=full,
            resumed=full_weights(model),
            outputs_at_save=outputs,
            meta_model_equal=all(
                torch.equal(v, saved[k]) for k, v in full_weights(meta_model).items()
            ),
            meta_model_outputs=_outputs(meta_model),
        )
    out["last_checkpoint"] = find_last_checkpoint(work_dir)
    # a corrupt file fails the load on every rank (only rank 0 reads a full checkpoint)
    Path(work_dir, "cut.ckpt").write_bytes(Path(work_dir, "full.ckpt").read_bytes()[:100])
    try:
        strategy.load_checkpoint("cut.ckpt")
    except CheckpointError as exc:
        out["corrupt"] = str(exc)
    out["rank"] = rank
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("fsdp_checkpoints")
    results = run_distributed(_save_resume_and_reload, 2, str(work_dir), timeout=240)
    return work_dir, results


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_resumes_bit_exactly_on_the_same_ranks(two_ranks, fmt):
    _, results = two_ranks
    for result in results:
        run = result[fmt]
        assert run["resumed_losses"] == run["full_losses"][-3:]
        assert all(torch.equal(run["resumed"][k], v) for k, v in run["full"].items())
        assert run["meta"] == (fmt, 2, 3, 2)  # format, world size, extra meta, RNG per rank


def test_each_format_has_its_layout_on_disk(two_ranks):
    work_dir, results = two_ranks
    layouts = {fmt: results[0][fmt]["layout"] for fmt in FORMATS}
    assert layouts["full"] == "file"
    assert layouts["sharded"] == [  # each rank's data and metadata fragment, no .metadata
        "__0.metadata",
        "__0_0.distcp",
        "__1.metadata",
        "__1_0.distcp",
        "layout.json",
        "manifest.json",
        "meta.pt",
    ]
    assert layouts["local"] == ["manifest.json", "rank0.pth", "rank1.pth"]
    assert {fmt: detect_format(work_dir / f"{fmt}.ckpt").name for fmt in FORMATS} == {
        fmt: fmt for fmt in FORMATS
    }
    assert results[0]["last_checkpoint"] == str(work_dir / "local.ckpt")
    assert not [p for p in os.listdir(work_dir) if p.endswith(".partial")]


@pytest.mark.parametrize("fmt", FORMATS)
def test_skip_init_weights_then_load_reproduces_the_saved_model(two_ranks, fmt):
    _, results = two_ranks
    for result in results:
        run = result[fmt]
        assert run["meta_model_equal"]  # every weight, bit for bit
        assert torch.equal(run["meta_model_outputs"], run["outputs_at_save"])


def test_a_full_checkpoint_loads_into_a_plain_module_and_single_device(two_ranks, tmp_path):
    work_dir, results = two_ranks
    saved = results[0]["full"]["saved"]
    checkpoint = torch.load(work_dir / "full.ckpt", weights_only=True)
    plain = TinyTransformer(dropout=0.1)
    plain.load_state_dict(checkpoint["state_dict"])  # strict: plain keys, full tensors
    assert all(torch.equal(v, saved[k]) for k, v in plain.state_dict().items())
    assert set(checkpoint["optimizer"]["state"]) == {n for n, _ in plain.named_parameters()}
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path))
    strategy.prepare(TinyTransformer(dropout=0.1), optim_wrapper=OPTIM, param_scheduler=SCHEDULERS)
    strategy.resume(work_dir / "full.ckpt")  # model, optimizer and schedulers
    assert all(torch.equal(v, saved[k]) for k, v in strategy.model_state_dict().items())


def test_a_sharded_checkpoint_loads_whole_into_single_device(two_ranks, tmp_path):
    work_dir, results = two_ranks
    saved = results[0]["sharded"]["saved"]
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path))
    strategy.prepare(TinyTransformer(dropout=0.1), optim_wrapper=OPTIM, param_scheduler=SCHEDULERS)
    meta = strategy.resume(work_dir / "sharded.ckpt")["meta"]
    assert meta["format"] == "sharded" and meta["iter"] == 3
    assert all(torch.equal(v, saved[k]) for k, v in strategy.model_state_dict().items())


def test_a_local_checkpoint_is_refused_outside_fsdp_with_the_way_out(two_ranks):
    work_dir, _ = two_ranks
    with pytest.raises(CheckpointError, match="loads only under FSDPStrategy.*state_dict_cfg"):
        read_checkpoint(work_dir / "local.ckpt")


def test_a_corrupt_full_checkpoint_fails_on_every_rank(two_ranks):
    _, results = two_ranks
    for result in results:
        assert "cut.ckpt is not a readable checkpoint" in result["corrupt"]


def _load_on_one_rank(work_dir):
    strategy, model, _, _ = _prepare(work_dir, "sharded")
    strategy.resume(os.path.join(work_dir, "sharded.ckpt"))  # 2 ranks → 1: DCP reshards
    weights = full_weights(model)
    try:
        strategy.load_checkpoint(os.path.join(work_dir, "local.ckpt"))
    except CheckpointError as exc:
        return weights, str(exc)
    return weights, None


def test_a_sharded_checkpoint_reshards_and_a_local_one_refuses_other_ranks(two_ranks):
    work_dir, results = two_ranks
    weights, local_error = run_distributed(_load_on_one_rank, 1, str(work_dir))[0]
    assert all(torch.equal(v, results[0]["sharded"]["saved"][k]) for k, v in weights.items())
    assert "files for ranks [0, 1], but this run has 1 rank(s)" in local_error
    assert "save with state_dict_cfg='sharded'" in local_error


# ----------------------------------------------------------------------------- mmengine
def _mmengine_run_strategy(shared_dir, rank_dirs):
    """mmengine's tests/test_strategies/test_fsdp.py::run_strategy against shardwise."""
    from shardwise import dist

    rank = dist.get_rank() if dist.is_distributed() else int(os.environ["RANK"])
    out = {}
    for skip_init_weights, fmt in [(True, "local"), (False, "full")]:
        # mmengine gives each rank its own temporary directory; a local checkpoint, which
        # every rank writes a part of, needs one directory that all of them see
        work_dir = shared_dir if fmt == "local" else rank_dirs[rank]
        strategy = FSDPStrategy(
            work_dir=work_dir,
            skip_init_weights=skip_init_weights,
            state_dict_cfg=fmt,
            model_wrapper=dict(auto_wrap_policy=linear_wrap_policy),
        )
        model = ToyModel()
        optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        lr_scheduler = LinearLR(optimizer=optim)
        model, optim, lr_scheduler = strategy.prepare(
            model=model, optim_wrapper=optim, param_scheduler=lr_scheduler
        )
        sharded = [isinstance(m, FSDPModule) for m in (model, model.linear1, model.linear2)]
        lrs = [optim.get_lr()["lr"][0]]
        data, data_samples = torch.ones(2, 2), torch.zeros(2, 2)
        loss = model(data, data_samples=data_samples, mode="loss")["loss"]
        loss.backward()
        optim.step()
        [scheduler.step() for scheduler in lr_scheduler]
        lrs.append(optim.get_lr()["lr"][0])
        ckpt_path = os.path.join(work_dir, f"checkpoint_{fmt}.pth")
        strategy.save_checkpoint(ckpt_path)
        written = os.path.exists(ckpt_path)
        if fmt == "full":
            ckpt_path = dist.broadcast_object(ckpt_path)
        strategy.load_checkpoint(ckpt_path)
        loss = model(data, data_samples=data_samples, mode="loss")["loss"]
        loss.backward()
        optim.step()
        [scheduler.step() for scheduler in lr_scheduler]
        lrs.append(optim.get_lr()["lr"][0])
        out[fmt] = dict(
            sharded=sharded,
            written=written,
            rank_dir=sorted(os.listdir(rank_dirs[rank])) if fmt == "full" else None,
            lrs=lrs,
            last_step=lr_scheduler[0].last_step,
        )

    # an optimizer with multiple param groups can be reconstructed
    model = ToyModel()
    strategy = FSDPStrategy(
        work_dir=rank_dirs[rank], model_wrapper=dict(auto_wrap_policy=linear_wrap_policy)
    )
    param_groups = [dict(params=[param], lr=0.1) for param in model.parameters()]
    optim = torch.optim.SGD(param_groups, lr=0.1, momentum=0.9)
    lr_scheduler = LinearLR(optimizer=optim, by_epoch=False, end=3)
    model, optim, lr_scheduler = strategy.prepare(
        model=model, optim_wrapper=optim, param_scheduler=lr_scheduler
    )
    data, data_samples = torch.ones(2, 2), torch.zeros(2, 2)
    lrs = [optim.get_lr()["lr"]]
    for _ in range(2):
        model(data, data_samples=data_samples, mode="loss")["loss"].backward()
        optim.step()
        [scheduler.step() for scheduler in lr_scheduler]
        lrs.append(optim.get_lr()["lr"])
    out["groups"] = dict(
        lrs=lrs,
        state=len(optim.optimizer.state_dict()["state"]),
        groups=len(optim.optimizer.param_groups),
    )
    return out


def test_mmengine_run_strategy_scenario(tmp_path):
    shared = tmp_path / "shared"
    rank_dirs = [str(tmp_path / f"rank{r}") for r in range(2)]
    results = run_distributed(_mmengine_run_strategy, 2, str(shared), rank_dirs)
    for rank, result in enumerate(results):
        for fmt in ("local", "full"):
            run = result[fmt]
            assert run["sharded"] == [True, True, True]  # root, linear1, linear2
            # LinearLR(start_factor=1/3, end=INF) warms up, slowly but surely, every step
            assert run["lrs"][0] == pytest.approx(0.1 / 3)
            assert run["lrs"][0] < run["lrs"][1] < run["lrs"][2]
            assert run["last_step"] == 2
        assert result["local"]["written"]  # the shared directory holds rank{i}.pth
        # full: only rank 0 writes; a non-main rank's directory holds no checkpoint
        assert result["full"]["written"] == (rank == 0)
        if rank != 0:
            assert not [f for f in result["full"]["rank_dir"] if "checkpoint" in f]
        groups = result["groups"]
        assert groups["groups"] == 4 and groups["state"] == 4
        assert [lr[0] for lr in groups["lrs"]] == pytest.approx([0.1 / 3, 0.1 * 2 / 3, 0.1])
    assert sorted(os.listdir(tmp_path / "shared" / "checkpoint_local.pth")) == [
        "manifest.json",
        "rank0.pth",
        "rank1.pth",
    ]


def _full_load_with_a_wrong_key(work_dir, path):
    strategy = FSDPStrategy(work_dir=work_dir)
    strategy.prepare(TinyTransformer(layers=1))
    strategy.load_checkpoint(path, strict=True)


def test_a_strict_load_of_a_mismatched_full_checkpoint_fails_on_every_rank(two_ranks, tmp_path):
    work_dir, _ = two_ranks
    with pytest.raises(DistributedTestError) as info:
        run_distributed(_full_load_with_a_wrong_key, 2, str(tmp_path), str(work_dir / "full.ckpt"))
    message = str(info.value)
    assert message.count("unexpected keys: ['blocks.1.fc.bias'") == 2  # rank 1 holds no tensors


def test_a_directory_that_is_no_checkpoint_is_named_with_what_it_holds(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match=r"not a checkpoint.*\['notes.txt'\]"):
        detect_format(tmp_path)
    with pytest.raises(FileNotFoundError, match="nowhere.pth"):
        detect_format(tmp_path / "nowhere.pth")


def test_loading_before_prepare_says_to_prepare_first(tmp_path):
    (tmp_path / "any.pth").write_bytes(b"")  # there: the missing prepare() is what to fix
    strategy = FSDPStrategy(work_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="call prepare\\(\\) first"):
        strategy.load_checkpoint(tmp_path / "any.pth")


def _resume_from_nowhere(work_dir: str) -> dict[str, str]:
    """Every rank's complaint about a checkpoint that is not there, unprepared and prepared."""
    said = {}
    for when in ("unprepared", "prepared"):
        if when == "unprepared":
            strategy = FSDPStrategy(work_dir=work_dir)
        else:
            strategy = _prepare(work_dir, "sharded")[0]
        try:
            strategy.resume("nowhere.pth")
        except FileNotFoundError as exc:
            said[when] = str(exc)
    return said


def test_a_missing_checkpoint_is_named_on_every_rank_before_anything_else(tmp_path):
    for said in run_distributed(_resume_from_nowhere, 2, str(tmp_path), timeout=120):
        for message in (said["unprepared"], said["prepared"]):
            assert "checkpoint 'nowhere.pth' does not exist" in message
            assert str(tmp_path / "nowhere.pth") in message  # where else it was looked for


def _stateless_optimizer_resumes(work_dir):
    """SGD without momentum holds no per-parameter tensors, which torch's full-state-dict
    load cannot handle; every format resumes its param_groups all the same."""
    lrs = {}
    for fmt in FORMATS:
        sgd = dict(optimizer=dict(type="SGD", lr=0.1))
        strategy = FSDPStrategy(work_dir=work_dir, state_dict_cfg=fmt)
        model, wrapper = strategy.prepare(TinyTransformer(), optim_wrapper=sgd)
        wrapper.param_groups[0]["lr"] = 0.05
        strategy.save_checkpoint(f"{fmt}.pth")
        strategy = FSDPStrategy(work_dir=work_dir, state_dict_cfg=fmt)
        model, wrapper = strategy.prepare(TinyTransformer(), optim_wrapper=sgd)
        strategy.resume(f"{fmt}.pth")
        lrs[fmt] = wrapper.param_groups[0]["lr"]
    return lrs


def test_a_stateless_optimizer_resumes_in_every_format(tmp_path):
    for lrs in run_distributed(_stateless_optimizer_resumes, 2, str(tmp_path)):
        assert lrs == {fmt: 0.05 for fmt in FORMATS}


def _saves_with_a_cached_plan(work_dir):
    """Two sharded saves by one strategy, each rank planning its own writes (issue 27: no
    plan goes through rank 0, so DCP's plan cache is left unused), and each checkpoint holds
    the weights of its own moment."""
    from torch.distributed.checkpoint.planner import SavePlanner

    strategy, model, wrapper, schedulers = _prepare(work_dir, "sharded")
    saved = []
    for name in ("a.pth", "b.pth"):
        _steps(strategy, model, wrapper, schedulers, range(2))
        saved.append(full_weights(model))
        strategy.save_checkpoint(name)
    keys = [k for k in SavePlanner._cached_save_plan if k.startswith("shardwise:Checkpointer@")]
    loaded = []
    for name in ("a.pth", "b.pth"):
        fresh, fresh_model, *_ = _prepare(work_dir, "sharded")
        fresh.load_checkpoint(name)
        loaded.append(full_weights(fresh_model))
    same = [all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(saved, loaded)]
    differ = any(not torch.equal(saved[0][k], saved[1][k]) for k in saved[0])
    return {"cached": len(keys), "same": same, "differ": differ}


def test_later_sharded_saves_plan_alone_and_hold_their_own_state(tmp_path):
    for result in run_distributed(_saves_with_a_cached_plan, 2, str(tmp_path)):
        assert result["cached"] == 0  # planned alone: nothing for DCP to cache
        assert result["same"] == [True, True] and result["differ"]


def test_an_optimizer_without_per_parameter_state_resumes_its_hyperparameters_only(
    tmp_path, monkeypatch
):
    """SGD without momentum keeps no state: the resume sets its groups' hyperparameters and
    does not run torch's helper, which would first create state with a zero-gradient step
    (a zeros_like of every parameter: seconds at 1B)."""
    from shardwise.strategies import state_dicts

    def sgd(lr):
        strategy = FSDPStrategy(
            work_dir=str(tmp_path), model_wrapper=dict(auto_wrap_policy={Block})
        )
        model, wrapper = strategy.prepare(
            TinyTransformer(), optim_wrapper=dict(optimizer=dict(type="SGD", lr=lr))
        )
        return strategy, model, wrapper

    strategy, model, wrapper = sgd(0.1)
    train_lm(strategy, model, wrapper, range(2))
    wrapper.optimizer.param_groups[0]["lr"] = 0.05  # as a scheduler would have left it
    strategy.save_checkpoint(str(tmp_path / "ckpt"))
    strategy, model, wrapper = sgd(0.1)
    calls = []
    monkeypatch.setattr(state_dicts, "set_optimizer_state_dict", lambda *a, **k: calls.append(a))
    strategy.resume(str(tmp_path / "ckpt"))
    assert wrapper.optimizer.param_groups[0]["lr"] == 0.05 and not calls
    assert not wrapper.optimizer.state and all(p.grad is None for p in model.parameters())
