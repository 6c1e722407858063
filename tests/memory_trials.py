"""The memory tier under test: a training loop on simulated nodes, and the kill trials.

``memory_loop`` is one rank of a run: FSDP over gloo, AdamW, a dropout (each rank's RNG
draws), a snapshot to memory after every ``interval``-th step, each simulated node's memory
directory ``{root}/node{domain}`` (``failure_domain=ranks_per_node``). A run resumes with
``resume=True`` (memory first, then storage). Each rank appends ``'{rank} {step} {loss}'`` to
a report file as each step ends, so that a parent that kills the ranks knows how far they got.

``run_memory_trial`` (the slow suite's campaign) kills one rank, a whole node (its memory
directory removed too) or every rank at a random moment, restarts the run on the ranks that
are left, and compares what it resumes with the uninterrupted run's record.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.distributed import Ranks, run_distributed

WIDTH = 64


class Position:
    """The loop's step, saved in ``meta``."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def memory_config(root: str, ranks_per_node: int = 2, **kwargs: Any) -> dict[str, Any]:
    return dict(
        interval=1,
        replicas=1,
        dir=os.path.join(root, "node{domain}"),
        failure_domain=ranks_per_node,
        **kwargs,
    )


def memory_loop(
    root: str,
    steps: int,
    *,
    resume: bool = False,
    ranks_per_node: int = 2,
    report: str | None = None,
    memory: dict[str, Any] | None = None,
    save_at: tuple[int, ...] = (),
    delay: float = 0.0,
    die_in_recovery: int | None = None,
) -> dict[str, Any]:
    """One rank of a run (see the module docstring): the losses of the steps it ran by step,
    the step it started from, the tier it resumed from, and its final weights."""
    import torch
    from torch import nn

    from shardwise.strategies import FSDPStrategy

    strategy = FSDPStrategy(
        work_dir=os.path.join(root, "work"),
        state_dict_cfg="sharded",
        env_kwargs=dict(randomness=dict(seed=0)),
        memory_checkpoint=memory or memory_config(root, ranks_per_node),
    )
    torch.manual_seed(0)
    model, wrapper = strategy.prepare(
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Dropout(0.2), nn.Linear(WIDTH, 1)),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-2)),
    )
    if strategy.rank == die_in_recovery:  # this rank dies as it sends its first file
        from shardwise.checkpoint import memory as memory_module

        memory_module.torch_dist = _DyingSender(memory_module.torch_dist)
    position = Position()
    checkpointer = strategy.checkpointer
    checkpointer.register("loop", position, meta=True)
    resumed = checkpointer.load_or_resume(resume=resume)
    tier = "scratch"
    if resumed is not None:
        tier = "memory" if "memory_step" in resumed.get("meta", {}) else "storage"
    start = position.step
    fd = os.open(report, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if report else None
    losses = {}
    for step in range(start + 1, steps + 1):
        loss = model(torch.randn(8, WIDTH)).pow(2).mean()
        wrapper.update_params(loss)
        losses[step] = loss.item()
        position.step = step
        if step in save_at:
            strategy.save_checkpoint(f"iter_{step}")
        checkpointer.memory.snapshot(step, {})
        if fd is not None:
            os.write(fd, f"{strategy.rank} {step} {losses[step]!r}\n".encode())
        time.sleep(delay)
    checkpointer.memory.wait()
    weights = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return dict(start=start, tier=tier, losses=losses, weights=weights)


class _DyingSender:
    """``torch.distributed`` whose ``send`` kills the process (a peer lost mid-recovery)."""

    def __init__(self, dist: Any) -> None:
        self._dist = dist

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dist, name)

    def send(self, *args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------------- the kill trials
def killed_loop(root: str, steps: int, report: str) -> None:
    """A rank of a run that is killed: steps reported as they end, a little apart."""
    memory_loop(root, steps, report=report, delay=0.01)


@dataclass
class MemoryOutcome:
    seed: int
    kill: str  # 'rank', 'node' or 'all'
    after: int  # the kill came after this many reported steps (on rank 0)
    delay: float
    status: str = "ok"  # 'ok' or what was wrong
    reason: str = ""
    reported: int = 0  # the last step every rank reported
    resumed: int = -1  # the step the restart resumed from
    tier: str = ""
    ranks: int = 0  # the ranks the run finished on


def _reports(report: Path) -> dict[int, int]:
    last: dict[int, int] = {}
    if report.exists():
        for line in report.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                last[int(parts[0])] = max(last.get(int(parts[0]), 0), int(parts[1]))
    return last


def uninterrupted(root: Path, steps: int) -> list[dict[str, Any]]:
    return run_distributed(memory_loop, 4, str(root), steps, timeout=300)


def run_memory_trial(
    seed: int, root: Path, reference: list[dict[str, Any]], steps: int = 16
) -> MemoryOutcome:
    """Run 4 ranks on 2 simulated nodes, kill (one rank, a node and its memory, or all) after
    a random step at a random moment, then restart: on 4 ranks, or on the 2 ranks of the node
    left after a node loss (half the trials), and check what it resumes against
    ``reference`` (the uninterrupted 4-rank run's ranks)."""
    rng = random.Random(seed)
    kill = rng.choice(["rank", "node", "all"])
    outcome = MemoryOutcome(seed, kill, rng.randint(2, steps - 4), rng.uniform(0.0, 0.05))
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    report = root / "report"
    with Ranks(killed_loop, 4, str(root), steps, str(report)) as ranks:
        deadline = time.monotonic() + 120
        while _reports(report).get(0, 0) < outcome.after and time.monotonic() < deadline:
            if not all(ranks.alive()):
                outcome.status, outcome.reason = "crashed", "a rank died before the kill"
                return outcome
            time.sleep(0.002)
        time.sleep(outcome.delay)
        victims = {"rank": [rng.randrange(4)], "node": [2, 3], "all": [0, 1, 2, 3]}[kill]
        for victim in victims:
            os.kill(ranks.procs[victim].pid, signal.SIGKILL)
    # the survivors of a partial kill fail in their next collective; Ranks killed them all
    outcome.reported = min(_reports(report).get(r, 0) for r in range(4))
    if kill == "node":
        shutil.rmtree(root / "node1", ignore_errors=True)
    shrink = kill == "node" and rng.random() < 0.5
    world = 2 if shrink else 4
    outcome.ranks = world
    try:
        results = run_distributed(memory_loop, world, str(root), steps, resume=True, timeout=300)
    except Exception as exc:  # noqa: BLE001 - the trial's outcome
        outcome.status, outcome.reason = "failed", str(exc)[-2000:]
        return outcome
    start = results[0]["start"]
    outcome.resumed, outcome.tier = start, results[0]["tier"]
    if outcome.tier != "memory":
        outcome.status, outcome.reason = "storage", f"resumed from {outcome.tier}"
    elif start < outcome.reported - 1:  # interval 1: at most the step in flight is lost
        outcome.status = "behind"
        outcome.reason = f"resumed step {start}, every rank had reported {outcome.reported}"
    elif not shrink and any(
        results[r]["losses"][s] != reference[r]["losses"][s]
        for r in range(4)
        for s in results[r]["losses"]
    ):
        outcome.status, outcome.reason = "diverged", "losses differ from the uninterrupted run"
    elif not shrink and any(
        not (results[0]["weights"][k] == reference[0]["weights"][k]).all()
        for k in results[0]["weights"]
    ):
        outcome.status, outcome.reason = "diverged", "final weights differ"
    return outcome


def outcome_dict(outcome: MemoryOutcome) -> dict[str, Any]:
    return asdict(outcome)
