"""The ``shardwise`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shardwise.checkpoint.commands import add_ckpt_parser
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


if __name__ == "__main__":
    sys.exit(main())
