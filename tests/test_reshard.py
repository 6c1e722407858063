"""Resharding and portability: a checkpoint saved on N ranks resumes on M ranks, under any
strategy, with the same model weights and optimizer state; training goes on from there.

The ``saved`` fixture chains the runs: FSDP on 2 ranks saves (and DDP on 2 ranks resumes it
and saves a full checkpoint FSDP loads back), FSDP on 1 rank resumes that and saves again,
FSDP on 2 ranks resumes the 1-rank checkpoint and a single-device one. Each test checks one
link of the chain against the state gathered when the checkpoint was saved.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from shardwise.checkpoint import CheckpointError
from shardwise.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy
from tests.distributed import run_distributed
from tests.test_fsdp import Block, TinyTransformer, lm_batch, train_lm

OPTIM = dict(optimizer=dict(type="AdamW", lr=1e-2, weight_decay=0.01))
_FULL = StateDictOptions(full_state_dict=True)


# ----------------------------------------------------------------------------- helpers
def _fsdp(work_dir, fmt="sharded"):
    strategy = FSDPStrategy(
        work_dir=work_dir,
        state_dict_cfg=fmt,
        model_wrapper=dict(auto_wrap_policy={Block}),
        env_kwargs=dict(randomness=dict(seed=7)),
    )
    return strategy, *strategy.prepare(TinyTransformer(dropout=0.1), optim_wrapper=OPTIM)


def _ddp(work_dir):
    strategy = DDPStrategy(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=7)))
    return strategy, *strategy.prepare(TinyTransformer(dropout=0.1), optim_wrapper=OPTIM)


def _single(work_dir):
    strategy = SingleDeviceStrategy(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=7)))
    return strategy, *strategy.prepare(TinyTransformer(dropout=0.1), optim_wrapper=OPTIM)


def _state(model, wrapper):
    """Weights and optimizer state as full tensors (gathered from the shards), by name."""
    weights = get_model_state_dict(model, options=_FULL)
    optim = get_optimizer_state_dict(model, wrapper.optimizer, options=_FULL)
    return dict(
        weights={k: v.detach().cpu().clone() for k, v in weights.items()},
        optimizer={
            name: {k: v.detach().cpu().clone() for k, v in per_param.items()}
            for name, per_param in optim["state"].items()
        },
        lrs=[group["lr"] for group in optim["param_groups"]],
    )


def _outputs(model):
    model.eval()
    with torch.no_grad():
        out = model(lm_batch(99)[0]).detach().cpu().clone()
    model.train()
    return out


def _snapshot(strategy, model, wrapper):
    return dict(**_state(model, wrapper), outputs=_outputs(model))


def _goes_on(strategy, model, wrapper):
    """Two more training steps run and change the weights."""
    before = _state(model, wrapper)["weights"]
    losses = train_lm(strategy, model, wrapper, range(10, 12), strategy.rank, strategy.world_size)
    after = _state(model, wrapper)["weights"]
    return all(torch.isfinite(torch.tensor(losses[0]))) and any(
        not torch.equal(after[k], v) for k, v in before.items()
    )


def _rng_warnings(strategy):
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    strategy.logger.addHandler(handler)
    return records


def _resume(strategy, model, wrapper, path):
    warnings = _rng_warnings(strategy)
    strategy.resume(path)
    draw = torch.rand(4)  # what the first dropout mask would draw from
    return dict(
        **_snapshot(strategy, model, wrapper),
        draw=draw,
        rng_warning=[w for w in warnings if "RNG states are not restored" in w],
        goes_on=_goes_on(strategy, model, wrapper),
    )


def equal_states(got, want):
    """Same weights and optimizer state, bit for bit; same outputs up to reduction order."""
    assert got["weights"].keys() == want["weights"].keys()
    for k, v in want["weights"].items():
        assert torch.equal(got["weights"][k], v), k
    assert got["optimizer"].keys() == want["optimizer"].keys()
    for name, per_param in want["optimizer"].items():
        for key, value in per_param.items():
            assert torch.equal(got["optimizer"][name][key], value), (name, key)
    assert got["lrs"] == want["lrs"]
    torch.testing.assert_close(got["outputs"], want["outputs"])


# ----------------------------------------------------------------------------- the runs
def _save_on_two_ranks(work_dir):
    """FSDP x2 saves sharded and local; DDP x2 resumes the sharded one and saves full; FSDP
    x2 loads the DDP checkpoint (rank 0 reads it, the others never open it)."""
    out = {}
    strategy, model, wrapper = _fsdp(work_dir)
    train_lm(strategy, model, wrapper, range(3), strategy.rank, 2)
    torch.rand(1 + strategy.rank)  # each rank's RNG in its own state
    strategy.save_checkpoint("fsdp2.ckpt")
    out["fsdp2"] = _snapshot(strategy, model, wrapper)
    out["fsdp2_draw"] = torch.rand(4)  # the RNG state saved is the one before this draw
    local, model, wrapper = _fsdp(work_dir, "local")
    local.resume("fsdp2.ckpt")
    local.save_checkpoint("local2.ckpt")

    strategy, model, wrapper = _ddp(work_dir)
    out["ddp_from_fsdp2"] = _resume(strategy, model, wrapper, "fsdp2.ckpt")
    strategy.save_checkpoint("ddp2.ckpt")
    out["ddp2"] = _snapshot(strategy, model, wrapper)

    import shardwise.checkpoint.formats as formats_module

    reads = []
    original = formats_module.load_full_checkpoint
    formats_module.load_full_checkpoint = lambda *a, **k: reads.append(a[0]) or original(*a, **k)
    strategy, model, wrapper = _fsdp(work_dir)
    out["fsdp2_from_ddp2"] = _resume(strategy, model, wrapper, "ddp2.ckpt")
    out["full_reads"] = len(reads)
    formats_module.load_full_checkpoint = original
    return out


def _resume_on_one_rank(work_dir):
    out = {}
    strategy, model, wrapper = _fsdp(work_dir)
    out["fsdp1_from_fsdp2"] = _resume(strategy, model, wrapper, "fsdp2.ckpt")
    strategy.resume("fsdp2.ckpt")  # back to the saved state, then save it on one rank
    strategy.save_checkpoint("fsdp1.ckpt")
    out["fsdp1"] = _snapshot(strategy, model, wrapper)
    try:
        strategy.resume("local2.ckpt")
    except CheckpointError as exc:
        out["local_error"] = str(exc)
    return out


def _counting_reads(counter):
    """Count the bytes every DCP record view hands out (``counter['bytes']``), and list the
    file ranges read into tensors (``counter['ranges']``, (file offset, bytes))."""
    from shardwise.checkpoint.safe_dcp import SafeFileSystemReader

    original = SafeFileSystemReader._slice_file

    def counted(self, stream, info):
        view = original(self, stream, info)
        read, readinto = view.read, view.readinto

        def count_read(size=-1):
            data = read(size)
            counter["bytes"] += len(data)
            return data

        def count_readinto(buffer):
            start = info.offset + view.tell()
            n = readinto(buffer)
            counter["bytes"] += n or 0
            counter.setdefault("ranges", []).append((start, n or 0))
            return n

        view.read, view.readinto = count_read, count_readinto
        return view

    SafeFileSystemReader._slice_file = counted
    return lambda: setattr(SafeFileSystemReader, "_slice_file", original)


def _resume_on_two_ranks(work_dir):
    out = {}
    for name in ("fsdp1", "single"):
        strategy, model, wrapper = _fsdp(work_dir)
        out[f"fsdp2_from_{name}"] = _resume(strategy, model, wrapper, f"{name}.ckpt")
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("reshard")
    results = {"two": run_distributed(_save_on_two_ranks, 2, str(work_dir), timeout=240)}
    # one CPU, no process group: reads the sharded checkpoint whole, saves a full one
    strategy, model, wrapper = _single(str(work_dir))
    results["single_from_fsdp2"] = _resume(strategy, model, wrapper, work_dir / "fsdp2.ckpt")
    strategy.resume(work_dir / "fsdp2.ckpt")
    strategy.save_checkpoint("single.ckpt")
    results["single"] = _snapshot(strategy, model, wrapper)
    results["one"] = run_distributed(_resume_on_one_rank, 1, str(work_dir), timeout=240)[0]
    results["two_again"] = run_distributed(_resume_on_two_ranks, 2, str(work_dir), timeout=240)
    return work_dir, results


# ----------------------------------------------------------------------------- the tests
def test_a_sharded_checkpoint_loads_on_fewer_ranks(saved):
    _, results = saved
    equal_states(results["one"]["fsdp1_from_fsdp2"], results["two"][0]["fsdp2"])
    assert results["one"]["fsdp1_from_fsdp2"]["goes_on"]


def test_a_sharded_checkpoint_loads_on_more_ranks(saved):
    _, results = saved
    for rank_result in results["two_again"]:
        equal_states(rank_result["fsdp2_from_fsdp1"], results["one"]["fsdp1"])
        assert rank_result["fsdp2_from_fsdp1"]["goes_on"]


def test_a_sharded_checkpoint_loads_under_ddp_and_on_one_cpu(saved):
    _, results = saved
    want = results["two"][0]["fsdp2"]
    for rank_result in results["two"]:
        equal_states(rank_result["ddp_from_fsdp2"], want)
        assert rank_result["ddp_from_fsdp2"]["goes_on"]
    equal_states(results["single_from_fsdp2"], want)
    assert results["single_from_fsdp2"]["goes_on"]


def test_full_checkpoints_of_ddp_and_single_device_load_into_fsdp(saved):
    _, results = saved
    for rank_result in results["two"]:
        equal_states(rank_result["fsdp2_from_ddp2"], results["two"][0]["ddp2"])
        assert rank_result["fsdp2_from_ddp2"]["goes_on"]
    for rank_result in results["two_again"]:
        equal_states(rank_result["fsdp2_from_single"], results["single"])


def test_only_rank_0_reads_a_full_checkpoint_into_fsdp(saved):
    _, results = saved
    assert [r["full_reads"] for r in results["two"]] == [1, 0]  # the others get a broadcast


def test_rng_states_are_restored_on_the_same_world_size(saved):
    _, results = saved
    for rank_result in results["two"]:
        ddp = rank_result["ddp_from_fsdp2"]
        assert torch.equal(ddp["draw"], rank_result["fsdp2_draw"])  # each rank its own state
        assert ddp["rng_warning"] == []
    assert not torch.equal(results["two"][0]["fsdp2_draw"], results["two"][1]["fsdp2_draw"])


def test_rng_states_are_reseeded_with_a_warning_on_another_world_size(saved):
    _, results = saved
    for result in (results["one"]["fsdp1_from_fsdp2"], results["single_from_fsdp2"]):
        assert result["rng_warning"] == [
            "The checkpoint was saved on 2 ranks and is resumed on 1: RNG states are not "
            "restored; every rank is reseeded from seed 7 instead"
        ]


def test_a_local_checkpoint_on_another_world_size_says_how_to_convert_it(saved):
    _, results = saved
    message = results["one"]["local_error"]
    assert "files for ranks [0, 1], but this run has 1 rank(s)" in message
    assert "load it there with FSDPStrategy and save with state_dict_cfg='sharded'" in message


# ----------------------------------------------------------------------------- 2 <-> 4 ranks
def _save_sharded(work_dir, name):
    strategy, model, wrapper = _fsdp(work_dir)
    train_lm(strategy, model, wrapper, range(3), strategy.rank, strategy.world_size)
    strategy.save_checkpoint(name)
    return _snapshot(strategy, model, wrapper)


def _resume_sharded(work_dir, name):
    strategy, model, wrapper = _fsdp(work_dir)
    return _resume(strategy, model, wrapper, name)


def _wide_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(4)))


def _save_wide(work_dir):
    strategy = FSDPStrategy(
        work_dir=work_dir, model_wrapper=dict(auto_wrap_policy={torch.nn.Linear})
    )
    model, wrapper = strategy.prepare(_wide_model(), optim_wrapper=OPTIM)
    wrapper.update_params(model(torch.randn(8, 256)).square().mean())
    strategy.save_checkpoint("wide.ckpt")
    return _state(model, wrapper)


def _resume_wide_counting_reads(work_dir):
    strategy = FSDPStrategy(
        work_dir=work_dir, model_wrapper=dict(auto_wrap_policy={torch.nn.Linear})
    )
    model, wrapper = strategy.prepare(_wide_model(), optim_wrapper=OPTIM)
    counter = {"bytes": 0}
    restore = _counting_reads(counter)
    hints = []
    fadvise = os.posix_fadvise
    os.posix_fadvise = lambda fd, start, n, advice: (
        hints.append((start, n)) or fadvise(fd, start, n, advice)
    )
    try:
        strategy.resume("wide.ckpt")
    finally:
        restore()
        os.posix_fadvise = fadvise
    return counter, hints, _state(model, wrapper)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="the read-ahead hints are POSIX's")
def test_each_of_more_ranks_reads_only_its_part_of_the_stored_tensors(tmp_path):
    saved = run_distributed(_save_wide, 1, str(tmp_path))[0]
    stored = sum(p.stat().st_size for p in (tmp_path / "wide.ckpt").glob("*.distcp"))
    for counter, hints, state in run_distributed(_resume_wide_counting_reads, 2, str(tmp_path)):
        read = counter["bytes"]
        # DCP's own reader hands every rank each stored record whole: all of the bytes
        assert 0.45 * stored < read < 0.55 * stored, (read, stored)
        # the kernel was asked beforehand for each range read into a tensor, and little more
        for start, n in counter["ranges"]:
            assert any(s <= start and start + n <= s + k for s, k in hints), (start, n)
        assert sum(k for _, k in hints) < 0.6 * stored
        assert all(torch.equal(v, saved["weights"][k]) for k, v in state["weights"].items())
        for name, per_param in state["optimizer"].items():
            assert all(torch.equal(v, saved["optimizer"][name][k]) for k, v in per_param.items())


@pytest.mark.slow
@pytest.mark.parametrize("saved_on, resumed_on", [(2, 4), (4, 2)])
def test_a_sharded_checkpoint_reshards_between_two_and_four_ranks(tmp_path, saved_on, resumed_on):
    want = run_distributed(_save_sharded, saved_on, str(tmp_path), "ckpt", timeout=240)[0]
    results = run_distributed(_resume_sharded, resumed_on, str(tmp_path), "ckpt", timeout=240)
    for result in results:
        equal_states(result, want)
        assert result["goes_on"]
        assert len(result["rng_warning"]) == 1


def test_the_world_size_is_recorded_for_resharding(saved):
    work_dir, _ = saved
    from shardwise.checkpoint.formats import read_checkpoint

    assert read_checkpoint(work_dir / "fsdp2.ckpt")["meta"]["world_size"] == 2
    assert read_checkpoint(work_dir / "fsdp1.ckpt")["meta"]["world_size"] == 1
    assert os.path.isfile(work_dir / "single.ckpt")
