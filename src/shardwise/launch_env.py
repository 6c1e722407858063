"""What the launcher told this process: its rank, the world, the node, the master address.

torchrun, SLURM's ``srun``, Kubeflow (``PET_*``, through torchrun) and Open MPI each describe
a rank with their own environment variables. :func:`read_launch_env` reads and checks them
before anything connects: a rank outside the world, variables of two launchers that disagree,
a SLURM node list that does not parse are a :class:`LauncherEnvError` naming the variables.
:func:`infer_launcher` says which launcher started the process; :func:`parse_slurm_nodelist`
expands SLURM's compressed node lists. :mod:`shardwise.dist` sets up the process group from
what this module reads (and re-exports these names).

Example::

    >>> env = read_launch_env('slurm', dict(SLURM_PROCID='1', SLURM_NTASKS='4',
    ...                                     SLURM_NODELIST='node[01-02]'))
    >>> env.rank, env.world_size, env.master_addr
    (1, 4, 'node01')
    >>> parse_slurm_nodelist('node[01-03,7],login')
    ['node01', 'node02', 'node03', 'node7', 'login']
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "DEFAULT_PORT",
    "LAUNCHERS",
    "LaunchEnv",
    "LauncherEnvError",
    "check_no_missed_launcher",
    "env_int",
    "infer_launcher",
    "is_torchrun_worker",
    "parse_slurm_nodelist",
    "read_launch_env",
    "require_vars",
    "slurm_master_addr",
    "slurm_master_port",
    "slurm_nnodes",
    "slurm_tasks_per_node",
]

LAUNCHERS = ("pytorch", "slurm", "mpi", "none")
DEFAULT_PORT = 29500


class LauncherEnvError(ValueError, RuntimeError):
    """A launcher's environment variables are missing, malformed, or disagree with each other
    or with an adopted process group. Raised before any collective, on every rank (each reads
    its own environment). A ``ValueError`` (bad input); also a ``RuntimeError``, which a
    missing variable always raised."""


@dataclass(frozen=True)
class LaunchEnv:
    """What a launcher's environment variables say about this process
    (:func:`read_launch_env`); ``None`` where they say nothing."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    nnodes: int | None = None
    master_addr: str | None = None


def is_torchrun_worker(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process is one of torchrun's workers (``TORCHELASTIC_RUN_ID`` or
    ``LOCAL_RANK`` set: torchrun sets both, ``torch.distributed.launch`` the latter)."""
    env = os.environ if env is None else env
    return "TORCHELASTIC_RUN_ID" in env or "LOCAL_RANK" in env


def infer_launcher(env: Mapping[str, str] | None = None) -> str:
    """Guess how this process was launched from its environment (default ``os.environ``).

    Returns ``'pytorch'`` for a torchrun worker (``LOCAL_RANK`` or ``TORCHELASTIC_RUN_ID``),
    ``'slurm'`` inside an ``srun`` step (``SLURM_NTASKS`` and ``SLURM_PROCID``; torch's
    ``RANK``/``WORLD_SIZE``, when also set, must agree with them), ``'pytorch'`` for ``RANK``
    and ``WORLD_SIZE`` alone (Kubeflow's PyTorchJob with one process per pod, a hand-made
    launch), ``'mpi'`` under Open MPI (``OMPI_COMM_WORLD_LOCAL_RANK``) and ``'none'``
    otherwise. Kubeflow's ``PET_*`` variables are torchrun's options, not a launch: ``shardwise
    train`` starts torchrun from them (:func:`shardwise.runner.launch.plan_launch`).
    """
    env = os.environ if env is None else env
    if is_torchrun_worker(env):
        return "pytorch"
    if "SLURM_NTASKS" in env and "SLURM_PROCID" in env:
        return "slurm"
    if "RANK" in env and "WORLD_SIZE" in env:
        return "pytorch"
    if "OMPI_COMM_WORLD_LOCAL_RANK" in env:
        return "mpi"
    return "none"


def env_int(
    env: Mapping[str, str], name: str, minimum: int = 0, required: bool = False
) -> int | None:
    """The integer in ``env[name]`` (``None`` when absent), refused with the variable's name."""
    if name not in env:
        if required:
            raise LauncherEnvError(f"{name} is not set")
        return None
    raw = str(env[name]).strip()
    try:
        value = int(raw)
    except ValueError:
        raise LauncherEnvError(f"{name}={env[name]!r} is not an integer") from None
    if value < minimum:
        raise LauncherEnvError(f"{name}={value} must be {minimum} or more")
    return value


def require_vars(env: Mapping[str, str], launcher: str, names: tuple[str, ...], hint: str) -> None:
    """Raise :class:`LauncherEnvError` naming the variables of ``names`` that ``env`` lacks
    (``launcher`` and ``hint``, how to start the script, complete the message)."""
    missing = [name for name in names if name not in env]
    if missing:
        raise LauncherEnvError(
            f"launcher={launcher!r} needs the environment variables {missing}; {hint}"
        )


def _outside(rank_name: str, rank: int, size_name: str, size: int, what: str = "ranks") -> None:
    if rank >= size:
        raise LauncherEnvError(
            f"{rank_name}={rank} is outside the world: {size_name}={size} {what} are numbered "
            f"0 to {size - 1}"
        )


def slurm_tasks_per_node(env: Mapping[str, str] | None = None) -> int | None:
    """Tasks per node of this SLURM step when every node runs the same number
    (``SLURM_STEP_TASKS_PER_NODE``, ``SLURM_NTASKS_PER_NODE`` or ``SLURM_TASKS_PER_NODE``, in
    SLURM's ``2(x3)`` form too); ``None`` when unknown or uneven."""
    env = os.environ if env is None else env
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = str(env.get(name, "")).strip()
        if not value:
            continue
        counts = set()
        for part in value.split(","):
            match = re.fullmatch(r"(\d+)(?:\(x\d+\))?", part.strip())
            if match is None:
                return None
            counts.add(int(match.group(1)))
        return counts.pop() if len(counts) == 1 else None
    return None


def slurm_nnodes(env: Mapping[str, str] | None = None) -> int | None:
    """Nodes of this SLURM step: ``SLURM_STEP_NUM_NODES``, ``SLURM_NNODES`` or
    ``SLURM_JOB_NUM_NODES``."""
    env = os.environ if env is None else env
    for name in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        if name in env:
            return env_int(env, name, minimum=1)
    return None


def slurm_master_addr(env: Mapping[str, str] | None = None) -> str:
    """Rank 0's host under SLURM: ``MASTER_ADDR``, else the first host of the step's node list
    (``SLURM_STEP_NODELIST``, ``SLURM_NODELIST`` or ``SLURM_JOB_NODELIST``)."""
    env = os.environ if env is None else env
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    for name in ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"):
        if env.get(name):
            try:
                return parse_slurm_nodelist(env[name])[0]
            except ValueError as exc:
                raise LauncherEnvError(f"{name}={env[name]!r}: {exc}") from None
    raise LauncherEnvError(
        "launcher='slurm' needs MASTER_ADDR or a node list (SLURM_NODELIST, SLURM_JOB_NODELIST) "
        "to find rank 0's host; start the script with srun inside a SLURM allocation"
    )


def slurm_master_port(env: Mapping[str, str] | None = None, port: int | None = None) -> int:
    """The rendezvous port under SLURM: ``MASTER_PORT``, else ``port``, else one derived from
    ``SLURM_JOB_ID`` (20000 to 29999: two jobs sharing a node seldom meet), else 29500."""
    env = os.environ if env is None else env
    given = env_int(env, "MASTER_PORT", minimum=1)
    if given is not None:
        return given
    if port:
        return int(port)
    job = str(env.get("SLURM_JOB_ID", "")).strip()
    return 20000 + int(job) % 10000 if job.isdigit() else DEFAULT_PORT


def _torch_vars_agree(env: Mapping[str, str], pairs: tuple[tuple[str, str, int], ...]) -> None:
    """torch's RANK/WORLD_SIZE, when set beside another launcher's variables, must agree."""
    for torch_name, other_name, other in pairs:
        value = env_int(env, torch_name)
        if value is not None and value != other:
            raise LauncherEnvError(
                f"{other_name}={other} but {torch_name}={value}: the launcher's variables "
                f"disagree with torch's; unset {torch_name} (the launcher sets "
                f"{other_name}), or pass --launcher pytorch / launcher='pytorch' to use "
                f"{torch_name}"
            )


def read_launch_env(launcher: str, env: Mapping[str, str] | None = None) -> LaunchEnv:
    """Read and check ``launcher``'s variables (default environment ``os.environ``).

    Raises :class:`LauncherEnvError` (a ``ValueError``) naming the variables when one is
    missing or not a number, a rank is outside the world (``RANK >= WORLD_SIZE``,
    ``SLURM_PROCID >= SLURM_NTASKS``, ...), two launchers' variables disagree
    (``SLURM_NTASKS=4`` with ``WORLD_SIZE=2``; Kubeflow's ``PET_NNODES`` ×
    ``PET_NPROC_PER_NODE`` against ``WORLD_SIZE``), or a SLURM node list does not parse.
    Reads only: nothing is set, no collective runs.
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"Unknown launcher {launcher!r}; expected one of {list(LAUNCHERS)}.")
    env = os.environ if env is None else env
    if launcher == "none":
        return LaunchEnv("none", 0, 1, 0, 1, 0, 1)
    if launcher == "pytorch":
        return _read_torchrun_env(env)
    if launcher == "slurm":
        return _read_slurm_env(env)
    return _read_mpi_env(env)


def _read_torchrun_env(env: Mapping[str, str]) -> LaunchEnv:
    require_vars(
        env,
        "pytorch",
        ("RANK", "WORLD_SIZE"),
        "start the script with torchrun (python -m torch.distributed.run).",
    )
    world = env_int(env, "WORLD_SIZE", minimum=1)
    rank = env_int(env, "RANK")
    assert world is not None and rank is not None
    _outside("RANK", rank, "WORLD_SIZE", world)
    local_rank = env_int(env, "LOCAL_RANK")
    local_world = env_int(env, "LOCAL_WORLD_SIZE", minimum=1)
    if local_world is not None:
        if local_world > world:
            raise LauncherEnvError(
                f"LOCAL_WORLD_SIZE={local_world} is larger than WORLD_SIZE={world}"
            )
        if local_rank is not None:
            _outside("LOCAL_RANK", local_rank, "LOCAL_WORLD_SIZE", local_world)
    if "PET_NNODES" in env and not is_torchrun_worker(env):
        _check_kubeflow_world(env, rank, world)
    return LaunchEnv(
        "pytorch",
        rank,
        world,
        local_rank,
        local_world,
        env_int(env, "GROUP_RANK"),
        None,
        env.get("MASTER_ADDR"),
    )


def _check_kubeflow_world(env: Mapping[str, str], rank: int, world: int) -> None:
    """A Kubeflow PyTorchJob pod that runs the script itself (no torchrun): its RANK and
    WORLD_SIZE are per pod, which holds only for one process per pod."""
    nproc = str(env.get("PET_NPROC_PER_NODE", "1")).strip()
    nnodes = str(env.get("PET_NNODES", "")).strip()
    if nproc.isdigit() and int(nproc) > 1:
        raise LauncherEnvError(
            f"PET_NPROC_PER_NODE={nproc}: Kubeflow asks for {nproc} processes per pod, but this "
            "one was not started by torchrun (no LOCAL_RANK, no TORCHELASTIC_RUN_ID); make the "
            "container command `shardwise train CONFIG` or `torchrun ... SCRIPT`"
        )
    if nnodes.isdigit() and world != int(nnodes):
        raise LauncherEnvError(
            f"WORLD_SIZE={world} disagrees with PET_NNODES={nnodes} × PET_NPROC_PER_NODE="
            f"{nproc}: one process per pod makes {nnodes} ranks"
        )
    node_rank = env_int(env, "PET_NODE_RANK")
    if node_rank is not None and node_rank != rank:
        raise LauncherEnvError(
            f"RANK={rank} disagrees with PET_NODE_RANK={node_rank} (one process per pod)"
        )


def _read_slurm_env(env: Mapping[str, str]) -> LaunchEnv:
    require_vars(
        env,
        "slurm",
        ("SLURM_PROCID", "SLURM_NTASKS"),
        "start the script with srun inside a SLURM allocation.",
    )
    ntasks = env_int(env, "SLURM_NTASKS", minimum=1)
    procid = env_int(env, "SLURM_PROCID")
    assert ntasks is not None and procid is not None
    _outside("SLURM_PROCID", procid, "SLURM_NTASKS", ntasks, "tasks")
    nnodes = slurm_nnodes(env)
    node_rank = env_int(env, "SLURM_NODEID")
    if nnodes is not None and node_rank is not None:
        _outside("SLURM_NODEID", node_rank, "SLURM_NNODES", nnodes, "nodes")
    if not is_torchrun_worker(env):
        _torch_vars_agree(
            env, (("WORLD_SIZE", "SLURM_NTASKS", ntasks), ("RANK", "SLURM_PROCID", procid))
        )
    local_rank = env_int(env, "SLURM_LOCALID")
    return LaunchEnv(
        "slurm",
        procid,
        ntasks,
        local_rank,
        slurm_tasks_per_node(env),
        node_rank,
        nnodes,
        slurm_master_addr(env),
    )


def _read_mpi_env(env: Mapping[str, str]) -> LaunchEnv:
    names = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")
    require_vars(env, "mpi", names, "start the script with Open MPI's mpirun.")
    world = env_int(env, "OMPI_COMM_WORLD_SIZE", minimum=1)
    rank = env_int(env, "OMPI_COMM_WORLD_RANK")
    local_rank = env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK")
    local_world = env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1)
    assert world is not None and rank is not None and local_rank is not None
    _outside("OMPI_COMM_WORLD_RANK", rank, "OMPI_COMM_WORLD_SIZE", world)
    if local_world is not None:
        _outside(
            "OMPI_COMM_WORLD_LOCAL_RANK", local_rank, "OMPI_COMM_WORLD_LOCAL_SIZE", local_world
        )
    if not is_torchrun_worker(env):
        _torch_vars_agree(
            env,
            (
                ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", world),
                ("RANK", "OMPI_COMM_WORLD_RANK", rank),
            ),
        )
    return LaunchEnv(
        "mpi", rank, world, local_rank, local_world, None, None, env.get("MASTER_ADDR")
    )


def check_no_missed_launcher(env: Mapping[str, str] | None = None) -> None:
    """Refuse to train alone where a launcher's variables ask for several processes that
    nothing started: Kubeflow's ``PET_NNODES``/``PET_NPROC_PER_NODE`` in a pod whose command
    is a plain ``python SCRIPT`` (``shardwise train`` starts torchrun from them itself)."""
    env = os.environ if env is None else env
    if "PET_NNODES" not in env or is_torchrun_worker(env):
        return
    nnodes = str(env["PET_NNODES"]).strip()
    nproc = str(env.get("PET_NPROC_PER_NODE", "1")).strip()
    most = nnodes.split(":")[-1]
    if (most.isdigit() and int(most) > 1) or (nproc.isdigit() and int(nproc) > 1):
        raise LauncherEnvError(
            f"PET_NNODES={nnodes} and PET_NPROC_PER_NODE={nproc} (Kubeflow) ask for several "
            "processes, but no launcher started this one; make the container command "
            "`shardwise train CONFIG` or `torchrun ... SCRIPT` (torchrun reads the PET_ "
            "variables)"
        )


def parse_slurm_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM node list such as ``'node[01-03,7],login'`` into host names.

    Uses ``scontrol show hostnames`` when it is installed, else a parser of the
    common forms (comma separated names, bracketed ranges and lists, several per name).
    Raises ``ValueError`` for a list it cannot read (unbalanced brackets, a range
    that is not numbers or runs backwards, an empty name).
    """
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout.split()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    return _expand_nodelist(nodelist)


_NODELIST_ITEM = re.compile(r"[^,\[\]]+(?:\[[^\[\]]*\][^,\[\]]*)*")


def _expand_nodelist(nodelist: str) -> list[str]:
    # Items are separated by commas outside brackets: 'gpu[01-02,05],login1'.
    text = nodelist.strip()
    items: list[str] = []
    pos = 0
    while pos < len(text):
        match = _NODELIST_ITEM.match(text, pos)
        if match is None or match.end() == pos:
            raise ValueError(f"Cannot parse SLURM node list {nodelist!r} at {text[pos:]!r}.")
        items.append(match.group())
        pos = match.end()
        if pos < len(text):
            if text[pos] != ",":
                raise ValueError(f"Cannot parse SLURM node list {nodelist!r} at {text[pos:]!r}.")
            pos += 1
            if pos == len(text):
                raise ValueError(f"Cannot parse SLURM node list {nodelist!r}: it ends in a comma.")
    hosts = [host for item in items for host in _expand_host(item, nodelist)]
    if not hosts or any(not host or any(c.isspace() for c in host) for host in hosts):
        raise ValueError(f"Cannot parse SLURM node list {nodelist!r}.")
    return hosts


def _expand_host(pattern: str, nodelist: str) -> list[str]:
    match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", pattern)
    if match is None:
        return [pattern]
    prefix, ranges, rest = match.groups()
    heads: list[str] = []
    for part in ranges.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or (dash and int(hi) < int(lo)):
            raise ValueError(
                f"Cannot parse SLURM node list {nodelist!r}: [{ranges}] holds {part!r}, "
                "not a number or a range such as 01-04."
            )
        if dash:
            heads.extend(f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
        else:
            heads.append(prefix + lo)
    return [head + tail for head in heads for tail in _expand_host(rest, nodelist)]
