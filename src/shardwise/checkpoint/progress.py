"""The byte-counting progress bar of the ``shardwise ckpt`` tools, drawn on stderr only when
stderr is a terminal.

A bar redraws itself in place with carriage returns: a file or a pipe (a CI log, ``| tee``)
would keep every redraw, hundreds of fragments on one line. There the bar is off, whatever
the caller asked for; the tools' one-line results are the record.

Example::

    with progress_bar(total_bytes, "verify iter_1000.pth", enabled=not args.no_progress) as bar:
        verify_checkpoint(path, on_bytes=bar.update)
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["draws_a_bar", "progress_bar"]


def draws_a_bar(stream: Any) -> bool:
    """Whether a bar may be drawn on ``stream``: it is a terminal (not a file, a pipe, or
    closed)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def progress_bar(total: int, desc: str, *, enabled: bool = True) -> Any:
    """A tqdm bar over ``total`` bytes on stderr, which draws nothing unless ``enabled`` and
    stderr is a terminal (:func:`draws_a_bar`); ``update(n)`` and ``with`` work either way."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=not (enabled and draws_a_bar(sys.stderr)),
        leave=False,
    )
