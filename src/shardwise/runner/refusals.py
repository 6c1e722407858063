"""Bad input that only the running ranks can find (another run's claim on the work dir's
prefix, credentials a rank's store refuses): one line on the terminal and exit code 2, as for
what ``shardwise train`` finds before it starts them, not a traceback per rank and torchrun's
summary after it.

A rank that meets one (:data:`REFUSED`) reports it with :func:`refuse`: under the workers'
``shardwise train`` launcher it leaves its line in the folder the launcher named
(:data:`REFUSALS_ENV`) and exits 2 without a word; the launcher (:class:`Refusals`) prints the
first rank's line once and exits 2. Under another launcher (torchrun, srun), rank 0 prints it.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from shardwise.checkpoint.object_commit import PrefixClaimedError
from shardwise.checkpoint.storage import StorageConfigError

from .hooks.package_hooks import PackageHookRefused
from .once import started_by_shardwise_train

__all__ = ["REFUSALS_ENV", "REFUSED", "REFUSED_EXIT_CODE", "Refusals", "refuse"]

#: The folder where the ranks leave their refusal (set by :class:`Refusals` for its workers).
REFUSALS_ENV = "SHARDWISE_REFUSALS"
#: The exit code of bad input, the same before and after the ranks start.
REFUSED_EXIT_CODE = 2
#: What a rank refuses as bad input (every rank alike).
REFUSED = (PrefixClaimedError, StorageConfigError, PackageHookRefused)


def refuse(error: BaseException) -> int:
    """Report ``error`` (one of :data:`REFUSED`) as this rank's refusal; the exit code."""
    line = f"shardwise train: error: {' '.join(str(error).split())}"
    folder = os.environ.get(REFUSALS_ENV)
    rank = os.environ.get("RANK", "0")
    if folder and started_by_shardwise_train() and Path(folder).is_dir():
        (Path(folder) / f"rank{int(rank):06d}").write_text(line, encoding="utf-8")
    elif rank == "0":
        print(line, file=sys.stderr, flush=True)
    return REFUSED_EXIT_CODE


#: torchrun's logger of a worker's failure ("failed (exitcode: 2) local_rank: 0 ...").
_TORCHRUN_LOGGER = "torch.distributed.elastic.multiprocessing.api"


class Refusals(logging.Filter):
    """The launcher's side: a folder for its workers' refusals (:data:`REFUSALS_ENV`, removed
        at exit), and the line to print when the workers ended on one. As a filter of torchrun's
        logger, it drops torchrun's own lines about a worker that exited with a refusal and the
    others it stopped then."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="shardwise-refusals-"))
        os.environ[REFUSALS_ENV] = str(self.folder)
        logging.getLogger(_TORCHRUN_LOGGER).addFilter(self)
        atexit.register(self.close)

    def close(self) -> None:
        logging.getLogger(_TORCHRUN_LOGGER).removeFilter(self)
        shutil.rmtree(self.folder, ignore_errors=True)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        text = str(record.msg)
        failed = text.startswith("failed (exitcode") and args[:1] == (REFUSED_EXIT_CODE,)
        stopping = "closing signal" in text  # the other workers, stopped after a refusal
        return not ((failed or stopping) and any(self.folder.glob("rank*")))

    def line(self, failure: Any) -> str | None:
        """The first rank's refusal when the workers ended on one (torchrun's
        ``ChildFailedError``: every failed worker exited 2, or was stopped by a signal after
        another's refusal); None otherwise."""
        lines = [p.read_text(encoding="utf-8") for p in sorted(self.folder.glob("rank*"))]
        codes = [f.exitcode for f in failure.failures.values()]
        if lines and all(code == REFUSED_EXIT_CODE or code < 0 for code in codes):
            return lines[0]
        return None
