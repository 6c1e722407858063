"""Process-group setup, device choice, rank helpers and collectives.

What the launcher told the process (rank, world, master; launcher inference) is read and
checked by :mod:`shardwise.launch_env`; import its names from there (``infer_launcher`` is
here too, where mmengine's ``mmengine.dist`` has it).

Every helper works without a process group: rank 0, world size 1, collectives are
identities. With one, tensors are communicated where the backend wants them: CPU
tensors on gloo; on NCCL a CPU tensor is moved to the current CUDA device for the
collective and its result copied back in place.

Example::

    from shardwise import dist, launch_env

    dist.init_dist(launch_env.infer_launcher(), timeout=600)
    loss = dist.all_reduce(loss.detach().clone(), op='mean')
    if dist.is_main_process():
        print(loss)
"""

from __future__ import annotations

import atexit
import copy
import datetime
import functools
import gc
import logging
import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
import torch.distributed as torch_dist
from torch.distributed import ProcessGroup

from . import launch_env
from .launch_env import infer_launcher

__all__ = [
    "env_kwargs_from_cfg",
    "check_adopted_group",
    "destroy_process_group",
    "owns_process_group",
    "REDUCE_OPS",
    "all_gather_object",
    "all_reduce",
    "barrier",
    "broadcast",
    "broadcast_object",
    "get_backend",
    "get_device",
    "get_dist_info",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "infer_launcher",
    "init_dist",
    "is_distributed",
    "is_main_process",
    "master_only",
]

logger = logging.getLogger(__name__)

REDUCE_OPS = ("sum", "mean", "max", "min", "product")

F = TypeVar("F", bound=Callable[..., Any])


# --------------------------------------------------------------------------- the process group

_OWNED_GROUP: weakref.ref | None = None


def owns_process_group() -> bool:
    """Whether the default process group is shardwise's: created by :func:`init_dist` (or
    by a strategy that needed one, FSDP's one-rank group). ``False`` for a group the caller
    initialised (Ray Train, user code, a notebook), which shardwise uses and never destroys,
    and when there is none."""
    if not is_distributed() or _OWNED_GROUP is None:
        return False
    return _OWNED_GROUP() is torch_dist.group.WORLD


def destroy_at_exit() -> None:
    """Record the default process group, just created by shardwise, as shardwise's
    (:func:`owns_process_group`), and have it destroyed at interpreter exit while Python is
    still whole (the handler is registered once; a no-op when the group is gone already or
    is not shardwise's).

    A process that exits with its group alive leaves gloo's worker threads holding tensors
    whose release during the interpreter's finalization needs the GIL and aborts the process
    ("terminate called without an active exception", exit code -6) after a successful run:
    pytorch#179291, whose fix in torch (this handler) was not merged. Garbage is collected
    first: a DDP or FSDP module left in a reference cycle still holds the group, and
    the group's threads are joined only when its last reference goes.
    """
    global _OWNED_GROUP
    if is_distributed():
        _OWNED_GROUP = weakref.ref(torch_dist.group.WORLD)
    _register_exit_handler()


@functools.cache
def _register_exit_handler() -> None:
    atexit.register(_destroy_process_groups)


def _destroy_process_groups() -> None:
    if owns_process_group():
        gc.collect()
        try:
            torch_dist.destroy_process_group()
        except Exception as exc:  # noqa: BLE001 - the process is ending either way
            logger.debug("destroy_process_group at exit failed: %s", exc)


def destroy_process_group() -> bool:
    """Destroy the default process group if shardwise created it (:func:`owns_process_group`);
    return whether it did. A group the caller initialised is left alone."""
    if not owns_process_group():
        return False
    gc.collect()
    torch_dist.destroy_process_group()
    return True


def check_adopted_group(launcher: str | None = None, env: Mapping[str, str] | None = None) -> None:
    """Check an already initialised process group against the environment's launcher
    variables before using it: ``WORLD_SIZE``/``RANK`` when set, and with ``launcher``
    named, that launcher's (``SLURM_NTASKS``/``SLURM_PROCID``, ``OMPI_COMM_WORLD_*``).
    Raises :class:`~shardwise.launch_env.LauncherEnvError` naming them; no collective runs."""
    env = os.environ if env is None else env
    world, rank = torch_dist.get_world_size(), torch_dist.get_rank()
    pairs = [("WORLD_SIZE", world), ("RANK", rank)]
    if launcher == "slurm":
        pairs += [("SLURM_NTASKS", world), ("SLURM_PROCID", rank)]
    elif launcher == "mpi":
        pairs += [("OMPI_COMM_WORLD_SIZE", world), ("OMPI_COMM_WORLD_RANK", rank)]
    for name, actual in pairs:
        value = launch_env.env_int(env, name)
        if value is not None and value != actual:
            raise launch_env.LauncherEnvError(
                f"{name}={value} but the process group already initialised in this process "
                f"has {world} rank(s) and this is rank {rank}; the group is used as it is: "
                f"unset {name} or initialise the group from the same launch"
            )


def init_dist(
    launcher: str,
    backend: str | None = None,
    timeout: float | datetime.timedelta | None = None,
    **kwargs: Any,
) -> None:
    """Initialise the default process group for ``launcher``.

    Args:
        launcher: ``'pytorch'`` (torchrun), ``'slurm'``, ``'mpi'`` (Open MPI) or
            ``'none'`` (do nothing).
        backend: ``'nccl'`` when CUDA is available, else ``'gloo'``, by default.
        timeout: rendezvous and collective timeout, in seconds or as a timedelta.
            An unreachable rendezvous raises ``RuntimeError`` after it.
        **kwargs: ``port`` (used for ``MASTER_PORT`` when the environment has none;
            default 29500); the rest go to ``torch.distributed.init_process_group``.

    The launcher's variables are checked first
    (:func:`~shardwise.launch_env.read_launch_env`): a missing or inconsistent one raises
    :class:`~shardwise.launch_env.LauncherEnvError` before anything connects.
    SLURM: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` come from ``SLURM_PROCID``/
    ``SLURM_NTASKS``/``SLURM_LOCALID``; ``MASTER_ADDR`` (unless set) is the first host
    of the step's node list; ``MASTER_PORT`` (unless set) is ``port`` or derived from
    ``SLURM_JOB_ID`` (:func:`~shardwise.launch_env.slurm_master_port`). Open MPI: from the
    ``OMPI_COMM_WORLD_*`` variables; ``MASTER_ADDR`` must be set when the job spans several
    nodes. Otherwise ``MASTER_PORT`` is the environment's, else ``port``, else 29500.

    An already initialised process group is adopted as it is (checked against the
    environment by :func:`check_adopted_group`): shardwise uses it and never destroys it.
    A group this function creates is destroyed at interpreter exit
    (:func:`destroy_at_exit`) unless destroyed before.
    """
    if launcher not in launch_env.LAUNCHERS:
        raise ValueError(
            f"Unknown launcher {launcher!r}; expected one of {list(launch_env.LAUNCHERS)}."
        )
    timeout = _as_timedelta(timeout)
    if launcher == "none":
        return
    if not torch_dist.is_available():
        raise RuntimeError("torch.distributed is not available in this PyTorch build.")
    if torch_dist.is_initialized():
        if not owns_process_group():
            check_adopted_group(launcher)
        logger.info(
            "Process group already initialised (backend %s, rank %d of %d); using it.",
            torch_dist.get_backend(),
            torch_dist.get_rank(),
            torch_dist.get_world_size(),
        )
        return
    launch_env.read_launch_env(launcher)  # refuse inconsistent variables before anything connects
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    port = kwargs.pop("port", None)

    if launcher == "slurm":
        _setup_slurm_env(port)
    elif launcher == "mpi":
        _setup_mpi_env(port)
    else:
        _setup_torchrun_env(port)

    local_rank = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if "nccl" in backend and local_rank >= count:
            raise ValueError(
                f"LOCAL_RANK={local_rank} but this node has only {count} CUDA device(s); "
                "start at most one process per GPU."
            )
        torch.cuda.set_device(local_rank % count)

    if timeout is not None:
        kwargs["timeout"] = timeout
    addr, port_str = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        torch_dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **kwargs)
    except (RuntimeError, TimeoutError, OSError) as exc:
        waited = f" within {timeout.total_seconds():g} s" if timeout is not None else ""
        raise RuntimeError(
            f"Could not join the process group at {addr}:{port_str} as rank {rank} of "
            f"{world_size}{waited} (launcher {launcher!r}, backend {backend!r}): {exc}\n"
            "Check that rank 0 is running and listening on MASTER_ADDR:MASTER_PORT, that "
            "this host can reach it (firewall, network interface), and that every rank "
            "uses the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE."
        ) from exc
    destroy_at_exit()
    logger.info(
        "Initialised process group: launcher %s, backend %s, rank %d of %d, master %s:%s.",
        launcher,
        backend,
        rank,
        world_size,
        addr,
        port_str,
    )


def _as_timedelta(timeout: float | datetime.timedelta | None) -> datetime.timedelta | None:
    if timeout is None or isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
        return datetime.timedelta(seconds=timeout)
    raise TypeError(
        f"timeout must be a positive number of seconds or a datetime.timedelta, got {timeout!r}."
    )


def _setup_torchrun_env(port: int | None) -> None:
    launch_env.require_vars(
        os.environ,
        "pytorch",
        ("RANK", "WORLD_SIZE", "MASTER_ADDR"),
        "start the script with torchrun (python -m torch.distributed.run).",
    )
    os.environ.setdefault("MASTER_PORT", str(port or launch_env.DEFAULT_PORT))


def _setup_slurm_env(port: int | None) -> None:
    env = os.environ
    proc_id = int(env["SLURM_PROCID"])
    env["MASTER_ADDR"] = launch_env.slurm_master_addr(env)
    env["MASTER_PORT"] = str(launch_env.slurm_master_port(env, port))
    env["RANK"] = str(proc_id)
    env["WORLD_SIZE"] = env["SLURM_NTASKS"]
    if "SLURM_LOCALID" in env:
        env["LOCAL_RANK"] = env["SLURM_LOCALID"]
    else:
        env["LOCAL_RANK"] = str(proc_id % max(torch.cuda.device_count(), 1))
    per_node = launch_env.slurm_tasks_per_node(env)
    if per_node is not None:
        env["LOCAL_WORLD_SIZE"] = str(per_node)


def _setup_mpi_env(port: int | None) -> None:
    env = os.environ
    world_size = env["OMPI_COMM_WORLD_SIZE"]
    local_size = env.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    if "MASTER_ADDR" not in env:
        if local_size != world_size:
            raise launch_env.LauncherEnvError(
                "launcher='mpi' across several nodes needs MASTER_ADDR (the host of rank 0); "
                "pass it with `mpirun -x MASTER_ADDR=<host> ...`."
            )
        env["MASTER_ADDR"] = "127.0.0.1"
    env.setdefault("MASTER_PORT", str(port or launch_env.DEFAULT_PORT))
    env["RANK"] = env["OMPI_COMM_WORLD_RANK"]
    env["WORLD_SIZE"] = world_size
    env["LOCAL_RANK"] = env["OMPI_COMM_WORLD_LOCAL_RANK"]
    if local_size is not None:
        env["LOCAL_WORLD_SIZE"] = local_size


# --------------------------------------------------------------------------- ranks


def is_distributed() -> bool:
    """Whether a default process group is initialised."""
    return torch_dist.is_available() and torch_dist.is_initialized()


def get_rank(group: ProcessGroup | None = None) -> int:
    """Rank of this process in ``group`` (default group); 0 when not distributed."""
    return torch_dist.get_rank(group) if is_distributed() else 0


def get_world_size(group: ProcessGroup | None = None) -> int:
    """Number of processes in ``group`` (default group); 1 when not distributed."""
    return torch_dist.get_world_size(group) if is_distributed() else 1


def get_dist_info(group: ProcessGroup | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` of ``group``."""
    return get_rank(group), get_world_size(group)


def get_local_size() -> int:
    """Processes on this node: ``LOCAL_WORLD_SIZE`` as set by the launcher.

    Without it: 1 when not distributed, else the world size (a single node).
    """
    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    return get_world_size()


def get_local_rank() -> int:
    """Rank of this process on its node: ``LOCAL_RANK`` as set by the launcher.

    Without it: 0 when not distributed, else the global rank (a single node).
    """
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    return get_rank()


def is_main_process(group: ProcessGroup | None = None) -> bool:
    """Whether this process is rank 0 of ``group``."""
    return get_rank(group) == 0


def master_only(func: F) -> F:
    """Decorator: run ``func`` on rank 0 only; other ranks get ``None``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if is_main_process():
            return func(*args, **kwargs)
        return None

    return wrapper  # type: ignore[return-value]


def get_backend(group: ProcessGroup | None = None) -> str | None:
    """Backend name of ``group`` (e.g. ``'gloo'``, ``'nccl'``); ``None`` when not distributed."""
    return str(torch_dist.get_backend(group)) if is_distributed() else None


def get_device() -> torch.device:
    """``cuda:<local rank>`` when CUDA is available, else ``cpu``; ``cpu`` also for an adopted
    process group (:func:`owns_process_group` False) whose backend cannot carry CUDA tensors'
    collectives the way NCCL does (gloo alone: a Ray Train run with ``use_gpu=False``)."""
    if torch.cuda.is_available():
        if is_distributed() and not owns_process_group() and "nccl" not in (get_backend() or ""):
            return torch.device("cpu")
        return torch.device("cuda", get_local_rank() % torch.cuda.device_count())
    return torch.device("cpu")


# --------------------------------------------------------------------------- collectives


def barrier(group: ProcessGroup | None = None) -> None:
    """Wait until every process of ``group`` gets here; nothing when not distributed."""
    if is_distributed():
        torch_dist.barrier(group)


def _comm_device(group: ProcessGroup | None) -> torch.device | None:
    """The device the backend needs tensors on, or ``None`` for wherever they are."""
    if "nccl" in (get_backend(group) or ""):
        return torch.device("cuda", torch.cuda.current_device())
    return None


def _run_in_place(tensor: torch.Tensor, group: ProcessGroup | None, op: Callable) -> None:
    device = _comm_device(group)
    if device is None or tensor.device == device:
        op(tensor)
        return
    staged = tensor.to(device)
    op(staged)
    tensor.copy_(staged)


def broadcast(
    tensor: torch.Tensor, src: int = 0, group: ProcessGroup | None = None
) -> torch.Tensor:
    """Overwrite ``tensor`` in place with the one on global rank ``src``; return it."""
    if is_distributed():
        _run_in_place(tensor, group, lambda t: torch_dist.broadcast(t, src=src, group=group))
    return tensor


def all_reduce(
    tensor: torch.Tensor, op: str = "sum", group: ProcessGroup | None = None
) -> torch.Tensor:
    """Reduce ``tensor`` across ``group`` in place and return it.

    ``op`` is one of ``'sum'``, ``'mean'``, ``'max'``, ``'min'``, ``'product'``.
    ``'mean'`` is a sum divided by the world size (so it works on gloo) and needs a
    floating point or complex tensor.
    """
    name = op.lower() if isinstance(op, str) else op
    if name not in REDUCE_OPS:
        raise ValueError(f"Unknown reduce op {op!r}; expected one of {list(REDUCE_OPS)}.")
    if name == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(
            f"all_reduce(op='mean') needs a floating point tensor, got {tensor.dtype}; "
            "convert it with .float() first."
        )
    if not is_distributed():
        return tensor
    reduce_op = {
        "sum": torch_dist.ReduceOp.SUM,
        "mean": torch_dist.ReduceOp.SUM,
        "max": torch_dist.ReduceOp.MAX,
        "min": torch_dist.ReduceOp.MIN,
        "product": torch_dist.ReduceOp.PRODUCT,
    }[name]
    _run_in_place(tensor, group, lambda t: torch_dist.all_reduce(t, op=reduce_op, group=group))
    if name == "mean":
        tensor.div_(get_world_size(group))
    return tensor


def broadcast_object(obj: Any, src: int = 0, group: ProcessGroup | None = None) -> Any:
    """Return global rank ``src``'s ``obj`` (any picklable object) on every rank."""
    if not is_distributed():
        return obj
    holder = [obj]
    torch_dist.broadcast_object_list(holder, src=src, group=group, device=_comm_device(group))
    return holder[0]


def all_gather_object(obj: Any, group: ProcessGroup | None = None) -> list[Any]:
    """Return the list of every rank's ``obj``, in rank order."""
    if not is_distributed():
        return [obj]
    gathered: list[Any] = [None] * get_world_size(group)
    torch_dist.all_gather_object(gathered, obj, group=group)
    return gathered


def env_kwargs_from_cfg(env_cfg: Mapping[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """mmengine's ``env_cfg`` as the strategy's ``env_kwargs``, and a note to log: an NCCL
    backend asked for on a machine without CUDA becomes gloo (mmengine configs name NCCL;
    shardwise's Runner logs the note at debug level: OpenMMLab's base configs name NCCL for
    every run, and a warning would come with every run on CPU)."""
    env = copy.deepcopy(dict(env_cfg or {}))
    dist_cfg = dict(env.get("dist_cfg") or {})
    note = None
    if "nccl" in str(dist_cfg.get("backend", "")) and not torch.cuda.is_available():
        note = f"env_cfg.dist_cfg.backend={dist_cfg['backend']!r} needs CUDA; using gloo"
        dist_cfg["backend"] = "gloo"
    if dist_cfg:
        env["dist_cfg"] = dist_cfg
    return env, note
