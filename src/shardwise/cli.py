"""The ``shardwise`` command."""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from shardwise.checkpoint.commands import add_ckpt_parser
from shardwise.runner import commands
from shardwise.runner.commands import add_plot_parser, add_train_parser


def _cmd_env(args: argparse.Namespace) -> int:
    from shardwise.env import collect_env

    for key, value in collect_env().items():
        print(f"{key}: {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardwise", description="Training strategies for PyTorch: CPU, GPU, DDP, FSDP2."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    env = sub.add_parser("env", help="print the collected environment (Python, torch, devices)")
    env.set_defaults(func=_cmd_env)
    add_train_parser(sub)
    add_plot_parser(sub)
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
    exception", pytorch#179291).
    """
    try:
        code = main()
    except SystemExit as exc:  # a preempted run (Runner's Preempted) ends as any other
        if not isinstance(exc.code, int):
            raise
        code = exc.code
    if not commands.TORE_DOWN_PROCESS_GROUP:
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
