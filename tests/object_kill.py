"""kill -9 of every rank at random points of saves to an S3 server: is a half checkpoint ever
loaded, and is the last committed one always the one resumed?

A *chain* of trials shares one prefix on the server (``s3://bucket/chain-{format}``). Each
trial starts 2 gloo ranks (FSDPStrategy, the chain's format, ``max_keep_ckpts=3``) that:

1. resume from the newest committed checkpoint of the prefix (``load_or_resume(resume=True)``;
   the first trial starts from scratch), check that every weight holds the iteration the
   checkpoint records (weights are set to ``float(i)`` before save ``i``: a checkpoint mixing
   two saves' shards fails this on some rank), and report ``'{rank} resumed {i} {ok}'``;
2. loop: an optimizer step, weights set to ``i``, ``save_checkpoint(f'iter_{i}')``, alternately
   synchronous and asynchronous, then report ``'{rank} {i}'`` as soon as the call returns.

The parent waits for 1 to 3 more saves (drawn), then a random delay within a save, and SIGKILLs
both ranks. Then, as a restarted job would: the checkpoint the resume picks
(:func:`~shardwise.checkpoint.find_last_checkpoint` on the URL) must exist, verify against
its manifest (``ckpt verify``'s checks, on a local copy), hold weights equal to its iteration,
be no more than one save behind the last reported one and at most one ahead (a save can
commit before its report); the next trial must report resuming from exactly it. A marker
(``.iter_N.partial``) left in the prefix counts the kills that landed inside a save.

``tests/test_object_storage_slow.py`` runs >= 50 trials; ``bench/object_storage.py
--kill-trials N`` reports the figures.
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

WIDTH = 512  # ~1 MB of weights, ~3 MB of state with AdamW


@dataclass
class KillOutcome:
    trial: int
    fmt: str
    after: int  # the kill came after this many more reported saves (on rank 0)
    delay: float
    status: str = "ok"  # 'ok', 'corrupt' (a bad checkpoint or resume), 'behind', 'none'
    reason: str = ""
    reported: int = 0  # the last save a rank reported
    latest: int | None = None  # the iteration of the checkpoint a resume picks
    resumed: int | None = None  # what this trial's ranks resumed from (the previous kill's)
    mid_save: bool = False  # the kill left a save's marker: it landed inside a save
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def saving_loop(work_dir: str, fmt: str, report: str, iterations: int = 10_000) -> None:
    """A rank of a trial (see the module docstring); never returns before the kill."""
    import torch
    from torch import nn

    from shardwise.strategies import FSDPStrategy

    strategy = FSDPStrategy(
        work_dir=work_dir, state_dict_cfg=fmt, env_kwargs=dict(randomness=dict(seed=0))
    )
    model, wrapper = strategy.prepare(
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1)),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)),
    )
    fd = os.open(report, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    checkpoint = strategy.load_or_resume(resume=True)
    start = int(checkpoint["meta"]["iter"]) if checkpoint is not None else 0
    uniform = all(bool((p.full_tensor() == start).all()) for p in model.parameters())
    ok = "ok" if checkpoint is None or uniform else "BAD"
    os.write(fd, f"{strategy.rank} resumed {start} {ok}\n".encode())
    for i in range(start + 1, start + iterations):
        wrapper.update_params(model(torch.randn(8, WIDTH)).pow(2).mean())
        strategy.wait_for_staging()
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(i))
        strategy.save_checkpoint(
            f"iter_{i}.pth",
            async_save=i % 2 == 0,
            max_keep_ckpts=3,
            extra_ckpt=dict(meta=dict(iter=i)),
        )
        os.write(fd, f"{strategy.rank} {i}\n".encode())


def _reports(report: Path) -> tuple[list[tuple[int, int]], list[tuple[int, int, str]]]:
    try:
        text = report.read_text()
    except FileNotFoundError:
        return [], []
    saves = [(int(r), int(i)) for r, i in re.findall(r"^(\d+) (\d+)$", text, re.M)]
    resumed = [
        (int(r), int(i), ok) for r, i, ok in re.findall(r"^(\d+) resumed (\d+) (\w+)$", text, re.M)
    ]
    return saves, resumed


def _iteration(url: str) -> int:
    return int(re.search(r"iter_(\d+)", url.rsplit("/", 1)[-1]).group(1))


def check_latest(prefix: str) -> tuple[int | None, str]:
    """The iteration of the checkpoint a resume of ``prefix`` picks, and what is wrong with
    it ('' when nothing): it must verify against its manifest and hold weights equal to its
    iteration, whole."""
    import torch

    from shardwise.checkpoint import find_last_checkpoint
    from shardwise.checkpoint.formats import read_checkpoint
    from shardwise.checkpoint.remote_read import local_checkpoint
    from shardwise.checkpoint.verify import verify_checkpoint

    latest = find_last_checkpoint(prefix)
    if latest is None:
        return None, ""
    iteration = _iteration(latest)
    with local_checkpoint(latest) as local:
        report = verify_checkpoint(local)
        if not report.ok:
            return iteration, f"{latest}: {'; '.join(map(str, report.problems))}"
        try:
            state = read_checkpoint(local)
        except Exception as exc:  # noqa: BLE001 - the trial reports it
            return iteration, f"{latest} does not load: {exc}"
    weights = state["state_dict"]
    if state["meta"].get("iter") != iteration or not all(
        bool((t == iteration).all()) for t in weights.values() if isinstance(t, torch.Tensor)
    ):
        return iteration, f"{latest} holds weights of another save than iteration {iteration}"
    return iteration, ""


def run_trial(
    trial: int,
    fmt: str,
    prefix: str,
    root: Path,
    env: dict[str, str],
    expected: int | None,
    timeout: float = 120.0,
) -> KillOutcome:
    """One trial of a chain: start 2 ranks on ``prefix``, kill them, check what is left.
    ``expected``: the iteration the previous trial left as the newest committed checkpoint
    (None for the first)."""
    from shardwise.checkpoint.storage import list_objects

    rng = random.Random(f"{fmt}-{trial}")
    outcome = KillOutcome(trial, fmt, after=rng.randint(1, 3), delay=round(rng.uniform(0, 0.4), 3))
    start = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    report = root / "reports"
    with Ranks(saving_loop, 2, prefix, fmt, str(report), env=env) as ranks:
        deadline = time.monotonic() + timeout
        while True:
            saves, resumed = _reports(report)
            if len(resumed) == 2 and sum(r == 0 for r, _ in saves) >= outcome.after:
                break
            if time.monotonic() > deadline or not all(ranks.alive()):
                outcome.status = "none"
                outcome.reason = f"no {outcome.after} saves reported (ranks alive: "
                outcome.reason += f"{ranks.alive()}; reports: {saves[-4:]})"
                return outcome
            time.sleep(0.002)
        time.sleep(outcome.delay)  # then every rank is killed
    saves, resumed = _reports(report)
    outcome.resumed = resumed[0][1]
    if any(ok != "ok" for _, _, ok in resumed) or {i for _, i, _ in resumed} != {expected or 0}:
        outcome.status = "corrupt"
        outcome.reason = f"resumed {resumed}, expected iteration {expected or 0}, uniform"
        return outcome
    outcome.reported = max(i for _, i in saves)
    outcome.mid_save = any(
        name.startswith(".iter_") and name.endswith(".partial") for name in list_objects(prefix)
    )
    outcome.latest, problem = check_latest(prefix)
    if problem or outcome.latest is None:
        outcome.status = "corrupt"
        outcome.reason = problem or "no committed checkpoint to resume from"
    elif not outcome.reported - 1 <= outcome.latest <= outcome.reported + 1:
        outcome.status = "behind"
        outcome.reason = f"resumes from {outcome.latest}, but save {outcome.reported} returned"
    outcome.seconds = round(time.monotonic() - start, 2)
    return outcome


def run_chain(
    fmt: str, trials: int, bucket: str, root: Path, env: dict[str, str], first: int = 0
) -> list[KillOutcome]:
    """``trials`` trials on one prefix, each resuming what the previous kill left."""
    prefix = f"{bucket}/chain-{fmt}"
    outcomes: list[KillOutcome] = []
    expected = None
    for trial in range(first, first + trials):
        outcome = run_trial(trial, fmt, prefix, root / f"{fmt}-{trial}", env, expected)
        outcomes.append(outcome)
        if outcome.status != "ok":
            break
        expected = outcome.latest
    return outcomes


def kill_summary(outcomes: list[KillOutcome]) -> dict[str, Any]:
    statuses = [o.status for o in outcomes]
    return dict(
        trials=len(outcomes),
        **{s: statuses.count(s) for s in ("ok", "corrupt", "behind", "none")},
        mid_save=sum(o.mid_save for o in outcomes),
        latest_minus_reported=sorted(
            {o.latest - o.reported for o in outcomes if o.latest is not None}
        ),
        seconds_per_trial=round(sum(o.seconds for o in outcomes) / max(1, len(outcomes)), 2),
    )
