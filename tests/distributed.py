"""Test harness: run a function on N real processes over gloo, or a script under torchrun.

``run_distributed(fn, world_size, *args)`` starts ``world_size`` processes with the
environment torchrun would give them (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``; in the caller's working directory), calls ``fn(*args)`` in
each and returns the list of
return values, rank by rank. The process group is *not* initialised for ``fn`` unless
``init_pg=True``; any rank's exception is re-raised in the test with that rank's
traceback, and a run that outlives ``timeout`` seconds is killed and reported.
``fn`` must be a module-level function (it is pickled by reference).
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DistributedTestError(AssertionError):
    """One or more ranks failed or timed out; the message holds their tracebacks."""


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    # Every rank is forked from a server that has already imported what a rank imports
    # (torch's DTensor, DCP and dynamo modules take seconds to import on each rank).
    ctx.set_forkserver_preload(["torch", "torch.distributed", "shardwise.strategies"])
    return ctx


def _worker(fn, rank, world_size, port, init_pg, env, cwd, args, kwargs, results) -> None:
    faulthandler.enable()  # a rank that crashes (SIGSEGV, SIGABRT) prints its Python stack
    os.chdir(cwd)  # the test's working directory, not the fork server's
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        **env,
    )
    try:
        if init_pg:
            import torch.distributed as dist

            dist.init_process_group("gloo", rank=rank, world_size=world_size)
        # Plain pickle copies tensors into the message; the queue's own pickler would share
        # them through file descriptors that vanish when this process exits.
        value = pickle.dumps(fn(*args, **kwargs))
        results.put((rank, True, value))
    except BaseException:  # noqa: BLE001 - every failure is reported to the test
        results.put((rank, False, traceback.format_exc()))
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    init_pg: bool = False,
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` processes; return each rank's result."""
    ctx = _context()
    results = ctx.Queue()
    port, cwd = free_port(), os.getcwd()
    procs = [
        ctx.Process(
            target=_worker,
            args=(fn, rank, world_size, port, init_pg, env or {}, cwd, args, kwargs, results),
            name=f"rank{rank}",
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    outcomes: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outcomes) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, ok, value = results.get(timeout=min(remaining, 1.0))
                outcomes[rank] = (ok, value)
            except queue.Empty:
                dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                crashed = [p for p in dead if int(p.name[4:]) not in outcomes]
                if crashed and results.empty():
                    time.sleep(0.5)  # let a late result arrive before calling it a crash
                    if results.empty():
                        for p in crashed:
                            outcomes[int(p.name[4:])] = (
                                False,
                                f"process died with exit code {p.exitcode}",
                            )
                if any(not ok for ok, _ in outcomes.values()):
                    time.sleep(2.0)  # give the other ranks a moment to report their own error
                    while not results.empty():
                        rank, ok, value = results.get()
                        outcomes[rank] = (ok, value)
                    break
    finally:
        for proc in procs:
            proc.join(timeout=5 if len(outcomes) == world_size else 0.1)
            if proc.is_alive():
                proc.kill()
                proc.join()
    failures = {r: v for r, (ok, v) in outcomes.items() if not ok}
    missing = [r for r in range(world_size) if r not in outcomes]
    if failures or missing:
        parts = [f"--- rank {r} failed ---\n{tb}" for r, tb in sorted(failures.items())]
        if missing:
            parts.append(f"--- ranks {missing} gave no result within {timeout:.0f} s ---")
        raise DistributedTestError("\n".join(parts))
    return [pickle.loads(outcomes[r][1]) for r in range(world_size)]


class Ranks:
    """``fn(*args)`` started on ``world_size`` ranks as :func:`run_distributed` starts them,
    without waiting for them: for a test that kills them (a context manager: every rank is
    SIGKILLed and reaped on exit, whatever it was doing)."""

    def __init__(
        self, fn: Callable[..., Any], world_size: int, *args: Any, env: dict[str, str] | None = None
    ) -> None:
        ctx, port, cwd = _context(), free_port(), os.getcwd()
        self._results = ctx.Queue()
        self.procs = [
            ctx.Process(
                target=_worker,
                args=(fn, rank, world_size, port, False, env or {}, cwd, args, {}, self._results),
            )
            for rank in range(world_size)
        ]

    def alive(self) -> list[bool]:
        return [proc.is_alive() for proc in self.procs]

    def __enter__(self) -> Ranks:
        for proc in self.procs:
            proc.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for proc in self.procs:
            if proc.pid is not None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            proc.join(timeout=30)
        self._results.close()


def run_torchrun(
    script: str | Path,
    nproc: int,
    *script_args: str,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
    torchrun_args: Sequence[str] = (),
    check: bool = True,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` under ``python -m torch.distributed.run`` with ``nproc`` local ranks."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        *torchrun_args,
        str(script),
        *script_args,
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or REPO
    )
    if check and proc.returncode != 0:
        raise DistributedTestError(
            f"torchrun exited with {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}"
            f"\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc
