"""Nothing lost: a save never deletes what it did not write, and a resume finds the newest
committed checkpoint even when ``last_checkpoint`` is wrong."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

import pytest
import torch

from shardwise.checkpoint import CheckpointError, clean_leftovers, find_last_checkpoint
from shardwise.checkpoint.manifest import manifest_path
from shardwise.strategies import FSDPStrategy, SingleDeviceStrategy
from tests.distributed import run_distributed
from tests.test_fsdp import Block, TinyTransformer
from tests.toy import ToyNet

OPTIM = dict(optimizer=dict(type="SGD", lr=0.1))


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (or ``root`` itself) with the SHA-256 of its bytes."""
    root = Path(root)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _strategy(work_dir, **kwargs) -> SingleDeviceStrategy:
    strategy = SingleDeviceStrategy(work_dir=str(work_dir), **kwargs)
    strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    return strategy


def _user_folder(path: Path) -> Path:
    (path / "plots").mkdir(parents=True)
    (path / "results.csv").write_text("epoch,acc\n1,0.5\n")
    (path / "plots" / "loss.png").write_bytes(os.urandom(256))
    return path


# ----------------------------------------------------------------------------- destinations
@pytest.mark.parametrize("kind", ["folder", "file", "checkpoint without its manifest"])
def test_a_save_onto_something_that_is_not_our_checkpoint_is_refused(tmp_path, kind):
    strategy = _strategy(tmp_path / "run")
    target = tmp_path / "run" / "x.pth"
    if kind == "folder":
        _user_folder(target)
    elif kind == "file":
        target.write_bytes(b"my notes")
    else:
        strategy.save_checkpoint(target)
        manifest_path(target).unlink()
    before = tree_digest(tmp_path)
    with pytest.raises(CheckpointError, match=r"refusing to save to .*x\.pth: .* not a committed"):
        strategy.save_checkpoint("x.pth")
    with pytest.raises(CheckpointError, match="refusing to save"):
        strategy.save_checkpoint("x.pth", async_save=True)
    assert tree_digest(tmp_path) == before


def test_overwriting_our_own_checkpoint_stays_atomic_and_allowed(tmp_path):
    strategy = _strategy(tmp_path)
    strategy.save_checkpoint("x.pth")
    first = tree_digest(tmp_path / "x.pth")
    strategy.model.net[0].weight.data += 1
    strategy.save_checkpoint("x.pth")
    assert tree_digest(tmp_path / "x.pth") != first
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("x")) == [
        "x.pth",
        "x.pth.manifest.json",
    ]


def _save_onto_user_folder(work_dir):
    strategy = FSDPStrategy(work_dir=work_dir, model_wrapper=dict(auto_wrap_policy={Block}))
    strategy.prepare(TinyTransformer(), optim_wrapper=OPTIM)
    try:
        strategy.save_checkpoint("results")
    except CheckpointError as exc:
        return str(exc)
    return None


def test_the_refusal_is_raised_on_every_rank_of_a_sharded_save(tmp_path):
    _user_folder(tmp_path / "results")
    before = tree_digest(tmp_path / "results")
    messages = run_distributed(_save_onto_user_folder, 2, str(tmp_path))
    assert all(m is not None and "refusing to save" in m and "results" in m for m in messages)
    assert tree_digest(tmp_path / "results") == before


def test_cleaning_leftovers_keeps_a_json_file_that_is_not_a_manifest(tmp_path):
    notes = tmp_path / "run.manifest.json"
    notes.write_text('{"my": "notes"}')
    assert clean_leftovers(tmp_path) == []
    assert notes.read_text() == '{"my": "notes"}'


def test_retention_never_deletes_a_retired_path_that_is_no_checkpoint(tmp_path):
    strategy = _strategy(tmp_path, max_keep_ckpts=1)
    strategy.save_checkpoint("iter_1.pth")
    (tmp_path / "iter_1.pth").unlink()
    (tmp_path / "iter_1.pth.manifest.json").unlink()
    _user_folder(tmp_path / "iter_1.pth")  # the name now holds someone's folder
    before = tree_digest(tmp_path / "iter_1.pth")
    strategy.save_checkpoint("iter_2.pth")
    assert tree_digest(tmp_path / "iter_1.pth") == before


# ----------------------------------------------------------------------------- latest
def _saved(work_dir, *names) -> SingleDeviceStrategy:
    strategy = _strategy(work_dir)
    for name in names:
        time.sleep(0.01)  # distinct manifest times
        strategy.save_checkpoint(name)
    return strategy


def test_a_dangling_last_checkpoint_falls_back_to_the_newest_committed(tmp_path, caplog):
    _saved(tmp_path, "iter_1.pth", "iter_2.pth", "iter_3.pth")
    for suffix in ("", ".manifest.json"):
        os.remove(tmp_path / f"iter_3.pth{suffix}")
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        assert find_last_checkpoint(tmp_path) == str(tmp_path / "iter_2.pth")
    assert "iter_3.pth, which does not exist" in caplog.text and "iter_2.pth" in caplog.text


def test_a_checkpoint_committed_after_the_pointer_was_written_wins(tmp_path, caplog):
    _saved(tmp_path, "iter_1.pth", "iter_2.pth")
    # a crash between the commit of iter_2 and the update of last_checkpoint
    pointer = tmp_path / "last_checkpoint"
    pointer.write_text(str(tmp_path / "iter_1.pth"))
    old = manifest_path(tmp_path / "iter_2.pth").stat().st_mtime_ns - 1_000_000
    os.utime(pointer, ns=(old, old))
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        assert find_last_checkpoint(tmp_path) == str(tmp_path / "iter_2.pth")
    assert "committed after it was written" in caplog.text


def test_no_pointer_at_all_still_finds_the_newest(tmp_path):
    _saved(tmp_path, "b.pth", "a.pth")
    (tmp_path / "last_checkpoint").unlink()
    assert find_last_checkpoint(tmp_path) == str(tmp_path / "a.pth")


def test_a_resume_with_a_dangling_pointer_continues_from_the_older_checkpoint(tmp_path):
    strategy = _saved(tmp_path, "iter_1.pth")
    weights = {k: v.clone() for k, v in strategy.model.state_dict().items()}
    strategy.model.net[0].weight.data += 1
    strategy.save_checkpoint("iter_2.pth")
    for suffix in ("", ".manifest.json"):
        os.remove(tmp_path / f"iter_2.pth{suffix}")
    fresh = _strategy(tmp_path)
    assert fresh.load_or_resume(resume=True) is not None
    for key, value in fresh.model.state_dict().items():
        assert torch.equal(value, weights[key]), key


def test_resume_never_restarts_silently_when_checkpoint_lookalikes_are_there(tmp_path, caplog):
    torch.save({"state_dict": ToyNet().state_dict()}, tmp_path / "epoch_3.pth")
    strategy = _strategy(tmp_path)
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        assert strategy.load_or_resume(resume=True) is None
    assert "epoch_3.pth but no committed checkpoint" in caplog.text
    assert "resume='PATH'" in caplog.text


# ----------------------------------------------------------------------------- mismatches
def test_resuming_a_model_of_another_width_is_refused_whole(tmp_path):
    narrow = SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=dict(log_level="ERROR"))
    narrow.prepare(ToyNet(width=16), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.1)))
    x = torch.randn(8, 4)
    narrow.optim_wrapper.update_params(narrow.model(x).pow(2).mean())
    narrow.save_checkpoint("narrow.pth")
    wide = SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=dict(log_level="ERROR"))
    wide.prepare(ToyNet(width=24), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.1)))
    before = {k: v.clone() for k, v in wide.model.state_dict().items()}
    with pytest.raises(CheckpointError, match="refusing to resume") as info:
        wide.resume("narrow.pth")
    assert "net.0.weight (16, 4) vs (24, 4)" in str(info.value)
    assert "nothing was loaded" in str(info.value) and "load_from" in str(info.value)
    assert all(torch.equal(v, before[k]) for k, v in wide.model.state_dict().items())
    assert not wide.optim_wrapper.optimizer.state  # no moments of the other width attached
    wide.optim_wrapper.update_params(wide.model(x).pow(2).mean())  # trains on
    head_bias = wide.model.net[4].bias.clone()
    wide.load_checkpoint("narrow.pth")  # weights only: what fits loads (with a warning)
    assert torch.equal(wide.model.net[4].bias, narrow.model.net[4].bias)
    assert not torch.equal(head_bias, narrow.model.net[4].bias)


def test_an_optimizer_over_other_parameters_is_refused(tmp_path):
    strategy = _strategy(tmp_path)
    strategy.save_checkpoint("all.pth")
    frozen = SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=dict(log_level="ERROR"))
    model = ToyNet()
    optimizer = torch.optim.SGD(model.net[4].parameters(), lr=0.1)  # the head only
    frozen.prepare(model, optim_wrapper=optimizer)
    with pytest.raises(CheckpointError, match=r"optimizer group 0: parameters only in the"):
        frozen.resume("all.pth")


def test_a_different_number_of_schedulers_is_refused_before_anything_loads(tmp_path):
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=dict(log_level="ERROR"))
    strategy.prepare(
        ToyNet(),
        optim_wrapper=OPTIM,
        param_scheduler=[dict(type="ConstantLR", by_epoch=False, end=5)],
    )
    strategy.save_checkpoint("one.pth")
    two = SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=dict(log_level="ERROR"))
    two.prepare(
        ToyNet(),
        optim_wrapper=OPTIM,
        param_scheduler=[
            dict(type="ConstantLR", by_epoch=False, end=5),
            dict(type="StepLR", by_epoch=False, step_size=2, end=5),
        ],
    )
    before = {k: v.clone() for k, v in two.model.state_dict().items()}
    with pytest.raises(CheckpointError, match="parameter schedulers: 1 in the checkpoint, 2"):
        two.resume("one.pth")
    assert all(torch.equal(v, before[k]) for k, v in two.model.state_dict().items())


def _resume_wider_sharded(work_dir, fmt):
    from tests.test_fsdp import TinyTransformer as Model

    def strategy_for(dim):
        strategy = FSDPStrategy(
            work_dir=work_dir,
            state_dict_cfg=fmt,
            model_wrapper=dict(auto_wrap_policy={Block}),
            log_kwargs=dict(log_level="ERROR"),
        )
        strategy.prepare(Model(dim=dim), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.1)))
        return strategy

    strategy_for(16).save_checkpoint(f"narrow_{fmt}")
    wide = strategy_for(24)
    try:
        wide.resume(f"narrow_{fmt}")
    except CheckpointError as exc:
        return str(exc), bool(wide.optim_wrapper.optimizer.state)
    return None, None


@pytest.mark.parametrize("fmt", ["sharded", "full"])
def test_a_sharded_resume_of_another_width_is_refused_on_every_rank(tmp_path, fmt):
    for message, has_state in run_distributed(_resume_wider_sharded, 2, str(tmp_path), fmt):
        assert message is not None and "refusing to resume" in message
        assert "blocks.0.fc.weight (64, 16) vs (96, 24)" in message and "19 more" in message
        assert has_state is False


class _Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, no cleanup."""


def test_a_crash_while_retention_deletes_leaves_no_half_deleted_checkpoint(tmp_path, monkeypatch):
    import shutil

    from shardwise.checkpoint.latest import committed_checkpoints
    from shardwise.checkpoint.verify import verify_checkpoint

    strategy = FSDPStrategy(work_dir=str(tmp_path), max_keep_ckpts=1)  # 1 rank, sharded: dirs
    strategy.prepare(TinyTransformer(), optim_wrapper=OPTIM)
    strategy.save_checkpoint("iter_1")
    real_rmtree = shutil.rmtree

    def dies_halfway(path, *args, **kwargs):
        files = sorted(p for p in Path(path).iterdir() if p.name != "manifest.json")
        files[0].unlink()  # the first file goes, then the process is killed
        raise _Killed

    monkeypatch.setattr(shutil, "rmtree", dies_halfway)
    with pytest.raises(_Killed):
        strategy.save_checkpoint("iter_2")  # committed, then retires iter_1
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert committed_checkpoints(tmp_path) == [tmp_path / "iter_2"]
    assert all(verify_checkpoint(p).ok for p in committed_checkpoints(tmp_path))
    assert find_last_checkpoint(tmp_path) == str(tmp_path / "iter_2")
    assert (tmp_path / ".iter_1.deleted").is_dir()  # moved away whole, then killed
    strategy.save_checkpoint("iter_3")  # the next save removes the leftover
    assert not (tmp_path / ".iter_1.deleted").exists()
