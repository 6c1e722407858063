"""The README's quickstart is examples/quickstart.py and runs as written: one process, and two
ranks under real torchrun."""

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


def _readme_block() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return readme.split("## Quickstart", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_quickstart_block_is_examples_quickstart_byte_for_byte():
    script = (REPO / "examples" / "quickstart.py").read_bytes()
    assert _readme_block().encode("utf-8") == script


def test_the_readme_quickstart_block_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _readme_block()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert " step 1  loss " in proc.stdout  # the starting loss is logged
    assert (tmp_path / "work_dirs" / "quickstart" / "iter_100.pth").is_file()
