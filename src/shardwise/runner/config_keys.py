"""The top-level keys of a config that the Runner reads, and the near misses of them.

A config file defines many names of its own (``train_pipeline``, ``data_root``,
``bgr_mean``...), which the Runner ignores, as mmengine's does. A name one or two typing
mistakes away from a key the Runner reads (``train_cgf`` for ``train_cfg``, ``modle`` for
``model``) is almost certainly a typo that would leave the run on its base settings:
:func:`check_top_level_keys` warns about it (once, in the launching process), or refuses it
with ``strict_keys=True`` (``shardwise train --strict-keys``).

Example::

    >>> near_misses(['train_cgf', 'train_pipeline', 'model'])
    [('train_cgf', 'train_cfg')]
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from .once import said_elsewhere

__all__ = ["RUNNER_KEYS", "check_top_level_keys", "near_misses"]

logger = logging.getLogger(__name__)

#: Every top-level key the Runner (``Runner.from_cfg``, ``shardwise train``) reads.
RUNNER_KEYS = frozenset(
    (
        "model work_dir experiment_name strategy train_dataloader optim_wrapper param_scheduler "
        "train_cfg val_dataloader val_cfg val_evaluator test_dataloader test_cfg test_evaluator "
        "default_hooks custom_hooks load_from resume launcher env_cfg log_level randomness "
        "auto_scale_lr visualizer log_processor default_scope data_preprocessor compile "
        "preemption custom_imports init_weights_for_test_or_val"
    ).split()
)

#: Messages warned about in this process (``Runner.from_cfg`` checks again what
#: ``shardwise train`` checked).
_WARNED: set[str] = set()


def _distance(a: str, b: str) -> int:
    """Edits (insert, delete, replace, swap two neighbours) that make ``a`` into ``b``."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], previous2[j - 2] + 1)
        previous2, previous = previous, row
    return previous[-1]


def near_misses(keys: Iterable[Any]) -> list[tuple[str, str]]:
    """``(key, close)`` for each of ``keys`` that is not a key the Runner reads but is one
    edit away from one (two for keys longer than 6 characters)."""
    found = []
    for key in keys:
        if not isinstance(key, str) or key in RUNNER_KEYS or key.startswith("_"):
            continue
        close = [
            known
            for known in sorted(RUNNER_KEYS)
            if _distance(key, known) <= (1 if len(known) <= 6 else 2)
        ]
        if close:
            found.append((key, min(close, key=lambda known: _distance(key, known))))
    return found


def check_top_level_keys(cfg: Mapping[str, Any], *, strict_keys: bool = False) -> None:
    """Warn about the config's near misses of the Runner's keys (:func:`near_misses`), or,
    with ``strict_keys``, refuse the first (``KeyError``, one line). The warning is given once
    per process, and not by the workers that ``shardwise train`` started (it warned)."""
    for key, close in near_misses(cfg.keys()):
        message = f"config key {key!r} is not one the Runner reads; did you mean {close!r}?"
        if strict_keys:
            raise KeyError(f"{message} Rename it (strict keys: near misses are refused)")
        if said_elsewhere() or message in _WARNED:
            continue
        _WARNED.add(message)
        logger.warning(
            "%s It is ignored (shardwise train --strict-keys, or Runner.check_cfg(cfg, "
            "strict_keys=True), makes this an error)",
            message,
        )
