"""kill -9 during asynchronous sharded saves: is the checkpoint a restart resumes from ever more
than one behind the last save a rank reported?

A trial runs a loop on 2 gloo ranks (FSDPStrategy, sharded, ``max_keep_ckpts=3``): a training
step, then ``save_checkpoint(f'iter_{i}', async_save=True)``; as soon as the call returns each
rank appends ``'{rank} {i}'`` to a report file (an ``O_APPEND`` write: the parent reads it at
once). The parent waits until the ``k``-th save was reported (``k`` drawn from 2..5), waits a
random delay within one iteration, and SIGKILLs both ranks. Then, as a restarted job would:
the checkpoint the resume picks (:func:`~shardwise.checkpoint.find_last_checkpoint`) must
exist, verify against its manifest, load whole in one process, and be no more than one save
behind the last reported one: save ``i`` returns once save ``i - 1`` is committed (at most one
save is in flight, and a save's commit ends with every rank learning of it).

``tests/test_kill_campaign.py`` runs hundreds of trials in the slow suite;
``bench/kill_campaign.py --async-trials N`` reports the figures.
"""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.distributed import Ranks

WIDTH = 384  # ~0.6 MB of weights, ~1.8 MB of state with AdamW: saves of ~10-30 ms here


@dataclass
class AsyncOutcome:
    seed: int
    after: int  # the kill came after this many reported saves (on rank 0)
    delay: float
    status: str = "ok"  # 'ok', 'behind' (resumed more than one save back), 'corrupt', 'none'
    reason: str = ""
    reported: int = 0  # the last save any rank reported
    resumed: int | None = None  # the iteration of the checkpoint a resume picks
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def saving_loop(work_dir: str, report: str, iterations: int = 200) -> None:
    """A rank of the killed run (see the module docstring); never returns before the kill."""
    import torch
    from torch import nn

    from shardwise.strategies import FSDPStrategy

    strategy = FSDPStrategy(
        work_dir=work_dir, state_dict_cfg="sharded", env_kwargs=dict(randomness=dict(seed=0))
    )
    model, wrapper = strategy.prepare(
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1)),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)),
    )
    fd = os.open(report, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for i in range(1, iterations + 1):
        wrapper.update_params(model(torch.randn(8, WIDTH)).pow(2).mean())
        strategy.save_checkpoint(f"iter_{i}", async_save=True, max_keep_ckpts=3)
        os.write(fd, f"{strategy.rank} {i}\n".encode())
    strategy.wait_for_checkpoint()


def _reports(report: Path) -> list[tuple[int, int]]:
    try:
        text = report.read_text()
    except FileNotFoundError:
        return []
    return [(int(r), int(i)) for r, i in re.findall(r"^(\d+) (\d+)$", text, re.M)]


def run_async_trial(seed: int, root: Path, timeout: float = 120.0) -> AsyncOutcome:
    """One trial in the fresh folder ``root``, its random choices from ``seed``."""
    from shardwise.checkpoint import find_last_checkpoint
    from shardwise.checkpoint.sharded import load_sharded_checkpoint
    from shardwise.checkpoint.verify import verify_checkpoint

    rng = random.Random(seed)
    outcome = AsyncOutcome(seed, after=rng.randint(2, 5), delay=round(rng.uniform(0, 0.05), 4))
    start = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    work_dir, report = root / "work", root / "reports"
    with Ranks(saving_loop, 2, str(work_dir), str(report)) as ranks:
        deadline = time.monotonic() + timeout
        while sum(r == 0 for r, _ in _reports(report)) < outcome.after:
            if time.monotonic() > deadline or not all(ranks.alive()):
                outcome.status = "none"
                outcome.reason = f"no {outcome.after} saves reported (ranks alive: "
                outcome.reason += f"{ranks.alive()})"
                return outcome
            time.sleep(0.001)
        time.sleep(outcome.delay)  # then every rank is killed
    reports = _reports(report)
    outcome.reported = max(i for _, i in reports)
    latest = find_last_checkpoint(work_dir)
    if latest is None:
        outcome.status, outcome.reason = "corrupt", "no committed checkpoint to resume from"
        return outcome
    outcome.resumed = int(Path(latest).name.removeprefix("iter_"))
    verified = verify_checkpoint(latest)
    if not verified.ok:
        outcome.status = "corrupt"
        outcome.reason = f"{latest}: {'; '.join(map(str, verified.problems))}"
        return outcome
    try:
        load_sharded_checkpoint(latest)
    except Exception as exc:  # noqa: BLE001 - the trial reports it
        outcome.status, outcome.reason = "corrupt", f"{latest} does not load: {exc}"
        return outcome
    if outcome.resumed < outcome.reported - 1:
        outcome.status = "behind"
        outcome.reason = (
            f"resumes from iteration {outcome.resumed}, but save {outcome.reported} had "
            f"returned (reports: {reports[-6:]}; checkpoints: "
            f"{sorted(p.name for p in work_dir.iterdir())})"
        )
    outcome.seconds = round(time.monotonic() - start, 2)
    return outcome


def async_summary(outcomes: list[AsyncOutcome]) -> dict[str, Any]:
    statuses = [o.status for o in outcomes]
    return dict(
        trials=len(outcomes),
        **{s: statuses.count(s) for s in ("ok", "behind", "corrupt", "none")},
        behind_by=sorted({o.reported - (o.resumed or 0) for o in outcomes}),
    )
