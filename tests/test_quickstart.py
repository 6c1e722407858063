"""The README's quickstart runs as written: one process, and two ranks under real torchrun."""

import subprocess
import sys

import torch

from tests.distributed import REPO, run_torchrun


def test_quickstart_trains_on_one_process(tmp_path):
    proc = subprocess.run(
        [sys.executable, "examples/quickstart.py", "--work-dir", str(tmp_path), "--steps", "100"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    losses = [
        float(line.split("loss")[1].split()[0])
        for line in proc.stdout.splitlines()
        if " loss " in line
    ]
    assert losses[-1] < 0.1 * losses[0]
    checkpoint = torch.load(tmp_path / "iter_100.pth", weights_only=True)
    assert checkpoint["meta"]["strategy"] == "SingleDeviceStrategy"


def test_quickstart_trains_with_ddp_under_torchrun(tmp_path):
    run_torchrun(
        "examples/quickstart.py",
        2,
        "--strategy",
        "DDPStrategy",
        "--work-dir",
        str(tmp_path),
        "--steps",
        "40",
        timeout=180,
    )
    checkpoint = torch.load(tmp_path / "iter_40.pth", weights_only=True)
    assert checkpoint["meta"]["world_size"] == 2
    assert len(checkpoint["meta"]["rng_states"]) == 2


def test_the_readme_quickstart_block_runs(tmp_path):
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Quickstart", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    proc = subprocess.run(
        [sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "work_dirs" / "demo" / "iter_100.pth").is_file()
