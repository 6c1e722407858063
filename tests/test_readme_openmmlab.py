"""The README's "Training an OpenMMLab project" works as written.

Default suite: every make target, repository path and command the section names is here, and
``examples/openmmlab/make_images.py`` writes the layout the section describes.

Slow suite: the section's commands, copied out of the README, run one after the other on a copy
of the repository (the working tree) with no ``.venv``: ``make openmmlab`` builds a new one from
PyPI (torch, shardwise, mmengine, mmcv-lite, mmpretrain, torchvision), then the example trains on
one process and under FSDP2 on two, resumes, converts, and mmengine loads the checkpoint. Skipped
where PyPI cannot be reached, except under CI (``CI`` set), where that fails.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed import REPO
from tests.openmmlab_support import unavailable

SECTION = "## Training an OpenMMLab project"
# a repository path as the section writes it (what the commands produce, work_dirs/ and data/,
# is not one)
REPO_PATH = re.compile(r"(?<![\w/.])((?:tools/|examples/|tests/|src/)[\w./-]*\w)")


def section() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end >= 0 else None]


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", section(), re.S | re.M)


def commands() -> list[str]:
    """The lines of the section's ``bash`` blocks, as written (comments and all)."""
    return [
        line
        for block in blocks("bash")
        for line in block.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def make_targets() -> set[str]:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([\w-]+):", makefile, re.M))


# ----------------------------------------------------------------------------- default suite


def test_the_section_s_commands_are_make_targets_and_the_venv_s_programs():
    runs = [shlex.split(line, comments=True) for line in commands()]
    assert [argv[:2] for argv in runs[:3]] == [
        ["make", "openmmlab"],
        [".venv/bin/python", "examples/openmmlab/make_images.py"],
        [".venv/bin/shardwise", "train"],
    ]
    scripts = re.findall(r"^(\w+) = ", (REPO / "pyproject.toml").read_text(), re.M)
    for argv in runs:
        if argv[0] == "make":
            assert set(argv[1:]) <= make_targets(), argv
        else:  # nothing from the PATH: the venv's python or one of shardwise's own scripts
            assert argv[0].startswith(".venv/bin/"), argv
            assert Path(argv[0]).name in {"python", *scripts}, argv


def test_every_path_the_section_names_exists():
    named = sorted({m for m in REPO_PATH.findall(section())})
    assert {
        "tools/openmmlab_env.sh",
        "tools/build_mmcv_ops.sh",
        "tools/openmmlab_ops_env.sh",
        "examples/openmmlab/make_images.py",
        "examples/openmmlab/resnet18.py",
        "examples/openmmlab/resnet18_fsdp.py",
        "tests/test_readme_openmmlab.py",
    } <= set(named)
    assert [p for p in named if not (REPO / p).exists()] == []


def test_make_openmmlab_runs_the_repository_s_script_in_the_venv(tmp_path):
    """``make -n``: the recipe (the venv's own steps first, where there is none)."""
    proc = subprocess.run(
        ["make", "-n", "openmmlab", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"PYTHON={tmp_path / 'venv'}/bin/python bash tools/openmmlab_env.sh" in proc.stdout
    assert "-m venv" in proc.stdout  # `make openmmlab` on a fresh clone makes the venv first
    ops = subprocess.run(
        ["make", "-n", "mmcv-ops", f"VENV={tmp_path / 'venv'}", "MMCV_CACHE=/cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    script = "bash tools/openmmlab_ops_env.sh"  # mmcv's wheel by tools/build_mmcv_ops.sh
    assert f"MMCV_CACHE=/cache PYTHON={tmp_path / 'venv'}/bin/python {script}" in ops.stdout


def test_make_images_writes_one_folder_per_class_for_custom_dataset(tmp_path):
    import numpy as np
    from PIL import Image

    subprocess.run(
        [sys.executable, str(REPO / "examples/openmmlab/make_images.py"), str(tmp_path / "data")],
        check=True,
        capture_output=True,
    )
    layout = {
        f"{split.name}/{folder.name}": len(list(folder.glob("*.png")))
        for split in sorted((tmp_path / "data").iterdir())
        for folder in sorted(split.iterdir())
    }
    assert layout == {
        "train/blue": 32,
        "train/green": 32,
        "train/red": 32,
        "val/blue": 8,
        "val/green": 8,
        "val/red": 8,
    }
    image = Image.open(tmp_path / "data" / "train" / "green" / "0.png")
    assert (image.size, image.mode) == ((32, 32), "RGB")
    assert np.asarray(image).reshape(-1, 3).mean(axis=0).argmax() == 1  # green: the brighter


# ----------------------------------------------------------------------------- slow suite


def _pypi_reachable(tmp_path: Path) -> str:
    """'' where pip can download from the index, else why not."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(tmp_path)]
        + ["mmpretrain==1.2.0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return "" if proc.returncode == 0 else " ".join(proc.stderr.strip().splitlines()[-2:])


def _fresh_copy(dest: Path) -> Path:
    """The working tree (tracked files, and new ones git does not ignore) copied to ``dest``:
    no ``.venv``, ``data`` or ``work_dirs``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def _user_env() -> dict[str, str]:
    """A shell's environment, not this test run's: no venv on the PATH or active, no
    variables that ``make`` would take for its own."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHON", "VENV", "PY", "PIP", "NPROC"}
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(REPO))
    )
    return env


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_openmmlab_section_runs_as_written_on_a_fresh_copy(tmp_path):
    why = _pypi_reachable(tmp_path / "probe")
    if why:
        unavailable(f"PyPI cannot be reached: {why}")
    repo = _fresh_copy(tmp_path / "repo")
    env = _user_env()

    outputs = {}
    for line in commands():
        started = time.monotonic()
        proc = subprocess.run(
            ["bash", "-c", line],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        took = time.monotonic() - started
        assert proc.returncode == 0, f"{line}\nrc {proc.returncode} after {took:.0f} s\n" + (
            proc.stdout[-3000:] + proc.stderr[-5000:]
        )
        outputs[line] = proc.stdout + proc.stderr
        print(f"{took:6.1f} s  {line}")

    # make openmmlab: the packages in the new venv, beside the torch the venv had
    install = next(out for line, out in outputs.items() if line.startswith("make openmmlab"))
    assert "openmmlab_env: mmpretrain 1.2.0 on mmcv-lite 2.2.0 and mmengine 0.10.7 ready" in (
        install
    )
    import torch

    venv_torch = subprocess.run(
        [str(repo / ".venv/bin/python"), "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert venv_torch == torch.__version__
    # once more: a torchvision that loads (pip's, where it matches torch) is left as it is
    again = subprocess.run(
        ["bash", "tools/openmmlab_env.sh"],
        cwd=repo,
        env={**env, "PYTHON": ".venv/bin/python"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "does not load" not in again.stdout and again.stdout.rstrip().endswith("ready")

    # the one-process run: 2 epochs of 6 iterations, validated after each, the loss going down
    work_dir = repo / "work_dirs" / "resnet18"
    assert (work_dir / "epoch_2.pth").is_file()
    records = [
        json.loads(line) for line in next(work_dir.glob("*/metrics.jsonl")).read_text().splitlines()
    ]
    train = [r["loss"] for r in records if r["mode"] == "train"]
    val = [r for r in records if r["mode"] == "val"]
    assert len(val) == 2 and all("accuracy/top1" in r for r in val)
    assert train[-1] < train[0]

    # FSDP2: sharded checkpoints, the resumed epoch, the converted file
    fsdp = repo / "work_dirs" / "resnet18_fsdp"
    assert all((fsdp / f"epoch_{n}.pth").is_dir() for n in (1, 2, 3))
    resumed = next(out for line, out in outputs.items() if "--resume" in line)
    assert f"Resuming from {fsdp / 'epoch_2.pth'}" in resumed
    assert (repo / "work_dirs" / "resnet18.pth").is_file()

    # which mmengine loads strictly into mmpretrain's model (the section's python block)
    (python_block,) = blocks("python")
    proc = subprocess.run(
        [".venv/bin/python", "-"],
        input=python_block,
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    # make mmcv-ops (the section's prose): mmcv 2.1.0 with its compiled ops in place of
    # mmcv-lite, from the cache where it was built before (else built: up to an hour)
    ops = subprocess.run(
        ["make", "mmcv-ops"], cwd=repo, env=env, capture_output=True, text=True, timeout=4200
    )
    assert ops.returncode == 0, ops.stdout[-3000:] + ops.stderr[-3000:]
    check = (
        "import torch; from mmcv.ops import nms; import mmcv; "
        "boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30]]); "
        "_, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5); "
        "print(mmcv.__version__, keep.tolist())"
    )
    proc = subprocess.run(
        [".venv/bin/python", "-c", check], cwd=repo, env=env, capture_output=True, text=True
    )
    assert proc.stdout.split() == ["2.1.0", "[0,", "2]"], proc.stdout + proc.stderr[-3000:]
