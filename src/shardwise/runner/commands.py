"""The work of ``shardwise train`` and ``shardwise plot`` (their arguments are declared in
:mod:`shardwise.cli`, which imports this module only when one of them runs).

``shardwise train CONFIG`` trains in this process when it runs alone or under a launcher
that already started the processes (torchrun, SLURM's srun with one task per rank, mpirun, an
initialised process group: read from the environment). It starts the processes itself through
``torch.distributed.run`` with ``--nproc-per-node N`` (N > 1) or ``--nnodes`` > 1, under
``srun`` with one task per node and ``--nproc-per-node N``, and in a Kubeflow pod (its
``PET_*`` variables). :func:`shardwise.runner.launch.plan_launch` decides.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shardwise.checkpoint.storage import absolute, check_storage, exists, is_url, location

#: Set once ``train`` has torn its process group down (see :func:`shardwise.cli.entry`).
TORE_DOWN_PROCESS_GROUP = False
#: Set once the workers that ``train`` launched were stopped by Ctrl-C (ditto).
STOPPED = False

__all__ = ["train", "load_train_config"]


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
    cfg.work_dir = absolute(cfg.work_dir)
    if args.resume is not None and args.load_from is not None:
        raise ValueError(
            "--resume and --load-from both say where to start; use --resume CKPT to continue "
            "a run from CKPT, or --load-from CKPT to start a new run from its weights"
        )
    if args.resume == "auto":  # mmengine's tools/train.py: the latest checkpoint in work_dir
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        _require_checkpoint(args.resume, "--resume", "--resume without a path")
        cfg.resume, cfg.load_from = True, absolute(args.resume)
    elif args.load_from is not None:
        _require_checkpoint(args.load_from, "--load-from", "--resume")
        cfg.load_from = args.load_from
    if args.launcher is not None:
        cfg.launcher = args.launcher
    _apply_replica_group(cfg, args)
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


def _require_checkpoint(path: str, flag: str, resume_flag: str) -> None:
    """Refuse a checkpoint ``path`` given by ``flag`` that does not exist, in one line naming
    the flag and, as the fix, the command line's way to resume (``resume_flag``)."""
    if is_url(path):
        check_storage(path, flag, write=False)
    if not (exists(path) if is_url(path) else Path(path).exists()):
        from .checks import checkpoints_hint

        hint = checkpoints_hint(location(path), resume=resume_flag)
        raise FileNotFoundError(f"{flag} {path}: no such checkpoint. {hint}")


#: The flags of ``shardwise train`` that set ``fault_tolerance``'s keys, and torchft's
#: environment variables used when they are absent.
_FT_FLAGS = (
    ("replica_group", "--replica-group", "REPLICA_GROUP_ID"),
    ("num_replica_groups", "--num-replica-groups", "NUM_REPLICA_GROUPS"),
)


def _apply_replica_group(cfg: Any, args: argparse.Namespace) -> None:
    """``--replica-group``/``--num-replica-groups`` (else ``REPLICA_GROUP_ID``/
    ``NUM_REPLICA_GROUPS``) into the strategy's ``fault_tolerance``."""
    given, flags = {}, []
    for key, flag, var in _FT_FLAGS:
        value = getattr(args, key, None)
        if value is not None:
            flags.append(flag)
        elif os.environ.get(var, "").strip():
            try:
                value = int(os.environ[var])
            except ValueError:
                raise ValueError(
                    f"{var}={os.environ[var]!r} is not an int; set it to this replica group's "
                    f"{key} or unset it"
                ) from None
        if value is not None:
            given[f"strategy.fault_tolerance.{key}"] = value
    strategy = cfg.get("strategy")
    has_ft = hasattr(strategy, "get") and strategy.get("fault_tolerance") is not None
    if flags and not has_ft:
        raise ValueError(
            f"{' and '.join(flags)} set fault_tolerance keys, but the config's strategy has no "
            "fault_tolerance; add strategy=dict(type='DDPStrategy', fault_tolerance=dict("
            "num_replica_groups=2, min_replicas=1, lighthouse='http://host:29510'))"
        )
    if given and has_ft:
        cfg.merge_from_dict(given)


def _own_replica_group_env(cfg: Any) -> bool:
    """A fault-tolerant replica group of one process started without a launcher: give it
    the environment torchrun would (rank 0 of 1, its TCPStore at ``MASTER_ADDR``, default
    this host, on a free ``MASTER_PORT``); whether it did."""
    import socket

    strategy = cfg.get("strategy")
    if not (hasattr(strategy, "get") and strategy.get("fault_tolerance") is not None):
        return False
    addr = os.environ.get("MASTER_ADDR")
    if not addr:
        addr = socket.gethostname()
        try:
            socket.gethostbyname(addr)
        except OSError:
            addr = "127.0.0.1"
    port = os.environ.get("MASTER_PORT")
    if not port:
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = str(sock.getsockname()[1])
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR=addr,
        MASTER_PORT=port,
    )
    return True


def ft_lighthouse(args: argparse.Namespace) -> int:
    """``shardwise ft lighthouse``: torchft's lighthouse in the foreground until SIGINT or
    SIGTERM."""
    import signal
    import threading

    try:
        from shardwise.strategies.fault_tolerance import import_torchft

        import_torchft(quiet=False)  # the lighthouse's quorum lines are its operators' log
        from torchft.coordination import LighthouseServer
    except ImportError as exc:
        print(f"shardwise ft lighthouse: error: {exc}", file=sys.stderr)
        return 2
    if args.min_replicas < 1:
        print(
            f"shardwise ft lighthouse: error: --min-replicas {args.min_replicas} must be >= 1",
            file=sys.stderr,
        )
        return 2
    try:
        server = LighthouseServer(
            bind=args.bind,
            min_replicas=args.min_replicas,
            join_timeout_ms=args.join_timeout_ms,
            quorum_tick_ms=args.quorum_tick_ms,
            heartbeat_timeout_ms=args.heartbeat_timeout_ms,
        )
    except Exception as exc:
        print(f"shardwise ft lighthouse: error: cannot bind {args.bind}: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(
        f"shardwise ft lighthouse: listening on {server.address()} (min_replicas="
        f"{args.min_replicas}); give the replica groups fault_tolerance.lighthouse="
        f"'{server.address()}' (or TORCHFT_LIGHTHOUSE)",
        flush=True,
    )
    while not stop.wait(0.5):
        pass
    server.shutdown()
    return 0


def _worker_argv(args: argparse.Namespace, work_dir: str, max_restarts: int = 0) -> list[str]:
    argv = ["train", str(Path(args.config).absolute()), "--launcher", "pytorch"]
    argv += ["--work-dir", work_dir]
    if args.resume == "auto":
        argv.append("--resume")
    elif args.resume is not None:
        argv += ["--resume", absolute(args.resume)]
    if args.load_from is not None:
        argv += ["--load-from", absolute(args.load_from)]
    if getattr(args, "cfg_options_raw", None):
        argv += ["--cfg-options", *args.cfg_options_raw]
    if args.auto_resume or max_restarts > 0:
        argv.append("--auto-resume")
    if getattr(args, "requeue", False):
        argv.append("--requeue")
    if getattr(args, "preempt_signals", None):
        argv += ["--preempt-signals", args.preempt_signals]
    for key, flag, _ in _FT_FLAGS:
        if getattr(args, key, None) is not None:
            argv += [flag, str(getattr(args, key))]
    return argv


def _apply_auto_resume(cfg: Any) -> str | None:
    """On an elastic restart, resume from the newest checkpoint committed since the launch;
    returns what to log about it."""
    from shardwise.checkpoint import find_last_checkpoint
    from shardwise.checkpoint.object_commit import commit_time

    from .launch import LAUNCH_TIME_ENV

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if restart == 0:
        return None
    strategy = cfg.get("strategy") or {}
    if isinstance(strategy, Mapping) and strategy.get("memory_checkpoint") not in (None, False):
        cfg.resume, cfg.load_from = True, None  # the memory tier first, then storage's newest
        return f"Restart {restart}: resuming from the newest snapshot in memory, else storage"
    latest = find_last_checkpoint(cfg.work_dir)
    launched = float(os.environ.get(LAUNCH_TIME_ENV, "0") or 0)
    committed = commit_time(latest) if is_url(latest or "") else os.stat(latest or ".").st_mtime
    if latest is not None and committed >= launched:
        cfg.resume, cfg.load_from = latest, None
        return f"Restart {restart}: resuming from {latest}"
    return f"Restart {restart}: no checkpoint committed since the launch; starting over"


def train(args: argparse.Namespace) -> int:
    """``shardwise train``: decide where the ranks run (:func:`~.launch.plan_launch`), check
    the config for that run, then train here or launch the processes."""
    from shardwise import dist

    from .hooks import INTERRUPTED_EXIT_CODE
    from .launch import LaunchOptions, die_with_launcher, launch, plan_launch
    from .once import quiet_if_said_elsewhere, warnings_to_log_file
    from .refusals import REFUSED, refuse

    die_with_launcher()  # a worker of a launching shardwise train ends when it does

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
    from .runner import Runner

    try:
        with quiet_if_said_elsewhere():  # the launcher, or rank 0, prints these warnings
            cfg = _read_train_config(args)
            # as mmengine's tools/train.py: --launcher (or the environment), not a config's key
            plan = plan_launch(options, args.launcher)
            strict_keys = getattr(args, "strict_keys", False)
            sizes = dict(world_size=plan.world_size, local_world_size=plan.local_world_size)
            Runner.check_cfg(cfg, **sizes, strict_keys=strict_keys)
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
        code = launch(plan.torchrun, worker_argv, signals=signals)
        global STOPPED
        STOPPED = code == INTERRUPTED_EXIT_CODE
        return code

    cfg.launcher = plan.launcher
    if plan.launcher == "none" and _own_replica_group_env(cfg):
        cfg.launcher = "pytorch"
    notes = []
    if args.auto_resume:
        notes.append(_apply_auto_resume(cfg))
    warnings_to_log_file()  # a rank other than 0: rank 0 prints the same ones
    try:
        runner = Runner.from_cfg(cfg)
        for note in filter(None, notes):
            runner.logger.warning(note)
        runner.train()
    except REFUSED as exc:  # bad input only the ranks could find: one line, exit code 2
        return refuse(exc)
    finally:
        if dist.destroy_process_group():  # only a group shardwise created
            global TORE_DOWN_PROCESS_GROUP
            TORE_DOWN_PROCESS_GROUP = True
    return 0
