"""Asynchronous saving: training blocks only for staging; the commit protocol still holds.

One two-rank run (the ``two_ranks`` fixture) saves in the background with FSDP (sharded and
full) and DDP while training goes on; the tests below each check one behaviour of its results.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from shardwise.checkpoint import CheckpointError, find_last_checkpoint, staging_path
from shardwise.checkpoint.manifest import MANIFEST, verify_manifest
from shardwise.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy
from tests.distributed import REPO, run_distributed, run_torchrun
from tests.test_fsdp import Block, TinyTransformer, full_weights, train_lm
from tests.toy import ToyNet, train_steps

OPTIM = dict(optimizer=dict(type="AdamW", lr=1e-2))


def _fsdp(work_dir, fmt, **kwargs):
    strategy = FSDPStrategy(
        work_dir=work_dir,
        state_dict_cfg=fmt,
        model_wrapper=dict(auto_wrap_policy={Block}),
        env_kwargs=dict(randomness=dict(seed=7)),
        **kwargs,
    )
    model, wrapper = strategy.prepare(TinyTransformer(), optim_wrapper=OPTIM)
    return strategy, model, wrapper


def _equal(got, want):
    return got.keys() == want.keys() and all(torch.equal(v, want[k]) for k, v in got.items())


def _full_optimizer_state(model, wrapper):
    options = StateDictOptions(full_state_dict=True)
    state = get_optimizer_state_dict(model, wrapper.optimizer, options=options)["state"]
    return {k: {n: v.clone() for n, v in s.items()} for k, s in state.items()}


def _slow_writes(rank, seconds):
    """Make this rank's DCP writes take ``seconds`` longer (the others wait in DCP's
    collectives on the checkpoint group meanwhile)."""
    from shardwise.checkpoint import sharded

    original = sharded._RecordingWriter.write_data

    def slow(self, plan, planner):
        time.sleep(seconds)
        return original(self, plan, planner)

    if int(os.environ["RANK"]) == rank:
        sharded._RecordingWriter.write_data = slow
    return lambda: setattr(sharded._RecordingWriter, "write_data", original)


def _failing_writes(rank):
    from shardwise.checkpoint import sharded

    original = sharded._RecordingWriter.write_data

    def disk_full(self, plan, planner):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.root))

    if int(os.environ["RANK"]) == rank:
        sharded._RecordingWriter.write_data = disk_full
    return lambda: setattr(sharded._RecordingWriter, "write_data", original)


def _count_hashing(strategy, model, wrapper, work_dir):
    """Save synchronously; which files did this rank hash for the manifest?"""
    from shardwise.checkpoint import manifest

    hashed, original = [], manifest.file_checksum

    def counting(path, on_bytes=None):
        hashed.append(Path(path).name)
        return original(path, on_bytes)

    manifest.file_checksum = counting
    strategy.save_checkpoint("hashed.ckpt", async_save=False)
    manifest.file_checksum = original
    return sorted(hashed), verify_manifest(Path(work_dir, "hashed.ckpt"))


def _save_in_the_background(work_dir):
    from shardwise.checkpoint import async_save

    async_save.DEFER_BYTES = 0  # every CPU tensor copied in the background, training fenced
    rank = int(os.environ["RANK"])
    out = {}
    # sharded: the training's collectives run while the save's wait in the background
    strategy, model, wrapper = _fsdp(work_dir, "sharded", async_save=True)
    train_lm(strategy, model, wrapper, range(2), rank, 2)
    out["hashed"], out["hashed_manifest"] = _count_hashing(strategy, model, wrapper, work_dir)
    saved, saved_optim = full_weights(model), _full_optimizer_state(model, wrapper)
    restore = _slow_writes(rank=1, seconds=0.5)
    future = strategy.save_checkpoint("sharded.ckpt")  # async_save=None: the strategy default
    out["returned_before_done"] = not future.done()
    out["future"] = isinstance(future, Future)
    train_lm(strategy, model, wrapper, range(2, 4), rank, 2)  # FSDP collectives meanwhile
    out["trained_while_saving"] = not future.done()
    strategy.wait_for_checkpoint()
    restore()
    out["sharded_path"] = future.result()
    out["trained_differs"] = not all(
        torch.equal(v, saved[k]) for k, v in full_weights(model).items()
    )
    strategy.load_checkpoint("sharded.ckpt")
    out["sharded_weights"] = all(torch.equal(v, saved[k]) for k, v in full_weights(model).items())
    fresh, fresh_model, fresh_wrapper = _fsdp(work_dir, "sharded")
    fresh.resume("sharded.ckpt")
    loaded_optim = _full_optimizer_state(fresh_model, fresh_wrapper)
    out["sharded_optimizer"] = all(
        torch.equal(v, saved_optim[k][n]) for k, s in loaded_optim.items() for n, v in s.items()
    )

    # at most one save in flight: the next save waits for the previous one
    restore = _slow_writes(rank=0, seconds=0.5)
    first = strategy.save_checkpoint("first.ckpt")
    strategy.save_checkpoint("second.ckpt")
    out["first_done_before_second_returned"] = first.done()
    strategy.wait_for_checkpoint()
    restore()
    out["last_after_two"] = find_last_checkpoint(work_dir)

    # a background failure on one rank is raised on every rank at the next wait
    restore = _failing_writes(rank=1)
    strategy.save_checkpoint("broken.ckpt")
    try:
        strategy.wait_for_checkpoint()
    except CheckpointError as exc:
        out["failure"] = str(exc)
    restore()
    out["last_after_failure"] = find_last_checkpoint(work_dir)
    out["broken_leftovers"] = [
        p for p in ("broken.ckpt", staging_path("broken.ckpt").name) if Path(work_dir, p).exists()
    ]

    # full: rank 0 stages to host memory and writes in the background
    strategy, model, wrapper = _fsdp(work_dir, "full")
    train_lm(strategy, model, wrapper, range(2), rank, 2)
    saved = full_weights(model)
    future = strategy.save_checkpoint("full.ckpt", async_save=True)
    train_lm(strategy, model, wrapper, range(2, 4), rank, 2)
    strategy.wait_for_checkpoint()
    checkpoint = torch.load(future.result(), weights_only=True)
    out["full_weights"] = all(torch.equal(checkpoint["state_dict"][k], v) for k, v in saved.items())

    # local: every rank stages its shards and writes rank{i}.pth in the background
    strategy, model, wrapper = _fsdp(work_dir, "local")
    train_lm(strategy, model, wrapper, range(2), rank, 2)
    saved = full_weights(model)
    strategy.save_checkpoint("local.ckpt", async_save=True)
    train_lm(strategy, model, wrapper, range(2, 4), rank, 2)
    strategy.load_checkpoint("local.ckpt")  # waits for the save first
    out["local_weights"] = _equal(full_weights(model), saved)

    # DDP: the same code path as every strategy's full format
    strategy = DDPStrategy(work_dir=work_dir)
    model, wrapper = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    train_steps(model, wrapper, [], range(2), rank)
    saved = {k: v.clone() for k, v in strategy.model_state_dict().items()}
    future = strategy.save_checkpoint("ddp.ckpt", async_save=True)
    train_steps(model, wrapper, [], range(2, 4), rank)
    strategy.wait_for_checkpoint()
    checkpoint = torch.load(future.result(), weights_only=True)
    out["ddp_weights"] = all(torch.equal(checkpoint["state_dict"][k], v) for k, v in saved.items())
    out["manifests"] = {
        name: verify_manifest(Path(work_dir, name))
        for name in ("sharded.ckpt", "second.ckpt", "full.ckpt", "local.ckpt", "ddp.ckpt")
    }
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("async_checkpoints")
    return work_dir, run_distributed(_save_in_the_background, 2, str(work_dir), timeout=240)


def test_an_async_save_returns_a_future_before_the_write_is_done(two_ranks):
    _, results = two_ranks
    for result in results:
        assert result["future"]
        # rank 1's write takes half a second longer: no rank can have committed yet
        assert result["returned_before_done"]
        assert result["trained_while_saving"]  # FSDP's collectives ran beside the save's


def test_an_async_sharded_save_holds_the_state_at_the_moment_of_the_save(two_ranks):
    work_dir, results = two_ranks
    for result in results:
        assert result["sharded_path"] == str(work_dir / "sharded.ckpt")
        assert result["trained_differs"]  # training changed the weights meanwhile
        assert result["sharded_weights"] and result["sharded_optimizer"]


def test_async_full_and_local_saves_hold_the_state_at_the_moment_of_the_save(two_ranks):
    _, results = two_ranks
    assert results[0]["full_weights"] and results[0]["ddp_weights"]
    assert all(result["local_weights"] for result in results)


def test_the_next_save_waits_for_the_one_in_flight(two_ranks):
    work_dir, results = two_ranks
    for result in results:
        assert result["first_done_before_second_returned"]
        assert result["last_after_two"] == str(work_dir / "second.ckpt")


def test_a_background_failure_is_raised_on_every_rank_and_commits_nothing(two_ranks):
    work_dir, results = two_ranks
    for result in results:
        # each rank writes alone (issue 27): the commit tells every rank which one failed
        assert "failed on rank 1" in result["failure"]
        assert "No space left on device" in result["failure"]
        assert result["last_after_failure"] == str(work_dir / "second.ckpt")
        assert result["broken_leftovers"] == []


def test_async_saves_record_a_manifest_that_verifies(two_ranks):
    work_dir, results = two_ranks
    assert results[0]["manifests"] == {
        "sharded.ckpt": [],
        "second.ckpt": [],
        "full.ckpt": [],
        "local.ckpt": [],
        "ddp.ckpt": [],
    }
    assert (work_dir / "full.ckpt.manifest.json").is_file()


def test_single_device_saves_in_the_background_without_a_process_group(tmp_path):
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), async_save=True)
    model, wrapper = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    train_steps(model, wrapper, [], range(2))
    saved = {k: v.clone() for k, v in strategy.model_state_dict().items()}
    future = strategy.save_checkpoint("epoch_1.pth")
    train_steps(model, wrapper, [], range(2, 4))
    assert future.result() == str(tmp_path / "epoch_1.pth")
    strategy.wait_for_checkpoint()
    checkpoint = torch.load(tmp_path / "epoch_1.pth", weights_only=True)
    assert all(torch.equal(checkpoint["state_dict"][k], v) for k, v in saved.items())
    assert strategy.save_checkpoint("epoch_2.pth", async_save=False) is None
    assert find_last_checkpoint(tmp_path) == str(tmp_path / "epoch_2.pth")


_EXIT_WITHOUT_WAITING = """
import os, sys, time
from shardwise.checkpoint import formats, sharded
from shardwise.strategies import FSDPStrategy, SingleDeviceStrategy
from tests.test_fsdp import Block, TinyTransformer, train_lm

rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
if world_size == 1:
    strategy = SingleDeviceStrategy(work_dir=sys.argv[1])
else:
    strategy = FSDPStrategy(work_dir=sys.argv[1], model_wrapper=dict(auto_wrap_policy={Block}))
optim = dict(optimizer=dict(type="SGD", lr=0.1))
model, wrapper = strategy.prepare(TinyTransformer(), optim_wrapper=optim)
train_lm(strategy, model, wrapper, range(2), rank, world_size)

def slowed(write):  # still writing when the script's last line has run
    def slow(*args):
        time.sleep(2.0)
        return write(*args)
    return slow

if rank == world_size - 1:
    sharded._RecordingWriter.write_data = slowed(sharded._RecordingWriter.write_data)
    formats.save_full_checkpoint = slowed(formats.save_full_checkpoint)
future = strategy.save_checkpoint("at_exit.ckpt", async_save=True)
print(f"rank {rank} done before exit: {future.done()}", flush=True)
"""


@pytest.mark.parametrize("world_size", [1, 2], ids=["one process", "FSDP on 2 ranks"])
def test_interpreter_exit_waits_for_the_save_in_flight_and_commits_it(tmp_path, world_size):
    script = tmp_path / "exit_without_waiting.py"
    script.write_text(_EXIT_WITHOUT_WAITING)
    work_dir = tmp_path / "work"
    if world_size == 1:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        command = [sys.executable, str(script), str(work_dir)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
    else:
        env = {"PYTHONPATH": str(REPO)}
        proc = run_torchrun(script, 2, str(work_dir), timeout=180, env=env, cwd=tmp_path)
    for rank in range(world_size):
        assert f"rank {rank} done before exit: False" in proc.stdout
    assert find_last_checkpoint(work_dir) == str(work_dir / "at_exit.ckpt")
    assert verify_manifest(work_dir / "at_exit.ckpt") == []
    assert not staging_path(work_dir / "at_exit.ckpt").exists()


def test_later_saves_refill_the_host_buffers_of_the_first(tmp_path, monkeypatch):
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), async_save=True)
    model, wrapper = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    staged = []
    original = strategy.checkpointer.stager.stage
    monkeypatch.setattr(
        strategy.checkpointer.stager, "stage", lambda s: staged.append(original(s)) or staged[-1]
    )
    expected = []
    for i in range(3):
        train_steps(model, wrapper, [], range(2 * i, 2 * i + 2))
        expected.append({k: v.clone() for k, v in strategy.model_state_dict().items()})
        strategy.save_checkpoint(f"iter_{i}.pth")
        train_steps(model, wrapper, [], range(10, 11))  # changes the weights while it writes
        strategy.wait_for_checkpoint()
    for i in range(3):
        checkpoint = torch.load(tmp_path / f"iter_{i}.pth", weights_only=True)
        assert _equal(checkpoint["state_dict"], expected[i])
    pointers = [{k: t.data_ptr() for k, t in s["state_dict"].items()} for s in staged]
    assert pointers[0] == pointers[1] == pointers[2]  # the same host memory, refilled


def test_each_rank_hashes_its_files_while_writing_them_and_reads_none_back(two_ranks):
    work_dir, (rank0, rank1) = two_ranks
    assert rank0["hashed"] == rank1["hashed"] == []  # no file read back for the manifest
    assert rank0["hashed_manifest"] == []  # ... and the manifest verifies against the disk
    manifest = json.loads((work_dir / "hashed.ckpt" / MANIFEST).read_text())
    assert sorted(manifest["files"]) == [
        "__0.metadata",
        "__0_0.distcp",
        "__1.metadata",
        "__1_0.distcp",
        "layout.json",
        "meta.pt",
    ]


def test_async_save_must_be_a_bool(tmp_path):
    with pytest.raises(TypeError, match="async_save must be True or False"):
        SingleDeviceStrategy(work_dir=str(tmp_path), async_save="yes")


def test_staging_copies_a_shared_tensor_once_and_keeps_the_containers():
    from collections import namedtuple

    from shardwise.checkpoint.async_save import AsyncCheckpointer

    Pair = namedtuple("Pair", "count values")
    tied = torch.randn(3)
    state = {"embed": tied, "head": tied, "pair": Pair(2, torch.ones(2)), "note": ["x", (1, 2)]}
    staged = AsyncCheckpointer().stage(state)
    assert staged["embed"] is staged["head"]  # tied weights stay tied, copied once
    assert torch.equal(staged["embed"], tied) and staged["embed"].data_ptr() != tied.data_ptr()
    assert isinstance(staged["pair"], Pair) and torch.equal(staged["pair"].values, torch.ones(2))
    assert staged["note"] == ["x", (1, 2)]
    tied.add_(1)  # training goes on: the staged copy does not change
    assert not torch.equal(staged["embed"], tied)


# ----------------------------------------------------------------------------- background staging
def _slow_copies(monkeypatch, checkpointer, seconds=0.5):
    """Leave every CPU tensor to the background copy, and make that copy start late."""
    from shardwise.checkpoint import async_save

    monkeypatch.setattr(async_save, "DEFER_BYTES", 0)
    original = checkpointer.copy_staged

    def slow():
        time.sleep(seconds)
        original()

    monkeypatch.setattr(checkpointer, "copy_staged", slow)


def test_training_runs_while_the_state_is_copied_and_the_optimizer_step_waits(
    tmp_path, monkeypatch
):
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), async_save=True)
    model, wrapper = strategy.prepare(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)), optim_wrapper=OPTIM
    )
    train_steps(model, wrapper, [], range(2))
    saved = {k: v.clone() for k, v in strategy.model_state_dict().items()}
    _slow_copies(monkeypatch, strategy.checkpointer.stager)
    strategy.save_checkpoint("iter_2.pth")
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    loss = (model(x) - y).pow(2).mean()
    loss.backward()  # a model without buffers: forward and backward do not wait
    assert strategy.checkpointer.stager.staging_wait_s == 0.0
    wrapper.step()  # waits for the copies, then changes the weights
    assert strategy.checkpointer.stager.staging_wait_s > 0.2
    assert not _equal(strategy.model_state_dict(), saved)
    strategy.wait_for_checkpoint()
    checkpoint = torch.load(tmp_path / "iter_2.pth", weights_only=True)
    assert _equal(checkpoint["state_dict"], saved)  # the weights of the moment of the save


def test_the_forward_of_a_model_with_buffers_waits_for_the_copies(tmp_path, monkeypatch):
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), async_save=True)
    model, wrapper = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    train_steps(model, wrapper, [], range(2))
    saved = {k: v.clone() for k, v in strategy.model_state_dict().items()}
    _slow_copies(monkeypatch, strategy.checkpointer.stager)
    strategy.save_checkpoint("iter_2.pth")
    model(torch.randn(16, 4))  # BatchNorm updates its running statistics: after the copies
    assert strategy.checkpointer.stager.staging_wait_s > 0.2
    assert not torch.equal(model.net[1].running_mean, saved["net.1.running_mean"])
    strategy.wait_for_checkpoint()
    checkpoint = torch.load(tmp_path / "iter_2.pth", weights_only=True)
    assert _equal(checkpoint["state_dict"], saved)


def test_a_failed_background_copy_releases_training_and_is_raised_at_the_wait(
    tmp_path, monkeypatch
):
    from shardwise.checkpoint import async_save

    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), async_save=True)
    model, wrapper = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    strategy.save_checkpoint("good.pth", async_save=False)
    monkeypatch.setattr(async_save, "DEFER_BYTES", 0)
    checkpointer = strategy.checkpointer.stager
    original = checkpointer.copy_staged

    def broken():  # one copy of mismatched sizes among the others
        checkpointer._pending.insert(0, (torch.empty(1), torch.empty(2)))
        original()

    monkeypatch.setattr(checkpointer, "copy_staged", broken)
    strategy.save_checkpoint("broken.pth")
    train_steps(model, wrapper, [], range(2))  # neither forward nor the step hangs
    with pytest.raises(CheckpointError, match="broken.pth"):
        strategy.wait_for_checkpoint()
    assert find_last_checkpoint(tmp_path) == str(tmp_path / "good.pth")
    assert not (tmp_path / "broken.pth").exists()


def test_staged_dtensors_of_a_cuda_mesh_keep_their_shards_in_host_memory():
    """On a GPU, FSDP's DTensors live on a 'cuda' mesh; their staged copies must stay in the
    (pinned) host buffers. DTensor.from_local moved each buffer back to the mesh's device: a
    second copy of the state in GPU memory, written from there. A 'cuda' mesh that starts no
    backend shows it on a CPU-only machine (the move raised 'not compiled with CUDA')."""
    import torch.distributed as torch_dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    from shardwise.checkpoint.async_save import AsyncCheckpointer

    torch_dist.init_process_group("gloo", store=torch_dist.HashStore(), rank=0, world_size=1)
    mesh = DeviceMesh("cuda", [0], _init_backend=False)
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    local = torch.arange(6.0).reshape(3, 2)  # the shard: in host memory in this stand-in
    meta = TensorMeta(local.shape, local.stride(), local.dtype)
    weight = DTensor(local, DTensorSpec(mesh, (Shard(0),), meta), requires_grad=False)
    checkpointer = AsyncCheckpointer()
    for _ in range(2):  # the second save reuses the buffer and its DTensor
        staged = checkpointer.stage({"weight": weight})["weight"]
        assert isinstance(staged, DTensor) and staged.device_mesh is mesh
        assert staged.placements == (Shard(0),) and staged.shape == weight.shape
        shard = staged.to_local()
        assert shard.device.type == "cpu" and shard.data_ptr() != local.data_ptr()
        assert torch.equal(shard, local)
