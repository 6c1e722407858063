"""The commit protocol: only complete checkpoints become visible; failures leave the old one."""

import os
from pathlib import Path

import pytest
import torch

from shardwise.checkpoint import (
    CheckpointCommit,
    CheckpointError,
    clean_leftovers,
    find_last_checkpoint,
    staging_path,
)
from tests.distributed import DistributedTestError, run_distributed


def _save(path, work_dir, value):
    with CheckpointCommit(path, work_dir=work_dir) as staging:
        torch.save({"value": value}, staging)


def test_a_committed_checkpoint_is_recorded_in_last_checkpoint(tmp_path):
    _save(tmp_path / "epoch_1.pth", tmp_path, 1)
    assert find_last_checkpoint(tmp_path) == str(tmp_path / "epoch_1.pth")
    assert torch.load(tmp_path / "epoch_1.pth", weights_only=True) == {"value": 1}
    assert not staging_path(tmp_path / "epoch_1.pth").exists()


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path):
    _save(tmp_path / "ckpt.pth", tmp_path, 1)
    with pytest.raises(CheckpointError, match="saving .*ckpt.pth failed on rank"):
        with CheckpointCommit(tmp_path / "ckpt.pth", work_dir=tmp_path) as staging:
            staging.write_bytes(b"half written")
            raise OSError(28, "No space left on device")
    assert torch.load(tmp_path / "ckpt.pth", weights_only=True) == {"value": 1}
    assert find_last_checkpoint(tmp_path) == str(tmp_path / "ckpt.pth")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt.pth",
        "ckpt.pth.manifest.json",  # the checksums recorded when ckpt.pth was committed
        "last_checkpoint",
    ]


def test_overwriting_a_checkpoint_replaces_it_whole(tmp_path):
    _save(tmp_path / "ckpt.pth", tmp_path, 1)
    _save(tmp_path / "ckpt.pth", tmp_path, 2)
    assert torch.load(tmp_path / "ckpt.pth", weights_only=True) == {"value": 2}


def test_the_next_save_cleans_leftovers_of_a_crashed_one(tmp_path):
    leftover = staging_path(tmp_path / "iter_5")
    leftover.mkdir()
    (leftover / "rank0.distcp").write_bytes(b"x")
    _save(tmp_path / "iter_10.pth", tmp_path, 10)
    assert not leftover.exists()
    assert clean_leftovers(tmp_path) == []


def test_last_checkpoint_pointing_at_a_missing_path_is_ignored(tmp_path):
    (tmp_path / "last_checkpoint").write_text(str(tmp_path / "gone.pth"))
    assert find_last_checkpoint(tmp_path) is None


def _save_directory_on_every_rank(path, fail_rank):
    import torch.distributed as dist

    rank = dist.get_rank()
    with CheckpointCommit(path, work_dir=Path(path).parent, is_dir=True) as staging:
        if rank == fail_rank:
            raise PermissionError(13, "Permission denied", str(staging))
        torch.save({"rank": rank}, staging / f"rank{rank}.pth")
    return sorted(os.listdir(path))


def test_every_rank_writes_then_the_directory_is_committed(tmp_path):
    results = run_distributed(
        _save_directory_on_every_rank, 2, str(tmp_path / "ckpt"), -1, init_pg=True
    )
    assert results == [["manifest.json", "rank0.pth", "rank1.pth"]] * 2
    assert find_last_checkpoint(tmp_path) == str(tmp_path / "ckpt")


def test_a_failure_on_one_rank_is_raised_on_every_rank(tmp_path):
    with pytest.raises(DistributedTestError) as info:
        run_distributed(_save_directory_on_every_rank, 2, str(tmp_path / "ckpt"), 1, init_pg=True)
    message = str(info.value)
    assert "rank 0 failed" in message and "rank 1 failed" in message
    assert message.count("Permission denied") >= 2
    assert not (tmp_path / "ckpt").exists()
    assert not staging_path(tmp_path / "ckpt").exists()
    assert find_last_checkpoint(tmp_path) is None


def _agree(fail_rank):
    """Each step's outcome on this rank: its result, or its exception as 'Type: message'."""
    import torch.distributed as dist

    from shardwise.checkpoint.agreement import on_every_rank, on_rank0

    rank = dist.get_rank()

    def step(fail_on):
        def fn():
            if rank == fail_on:
                raise ValueError(f"bad bytes on rank {rank}\nsecond line")
            return f"from rank {rank}"

        return fn

    outcomes = {}
    for name, run in {
        "every": lambda: on_every_rank(step(fail_rank), "reading x"),
        "rank0": lambda: on_rank0(step(fail_rank)),
    }.items():
        try:
            outcomes[name] = run()
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test compares
            outcomes[name] = f"{type(exc).__name__}: {exc}"
    return outcomes


def test_the_ranks_agree_on_a_step_that_fails_on_one_of_them():
    """on_every_rank: the failed rank raises its own exception, the others a CheckpointError
    naming it (one line); on_rank0: rank 0's result, or its exception, on every rank."""
    ok, fails_on_1, fails_on_0 = (run_distributed(_agree, 2, r, init_pg=True) for r in (-1, 1, 0))
    assert ok == [
        {"every": "from rank 0", "rank0": "from rank 0"},
        {"every": "from rank 1", "rank0": "from rank 0"},
    ]
    assert fails_on_1[0]["every"] == (
        "CheckpointError: reading x failed on rank 1: ValueError: bad bytes on rank 1"
    )
    assert fails_on_1[1]["every"] == "ValueError: bad bytes on rank 1\nsecond line"
    assert [r["rank0"] for r in fails_on_1] == ["from rank 0"] * 2
    assert [r["rank0"] for r in fails_on_0] == ["ValueError: bad bytes on rank 0\nsecond line"] * 2


def test_without_a_process_group_a_step_runs_alone():
    from shardwise.checkpoint.agreement import on_every_rank, on_rank0

    assert on_every_rank(lambda: 3) == 3 and on_rank0(lambda: 4) == 4
    with pytest.raises(KeyError, match="x"):
        on_every_rank(lambda: {}["x"])
