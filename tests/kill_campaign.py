"""A kill -9 campaign against the checkpoint engine, as a cluster would run it: a real
``shardwise train`` (one process, or two ranks under torchrun) saving a checkpoint after
every iteration is killed at a random moment — every process of the run, by pid (torchrun
starts its workers in sessions of their own, so killing a process group would leave them
running) — then resumed with ``--resume`` as a restarted job would be.

A trial is *corrupt* when, after the kill, the checkpoint a resume picks (or any committed
checkpoint) fails verification against its manifest, or the resume does not continue from
that checkpoint's iteration to the end, or the final checkpoint does not verify; it *hangs*
when a process of the killed run survives or the resume does not finish in time.

``tests/test_kill_campaign.py`` runs a few trials in CI; ``bench/kill_campaign.py`` runs the
whole campaign and writes its figures to ``bench/RESULTS.md``.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MAX_ITERS = 60
RESUME_TIMEOUT = 240.0

CONFIG = """
custom_imports = dict(imports=["tests.test_runner_support"])
model = dict(type="DropoutRegressor", width={width})
strategy = dict(type="FSDPStrategy", state_dict_cfg="{fmt}", async_save={async_save})
train_dataloader = dict(dataset=dict(type="RegressionData", n=64), batch_size=8)
optim_wrapper = dict(optimizer=dict(type="AdamW", lr=0.001))
param_scheduler = [dict(type="LinearLR", start_factor=0.5, by_epoch=False, end=8)]
train_cfg = dict(by_epoch=False, max_iters={max_iters})
default_hooks = dict(
    logger=dict(interval=4),
    checkpoint=dict(by_epoch=False, interval=1, max_keep_ckpts=3),
)
randomness = dict(seed=0)
"""


@dataclass(frozen=True)
class Trial:
    mode: str  # 'sync' or 'async'
    fmt: str  # 'full' or 'sharded'
    ranks: int  # 1 or 2
    delay: float  # seconds after the first commit at which every process is killed


@dataclass
class Outcome:
    trial: Trial
    status: str = "ok"  # 'ok', 'corrupt' or 'hang'
    reason: str = ""
    killed: int = 0  # processes killed
    mid_save: bool = False  # a save was in progress (its staging path was there)
    resumed_from: int | None = None  # the iteration the resume continued from
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "trial": asdict(self.trial)}


def plan(n: int, seed: int = 20261125, max_delay: float = 1.5) -> list[Trial]:
    """``n`` trials cycling over sync/async x full/sharded x 1/2 ranks, each killed at a delay
    drawn uniformly in ``[0, max_delay)`` seconds after the run's first commit."""
    rng = random.Random(seed)
    kinds = itertools.cycle(itertools.product(("sync", "async"), ("full", "sharded"), (1, 2)))
    return [Trial(*next(kinds), round(rng.uniform(0, max_delay), 3)) for _ in range(n)]


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for name in ("STOP_AT", "CRASH_AT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR"):
        env.pop(name, None)
    return env


def _command(config: Path, work_dir: Path, ranks: int, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "shardwise.cli", "train", str(config)]
    cmd += ["--work-dir", str(work_dir), "--nproc-per-node", str(ranks), *extra]
    return cmd


def _children() -> dict[int, list[int]]:
    """Every process's children, from ``/proc`` (parent pid -> child pids)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, whatever session or group they are in."""
    tree, found, todo = _children(), [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += tree.get(current, [])
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_run(proc: subprocess.Popen) -> int:
    """SIGKILL the run's every process (workers first, found again until none is left);
    returns how many were killed."""
    killed: set[int] = set()
    for _ in range(20):
        pids = [p for p in descendants(proc.pid) if _alive(p) and p not in killed]
        if not pids:
            break
        for pid in reversed(pids):  # the deepest first: a launcher cannot restart them
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
    proc.wait(timeout=30)
    return len(killed)


def _first_commit(work_dir: Path, proc: subprocess.Popen, timeout: float = 180) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (work_dir / "last_checkpoint").exists():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    return False


def _verify_all(work_dir: Path) -> list[str]:
    """Problems of every committed checkpoint in ``work_dir`` and of the one a resume picks."""
    from shardwise.checkpoint import find_last_checkpoint
    from shardwise.checkpoint.latest import committed_checkpoints
    from shardwise.checkpoint.verify import verify_checkpoint

    problems = []
    latest = find_last_checkpoint(work_dir)
    paths = committed_checkpoints(work_dir) + ([Path(latest)] if latest else [])
    for path in dict.fromkeys(paths):
        report = verify_checkpoint(path)
        if not report.ok:
            problems.append(f"{path.name}: {'; '.join(map(str, report.problems))}")
    return problems


def run_trial(trial: Trial, root: Path, width: int = 200_000) -> Outcome:
    """One trial in the fresh folder ``root`` (see the module docstring)."""
    from shardwise.checkpoint import find_last_checkpoint

    outcome = Outcome(trial)
    start = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    config = root / "run.py"
    config.write_text(
        CONFIG.format(
            width=width, fmt=trial.fmt, async_save=trial.mode == "async", max_iters=MAX_ITERS
        )
    )
    work_dir = root / "work"
    log = open(root / "killed_run.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        _command(config, work_dir, trial.ranks),
        cwd=REPO,
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        committed = _first_commit(work_dir, proc)
        if committed:
            time.sleep(trial.delay)
        if proc.poll() is not None:
            outcome.notes.append(f"the run ended (exit {proc.returncode}) before the kill")
        elif not committed:
            outcome.notes.append("killed before any commit")
        outcome.killed = kill_run(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    time.sleep(0.2)
    survivors = [p for p in descendants(proc.pid) if p != proc.pid and _alive(p)]
    if survivors:
        outcome.status, outcome.reason = "hang", f"processes {survivors} survived the kill"
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        return outcome
    outcome.mid_save = any(p.name.endswith(".partial") for p in work_dir.glob(".*"))
    problems = _verify_all(work_dir)
    if problems:
        outcome.status, outcome.reason = "corrupt", f"after the kill: {problems}"
        return outcome
    latest = find_last_checkpoint(work_dir)
    expected = _iteration(latest) if latest else 0
    try:
        resumed = subprocess.run(
            _command(config, work_dir, trial.ranks, "--resume"),
            cwd=REPO,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=RESUME_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        outcome.status, outcome.reason = "hang", f"the resume ran past {RESUME_TIMEOUT:.0f} s"
        return outcome
    (root / "resume.log").write_text(resumed.stdout + resumed.stderr)
    text = resumed.stdout + resumed.stderr
    continued = re.search(r"Continuing at epoch \d+, iteration (\d+)", text)
    outcome.resumed_from = int(continued.group(1)) if continued else 0
    final = work_dir / f"iter_{MAX_ITERS}.pth"
    damaged = _verify_all(work_dir) if final.exists() else [f"{final.name} is missing"]
    if resumed.returncode != 0:
        outcome.status = "corrupt"
        outcome.reason = f"the resume exited {resumed.returncode}: {text.strip()[-400:]}"
    elif outcome.resumed_from != expected:
        outcome.status = "corrupt"
        outcome.reason = f"resumed at iteration {outcome.resumed_from}, expected {expected}"
    elif damaged:
        outcome.status = "corrupt"
        outcome.reason = f"the final checkpoint is missing or damaged: {damaged}"
    outcome.seconds = round(time.monotonic() - start, 1)
    return outcome


def _iteration(path: str) -> int:
    match = re.search(r"iter_(\d+)", Path(path).name)
    return int(match.group(1)) if match else -1


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """Counts by status and by kind of trial."""
    by_kind: dict[str, dict[str, int]] = {}
    for o in outcomes:
        kind = f"{o.trial.mode} {o.trial.fmt} {o.trial.ranks} rank(s)"
        row = by_kind.setdefault(kind, {"trials": 0, "ok": 0, "corrupt": 0, "hang": 0, "mid": 0})
        row["trials"] += 1
        row[o.status] += 1
        row["mid"] += o.mid_save
    return dict(
        trials=len(outcomes),
        ok=sum(o.status == "ok" for o in outcomes),
        corrupt=sum(o.status == "corrupt" for o in outcomes),
        hang=sum(o.status == "hang" for o in outcomes),
        mid_save=sum(o.mid_save for o in outcomes),
        by_kind=by_kind,
    )
