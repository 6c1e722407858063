"""shardwise.dist: launcher inference, init_dist, rank helpers and collectives."""

from __future__ import annotations

import datetime
import os
import shutil

import pytest
import torch
import torch.distributed as torch_dist

from shardwise import dist
from shardwise.launch_env import infer_launcher, parse_slurm_nodelist
from tests.distributed import free_port, run_distributed

LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_NTASKS_PER_NODE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)


@pytest.fixture
def launch_env():
    """No launcher variables during the test; the environment is restored afterwards."""
    saved = dict(os.environ)
    for name in LAUNCH_VARS:
        os.environ.pop(name, None)
    yield os.environ
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


# --------------------------------------------------------------------------- launcher


@pytest.mark.parametrize(
    "variables, expected",
    [
        ({"LOCAL_RANK": "0"}, "pytorch"),
        ({"TORCHELASTIC_RUN_ID": "abc"}, "pytorch"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "pytorch"),
        ({"SLURM_NTASKS": "2", "SLURM_PROCID": "1"}, "slurm"),
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "0"}, "mpi"),
        ({"RANK": "0"}, "none"),
        ({}, "none"),
    ],
)
def test_infer_launcher_from_environment(launch_env, variables, expected):
    launch_env.update(variables)
    assert infer_launcher() == expected


def test_torchrun_variables_win_over_slurm(launch_env):
    launch_env.update(SLURM_NTASKS="2", SLURM_PROCID="0", LOCAL_RANK="0")
    assert infer_launcher() == "pytorch"


def test_unknown_launcher_is_rejected_with_the_accepted_ones():
    with pytest.raises(ValueError, match="'torchrun'.*'pytorch', 'slurm', 'mpi', 'none'"):
        dist.init_dist("torchrun")


def test_launcher_none_initialises_nothing(launch_env):
    dist.init_dist("none")
    assert not dist.is_distributed()


@pytest.mark.parametrize("timeout", ["30", -1, True])
def test_bad_timeout_is_rejected(timeout):
    with pytest.raises(TypeError, match="timeout"):
        dist.init_dist("pytorch", timeout=timeout)


def test_pytorch_launcher_without_torchrun_variables_says_how_to_launch(launch_env):
    with pytest.raises(RuntimeError, match="RANK.*torchrun"):
        dist.init_dist("pytorch")


# --------------------------------------------------------------------------- SLURM / MPI


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node01", ["node01"]),
        ("node[01-03],other", ["node01", "node02", "node03", "other"]),
        ("gpu[8-10,12]", ["gpu8", "gpu9", "gpu10", "gpu12"]),
        ("a[1-2]-b[07,09]", ["a1-b07", "a1-b09", "a2-b07", "a2-b09"]),
        ("x[001-002],y[1]", ["x001", "x002", "y1"]),
    ],
)
def test_slurm_nodelist_is_expanded_without_scontrol(monkeypatch, nodelist, hosts):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert parse_slurm_nodelist(nodelist) == hosts


def test_init_from_slurm_environment(launch_env):
    port = free_port()
    launch_env.update(SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_NODELIST="localhost")
    dist.init_dist("slurm", timeout=30, port=port)
    assert dist.is_distributed()
    assert (dist.get_rank(), dist.get_world_size(), dist.get_local_rank()) == (0, 1, 0)
    assert launch_env["MASTER_ADDR"] == "localhost"
    assert launch_env["MASTER_PORT"] == str(port)
    assert (launch_env["RANK"], launch_env["WORLD_SIZE"]) == ("0", "1")


def test_slurm_master_port_from_environment_wins_over_port_argument(launch_env, monkeypatch):
    launch_env.update(
        SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_NODELIST="localhost", MASTER_PORT="1"
    )
    monkeypatch.setattr(dist.torch_dist, "init_process_group", lambda **kwargs: None)
    dist.init_dist("slurm", port=2)
    assert launch_env["MASTER_PORT"] == "1"


def test_init_from_open_mpi_environment(launch_env):
    launch_env.update(
        OMPI_COMM_WORLD_RANK="0",
        OMPI_COMM_WORLD_SIZE="1",
        OMPI_COMM_WORLD_LOCAL_RANK="0",
        OMPI_COMM_WORLD_LOCAL_SIZE="1",
        MASTER_PORT=str(free_port()),
    )
    dist.init_dist("mpi", timeout=datetime.timedelta(seconds=30))
    assert dist.get_dist_info() == (0, 1)
    assert dist.get_local_size() == 1
    assert launch_env["MASTER_ADDR"] == "127.0.0.1"


def test_already_initialised_group_is_reused(launch_env):
    torch_dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    group = torch_dist.group.WORLD
    dist.init_dist("pytorch")  # no torchrun variables needed: nothing to set up
    assert torch_dist.group.WORLD is group
    assert dist.get_backend() == "gloo"


# --------------------------------------------------------------------------- helpers


def test_helpers_work_when_not_distributed():
    assert not dist.is_distributed()
    assert dist.get_rank() == 0 and dist.get_world_size() == 1
    assert dist.get_local_rank() == int(os.environ.get("LOCAL_RANK", 0))
    assert dist.is_main_process()
    assert dist.get_backend() is None
    expected = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert dist.get_device() == expected
    dist.barrier()
    t = torch.tensor([1.0, 2.0])
    assert dist.broadcast(t) is t and t.tolist() == [1.0, 2.0]
    assert dist.all_reduce(t, op="mean") is t and t.tolist() == [1.0, 2.0]
    assert dist.broadcast_object({"a": 1}) == {"a": 1}
    assert dist.all_gather_object("x") == ["x"]
    assert dist.master_only(lambda: 7)() == 7


def test_all_reduce_rejects_unknown_op_and_integer_mean():
    with pytest.raises(ValueError, match="'avg'.*'sum', 'mean'"):
        dist.all_reduce(torch.ones(1), op="avg")
    with pytest.raises(TypeError, match="floating point"):
        dist.all_reduce(torch.ones(1, dtype=torch.int64), op="mean")


def _collectives_worker() -> dict:
    dist.init_dist(infer_launcher(), timeout=60)
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.full((2,), float(rank + 1))
    out = {
        "rank": rank,
        "world": world,
        "local_rank": dist.get_local_rank(),
        "local_size": dist.get_local_size(),
        "backend": dist.get_backend(),
        "device": str(dist.get_device()),
        "main": dist.is_main_process(),
        "master_only": dist.master_only(lambda: "ran")(),
        "broadcast": dist.broadcast(torch.tensor([rank * 10.0]), src=world - 1).tolist(),
        "sum": dist.all_reduce(value.clone()).tolist(),
        "mean": dist.all_reduce(value.clone(), op="mean").tolist(),
        "max": dist.all_reduce(value.clone(), op="max").tolist(),
        "min": dist.all_reduce(value.clone(), op="MIN").tolist(),
        "product": dist.all_reduce(value.clone(), op="product").tolist(),
        "object": dist.broadcast_object({"from": rank} if rank == 0 else None),
        "gathered": dist.all_gather_object(("rank", rank)),
    }
    dist.barrier()
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_collectives_over_gloo(world_size):
    results = run_distributed(_collectives_worker, world_size, timeout=120)
    ranks = list(range(world_size))
    total = sum(r + 1 for r in ranks)
    product = 1.0
    for r in ranks:
        product *= r + 1
    for rank, out in enumerate(results):
        assert (out["rank"], out["world"], out["local_rank"]) == (rank, world_size, rank)
        assert out["local_size"] == world_size
        assert (out["backend"], out["device"]) == ("gloo", "cpu")
        assert out["main"] is (rank == 0)
        assert out["master_only"] == ("ran" if rank == 0 else None)
        assert out["broadcast"] == [(world_size - 1) * 10.0]
        assert out["sum"] == [float(total)] * 2
        assert out["mean"] == [total / world_size] * 2
        assert out["max"] == [float(world_size)] * 2
        assert out["min"] == [1.0] * 2
        assert out["product"] == [product] * 2
        assert out["object"] == {"from": 0}
        assert out["gathered"] == [("rank", r) for r in ranks]


def _join_missing_rank0(timeout: float) -> str:
    os.environ.update(
        RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_PORT=str(free_port())
    )
    try:
        dist.init_dist("pytorch", timeout=timeout)
    except RuntimeError as exc:
        return f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}\n{exc}"
    raise AssertionError("init_dist returned although rank 0 never started")


@pytest.mark.timeout(120)
def test_unreachable_rendezvous_raises_after_its_timeout():
    (report,) = run_distributed(_join_missing_rank0, 1, 3.0, timeout=90)
    address, message = report.split("\n", 1)
    assert address in message
    assert "rank 1 of 2" in message
    assert "Check that rank 0 is running" in message


_EXIT_PROBE = """
import atexit, gc, os, sys
import torch.distributed as torch_dist
# registered before init_dist, so it runs after shardwise's handler (atexit runs LIFO)
atexit.register(lambda: print("initialised at exit:", torch_dist.is_initialized(),
                              "threads:", len(os.listdir("/proc/self/task")), flush=True))
from shardwise import dist
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=sys.argv[1])
dist.init_dist("pytorch", backend="gloo")
dist.all_reduce(__import__("torch").ones(1))
# garbage that still holds the group, as a DDP wrapper in a reference cycle does
gc.disable()
cycle = [torch_dist.group.WORLD]
cycle.append(cycle)
del cycle
print("trained", flush=True)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_a_process_that_exits_with_its_group_alive_destroys_it_before_finalization():
    import subprocess
    import sys

    from tests.distributed import REPO

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO / "src")
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_PROBE, str(free_port())],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # the group's gloo threads are joined while Python is whole: one left at finalization
    # would abort the process when it drops its last tensor (exit code -6)
    assert proc.stdout.split() == "trained initialised at exit: False threads: 1".split()
