"""The memory tier (``memory_checkpoint``): snapshots in node-local memory every step,
replicated to the other simulated node, recovered from memory and peers bit for bit."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from shardwise.checkpoint.memory import (
    MARKER,
    Topology,
    list_snapshots,
    parse_memory_checkpoint,
)
from tests.distributed import DistributedTestError, run_distributed
from tests.memory_trials import memory_config, memory_loop


def _run_dir(node):
    """The one run's directory in a node's memory directory."""
    (run,) = node.glob("run-*")
    return run


def _same_run(resumed, reference):
    for rank, result in enumerate(resumed):
        for step, loss in result["losses"].items():
            assert loss == reference[rank]["losses"][step], (rank, step)
    for key, tensor in resumed[0]["weights"].items():
        assert (tensor == reference[0]["weights"][key]).all(), key


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted 4-rank run (2 nodes of 2 ranks), 8 steps."""
    return run_distributed(memory_loop, 4, str(tmp_path_factory.mktemp("reference")), 8)


def test_topology_puts_each_replica_on_another_node():
    top = [Topology(rank, 4, 2, 1) for rank in range(4)]
    assert [t.sends_to() for t in top] == [[2], [3], [0], [1]]
    assert [t.receives_from() for t in top] == [[2], [3], [0], [1]]
    assert Topology(0, 2, 2, 1).copies == 0  # one node: nowhere else to keep a copy
    assert Topology(0, 6, 2, 5).copies == 2  # at most one copy in each other node


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (dict(interval=0), "interval=0"),
        (dict(replicas=-1), "replicas=-1"),
        (dict(intervall=2), "unknown keys ['intervall']"),
        (dict(failure_domain="rack"), "failure_domain='rack'"),
        ("yes", "must be a dict"),
    ],
)
def test_bad_memory_checkpoint_values_are_named(value, words):
    with pytest.raises((TypeError, ValueError), match=None) as info:
        parse_memory_checkpoint(value)
    assert words in str(info.value)


def test_every_node_keeps_its_ranks_snapshots_and_the_other_nodes_replicas(tmp_path):
    run_distributed(memory_loop, 4, str(tmp_path), 3)
    for node in ("node0", "node1"):
        found = list_snapshots(_run_dir(tmp_path / node))
        assert {m["owner"] for m in found} == {0, 1, 2, 3}  # its own ranks', the other's replicas
        assert sorted(m["step"] for m in found if m["owner"] == 0) == [2, 3]


def test_a_restart_resumes_from_memory_bit_for_bit(tmp_path, reference):
    run_distributed(memory_loop, 4, str(tmp_path), 5, save_at=(4,))  # storage has step 4
    resumed = run_distributed(memory_loop, 4, str(tmp_path), 8, resume=True)
    assert [r["start"] for r in resumed] == [5] * 4
    assert {r["tier"] for r in resumed} == {"memory"}
    _same_run(resumed, reference)


def test_a_lost_node_is_recovered_from_its_replicas(tmp_path, reference):
    run_distributed(memory_loop, 4, str(tmp_path), 5)
    shutil.rmtree(tmp_path / "node1")  # the node and its memory are gone
    resumed = run_distributed(memory_loop, 4, str(tmp_path), 8, resume=True)
    assert [r["start"] for r in resumed] == [5] * 4
    _same_run(resumed, reference)


def test_a_half_written_snapshot_is_never_resumed(tmp_path, reference):
    run_distributed(memory_loop, 4, str(tmp_path), 5)
    for node in ("node0", "node1"):  # rank 1's step 5 lost its marker everywhere
        for marker in (tmp_path / node).glob("*/rank1/slot*/" + MARKER):
            if '"step": 5' in marker.read_text():
                marker.unlink()
    resumed = run_distributed(memory_loop, 4, str(tmp_path), 8, resume=True)
    assert [r["start"] for r in resumed] == [4] * 4
    _same_run(resumed, reference)


def test_a_replica_older_than_the_local_copy_is_used_only_when_the_local_copy_is_lost(
    tmp_path, reference
):
    for run, lost in (("kept", None), ("lost", "node1")):
        root = tmp_path / run
        run_distributed(memory_loop, 4, str(root), 5)
        for marker in (root / "node0").glob("*/rank[23]/slot*/" + MARKER):
            if '"step": 5' in marker.read_text():  # node 0 has only step 4 of ranks 2 and 3
                marker.unlink()
        if lost:
            shutil.rmtree(root / lost)
        resumed = run_distributed(memory_loop, 4, str(root), 8, resume=True)
        # node 1's own copies are newer; without node 1 only the older replicas are left
        assert [r["start"] for r in resumed] == [5 if lost is None else 4] * 4
        _same_run(resumed, reference)


def test_a_peer_that_dies_during_recovery_fails_every_rank_and_the_next_restart_recovers(
    tmp_path, reference
):
    run_distributed(memory_loop, 4, str(tmp_path), 5)
    shutil.rmtree(tmp_path / "node1")  # ranks 2 and 3 need their files from ranks 0 and 1
    with pytest.raises(DistributedTestError) as info:
        run_distributed(
            memory_loop, 4, str(tmp_path), 8, resume=True, die_in_recovery=0, timeout=90
        )
    assert "gave no result" not in str(info.value)  # every rank ended: none hung
    resumed = run_distributed(memory_loop, 4, str(tmp_path), 8, resume=True)
    assert [r["start"] for r in resumed] == [5] * 4
    _same_run(resumed, reference)


def test_a_node_that_does_not_return_continues_on_fewer_ranks(tmp_path):
    """4 ranks snapshot step 5 and save it to storage; node 1 is lost for good; 2 ranks
    resume from memory (resharded) with the losses 2 ranks resumed from storage have."""
    run_distributed(memory_loop, 4, str(tmp_path / "a"), 5, save_at=(5,))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "a" / "node1")
    from_memory = run_distributed(memory_loop, 2, str(tmp_path / "a"), 8, resume=True)
    assert [r["start"] for r in from_memory] == [5, 5]
    assert {r["tier"] for r in from_memory} == {"memory"}
    shutil.rmtree(tmp_path / "b" / "node0")
    shutil.rmtree(tmp_path / "b" / "node1")
    from_storage = run_distributed(memory_loop, 2, str(tmp_path / "b"), 8, resume=True)
    assert {r["tier"] for r in from_storage} == {"storage"}
    _same_run(from_memory, from_storage)


def test_without_a_complete_snapshot_the_run_falls_back_to_storage(tmp_path, reference):
    run_distributed(memory_loop, 4, str(tmp_path), 5, save_at=(4,))
    shutil.rmtree(tmp_path / "node0")  # a node and its replica's holder: both copies of 0, 1
    shutil.rmtree(tmp_path / "node1")
    resumed = run_distributed(memory_loop, 4, str(tmp_path), 8, resume=True)
    assert [r["start"] for r in resumed] == [4] * 4
    assert {r["tier"] for r in resumed} == {"storage"}
    _same_run(resumed, reference)


def test_a_fresh_run_removes_an_earlier_runs_snapshots(tmp_path):
    run_distributed(memory_loop, 4, str(tmp_path), 3)
    fresh = run_distributed(memory_loop, 4, str(tmp_path), 1)  # resume=False
    assert [r["start"] for r in fresh] == [0] * 4
    steps = {
        m["step"] for node in ("node0", "node1") for m in list_snapshots(_run_dir(tmp_path / node))
    }
    assert steps == {1}


def test_two_runs_on_one_machine_keep_their_snapshots_apart(tmp_path):
    memory = memory_config(str(tmp_path / "shm"))
    run_distributed(memory_loop, 2, str(tmp_path / "a"), 3, memory=memory, ranks_per_node=1)
    run_distributed(memory_loop, 2, str(tmp_path / "b"), 2, memory=memory, ranks_per_node=1)
    runs = sorted((tmp_path / "shm" / "node0").glob("run-*"))
    assert len(runs) == 2
    assert {max(m["step"] for m in list_snapshots(run)) for run in runs} == {2, 3}


def test_a_second_run_of_the_same_work_dir_on_one_machine_is_refused(tmp_path):
    from tests.distributed import Ranks
    from tests.memory_trials import killed_loop

    report = tmp_path / "report"
    with Ranks(killed_loop, 2, str(tmp_path), 10_000, str(report)):
        while not report.exists() or len(report.read_text().splitlines()) < 4:
            time.sleep(0.05)
        with pytest.raises(DistributedTestError) as info:
            run_distributed(memory_loop, 2, str(tmp_path), 3)
    assert "another run on rank 0's machine (pid " in str(info.value)
    assert "give this run another work_dir" in str(info.value)
    steps = {m["step"] for m in list_snapshots(_run_dir(tmp_path / "node0"))}
    assert min(steps) > 1  # the first run's snapshots were not removed


def test_too_little_memory_is_one_line_before_training(tmp_path):
    import torch

    from shardwise.checkpoint.files import CheckpointError
    from shardwise.checkpoint.memory import MemoryTier

    config = parse_memory_checkpoint(memory_config(str(tmp_path)))
    huge = {"state_dict": {"w": torch.empty(2**44, device="meta")}}  # 64 TiB, never allocated
    tier = MemoryTier(config, lambda meta: huge, lambda *fns: None, tmp_path, 0, 1)
    with pytest.raises(CheckpointError) as info:
        tier.begin(fresh=True)
    message = str(info.value)
    assert "\n" not in message
    assert "131072 GiB" in message or "MiB" in message
    assert "dir=" in message


def test_shardwise_train_restarts_a_killed_worker_from_memory(tmp_path):
    """Real ``shardwise train`` on 2 ranks (torchrun, ``--max-restarts 1``): rank 1 dies after
    iteration 7; the restart resumes from the memory snapshot of iteration 6 (storage has
    iteration 4) and ends with the losses of an uninterrupted run."""
    from tests.test_cli_train import TINY, losses, ok, train

    config = tmp_path / "tiny.py"
    config.write_text(TINY + "strategy = dict(type='DDPStrategy', memory_checkpoint=dict())\n")
    two = ("--nproc-per-node", "2")
    env = dict(SHARDWISE_MEMORY_DIR=str(tmp_path / "shm"))
    ok(train(str(config), tmp_path / "whole", *two, env=env))
    proc = ok(
        train(
            str(config),
            tmp_path / "work",
            *two,
            "--max-restarts",
            "1",
            env=dict(env, CRASH_AT="7"),
        )
    )
    assert "Restart 1: resuming from the newest snapshot in memory" in proc.stdout
    assert "Resuming from the memory snapshot of step 6" in proc.stdout, proc.stdout[-3000:]
    assert losses(tmp_path / "work")[-3:] == losses(tmp_path / "whole")[-3:]


def test_ckpt_inspect_lists_a_nodes_memory_snapshots(tmp_path):
    import json
    import subprocess
    import sys

    run_distributed(memory_loop, 4, str(tmp_path), 3)
    node = tmp_path / "node0"

    def inspect(*args):
        cmd = [sys.executable, "-m", "shardwise.cli", "ckpt", "inspect", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    summary = json.loads(inspect(str(node), "--json"))
    (run,) = summary["runs"]
    assert run["work_dir"] == str(tmp_path / "work")
    assert {(row["owner"], row["step"]) for row in run["snapshots"]} == {
        (owner, step) for owner in range(4) for step in (2, 3)
    }
    assert run["complete_here"] == [2, 3]  # its own ranks' and the replicas of the others
    text = inspect(str(node))
    assert "memory snapshots" in text and "complete on this node alone: steps [2, 3]" in text


def test_a_slot_is_written_over_in_place_and_only_where_this_process_wrote_it(tmp_path):
    """A snapshot reuses the pages of the files this process wrote into its slot (no new
    memory each step); a file of another process there (one a recovery may still map) is
    replaced, never written over."""
    import os

    import torch

    from shardwise.checkpoint.memory import MemoryTier

    config = parse_memory_checkpoint(memory_config(str(tmp_path)))
    state = {"state_dict": {"w": torch.arange(1000.0)}, "meta": {}}
    tier = MemoryTier(config, lambda meta: state, lambda *fns: None, tmp_path / "work", 0, 1)

    def snapshot(step):
        state["state_dict"]["w"] += 1
        tier.snapshot(step, {})
        tier.wait()
        (newest,) = [m for m in list_snapshots(tier.root) if m["step"] == step]
        return Path(newest["slot"])

    slot0, slot1 = snapshot(1), snapshot(2)
    data = next(p.name for p in slot0.iterdir() if p.name.endswith(".distcp"))
    os.link(slot0 / data, tmp_path / "ours")  # the same file under a second name
    assert snapshot(3) == slot0
    assert (tmp_path / "ours").read_bytes() == (slot0 / data).read_bytes()  # written over
    (slot1 / data).unlink()
    (slot1 / data).write_bytes(b"x" * 10)  # as if another process had written it
    os.link(slot1 / data, tmp_path / "theirs")  # e.g. a recovery's link, mapped
    assert snapshot(4) == slot1
    assert (tmp_path / "theirs").read_bytes() == b"x" * 10  # replaced, not written over
    assert (slot1 / data).stat().st_size > 10
    assert [m["step"] for m in list_snapshots(tier.root)] == [3, 4]
