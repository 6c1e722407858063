"""``shardwise train`` and ``shardwise plot`` (placeholders until the runner lands)."""

from __future__ import annotations

import argparse


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``shardwise train``."""


def add_plot_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``shardwise plot``."""
