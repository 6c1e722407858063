"""How long the ``shardwise`` command takes to start, against ``python -c 'import torch'``.

Each contender is a fresh process, timed from spawn to exit; the contenders alternate in
rounds (ABBA order, see :func:`_common.interleaved_steps`) and the best of N is reported (the
machine is shared: the best run is the one least disturbed). The contenders:

- ``python -c pass``: the interpreter alone (the floor);
- ``python -c 'import torch'``: the baseline a command that reads a ``.pth`` cannot beat;
- ``shardwise --help``, ``shardwise env``;
- ``shardwise ckpt inspect`` and ``shardwise ckpt verify`` of a small full checkpoint (a
  ``.pth`` with its manifest) and of a small sharded one (a DCP directory).

Each row also records whether the command imported torch and the heavy modules it did not
need (transformers, mmengine, ray, tensorboard, the runner, the strategies), from
``python -X importtime``.

    python bench/cli_startup.py            # --quick: best of 5
    python bench/cli_startup.py --full     # best of 15
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import interleaved_steps, quiet_shardwise_logs, section_main

#: issue 25's target for --help, env, ckpt inspect and ckpt verify (seconds)
TARGET_S = 1.5
#: modules a command that does not train should not import
HEAVY = (
    "transformers",
    "mmengine",
    "ray",
    "tensorboard",
    "shardwise.runner.runner",
    "shardwise.strategies",
)


def _shardwise() -> list[str]:
    """The console script beside this interpreter, else ``python -m shardwise.cli``."""
    script = Path(sys.executable).with_name("shardwise")
    return [str(script)] if script.exists() else [sys.executable, "-m", "shardwise.cli"]


def _checkpoints(root: Path) -> dict[str, Path]:
    """A small full checkpoint (with its manifest) and the same converted to sharded."""
    import torch

    from shardwise.checkpoint.convert import convert_checkpoint
    from shardwise.strategies import SingleDeviceStrategy

    quiet_shardwise_logs()
    strategy = SingleDeviceStrategy(work_dir=str(root))
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    strategy.prepare(model, optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)))
    strategy.save_checkpoint("iter_2.pth", extra_ckpt=dict(meta=dict(epoch=1, iter=2)))
    full = root / "iter_2.pth"
    sharded = convert_checkpoint(full, root / "iter_2_sharded", to="sharded", progress=False)
    return {"full": full, "sharded": Path(sharded)}


def _imports(argv: list[str]) -> dict[str, Any]:
    """Whether ``python ARGV`` imports torch, and which heavy modules (``-X importtime``)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, timeout=300
    )
    names = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return {
        "torch": "torch" in names,
        "heavy": sorted(n for n in names if n in HEAVY or n.split(".")[0] in HEAVY),
        "modules": len(names),
    }


def run(quick: bool) -> dict[str, Any]:
    rounds = 5 if quick else 15
    with tempfile.TemporaryDirectory(prefix="shardwise-bench-cli-") as tmp:
        ckpt = _checkpoints(Path(tmp))
        cli = ["-m", "shardwise.cli"]
        python_argv = {  # what follows the interpreter
            "python -c pass": ["-c", "pass"],
            "python -c 'import torch'": ["-c", "import torch"],
            "shardwise --help": [*cli, "--help"],
            "shardwise env": [*cli, "env"],
            "shardwise ckpt inspect (full .pth)": [*cli, "ckpt", "inspect", str(ckpt["full"])],
            "shardwise ckpt verify (full .pth)": [*cli, "ckpt", "verify", str(ckpt["full"])],
            "shardwise ckpt inspect (sharded)": [*cli, "ckpt", "inspect", str(ckpt["sharded"])],
            "shardwise ckpt verify (sharded)": [*cli, "ckpt", "verify", str(ckpt["sharded"])],
        }
        for argv in python_argv.values():
            if argv[:3] == [*cli, "ckpt"] and argv[3] == "verify":
                argv.insert(4, "--no-progress")
        sw = _shardwise()  # timed as a user runs it: the console script
        commands = {
            name: [*sw, *argv[2:]] if argv[:2] == cli else [sys.executable, *argv]
            for name, argv in python_argv.items()
        }
        failed = {}

        def spawn(name: str):
            def step(_: int) -> None:
                proc = subprocess.run(commands[name], capture_output=True, text=True, timeout=300)
                if proc.returncode != 0:
                    failed[name] = proc.stderr[-2000:]

            return step

        start = time.perf_counter()
        times = interleaved_steps(
            {name: spawn(name) for name in commands}, warmup=1, rounds=rounds, per_round=1
        )
        imports = {name: _imports(argv) for name, argv in python_argv.items()}
        wall = time.perf_counter() - start
    torch_s = min(times["python -c 'import torch'"])
    rows = [
        {
            "command": name,
            "best_s": min(times[name]),
            "median_s": sorted(times[name])[len(times[name]) // 2],
            "vs_import_torch": min(times[name]) / torch_s,
            "target_s": TARGET_S if name.startswith("shardwise") else None,
            "imports_torch": imports[name]["torch"],
            "heavy_imports": imports[name]["heavy"],
            "modules": imports[name]["modules"],
        }
        for name in commands
    ]
    return {
        "rows": rows,
        "runs_per_command": rounds,
        "failed": failed,
        "measure_wall_s": round(wall, 1),
        "status": "error" if failed else "ok",
        "error": "\n".join(f"{k}: {v}" for k, v in failed.items()) or None,
    }


if __name__ == "__main__":
    section_main("cli_startup", run)
