"""The Runner's checkpoints (mmengine's method names) over the strategy's Checkpointer: the
runner registers its own state objects (the training loop's position, the message hub) after
the strategy's, resumes or loads by mmengine's rules, and saves with the loop position."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from shardwise.checkpoint import find_last_checkpoint
from shardwise.config import redact_secrets

__all__ = ["RunnerCheckpoints"]


class RunnerCheckpoints:
    """The checkpoint methods of :class:`~shardwise.runner.Runner` (a base class of it: they
    use its ``strategy``, ``train_loop``, ``message_hub``, ``optim_wrapper`` and hooks)."""

    def _init_checkpoints(self, load_from: Any, resume: Any) -> None:
        """Where the run starts (mmengine's ``load_from`` and ``resume``)."""
        self._load_from = None if load_from is None else str(load_from)
        self._resume = resume
        self._has_loaded = False
        self._warned_fresh = False  # a run from scratch over committed checkpoints, said once

    # ------------------------------------------------------------------ checkpoints
    def _register_states(self) -> None:
        """Hand the runner's own state objects to the strategy's Checkpointer, after the
        strategy's (a resume restores the random state before the loop reseeds its sampler):
        the training loop's position (``meta``'s ``epoch``, ``iter``, ``epoch_length``; the
        data position follows from it) and the message hub."""
        checkpointer = self.strategy.checkpointer
        if self.optim_wrapper is not None:  # in train()
            checkpointer.register("loop", self.train_loop, meta=True)
        checkpointer.register("message_hub", self.message_hub, required=False)

    def load_or_resume(self) -> dict[str, Any] | None:
        """Resume or load weights as ``resume`` and ``load_from`` say (mmengine's rules),
        once per runner. Without a training loop (``val()``, ``test()``) the checkpoint a
        resume would pick gives its weights only."""
        if self._has_loaded:
            return None
        checkpoint = self.strategy.checkpointer.load_or_resume(
            load_from=self._load_from,
            resume=self._resume,
            weights_only=self.optim_wrapper is None,
            resume_with=self.resume,
            load_with=self.load_checkpoint,
        )
        self._has_loaded = checkpoint is not None
        if checkpoint is None and self.optim_wrapper is not None:
            self._warn_of_committed_checkpoints()
        return checkpoint

    def _warn_of_committed_checkpoints(self) -> None:
        """A run from scratch (no ``resume``, no ``load_from``) in a work_dir that holds
        committed checkpoints: one warning, on rank 0, naming the newest and ``--resume``."""
        if self._warned_fresh or self._resume or self._load_from is not None or self.rank != 0:
            return
        self._warned_fresh = True
        newest = find_last_checkpoint(self.work_dir)
        if newest is not None:
            self.logger.warning(
                "%s holds committed checkpoints (the newest: %s) and this run starts from "
                "scratch: pass --resume (resume=True) to continue from the newest, --load-from "
                "(load_from) for its weights only, or another work_dir",
                self.work_dir,
                newest,
            )

    def snapshot_to_memory(self) -> None:
        """After a training iteration (its hooks run): a snapshot to the strategy's memory
        tier when one is due (``memory_checkpoint``'s ``interval``), with the loop position
        a save after this iteration records."""
        tier = self.strategy.checkpointer.memory
        if tier is None or not tier.due(self.iter + 1):
            return
        self._register_states()
        tier.snapshot(self.iter + 1, dict(epoch=self.epoch, iter=self.iter + 1))

    def resume(self, filename: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore model, optimizer, schedulers, RNG states, the loop position and the
        message hub from a checkpoint."""
        self._register_states()
        return self.strategy.checkpointer.resume(filename, callback=self._after_load_callback())

    def load_checkpoint(self, filename: str | os.PathLike[str], **kwargs: Any) -> dict[str, Any]:
        """Load the model weights of a checkpoint (``strict``, ``revise_keys``,
        ``map_location`` as the strategy's ``load_checkpoint``)."""
        return self.strategy.checkpointer.load(
            filename, callback=self._after_load_callback(), **kwargs
        )

    def _before_save_callback(self, checkpoint: dict[str, Any]) -> None:
        """The ``before_save_checkpoint`` hooks, on every rank, with the keys mmengine's Runner
        gives them there (it builds the whole dict on every rank; mmengine's ``EMAHook`` swaps
        ``checkpoint['state_dict']``'s entries): on a rank that writes nothing of a gathered
        checkpoint (rank 0 writes the full file), the entries torch's gather left empty are
        this rank's own state (the model's replica under DDP, its shards under FSDP; no copy,
        no collective), for the hooks only (nothing of it is written)."""
        checkpointer = self.strategy.checkpointer
        layout = checkpointer.layout
        if layout is not None and not layout.format.writes_on(layout.rank):
            empty = [
                key for key, value in checkpoint.items() if isinstance(value, dict) and not value
            ]
            if empty:
                local = checkpointer.local_state_dict()
                checkpoint.update({key: local[key] for key in empty if key in local})
        self.call_hook("before_save_checkpoint", checkpoint=checkpoint)

    def _after_load_callback(self) -> Callable[[dict[str, Any]], None]:
        return lambda checkpoint: self.call_hook("after_load_checkpoint", checkpoint=checkpoint)

    def save_checkpoint(
        self,
        filename: str | os.PathLike[str],
        *,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        meta: Mapping[str, Any] | None = None,
        by_epoch: bool = True,
        async_save: bool | None = None,
        max_keep_ckpts: int | None = None,
        series: str = "periodic",
    ) -> Any:
        """Save a checkpoint with the loop position and the message hub.

        ``by_epoch=True`` is for a save at the end of an epoch (the epoch is complete),
        ``False`` for one after an iteration, as mmengine's ``CheckpointHook`` calls it;
        ``meta`` entries are added to (and may override) the recorded position.
        ``async_save``, ``max_keep_ckpts`` and ``series`` go to the strategy's
        ``save_checkpoint`` (None: its defaults).
        Returns what the strategy returns: a future for a save written in the background,
        else None. Under fault tolerance one replica group writes (rank 0 of the current
        quorum: the replicas hold the same state); the others save nothing.
        """
        ft = getattr(self.strategy, "fault_tolerance", None)
        if ft is not None and not ft.writes_checkpoints:
            return None
        if by_epoch:
            position = dict(epoch=self.epoch + 1, iter=self.iter)
        else:
            position = dict(epoch=self.epoch, iter=self.iter + 1)
        full_meta = {**position, **dict(meta or {})}
        full_meta.update(
            cfg=redact_secrets(self.cfg).pretty_text, experiment_name=self.experiment_name
        )
        self._register_states()
        return self.strategy.checkpointer.save(
            filename,
            save_optimizer=save_optimizer,
            save_param_scheduler=save_param_scheduler,
            extra_ckpt=dict(meta=full_meta),
            callback=self._before_save_callback,
            async_save=async_save,
            max_keep_ckpts=max_keep_ckpts,
            series=series,
        )
