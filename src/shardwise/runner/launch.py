"""Launching ``shardwise train`` on several processes through torch's elastic launcher.

``shardwise train CONFIG --nproc-per-node N`` re-runs itself as ``python -m shardwise.cli
train CONFIG --launcher pytorch ...`` in N worker processes started by
``torch.distributed.run`` (torchrun), in this process, with torchrun's rendezvous and
restart options. Multi-node runs are the same command on every node with ``--nnodes``,
``--node-rank`` or a rendezvous endpoint. With ``--max-restarts`` > 0 the workers also get
``--auto-resume``: after a crash, torchrun restarts every worker and they continue from the
last checkpoint committed since the launch.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LaunchOptions", "launch", "torchrun_args", "LAUNCH_TIME_ENV"]

LAUNCH_TIME_ENV = "SHARDWISE_LAUNCH_TIME"


@dataclass
class LaunchOptions:
    """torchrun's options that ``shardwise train`` exposes (``None``: torchrun's default)."""

    nproc_per_node: int = 1
    nnodes: str = "1"
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    max_restarts: int = 0

    @property
    def multi_node(self) -> bool:
        return self.nnodes.split(":")[-1] != "1"

    def check(self) -> None:
        """Refuse options that cannot launch, before anything starts."""
        if self.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node must be at least 1, got {self.nproc_per_node}")
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts must be 0 or more, got {self.max_restarts}")
        if self.multi_node and not (self.rdzv_endpoint or self.master_addr):
            raise ValueError(
                f"--nnodes {self.nnodes} needs a meeting point that every node can reach: "
                "--rdzv-endpoint HOST:PORT (with --rdzv-backend c10d and the same --rdzv-id on "
                "every node), or --master-addr HOST --master-port PORT with --node-rank"
            )


def torchrun_args(options: LaunchOptions, worker_argv: Sequence[str]) -> list[str]:
    """torchrun's command line for ``python -m shardwise.cli WORKER_ARGV`` workers."""
    args = [
        f"--nproc-per-node={options.nproc_per_node}",
        f"--nnodes={options.nnodes}",
        f"--max-restarts={options.max_restarts}",
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
    return [*args, "--module", "shardwise.cli", *worker_argv]


def launch(options: LaunchOptions, worker_argv: Sequence[str]) -> int:
    """Run the workers under ``torch.distributed.run`` in this process; return the exit code
    (0 when every worker succeeded, 1 otherwise, with torchrun's report of the failure)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    options.check()
    os.environ.setdefault(LAUNCH_TIME_ENV, repr(time.time()))
    if options.max_restarts > 0:
        # torchrun shares its rendezvous store with the workers by default, and restarted
        # workers can then read the previous attempt's addresses from it and fail to connect
        # (pytorch/pytorch#135712); a fresh store per attempt avoids that.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if "OMP_NUM_THREADS" not in os.environ:  # share the cores between the local workers
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        os.environ["OMP_NUM_THREADS"] = str(max(1, (cores or 1) // options.nproc_per_node))
    args = get_args_parser().parse_args(torchrun_args(options, worker_argv))
    try:
        run(args)
    except ChildFailedError as exc:
        print(exc.format_msg(), file=sys.stderr)
        return 1
    return 0
