"""Where ``shardwise train`` runs its ranks: in this process, or in workers it starts through
torch's elastic launcher (torchrun). Decided once, by :func:`plan_launch`, from the command
line and the environment, in this order:

- a process group already initialised in this process (a notebook, Ray Train): its ranks
  train here, in that group, which shardwise leaves alive;
- a torchrun worker (``LOCAL_RANK`` / ``TORCHELASTIC_RUN_ID``): trains its rank here
  (launcher ``pytorch``);
- a Kubeflow pod (``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
  ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``; PyTorchJob and TrainJob set them for torchrun)
  whose command is ``shardwise train`` itself: starts torchrun once per pod with them (a pod
  whose command is torchrun is the case above);
- ``srun`` (``SLURM_PROCID``, ``SLURM_NTASKS``): one task per rank trains its rank here
  (launcher ``slurm``: rank from ``SLURM_PROCID``, master from the node list, compressed forms
  such as ``node[01-04,07]`` included); one task per node with ``--nproc-per-node N`` starts
  torchrun once per node: ``SLURM_NNODES`` nodes, node rank ``SLURM_NODEID``, a static
  rendezvous at the node list's first host (port ``MASTER_PORT``, else derived from
  ``SLURM_JOB_ID``);
- ``RANK`` and ``WORLD_SIZE`` alone: trains its rank here (launcher ``pytorch``);
- ``mpirun`` (``OMPI_COMM_WORLD_*``): trains its rank here (launcher ``mpi``);
- nothing: trains here, or with ``--nproc-per-node`` > 1 / ``--nnodes`` > 1 starts torchrun
  with the command line's options.

``--launcher`` names this process's launcher instead of inferring it. The workers run
``python -m shardwise.cli train CONFIG --launcher pytorch ...`` and train in their own process:
nothing is ever launched twice. They die with the ``shardwise train`` that started them
(:func:`die_with_launcher`), even one killed with SIGKILL: torchrun starts them in sessions
of their own, where nothing else would end them. With ``--max-restarts`` > 0 the workers also get
``--auto-resume``: after a crash, torchrun restarts every worker and they continue from the
last checkpoint committed since the launch.

Inconsistent variables (``SLURM_NTASKS=4`` with ``WORLD_SIZE=2``, a rank outside the world,
a node list that does not parse, ``--nproc-per-node`` against the launcher's processes per
node or an existing group's size) raise a ``ValueError`` naming them, before anything starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from shardwise import dist, launch_env

__all__ = [
    "LaunchOptions",
    "LaunchPlan",
    "launch",
    "plan_launch",
    "torchrun_args",
    "LAUNCH_TIME_ENV",
    "LAUNCHER_PID_ENV",
    "TORCHRUN_SIGNALS",
    "die_with_launcher",
]

LAUNCH_TIME_ENV = "SHARDWISE_LAUNCH_TIME"
#: The pid of the ``shardwise train`` process that launched the workers (their parent).
LAUNCHER_PID_ENV = "SHARDWISE_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

#: The signals torchrun's agent forwards to its workers: torchrun's own, and SIGUSR1, which
#: SLURM's ``--signal=USR1@120`` sends before a time limit (the workers' preemption hook
#: turns it into a checkpoint).
TORCHRUN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1")


@dataclass
class LaunchOptions:
    """torchrun's options that ``shardwise train`` exposes (``None``: not given; torchrun's
    default, or the launcher's value where one set the environment)."""

    nproc_per_node: int | None = None
    nnodes: str | None = None
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    max_restarts: int | None = None

    @property
    def nproc(self) -> int:
        """Processes per node (1 when not given)."""
        return self.nproc_per_node or 1

    @property
    def multi_node(self) -> bool:
        return (self.nnodes or "1").split(":")[-1] != "1"

    @property
    def fixed_nnodes(self) -> int | None:
        """The number of nodes when it is one number (not an elastic ``MIN:MAX``)."""
        nnodes = self.nnodes or "1"
        return int(nnodes) if nnodes.isdigit() else None

    def check(self) -> None:
        """Refuse values that cannot launch, before anything starts."""
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node must be at least 1, got {self.nproc_per_node}")
        if self.max_restarts is not None and self.max_restarts < 0:
            raise ValueError(f"--max-restarts must be 0 or more, got {self.max_restarts}")
        if self.node_rank is not None and self.node_rank < 0:
            raise ValueError(f"--node-rank must be 0 or more, got {self.node_rank}")
        if self.nnodes is not None:
            parts = self.nnodes.split(":")
            if (
                len(parts) > 2
                or not all(part.isdigit() for part in parts)
                or not 0 < int(parts[0]) <= int(parts[-1])
            ):
                raise ValueError(
                    f"--nnodes must be a number of nodes or MIN:MAX, got {self.nnodes!r}"
                )
            if self.node_rank is not None and self.fixed_nnodes is not None:
                if self.node_rank >= self.fixed_nnodes:
                    raise ValueError(
                        f"--node-rank {self.node_rank} is outside --nnodes {self.nnodes}: "
                        f"nodes are numbered 0 to {self.fixed_nnodes - 1}"
                    )

    def check_meeting_point(self) -> None:
        """Several nodes need an address every node can reach."""
        if self.multi_node and not (self.rdzv_endpoint or self.master_addr):
            raise ValueError(
                f"--nnodes {self.nnodes} needs a meeting point that every node can reach: "
                "--rdzv-endpoint HOST:PORT (with --rdzv-backend c10d and the same --rdzv-id on "
                "every node), or --master-addr HOST --master-port PORT with --node-rank"
            )


@dataclass(frozen=True)
class LaunchPlan:
    """What ``shardwise train`` does with this process (:func:`plan_launch`).

    Attributes:
        torchrun: start torchrun with these options; ``None``: train in this process.
        launcher: the launcher of the process(es) that train: this one's (``'pytorch'``,
            ``'slurm'``, ``'mpi'``, ``'none'``), or ``'pytorch'`` for torchrun's workers.
        source: what the decision was read from: ``'torchrun'``, ``'slurm'``,
            ``'kubeflow'``, ``'mpi'``, ``'process group'`` (one already initialised here),
            ``'command line'`` (``--nproc-per-node``/``--nnodes`` alone) or ``'none'``.
        world_size, local_world_size: of the run, where known (``None``: unknown, e.g.
            elastic).
        description: one line for the log.
    """

    torchrun: LaunchOptions | None
    launcher: str
    source: str
    world_size: int | None
    local_world_size: int | None
    description: str

    @property
    def in_process(self) -> bool:
        return self.torchrun is None


def _here(launcher: str, source: str, world: int | None, local: int | None, what: str):
    return LaunchPlan(None, launcher, source, world, local, what)


def plan_launch(
    options: LaunchOptions, launcher: str | None = None, env: Mapping[str, str] | None = None
) -> LaunchPlan:
    """Decide where the ranks of ``shardwise train`` run (see the module docstring).

    Args:
        options: the command line's torchrun options (``None`` fields: not given).
        launcher: ``--launcher``, when given: the launcher of this process, which is then
            not inferred (``'slurm'`` may still start torchrun per node).
        env: the environment (default ``os.environ``); only read.

    Raises ``ValueError`` naming the flags and variables that disagree.
    """
    env = os.environ if env is None else env
    options.check()
    nproc = options.nproc_per_node
    if dist.is_distributed():
        return _plan_adopted(options, launcher, env)
    if launcher == "none":
        if (nproc is not None and nproc > 1) or options.multi_node:
            raise ValueError(
                f"--launcher none runs one process, but --nproc-per-node {options.nproc} / "
                f"--nnodes {options.nnodes or 1} ask for more; drop --launcher none"
            )
        return _here("none", "none", 1, 1, "one process")
    if launcher is None:
        if "PET_NNODES" in env and not launch_env.is_torchrun_worker(env):
            return _plan_kubeflow(options, env)
        launcher = launch_env.infer_launcher(env)
    if launcher == "slurm":
        return _plan_slurm(options, env)
    if launcher in ("pytorch", "mpi"):
        return _plan_started(options, launcher, env)
    if launcher != "none":
        raise ValueError(
            f"--launcher must be one of {list(launch_env.LAUNCHERS)}, got {launcher!r}"
        )
    if nproc is None or nproc == 1:
        if not options.multi_node:
            return _here("none", "none", 1, 1, "one process")
    options.check_meeting_point()
    nodes = options.fixed_nnodes
    return LaunchPlan(
        replace(options),
        "pytorch",
        "command line",
        options.nproc * nodes if nodes else None,
        options.nproc,
        f"starting torchrun: {options.nnodes or 1} node(s) × {options.nproc} process(es)",
    )


def _plan_adopted(options: LaunchOptions, launcher: str | None, env: Mapping[str, str]):
    world = dist.get_world_size()
    nodes = options.fixed_nnodes or 1
    if options.nproc_per_node is not None and options.nproc * nodes != world:
        raise ValueError(
            f"--nproc-per-node {options.nproc}"
            + (f" × --nnodes {options.nnodes}" if options.nnodes else "")
            + f" asks for {options.nproc * nodes} ranks, but the process group already "
            f"initialised in this process has {world}; drop --nproc-per-node (the group's "
            "ranks train)"
        )
    dist.check_adopted_group(launcher, env)
    launcher = launcher or launch_env.infer_launcher(env)
    return _here(launcher, "process group", world, None, f"the existing {world}-rank group")


def _check_nproc(options: LaunchOptions, local: int | None, source: str, fix: str) -> None:
    nproc = options.nproc_per_node
    if nproc is None or nproc == local or (nproc == 1 and local is None):
        return
    raise ValueError(
        f"--nproc-per-node {nproc} disagrees with the launcher that started this process: "
        f"{source}; {fix}"
    )


def _plan_started(options: LaunchOptions, launcher: str, env: Mapping[str, str]) -> LaunchPlan:
    """torchrun's worker, RANK/WORLD_SIZE alone, or mpirun: this process is one rank."""
    found = launch_env.read_launch_env(launcher, env)
    if launcher == "mpi":
        source = f"mpirun started {found.local_world_size or '?'} process(es) on this node "
        source += "(OMPI_COMM_WORLD_LOCAL_SIZE)"
    elif found.local_world_size is not None:
        source = f"LOCAL_WORLD_SIZE={found.local_world_size} (processes on this node)"
    else:
        source = f"RANK={found.rank} and WORLD_SIZE={found.world_size} make this process one rank"
    _check_nproc(options, found.local_world_size, source, "drop --nproc-per-node")
    if options.nnodes is not None and options.fixed_nnodes is not None:
        local = found.local_world_size
        if local is not None and options.fixed_nnodes * local != found.world_size:
            raise ValueError(
                f"--nnodes {options.nnodes} disagrees with the launcher that started this "
                f"process: WORLD_SIZE={found.world_size} over LOCAL_WORLD_SIZE={local} per "
                "node; drop --nnodes"
            )
    what = f"rank {found.rank} of {found.world_size} ({launcher})"
    source = "torchrun" if launcher == "pytorch" else launcher
    return _here(launcher, source, found.world_size, found.local_world_size, what)


def _plan_slurm(options: LaunchOptions, env: Mapping[str, str]) -> LaunchPlan:
    """srun: one task per rank (train here) or one task per node (torchrun per node)."""
    found = launch_env.read_launch_env("slurm", env)
    ntasks, nproc = found.world_size, options.nproc_per_node
    nnodes = found.nnodes
    if options.nnodes is not None and nnodes is not None and options.fixed_nnodes != nnodes:
        raise ValueError(
            f"--nnodes {options.nnodes} disagrees with the SLURM step: SLURM_NNODES={nnodes}; "
            "drop --nnodes"
        )
    per_node = found.local_world_size
    step = f"SLURM_NTASKS={ntasks}" + (f", SLURM_NNODES={nnodes}" if nnodes else "")
    if per_node is not None:
        step += f", {_tasks_per_node_name(env)}={env[_tasks_per_node_name(env)]}"
    one_per_node = (nnodes is not None and ntasks == nnodes) or (nnodes is None and per_node == 1)
    if nproc is None or nproc == 1:
        return _here("slurm", "slurm", ntasks, per_node, f"srun task {found.rank} of {ntasks}")
    if not one_per_node:
        here = per_node
        if here is None and nnodes is not None and ntasks % nnodes == 0:
            here = ntasks // nnodes
        if here == nproc:  # srun started the processes already: one task per rank
            what = f"srun task {found.rank} of {ntasks}"
            return _here("slurm", "slurm", ntasks, per_node, what)
        raise ValueError(
            f"--nproc-per-node {nproc} disagrees with the SLURM step ({step}): srun already "
            f"started several tasks per node; run one task per node (srun --ntasks-per-node=1) "
            f"for shardwise to start {nproc} processes on each, or one task per rank (srun "
            f"--ntasks-per-node={nproc}) without --nproc-per-node"
        )
    nodes = nnodes if nnodes is not None else ntasks
    node_rank = found.node_rank if found.node_rank is not None else found.rank
    if found.node_rank is not None and found.node_rank != found.rank:
        raise ValueError(
            f"SLURM_NODEID={found.node_rank} but SLURM_PROCID={found.rank}: with one task per "
            "node they are the same; check the srun options"
        )
    planned = replace(options, nnodes=str(nodes), node_rank=node_rank)
    if options.rdzv_endpoint is None:
        planned.master_addr = options.master_addr or found.master_addr
        planned.master_port = options.master_port or launch_env.slurm_master_port(env)
        meeting = f"{planned.master_addr}:{planned.master_port}"
    else:
        planned.node_rank = None if options.rdzv_backend not in (None, "static") else node_rank
        meeting = options.rdzv_endpoint
    what = (
        f"SLURM, one task per node ({step}): starting torchrun with {nodes} node(s) × {nproc} "
        f"process(es), node rank {node_rank}, rendezvous {meeting}"
    )
    return LaunchPlan(planned, "pytorch", "slurm", nodes * nproc, nproc, what)


def _tasks_per_node_name(env: Mapping[str, str]) -> str:
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if str(env.get(name, "")).strip():
            return name
    return "SLURM_NTASKS_PER_NODE"


def _kubeflow_nproc(value: str) -> int:
    """``PET_NPROC_PER_NODE`` as a number: an integer, or torchrun's ``gpu``/``cpu``/``auto``
    (``auto`` without CUDA: 1 process, not torchrun's one per CPU core)."""
    import torch

    if value.isdigit() and int(value) >= 1:
        return int(value)
    if value in ("auto", "gpu") and torch.cuda.is_available():
        return torch.cuda.device_count()
    if value == "auto":
        return 1
    if value == "cpu":
        return os.cpu_count() or 1
    raise ValueError(
        f"PET_NPROC_PER_NODE={value!r} is not a number of processes (or auto, gpu, cpu)"
        + ("; gpu needs CUDA, which this machine lacks" if value == "gpu" else "")
    )


def _plan_kubeflow(options: LaunchOptions, env: Mapping[str, str]) -> LaunchPlan:
    """A Kubeflow pod (PyTorchJob or TrainJob) whose command is ``shardwise train``: start
    torchrun once per pod with the ``PET_*`` values (which torchrun itself would read)."""
    nnodes = str(env["PET_NNODES"]).strip()
    try:
        LaunchOptions(nnodes=nnodes).check()
    except ValueError:
        raise ValueError(
            f"PET_NNODES={env['PET_NNODES']!r} is not a number of nodes or MIN:MAX"
        ) from None
    if options.nnodes is not None and options.nnodes != nnodes:
        raise ValueError(
            f"--nnodes {options.nnodes} disagrees with Kubeflow's PET_NNODES={nnodes}; "
            "drop --nnodes"
        )
    pet_nproc = str(env.get("PET_NPROC_PER_NODE", "")).strip()
    given = options.nproc_per_node
    if pet_nproc.isdigit() and given is not None and given != int(pet_nproc):
        raise ValueError(
            f"--nproc-per-node {given} disagrees with Kubeflow's PET_NPROC_PER_NODE={pet_nproc} "
            "(numProcPerNode); drop --nproc-per-node or change numProcPerNode"
        )
    nproc = given or (_kubeflow_nproc(pet_nproc) if pet_nproc else 1)
    planned = replace(options, nproc_per_node=nproc, nnodes=nnodes)
    fixed = planned.fixed_nnodes
    if options.max_restarts is None and "PET_MAX_RESTARTS" in env:
        planned.max_restarts = launch_env.env_int(env, "PET_MAX_RESTARTS")
    if "PET_RDZV_ENDPOINT" in env and options.rdzv_endpoint is None:  # elastic PyTorchJob
        planned.rdzv_endpoint = env["PET_RDZV_ENDPOINT"]
        planned.rdzv_backend = options.rdzv_backend or env.get("PET_RDZV_BACKEND") or "c10d"
        planned.rdzv_id = options.rdzv_id or env.get("PET_RDZV_ID")
        meeting = f"rendezvous {planned.rdzv_endpoint} ({planned.rdzv_backend})"
    else:
        node_rank = launch_env.env_int(env, "PET_NODE_RANK")
        if node_rank is not None and fixed is not None and node_rank >= fixed:
            raise ValueError(
                f"PET_NODE_RANK={node_rank} is outside the world: PET_NNODES={nnodes} nodes are "
                f"numbered 0 to {fixed - 1}"
            )
        if planned.node_rank is None:
            planned.node_rank = node_rank if node_rank is not None else 0
        if options.master_addr is None and env.get("PET_MASTER_ADDR"):
            planned.master_addr = env["PET_MASTER_ADDR"]
        if options.master_port is None and "PET_MASTER_PORT" in env:
            planned.master_port = launch_env.env_int(env, "PET_MASTER_PORT", minimum=1)
        if planned.multi_node and (node_rank is None or planned.master_addr is None):
            missing = [n for n in ("PET_NODE_RANK", "PET_MASTER_ADDR") if not env.get(n)]
            raise ValueError(
                f"PET_NNODES={nnodes} but {missing} not set: several pods need their rank and "
                "rank 0's address"
            )
        meeting = f"node rank {planned.node_rank}, master {planned.master_addr or '127.0.0.1'}"
        meeting += f":{planned.master_port or 29500}"
    _check_kubeflow_torch_vars(env, nnodes, pet_nproc, planned)
    what = (
        f"Kubeflow (PET_NNODES={nnodes}, PET_NPROC_PER_NODE={pet_nproc or '1'}): starting "
        f"torchrun with {nnodes} node(s) × {nproc} process(es), {meeting}"
    )
    world = fixed * nproc if fixed else None
    return LaunchPlan(planned, "pytorch", "kubeflow", world, nproc, what)


def _check_kubeflow_torch_vars(
    env: Mapping[str, str], nnodes: str, pet_nproc: str, planned: LaunchOptions
) -> None:
    """PyTorchJob also sets RANK (the pod's) and WORLD_SIZE (pods × numeric nprocPerNode)."""
    world = launch_env.env_int(env, "WORLD_SIZE", minimum=1)
    if world is not None and nnodes.isdigit() and pet_nproc.isdigit():
        expected = int(nnodes) * int(pet_nproc)
        if world not in (expected, int(nnodes)):
            raise ValueError(
                f"WORLD_SIZE={world} disagrees with PET_NNODES={nnodes} × PET_NPROC_PER_NODE="
                f"{pet_nproc} = {expected}"
            )
    rank = launch_env.env_int(env, "RANK")
    if rank is not None and planned.node_rank is not None and "PET_NODE_RANK" in env:
        if rank != planned.node_rank:
            raise ValueError(
                f"RANK={rank} disagrees with PET_NODE_RANK={planned.node_rank} (the pod's rank)"
            )


def torchrun_args(
    options: LaunchOptions, worker_argv: Sequence[str], signals: Sequence[str] = ()
) -> list[str]:
    """torchrun's command line for ``python -m shardwise.cli WORKER_ARGV`` workers;
    ``signals``: the ones its agent forwards to the workers (where this torch has the
    option)."""
    args = [
        f"--nproc-per-node={options.nproc}",
        f"--nnodes={options.nnodes or 1}",
        f"--max-restarts={options.max_restarts or 0}",
    ]
    for flag, value in (
        ("--node-rank", options.node_rank),
        ("--rdzv-backend", options.rdzv_backend),
        ("--rdzv-endpoint", options.rdzv_endpoint),
        ("--rdzv-id", options.rdzv_id),
        ("--master-addr", options.master_addr),
        ("--master-port", options.master_port),
    ):
        if value is not None:
            args.append(f"{flag}={value}")
    if signals:
        args.append(f"--signals-to-handle={','.join(signals)}")
    return [*args, "--module", "shardwise.cli", *worker_argv]


def _torchrun_has(option: str) -> bool:
    from torch.distributed.run import get_args_parser

    return any(option in action.option_strings for action in get_args_parser()._actions)


def forwarded_signals(extra: Sequence[str] = ()) -> list[str]:
    """:data:`TORCHRUN_SIGNALS` and ``extra`` (the run's preemption signals), by name."""
    names = list(TORCHRUN_SIGNALS)
    for name in extra:
        key = str(name).upper()
        key = key if key.startswith("SIG") else f"SIG{key}"
        if hasattr(signal.Signals, key) and key not in names:
            names.append(key)
    return names


def launch(options: LaunchOptions, worker_argv: Sequence[str], signals: Sequence[str] = ()) -> int:
    """Run the workers under ``torch.distributed.run`` in this process; return the exit code:
    0 when every worker succeeded; the preempted code (143) when every failed worker was
    preempted (a checkpoint committed); 128 + the signal's number when this process got a
    signal it forwarded to the workers; 1 otherwise, with torchrun's report of the failure.
    ``signals``: more signals to forward than :data:`TORCHRUN_SIGNALS` (e.g. the run's
    preemption signals)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    options.check()
    options.check_meeting_point()
    os.environ.setdefault(LAUNCH_TIME_ENV, repr(time.time()))
    if (options.max_restarts or 0) > 0:
        # torchrun shares its rendezvous store with the workers by default, and restarted
        # workers can then read the previous attempt's addresses from it and fail to connect
        # (pytorch/pytorch#135712); a fresh store per attempt avoids that.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if "OMP_NUM_THREADS" not in os.environ:  # share the cores between the local workers
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        os.environ["OMP_NUM_THREADS"] = str(max(1, (cores or 1) // options.nproc))
    forwarded = forwarded_signals(signals) if _torchrun_has("--signals-to-handle") else []
    args = get_args_parser().parse_args(torchrun_args(options, worker_argv, forwarded))
    from .refusals import REFUSED_EXIT_CODE, Refusals

    refusals = Refusals()  # where a worker leaves the one line of bad input it found
    from .hooks import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE

    try:
        with _quiet_about_ctrl_c(), _launcher_pid_for_the_workers():
            run(args)
    except ChildFailedError as exc:
        refusal = refusals.line(exc)
        if refusal is not None:  # bad input the workers found: their one line, exit code 2
            print(refusal, file=sys.stderr)
            return REFUSED_EXIT_CODE
        codes = {failure.exitcode for failure in exc.failures.values()}
        if codes == {INTERRUPTED_EXIT_CODE}:  # Ctrl-C reached the workers: rank 0 said so
            return INTERRUPTED_EXIT_CODE
        print(exc.format_msg(), file=sys.stderr)
        return PREEMPTED_EXIT_CODE if codes == {PREEMPTED_EXIT_CODE} else 1
    except SignalException as exc:
        if exc.sigval == signal.SIGINT:  # Ctrl-C: the workers' rank 0 said what they did
            return INTERRUPTED_EXIT_CODE
        print(
            f"shardwise train: {signal.Signals(exc.sigval).name} received; forwarded to the "
            "workers",
            file=sys.stderr,
        )
        return 128 + int(exc.sigval)
    return 0


class _CtrlCNotes(logging.Filter):
    """Drops torchrun's agent's notes about passing Ctrl-C on ("Received 2 death signal",
    "Sending process N closing signal SIGINT"): the workers' rank 0 says what Ctrl-C did."""

    interrupted = False  # after Ctrl-C, the agent's SIGTERM on a second one goes unsaid too

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if "death signal" in text or "closing signal" in text:
            args = record.args if isinstance(record.args, tuple) else ()
            self.interrupted |= any(arg in (signal.SIGINT, "SIGINT") for arg in args)
            return not self.interrupted
        return True


@contextlib.contextmanager
def _quiet_about_ctrl_c() -> Iterator[None]:
    names = (
        "torch.distributed.elastic.agent.server.api",
        "torch.distributed.elastic.multiprocessing.api",
    )
    loggers = [logging.getLogger(name) for name in names]
    quiet = _CtrlCNotes()
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


@contextlib.contextmanager
def _launcher_pid_for_the_workers() -> Iterator[None]:
    """:data:`LAUNCHER_PID_ENV` in the workers' environment (see :func:`die_with_launcher`),
    and as it was in this process's afterwards."""
    before = os.environ.get(LAUNCHER_PID_ENV)
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LAUNCHER_PID_ENV, None)
        else:
            os.environ[LAUNCHER_PID_ENV] = before


def die_with_launcher(env: Mapping[str, str] | None = None) -> bool:
    """In a worker that :func:`launch` started (its parent's pid in :data:`LAUNCHER_PID_ENV`),
    have the kernel send this process SIGKILL when the launcher dies (Linux's
    ``prctl(PR_SET_PDEATHSIG)``; elsewhere a daemon thread that checks the parent every half
    second); whether it did. A launcher that is already gone ends this process at once."""
    env = os.environ if env is None else env
    launcher = str(env.get(LAUNCHER_PID_ENV, ""))
    if not launcher.isdigit() or int(launcher) != os.getppid():
        return False  # not started by shardwise train (or the launcher is gone already)
    pid = int(launcher)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != pid:  # the launcher died before the call
                os.kill(os.getpid(), signal.SIGKILL)
            return True
    thread = threading.Thread(
        target=_watch_launcher, args=(pid,), name="shardwise-launcher-watch", daemon=True
    )
    thread.start()
    return True


def _watch_launcher(pid: int) -> None:
    while os.getppid() == pid:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
