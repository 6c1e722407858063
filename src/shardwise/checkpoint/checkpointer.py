"""The Checkpointer: saving, loading and resuming a strategy's state, in one place.

A checkpoint is a dict of *state objects* (each with ``state_dict()`` / ``load_state_dict()``):
the model (``'state_dict'``), the optimizers (``'optimizer'``), the parameter schedulers
(``'param_schedulers'``), the random state (in ``'meta'``), and the caller's extras (a runner's
loop position and message hub). The strategy contributes only how its model and optimizer
state is gathered or sharded (its ``*_state_dict`` methods), the format it writes and how it
reads one onto its model (``_read_state``); everything else lives here:

- :meth:`Checkpointer.save`: the state, through the commit protocol, synchronously or in the
  background (:mod:`shardwise.checkpoint.async_save`), with retention (``max_keep_ckpts``);
- :meth:`Checkpointer.load` (weights) and :meth:`Checkpointer.resume` (everything, whole or
  refused: :mod:`.matching`);
- :func:`where_to_start` and :meth:`Checkpointer.load_or_resume`: mmengine's rules for
  ``load_from`` and ``resume``, shared with the Runner.

``BaseStrategy`` keeps the public methods (``save_checkpoint``, ``load_checkpoint``,
``resume``, ``load_or_resume``, ``wait_for_checkpoint``, ``wait_for_staging``) and delegates.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

import shardwise
from shardwise import dist
from shardwise.checkpoint import CheckpointCommit, CheckpointError, find_last_checkpoint
from shardwise.checkpoint.async_save import AsyncCheckpointer
from shardwise.checkpoint.formats import CheckpointFormat
from shardwise.checkpoint.retention import Retention, check_max_keep_ckpts
from shardwise.env import capture_rng_state, gc_paused, restore_rng_state

from .matching import (
    optimizer_states_by_name,
    resume_mismatches,
    revise_state_dict_keys,
    unwrap_model,
)
from .state_dicts import saved_layout

__all__ = ["DEFAULT_REVISE_KEYS", "Checkpointer", "State", "where_to_start"]

DEFAULT_REVISE_KEYS = [(r"^module\.", "")]


@dataclass(frozen=True)
class State:
    """One entry of a checkpoint: how to take it from the run and put it back."""

    state_dict: Callable[[], Any]
    load_state_dict: Callable[[Any], None]


def where_to_start(
    work_dir: str | os.PathLike[str], *, load_from: Any = None, resume: Any = False
) -> tuple[str | None, str | None]:
    """``(checkpoint to resume from, checkpoint to load weights from)``, by mmengine's rules:
    ``resume='PATH'``: that path; ``resume=True`` with ``load_from``: ``load_from``;
    ``resume=True`` alone: the newest committed checkpoint in ``work_dir`` (None when there is
    none); ``load_from`` alone: its weights."""
    if isinstance(resume, str | os.PathLike):
        return str(resume), None
    if resume and load_from is not None:
        return str(load_from), None
    if resume:
        return find_last_checkpoint(work_dir), None
    return None, None if load_from is None else str(load_from)


class Checkpointer:
    """Saves, loads and resumes the state of ``strategy`` (see the module docstring).

    Args:
        strategy: the :class:`~shardwise.strategies.BaseStrategy` whose state this is.
        async_save: the default of :meth:`save`'s ``async_save``.
        max_keep_ckpts: the default of :meth:`save`'s ``max_keep_ckpts``.
        verify_checksums: the default of :meth:`load`'s and :meth:`resume`'s.
    """

    def __init__(
        self, strategy: Any, *, async_save: bool, max_keep_ckpts: int, verify_checksums: bool
    ) -> None:
        self.strategy = strategy
        self.async_save = async_save
        self.max_keep_ckpts = check_max_keep_ckpts(max_keep_ckpts)
        self.verify_checksums = verify_checksums
        #: The checkpoints kept under a ``max_keep_ckpts`` limit, by series.
        self.retention = Retention()
        #: Stages asynchronous saves in host memory and writes them in the background.
        self.stager = AsyncCheckpointer()
        self._fenced: list[Any] = []  # optimizers and models hooked by _fence_staging

    # ------------------------------------------------------------------ states
    def states(self, optimizer: bool = True, schedulers: bool = True) -> dict[str, State]:
        """The state objects of the strategy, by checkpoint key (what it has of them)."""
        s = self.strategy
        states = {"state_dict": State(s.model_state_dict, s.load_model_state_dict)}
        if optimizer and hasattr(s, "optim_wrapper"):
            states["optimizer"] = State(s.optim_state_dict, s.load_optim_state_dict)
        if schedulers and hasattr(s, "param_schedulers"):
            states["param_schedulers"] = State(
                s.scheduler_state_dict, s.load_scheduler_state_dict
            )
        return states

    def _meta(self, fmt: CheckpointFormat) -> dict[str, Any]:
        """What every checkpoint records besides the state: who wrote it, when, every rank's
        random state (a collective: every rank must call it), its layout (:func:`saved_layout`)."""
        s = self.strategy
        return dict(
            shardwise_version=shardwise.__version__,
            time=time.strftime("%Y-%m-%d %H:%M:%S"),
            timestamp=s.timestamp,
            experiment_name=s.experiment_name,
            seed=s.seed,
            randomness=s.randomness,
            world_size=s.world_size,
            strategy=type(s).__name__,
            format=fmt.name,
            rng_states=dist.all_gather_object(capture_rng_state()),
            **saved_layout(s),
        )

    def _restore_randomness(self, meta: Mapping[str, Any]) -> None:
        s = self.strategy
        seed = meta.get("seed")
        if seed is not None and seed != s.seed:
            s.logger.warning("The checkpoint's seed %s replaces this run's seed %s", seed, s.seed)
            s._set_randomness(**{**s.randomness, "seed": seed})
        states = meta.get("rng_states")
        if states and len(states) == s.world_size:
            restore_rng_state(states[s.rank])
        elif states:
            s.logger.warning(
                "The checkpoint was saved on %d ranks and is resumed on %d: RNG states are not "
                "restored; every rank is reseeded from seed %s instead",
                len(states),
                s.world_size,
                s.seed,
            )

    # ------------------------------------------------------------------ paths
    def resolve(self, filename: str | os.PathLike[str]) -> Path:
        """Where a save puts ``filename``: as given if absolute, else inside ``work_dir``."""
        path = Path(filename)
        return path if path.is_absolute() else Path(self.strategy.work_dir) / path

    def find(self, filename: str | os.PathLike[str]) -> Path:
        """``filename`` as given, or inside ``work_dir`` when it is relative and only there."""
        path = Path(filename)
        if not path.exists() and not path.is_absolute() and self.resolve(path).exists():
            path = self.resolve(path)
        return path

    def _read(self, filename: Any, map_location: Any, verify: bool | None) -> dict[str, Any]:
        s = self.strategy
        location = s.device if map_location == "default" else map_location
        verify = self.verify_checksums if verify is None else bool(verify)
        return s._read_state(self.find(filename), location, verify)

    # ------------------------------------------------------------------ save
    def _state(
        self,
        save_optimizer: bool,
        save_param_scheduler: bool,
        extra_ckpt: Mapping[str, Any] | None,
        fmt: CheckpointFormat,
    ) -> dict[str, Any]:
        """The checkpoint dict every format stores (collective under sharding)."""
        states = self.states(save_optimizer, save_param_scheduler)
        extra = dict(extra_ckpt or {})
        clash = sorted(set(extra) & {"state_dict", "optimizer", "param_schedulers"})
        if clash:
            raise ValueError(
                f"extra_ckpt keys {clash} would overwrite the checkpoint's own entries "
                f"{['state_dict', 'optimizer', 'param_schedulers']}; rename them"
            )
        state = {key: entry.state_dict() for key, entry in states.items()}
        meta = self._meta(fmt)
        meta.update(extra.pop("meta", {}))
        state.update(extra)
        state["meta"] = meta
        return state

    @gc_paused()
    def save(
        self,
        filename: str | os.PathLike[str],
        *,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        extra_ckpt: Mapping[str, Any] | None = None,
        callback: Callable[[dict[str, Any]], None] | None = None,
        async_save: bool | None = None,
        max_keep_ckpts: int | None = None,
        series: str = "periodic",
    ) -> Future | None:
        """Save a checkpoint through the commit protocol, in the strategy's format (the
        base strategy's: the full format, one file written by rank 0).

        A relative ``filename`` is taken inside ``work_dir``. ``extra_ckpt`` entries are
        stored beside the state (its ``meta`` entries are merged into ``meta``);
        ``callback(checkpoint)`` may edit the dict before it is written.

        ``async_save`` (None: the strategy's ``async_save`` default) returns as soon as the
        state is copied to host memory, with a future (``.done()``, ``.result()`` -> the
        checkpoint's path) while the write and commit go on in the background; the next save,
        :meth:`wait_for_checkpoint`, loading and interpreter exit wait for it, and its failure
        (on any rank) is raised as :class:`CheckpointError` on every rank there. A synchronous
        save returns None once the checkpoint is committed.

        ``max_keep_ckpts`` (None: the strategy's default; -1: no limit) keeps only the newest
        N checkpoints of the ``series`` (e.g. ``'periodic'``, ``'best_acc'``): once this one
        is committed, rank 0 deletes the oldest beyond N (never the newest, never one being
        written; see :mod:`shardwise.checkpoint.retention`). The lists survive a resume.

        Example::

            >>> future = strategy.save_checkpoint('iter_1000.pth', async_save=True)
            >>> ...  # training goes on while the checkpoint is written
            >>> strategy.wait_for_checkpoint()  # committed (or CheckpointError)
        """
        self.wait()
        s = self.strategy
        if not s._prepared:
            raise RuntimeError("save_checkpoint() needs a prepared strategy: call prepare() first")
        in_background = self.async_save if async_save is None else bool(async_save)
        max_keep = self.max_keep_ckpts if max_keep_ckpts is None else max_keep_ckpts
        check_max_keep_ckpts(max_keep)
        path = self.resolve(filename)
        fmt = s._checkpoint_format()
        start = time.perf_counter()
        try:
            state = self._state(save_optimizer, save_param_scheduler, extra_ckpt, fmt)
        except CheckpointError:
            raise
        except RuntimeError as exc:  # a collective failed: a rank crashed or timed out
            raise CheckpointError(
                f"saving {path}: gathering the state to save failed on rank {s.rank}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if callback is not None:
            callback(state)
        retire: list[str] = []
        if max_keep > 0:
            kept, retire = self.retention.plan(path, max_keep, series)
            state.setdefault("meta", {})["kept_checkpoints"] = kept
        if in_background:
            return self._save_in_background(state, path, fmt, start, retire)
        commit = CheckpointCommit(path, work_dir=s.work_dir, is_dir=fmt.is_dir, retire=retire)
        try:
            with commit as staging:
                commit.record(*self._write(fmt, state, staging))
        except BaseException:
            self.retention.settle(committed=False)
            raise
        self.retention.settle(committed=True)
        s.logger.info("Saved checkpoint %s (%s) in %.2f s", path, fmt, time.perf_counter() - start)
        return None

    def _write(
        self, fmt: CheckpointFormat, state: dict[str, Any], staging: Path, group: Any = None
    ) -> list[Any]:
        """This rank's part of the checkpoint under the staging path (collectives on
        ``group``); one DCP plan is reused per strategy and kind of save."""
        s = self.strategy
        plan = f"{type(s).__name__}@{id(s):x}:{'async' if group else 'sync'}"
        return fmt.write(state, staging, rank=s.rank, group=group, plan=plan)

    def _save_in_background(
        self,
        state: dict[str, Any],
        path: Path,
        fmt: CheckpointFormat,
        start: float,
        retire: list[str],
    ) -> Future:
        """Stage ``state`` to host memory, agree that every rank did, and write and commit it
        in the background (see :mod:`shardwise.checkpoint.async_save`)."""
        s = self.strategy
        group = self.stager.group()
        commit = CheckpointCommit(
            path, work_dir=s.work_dir, group=group, is_dir=fmt.is_dir, retire=retire
        )
        staged, error = None, None
        try:
            staged = fmt.stage(state, self.stager, s.rank)
        except Exception as exc:  # noqa: BLE001 - every rank raises it from begin()
            error = exc
        del state
        try:
            staging = commit.begin(error)
        except CheckpointError:
            self.stager.discard()
            self.retention.settle(committed=False)
            raise
        self._fence_staging()
        blocked = time.perf_counter() - start
        future = self.stager.submit(commit, lambda: self._write(fmt, staged, staging, group))
        s.logger.info(
            "Staged checkpoint %s (%s) in host memory in %.2f s; writing it in the background",
            path,
            fmt,
            blocked,
        )

        def log(done: Future) -> None:
            if done.exception() is None:
                s.logger.info(
                    "Saved checkpoint %s (%s) in %.2f s (in the background)",
                    path,
                    fmt,
                    time.perf_counter() - start,
                )

        future.add_done_callback(log)
        return future

    def _fence_staging(self) -> None:
        """Make every optimizer step, and every forward of a model with persistent buffers
        (forward may update them, e.g. BatchNorm's statistics), wait until the save in flight
        has copied the tensors it left to the background (hooks registered once)."""
        s = self.strategy
        targets: list[Any] = []
        if hasattr(s, "optim_wrapper"):
            targets += [wrapper.optimizer for wrapper in s._wrappers().values()]
        if _has_persistent_buffers(s.model):
            targets.append(s.model)
        for target in targets:
            if any(fenced is target for fenced in self._fenced):
                continue
            if isinstance(target, torch.optim.Optimizer):
                target.register_step_pre_hook(lambda *_: self.stager.wait_for_staging())
            else:
                target.register_forward_pre_hook(lambda *_: self.stager.wait_for_staging())
            self._fenced.append(target)

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed; raise its failure."""
        if not self.stager.in_flight:
            return
        try:
            self.stager.wait()
        except BaseException:
            self.retention.settle(committed=False)
            raise
        self.retention.settle(committed=True)

    # ------------------------------------------------------------------ load
    @gc_paused()
    def load(
        self,
        filename: str | os.PathLike[str],
        *,
        map_location: Any = "cpu",
        strict: bool = False,
        revise_keys: Sequence[tuple[str, str]] = DEFAULT_REVISE_KEYS,
        callback: Callable[[dict[str, Any]], None] | None = None,
        verify_checksums: bool | None = None,
    ) -> dict[str, Any]:
        """Load the model weights of a checkpoint; return the rest of it (``meta``,
        ``optimizer``, extras). ``map_location='default'`` means the strategy's device;
        ``strict`` refuses missing, unexpected and mismatched keys (else they are skipped with
        a warning); ``revise_keys`` are ``(pattern, replacement)`` regexes applied to the
        keys; ``callback(checkpoint)`` sees it before it is used; ``verify_checksums`` (None:
        the strategy's default, True) compares the files with the checksums recorded when
        they were saved while reading them, and refuses a mismatch."""
        self.wait()
        checkpoint = self._read(filename, map_location, verify_checksums)
        if callback is not None:
            callback(checkpoint)
        if "state_dict" not in checkpoint and _is_bare_state_dict(checkpoint):
            checkpoint = {"state_dict": checkpoint}
        if "state_dict" not in checkpoint:
            raise KeyError(
                f"{filename} has no 'state_dict' entry (keys: {sorted(checkpoint)}); it is not "
                "a shardwise or mmengine checkpoint"
            )
        self.strategy.load_model_state_dict(
            checkpoint.pop("state_dict"), strict=strict, revise_keys=revise_keys
        )
        return checkpoint

    @gc_paused()
    def resume(
        self,
        filename: str | os.PathLike[str],
        *,
        resume_optimizer: bool = True,
        resume_param_scheduler: bool = True,
        map_location: Any = "default",
        callback: Callable[[dict[str, Any]], None] | None = None,
        verify_checksums: bool | None = None,
    ) -> dict[str, Any]:
        """Restore model, optimizer, schedulers, seed and RNG states from a checkpoint, whole
        or not at all: a checkpoint that does not fit the run is refused before anything is
        loaded (:mod:`.matching`). ``resume_optimizer`` / ``resume_param_scheduler``: restore
        those too; ``map_location``, ``callback``, ``verify_checksums`` as in :meth:`load`."""
        self.wait()
        s = self.strategy
        if not s._prepared:
            raise RuntimeError("resume() needs a prepared strategy: call prepare() first")
        checkpoint = self._read(filename, map_location, verify_checksums)
        states = self.states(resume_optimizer, resume_param_scheduler)
        self._check_resumable(filename, checkpoint, states, resume_optimizer)
        if callback is not None:
            callback(checkpoint)
        for key, entry in states.items():
            entry.load_state_dict(checkpoint.pop(key))
        meta = checkpoint.get("meta", {})
        self._restore_randomness(meta)
        self.retention.restore(meta.get("kept_checkpoints"), self.find(filename))
        s.logger.info("Resumed from %s", filename)
        return checkpoint

    def _check_resumable(
        self, filename: Any, checkpoint: dict[str, Any], states: Mapping[str, State], optim: bool
    ) -> None:
        """Refuse a resume that could not be whole: a state absent from the checkpoint, or
        one that does not fit the model, optimizers or schedulers (:mod:`.matching`). Puts the
        model keys and optimizer states into the shape loading expects."""
        s = self.strategy
        if optim and "optimizer" not in states:
            raise RuntimeError(
                "resume_optimizer=True but this strategy has no optimizer wrapper; pass "
                "optim_wrapper to prepare() or resume(..., resume_optimizer=False)"
            )
        for key, what, option in (
            ("optimizer", "optimizer", "resume_optimizer"),
            ("param_schedulers", "parameter scheduler", "resume_param_scheduler"),
        ):
            if key in states and key not in checkpoint:
                raise KeyError(
                    f"{filename} has no {what} state; resume with {option}=False to "
                    "restore the rest of it"
                )
        model = unwrap_model(s.model)
        revised = revise_state_dict_keys(checkpoint["state_dict"], DEFAULT_REVISE_KEYS)
        checkpoint["state_dict"] = revised
        fitted, optimizers = dict(checkpoint), None
        if "optimizer" in states:
            optimizers = {key: wrapper.optimizer for key, wrapper in s._wrappers().items()}
            by_name = optimizer_states_by_name(checkpoint["optimizer"], optimizers, model)
            fitted["optimizer"], checkpoint["optimizer"] = by_name, by_name.get("", by_name)
        problems = resume_mismatches(
            fitted,
            model,
            optimizers=optimizers,
            schedulers=s.param_schedulers if "param_schedulers" in states else None,
        )
        if problems:
            raise CheckpointError(
                f"refusing to resume from {filename}: it does not fit this run, and nothing was "
                "loaded:\n  " + "\n  ".join(problems) + "\nTo start a new run from its "
                "weights, use load_from (it loads the parameters that fit and no optimizer state)"
            )

    def load_or_resume(
        self, *, load_from: Any = None, resume: bool | str = False
    ) -> dict[str, Any] | None:
        """Resume or load weights by mmengine's rules (:func:`where_to_start`)."""
        resume_from, weights_from = where_to_start(
            self.strategy.work_dir, load_from=load_from, resume=resume
        )
        if resume_from is not None:
            self.strategy.logger.info("Resuming from %s", resume_from)
            return self.resume(resume_from)
        if weights_from is not None:
            return self.load(weights_from)
        if resume:
            self.strategy.logger.info(
                "resume=True but %s has no committed checkpoint; starting from scratch",
                self.strategy.work_dir,
            )
        return None


def _has_persistent_buffers(model: nn.Module) -> bool:
    """Whether the model's state dict holds buffers (which forward may update)."""
    return any(
        buffer is not None and name not in module._non_persistent_buffers_set
        for module in model.modules()
        for name, buffer in module._buffers.items()
    )


def _is_bare_state_dict(checkpoint: Mapping[str, Any]) -> bool:
    """``torch.save(model.state_dict())``: tensors under module keys and nothing else."""
    return bool(checkpoint) and all(isinstance(v, torch.Tensor) for v in checkpoint.values())
