"""``_delete_=True`` honoured wherever mmengine 0.10.7 honours it, with mmengine as the oracle.

The case: a dict with ``_delete_=True`` bound to a module-level variable, which reaches
``train_dataloader.dataset`` (and ``val_dataloader.dataset``) only through that variable.
mmengine replaces the base's dataset there; a reader that keeps the child's values as one
shared object lets the first merge use up the marker and merges the base's keys back in.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from shardwise.config import Config

CONFIGS = Path(__file__).parent / "data" / "configs" / "delete_through_variable"


def without_delete(value):
    """mmengine leaves ``_delete_`` in a dict it copied without merging; shardwise drops it."""
    if isinstance(value, dict):
        return {k: without_delete(v) for k, v in value.items() if k != "_delete_"}
    if isinstance(value, (list, tuple)):
        return type(value)(without_delete(v) for v in value)
    return value


def typed(value):
    """``value`` with every leaf and container tagged by its type, for exact comparison."""
    if isinstance(value, dict):
        return ("dict", {k: typed(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [typed(v) for v in value])
    return (type(value).__name__, value)


def test_delete_through_a_module_level_variable_replaces_the_base_dataset():
    cfg = Config.fromfile(CONFIGS / "child_concat.py")
    dataset = cfg.train_dataloader.dataset
    assert dataset.type == "ConcatDataset"
    assert "ann_file" not in dataset and "data_prefix" not in dataset
    assert "pipeline" not in dataset
    assert [d.ann_file for d in dataset.datasets] == ["toy/a.txt", "toy/b.txt"]
    assert cfg.train_dataloader.batch_size == 8 and cfg.train_dataloader.num_workers == 2
    assert "ann_file" not in cfg.val_dataloader.dataset
    assert cfg.val_dataloader.batch_size == 1
    assert "_delete_" not in cfg.concat_trainset


def test_delete_through_a_module_level_variable_reads_as_mmengine_reads_it():
    mmengine_config = pytest.importorskip("mmengine.config").Config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = Config.fromfile(CONFIGS / "child_concat.py")
        theirs = mmengine_config.fromfile(str(CONFIGS / "child_concat.py"))
    assert typed(ours.to_dict()) == typed(without_delete(theirs.to_dict()))
