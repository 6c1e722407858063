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

Ctrl-C (SIGINT) takes the same path, as users expect of a trainer: the ranks finish the
step, commit ``iter_{n}.pth`` when the run saves checkpoints (a ``CheckpointHook`` with an
``interval`` or ``save_last``), and raise :class:`Interrupted` (exit code 130,
:data:`INTERRUPTED_EXIT_CODE`), with one line on rank 0 that names the checkpoint, or the
last one and the work lost since. A second Ctrl-C (or the SIGTERM that torchrun's agent sends
after it) stops the process at once, with one line and no checkpoint.

Example (a config; ``shardwise train --requeue`` sets the same)::

    preemption = dict(signals=['SIGTERM', 'SIGUSR1'], requeue=True)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from typing import Any

import torch
import torch.distributed as torch_dist

from shardwise import dist
from shardwise.checkpoint import find_last_checkpoint
from shardwise.checkpoint.storage import location
from shardwise.registry import HOOKS

from .hook import Hook

__all__ = [
    "INTERRUPTED_EXIT_CODE",
    "Interrupted",
    "PREEMPTED_EXIT_CODE",
    "Preempted",
    "PreemptionHook",
]

#: The exit code of a preempted run: 128 + SIGTERM, as if the signal had ended it.
PREEMPTED_EXIT_CODE = 143
#: The exit code of a run stopped by Ctrl-C: 128 + SIGINT, as a shell reports it.
INTERRUPTED_EXIT_CODE = 130


class Preempted(SystemExit):
    """Raised on every rank once the preemption checkpoint is committed; uncaught, the
    process exits with :data:`PREEMPTED_EXIT_CODE`."""

    def __init__(self, checkpoint: str, signal_name: str) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.checkpoint, self.signal_name = checkpoint, signal_name


class Interrupted(SystemExit):
    """Raised on every rank after Ctrl-C, once the step is finished (and its checkpoint
    committed where the run saves checkpoints: ``checkpoint``, else None); uncaught, the
    process exits with :data:`INTERRUPTED_EXIT_CODE`."""

    def __init__(self, checkpoint: str | None) -> None:
        super().__init__(INTERRUPTED_EXIT_CODE)
        self.checkpoint = checkpoint


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
        interrupt: handle Ctrl-C (SIGINT) as the module docstring says; False leaves it to
            Python (a ``KeyboardInterrupt`` wherever it comes).
    """

    priority = "LOWEST"  # after the iteration's logging and periodic checkpoint

    def __init__(
        self,
        signals: Any = ("SIGTERM", "SIGUSR1"),
        requeue: bool = False,
        filename_tmpl: str = "iter_{}.pth",
        interrupt: bool = True,
    ) -> None:
        if not isinstance(requeue, bool):
            raise TypeError(f"preemption requeue must be True or False, got {requeue!r}")
        if not isinstance(interrupt, bool):
            raise TypeError(f"preemption interrupt must be True or False, got {interrupt!r}")
        self.signals = _parse_signals(signals)
        self.requeue = requeue
        self.filename_tmpl = filename_tmpl
        self.interrupt = interrupt and signal.SIGINT not in self.signals
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._group: Any = None
        self._hub: Any = None

    # ------------------------------------------------------------------ handlers
    def _note(self, signum: int, frame: Any) -> None:
        if self.received is signal.SIGINT:  # after Ctrl-C (torchrun's agent: SIGTERM next)
            self._stop_now()
        self.received = self.received or signal.Signals(signum)

    def _note_interrupt(self, signum: int, frame: Any) -> None:
        if self.received is not None:  # Ctrl-C again
            self._stop_now()
        self.received = signal.SIGINT

    def _stop_now(self) -> None:
        """Exit at once (a second Ctrl-C), with one line from rank 0."""
        if dist.get_rank() == 0:
            last = self._hub.get_info("last_ckpt") if self._hub is not None else None
            since = f"since {last}" if last else "of this run"
            line = (
                "Interrupted again (Ctrl-C): stopping at once, without a checkpoint; the work "
                f"{since} is lost; exit code {INTERRUPTED_EXIT_CODE}\n"
            )
            os.write(sys.stderr.fileno(), line.encode())
        os._exit(INTERRUPTED_EXIT_CODE)

    def before_train(self, runner) -> None:
        self.received = None
        if threading.current_thread() is not threading.main_thread():
            runner.logger.info(
                "PreemptionHook: training runs outside the main thread (e.g. in a Ray worker), "
                "where signal handlers cannot be installed; preemption is left to the caller"
            )
            return
        self._hub = runner.message_hub
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._note)
        if self.interrupt:
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._note_interrupt)
        if dist.is_distributed() and torch_dist.get_world_size() > 1:
            cpu = torch_dist.get_backend() == "gloo"
            self._group = None if cpu else torch_dist.new_group(backend="gloo")

    def after_train(self, runner) -> None:
        self._restore()

    def close(self) -> None:
        """After a failure: give the signals back to their previous handlers."""
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
        if signum == signal.SIGINT:  # the lowest number: any preemption signal wins
            self._stop_interrupted(runner)
        name = signal.Signals(signum).name
        done = runner.iter + 1
        runner.logger.warning(
            "%s received: saving a checkpoint at iteration %d and stopping", name, done
        )
        path = self._commit(runner)
        runner.logger.warning("Committed %s; exiting with code %d", path, PREEMPTED_EXIT_CODE)
        if self.requeue and dist.get_rank() == 0:
            _requeue(runner.logger)
        self._restore()
        raise Preempted(path, name)

    def _commit(self, runner) -> str:
        """Commit a checkpoint of this iteration (unless the checkpoint hook just did); its
        path."""
        path = str(location(runner.work_dir) / self.filename_tmpl.format(runner.iter + 1))
        runner.strategy.wait_for_checkpoint()
        if runner.message_hub.get_info("last_ckpt") != path:
            runner.save_checkpoint(path, by_epoch=False, async_save=False, series="preemption")
            runner.message_hub.update_info("last_ckpt", path)
        return path

    def _stop_interrupted(self, runner) -> None:
        """After Ctrl-C: the checkpoint where the run saves them, one line, :class:`Interrupted`."""
        done = runner.iter + 1
        if _saves_checkpoints(runner):
            path: str | None = self._commit(runner)
            outcome = f"committed {path} (--resume continues from it)"
        else:
            path = None
            runner.strategy.wait_for_checkpoint()
            last = runner.message_hub.get_info("last_ckpt") or find_last_checkpoint(
                str(runner.work_dir)
            )
            since = f"since {last}" if last else "of this run"
            outcome = f"no checkpoint is saved (default_hooks.checkpoint): the work {since} is lost"
        runner.logger.warning(
            "Interrupted (Ctrl-C) after iteration %d: %s; exiting with code %d",
            done,
            outcome,
            INTERRUPTED_EXIT_CODE,
        )
        self._restore()
        raise Interrupted(path)


def _saves_checkpoints(runner) -> bool:
    """Whether the run saves checkpoints: a checkpoint hook (shardwise's or mmengine's) with an
    ``interval`` or ``save_last``."""
    for hook in getattr(runner, "hooks", ()):
        if type(hook).__name__ == "CheckpointHook":
            interval = getattr(hook, "interval", -1)
            if (isinstance(interval, int) and interval > 0) or getattr(hook, "save_last", False):
                return True
    return False


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
