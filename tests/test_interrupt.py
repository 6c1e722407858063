"""Ctrl-C (SIGINT): the first one finishes the step, commits a checkpoint when the config
saves checkpoints (saying where, or that the work since the last checkpoint is lost), and
exits with code 130, in one line; a second one stops at once. Run as a user would: a real
``shardwise train`` on 2 ranks (CPU, gloo), SIGINT to the launcher as a terminal sends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardwise.checkpoint import find_last_checkpoint
from shardwise.checkpoint.manifest import is_committed
from shardwise.runner import INTERRUPTED_EXIT_CODE, Hook, Interrupted, Runner
from tests.distributed import REPO

CONFIG = """
custom_imports = dict(imports=["tests.test_runner_support"])
model = dict(type="DropoutRegressor", width=16)
strategy = dict(type="DDPStrategy")
train_dataloader = dict(dataset=dict(type="RegressionData", n=64), batch_size=4)
optim_wrapper = dict(optimizer=dict(type="AdamW", lr=0.01))
train_cfg = dict(by_epoch=True, max_epochs=50)
default_hooks = dict(logger=dict(interval=4), checkpoint={checkpoint})
custom_hooks = [dict(type="RecordLossHook", seconds={seconds})]
randomness = dict(seed=0)
"""


def _start(tmp_path: Path, checkpoint: str, seconds: float = 0.2) -> subprocess.Popen:
    config = tmp_path / "cfg.py"
    config.write_text(CONFIG.format(checkpoint=checkpoint, seconds=seconds))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "shardwise.cli", "train", str(config), "--work-dir"]
    return subprocess.Popen(
        [*cmd, str(tmp_path / "work"), "--nproc-per-node", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_iteration(work_dir: Path, at_least: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        marks = [work_dir / f"iter_rank{rank}" for rank in (0, 1)]
        if all(m.is_file() and int(m.read_text() or 0) >= at_least for m in marks):
            return
        time.sleep(0.05)
    raise AssertionError(f"the run did not reach iteration {at_least}: {proc.communicate()}")


def _after(text: str, start: str) -> list[str]:
    """The lines of ``text`` after the first that contains ``start``."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if start in line)
    return lines[first + 1 :]


NOISE = ("Traceback", "KeyboardInterrupt", "closing signal", "death signal", "SIGINT received")


def test_ctrl_c_commits_a_checkpoint_of_the_step_and_exits_130_in_one_line(tmp_path):
    run = _start(tmp_path, "dict(interval=1)")
    work_dir = tmp_path / "work"
    _wait_for_iteration(work_dir, 3, run)
    run.send_signal(signal.SIGINT)  # a terminal's Ctrl-C reaches the launcher
    out, err = run.communicate(timeout=120)
    assert run.returncode == INTERRUPTED_EXIT_CODE, (out, err)
    saved = find_last_checkpoint(str(work_dir))
    assert saved is not None and is_committed(saved)
    stopped = int((work_dir / "iter_rank0").read_text())
    assert Path(saved).name == f"iter_{stopped}.pth"  # the step in progress, finished and kept
    said = [line for line in (out + err).splitlines() if "Interrupted" in line]
    assert len(said) == 1 and f"committed {saved}" in said[0], (out, err)
    assert f"exiting with code {INTERRUPTED_EXIT_CODE}" in said[0]
    assert not [noise for noise in NOISE if noise in out + err], (out, err)


def test_ctrl_c_without_saving_names_the_work_that_is_lost(tmp_path):
    from tests.test_runner_support import DropoutRegressor, RegressionData

    class CtrlC(Hook):
        priority = "LOW"  # before the preemption hook of the same iteration

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if runner.iter + 1 == 3:
                os.kill(os.getpid(), signal.SIGINT)

    runner = Runner(
        model=DropoutRegressor(),
        work_dir=str(tmp_path),
        train_dataloader=dict(dataset=RegressionData(n=32), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=True, max_epochs=3),
        default_hooks=dict(checkpoint=None),
        custom_hooks=[CtrlC()],
    )
    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as info:
        runner.train()
    assert info.value.code == INTERRUPTED_EXIT_CODE and info.value.checkpoint is None
    assert runner.iter == 2  # the third step ran to its end, no fourth began
    assert find_last_checkpoint(str(tmp_path)) is None
    assert signal.getsignal(signal.SIGINT) is previous  # the handler is given back
    log = (Path(runner.log_dir) / f"{runner.timestamp}.log").read_text()
    said = [line for line in log.splitlines() if "Interrupted" in line]
    assert len(said) == 1, log
    assert "no checkpoint is saved (default_hooks.checkpoint)" in said[0]
    assert "the work of this run is lost" in said[0]


def test_ctrl_c_twice_stops_at_once_without_tracebacks(tmp_path):
    # steps of 3 s: the first Ctrl-C waits for the step's end, the second does not
    run = _start(tmp_path, "dict(interval=1)", seconds=3.0)
    work_dir = tmp_path / "work"
    _wait_for_iteration(work_dir, 1, run)
    pids = [int((work_dir / f"pid_rank{rank}").read_text()) for rank in (0, 1)]
    run.send_signal(signal.SIGINT)
    time.sleep(0.5)
    started = time.monotonic()
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    assert time.monotonic() - started < 2.5, (out, err)  # not the end of the 3 s step
    assert run.returncode == INTERRUPTED_EXIT_CODE, (out, err)
    assert not [noise for noise in NOISE if noise in out + err], (out, err)
    said = [line for line in (out + err).splitlines() if "Interrupted" in line]
    assert len(said) == 1 and "stopping at once" in said[0], (out, err)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(map(_alive, pids)):
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)]  # the workers are gone too


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("how", ["the launcher got it", "the workers got it"])
def test_the_launcher_adds_nothing_to_the_workers_line_after_ctrl_c(monkeypatch, capsys, how):
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from shardwise.runner.launch import LAUNCHER_PID_ENV, LaunchOptions, launch

    seen = {}

    def run(args):
        seen["launcher"] = os.environ.get(LAUNCHER_PID_ENV)
        if how == "the launcher got it":
            raise SignalException("got it", sigval=signal.SIGINT)
        failure = ProcessFailure(local_rank=0, pid=1, exitcode=130, error_file="/nonexistent")
        raise ChildFailedError("w", {0: failure, 1: failure})

    monkeypatch.setattr(torchrun, "run", run)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv(LAUNCHER_PID_ENV, raising=False)
    assert launch(LaunchOptions(nproc_per_node=2), ["train", "cfg.py"]) == INTERRUPTED_EXIT_CODE
    assert capsys.readouterr().err == ""
    assert seen["launcher"] == str(os.getpid())  # the workers know their launcher
    assert LAUNCHER_PID_ENV not in os.environ  # and this process's environment is as it was
