"""Preemption: SIGTERM or SIGUSR1 to any rank ends the run with a committed checkpoint of the
iteration in progress and exit code 143; ``--resume`` continues it bit for bit.

The end-to-end case runs a real ``shardwise train`` on 2 ranks under torchrun and signals one
worker process mid-epoch, as SLURM's ``--signal`` or a Kubernetes eviction would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardwise.checkpoint import find_last_checkpoint
from shardwise.checkpoint.manifest import is_committed
from shardwise.runner import PREEMPTED_EXIT_CODE, Hook, Preempted, PreemptionHook, Runner

REPO = Path(__file__).resolve().parents[1]

CONFIG = """
custom_imports = dict(imports=["tests.test_runner_support"])
model = dict(type="DropoutRegressor", width=16)
strategy = dict(type="{strategy}")
train_dataloader = dict(dataset=dict(type="RegressionData", n=64), batch_size=4)
optim_wrapper = dict(optimizer=dict(type="AdamW", lr=0.01))
train_cfg = dict(by_epoch=True, max_epochs=2)
default_hooks = dict(logger=dict(interval=4), checkpoint=dict(interval=1))
custom_hooks = [dict(type="RecordLossHook", seconds={seconds})]
randomness = dict(seed=0)
"""


def _config(tmp_path: Path, strategy: str, seconds: float) -> Path:
    path = tmp_path / "cfg.py"
    path.write_text(CONFIG.format(strategy=strategy, seconds=seconds))
    return path


def _train(config: Path, work_dir: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "shardwise.cli", "train", str(config), "--work-dir"]
    return subprocess.Popen(
        [*cmd, str(work_dir), *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _losses(work_dir: Path) -> dict[int, str]:
    lines = (work_dir / "losses.jsonl").read_text().splitlines()
    return {entry["iter"]: entry["loss"] for entry in map(json.loads, lines)}


def _wait_for_iteration(work_dir: Path, rank: int, at_least: int, proc) -> None:
    marker = work_dir / f"iter_rank{rank}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if marker.is_file() and int(marker.read_text() or 0) >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} did not reach iteration {at_least}: {proc.poll()}")


TWO_RANKS = ("--nproc-per-node", "2")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, str]:
    """The losses of the run that nothing interrupts."""
    tmp_path = tmp_path_factory.mktemp("whole")
    run = _train(_config(tmp_path, "DDPStrategy", seconds=0.15), tmp_path / "work", *TWO_RANKS)
    out, _ = run.communicate(timeout=300)
    assert run.returncode == 0, out
    losses = _losses(tmp_path / "work")
    assert sorted(losses) == list(range(1, 17))  # 2 epochs of 8 iterations
    return losses


@pytest.mark.slow
@pytest.mark.parametrize(
    "target, signum",
    [("rank 1", signal.SIGTERM), ("rank 1", signal.SIGUSR1), ("launcher", signal.SIGTERM)],
)
def test_a_signal_to_one_rank_or_the_launcher_commits_a_checkpoint_and_resume_is_exact(
    tmp_path, target, signum, uninterrupted
):
    config = _config(tmp_path, "DDPStrategy", seconds=0.15)
    preempted = tmp_path / "preempted"
    run = _train(config, preempted, *TWO_RANKS)
    _wait_for_iteration(preempted, 1, 3, run)  # mid-epoch 1
    # torchrun forwards a signal it gets to every worker (and kills them 30 s later)
    pid = run.pid if target == "launcher" else int((preempted / "pid_rank1").read_text())
    os.kill(pid, signum)
    out, _ = run.communicate(timeout=120)
    assert run.returncode != 0, out  # torchrun reports the workers' exit code 143
    assert f"exiting with code {PREEMPTED_EXIT_CODE}" in out, out
    assert f"{signal.Signals(signum).name} received" in out
    saved = find_last_checkpoint(str(preempted))
    assert saved is not None and is_committed(saved)
    stopped_at = max(_losses(preempted))
    assert Path(saved).name == f"iter_{stopped_at}.pth"  # the iteration in progress, kept
    assert 3 <= stopped_at < 8

    resumed = _train(config, preempted, *TWO_RANKS, "--resume")
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert _losses(preempted) == uninterrupted  # every iteration once, bit for bit


def test_a_signal_in_one_process_stops_after_the_iteration_with_a_checkpoint(tmp_path):
    from tests.test_runner_support import DropoutRegressor, RegressionData

    class Sender(Hook):
        priority = "LOW"  # before the preemption hook of the same iteration

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if runner.iter + 1 == 3:
                os.kill(os.getpid(), signal.SIGUSR1)

    runner = Runner(
        model=DropoutRegressor(),
        work_dir=str(tmp_path),
        train_dataloader=dict(dataset=RegressionData(n=32), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=True, max_epochs=3),
        default_hooks=dict(checkpoint=dict(interval=1)),
        custom_hooks=[Sender()],
    )
    previous = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(Preempted) as info:
        runner.train()
    assert info.value.code == PREEMPTED_EXIT_CODE and info.value.signal_name == "SIGUSR1"
    assert info.value.checkpoint == str(tmp_path / "iter_3.pth")
    assert is_committed(tmp_path / "iter_3.pth")
    assert signal.getsignal(signal.SIGUSR1) is previous  # the handlers are given back
    assert runner.iter == 2  # the third iteration ran to its end, no fourth began


def test_bad_preemption_settings_are_refused():
    with pytest.raises(ValueError, match="'SIGKILL', which is not a signal that can be caught"):
        PreemptionHook(signals=["SIGKILL"])
    with pytest.raises(ValueError, match="'SIGNOPE'"):
        PreemptionHook(signals="SIGNOPE")
    with pytest.raises(TypeError, match="requeue must be True or False"):
        PreemptionHook(requeue="yes")
    assert PreemptionHook(signals=["term", "USR1"]).signals == (signal.SIGTERM, signal.SIGUSR1)
    import tests.test_runner_support  # noqa: F401 - registers DropoutRegressor
    from shardwise.runner.checks import check_config

    cfg = dict(model=dict(type="DropoutRegressor"))
    for preemption, message in (
        (dict(signals=["SIGKILL"]), "default_hooks.preemption: preemption signals holds"),
        ("yes", "preemption must be a dict such as"),
        (dict(requeue=1), "requeue must be True or False"),
    ):
        with pytest.raises((TypeError, ValueError), match=message):
            check_config({**cfg, "preemption": preemption})
