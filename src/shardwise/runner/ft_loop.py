"""The training loop of a fault-tolerant run (``strategy=dict(..., fault_tolerance=...)``;
:mod:`shardwise.strategies.fault_tolerance`).

Each optimizer step starts with the step's quorum (torchft's, through
:meth:`~shardwise.strategies.fault_tolerance.FaultTolerance.start_step`), *before* its data is
read: a replica group that (re)joins heals there from a live peer, the loop's position
(``epoch``, ``iter``) with the rest of the state, and then reads the data of the step the
quorum is at. The data of iteration ``i`` is fixed by ``i`` alone: the ``i``-th window of
``batch_size * num_replica_groups * dp_size`` indices of the epoch's permutation (the order
a ``DistributedSampler`` over that many ranks gives, so a run without failures reads what a
plain run of ``num_replica_groups * dp_size`` ranks reads), split among the ranks of the
replica groups live in the step's quorum. When a group is lost, the survivors read its part
too (their per-rank batch grows); nothing is skipped or repeated, and the step in progress
when a group dies does not commit and is redone with the new split.

A step that does not commit (``should_commit()`` is False: the optimizer did not step)
calls no ``after_train_iter`` and does not advance ``iter``; with gradient accumulation the
whole window of ``accumulative_counts`` iterations is the step, its quorum started before
its first batch, and a window that does not commit is redone from its first iteration (the
schedulers rewound). Every other hook, the logging and the validation run as in
:class:`~shardwise.runner.loops.EpochBasedTrainLoop` / :class:`IterBasedTrainLoop`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from .data import ResumableSampler
from .loops import _TrainLoop

__all__ = ["FaultTolerantTrainLoop", "QuorumBatchSampler", "ft_config_of"]


def ft_config_of(strategy: Any) -> Any:
    """The strategy's checked ``fault_tolerance`` config, None without one (known before
    ``prepare``, when the loop is built)."""
    return getattr(strategy, "fault_tolerance_cfg", None)


class QuorumBatchSampler:
    """The batches of one rank from iteration ``start`` on, for one quorum.

    Iteration ``i`` reads window ``i % epoch_length`` of data epoch ``i // epoch_length``:
    ``batch_size * total_parts`` indices of the epoch's permutation (``seed + epoch``,
    padded as ``DistributedSampler`` pads for ``total_parts`` ranks), of which this rank
    reads every ``parts``-th from ``part`` (``parts``: the ranks of the live replica groups).
    """

    def __init__(
        self,
        dataset_len: int,
        batch_size: int,
        total_parts: int,
        *,
        shuffle: bool,
        seed: int,
        drop_last: bool,
    ) -> None:
        self.dataset_len = dataset_len
        self.window = batch_size * total_parts
        self.total_size = math.ceil(dataset_len / total_parts) * total_parts
        self.shuffle, self.seed = shuffle, seed
        if drop_last:
            self.epoch_length = self.total_size // self.window
        else:
            self.epoch_length = math.ceil(self.total_size / self.window)
        self.start, self.part, self.parts = 0, 0, 1
        self._perm: tuple[int, list[int]] | None = None

    def permutation(self, epoch: int) -> list[int]:
        """Data epoch ``epoch``'s indices, padded to a multiple of the ranks."""
        if self._perm is None or self._perm[0] != epoch:
            if self.shuffle:
                g = torch.Generator()
                g.manual_seed(self.seed + epoch)
                indices = torch.randperm(self.dataset_len, generator=g).tolist()
            else:
                indices = list(range(self.dataset_len))
            pad = self.total_size - len(indices)
            indices += (indices * math.ceil(pad / len(indices)))[:pad] if pad else []
            self._perm = (epoch, indices)
        return self._perm[1]

    def indices(self, iteration: int, part: int, parts: int) -> list[int]:
        """The indices of iteration ``iteration`` that part ``part`` of ``parts`` reads."""
        epoch, b = divmod(iteration, self.epoch_length)
        window = self.permutation(epoch)[b * self.window : (b + 1) * self.window]
        return window[part::parts]

    def __iter__(self) -> Iterator[list[int]]:
        iteration = self.start
        while True:
            yield self.indices(iteration, self.part, self.parts)
            iteration += 1


def _over_replica_groups(loader: DataLoader, total_parts: int, part: int) -> DataLoader:
    """``loader``'s data, batch size and shuffling as a loader over every rank of every replica
    group (``total_parts``; this rank's ``part`` when all are live): the one the hooks and the
    logging see (its length is the epoch's), whose sampler's seed a resume restores. The loop
    reads the batches of each quorum through :class:`QuorumBatchSampler`."""
    sampler = getattr(loader, "sampler", None)
    if loader.batch_size is None or not hasattr(sampler, "shuffle"):
        raise ValueError(
            "fault_tolerance reads each step's part of the data for the live replica "
            "groups, which needs a train_dataloader with a batch_size and a "
            "DistributedSampler (build it from a config: train_dataloader=dict(dataset="
            f"..., batch_size=...)); got batch_size={loader.batch_size!r}, sampler "
            f"{type(sampler).__name__}"
        )
    generator = torch.Generator()
    over_groups = ResumableSampler(
        loader.dataset,
        shuffle=bool(sampler.shuffle),
        seed=int(sampler.seed),
        num_replicas=total_parts,
        rank=part,
        generator=generator,
    )
    return _like(
        loader,
        batch_size=loader.batch_size,
        sampler=over_groups,
        drop_last=loader.drop_last,
        generator=generator,
    )


def _like(loader: DataLoader, **kwargs: Any) -> DataLoader:
    """A ``DataLoader`` of ``loader``'s dataset with its collation, workers and pinning, and
    ``kwargs`` (its sampling)."""
    kwargs.update(
        collate_fn=loader.collate_fn,
        num_workers=loader.num_workers,
        pin_memory=loader.pin_memory,
        worker_init_fn=loader.worker_init_fn,
        timeout=loader.timeout,
    )
    if loader.num_workers > 0:
        kwargs.update(
            multiprocessing_context=loader.multiprocessing_context,
            prefetch_factor=loader.prefetch_factor,
        )
    return DataLoader(loader.dataset, **kwargs)


class _QuorumBatches:
    """The batch of an iteration for a quorum, read through a ``DataLoader`` over a
    :class:`QuorumBatchSampler` (workers prefetch the next iterations while the quorum stays
    the same; a new quorum or position starts a new iterator)."""

    def __init__(self, loader: DataLoader, total_parts: int) -> None:
        sampler = loader.sampler
        self.loader = loader
        self.sampler = QuorumBatchSampler(
            len(loader.dataset),
            loader.batch_size,
            total_parts,
            shuffle=bool(sampler.shuffle),
            seed=int(sampler.seed),
            drop_last=bool(loader.drop_last),
        )
        self._key: tuple[int, int, int] | None = None
        self._it: Iterator[Any] | None = None

    def get(self, iteration: int, part: int, parts: int) -> Any:
        seed = int(self.loader.sampler.seed)  # a resume may have reseeded the sampler
        if (iteration, part, parts) != self._key or seed != self.sampler.seed:
            self._restart(iteration, part, parts, seed)
        batch = next(self._it)
        self._key = (iteration + 1, part, parts)
        return batch

    def _restart(self, iteration: int, part: int, parts: int, seed: int) -> None:
        self._it = None  # the previous iterator's workers stop
        s = self.sampler
        s.start, s.part, s.parts, s.seed, s._perm = iteration, part, parts, seed, None
        generator = torch.Generator()  # the workers' seeds: from the seed, position, part
        generator.manual_seed((seed * 1_000_003 + iteration * 7_919 + part) % (2**63 - 1))
        self._it = iter(_like(self.loader, batch_sampler=s, generator=generator))


class FaultTolerantTrainLoop(_TrainLoop):
    """Train a replica group of a fault-tolerant run: ``max_epochs`` (``by_epoch=True``) or
    ``max_iters`` steps, each started by the quorum (see the module docstring). Built by the
    Runner in place of the epoch- or iteration-based loop when the strategy has
    ``fault_tolerance``; ``val_begin``, ``val_interval`` as theirs."""

    def __init__(
        self,
        runner: Any,
        dataloader: DataLoader,
        *,
        by_epoch: bool,
        max_epochs: int | None = None,
        max_iters: int | None = None,
        val_begin: int = 1,
        val_interval: int | None = None,
    ) -> None:
        if val_interval is None:
            val_interval = 1 if by_epoch else 1000
        ft = ft_config_of(runner.strategy)
        self._dp_size = runner.strategy.data_parallel_size
        self._dp_rank = runner.strategy.data_parallel_rank
        total = ft["num_replica_groups"] * self._dp_size
        dataloader = _over_replica_groups(
            dataloader, total, ft["replica_group"] * self._dp_size + self._dp_rank
        )
        runner.train_dataloader = dataloader  # its length is the epoch's, as hooks expect
        super().__init__(runner, dataloader, val_begin, val_interval)
        self.by_epoch = by_epoch
        self._batches = _QuorumBatches(dataloader, total)
        if by_epoch:
            self._max_epochs = int(max_epochs)
            self._max_iters = self._max_epochs * self.epoch_length
        else:
            self._max_iters, self._max_epochs = int(max_iters), 1
        self._healed = False
        self._resumed = False
        self._open_epoch: int | None = None

    # ------------------------------------------------------------------ state
    def load_state_dict(self, meta: dict[str, Any]) -> None:
        """Resume from a checkpoint (every replica group died): the position, the sampler's
        seed; the quorum's step follows (:meth:`run`)."""
        self._resumed = True
        super().load_state_dict(meta)

    def local_state_dict(self) -> dict[str, Any]:
        """The position a healing peer receives."""
        return self.state_dict()

    def load_local_state_dict(self, state: dict[str, Any]) -> None:
        """Take a live peer's position (a heal, inside :meth:`start_step`)."""
        self._epoch, self._iter = int(state["epoch"]), int(state["iter"])
        self._healed = True

    # ------------------------------------------------------------------ the loop
    def _window(self) -> int:
        """The iterations of one optimizer step (gradient accumulation)."""
        wrapper = self.runner.optim_wrapper
        wrappers = list(wrapper.values()) if hasattr(wrapper, "values") else [wrapper]
        counts = {getattr(w, "accumulative_counts", 1) for w in wrappers}
        if len(counts) != 1:
            raise ValueError(
                f"fault_tolerance commits one optimizer step for every optimizer at once, but "
                f"the optimizer wrappers accumulate over {sorted(counts)} iterations; give "
                "them the same accumulative_counts"
            )
        return counts.pop()

    def run(self) -> Any:
        ft = self.runner.strategy.fault_tolerance
        try:
            model = self._run(ft)
        except BaseException:  # torchft's servers and threads would keep the process alive
            ft.shutdown()
            raise
        ft.shutdown(wait_for_group=True)
        return model

    def _run(self, ft: Any) -> Any:
        runner = self.runner
        window = self._window()
        runner._register_states()  # the position and the message hub heal with the rest
        if self._resumed:  # from a checkpoint: the quorum's step is the checkpoint's
            ft.restore_step(self._iter // window)
        runner.call_hook("before_train")
        if not self.by_epoch:
            runner.call_hook("before_train_epoch")
        while self._iter < self._max_iters and not self.stop_training:
            step = ft.start_step()  # may heal: the position comes with the state
            if self._healed:
                self._healed = False
                runner._initialize_accumulation()
            if self._iter >= self._max_iters:
                break
            if self.by_epoch:
                self._enter_epoch()
            if self._run_step(ft, step, window) and self.by_epoch:
                self._leave_epoch()
            elif not self.by_epoch and self._validate_now(
                self._iter, self._iter == self._max_iters
            ):
                runner.val_loop.run()
        if not self.by_epoch:
            runner.call_hook("after_train_epoch")
        runner.call_hook("after_train")
        return runner.model

    def _run_step(self, ft: Any, step: int, window: int) -> bool:
        """One optimizer step (a window of iterations); whether it committed."""
        runner = self.runner
        start = self._iter
        n = min(window - start % window, self._max_iters - start)
        states = runner.strategy.checkpointer.states
        schedulers = states.get("param_schedulers")
        saved = copy.deepcopy(schedulers.state_dict()) if n > 1 and schedulers else None
        part = ft.replica_rank * self._dp_size + self._dp_rank
        parts = ft.num_replicas * self._dp_size
        for j in range(n):
            runner.model.train()
            batch = self._batches.get(self._iter, part, parts)
            idx = self._iter - self._epoch * self.epoch_length if self.by_epoch else self._iter
            runner.call_hook("before_train_iter", batch_idx=idx, data_batch=batch)
            failed = ft.failed_commits
            outputs = runner.train_step(batch)
            if j == n - 1 and ft.current_step() <= step:
                if ft.failed_commits == failed:
                    raise RuntimeError(
                        f"iteration {self._iter} ended a window of {n} iteration(s) without an "
                        "optimizer step: fault_tolerance commits at each step of the optimizer "
                        "wrapper (update_params or step); call it every accumulative_counts "
                        "iterations"
                    )
                self._iter = start  # not committed: the step is redone
                if saved is not None:
                    schedulers.load_state_dict(saved)
                runner._initialize_accumulation()
                return False
            runner.call_hook("after_train_iter", batch_idx=idx, data_batch=batch, outputs=outputs)
            self._iter += 1
        return True

    def _enter_epoch(self) -> None:
        """``before_train_epoch`` for the epoch of the next iteration (an epoch left by a
        heal that moved on is closed without ``after_train_epoch``)."""
        self._epoch = self._iter // self.epoch_length
        if self._open_epoch != self._epoch:
            self._open_epoch = self._epoch
            self.runner.call_hook("before_train_epoch")

    def _leave_epoch(self) -> None:
        if self._iter % self.epoch_length:
            return
        self.runner.call_hook("after_train_epoch")
        self._epoch += 1
        self._open_epoch = None
        if self._validate_now(self._epoch, self._epoch == self._max_epochs):
            self.runner.val_loop.run()
