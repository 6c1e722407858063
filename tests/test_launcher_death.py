"""The workers of ``shardwise train`` die with it: torchrun starts them in sessions of their
own (``setsid``), so a launcher killed with SIGKILL (an OOM killer, ``kill -9``, a lost
terminal) would leave them training and saving into the work dir of the next run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed import REPO

CONFIG = """
custom_imports = dict(imports=["tests.test_runner_support"])
model = dict(type="DropoutRegressor", width=16)
strategy = dict(type="DDPStrategy")
train_dataloader = dict(dataset=dict(type="RegressionData", n=64), batch_size=4)
optim_wrapper = dict(optimizer=dict(type="AdamW", lr=0.01))
train_cfg = dict(by_epoch=True, max_epochs=50)
default_hooks = dict(logger=dict(interval=4), checkpoint=dict(interval=1))
custom_hooks = [dict(type="RecordLossHook", seconds=0.2)]
randomness = dict(seed=0)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that nobody reaped has stopped running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_for_pids(work_dir: Path, proc: subprocess.Popen, log: Path) -> list[int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        marks = [work_dir / f"iter_rank{rank}" for rank in (0, 1)]
        if all(m.is_file() and int(m.read_text() or 0) >= 2 for m in marks):
            return [int((work_dir / f"pid_rank{rank}").read_text()) for rank in (0, 1)]
        time.sleep(0.05)
    raise AssertionError(f"the workers did not start training: {proc.poll()}\n{log.read_text()}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_launcher_with_sigkill_ends_its_workers(tmp_path):
    config = tmp_path / "cfg.py"
    config.write_text(CONFIG)
    work_dir = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "shardwise.cli", "train", str(config), "--work-dir"]
    log = (tmp_path / "out.txt").open("w")  # not a pipe: a surviving worker would hold it
    launcher = subprocess.Popen(
        [*cmd, str(work_dir), "--nproc-per-node", "2"],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    workers: list[int] = []
    try:
        workers = _wait_for_pids(work_dir, launcher, tmp_path / "out.txt")
        assert all(_alive(pid) for pid in workers)
        launcher.kill()
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
            time.sleep(0.05)
        assert not [pid for pid in workers if _alive(pid)], "workers outlived their launcher"
    finally:
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=30)
        log.close()
