"""``shardwise train`` and ``shardwise plot``.

``shardwise train CONFIG`` trains in this process when it runs alone or under a launcher
that already started the processes (torchrun, SLURM's srun with one task per rank, mpirun, an
initialised process group: read from the environment). It starts the processes itself through
``torch.distributed.run`` with ``--nproc-per-node N`` (N > 1) or ``--nnodes`` > 1, under
``srun`` with one task per node and ``--nproc-per-node N``, and in a Kubeflow pod (its
``PET_*`` variables). :func:`shardwise.runner.launch.plan_launch` decides.

Examples::

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
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from shardwise.config import DictAction

#: Set once ``train`` has torn its process group down (see :func:`shardwise.cli.entry`).
TORE_DOWN_PROCESS_GROUP = False

__all__ = ["add_train_parser", "add_plot_parser", "train", "load_train_config"]

_LAUNCHERS = ("none", "pytorch", "slurm", "mpi")


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


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``shardwise train``."""
    parser = sub.add_parser(
        "train",
        help="train from a config, in this process or on several (torchrun)",
        description=__doc__.split("Examples::")[0],
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
    parser.set_defaults(func=train)


def add_plot_parser(sub: argparse._SubParsersAction) -> None:
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
    parser.set_defaults(func=_plot)


def _plot(args: argparse.Namespace) -> int:
    from .plot import plot_metrics

    try:
        path = plot_metrics(args.work_dir, args.out)
    except (ImportError, FileNotFoundError, ValueError) as exc:
        print(f"shardwise plot: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


# ----------------------------------------------------------------------------- train


def _make_importable(config: Path) -> None:
    """Let ``custom_imports`` name modules beside the config or in the working directory."""
    for folder in (str(config.parent.absolute()), os.getcwd()):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def load_train_config(
    args: argparse.Namespace, world_size: int | None = None, local_world_size: int | None = None
) -> Any:
    """The config with the command line applied (``--cfg-options``, ``--work-dir``,
    ``--resume``, ``--load-from``, ``--launcher``, ``--requeue``, ``--preempt-signals``),
    checked by ``Runner.check_cfg`` for a run of ``world_size`` ranks, ``local_world_size``
    per node (default: this process's)."""
    from .runner import Runner

    cfg = _read_train_config(args)
    Runner.check_cfg(cfg, world_size=world_size, local_world_size=local_world_size)
    return cfg


def _parse_signals(value: str) -> list[str]:
    import signal

    names = []
    for raw in value.split(","):
        key = raw.strip().upper()
        key = key if key.startswith("SIG") else f"SIG{key}"
        if not hasattr(signal.Signals, key) or key in ("SIGKILL", "SIGSTOP"):
            raise ValueError(
                f"--preempt-signals {value}: {raw.strip()!r} is not a signal that can be caught; "
                "e.g. --preempt-signals SIGTERM,SIGUSR1"
            )
        names.append(key)
    return names


def _read_train_config(args: argparse.Namespace) -> Any:
    """The config with the command line applied, unchecked (see :func:`load_train_config`)."""
    from shardwise.config import Config

    config = Path(args.config)
    if not config.is_file():
        raise FileNotFoundError(f"config file not found: {config}")
    _make_importable(config)
    cfg = Config.fromfile(config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get("work_dir") is None:
        cfg.work_dir = str(Path("work_dirs") / config.stem)
    cfg.work_dir = str(Path(cfg.work_dir).absolute())
    if args.resume is not None and args.load_from is not None:
        raise ValueError(
            "--resume and --load-from both say where to start; use --resume CKPT to continue "
            "a run from CKPT, or --load-from CKPT to start a new run from its weights"
        )
    if args.resume == "auto":  # mmengine's tools/train.py: the latest checkpoint in work_dir
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        if not Path(args.resume).exists():
            from .checks import checkpoints_hint

            hint = checkpoints_hint(Path(args.resume)).replace(
                "resume=True", "--resume without a path"
            )
            raise FileNotFoundError(f"--resume {args.resume}: no such checkpoint. {hint}")
        cfg.resume, cfg.load_from = True, str(Path(args.resume).absolute())
    elif args.load_from is not None:
        cfg.load_from = args.load_from
    if args.launcher is not None:
        cfg.launcher = args.launcher
    preemption = {}
    if getattr(args, "requeue", False):
        preemption["requeue"] = True
    if getattr(args, "preempt_signals", None):
        preemption["signals"] = _parse_signals(args.preempt_signals)
    if preemption:
        current = cfg.get("preemption")
        if current is not None and not isinstance(current, dict):
            raise ValueError(
                f"preemption must be a dict such as dict(signals=['SIGTERM', 'SIGUSR1'], "
                f"requeue=True), got {current!r}"
            )
        cfg.preemption = {**dict(current or {}), **preemption}
    return cfg


def _worker_argv(args: argparse.Namespace, work_dir: str, max_restarts: int = 0) -> list[str]:
    argv = ["train", str(Path(args.config).absolute()), "--launcher", "pytorch"]
    argv += ["--work-dir", work_dir]
    if args.resume == "auto":
        argv.append("--resume")
    elif args.resume is not None:
        argv += ["--resume", str(Path(args.resume).absolute())]
    if args.load_from is not None:
        argv += ["--load-from", str(Path(args.load_from).absolute())]
    if getattr(args, "cfg_options_raw", None):
        argv += ["--cfg-options", *args.cfg_options_raw]
    if args.auto_resume or max_restarts > 0:
        argv.append("--auto-resume")
    if getattr(args, "requeue", False):
        argv.append("--requeue")
    if getattr(args, "preempt_signals", None):
        argv += ["--preempt-signals", args.preempt_signals]
    return argv


def _apply_auto_resume(cfg: Any) -> str | None:
    """On an elastic restart, resume from the newest checkpoint committed since the launch;
    returns what to log about it."""
    from shardwise.checkpoint import find_last_checkpoint

    from .launch import LAUNCH_TIME_ENV

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if restart == 0:
        return None
    latest = find_last_checkpoint(cfg.work_dir)
    launched = float(os.environ.get(LAUNCH_TIME_ENV, "0") or 0)
    if latest is not None and os.stat(latest).st_mtime >= launched:
        cfg.resume, cfg.load_from = latest, None
        return f"Restart {restart}: resuming from {latest}"
    return f"Restart {restart}: no checkpoint committed since the launch; starting over"


def train(args: argparse.Namespace) -> int:
    """``shardwise train``: decide where the ranks run (:func:`~.launch.plan_launch`), check
    the config for that run, then train here or launch the processes."""
    from shardwise import dist

    from .launch import LaunchOptions, launch, plan_launch

    options = LaunchOptions(
        nproc_per_node=args.nproc_per_node,
        nnodes=None if args.nnodes is None else str(args.nnodes),
        node_rank=args.node_rank,
        rdzv_backend=args.rdzv_backend,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        master_addr=args.master_addr,
        master_port=args.master_port,
        max_restarts=args.max_restarts,
    )
    try:
        cfg = _read_train_config(args)
        # as mmengine's tools/train.py: --launcher (or the environment), not a config's key
        plan = plan_launch(options, args.launcher)
        from .runner import Runner

        Runner.check_cfg(cfg, world_size=plan.world_size, local_world_size=plan.local_world_size)
    except (ValueError, TypeError, KeyError, FileNotFoundError, SyntaxError, ImportError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"shardwise train: error: {message}", file=sys.stderr)
        return 2
    if plan.torchrun is not None:
        if plan.source != "command line":
            print(f"shardwise train: {plan.description}", flush=True)
        signals = (cfg.get("preemption") or {}).get("signals") or ()
        signals = [signals] if isinstance(signals, str) else list(signals)
        worker_argv = _worker_argv(args, cfg.work_dir, plan.torchrun.max_restarts or 0)
        return launch(plan.torchrun, worker_argv, signals=signals)

    cfg.launcher = plan.launcher
    notes = []
    if args.auto_resume:
        notes.append(_apply_auto_resume(cfg))
    try:
        runner = Runner.from_cfg(cfg)
        for note in filter(None, notes):
            runner.logger.warning(note)
        runner.train()
    finally:
        if dist.destroy_process_group():  # only a group shardwise created
            global TORE_DOWN_PROCESS_GROUP
            TORE_DOWN_PROCESS_GROUP = True
    return 0
