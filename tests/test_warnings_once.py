"""What every process of a run would print alike is printed once: by the launcher of
``shardwise train`` (which checks the config before it starts the workers), else by rank 0;
the other ranks' Python warnings go to their own log files. mmengine configs' default
``env_cfg.dist_cfg.backend='nccl'`` on a machine without CUDA becomes gloo without a word."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.distributed import run_torchrun
from tests.test_cli_train import TINY, train
from tests.warns_on_import import MESSAGE

NOISY = (
    TINY.replace(
        'imports=["tests.test_runner_support"]',
        'imports=["tests.warns_on_import", "tests.test_runner_support"]',
    )
    + "\nenv_cfg = dict(dist_cfg=dict(backend='nccl'))\n"
)


def test_an_import_warning_and_the_nccl_default_print_once_on_two_ranks(tmp_path):
    assert not torch.cuda.is_available()
    config = tmp_path / "noisy.py"
    config.write_text(NOISY)
    proc = train(str(config), tmp_path / "w", "--nproc-per-node", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert out.count(MESSAGE) == 1, out[-4000:]
    assert "nccl" not in out.lower(), out[-4000:]
    rank1_logs = list(Path(tmp_path / "w").glob("*/*_rank1.log"))
    assert rank1_logs, list(Path(tmp_path / "w").rglob("*"))


def test_under_torchrun_rank_0_alone_prints_an_import_warning(tmp_path):
    config = tmp_path / "noisy.py"
    config.write_text(NOISY)
    args = ("train", str(config), "--work-dir", str(tmp_path / "w"))
    proc = run_torchrun("shardwise.cli", 2, *args, torchrun_args=["--module"], check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert out.count(MESSAGE) == 1, out[-4000:]
