"""What every process of a run would print alike, printed once.

``shardwise train`` reads and checks the config in the launching process before it starts the
workers, and every worker reads and checks it again: the warnings of that (a package that
warns when imported, as mmcv-lite's ``Fail to import MultiScaleDeformableAttention``; a config
key that is a near miss) are the launcher's to print, or, under another launcher (torchrun,
srun), rank 0's (:func:`said_elsewhere`, :func:`quiet_if_said_elsewhere`). A rank other than 0
writes the Python warnings it meets later into its own log file, not onto the terminal
(:func:`warnings_to_log_file`): rank 0 prints the same ones.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator

__all__ = [
    "quiet_if_said_elsewhere",
    "said_elsewhere",
    "started_by_shardwise_train",
    "warnings_to_log_file",
]


def started_by_shardwise_train() -> bool:
    """Whether this process is a worker that ``shardwise train`` started (its parent)."""
    from .launch import LAUNCHER_PID_ENV

    return os.environ.get(LAUNCHER_PID_ENV, "") == str(os.getppid())


def said_elsewhere() -> bool:
    """Whether this process is a rank whose messages about the config another process prints:
    any rank that ``shardwise train`` started (it checked the config first), else a rank
    other than 0."""
    rank = os.environ.get("RANK")
    return rank is not None and (rank != "0" or started_by_shardwise_train())


@contextlib.contextmanager
def quiet_if_said_elsewhere() -> Iterator[None]:
    """Python's warnings inside the block are not shown where :func:`said_elsewhere`."""
    if not said_elsewhere():
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class _ToRunLogger(logging.Handler):
    """A Python warning as a record of the run's logger (``shardwise``): its file handler
    writes it into this rank's log file; its console handler passes only errors on a rank
    other than 0."""

    def emit(self, record: logging.LogRecord) -> None:
        record.name = "py.warnings"
        logging.getLogger("shardwise").handle(record)


def warnings_to_log_file() -> None:
    """On a rank other than 0, Python's warnings from now on go to the rank's log file."""
    if os.environ.get("RANK", "0") == "0":
        return
    logging.captureWarnings(True)
    captured = logging.getLogger("py.warnings")
    captured.propagate = False
    if not any(isinstance(h, _ToRunLogger) for h in captured.handlers):
        captured.addHandler(_ToRunLogger())
