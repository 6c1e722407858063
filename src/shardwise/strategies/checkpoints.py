"""A strategy's state and checkpoint methods (mmengine's names) over its Checkpointer: once
prepared, the strategy hands the Checkpointer its state objects (:mod:`.states`) and its
:class:`~shardwise.checkpoint.checkpointer.Layout`; the methods here delegate to them."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from shardwise.checkpoint.checkpointer import DEFAULT_REVISE_KEYS, Checkpointer
from shardwise.checkpoint.states import RandomState

from .matching import revise_state_dict_keys
from .states import ModelState, OptimizersState, RunInfo, SchedulersState

__all__ = ["StrategyCheckpoints"]


class StrategyCheckpoints:
    """The state and checkpoint methods of :class:`~shardwise.strategies.BaseStrategy` (a
    base class of it: they use its model, optimizer wrapper, schedulers, randomness and the
    ``_state_dict_options`` / ``_load_options`` / ``_offload`` / ``_checkpoint_layout`` that
    each strategy defines)."""

    _checkpointer: Checkpointer

    def _register_states(self) -> None:
        """Hand the prepared model, optimizers, schedulers and random state to the
        Checkpointer as state objects, with this strategy's layout."""
        checkpointer = self._checkpointer
        checkpointer.layout = self._checkpoint_layout()
        options = dict(options=self._state_dict_options, load_options=self._load_options)
        checkpointer.register(
            "state_dict", ModelState(self.model, logger=self.logger, post=self._offload, **options)
        )
        mappings: Any = dict
        if hasattr(self, "optim_wrapper"):
            wrappers = OptimizersState(self.model, self._wrappers, post=self._offload, **options)
            checkpointer.register("optimizer", wrappers)
            mappings = lambda: wrappers.group_mappings  # noqa: E731 - read at each resume
        if hasattr(self, "param_schedulers"):
            schedulers = SchedulersState(lambda: self.param_schedulers, mappings)
            checkpointer.register("param_schedulers", schedulers)

        def reseed(seed: int) -> None:
            self._set_randomness(**{**self.randomness, "seed": seed})

        randomness = RandomState(lambda: self.randomness, reseed, self.logger)
        checkpointer.register("randomness", randomness, meta=True)
        checkpointer.register("run", RunInfo(self), meta=True)

    def _state(self, key: str) -> Any:
        if key not in self._checkpointer.states:
            raise RuntimeError(
                f"the strategy has no {key!r} state yet: call prepare() first"
                + (" with optim_wrapper" if key == "optimizer" else "")
                + (" with param_scheduler" if key == "param_schedulers" else "")
            )
        return self._checkpointer.states[key]

    def model_state_dict(self) -> dict[str, Any]:
        """The model's state dict in the checkpoint format (here full tensors on the CPU),
        keyed as the plain module's keys."""
        return self._state("state_dict").state_dict()

    def optim_state_dict(self) -> dict[str, Any]:
        """The optimizer state keyed by parameter name (a dict of them for several
        optimizers), with the wrapper's own state (e.g. the loss scaler)."""
        return self._state("optimizer").state_dict()

    def scheduler_state_dict(self) -> list[dict[str, Any]] | dict[str, list[dict[str, Any]]]:
        """Each scheduler's state, in order (per optimizer name for several optimizers)."""
        return self._state("param_schedulers").state_dict()

    def load_model_state_dict(
        self,
        state_dict: Mapping[str, Any],
        *,
        strict: bool = False,
        revise_keys: Sequence[tuple[str, str]] = DEFAULT_REVISE_KEYS,
    ) -> None:
        """Load a full (unsharded) model state dict.

        ``revise_keys`` are ``(pattern, replacement)`` regex pairs applied to every key
        (by default a ``module.`` prefix is dropped). With ``strict=True`` any missing or
        unexpected key is an error naming them, raised before anything is loaded; otherwise
        they, and tensors whose shape differs from the model's, are skipped with a warning.
        """
        revised = revise_state_dict_keys(state_dict, revise_keys)
        self._state("state_dict").load_state_dict(revised, strict=strict)

    def load_optim_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load what :meth:`optim_state_dict` returned."""
        self._state("optimizer").load_state_dict(state_dict)

    def load_scheduler_state_dict(self, state_dict: Any) -> None:
        """Load what :meth:`scheduler_state_dict` returned."""
        self._state("param_schedulers").load_state_dict(state_dict)

    # ------------------------------------------------------------------ checkpoints
    @property
    def checkpointer(self) -> Checkpointer:
        """What saves, loads and resumes this strategy's state objects
        (:class:`~shardwise.checkpoint.checkpointer.Checkpointer`)."""
        return self._checkpointer

    def save_checkpoint(self, filename: str | os.PathLike[str], **kwargs: Any) -> Future | None:
        """Save a checkpoint, committed atomically, in the strategy's format (here the full
        format: one file by rank 0). Keywords (:meth:`Checkpointer.save
        <shardwise.checkpoint.checkpointer.Checkpointer.save>`): ``save_optimizer``,
        ``save_param_scheduler``, ``extra_ckpt``, ``callback``, ``async_save`` (returns a
        future once the state is in host memory), ``max_keep_ckpts``, ``series``.

        Example::

            >>> future = strategy.save_checkpoint('iter_1000.pth', async_save=True)
            >>> ...  # training goes on while the checkpoint is written
            >>> strategy.wait_for_checkpoint()  # committed (or CheckpointError)
        """
        return self._checkpointer.save(filename, **kwargs)

    def wait_for_checkpoint(self) -> None:
        """Block until the save in flight (if any) is committed; its failure, on any rank,
        is raised here as :class:`CheckpointError` on every rank."""
        self._checkpointer.wait()

    def wait_for_staging(self) -> None:
        """Block until the asynchronous save in flight has copied the state to host memory.
        The next optimizer step (and forward, for a model with buffers) calls it; code that
        changes saved tensors in place before those should call it first."""
        self._checkpointer.stager.wait_for_staging()

    def load_checkpoint(self, filename: str | os.PathLike[str], **kwargs: Any) -> dict[str, Any]:
        """Load the model weights of a checkpoint; return the rest of it (``meta``,
        ``optimizer``, extras). Keywords (:meth:`Checkpointer.load
        <shardwise.checkpoint.checkpointer.Checkpointer.load>`): ``map_location``
        (``'default'``: this strategy's device), ``strict``, ``revise_keys``, ``callback``,
        ``verify_checksums`` (compare the files with their recorded checksums; default on)."""
        return self._checkpointer.load(filename, **kwargs)

    def resume(self, filename: str | os.PathLike[str], **kwargs: Any) -> dict[str, Any]:
        """Restore model, optimizer, schedulers, seed and RNG states from a checkpoint, whole
        or not at all. Keywords (:meth:`Checkpointer.resume
        <shardwise.checkpoint.checkpointer.Checkpointer.resume>`): ``resume_optimizer``,
        ``resume_param_scheduler``, ``map_location``, ``callback``, ``verify_checksums``."""
        return self._checkpointer.resume(filename, **kwargs)

    def load_or_resume(
        self, *, load_from: str | None = None, resume: bool | str = False
    ) -> dict[str, Any] | None:
        """mmengine's rules: ``resume=PATH`` resumes from it; ``resume=True`` from
        ``load_from`` when given, else from the newest committed checkpoint in ``work_dir``;
        ``load_from`` alone loads its weights."""
        return self._checkpointer.load_or_resume(load_from=load_from, resume=resume)
