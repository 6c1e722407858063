"""``shardwise ckpt inspect|convert|verify`` (placeholder until the checkpoint tools land)."""

from __future__ import annotations

import argparse


def add_ckpt_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``shardwise ckpt``."""
