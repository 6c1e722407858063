"""An OpenMMLab config under ``shardwise train`` against mmengine's own Runner (issue 37).

The config: the child of the corpus's ``mmpretrain/configs/resnet/resnet18_8xb16_cifar10.py``
that ``tests/test_openmmlab.py`` trains (ResNet-18, CIFAR-10's pipeline with 2 worker
processes, SGD with momentum, batch 16), on a generated folder of 32-pixel images (3 classes),
with mmpretrain 1.2.0 on mmcv-lite 2.2.0 (``tests/openmmlab_support.build_env``, which runs
``tools/openmmlab_env.sh`` once into ``.openmmlab/env``).

- ``one_process``: ``shardwise train CONFIG`` against mmengine's
  ``Runner.from_cfg(cfg).train()`` on one process each (one intra-op thread), in fresh
  processes launched alternately (A B, B A, ...). A step is the time between two iterations'
  ends as a hook sees them (``tests.openmmlab_hooks.RecordHook``, the first hook of
  ``after_train_iter`` in both runners): the data, the step and every hook. Each launch gives
  the median of its steps after the first two of each epoch (worker start-up); the ratio is the
  median over pairs of launches side by side in time of shardwise's median over mmengine's,
  so that a shared machine's drift cancels. Beside the wall time, the training process's CPU
  seconds per step (the workers' transforms are the same code under both): on a loaded
  machine the wall time of a launch moves by more than the difference sought. Both launches
  compute the same losses (checked). Target: <= 1.02 (wall).
- ``fsdp2``: ``shardwise train`` with ``FSDPStrategy`` on 2 processes, and mmengine's
  ``FlexibleRunner`` with its own ``FSDPStrategy`` under torchrun, where that runs: mmengine
  0.10.7's ``init_dist`` calls ``torch.cuda.set_device``, so on a CPU-only torch it does not
  start, and the result says so with the error it stopped at (shardwise's step time is still
  given).

    python bench/openmmlab.py --quick --out /tmp/openmmlab.json
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import REPO, machine_info, median, ratio, section_main

sys.path.insert(0, str(REPO))
from tests.openmmlab_support import (  # noqa: E402
    build_env,
    child_config,
    make_images,
    run_env,
    train_with_mmengine,
    train_with_shardwise,
)

TARGET = 1.02
BATCH = 16
SKIP_PER_EPOCH = 2  # each epoch's first steps start the worker processes

FLEXIBLE_FSDP = """
import sys
from mmengine.config import Config
from mmengine.runner import FlexibleRunner
cfg = Config.fromfile(sys.argv[1])
cfg.work_dir = sys.argv[2]
cfg.strategy = dict(type='FSDPStrategy')
cfg.launcher = 'pytorch'
cfg.env_cfg = dict(dist_cfg=dict(backend='gloo'))
FlexibleRunner.from_cfg(cfg).train()
"""


def _steps(out: Path, epoch_length: int) -> tuple[list[float], list[float], list[float]]:
    """The wall seconds and this process's CPU seconds of each step a run recorded (each
    epoch's first ones left out), and its losses."""
    times = json.loads((out / "times.json").read_text())
    losses = json.loads((out / "losses.json").read_text())
    kept = [
        (later[0] - earlier[0], later[1] - earlier[1])
        for i, (earlier, later) in enumerate(zip(times, times[1:]), start=1)
        if i % epoch_length >= SKIP_PER_EPOCH
    ]
    return [wall for wall, _ in kept], [cpu for _, cpu in kept], losses


def _launch(trainer, name: str, tmp: Path, images: Path, env_dir: Path, epochs: int, *args: str):
    out = tmp / f"{name}_record"
    config = child_config(
        "resnet18", tmp, images, out, batch=BATCH, epochs=epochs, name=f"{name}_config"
    )
    proc = trainer(config, tmp / f"{name}_run", env_dir, *args)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    return out


def one_process(env_dir: Path, images: Path, launches: int, epochs: int, epoch_length: int):
    pairs = []
    for launch in range(launches):
        order = ["mmengine", "shardwise"] if launch % 2 == 0 else ["shardwise", "mmengine"]
        wall, cpu, losses = {}, {}, {}
        for name in order:
            trainer = train_with_mmengine if name == "mmengine" else train_with_shardwise
            with tempfile.TemporaryDirectory() as tmp:
                out = _launch(trainer, name, Path(tmp), images, env_dir, epochs)
                walls, cpus, losses[name] = _steps(out, epoch_length)
            wall[name], cpu[name] = median(walls), median(cpus)
        if losses["mmengine"] != losses["shardwise"]:
            raise RuntimeError(f"the runs computed different losses: {losses}")
        pairs.append(
            dict(
                order=order,
                mmengine_step_s=round(wall["mmengine"], 4),
                shardwise_step_s=round(wall["shardwise"], 4),
                ratio=round(ratio(wall["shardwise"], wall["mmengine"]), 4),
                mmengine_cpu_s=round(cpu["mmengine"], 4),
                shardwise_cpu_s=round(cpu["shardwise"], 4),
                cpu_ratio=round(ratio(cpu["shardwise"], cpu["mmengine"]), 4),
                loadavg=[round(x, 2) for x in os.getloadavg()],
            )
        )
    value = median([p["ratio"] for p in pairs])
    return dict(
        ratio=round(value, 4),
        target=TARGET,
        met=value <= TARGET,
        ratio_range=[min(p["ratio"] for p in pairs), max(p["ratio"] for p in pairs)],
        mmengine_step_s=round(median([p["mmengine_step_s"] for p in pairs]), 4),
        shardwise_step_s=round(median([p["shardwise_step_s"] for p in pairs]), 4),
        cpu_ratio=round(median([p["cpu_ratio"] for p in pairs]), 4),
        cpu_ratio_range=[min(p["cpu_ratio"] for p in pairs), max(p["cpu_ratio"] for p in pairs)],
        same_losses=True,
        launches=pairs,
    )


def fsdp2(env_dir: Path, images: Path, launches: int, epochs: int, epoch_length: int):
    """``epoch_length``: steps per epoch on 2 ranks."""
    steps = []
    for _ in range(launches):
        with tempfile.TemporaryDirectory() as tmp:
            args = ("--nproc-per-node", "2")
            out = _launch(train_with_shardwise, "fsdp", Path(tmp), images, env_dir, epochs, *args)
            steps.append(median(_steps(out, epoch_length)[0]))
    result: dict[str, Any] = dict(shardwise_step_s=round(median(steps), 4), launches=len(steps))
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "record"
        config = child_config(
            "resnet18", Path(tmp), images, record, batch=BATCH, epochs=epochs, name="flexible"
        )
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        proc = subprocess.run(
            [*torchrun, "--no-python", sys.executable, "-c", FLEXIBLE_FSDP, str(config), tmp],
            cwd=REPO,
            env=run_env(env_dir),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode == 0:
            flexible = median(_steps(record, epoch_length)[0])
            result["mmengine_flexible_fsdp_step_s"] = round(flexible, 4)
            result["ratio"] = round(ratio(result["shardwise_step_s"], flexible), 4)
            return result
    errors = [
        line.strip()
        for line in proc.stderr.splitlines()
        if re.match(r"\s*\w+(Error|Exception): ", line) and "ChildFailedError" not in line
    ]
    result["mmengine_flexible_fsdp"] = "does not run here: " + (
        errors[0] if errors else proc.stderr[-300:]
    )
    return result


def run(quick: bool) -> dict[str, Any]:
    env_dir, reason = build_env()
    if env_dir is None:
        return dict(status="skipped", reason=reason)
    launches, epochs, per_class = (4, 2, 64) if quick else (8, 3, 96)
    result: dict[str, Any] = dict(machine=machine_info())
    with tempfile.TemporaryDirectory() as tmp:
        images = make_images(Path(tmp) / "images", per_class=per_class)
        epoch_length = -(-3 * per_class // BATCH)
        result["config"] = dict(
            base="mmpretrain/configs/resnet/resnet18_8xb16_cifar10.py",
            images=3 * per_class,
            batch=BATCH,
            epochs=epochs,
            steps_per_epoch=epoch_length,
            num_workers=2,
            threads_per_process=1,
        )
        result["one_process"] = one_process(env_dir, images, launches, epochs, epoch_length)
        two_ranks = -(-3 * per_class // (2 * BATCH))
        result["fsdp2"] = fsdp2(env_dir, images, max(2, launches // 2), epochs, two_ranks)
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


if __name__ == "__main__":
    section_main("openmmlab", run)
