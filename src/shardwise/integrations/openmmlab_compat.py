"""Every decision the Runner makes to train an OpenMMLab project as mmengine 0.10.7's Runner
trains it, in one policy object chosen once when the Runner is built (:func:`compat_for`).

The core (the Runner, its loops, its dataloaders and evaluators) asks the policy at named
points and never asks where a config came from. :class:`PlainRun` answers with shardwise's own
behaviour; :class:`OpenMMLabCompat` answers as mmengine's Runner would for the objects of
mmengine's it is handed (an OpenMMLab package's dataset, metrics, visualizer, optimizer
wrapper constructor, scheduler), and as :class:`PlainRun` for the rest.

The random draws. mmengine's Runner builds its DataLoaders without a generator of their own, so
each DataLoader iterator opened under it draws one int64 from torch's default generator (the
workers' base seed: torch 2.x ``torch/utils/data/dataloader.py``, ``_BaseDataLoaderIter.__init__``:
``self._base_seed = torch.empty((), dtype=torch.int64).random_(generator=loader.generator)``),
the generator that also seeds the model's ``init_weights`` and its dropout. Except where torch
reuses the iterator: ``DataLoader.__iter__`` with ``persistent_workers=True`` and
``num_workers > 0`` opens one iterator on the first ``iter()`` and later ``_reset``\\ s it,
which draws nothing (for a map-style dataset). shardwise's loaders have their own generator
(which keeps a resumed run's draws those of the run it continues), so for a dataset of
mmengine's the policy builds the loader (:meth:`OpenMMLabCompat.dataloader`) and the loader
reports each ``iter()`` to the policy, which draws as torch would, whoever opens it: the loops,
a package's hook (mmpretrain's ``PreciseBNHook``), a package's own loop. Two draw points stand
apart, named against the line of ``mmengine/runner/loops.py`` (0.10.7) they mirror: the
iteration-based loop's first draw, made when mmengine builds the loop
(:meth:`~OpenMMLabCompat.model_to_prepare`), and a resumed run's draws, made or left out as the
run it continues made them before its checkpoint (:meth:`~OpenMMLabCompat.resume_train`,
:meth:`~OpenMMLabCompat.resume_eval_passes`).

Example::

    compat = compat_for('mmpretrain')          # OpenMMLabCompat; compat_for(None): PlainRun
    loader = compat.dataloader(dataset, batch_size=4, generator=torch.Generator())
    iter(loader)      # for a dataset of mmengine's: one int64 drawn from torch's generator
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

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

    def dataloader(self, dataset: Any, **kwargs: Any) -> DataLoader:
        """The ``DataLoader`` over ``dataset`` (``kwargs``: torch's keywords): torch's."""
        return DataLoader(dataset, **kwargs)

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

    def resume_train(self, loop: Any, *, epoch: int, skip: int) -> None:
        """A resumed training ``loop`` continues at data epoch ``epoch`` after ``skip``
        batches of it."""

    def resume_eval_passes(self, loader: Any, *, opened_before: bool, replay: bool) -> None:
        """A resumed run: the passes of the run it continues opened ``loader``
        (``opened_before``) before the checkpoint; ``replay``: the pass due at the
        checkpoint's position, which that run made after saving it and this one skips."""


class OpenMMLabCompat(PlainRun):
    """mmengine 0.10.7's Runner's behaviour for mmengine's objects (an OpenMMLab package's),
    :class:`PlainRun`'s for the rest."""

    name = "openmmlab"

    def __init__(self) -> None:
        self._reporting: weakref.WeakSet[Any] = weakref.WeakSet()  # loaders it built
        self._opened: weakref.WeakSet[Any] = weakref.WeakSet()  # loaders with an iterator
        # loaders whose next opening continues an iterator whose draw is already made
        self._drawn_ahead: weakref.WeakSet[Any] = weakref.WeakSet()

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

    def dataloader(self, dataset: Any, **kwargs: Any) -> DataLoader:
        """For a dataset of mmengine's, a ``DataLoader`` that reports each ``iter()`` to the
        policy (:meth:`opened`) before torch opens or reuses its iterator."""
        if not openmmlab.from_mmengine(dataset):
            return DataLoader(dataset, **kwargs)
        loader = _ReportingDataLoader(dataset, **kwargs)
        loader.report_open = self.opened
        self._reporting.add(loader)
        return loader

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
        """Over a dataset of mmengine's, a loader the policy built (it reports its openings;
        a loader handed over as an object draws from its own generator, or from torch's by
        itself, as under mmengine's Runner)."""
        return loader in self._reporting

    def opened(self, loader: Any) -> None:
        """mirrors torch's ``DataLoader.__iter__`` (``_BaseDataLoaderIter.__init__``'s base
        seed), where mmengine's loops open ``loader`` (``enumerate(self.dataloader)`` in
        ``EpochBasedTrainLoop.run_epoch``, loops.py:114, ``ValLoop.run``, loops.py:378,
        ``TestLoop.run``, loops.py:462; ``iter(self._dataloader)`` in
        ``_InfiniteDataloaderIterator.__next__`` on ``StopIteration``, loops.py:191) and
        wherever else ``iter()`` is called on it (a package's hook or loop): one int64, unless
        torch reuses the loader's iterator (persistent workers, after the first ``iter()``),
        or the opening continues an iterator whose draw is made (:meth:`model_to_prepare`,
        :meth:`resume_train`). An endless sampler (mmengine's ``InfiniteSampler``) never ends
        its iterator, so the loops never reopen it."""
        if loader in self._drawn_ahead:
            self._drawn_ahead.discard(loader)
            self._opened.add(loader)
        else:
            self._open(loader, opened_before=loader in self._opened)

    def model_to_prepare(self, model: Any, loop: Any, build_model: Callable[[Any], Any]) -> Any:
        """mirrors ``IterBasedTrainLoop.__init__`` (loops.py:245,
        ``_InfiniteDataloaderIterator(self.dataloader)``, whose ``__init__`` calls
        ``iter(self._dataloader)``, loops.py:159): mmengine's ``Runner.train`` builds the loop
        (runner.py:1728) before ``_init_model_weights`` (runner.py:1748), so the first draw
        comes between the model's construction and its ``init_weights``. For a loop that opens
        its data when built (``opens_data_when_built``): the model built, then the draw; the
        built model goes to ``prepare``, which initialises it. The loop's first opening of the
        loader continues that iterator: it draws nothing (an opening by a hook before the
        loop's first batch takes its place)."""
        loader = getattr(loop, "dataloader", None)
        opens = getattr(loop, "opens_data_when_built", False)
        if not (opens and isinstance(model, Mapping) and self.draws_at_open(loader)):
            return model
        built = build_model(model)
        self._open(loader)
        self._drawn_ahead.add(loader)
        return built

    def resume_train(self, loop: Any, *, epoch: int, skip: int) -> None:
        """A resumed run continues the draws of the training loop of the run it continues: the
        iterator of a data epoch resumed after ``skip > 0`` batches was opened (and drew) before
        the checkpoint, as was mmengine's ``IterBasedTrainLoop``'s first (loops.py:245) and
        its only one over an endless sampler; its next opening draws nothing. A loader opened
        before the checkpoint (any position past the start) reuses its iterator with
        persistent workers."""
        loader = loop.dataloader
        if not self.draws_at_open(loader):
            return
        built_open = getattr(loop, "opens_data_when_built", False)
        if skip > 0 or (built_open and (epoch == 0 or _endless(loader))):
            self._drawn_ahead.add(loader)
        else:
            self._drawn_ahead.discard(loader)
        if skip > 0 or epoch > 0 or built_open:
            self._opened.add(loader)

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


class _ReportingDataLoader(DataLoader):
    """torch's ``DataLoader``, reporting each ``iter()`` (``report_open(self)``) before it
    opens or reuses its iterator."""

    report_open: Callable[[Any], None]

    def __iter__(self) -> Any:
        self.report_open(self)
        return super().__iter__()


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
