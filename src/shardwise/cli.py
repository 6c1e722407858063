"""The ``shardwise`` command."""

from __future__ import annotations

import argparse
import atexit
import difflib
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from shardwise.checkpoint.commands import add_ckpt_parser
from shardwise.runner import commands
from shardwise.runner.commands import add_plot_parser, add_train_parser


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
