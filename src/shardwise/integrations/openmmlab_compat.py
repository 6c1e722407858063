"""Every decision the Runner makes to train an OpenMMLab project as mmengine 0.10.7's Runner
trains it, in one policy object chosen once when the Runner is built (:func:`compat_for`).

The core (the Runner, its loops, its dataloaders and evaluators) asks the policy at named
points and never asks where a config came from. :class:`PlainRun` answers with shardwise's own
behaviour; :class:`OpenMMLabCompat` answers as mmengine's Runner would for the objects of
mmengine's it is handed (an OpenMMLab package's dataset, metrics, visualizer, optimizer
wrapper constructor, scheduler), and as :class:`PlainRun` for the rest.

The random draws. mmengine's Runner builds its DataLoaders without a generator of their own, so
each DataLoader iterator it opens draws one int64 from torch's default generator (the workers'
base seed: torch 2.x ``torch/utils/data/dataloader.py``, ``_BaseDataLoaderIter.__init__``:
``self._base_seed = torch.empty((), dtype=torch.int64).random_(generator=loader.generator)``),
the generator that also seeds the model's ``init_weights`` and its dropout. Except where torch
reuses the iterator: ``DataLoader.__iter__`` with ``persistent_workers=True`` and
``num_workers > 0`` opens one iterator on the first ``iter()`` and later ``_reset``\\ s it,
which draws nothing (for a map-style dataset). shardwise's loaders have their own generator
(which keeps a resumed run's draws those of the run it continues), so the policy makes each of
those draws itself, at the point mmengine's loops open an iterator; each draw point below names
the line of ``mmengine/runner/loops.py`` (0.10.7) it mirrors.

Example::

    compat = compat_for('mmpretrain')          # OpenMMLabCompat; compat_for(None): PlainRun
    compat.open_train_epoch(loader, epoch=0, skip=0)   # mmengine's run_epoch's enumerate()
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from . import openmmlab

__all__ = [
    "OpenMMLabCompat",
    "PlainRun",
    "builds_own_vis_backends",
    "compat_for",
    "is_package_hook",
    "is_package_loop",
    "optimizer_to_rewrap",
    "scheduler_optimizer",
]


class PlainRun:
    """shardwise's own behaviour at every point the Runner asks about: no draw from torch's
    generator where a DataLoader iterator opens (the loaders have their own), torch's collate,
    shardwise's worker seeding, its evaluator; the config recorded as it is."""

    name = "shardwise"

    # ----------------------------------------------------------------- building
    def default_collate(self, dataset: Any) -> str:
        """The name (in ``FUNCTIONS``) of the collate function a loader config without
        ``collate_fn`` gets."""
        return "default_collate"

    def collate_function(self, dataset: Any, name: str, scope: str | None) -> Any:
        """The collate function ``collate_fn=dict(type=name)`` means under the default scope
        ``scope``, or None: the name is shardwise's (``FUNCTIONS``)."""
        return None

    def worker_init_fn(self, dataset: Any, default: Callable, **seeding: int) -> Callable:
        """The loader's ``worker_init_fn``; ``seeding``: ``num_workers``, ``rank``, ``seed``."""
        return default

    def evaluator(self, metrics: list[Any], default: Callable[[list[Any]], Any]) -> Any:
        """The evaluator over built ``metrics`` (``default(metrics)``: shardwise's)."""
        return default(metrics)

    def recorded_config(self, cfg: Any, visualizer: Any) -> Any:
        """The config as ``visualizer`` records it."""
        return cfg

    def hand_over_logs(self, log_dir: str, timestamp: str, logger: logging.Logger) -> None:
        """Another framework's log lines into the run's log file
        (``{log_dir}/{timestamp}.log``, at ``logger``'s level): none here."""

    # ----------------------------------------------------------------- random draws
    def draws_at_open(self, loader: Any) -> bool:
        """Whether opening an iterator over ``loader`` makes a draw of the policy's (a
        checkpoint saved during a validation pass over it records so)."""
        return False

    def model_to_prepare(self, model: Any, loop: Any, build_model: Callable[[Any], Any]) -> Any:
        """What the strategy's ``prepare`` gets for the training run's model: ``model`` as it
        is (its config is built, then initialised, there)."""
        return model

    def open_train_epoch(self, loader: Any, *, epoch: int, skip: int) -> None:
        """An epoch-based loop starts data epoch ``epoch`` after ``skip`` batches."""

    def reopen_endless(self, loader: Any) -> None:
        """An iteration-based loop opens ``loader`` again for its next data epoch (or resumes
        at the start of one)."""

    def open_eval_pass(self, loader: Any) -> None:
        """A validation or test pass opens ``loader``."""

    def resume_eval_passes(self, loader: Any, *, opened_before: bool, replay: bool) -> None:
        """A resumed run: the passes of the run it continues opened ``loader``
        (``opened_before``) before the checkpoint; ``replay``: the pass due at the
        checkpoint's position, which that run made after saving it and this one skips."""


class OpenMMLabCompat(PlainRun):
    """mmengine 0.10.7's Runner's behaviour for mmengine's objects (an OpenMMLab package's),
    :class:`PlainRun`'s for the rest."""

    name = "openmmlab"

    def __init__(self) -> None:
        self._opened: weakref.WeakSet[Any] = weakref.WeakSet()  # loaders with an iterator

    # ----------------------------------------------------------------- building
    def default_collate(self, dataset: Any) -> str:
        """mmengine's ``pseudo_collate`` for its datasets (their samples hold data elements
        that the model's data preprocessor batches; torch's cannot stack them)."""
        return "pseudo_collate" if openmmlab.from_mmengine(dataset) else "default_collate"

    def collate_function(self, dataset: Any, name: str, scope: str | None) -> Any:
        """mmengine's ``FUNCTIONS`` first, for its datasets, as its Runner resolves the name."""
        if not openmmlab.from_mmengine(dataset) or not isinstance(name, str):
            return None
        return openmmlab.collate_function(name, scope)

    def worker_init_fn(self, dataset: Any, default: Callable, **seeding: int) -> Callable:
        """mmengine's worker seeding for its datasets (``num_workers * rank + worker_id +
        seed`` for ``random``, NumPy and torch; ``mmengine/runner/runner.py``
        ``build_dataloader``)."""
        if openmmlab.from_mmengine(dataset):
            return openmmlab.worker_init_fn(**seeding)
        return default

    def evaluator(self, metrics: list[Any], default: Callable[[list[Any]], Any]) -> Any:
        """mmengine's ``Evaluator`` over a package's metrics (it hands them the data samples
        as dicts, as they expect)."""
        if any(openmmlab.from_mmengine(metric) for metric in metrics):
            return openmmlab.evaluator(metrics)
        return default(metrics)

    def recorded_config(self, cfg: Any, visualizer: Any) -> Any:
        """mmengine's ``Config`` for a package's visualizer (its backends take only that)."""
        if openmmlab.from_mmengine(visualizer):
            return openmmlab.mmengine_config(cfg)
        return cfg

    def hand_over_logs(self, log_dir: str, timestamp: str, logger: logging.Logger) -> None:
        """mmengine's own messages (a model's ``init_weights`` report) into the run's log
        file, as under mmengine's Runner."""
        log_file = os.path.join(log_dir, f"{timestamp}.log")
        openmmlab.log_to(log_file, logger.getEffectiveLevel())

    # ----------------------------------------------------------------- random draws
    def draws_at_open(self, loader: Any) -> bool:
        """Over a dataset of mmengine's: mmengine's loader has no generator of its own, so
        its iterators draw from torch's; shardwise's loader has one (else torch draws from
        the global generator itself and the policy must not draw twice)."""
        dataset = getattr(loader, "dataset", None)
        return openmmlab.from_mmengine(dataset) and getattr(loader, "generator", None) is not None

    def model_to_prepare(self, model: Any, loop: Any, build_model: Callable[[Any], Any]) -> Any:
        """mirrors ``IterBasedTrainLoop.__init__`` (loops.py:245,
        ``_InfiniteDataloaderIterator(self.dataloader)``, whose ``__init__`` calls
        ``iter(self._dataloader)``, loops.py:159): mmengine's ``Runner.train`` builds the loop
        (runner.py:1728) before ``_init_model_weights`` (runner.py:1748), so the first draw
        comes between the model's construction and its ``init_weights``. For a loop that opens
        its data when built (``opens_data_when_built``): the model built, then the draw; the
        built model goes to ``prepare``, which initialises it."""
        loader = getattr(loop, "dataloader", None)
        opens = getattr(loop, "opens_data_when_built", False)
        if not (opens and isinstance(model, Mapping) and self.draws_at_open(loader)):
            return model
        built = build_model(model)
        self._open(loader)
        return built

    def open_train_epoch(self, loader: Any, *, epoch: int, skip: int) -> None:
        """mirrors ``EpochBasedTrainLoop.run_epoch``'s ``enumerate(self.dataloader)``
        (loops.py:114): a draw at every epoch's first batch; with persistent workers only at
        the first epoch's (torch's ``DataLoader.__iter__`` then resets its one iterator).
        A resumed epoch (``skip > 0``) drew when it started, before its checkpoint."""
        if skip == 0:
            self._open(loader, opened_before=epoch > 0)

    def reopen_endless(self, loader: Any) -> None:
        """mirrors ``_InfiniteDataloaderIterator.__next__``'s ``iter(self._dataloader)`` on
        ``StopIteration`` (loops.py:191): a draw at every new data epoch, none with persistent
        workers, and none with an endless sampler (mmengine's ``InfiniteSampler``: the
        iterator never ends, so it is never reopened)."""
        if not _endless(loader):
            self._open(loader, opened_before=True)

    def open_eval_pass(self, loader: Any) -> None:
        """mirrors ``ValLoop.run``'s and ``TestLoop.run``'s ``enumerate(self.dataloader)``
        (loops.py:378, loops.py:462): a draw at every pass; with persistent workers at the
        loader's first only."""
        self._open(loader, opened_before=loader in self._opened)

    def resume_eval_passes(self, loader: Any, *, opened_before: bool, replay: bool) -> None:
        """A resumed run continues the draws of ``ValLoop.run`` (loops.py:378) of the run it
        continues: the replayed pass draws as it drew there, and a loader that run had opened
        (with persistent workers) draws no more."""
        if replay:
            self._open(loader, opened_before=opened_before)
        elif opened_before:
            self._opened.add(loader)

    def _open(self, loader: Any, opened_before: bool = False) -> None:
        """What ``iter(loader)`` draws from torch's generator under mmengine's Runner: one
        int64 (``_BaseDataLoaderIter.__init__``), unless torch reuses the loader's iterator
        (``DataLoader.__iter__``: ``persistent_workers and num_workers > 0``, after the first
        ``iter()``)."""
        if not self.draws_at_open(loader):
            return
        reused = getattr(loader, "persistent_workers", False) and loader.num_workers > 0
        if not (reused and opened_before):
            torch.empty((), dtype=torch.int64).random_()
        self._opened.add(loader)


def _endless(loader: Any) -> bool:
    """Whether ``loader``'s sampler never ends (mmengine's ``InfiniteSampler`` or shardwise's
    stand-in for it, :class:`~shardwise.runner.data.ResumableInfiniteSampler`)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", None) or getattr(loader, "sampler", None)
    return bool(getattr(sampler, "endless", False)) or type(sampler).__name__ == "InfiniteSampler"


def compat_for(default_scope: str | None) -> PlainRun:
    """The policy of a Runner whose config's ``default_scope`` is ``default_scope``, chosen
    once when it is built (after its components were checked, which resolves their names):
    :class:`OpenMMLabCompat` when the scope is an OpenMMLab package's or mmengine has been
    imported (an object or a name of mmengine's tree), else :class:`PlainRun`."""
    package = default_scope is not None and default_scope not in openmmlab.NOT_PACKAGES
    if package or "mmengine" in sys.modules:
        return OpenMMLabCompat()
    return PlainRun()


# ------------------------------------------------- decisions made before a Runner (or without)


def builds_own_vis_backends(visualizer_cls: Any) -> bool:
    """Whether a visualizer class is mmengine's (it builds its own ``vis_backends``, which
    shardwise's config checks leave to it)."""
    return openmmlab.from_mmengine(visualizer_cls)


def is_package_hook(hook: Any) -> bool:
    """Whether ``hook`` is mmengine's kind (an OpenMMLab package's or mmengine's own
    ``Hook``): it may test the runner as mmengine's Runner (its loops' classes...)."""
    return openmmlab.from_mmengine(hook)


def is_package_loop(loop_cls: Any, ours: tuple[type, ...]) -> bool:
    """Whether a training loop class (``train_cfg.type``) is mmengine's kind and none of
    shardwise's loops ``ours`` (whose position its checkpoints save and resume)."""
    return (
        isinstance(loop_cls, type)
        and openmmlab.from_mmengine(loop_cls)
        and not issubclass(loop_cls, ours)
    )


def optimizer_to_rewrap(built: Any) -> Any:
    """What an optimizer wrapper constructor built, if it is an OpenMMLab package's (mmengine's
    wrapper around a torch optimizer whose parameter groups it made): that torch optimizer, to
    be wrapped by shardwise's wrapper with the same settings; else None."""
    inner = getattr(built, "optimizer", None)
    if openmmlab.from_mmengine(built) and isinstance(inner, torch.optim.Optimizer):
        return inner
    return None


def scheduler_optimizer(scheduler_cls: Any, optimizer: Any) -> Any:
    """The optimizer a scheduler of class ``scheduler_cls`` is built with: an OpenMMLab
    package's (mmengine's class) takes a torch optimizer, so it gets the wrapper's own (whose
    parameter groups it schedules); shardwise's takes the wrapper."""
    inner = getattr(optimizer, "optimizer", None)
    if openmmlab.from_mmengine(scheduler_cls) and isinstance(inner, torch.optim.Optimizer):
        return inner
    return optimizer
