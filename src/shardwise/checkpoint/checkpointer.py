"""The Checkpointer: saving, loading and resuming state objects, in one place.

A checkpoint is a dict of entries, each the ``state_dict()`` of a *state object*
(:mod:`.states`: torch's ``Stateful`` protocol), by checkpoint key. A strategy registers its
model (``'state_dict'``), optimizers (``'optimizer'``) and schedulers (``'param_schedulers'``);
parts of ``'meta'`` (the random state, the strategy's layout, a runner's loop position) are
state objects too, registered with ``meta=True``; a runner adds its message hub. The strategy
hands over only a :class:`Layout`: the format it writes and where read tensors go (its
``Placement``). The Checkpointer knows nothing else of the strategy:

- :meth:`Checkpointer.save`: every state, through the commit protocol, synchronously or in the
  background (:mod:`.async_save`), with retention (``max_keep_ckpts``);
- :meth:`Checkpointer.load` (model weights) and :meth:`Checkpointer.resume` (every state,
  whole or refused: each state's ``fit_state_dict`` says whether the saved entry fits);
- :func:`where_to_start` and :meth:`Checkpointer.load_or_resume`: mmengine's rules for
  ``load_from`` and ``resume``.

Example::

    >>> checkpointer = Checkpointer('work_dirs/demo', layout=Layout(FULL))
    >>> checkpointer.register('state_dict', model)       # any object with state_dict()
    >>> checkpointer.register('optimizer', optimizer)
    >>> checkpointer.save('iter_10.pth')
    >>> checkpointer.resume('iter_10.pth')
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import shardwise
from shardwise.env import gc_paused

from .agreement import on_every_rank
from .async_save import AsyncCheckpointer
from .files import CheckpointError, require_checkpoint
from .formats import CheckpointFormat, Placement, detect_format, read_checkpoint
from .full import is_bare_state_dict
from .latest import find_last_checkpoint
from .local import rank_file
from .manifest import MANIFEST
from .object_commit import RunClaims, commit_for
from .planning import LAYOUT_FILE
from .remote_read import RemoteCheckpoint, read_remote
from .retention import Retention, check_max_keep_ckpts
from .sharded import DCP_METADATA, META_FILE
from .states import Stateful
from .storage import ObjectURL, location

__all__ = [
    "DEFAULT_REVISE_KEYS",
    "MODEL",
    "Checkpointer",
    "Layout",
    "revise_state_dict_keys",
    "where_to_start",
]

DEFAULT_REVISE_KEYS = [(r"^module\.", "")]

#: The checkpoint keys of the model, optimizer and scheduler entries (mmengine's).
MODEL, OPTIMIZER, SCHEDULERS = "state_dict", "optimizer", "param_schedulers"


@dataclass(frozen=True)
class Layout:
    """What a strategy tells the Checkpointer about its state.

    Args:
        format: the format saves write.
        placement: for a sharded run, ``placement(path)`` says where the tensors read from the
            checkpoint at ``path`` go (every rank reads onto its shards, collectively); None:
            each process reads the checkpoint whole, onto plain tensors.
        device: where ``map_location='default'`` puts the tensors read.
        rank: this process's rank.
    """

    format: CheckpointFormat
    placement: Callable[[Path], Placement] | None = None
    device: torch.device | str = "cpu"
    rank: int = 0


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


@dataclass
class _Entry:
    state: Stateful
    meta: bool  # its state_dict() is merged into 'meta', and it loads from 'meta'
    required: bool  # a resume refuses a checkpoint without it


class Checkpointer:
    """Saves, loads and resumes state objects (see the module docstring).

    Args:
        work_dir: where relative checkpoint names are put and looked for: a local directory
            or an object-store URL (``s3://bucket/run``; see :mod:`.object_commit`).
        states: the state objects by checkpoint key (more with :meth:`register`).
        layout: the strategy's :class:`Layout` (None until it has one: saving, loading and
            resuming refuse until then).
        async_save: the default of :meth:`save`'s ``async_save``.
        max_keep_ckpts: the default of :meth:`save`'s ``max_keep_ckpts``.
        verify_checksums: the default of :meth:`load`'s and :meth:`resume`'s.
        logger: where saves and loads are reported.
        run_label: how a person finds this run (the strategy's log folder), recorded with
            each local checkpoint it commits; a later run that overwrites one names it.
    """

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        states: Mapping[str, Stateful] | None = None,
        layout: Layout | None = None,
        *,
        async_save: bool = False,
        max_keep_ckpts: int = -1,
        verify_checksums: bool = True,
        logger: logging.Logger | None = None,
        run_label: str = "",
    ) -> None:
        self.work_dir = location(work_dir)
        self.layout = layout
        self.async_save = async_save
        self.max_keep_ckpts = check_max_keep_ckpts(max_keep_ckpts)
        self.verify_checksums = verify_checksums
        self.logger = logger or logging.getLogger("shardwise")
        self._states: dict[str, _Entry] = {}
        self._fenced: set[str] = set()  # states hooked by _fence_staging
        for key, state in (states or {}).items():
            self.register(key, state)
        #: The checkpoints kept under a ``max_keep_ckpts`` limit, by series.
        self.retention = Retention()
        #: Stages asynchronous saves in host memory and writes them in the background.
        self.stager = AsyncCheckpointer()
        #: The prefixes on object storage this run writes (see :mod:`.object_commit`).
        self.claims = RunClaims(run_label)
        #: The memory tier (:mod:`.memory`: snapshots in node memory), if the strategy has one.
        self.memory: Any = None

    # ------------------------------------------------------------------ states
    def register(
        self, key: str, state: Stateful, *, meta: bool = False, required: bool = True
    ) -> None:
        """Save and resume ``state`` under ``key`` (replacing what was there). With ``meta``,
        its ``state_dict()`` (a dict) is merged into the checkpoint's ``meta`` and it is
        loaded from ``meta``. ``required=False``: a resume from a checkpoint without it goes
        on without it (an entry added in a later version, say)."""
        if not isinstance(state, Stateful):
            raise TypeError(
                f"checkpoint state {key!r} is a {type(state).__name__}, which has no "
                "state_dict()/load_state_dict(); register an object with both"
            )
        if not meta and key == "meta":
            raise ValueError("'meta' is the checkpoint's own entry; register parts with meta=True")
        self._states[key] = _Entry(state, meta, required)
        self._fenced.discard(key)

    def unregister(self, key: str) -> None:
        """Stop saving and resuming ``key`` (nothing if it is not registered)."""
        self._states.pop(key, None)

    @property
    def states(self) -> dict[str, Stateful]:
        """The registered state objects, by key."""
        return {key: entry.state for key, entry in self._states.items()}

    def local_state_dict(self) -> dict[str, Any]:
        """This rank's part of every registered state, by key, taken without any collective:
        each state's ``local_state_dict()`` where it has one, else its ``state_dict()`` (see
        :mod:`~shardwise.checkpoint.states`). What a peer rank of the same layout loads with
        :meth:`load_local_state_dict` (fault tolerance heals a replica group this way)."""
        return {
            key: getattr(e.state, "local_state_dict", e.state.state_dict)()
            for key, e in self._states.items()
        }

    def load_local_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load what a peer rank's :meth:`local_state_dict` gave, every state in registration
        order, without any collective. Raises KeyError naming the keys that differ (checked
        before anything is loaded)."""
        if set(state_dict) != set(self._states):
            raise KeyError(
                f"the local state has {sorted(state_dict)}, this Checkpointer registers "
                f"{sorted(self._states)}; both sides must register the same states"
            )
        for key, e in self._states.items():
            getattr(e.state, "load_local_state_dict", e.state.load_state_dict)(state_dict[key])

    def _selected(self, skip: Sequence[str]) -> dict[str, _Entry]:
        return {key: e for key, e in self._states.items() if key not in skip}

    def _layout(self, what: str) -> Layout:
        if self.layout is None or MODEL not in self._states:
            raise RuntimeError(f"{what} needs a prepared strategy: call prepare() first")
        return self.layout

    # ------------------------------------------------------------------ paths
    def resolve(self, filename: str | os.PathLike[str]) -> Path | ObjectURL:
        """Where a save puts ``filename``: as given if absolute (or a URL), else inside
        ``work_dir``."""
        path = location(filename)
        if isinstance(path, ObjectURL) or path.is_absolute():
            return path
        return self.work_dir / path

    def find(self, filename: str | os.PathLike[str]) -> Path | ObjectURL:
        """``filename`` as given, or inside ``work_dir`` when it is relative and only there
        (inside a ``work_dir`` on object storage when it is not on local disk)."""
        path = location(filename)
        if isinstance(path, ObjectURL) or path.exists() or path.is_absolute():
            return path
        inside = self.resolve(path)
        return inside if isinstance(inside, ObjectURL) or inside.exists() else path

    def read(
        self,
        filename: str | os.PathLike[str],
        map_location: Any = "cpu",
        verify_checksums: bool | None = None,
    ) -> dict[str, Any]:
        """The checkpoint at ``filename``, read as the layout says: whole, or by every rank onto
        its shards (collective); ``map_location='default'``: the layout's device."""
        layout = self._layout("reading a checkpoint")
        path = self.find(filename)
        if isinstance(path, ObjectURL):  # read a local copy, its bytes fetched where read
            read = lambda local: self.read(local, map_location, verify_checksums)  # noqa: E731
            return read_remote(path, read, lambda remote: _read_first(remote, layout))
        device = layout.device if map_location == "default" else map_location
        verify = self.verify_checksums if verify_checksums is None else bool(verify_checksums)
        if layout.placement is None:
            return read_checkpoint(path, map_location=device, verify_checksums=verify)
        placement = layout.placement(path)
        fmt = placement.on_rank0(lambda: detect_format(path))
        return fmt.read_onto(path, placement, verify)

    # ------------------------------------------------------------------ save
    def state(
        self,
        skip: Sequence[str] = (),
        extra_ckpt: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The checkpoint dict of every registered state but ``skip`` (a collective under
        sharding), with ``extra_ckpt`` beside them (its ``meta`` merged into ``meta``)."""
        layout = self._layout("taking the state")
        extra = dict(extra_ckpt or {})
        selected = self._selected(skip)
        clash = sorted(set(extra) & {k for k, e in selected.items() if not e.meta})
        if clash:
            raise ValueError(
                f"extra_ckpt keys {clash} would overwrite the checkpoint's own entries "
                f"{sorted(k for k, e in self._states.items() if not e.meta)}; rename them"
            )
        meta: dict[str, Any] = dict(
            shardwise_version=shardwise.__version__,
            time=time.strftime("%Y-%m-%d %H:%M:%S"),
            format=layout.format.name,
        )
        state: dict[str, Any] = {}
        for key, entry in selected.items():
            if entry.meta:
                meta.update(entry.state.state_dict())
            else:
                state[key] = entry.state.state_dict()
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
        """Save every registered state through the commit protocol, in the layout's format.

        A relative ``filename`` is taken inside ``work_dir``. ``save_optimizer`` /
        ``save_param_scheduler`` False leave those entries out. ``extra_ckpt`` entries are
        stored beside the states (its ``meta`` entries are merged into ``meta``);
        ``callback(checkpoint)`` may edit the dict before it is written.

        ``async_save`` (None: the default given at construction) returns as soon as the state
        is copied to host memory, with a future (``.done()``, ``.result()`` -> the
        checkpoint's path) while the write and commit go on in the background; the next save,
        :meth:`wait`, loading and interpreter exit wait for it, and its failure (on any rank)
        is raised as :class:`CheckpointError` on every rank there. A synchronous save returns
        None once the checkpoint is committed.

        ``max_keep_ckpts`` (None: the default given at construction; -1: no limit) keeps only
        the newest N checkpoints of the ``series`` (e.g. ``'periodic'``, ``'best_acc'``):
        once this one is committed, rank 0 deletes the oldest beyond N (never the newest,
        never one being written; see :mod:`.retention`). The lists survive a resume.

        Example::

            >>> future = strategy.save_checkpoint('iter_1000.pth', async_save=True)
            >>> ...  # training goes on while the checkpoint is written
            >>> strategy.wait_for_checkpoint()  # committed (or CheckpointError)
        """
        self.wait()
        layout = self._layout("save_checkpoint()")
        in_background = self.async_save if async_save is None else bool(async_save)
        max_keep = self.max_keep_ckpts if max_keep_ckpts is None else max_keep_ckpts
        check_max_keep_ckpts(max_keep)
        path = self.resolve(filename)
        fmt = layout.format
        skip = [OPTIMIZER] * (not save_optimizer) + [SCHEDULERS] * (not save_param_scheduler)
        start = time.perf_counter()
        try:
            state = self.state(skip, extra_ckpt)
        except CheckpointError:
            raise
        except RuntimeError as exc:  # a collective failed: a rank crashed or timed out
            raise CheckpointError(
                f"saving {path}: gathering the state to save failed on rank {layout.rank}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if callback is not None:
            callback(state)
        retire: list[str] = []
        if max_keep > 0:
            kept, retire = self.retention.plan(path, max_keep, series)
            state.setdefault("meta", {})["kept_checkpoints"] = kept
        if layout.rank == 0:
            _say_if_overwriting(path, self.claims, self.logger)
        if in_background:
            return self._save_in_background(state, path, fmt, start, retire)
        commit = commit_for(path, self.work_dir, self.claims, fmt.is_dir, retire)
        try:
            with commit as staging:
                commit.record(*self._write(fmt, state, staging))
        except BaseException:
            self.retention.settle(committed=False)
            raise
        self.retention.settle(committed=True)
        self.logger.info(
            "Saved checkpoint %s (%s) in %.2f s", path, fmt, time.perf_counter() - start
        )
        return None

    def _write(
        self, fmt: CheckpointFormat, state: dict[str, Any], staging: Path, group: Any = None
    ) -> list[Any]:
        """This rank's part of the checkpoint under the staging path (collectives on
        ``group``); one DCP plan is reused per layout and kind of save."""
        plan = f"Checkpointer@{id(self):x}:{'async' if group else 'sync'}"
        return fmt.write(state, staging, rank=self._layout("writing").rank, group=group, plan=plan)

    def _save_in_background(
        self,
        state: dict[str, Any],
        path: Path | ObjectURL,
        fmt: CheckpointFormat,
        start: float,
        retire: list[str],
    ) -> Future:
        """Stage ``state`` to host memory, agree that every rank did, and write and commit it
        in the background (see :mod:`.async_save`)."""
        group = self.stager.group()
        commit = commit_for(path, self.work_dir, self.claims, fmt.is_dir, retire, group)
        staged, error = None, None
        try:
            staged = fmt.stage(state, self.stager, self._layout("staging").rank)
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
        self.logger.info(
            "Staged checkpoint %s (%s) in host memory in %.2f s; writing it in the background",
            path,
            fmt,
            blocked,
        )

        def log(done: Future) -> None:
            if done.exception() is None:
                self.logger.info(
                    "Saved checkpoint %s (%s) in %.2f s (in the background)",
                    path,
                    fmt,
                    time.perf_counter() - start,
                )

        future.add_done_callback(log)
        return future

    def _fence_staging(self) -> None:
        """Make every state that changes its saved tensors in place (an optimizer step, a
        forward that updates buffers) wait until the save in flight has copied the tensors it
        left to the background (hooks registered once per state)."""
        for key, entry in self._states.items():
            hook = getattr(entry.state, "register_pre_change_hook", None)
            if hook is None or key in self._fenced:
                continue
            hook(self.stager.wait_for_staging)
            self._fenced.add(key)

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
        ``optimizer``, extras). ``map_location='default'`` means the layout's device;
        ``strict`` refuses missing, unexpected and mismatched keys (else they are skipped with
        a warning); ``revise_keys`` are ``(pattern, replacement)`` regexes applied to the
        keys; ``callback(checkpoint)`` sees it before it is used; ``verify_checksums`` (None:
        the default given at construction) compares the files with the checksums recorded
        when they were saved while reading them, and refuses a mismatch."""
        require_checkpoint(self.find(filename), also=self.resolve(filename))  # said first
        self.wait()
        self.logger.info("Loading weights from %s", filename)
        checkpoint = self.read(filename, map_location, verify_checksums)
        if callback is not None:
            callback(checkpoint)
        if MODEL not in checkpoint and is_bare_state_dict(checkpoint):
            checkpoint = {MODEL: checkpoint}
        if MODEL not in checkpoint:
            raise KeyError(
                f"{filename} has no {MODEL!r} entry (keys: {sorted(checkpoint)}); it is not "
                "a shardwise or mmengine checkpoint"
            )
        weights = revise_state_dict_keys(checkpoint.pop(MODEL), revise_keys)
        self._states[MODEL].state.load_state_dict(weights, strict=strict)
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
        """Restore every registered state from a checkpoint, whole or not at all: a checkpoint
        that lacks a required entry, or one whose entries do not fit their states (each
        state's ``fit_state_dict``), is refused before anything is loaded.
        ``resume_optimizer`` / ``resume_param_scheduler`` False leave those states as they
        are; ``map_location``, ``callback``, ``verify_checksums`` as in :meth:`load`. Returns
        the checkpoint's entries no state took (``meta`` always)."""
        require_checkpoint(self.find(filename), also=self.resolve(filename))  # said first
        self.wait()
        self._layout("resume()")
        skip = [OPTIMIZER] * (not resume_optimizer) + [SCHEDULERS] * (not resume_param_scheduler)
        if resume_optimizer and OPTIMIZER not in self._states:
            raise RuntimeError(
                "resume_optimizer=True but this strategy has no optimizer wrapper; pass "
                "optim_wrapper to prepare() or resume(..., resume_optimizer=False)"
            )
        checkpoint = self.read(filename, map_location, verify_checksums)
        entries = on_every_rank(  # refused on every rank, or by none
            lambda: _fit(filename, checkpoint, self._selected(skip)),
            f"resuming from {filename}",
        )
        if callback is not None:
            callback(checkpoint)
        meta = checkpoint.get("meta", {})
        for key, entry in entries.items():
            entry.state.load_state_dict(meta if entry.meta else checkpoint.pop(key))
        found = self.find(filename)
        self.retention.restore(meta.get("kept_checkpoints"), found)
        self.claims.resumed_from(found)
        self.logger.info("Resumed from %s", filename)
        return checkpoint

    def load_or_resume(
        self,
        *,
        load_from: Any = None,
        resume: bool | str = False,
        weights_only: bool = False,
        resume_with: Callable[[str], dict[str, Any]] | None = None,
        load_with: Callable[[str], dict[str, Any]] | None = None,
    ) -> dict[str, Any] | None:
        """Resume or load weights by mmengine's rules (:func:`where_to_start`); None when
        there is nothing to start from. ``weights_only``: the checkpoint a resume would pick
        gives its weights only (a run with nothing to train). ``resume_with`` and
        ``load_with`` (default: :meth:`resume` and :meth:`load`) are called with the path (a
        runner passes its own, which register its states and call its hooks)."""
        if self.memory is not None and not weights_only:  # resume=True: memory, then storage
            placed = self._layout("resume()").placement is not None
            recovered = self.memory.start(resume=resume is True, placed=placed)
            if recovered is not None:
                return recovered.resume(resume_with or self.resume, self.retention, self.logger)
        resume_from, weights_from = where_to_start(
            self.work_dir, load_from=load_from, resume=resume
        )
        given = "resume" if isinstance(resume, str | os.PathLike) else "load_from"
        if resume_from or weights_from:  # named before the runner's hooks run, on every rank
            path = resume_from or weights_from
            require_checkpoint(self.find(path), f"{given} checkpoint", also=self.resolve(path))
        if resume_from is not None and not weights_only:
            self.logger.info("Resuming from %s", resume_from)
            return (resume_with or self.resume)(resume_from)
        if resume_from is not None or weights_from is not None:
            return (load_with or self.load)(resume_from or weights_from)
        if resume:
            self.logger.info(
                "resume=True but %s has no committed checkpoint: starting from scratch",
                self.work_dir,
            )
        return None


def _fit(
    filename: Any, checkpoint: dict[str, Any], selected: Mapping[str, _Entry]
) -> dict[str, _Entry]:
    """The states to load: refuses a resume that could not be whole (a required entry
    missing, or one its state says does not fit), and puts each entry in the shape its
    state loads."""
    hints = {
        OPTIMIZER: "optimizer state; resume with resume_optimizer=False",
        SCHEDULERS: "parameter scheduler state; resume with resume_param_scheduler=False",
    }
    problems: list[str] = []
    entries: dict[str, _Entry] = {}
    for key, entry in selected.items():
        if entry.meta:
            entries[key] = entry
            continue
        if key not in checkpoint:
            if entry.required:
                hint = hints.get(key, f"{key!r} entry; unregister it")
                raise KeyError(f"{filename} has no {hint} to restore the rest of it")
            continue
        fit = getattr(entry.state, "fit_state_dict", None)
        if fit is not None:
            checkpoint[key], found = fit(checkpoint[key])
            problems += found
        entries[key] = entry
    if problems:
        raise CheckpointError(  # one line: what every rank tells the others
            f"refusing to resume from {filename}: it does not fit this run "
            f"({'; '.join(problems)}), and nothing was loaded. To start a new run from its "
            "weights, use load_from (it loads the parameters that fit and no optimizer state)"
        )
    return entries


def _read_first(remote: RemoteCheckpoint, layout: Layout) -> list[str] | None:
    """What a rank fetches of a checkpoint on object storage before reading it (None:
    everything): a process reading it whole, everything; under a placement, a single file on
    rank 0 (the others get its tensors from rank 0), else the small files every rank reads
    (a sharded read fetches its fragments and chunks itself; a local one its rank file)."""
    if layout.placement is None:
        return None
    if not remote.is_dir:
        return None if layout.rank == 0 else []
    return [MANIFEST, META_FILE, LAYOUT_FILE, DCP_METADATA, rank_file(".", layout.rank).name]


def revise_state_dict_keys(
    state_dict: Mapping[str, Any], revise_keys: Sequence[tuple[str, str]]
) -> dict[str, Any]:
    """``state_dict`` with each ``(pattern, replacement)`` regex applied to every key."""
    revised = dict(state_dict)
    for pattern, replacement in revise_keys:
        regex = re.compile(pattern)
        revised = {regex.sub(replacement, k): v for k, v in revised.items()}
    return revised


def _say_if_overwriting(path: Path | ObjectURL, claims: RunClaims, logger: logging.Logger) -> None:
    """A warning before a save replaces a checkpoint another run committed at the local
    ``path`` (on object storage, the prefix's claim refuses another run's saves)."""
    previous = claims.another_runs(path) if isinstance(path, Path) else None
    if previous is None:
        return
    if previous.get("label"):
        who = f"the run logged in {previous['label']}"
    elif previous.get("pid"):
        who = f"pid {previous['pid']} on {previous.get('host', '?')}"
    else:
        who = f"at {previous.get('created') or 'an unknown time'}"
    logger.warning(
        "Overwriting %s, which another run committed in this work dir (%s); give each run its "
        "own work_dir (--work-dir) to keep both",
        path,
        who,
    )
