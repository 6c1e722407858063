"""The `shardwise` command."""

import subprocess
import sys

from shardwise.cli import main


def test_shardwise_env_prints_the_collected_environment(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "PyTorch: 2." in out and "shardwise: " in out and "CUDA available: " in out


def test_the_console_script_entry_point_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "shardwise.cli", "env"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "Python: " in proc.stdout
