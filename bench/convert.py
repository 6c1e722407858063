"""``shardwise ckpt convert`` against the disk (issue 36): converting a sharded checkpoint of
~60 MB into a full file and into safetensors, against reading and writing the same bytes.

The checkpoint: a CharGPT (``examples/chargpt.py``, 5 layers of width 288: 5.1M parameters)
with AdamW's moments after one step, saved by ``FSDPStrategy(state_dict_cfg='sharded')`` on
2 gloo ranks (each rank plans its own writes: two data files, two metadata fragments,
``layout.json``, ``meta.pt``, the manifest): ~61 MB, the size of the checkpoint the issue
timed (14 s, ~4 MB/s, before the fix).

Contenders, in this one process (what ``shardwise ckpt convert`` runs), in ABBA order (A B C,
C B A, ...) after one warm-up each:

- *disk*: every file of the checkpoint read whole (``readinto`` a buffer) and as many bytes
  written to a new file in the destination's directory, the file fsync'd, then the
  directory: the floor any conversion of those bytes is held against (the converter's commit
  fsyncs the file it wrote, its manifest and the directory);
- *full*: ``convert_checkpoint(src, dst, to='full')`` with the source's checksums verified
  first (the default, what the CLI runs);
- *safetensors*: ``convert_checkpoint(src, dst, to='safetensors')``: the weights alone (a
  third of the bytes *disk* moves; its ratio is against the same *disk*).

Two cache states, each its own series: *warm* (the checkpoint's files in the page cache, as
right after a save) and *cold* (the checkpoint's pages evicted before each contender,
``posix_fadvise(DONTNEED)``: what a conversion of a checkpoint saved long ago reads). Each
contender's output is removed after it is timed, outside the timing, with ``os.sync()``
before the next. Beside the wall time, this process's CPU time (user + system): on a shared
machine a contender that computes more waits longer for a core. Issue 36's target:
full / disk <= 1.5 (medians). A cProfile of one warm conversion to full comes with the
result.

    python bench/convert.py --quick --out bench/convert.json
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    MB,
    drop_file_cache,
    gpt_fsdp_strategy,
    machine_info,
    median,
    path_bytes,
    profile_call,
    ratio,
    run_ranks,
    section_main,
)

TARGET = 1.5
#: 5 layers of width 288: 5.1M parameters, ~61 MB with AdamW's two moments.
SIZE = dict(n_layer=5, n_head=4, n_embd=288)
#: ``--full`` also converts a checkpoint 10x larger (16 layers of width 512: ~50M parameters,
#: ~0.6 GB), where the fixed costs weigh less.
LARGE = dict(n_layer=16, n_head=8, n_embd=512)
CACHES = ("warm", "cold")
CONTENDERS = ("disk", "full", "safetensors")


def _settings(quick: bool) -> dict[str, int]:
    """Timed rounds: each contender once per round, the order reversed every other round."""
    return {"rounds": 6} if quick else {"rounds": 12}


# ----------------------------------------------------------------------------- the checkpoint
def save_case(path: str, size: dict[str, int]) -> dict[str, Any]:
    """One of 2 ranks: FSDP's sharded checkpoint of the model after one AdamW step."""
    import torch.distributed as dist
    from _models import GPTSize, build_gpt, loss_of, make_batches

    size = GPTSize(**size)
    work = Path(path).parent
    strategy = gpt_fsdp_strategy(str(work), state_dict_cfg="sharded")
    model, optim_wrapper = strategy.prepare(
        build_gpt(size), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=3e-4))
    )
    batch = make_batches(1, 2, size, seed=dist.get_rank())[0]
    optim_wrapper.update_params(loss_of(model, batch))
    strategy.save_checkpoint(path)
    dist.barrier()
    return {"parameters": sum(p.numel() for p in model.parameters())}  # global shapes


# ----------------------------------------------------------------------------- contenders
def read_and_write(src: Path, dst: Path) -> int:
    """Read every file of ``src`` whole, write as many bytes to ``dst``, fsync it and its
    directory; returns the bytes."""
    files = sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else [src]
    sizes = [f.stat().st_size for f in files]
    buf = bytearray(max(sizes))
    view = memoryview(buf)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for file, size in zip(files, sizes):
            with open(file, "rb", buffering=0) as f:
                got = f.readinto(view[:size])
            done = 0
            while done < got:
                done += os.write(fd, view[done:got])
        os.fsync(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(dst.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return sum(sizes)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    for extra in path.parent.glob(f"{path.name}.manifest.json"):
        extra.unlink()


def _series(
    steps: dict[str, Any], src: Path, root: Path, rounds: int, cold: bool
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, int]]:
    """Every contender once per round (ABBA order) after a warm-up round; each one's
    seconds (wall, and this process's CPU time), and output bytes."""
    suffix = {"disk": ".bin", "full": ".pth", "safetensors": ".safetensors"}
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    cpu: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    out_bytes: dict[str, int] = {}
    for r in range(rounds + 1):  # round 0: the warm-up
        for name in CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]:
            dst = root / f"{name}{suffix[name]}"
            os.sync()
            if cold:
                drop_file_cache(src)
            start, start_cpu = time.perf_counter(), time.process_time()
            steps[name](dst)
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
            out_bytes[name] = path_bytes(dst)
            _remove(dst)
            if r:
                times[name].append(seconds)
                cpu[name].append(cpu_seconds)
    return times, cpu, out_bytes


def measure(size: dict[str, int], rounds: int, profile: bool = False) -> dict[str, Any]:
    """Save a sharded checkpoint of ``size`` on 2 ranks; time each contender, warm and cold."""
    from shardwise.checkpoint.convert import convert_checkpoint

    result: dict[str, Any] = {"model": size}
    root = Path(tempfile.mkdtemp(prefix="shardwise-bench-convert-"))
    try:
        src = root / "sharded.pth"
        saved = run_ranks("convert:save_case", 2, {"path": str(src), "size": size}, timeout=600)
        result["parameters"] = saved[0]["parameters"]
        result["checkpoint_bytes"] = path_bytes(src)
        result["checkpoint_files"] = {p.name: p.stat().st_size for p in sorted(src.iterdir())}
        steps = {
            "disk": lambda dst: read_and_write(src, dst),
            "full": lambda dst: convert_checkpoint(src, dst, to="full"),
            "safetensors": lambda dst: convert_checkpoint(src, dst, to="safetensors"),
        }
        for cache in CACHES:
            times, cpu, out_bytes = _series(steps, src, root, rounds, cache == "cold")
            medians = {name: median(xs) for name, xs in times.items()}
            case: dict[str, Any] = {
                "seconds": {name: [round(x, 4) for x in xs] for name, xs in times.items()},
                "median_s": medians,
                "cpu_median_s": {name: median(xs) for name, xs in cpu.items()},
                "output_bytes": out_bytes,
                "full_over_disk": ratio(medians["full"], medians["disk"]),
                "safetensors_over_disk": ratio(medians["safetensors"], medians["disk"]),
                "disk_mb_per_s": result["checkpoint_bytes"] / MB / medians["disk"],
                "full_mb_per_s": result["checkpoint_bytes"] / MB / medians["full"],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            }
            case["meets_target"] = case["full_over_disk"] <= TARGET
            result[cache] = case
        if profile:
            result["profile_full_warm"] = profile_call(
                lambda: convert_checkpoint(src, root / "profiled.pth", to="full")
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


def run(quick: bool = True) -> dict[str, Any]:
    settings = _settings(quick)
    result = {"settings": settings, "target": TARGET, "machine": machine_info()}
    result.update(measure(SIZE, settings["rounds"], profile=True))
    if not quick:
        result["large"] = measure(LARGE, 4)
    return result


if __name__ == "__main__":
    section_main("convert", run)
