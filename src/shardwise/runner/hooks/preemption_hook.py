"""PreemptionHook: a signal to any rank ends the run with a committed checkpoint.

Clusters warn a job before they kill it: SLURM sends a signal chosen with ``--signal``
(``SIGUSR1@120``: two minutes ahead), Kubernetes and torchrun send ``SIGTERM`` (torchrun
forwards it to its workers and kills them 30 s later). While the Runner trains, the hook's
handler only notes the signal; after each iteration the ranks agree whether any of them got
one (one all-reduce of a flag on a gloo group: no device synchronisation), and if so every
rank, at the same iteration:

1. waits for an asynchronous save in flight to be committed (a save in progress when the
   signal came is never interrupted: the handler does nothing else);
2. commits a synchronous checkpoint of this iteration (``iter_{n}.pth``; skipped when the
   ``CheckpointHook`` just saved it), which ``resume=True`` / ``--resume`` and
   ``--auto-resume`` pick up;
3. with ``requeue`` under SLURM, rank 0 runs ``scontrol requeue $SLURM_JOB_ID``;
4. raises :class:`Preempted`, a ``SystemExit`` with :data:`PREEMPTED_EXIT_CODE` (143).

A preempted run loses at most the iteration in progress when the signal came.

Example (a config; ``shardwise train --requeue`` sets the same)::

    preemption = dict(signals=['SIGTERM', 'SIGUSR1'], requeue=True)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from typing import Any

import torch
import torch.distributed as torch_dist

from shardwise import dist
from shardwise.checkpoint.storage import location
from shardwise.registry import HOOKS

from .hook import Hook

__all__ = ["PREEMPTED_EXIT_CODE", "Preempted", "PreemptionHook"]

#: The exit code of a preempted run: 128 + SIGTERM, as if the signal had ended it.
PREEMPTED_EXIT_CODE = 143


class Preempted(SystemExit):
    """Raised on every rank once the preemption checkpoint is committed; uncaught, the
    process exits with :data:`PREEMPTED_EXIT_CODE`."""

    def __init__(self, checkpoint: str, signal_name: str) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.checkpoint, self.signal_name = checkpoint, signal_name


def _parse_signals(signals: Any) -> tuple[signal.Signals, ...]:
    names = [signals] if isinstance(signals, str) else list(signals or ())
    parsed = []
    for name in names:
        key = str(name).upper()
        key = key if key.startswith("SIG") else f"SIG{key}"
        if not hasattr(signal.Signals, key) or key in ("SIGKILL", "SIGSTOP"):
            raise ValueError(
                f"preemption signals holds {name!r}, which is not a signal that can be caught; "
                "e.g. preemption=dict(signals=['SIGTERM', 'SIGUSR1'])"
            )
        parsed.append(signal.Signals[key])
    return tuple(parsed)


@HOOKS.register_module()
class PreemptionHook(Hook):
    """Turn a preemption signal into a committed checkpoint and a clean exit (see the module
    docstring).

    Args:
        signals: the signals that mean "about to be killed" (names or numbers).
        requeue: under SLURM, requeue the job (``scontrol requeue``) after the checkpoint;
            a warning where ``scontrol`` or ``SLURM_JOB_ID`` is missing.
        filename_tmpl: the checkpoint's name, given the number of iterations done.
    """

    priority = "LOWEST"  # after the iteration's logging and periodic checkpoint

    def __init__(
        self,
        signals: Any = ("SIGTERM", "SIGUSR1"),
        requeue: bool = False,
        filename_tmpl: str = "iter_{}.pth",
    ) -> None:
        if not isinstance(requeue, bool):
            raise TypeError(f"preemption requeue must be True or False, got {requeue!r}")
        self.signals = _parse_signals(signals)
        self.requeue = requeue
        self.filename_tmpl = filename_tmpl
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._group: Any = None

    # ------------------------------------------------------------------ handlers
    def _note(self, signum: int, frame: Any) -> None:
        self.received = self.received or signal.Signals(signum)

    def before_train(self, runner) -> None:
        if threading.current_thread() is not threading.main_thread():
            runner.logger.info(
                "PreemptionHook: training runs outside the main thread (e.g. in a Ray worker), "
                "where signal handlers cannot be installed; preemption is left to the caller"
            )
            return
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._note)
        if dist.is_distributed() and torch_dist.get_world_size() > 1:
            cpu = torch_dist.get_backend() == "gloo"
            self._group = None if cpu else torch_dist.new_group(backend="gloo")

    def after_train(self, runner) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    # ------------------------------------------------------------------ the decision
    def _agreed_signal(self) -> int:
        """The signal some rank received (0: none), the same on every rank."""
        flag = torch.tensor([int(self.received or 0)], dtype=torch.int64)
        if dist.is_distributed() and torch_dist.get_world_size() > 1:
            torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MAX, group=self._group)
        return int(flag.item())

    def after_train_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        if not self._previous:
            return
        signum = self._agreed_signal()
        if not signum:
            return
        name = signal.Signals(signum).name
        done = runner.iter + 1
        path = str(location(runner.work_dir) / self.filename_tmpl.format(done))
        runner.logger.warning(
            "%s received: saving a checkpoint at iteration %d and stopping", name, done
        )
        runner.strategy.wait_for_checkpoint()
        if runner.message_hub.get_info("last_ckpt") != path:
            runner.save_checkpoint(path, by_epoch=False, async_save=False, series="preemption")
            runner.message_hub.update_info("last_ckpt", path)
        runner.logger.warning("Committed %s; exiting with code %d", path, PREEMPTED_EXIT_CODE)
        if self.requeue and dist.get_rank() == 0:
            _requeue(runner.logger)
        self._restore()
        raise Preempted(path, name)


def _requeue(logger: Any) -> None:
    job = os.environ.get("SLURM_JOB_ID")
    scontrol = shutil.which("scontrol")
    if job is None or scontrol is None:
        logger.warning(
            "requeue asked, but %s; the job is not requeued",
            "SLURM_JOB_ID is not set (not a SLURM job)" if job is None else "scontrol is absent",
        )
        return
    result = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True)
    if result.returncode:
        logger.warning("scontrol requeue %s failed: %s", job, result.stderr.strip())
    else:
        logger.warning("Requeued SLURM job %s", job)
