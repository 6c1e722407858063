"""``shardwise train`` under cluster launchers, simulated on this machine with real processes
over loopback: torchrun, SLURM's srun (one task per rank, one task per node; a stand-in srun,
``tests/fake_slurm/srun``), Kubeflow pods (``PET_*``); the examples' sbatch script and TrainJob
manifest as written; a process group that the caller initialised, adopted and left alive;
and the launch decision (``plan_launch``) with its refusals of inconsistent variables.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from shardwise import dist, launch_env
from shardwise.checkpoint import find_last_checkpoint
from shardwise.checkpoint.manifest import is_committed
from shardwise.cli import main
from shardwise.runner.launch import LaunchOptions, plan_launch
from tests.distributed import REPO, free_port, run_distributed
from tests.test_cli_train import TINY, records

FAKE_SLURM = REPO / "tests" / "fake_slurm"
SBATCH = REPO / "examples" / "slurm" / "train.sbatch"
TRAINJOB = REPO / "examples" / "kubeflow" / "trainjob.yaml"

LAUNCH_PREFIXES = ("SLURM_", "PET_", "OMPI_", "TORCHELASTIC_")
LAUNCH_NAMES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "STOP_AT",
    "CRASH_AT",
)


def _is_launch_var(name: str) -> bool:
    return name in LAUNCH_NAMES or name.startswith(LAUNCH_PREFIXES)


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variable in this process's environment during the test."""
    for name in list(os.environ):
        if _is_launch_var(name):
            monkeypatch.delenv(name)
    return monkeypatch


def base_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher variable, for a simulated process."""
    env = {k: v for k, v in os.environ.items() if not _is_launch_var(k)}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([str(FAKE_SLURM), venv_bin, env.get("PATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


@pytest.fixture
def config(tmp_path) -> str:
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return str(path)


def run_all(commands: list[tuple[list[str], dict[str, str]]], timeout: float = 240) -> list:
    """Start every ``(argv, env)`` at once from the repository root (processes of a cluster
    that start together); return ``(returncode, output)`` for each."""
    procs = [
        subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for argv, env in commands
    ]
    outcomes = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            outcomes.append((proc.returncode, out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return outcomes


def ok(outcome: tuple[int, str]) -> str:
    code, out = outcome
    assert code == 0, f"rc {code}\n{out[-6000:]}"
    return out


def assert_trained(work_dir: Path, world: int, out: str, launcher: str) -> None:
    """The tiny run trained on ``world`` ranks to the end and committed its checkpoint."""
    assert f"DDPStrategy on {world} rank(s) (launcher {launcher}," in out, out[-4000:]
    assert sorted(records(work_dir)) == [2, 4, 6, 8, 10, 12]
    last = find_last_checkpoint(str(work_dir))
    assert last is not None and Path(last).name == "iter_12.pth" and is_committed(last)
    logs = {p.name for p in work_dir.glob("*/*.log")}
    assert any(name.endswith(f"_rank{world - 1}.log") for name in logs), logs
    assert not any(name.endswith(f"_rank{world}.log") for name in logs), logs


def slurm_job(nodes: int, nodelist: str, **extra: str) -> dict[str, str]:
    """The environment sbatch gives a job of ``nodes`` nodes (its batch script's)."""
    return base_env(
        SLURM_JOB_ID="4242",
        SLURM_JOB_NAME="test",
        SLURM_JOB_NUM_NODES=str(nodes),
        SLURM_NNODES=str(nodes),
        SLURM_JOB_NODELIST=nodelist,
        SLURM_NODELIST=nodelist,
        SLURM_SUBMIT_DIR=str(REPO),
        MASTER_PORT=str(free_port()),
        **extra,
    )


def kubeflow_pods(nnodes: int, nproc: int, *, pytorchjob: bool = False) -> list[dict[str, str]]:
    """Each pod's environment as Kubeflow's torch runtime sets it (TrainJob: ``PET_*``;
    PyTorchJob adds ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` (the pod's), ``WORLD_SIZE``)."""
    port = str(free_port())
    pods = []
    for node_rank in range(nnodes):
        env = base_env(
            PET_NNODES=str(nnodes),
            PET_NPROC_PER_NODE=str(nproc),
            PET_NODE_RANK=str(node_rank),
            PET_MASTER_ADDR="127.0.0.1",
            PET_MASTER_PORT=port,
        )
        if pytorchjob:
            env.update(
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                RANK=str(node_rank),
                WORLD_SIZE=str(nnodes * nproc),
            )
        pods.append(env)
    return pods


def shardwise_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "shardwise.cli", *args]


# ----------------------------------------------------------------------------- torchrun
def test_two_nodes_meet_at_a_c10d_rendezvous(tmp_path, config):
    """The same command on every node: shardwise train starts torchrun there, and the nodes'
    agents meet at the rendezvous endpoint (two simulated nodes, one process each)."""
    work_dir = tmp_path / "work"
    endpoint = f"127.0.0.1:{free_port()}"
    argv = shardwise_argv(
        "train", config, "--work-dir", str(work_dir), "--nproc-per-node", "1", "--nnodes", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "job7",
    )  # fmt: skip
    outs = [ok(o) for o in run_all([(argv, base_env()), (argv, base_env())])]
    rank0 = next(out for out in outs if "DDPStrategy on" in out)
    assert_trained(work_dir, 2, rank0, "pytorch")


# ----------------------------------------------------------------------------- SLURM
def test_srun_with_one_task_per_rank_trains_every_rank_in_its_task(tmp_path, config):
    work_dir = tmp_path / "work"
    job = slurm_job(1, "localhost")
    srun = ["srun", "--ntasks-per-node=2", "shardwise", "train", config, "--work-dir"]
    out = ok(run_all([([*srun, str(work_dir)], job)])[0])
    assert "starting torchrun" not in out  # every task is a rank: nothing launched
    assert_trained(work_dir, 2, out, "slurm")


def test_the_sbatch_script_runs_torchrun_once_per_node_over_a_compressed_node_list(
    tmp_path, config
):
    """examples/slurm/train.sbatch as written, in a 2-node job whose node list is compressed
    (two loopback addresses), with a stand-in srun; 2 processes per node instead of 8 GPUs."""
    directives = sbatch_directives()
    nodes, per_node = int(directives["nodes"]), int(directives["ntasks-per-node"])
    job = slurm_job(
        nodes,
        "127.0.0.[1-2]",
        SLURM_NTASKS=str(nodes * per_node),
        SLURM_NTASKS_PER_NODE=str(per_node),
        SLURM_PROCID="0",  # the batch script's own
        CONFIG=config,
        WORK_DIR=str(tmp_path / "work"),
        NPROC_PER_NODE="2",
    )
    out = ok(run_all([(["bash", str(SBATCH)], job)])[0])
    starts = re.findall(r"SLURM, one task per node .*", out)
    assert len(starts) == nodes, out[-4000:]  # one torchrun per node, none per rank
    assert "node rank 0, rendezvous 127.0.0.1:" in out and "node rank 1," in out
    assert_trained(tmp_path / "work", nodes * 2, out, "pytorch")


def sbatch_directives() -> dict[str, str]:
    directives = {}
    for line in SBATCH.read_text().splitlines():
        if line.startswith("#SBATCH --"):
            name, _, value = line[len("#SBATCH --") :].partition("=")
            directives[name.strip()] = value.strip()
    return directives


def srun_command() -> list[str]:
    """The script's srun line, its continuation lines joined, as the shell splits it."""
    text = SBATCH.read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.strip().startswith("srun ")]
    return shlex.split(line)


def test_the_sbatch_script_asks_for_what_the_simulation_runs():
    directives = sbatch_directives()
    assert directives["ntasks-per-node"] == "1"  # one shardwise train per node ...
    assert directives["signal"] == "USR1@120" and "requeue" in directives  # ... preemptible
    srun = srun_command()
    assert "--ntasks-per-node=1" in srun
    train = srun[srun.index("shardwise") :]
    assert train[:3] == ["shardwise", "train", "$CONFIG"]
    assert "--nproc-per-node" in train and {"--resume", "--requeue"} <= set(train)
    assert "CONFIG=${CONFIG:-examples/gpt_fsdp.py}" in SBATCH.read_text()


# ----------------------------------------------------------------------------- Kubeflow
def test_kubeflow_pods_whose_command_is_shardwise_train_start_torchrun_once_each(tmp_path, config):
    work_dir = tmp_path / "work"
    argv = shardwise_argv("train", config, "--work-dir", str(work_dir))
    outs = [ok(o) for o in run_all([(argv, env) for env in kubeflow_pods(2, 1)])]
    for node_rank, out in enumerate(outs):
        assert out.count("Kubeflow (PET_NNODES=2, PET_NPROC_PER_NODE=1): starting torchrun") == 1
        assert f"node rank {node_rank}, master 127.0.0.1:" in out
    assert_trained(work_dir, 2, outs[0], "pytorch")


@pytest.mark.slow
def test_pytorchjob_pods_with_two_processes_each(tmp_path, config):
    """PyTorchJob also sets RANK (the pod's) and WORLD_SIZE: torchrun's workers replace them."""
    work_dir = tmp_path / "work"
    argv = shardwise_argv("train", config, "--work-dir", str(work_dir))
    pods = kubeflow_pods(2, 2, pytorchjob=True)
    outs = [ok(o) for o in run_all([(argv, env) for env in pods], timeout=280)]
    assert_trained(work_dir, 4, outs[0], "pytorch")


def test_kubeflow_pods_whose_command_is_torchrun_train_in_its_workers(tmp_path, config):
    """The runtime's usual command, torchrun (which reads PET_*): shardwise trains in the
    workers and starts nothing itself."""
    work_dir = tmp_path / "work"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--module", "shardwise.cli"]
    argv = [*torchrun, "train", config, "--work-dir", str(work_dir)]
    outs = [ok(o) for o in run_all([(argv, env) for env in kubeflow_pods(2, 1)])]
    assert not any("starting torchrun" in out for out in outs)
    assert_trained(work_dir, 2, outs[0], "pytorch")


def trainjob() -> dict:
    return yaml.safe_load(TRAINJOB.read_text())


def test_the_trainjob_manifest_runs_shardwise_train_under_the_torch_runtime():
    job = trainjob()
    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    trainer = job["spec"]["trainer"]
    assert trainer["command"][:3] == ["shardwise", "train", "examples/gpt_fsdp.py"]
    assert isinstance(trainer["numNodes"], int) and isinstance(trainer["numProcPerNode"], int)
    work_dir = trainer["command"][trainer["command"].index("--work-dir") + 1]
    mounts = job["spec"]["podTemplateOverrides"][0]["spec"]["containers"][0]["volumeMounts"]
    assert any(work_dir.startswith(mount["mountPath"]) for mount in mounts)  # shared storage


@pytest.mark.slow
def test_the_trainjob_manifest_s_command_trains_the_gpt_in_two_pods(tmp_path):
    """The manifest's command as each pod runs it (the torch runtime's PET_* values for its
    numNodes), on this CPU machine: one process per pod instead of numProcPerNode GPUs, a
    local work dir and a short run."""
    from tests.test_examples import SHORT_GPT

    trainer = trainjob()["spec"]["trainer"]
    command = [*trainer["command"], "--work-dir", str(tmp_path / "gpt")]
    command += ["--cfg-options", *SHORT_GPT, "train_cfg.max_iters=15", "model.n_layer=2"]
    pods = kubeflow_pods(trainer["numNodes"], 1)
    outs = [ok(o) for o in run_all([(command, env) for env in pods], timeout=280)]
    assert "FSDPStrategy on 2 rank(s) (launcher pytorch" in outs[0]
    last = find_last_checkpoint(str(tmp_path / "gpt"))
    assert last is not None and Path(last).name == "iter_15.pth" and is_committed(last)


# ----------------------------------------------------------------------------- the decision
def _plan(env: dict[str, str], launcher: str | None = None, **options):
    return plan_launch(LaunchOptions(**options), launcher, env=env)


TORCHRUN_WORKER = dict(
    RANK="3",
    WORLD_SIZE="4",
    LOCAL_RANK="1",
    LOCAL_WORLD_SIZE="2",
    GROUP_RANK="1",
    TORCHELASTIC_RUN_ID="job",
    MASTER_ADDR="node01",
    MASTER_PORT="29500",
)
SRUN_TASK_PER_RANK = dict(
    SLURM_JOB_ID="77",
    SLURM_NTASKS="4",
    SLURM_PROCID="3",
    SLURM_LOCALID="1",
    SLURM_NODEID="1",
    SLURM_NNODES="2",
    SLURM_NTASKS_PER_NODE="2",
    SLURM_NODELIST="node[01-02]",
)
SRUN_TASK_PER_NODE = dict(
    SLURM_JOB_ID="1234",
    SLURM_NTASKS="5",
    SLURM_PROCID="4",
    SLURM_LOCALID="0",
    SLURM_NODEID="4",
    SLURM_NNODES="5",
    SLURM_NTASKS_PER_NODE="1",
    SLURM_NODELIST="gpu[01-04,07]",
)
TRAINJOB_POD = dict(
    PET_NNODES="2",
    PET_NPROC_PER_NODE="4",
    PET_NODE_RANK="1",
    PET_MASTER_ADDR="gpt-node-0-0.gpt",
    PET_MASTER_PORT="29400",
)
PYTORCHJOB_POD = dict(
    TRAINJOB_POD, MASTER_ADDR="gpt-master-0", MASTER_PORT="23456", RANK="1", WORLD_SIZE="8"
)


@pytest.mark.parametrize(
    "env, options, launcher, world, local",
    [
        (TORCHRUN_WORKER, {}, "pytorch", 4, 2),
        (TORCHRUN_WORKER, dict(nproc_per_node=2), "pytorch", 4, 2),  # agrees with torchrun
        ({**TORCHRUN_WORKER, **SRUN_TASK_PER_NODE, **TRAINJOB_POD}, {}, "pytorch", 4, 2),
        (SRUN_TASK_PER_RANK, {}, "slurm", 4, 2),
        (SRUN_TASK_PER_RANK, dict(nproc_per_node=2), "slurm", 4, 2),  # srun started them
        (dict(RANK="1", WORLD_SIZE="2", MASTER_ADDR="h"), {}, "pytorch", 2, None),
        (
            dict(
                OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK="1"
            ),
            {},
            "mpi",
            2,
            None,
        ),
        ({}, {}, "none", 1, 1),
    ],
    ids=[
        "torchrun-worker",
        "torchrun-worker-same-nproc",
        "torchrun-worker-under-srun-in-a-pod",
        "srun-task-per-rank",
        "srun-task-per-rank-same-nproc",
        "rank-and-world-size",
        "mpirun",
        "nothing",
    ],
)
def test_a_process_started_as_a_rank_trains_in_place(
    clean_env, env, options, launcher, world, local
):
    plan = _plan(env, **options)
    assert plan.in_process
    assert (plan.launcher, plan.world_size, plan.local_world_size) == (launcher, world, local)


def test_srun_with_one_task_per_node_starts_torchrun_at_the_first_host(clean_env):
    plan = _plan(SRUN_TASK_PER_NODE, nproc_per_node=8)
    assert plan.source == "slurm" and plan.world_size == 40 and plan.local_world_size == 8
    opts = plan.torchrun
    assert (opts.nproc_per_node, opts.nnodes, opts.node_rank) == (8, "5", 4)
    assert (opts.master_addr, opts.master_port) == ("gpu01", 21234)  # port from the job id
    assert opts.rdzv_backend is None  # static rendezvous: node ranks are SLURM's
    with_port = _plan(
        {**SRUN_TASK_PER_NODE, "MASTER_PORT": "3000", "MASTER_ADDR": "head"}, nproc_per_node=8
    )
    assert (with_port.torchrun.master_addr, with_port.torchrun.master_port) == ("head", 3000)
    c10d = _plan(
        SRUN_TASK_PER_NODE,
        nproc_per_node=8,
        rdzv_backend="c10d",
        rdzv_endpoint="gpu01:29400",
        rdzv_id="x",
    )
    assert c10d.torchrun.rdzv_endpoint == "gpu01:29400" and c10d.torchrun.master_addr is None
    one = _plan(SRUN_TASK_PER_NODE, launcher="slurm")  # no --nproc-per-node: this task is a rank
    assert one.in_process and one.world_size == 5


def test_a_kubeflow_pod_starts_torchrun_once_with_its_pet_values(clean_env):
    for env in (TRAINJOB_POD, PYTORCHJOB_POD):
        plan = _plan(env)
        assert plan.source == "kubeflow" and plan.world_size == 8
        opts = plan.torchrun
        assert (opts.nproc_per_node, opts.nnodes, opts.node_rank) == (4, "2", 1)
        assert (opts.master_addr, opts.master_port) == ("gpt-node-0-0.gpt", 29400)
    elastic = _plan(
        dict(
            PET_NNODES="1:3",
            PET_NPROC_PER_NODE="1",
            PET_RDZV_ENDPOINT="gpt-worker-0:29400",
            PET_RDZV_BACKEND="c10d",
            PET_RDZV_ID="gpt",
            PET_MAX_RESTARTS="3",
        )
    )
    opts = elastic.torchrun
    assert (opts.nnodes, opts.rdzv_endpoint, opts.rdzv_id, opts.max_restarts) == (
        "1:3",
        "gpt-worker-0:29400",
        "gpt",
        3,
    )
    assert elastic.world_size is None
    auto = _plan(dict(TRAINJOB_POD, PET_NPROC_PER_NODE="auto"))
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 1
    assert auto.torchrun.nproc_per_node == expected  # not one process per CPU core
    assert _plan(dict(TRAINJOB_POD, PET_NPROC_PER_NODE="auto"), nproc_per_node=2).world_size == 4


def test_without_a_launcher_nproc_per_node_starts_torchrun_here(clean_env):
    plan = _plan({}, nproc_per_node=2)
    assert plan.source == "command line" and plan.torchrun.nproc_per_node == 2
    assert plan.world_size == 2


# ----------------------------------------------------------------------------- bad input
BAD = [
    (
        dict(SLURM_NTASKS="4", SLURM_PROCID="0", SLURM_NODELIST="n1", WORLD_SIZE="2", RANK="0"),
        [],
        ["SLURM_NTASKS=4 but WORLD_SIZE=2"],
    ),
    (dict(RANK="2", WORLD_SIZE="2", MASTER_ADDR="h"), [], ["RANK=2 is outside", "WORLD_SIZE=2"]),
    (
        dict(SLURM_NTASKS="4", SLURM_PROCID="4", SLURM_NODELIST="n1"),
        [],
        ["SLURM_PROCID=4 is outside", "SLURM_NTASKS=4"],
    ),
    (
        dict(SLURM_NTASKS="2", SLURM_PROCID="0", SLURM_NODELIST="node[01-"),
        [],
        ["SLURM_NODELIST='node[01-'", "Cannot parse"],
    ),
    (
        dict(SLURM_NTASKS="2", SLURM_PROCID="0", SLURM_NODELIST="node[b-a]"),
        [],
        ["SLURM_NODELIST='node[b-a]'", "'b-a'"],
    ),
    (
        dict(SRUN_TASK_PER_RANK),
        ["--nproc-per-node", "4"],
        ["--nproc-per-node 4", "SLURM_NTASKS_PER_NODE=2", "srun --ntasks-per-node=1"],
    ),
    (dict(SLURM_NTASKS="two", SLURM_PROCID="0"), [], ["SLURM_NTASKS='two' is not an integer"]),
    (
        dict(SRUN_TASK_PER_NODE, SLURM_NODEID="3"),
        ["--nproc-per-node", "2"],
        ["SLURM_NODEID=3 but SLURM_PROCID=4"],
    ),
    (
        dict(SRUN_TASK_PER_NODE),
        ["--nproc-per-node", "2", "--nnodes", "4"],
        ["--nnodes 4", "SLURM_NNODES=5"],
    ),
    (
        dict(TRAINJOB_POD, WORLD_SIZE="6", RANK="1"),
        [],
        ["WORLD_SIZE=6 disagrees with PET_NNODES=2 × PET_NPROC_PER_NODE=4"],
    ),
    (dict(TRAINJOB_POD), ["--nproc-per-node", "2"], ["--nproc-per-node 2", "PET_NPROC_PER_NODE=4"]),
    (dict(TRAINJOB_POD, PET_NODE_RANK="2"), [], ["PET_NODE_RANK=2 is outside", "PET_NNODES=2"]),
    (
        {k: v for k, v in TRAINJOB_POD.items() if k != "PET_MASTER_ADDR"},
        [],
        ["PET_NNODES=2", "PET_MASTER_ADDR"],
    ),
    (dict(TRAINJOB_POD, PET_NNODES="two"), [], ["PET_NNODES='two'"]),
    (
        dict(TORCHRUN_WORKER),
        ["--nproc-per-node", "4"],
        ["--nproc-per-node 4", "LOCAL_WORLD_SIZE=2"],
    ),
    (
        dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="h"),
        ["--nproc-per-node", "2"],
        ["--nproc-per-node 2", "RANK=0 and WORLD_SIZE=2"],
    ),
    (
        dict(TORCHRUN_WORKER, LOCAL_RANK="2"),
        [],
        ["LOCAL_RANK=2 is outside", "LOCAL_WORLD_SIZE=2"],
    ),
    (
        dict(OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK="0"),
        [],
        ["OMPI_COMM_WORLD_RANK=2 is outside"],
    ),
]
BAD_IDS = [
    "slurm-ntasks-vs-world-size",
    "rank-outside-world",
    "slurm-procid-outside-ntasks",
    "unparsable-nodelist",
    "nodelist-range-not-numbers",
    "nproc-vs-srun-tasks-per-node",
    "slurm-ntasks-not-a-number",
    "slurm-nodeid-vs-procid-one-task-per-node",
    "nnodes-vs-slurm-nnodes",
    "pet-nnodes-vs-world-size",
    "nproc-vs-pet-nproc-per-node",
    "pet-node-rank-outside",
    "pet-master-addr-missing",
    "pet-nnodes-not-a-number",
    "nproc-vs-torchrun-local-world-size",
    "nproc-with-rank-and-world-size",
    "local-rank-outside",
    "mpi-rank-outside",
]


@pytest.mark.parametrize("env, extra, words", BAD, ids=BAD_IDS)
def test_inconsistent_launcher_input_is_one_line_and_exit_code_2(
    clean_env, tmp_path, config, capsys, env, extra, words
):
    for name, value in env.items():
        clean_env.setenv(name, value)
    code = main(["train", config, "--work-dir", str(tmp_path / "never"), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("shardwise train: error:") and err.count("\n") == 1, err
    for word in words:
        assert word in err, err
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize(
    "env, words",
    [(env, words) for env, extra, words in BAD if not extra],
    ids=[i for (_, extra, _), i in zip(BAD, BAD_IDS) if not extra],
)
def test_the_library_refuses_the_same_variables_with_a_value_error(clean_env, tmp_path, env, words):
    """A strategy (and launch_env.read_launch_env) reads the environment before any collective."""
    from shardwise.strategies import DDPStrategy

    for name, value in env.items():
        clean_env.setenv(name, value)
    if "PET_NNODES" in env:  # a plain script in a pod: torchrun would have read these
        words = ["PET_", "torchrun"]
    with pytest.raises(ValueError) as info:
        DDPStrategy(work_dir=str(tmp_path / "w"))
    for word in words:
        assert word in str(info.value)
    assert "\n" not in str(info.value)
    assert not dist.is_distributed()


def test_every_rank_refuses_inconsistent_variables_before_any_collective(tmp_path, config):
    """Two srun tasks whose environment also says WORLD_SIZE=4: both stop at once, each with
    the one line (no rank waits for a peer)."""
    argv = shardwise_argv("train", config, "--work-dir", str(tmp_path / "never"))
    job = slurm_job(1, "localhost")
    envs = [
        dict(job, SLURM_NTASKS="2", SLURM_PROCID=str(r), WORLD_SIZE="4", RANK=str(r))
        for r in range(2)
    ]
    outcomes = run_all([(argv, env) for env in envs], timeout=60)
    for code, out in outcomes:
        assert code == 2, out
        assert out.strip() == (
            "shardwise train: error: SLURM_NTASKS=2 but WORLD_SIZE=4: the launcher's variables "
            "disagree with torch's; unset WORLD_SIZE (the launcher sets SLURM_NTASKS), or pass "
            "--launcher pytorch / launcher='pytorch' to use WORLD_SIZE"
        )


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
        ("a[1-2]-b[07,09],login", ["a1-b07", "a1-b09", "a2-b07", "a2-b09", "login"]),
    ],
)
def test_compressed_node_lists_name_the_master(clean_env, monkeypatch, nodelist, hosts):
    monkeypatch.setattr(launch_env.shutil, "which", lambda name: None)  # no scontrol here
    assert launch_env.parse_slurm_nodelist(nodelist) == hosts
    env = dict(SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_JOB_NODELIST=nodelist)
    assert launch_env.read_launch_env("slurm", env).master_addr == hosts[0]


@pytest.mark.parametrize("nodelist", ["node[01-", "node01]", "node[]", "a,,b", "a,", "n[3-1]"])
def test_unreadable_node_lists_are_refused(monkeypatch, nodelist):
    monkeypatch.setattr(launch_env.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="Cannot parse SLURM node list"):
        launch_env.parse_slurm_nodelist(nodelist)


# ----------------------------------------------------------------------------- adopted group
ADOPT_CONFIG = dict(
    model=dict(type="DropoutRegressor"),
    train_dataloader=dict(dataset=dict(type="RegressionData", n=32), batch_size=4),
    optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
    train_cfg=dict(by_epoch=False, max_iters=4),
    default_hooks=dict(logger=dict(interval=2), checkpoint=dict(by_epoch=False, interval=4)),
    randomness=dict(seed=0),
)


def _train_in_an_adopted_group(strategy: str, work_dir: str, notebook: bool) -> dict:
    """Rank's part: the caller's group (run_distributed's init_process_group) exists before
    the strategy; it is still there, and works, after the Runner is done."""
    import torch.distributed as torch_dist

    import tests.test_runner_support  # noqa: F401 - registers the model and data
    from shardwise.runner import Runner

    if notebook:  # user code that made its group with an init_method: no launcher variable
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            os.environ.pop(name)
    group = torch_dist.group.WORLD
    chosen = dict(type=strategy) if strategy else None  # None: the Runner's default
    runner = Runner(work_dir=work_dir, strategy=chosen, **ADOPT_CONFIG)
    runner.train()
    seen = dict(
        strategy=type(runner.strategy).__name__,
        launcher=runner.strategy.launcher,
        distributed=runner.strategy.distributed,
        world=runner.strategy.world_size,
        device=str(runner.strategy.device),
        owns=dist.owns_process_group(),
        checkpoint=runner.message_hub.get_info("last_ckpt"),
    )
    del runner
    gc.collect()
    dist._destroy_process_groups()  # what interpreter exit runs: not this group
    seen["alive"] = torch_dist.is_initialized() and torch_dist.group.WORLD is group
    total = torch.tensor([float(torch_dist.get_rank() + 1)])
    torch_dist.all_reduce(total)
    seen["all_reduce"] = total.item()
    return seen


@pytest.mark.parametrize(
    "strategy, notebook",
    [("DDPStrategy", False), ("FSDPStrategy", False), ("DDPStrategy", True), (None, True)],
    ids=["ddp", "fsdp", "ddp-no-launcher-variables", "default-no-launcher-variables"],
)
def test_a_strategy_adopts_an_existing_group_and_leaves_it_alive(tmp_path, strategy, notebook):
    work_dir = str(tmp_path / "work")
    results = run_distributed(
        _train_in_an_adopted_group, 2, strategy, work_dir, notebook, init_pg=True, timeout=180
    )
    for seen in results:
        assert seen["alive"] and seen["all_reduce"] == 3.0
        assert seen["distributed"] and seen["world"] == 2 and not seen["owns"]
        assert seen["launcher"] == ("none" if notebook else "pytorch")
        assert seen["device"] == "cpu"
        assert seen["strategy"] == (strategy or "DDPStrategy")  # several ranks: DDP by default
    assert results[0]["checkpoint"] == str(Path(work_dir) / "iter_4.pth")
    assert is_committed(results[0]["checkpoint"])


def _shardwise_train_in_an_adopted_group(config: str, work_dir: str) -> dict:
    import torch.distributed as torch_dist

    from shardwise.runner import commands

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        refused = main(["train", config, "--work-dir", work_dir, "--nproc-per-node", "4"])
    code = main(["train", config, "--work-dir", work_dir])
    total = torch.ones(1)
    torch_dist.all_reduce(total)
    return dict(
        refused=refused,
        error=err.getvalue(),
        code=code,
        alive=torch_dist.is_initialized(),
        sum=total.item(),
        tore_down=commands.TORE_DOWN_PROCESS_GROUP,
    )


def test_shardwise_train_in_an_adopted_group_trains_there_and_leaves_it(tmp_path, config):
    work_dir = tmp_path / "work"
    results = run_distributed(
        _shardwise_train_in_an_adopted_group, 2, config, str(work_dir), init_pg=True, timeout=180
    )
    for seen in results:
        assert seen["refused"] == 2 and seen["error"].count("\n") == 1
        assert "--nproc-per-node 4 asks for 4 ranks" in seen["error"]
        assert "already initialised in this process has 2" in seen["error"]
        assert seen["code"] == 0 and seen["alive"] and seen["sum"] == 2.0
        assert not seen["tore_down"]
    assert sorted(records(work_dir)) == [2, 4, 6, 8, 10, 12]


def _adopt_with_disagreeing_variables() -> str:
    from shardwise.strategies import DDPStrategy

    os.environ["WORLD_SIZE"] = "4"
    try:
        DDPStrategy()
    except ValueError as exc:
        return str(exc)
    return "accepted"


def test_launcher_variables_that_disagree_with_an_adopted_group_are_refused():
    messages = run_distributed(_adopt_with_disagreeing_variables, 2, init_pg=True, timeout=120)
    for message in messages:
        assert message.startswith("WORLD_SIZE=4 but the process group already initialised")
        assert "has 2 rank(s)" in message


_EXIT_PROBE = """
import atexit, os, sys
import torch.distributed as torch_dist
def report():  # registered before shardwise's handler, so it runs after it (LIFO)
    print("initialised at exit:", torch_dist.is_initialized(), flush=True)
    torch_dist.destroy_process_group()  # the owner's job
atexit.register(report)
torch_dist.init_process_group(
    "gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1
)
from shardwise import dist
dist.init_dist("pytorch")
from shardwise.strategies import DDPStrategy
strategy = DDPStrategy()
print("adopted:", strategy.distributed, dist.owns_process_group(), flush=True)
"""


def test_interpreter_exit_leaves_an_adopted_group_to_its_owner(tmp_path):
    env = base_env(PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_PROBE, str(free_port())],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == "adopted: True False initialised at exit: True".split()


def test_the_readme_s_cluster_recipes_name_tests_that_exist():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Running on a cluster", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(?:tests/[\w/]+\.py::)?(test_\w+)`", section))
    defined = {
        name
        for path in (REPO / "tests").glob("test_*.py")
        for name in re.findall(r"^def (test_\w+)", path.read_text(), flags=re.M)
    }
    assert len(named) >= 12 and named <= defined, named - defined
    for path in re.findall(r"`((?:examples|tests)/[\w/.]+)`", section):
        assert (REPO / path).exists(), path
