"""The ``shardwise`` command.

Building the parser imports nothing heavy (no torch): every subcommand's arguments are
declared here (``ckpt``'s in :mod:`shardwise.checkpoint.commands`, whose module level is as
light), and the module that does a subcommand's work is imported only when it runs. So
``shardwise --help`` and a mistyped flag answer at once, and ``shardwise ckpt inspect``
imports what reading a checkpoint needs, not the runner or the strategies.
"""

from __future__ import annotations

import argparse
import atexit
import difflib
import importlib
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from shardwise.checkpoint.commands import add_ckpt_parser
from shardwise.config import DictAction

_LAUNCHERS = ("none", "pytorch", "slurm", "mpi")

_TRAIN_DESCRIPTION = """\
Train from a config. ``shardwise train CONFIG`` trains in this process when it runs alone
or under a launcher that already started the processes (torchrun, SLURM's srun with one task
per rank, mpirun, an initialised process group: read from the environment). It starts the
processes itself through ``torch.distributed.run`` with ``--nproc-per-node N`` (N > 1) or
``--nnodes`` > 1, under ``srun`` with one task per node and ``--nproc-per-node N``, and in a
Kubeflow pod (its ``PET_*`` variables).

Exit status: 0 on success; 2 for bad input, one line on stderr: found before any worker
starts (the config, a flag, a checkpoint path, a store that cannot be reached or written) or
by the workers (the work dir's prefix claimed by another run); 143 after a preemption
checkpoint; 130 after Ctrl-C (the first finishes the step and saves where the config saves
checkpoints; a second stops at once); 1 for a failure while training.
"""

_TRAIN_EXAMPLES = """

    shardwise train examples/digits_ddp.py                        # one process
    shardwise train examples/gpt_fsdp.py --nproc-per-node 2       # two local processes
    shardwise train cfg.py --nproc-per-node 8 --max-restarts 3    # restart and auto-resume
    torchrun --nproc-per-node 8 -m shardwise.cli train cfg.py     # an existing launcher
    srun --ntasks-per-node=1 shardwise train cfg.py --nproc-per-node 8  # torchrun per node
    srun --ntasks-per-node=8 shardwise train cfg.py               # one srun task per rank
    shardwise train cfg.py --nproc-per-node 8 --resume --requeue  # preempted: requeue (SLURM)
    shardwise train cfg.py --resume                               # the latest checkpoint
    shardwise train cfg.py --cfg-options train_cfg.max_iters=100 optim_wrapper.optimizer.lr=0.1
    shardwise plot work_dirs/cfg                                  # curves into a PNG
    shardwise ft lighthouse --min-replicas 1 &                    # fault tolerance (torchft):
    shardwise train cfg.py --replica-group 0 --num-replica-groups 2   # one replica group
"""


def _later(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """A subcommand's function, imported from ``module`` when the subcommand runs."""

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), name)(args)

    return run


class _Overrides(DictAction):
    """``--cfg-options``: parsed into a dict, and kept as typed for the worker processes."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        try:
            super().__call__(parser, namespace, values, option_string)
        except ValueError as exc:  # argparse's usage error and exit code 2, not a traceback
            raise argparse.ArgumentError(self, str(exc)) from None
        raw = list(getattr(namespace, "cfg_options_raw", None) or [])
        raw += [values] if isinstance(values, str) else list(values)
        namespace.cfg_options_raw = raw


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``shardwise train``."""
    parser = sub.add_parser(
        "train",
        help="train from a config, in this process or on several (torchrun)",
        description=_TRAIN_DESCRIPTION,
        epilog="examples:" + _TRAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", help="the config file (.py, .json or .yaml)")
    parser.add_argument(
        "--work-dir", help="where checkpoints and logs go (default: work_dirs/<config name>)"
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const="auto",
        metavar="CKPT",
        help="resume training: from CKPT, or without a value from the latest checkpoint "
        "committed in the work dir",
    )
    parser.add_argument("--load-from", metavar="CKPT", help="start from these weights")
    parser.add_argument(
        "--cfg-options",
        nargs="+",
        action=_Overrides,
        metavar="KEY=VALUE",
        help="override config values, e.g. train_cfg.max_iters=100 model.depth=4",
    )
    parser.add_argument(
        "--strict-keys",
        action="store_true",
        help="refuse a top-level config key that is a near miss of one the Runner reads "
        "(train_cgf for train_cfg; without it: a warning)",
    )
    parser.add_argument(
        "--launcher",
        choices=_LAUNCHERS,
        help="how the processes were started (default: read from the environment)",
    )
    launch = parser.add_argument_group(
        "launching processes (torch.distributed.run)",
        "used when no launcher started this process and --nproc-per-node > 1 or --nnodes > 1, "
        "under srun with one task per node, and in a Kubeflow pod (PET_* variables)",
    )
    launch.add_argument(
        "--nproc-per-node", type=int, help="processes per node (default 1, or the launcher's)"
    )
    launch.add_argument("--nnodes", help="number of nodes, or MIN:MAX (elastic)")
    launch.add_argument("--node-rank", type=int, help="this node's rank (static rendezvous)")
    launch.add_argument("--rdzv-backend", help="rendezvous backend (e.g. c10d)")
    launch.add_argument("--rdzv-endpoint", help="rendezvous HOST:PORT, the same on every node")
    launch.add_argument("--rdzv-id", help="a job id, the same on every node")
    launch.add_argument("--master-addr", help="rank 0's host (static rendezvous)")
    launch.add_argument("--master-port", type=int, help="rank 0's port (static rendezvous)")
    launch.add_argument(
        "--max-restarts",
        type=int,
        help="restart the workers this many times after a failure (default 0); they resume "
        "from the last checkpoint committed since the launch",
    )
    parser.add_argument(
        "--auto-resume",
        action="store_true",
        help="on an elastic restart (TORCHELASTIC_RESTART_COUNT > 0), resume from the latest "
        "checkpoint committed since the launch (added for the workers when --max-restarts > 0)",
    )
    preempt = parser.add_argument_group(
        "preemption",
        "a preemption signal to any rank ends the run with a checkpoint of that iteration and "
        "exit code 143 (the config's preemption=dict(...))",
    )
    preempt.add_argument(
        "--requeue",
        action="store_true",
        help="after a preemption checkpoint, requeue the SLURM job (scontrol requeue): "
        "preemption.requeue=True",
    )
    preempt.add_argument(
        "--preempt-signals",
        metavar="SIG[,SIG...]",
        help="the signals that mean preemption, e.g. SIGTERM,SIGUSR1: preemption.signals",
    )
    ft = parser.add_argument_group(
        "fault tolerance (torchft)",
        "this launch is one replica group of the config's strategy fault_tolerance; the "
        "environment's REPLICA_GROUP_ID and NUM_REPLICA_GROUPS (torchft's) are used when the "
        "flags are absent",
    )
    ft.add_argument(
        "--replica-group",
        type=int,
        metavar="N",
        help="this replica group's id, 0..num_replica_groups-1: fault_tolerance.replica_group",
    )
    ft.add_argument(
        "--num-replica-groups",
        type=int,
        metavar="N",
        help="how many replica groups the run has: fault_tolerance.num_replica_groups",
    )
    parser.set_defaults(func=_later("shardwise.runner.commands", "train"))


def _add_ft_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``shardwise ft lighthouse``."""
    parser = sub.add_parser("ft", help="fault tolerance (torchft): the lighthouse")
    ft_sub = parser.add_subparsers(dest="ft_command", required=True, metavar="COMMAND")
    lighthouse = ft_sub.add_parser(
        "lighthouse",
        help="run torchft's lighthouse in the foreground",
        description="Run torchft's lighthouse, which forms the quorum of the live replica "
        "groups, until interrupted (Ctrl-C, SIGTERM). Give each replica group its address "
        "(fault_tolerance.lighthouse or TORCHFT_LIGHTHOUSE). Needs torchft: pip install "
        "'shardwise[ft]'.",
        epilog="example:\n  shardwise ft lighthouse --bind 0.0.0.0:29510 --min-replicas 1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    lighthouse.add_argument(
        "--bind", default="[::]:29510", help="HOST:PORT to listen on (default [::]:29510)"
    )
    lighthouse.add_argument(
        "--min-replicas",
        type=int,
        default=1,
        help="replica groups a quorum needs (default 1; the config's min_replicas)",
    )
    lighthouse.add_argument(
        "--join-timeout-ms",
        type=int,
        default=60000,
        help="how long a quorum waits for groups that heartbeat but have not joined "
        "(default 60000)",
    )
    lighthouse.add_argument(
        "--quorum-tick-ms", type=int, default=100, help="quorum check period (default 100)"
    )
    lighthouse.add_argument(
        "--heartbeat-timeout-ms",
        type=int,
        default=5000,
        help="a group silent this long is dead (default 5000)",
    )
    lighthouse.set_defaults(func=_later("shardwise.runner.commands", "ft_lighthouse"))


def _add_plot_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``shardwise plot``."""
    parser = sub.add_parser(
        "plot",
        help="draw loss, lr and validation curves of a run into a PNG",
        description="Draw the loss, learning-rate and validation-metric curves logged in "
        "WORK_DIR/<timestamp>/metrics.jsonl into a PNG (needs matplotlib: "
        "pip install 'shardwise[plot]').",
    )
    parser.add_argument("work_dir", help="a work dir, one run's log dir, or a metrics.jsonl")
    parser.add_argument("--out", help="the PNG to write (default: WORK_DIR/metrics.png)")
    parser.set_defaults(func=_later("shardwise.runner.commands", "_plot"))


def _cmd_env(args: argparse.Namespace) -> int:
    from shardwise.env import collect_env

    for key, value in collect_env().items():
        print(f"{key}: {value}")
    return 0


class _Parser(argparse.ArgumentParser):
    """An argument parser that takes no abbreviations (``--nproc`` is not
    ``--nproc-per-node``) and refuses an unknown argument with its own usage, that of the
    subcommand it was given to, and the nearest flag names."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:  # here, where this (sub)command's usage is known, not in the top parser
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._nearest(extras)}")
        return namespace, extras

    def _nearest(self, extras: Sequence[str]) -> str:
        """``; did you mean --x?`` for the first unknown flag with a near name, or ``''``."""
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        for extra in extras:
            if not extra.startswith("-"):
                continue
            given = extra.split("=", 1)[0]
            near = [f for f in flags if f.startswith(given) or given.startswith(f)]
            near += difflib.get_close_matches(given, flags, n=3, cutoff=0.6)
            near = list(dict.fromkeys(near))[:3]
            if near:
                return f"; did you mean {' or '.join(near)}?"
        return ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="shardwise", description="Training strategies for PyTorch: CPU, GPU, DDP, FSDP2."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    env = sub.add_parser("env", help="print the collected environment (Python, torch, devices)")
    env.set_defaults(func=_cmd_env)
    _add_train_parser(sub)
    _add_plot_parser(sub)
    _add_ft_parser(sub)
    add_ckpt_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


def entry() -> NoReturn:
    """The ``shardwise`` command: :func:`main`, then exit with its code.

    After distributed training, once the process group is torn down, every thread has
    finished and the ``atexit`` handlers have run (the wait for asynchronous saves among
    them), the process leaves without the interpreter's teardown: gloo's threads may still
    be destroyed then and abort a successful run ("terminate called without an active
    exception", pytorch#179291). So does a launcher whose workers were stopped by Ctrl-C
    (the teardown of torchrun's objects takes seconds there).
    """
    try:
        code = main()
    except SystemExit as exc:  # a preempted run (Runner's Preempted) ends as any other
        if not isinstance(exc.code, int):
            raise
        code = exc.code
    except KeyboardInterrupt:  # Ctrl-C outside training (which stops after its step)
        if os.environ.get("RANK", "0") == "0":
            print("shardwise: interrupted (Ctrl-C); exit code 130", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # at once: no teardown of a process group that may be half set up
    commands = sys.modules.get("shardwise.runner.commands")  # imported if train ran
    if not any(getattr(commands, flag, False) for flag in ("TORE_DOWN_PROCESS_GROUP", "STOPPED")):
        sys.exit(code)
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
