"""Checkpointing: save throughput, rank 0's peak memory and load time of shardwise's
checkpoints, against plain torch and against the disk, all measured in the same run.

- ``full`` (one process, ``SingleDeviceStrategy``): ``save_checkpoint`` (one file, fsync'd,
  committed by rename) against ``torch.save`` of the model's and optimizer's state dicts
  (with fsync: the same durability; without: the page cache) and against the disk's
  sequential write bandwidth (``os.write`` of the same number of bytes, then ``fsync``).
  Loads (``load_checkpoint``: weights; ``resume``: weights, optimizer, RNG) against
  ``torch.load`` + ``load_state_dict`` and against reading the file; the file's pages are
  evicted from the page cache before every load.
- ``sharded`` (2 ranks, ``FSDPStrategy(state_dict_cfg='sharded')``, when it exists) against
  ``torch.distributed.checkpoint`` (DCP) save/load of a ``fully_shard``-ed copy. It runs
  first and leaves its checkpoint to ``full``, which resumes it on one rank (resharding)
  beside its own loads: against the 2-rank resume of the same checkpoint.
- ``async`` (inside ``full`` and ``sharded``): ``save_checkpoint(async_save=True)`` against a
  synchronous save of the same state, alternating; the time training is blocked (until the
  call returns) and until the checkpoint is committed (``wait_for_checkpoint``).
- ``memory`` (fresh processes): the RSS high-water mark (``VmHWM``, reset just before each
  operation) above the RSS before it, for the full save and loads, against the model's size
  and against torch; and rank 0's while ``FSDPStrategy(state_dict_cfg='full')`` gathers and
  writes a full checkpoint on 2 ranks, against the same gather done by hand
  (``get_state_dict(full_state_dict=True, cpu_offload=True)`` + ``torch.save``); and the
  safetensors export of the full checkpoint (``convert_checkpoint(to='safetensors')``),
  against the model's size, its largest tensor and ``torch.load`` + safetensors'
  ``save_file``. These processes run with ``MALLOC_MMAP_THRESHOLD_`` set so that RSS follows
  live memory.

Timings are repeated, rotating the contenders' order, with ``os.sync()`` between them. This
machine's disk is shared and its speed jumps between runs, so the figure is the best of N
(the cost when nothing else gets in the way); the median is kept beside it. A profile
(cProfile) of one shardwise save and one resume comes with each case.

    python bench/checkpoint_io.py --quick
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common
from _common import (
    GB,
    MEMORY_ENV,
    disk_write_seconds,
    drop_file_cache,
    fsdp_strategy_class,
    fully_shard_blocks,
    gpt_fsdp_strategy,
    median,
    out_of_time,
    path_bytes,
    proc_status_kb,
    profile_call,
    quiet_shardwise_logs,
    ratio,
    reset_peak_rss,
    run_ranks,
    section_main,
)

LR = 3e-4
#: The 1-rank resume of the sharded checkpoint that FSDP saved on 2 ranks (``full_case``).
RESHARDED = "shardwise resume of the 2-rank sharded checkpoint"
TARGETS = {"save": 1.10, "load": 1.10, "save_peak_vs_model": 1.0, "load_peak_vs_torch": 1.10}


def _sizes(quick: bool) -> dict[str, Any]:
    return dict(size="25M", repeats=4) if quick else dict(size="100M", repeats=9)


# ----------------------------------------------------------------------------- helpers
def _peak_extra(fn: Callable[[], Any]) -> int | None:
    """Bytes the RSS rose above its level at the start while ``fn()`` ran."""
    gc.collect()
    if not reset_peak_rss():
        return None
    before = proc_status_kb("VmRSS") or 0
    fn()
    return ((proc_status_kb("VmHWM") or 0) - before) * 1024


def _collective_seconds(fn: Callable[[], Any], barrier: Callable[[], None] | None) -> float:
    """Seconds ``fn()`` took until every rank was done (barriers on both sides)."""
    if barrier:
        barrier()
    start = time.perf_counter()
    fn()
    if barrier:
        barrier()
    return time.perf_counter() - start


def _read_seconds(path: Path) -> float:
    """Seconds to read every file of ``path`` from the disk (its pages evicted first)."""
    drop_file_cache(path)
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    start = time.perf_counter()
    for file in files:
        with open(file, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass
    return time.perf_counter() - start


def _rotate(names: list[str], r: int) -> list[str]:
    k = r % len(names)
    return names[k:] + names[:k]


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _async_vs_sync(strategy, work: Path, repeats: int, suffix: str) -> dict[str, list[float]]:
    """The same state saved synchronously and with ``async_save=True``, alternating: the
    seconds until ``save_checkpoint`` returns (training is blocked that long) and, for the
    asynchronous save, until ``wait_for_checkpoint`` returns (the checkpoint is committed).

    Nothing else runs while the background write goes on (in training, the step would share
    the cores with it). On several ranks each rank times its own calls and every repeat's
    figure is the slowest rank's (training goes on at the pace of the slowest).
    """
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    barrier = dist.barrier if distributed else None
    rank = dist.get_rank() if distributed else 0
    # Untimed first: the first asynchronous save creates its dedicated gloo group.
    warmup = work / f"async_warmup{suffix}"
    strategy.save_checkpoint(warmup, async_save=True)
    strategy.wait_for_checkpoint()
    if barrier:
        barrier()
    if rank == 0:
        _remove(warmup)
    runs: dict[str, list[float]] = {"sync": [], "async blocked": [], "async committed": []}
    for r in range(repeats):
        for mode in _rotate(["sync", "async"], r):
            path = work / f"{mode}_{r}{suffix}"
            if barrier:
                barrier()
            start = time.perf_counter()
            if mode == "sync":
                strategy.save_checkpoint(path, async_save=False)
                runs["sync"].append(time.perf_counter() - start)
            else:
                strategy.save_checkpoint(path, async_save=True)
                strategy.wait_for_staging()  # as if the next optimizer step came at once
                runs["async blocked"].append(time.perf_counter() - start)
                strategy.wait_for_checkpoint()
                runs["async committed"].append(time.perf_counter() - start)
            if barrier:
                barrier()
            if rank == 0:
                os.sync()
                _remove(path)
    if not distributed:
        return runs
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, runs)
    return {k: [max(rk[k][i] for rk in every) for i in range(len(v))] for k, v in runs.items()}


def _torch_save(state: dict[str, Any], path: Path, fsync: bool = True) -> None:
    import torch

    with open(path, "wb") as f:
        torch.save(state, f)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def _single_setup(size: str, work: Path):
    """A prepared SingleDeviceStrategy with the model trained one step (optimizer state)."""
    from _models import build_gpt, loss_of, make_batches

    from shardwise.strategies import SingleDeviceStrategy

    quiet_shardwise_logs()
    strategy = SingleDeviceStrategy(work_dir=work, env_kwargs=dict(randomness=dict(seed=0)))
    model, optim_wrapper = strategy.prepare(
        build_gpt(size), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR))
    )
    optim_wrapper.update_params(loss_of(model, make_batches(1, 2, size)[0]))
    return strategy, model, optim_wrapper.optimizer


def _fsdp_setup(size: str, work_dir: str, state_dict_cfg: str):
    """A shardwise FSDP model and a hand-``fully_shard``-ed copy, each trained one step."""
    import copy

    import torch
    import torch.distributed as dist
    from _models import block_class, build_gpt, loss_of, make_batches

    strategy = gpt_fsdp_strategy(work_dir, state_dict_cfg=state_dict_cfg)
    block = block_class()
    base = build_gpt(size)
    batch = make_batches(1, 2, size, seed=dist.get_rank())[0]
    model, optim_wrapper = strategy.prepare(
        copy.deepcopy(base), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR))
    )
    optim_wrapper.update_params(loss_of(model, batch))
    fully_shard_blocks(base, block)
    raw_opt = torch.optim.AdamW(base.parameters(), lr=LR)
    loss_of(base, batch).backward()
    raw_opt.step()
    raw_opt.zero_grad()
    return strategy, model, base, raw_opt


def _model_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# ----------------------------------------------------------------------------- full format
def full_case(
    size: str, work_dir: str, repeats: int, sharded_dir: str | None = None
) -> dict[str, Any]:
    """One process: shardwise's full checkpoint against torch.save, torch.load and the disk;
    an asynchronous save against a synchronous one; and, given ``sharded_dir`` (a sharded
    checkpoint FSDP saved on 2 ranks), its resume on this one rank (resharding)."""
    import torch

    work = Path(work_dir)
    strategy, model, optimizer = _single_setup(size, work)

    def raw_state() -> dict[str, Any]:
        return {"state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}

    # An untimed save first: it warms the code paths and tells the disk bench its byte count.
    warm = work / "warmup.pth"
    strategy.save_checkpoint(warm)
    nbytes = path_bytes(warm)
    _remove(warm)
    savers: dict[str, Callable[[Path], Any]] = {
        "shardwise": strategy.save_checkpoint,
        "torch.save+fsync": lambda p: _torch_save(raw_state(), p),
        "torch.save (page cache)": lambda p: _torch_save(raw_state(), p, fsync=False),
        "disk": lambda p: disk_write_seconds(p, nbytes),
    }
    saves: dict[str, list[float]] = {name: [] for name in savers}
    sizes: dict[str, int] = {}
    for r in range(repeats):
        for name in _rotate(list(savers), r):
            path = work / f"{name.split()[0].replace('+', '_')}_{r}.pth"
            saves[name].append(_collective_seconds(lambda n=name, p=path: savers[n](p), None))
            sizes[name] = path_bytes(path)
            os.sync()  # the next contender starts with no dirty pages of this one
            if r < repeats - 1 or name not in ("shardwise", "torch.save+fsync"):
                _remove(path)
    async_runs = _async_vs_sync(strategy, work, repeats, ".pth")
    sw_file = work / f"shardwise_{repeats - 1}.pth"
    raw_file = work / f"torch.save_fsync_{repeats - 1}.pth"

    def raw_load(with_optimizer: bool) -> None:
        ckpt = torch.load(raw_file, map_location="cpu", weights_only=True)
        model.load_state_dict(ckpt["state_dict"])
        if with_optimizer:
            optimizer.load_state_dict(ckpt["optimizer"])

    loaders: dict[str, tuple[Path, Callable[[], Any]]] = {
        "shardwise load_checkpoint": (sw_file, lambda: strategy.load_checkpoint(sw_file)),
        "shardwise resume": (sw_file, lambda: strategy.resume(sw_file)),
        "torch.load+load_state_dict (weights)": (raw_file, lambda: raw_load(False)),
        "torch.load+load_state_dict (weights+optimizer)": (raw_file, lambda: raw_load(True)),
    }
    loads: dict[str, list[float]] = {name: [] for name in loaders}
    reads = []
    # Twice the save's repeats: a load of the 25M model takes ~0.1 s, and the best of 4 moved
    # by +-7% between runs on the shared disk.
    for r in range(2 * repeats):
        for name in _rotate(list(loaders), r):
            path, fn = loaders[name]
            drop_file_cache(path)
            loads[name].append(_collective_seconds(fn, None))
        reads.append(_read_seconds(sw_file))
    # The resharded resume is held against the 2-rank resume, not against these loads: timed
    # on its own, after them, so that what it leaves (its allocations freed, a different
    # optimizer state) never lands on one of the full contenders (in the rotation above it
    # always preceded the same one, load_checkpoint, which ran 20-30 ms slower for it).
    if sharded_dir is not None:
        resharded = Path(sharded_dir)
        loads[RESHARDED] = []
        for _ in range(repeats):
            drop_file_cache(resharded)
            loads[RESHARDED].append(_collective_seconds(lambda: strategy.resume(resharded), None))
    profiles = {}
    for name, (path, fn) in {
        "save": (None, lambda: strategy.save_checkpoint(work / "profiled.pth")),
        "raw save": (None, lambda: savers["torch.save+fsync"](work / "profiled_raw.pth")),
        "load_checkpoint": (sw_file, lambda: strategy.load_checkpoint(sw_file)),
        "raw load_checkpoint": (raw_file, lambda: raw_load(False)),
        "resume": (sw_file, lambda: strategy.resume(sw_file)),
        "raw resume": (raw_file, lambda: raw_load(True)),
    }.items():
        if path is not None:
            drop_file_cache(path)
        os.sync()
        profiles[name] = profile_call(fn)
    return {
        "file_bytes": sizes,
        "save_runs_s": saves,
        "async_runs_s": async_runs,
        "load_runs_s": loads,
        "disk_read_runs_s": reads,
        "profiles": profiles,
    }


# ----------------------------------------------------------------------------- sharded (FSDP)
def sharded_case(size: str, work_dir: str, repeats: int) -> dict[str, Any]:
    """One rank: FSDPStrategy's sharded checkpoint against raw DCP save and load."""
    import torch.distributed as dist

    strategy, _model, raw_model, raw_opt = _fsdp_setup(size, work_dir, "sharded")
    work = Path(work_dir)
    rank = dist.get_rank()
    savers = {
        "shardwise": strategy.save_checkpoint,
        "dcp": lambda p: _common.dcp_save(raw_model, raw_opt, p),
    }
    saves: dict[str, list[float]] = {name: [] for name in savers}
    sizes: dict[str, int] = {}
    for r in range(repeats):
        for name in _rotate(list(savers), r):
            path = work / f"{name}_sharded_{r}"
            saves[name].append(
                _collective_seconds(lambda n=name, p=path: savers[n](p), dist.barrier)
            )
            if rank == 0:
                sizes[name] = path_bytes(path)
                os.sync()
            dist.barrier()
            if rank == 0 and r < repeats - 1:
                _remove(path)
    async_runs = _async_vs_sync(strategy, work, repeats, "")
    sw_dir, raw_dir = work / f"shardwise_sharded_{repeats - 1}", work / f"dcp_sharded_{repeats - 1}"
    loaders = {
        "shardwise resume": (sw_dir, lambda: strategy.resume(sw_dir)),
        "dcp": (raw_dir, lambda: _common.dcp_load(raw_model, raw_opt, raw_dir)),
    }
    loads: dict[str, list[float]] = {name: [] for name in loaders}
    for r in range(repeats):
        for name in _rotate(list(loaders), r):
            path, fn = loaders[name]
            if rank == 0:
                drop_file_cache(path)
            loads[name].append(_collective_seconds(fn, dist.barrier))
    profiles = {}
    for name, (path, fn) in {
        "save": (None, lambda: strategy.save_checkpoint(work / "profiled")),
        "raw save": (None, lambda: _common.dcp_save(raw_model, raw_opt, work / "profiled_raw")),
        "resume": (sw_dir, lambda: strategy.resume(sw_dir)),
        "raw resume": (raw_dir, lambda: _common.dcp_load(raw_model, raw_opt, raw_dir)),
    }.items():
        if rank == 0 and path is not None:
            drop_file_cache(path)
        dist.barrier()
        profiles[name] = profile_call(fn)
    return {
        "dir_bytes": sizes,
        "save_runs_s": saves,
        "async_runs_s": async_runs,
        "load_runs_s": loads,
        "profiles": profiles,
        "resume_dir": str(sw_dir),
    }


# ----------------------------------------------------------------------------- memory
def memory_full_case(size: str, work_dir: str) -> dict[str, Any]:
    """One fresh process: the RSS each full-format save or load adds at its peak."""
    import torch

    work = Path(work_dir)
    strategy, model, optimizer = _single_setup(size, work)
    sw_file, raw_file = work / "mem_sw.pth", work / "mem_raw.pth"
    peaks: dict[str, int | None] = {}
    peaks["save: shardwise"] = _peak_extra(lambda: strategy.save_checkpoint(sw_file))
    peaks["save: torch.save+fsync"] = _peak_extra(
        lambda: _torch_save(
            {"state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}, raw_file
        )
    )
    held: dict[str, Any] = {}

    def raw_load(with_optimizer: bool) -> None:
        ckpt = torch.load(raw_file, map_location="cpu", weights_only=True)
        model.load_state_dict(ckpt["state_dict"])
        if with_optimizer:
            optimizer.load_state_dict(ckpt["optimizer"])

    peaks["load weights: shardwise load_checkpoint"] = _peak_extra(
        lambda: strategy.load_checkpoint(sw_file)
    )
    peaks["load weights: torch.load+load_state_dict"] = _peak_extra(lambda: raw_load(False))
    peaks["resume: shardwise resume"] = _peak_extra(lambda: strategy.resume(sw_file))
    peaks["resume: torch.load+load_state_dict x2"] = _peak_extra(lambda: raw_load(True))
    # Where a load's memory goes: reading the file, then handing the weights to the model.
    peaks["part: torch.load of the shardwise file"] = _peak_extra(
        lambda: held.update(ckpt=torch.load(sw_file, map_location="cpu", weights_only=True))
    )
    peaks["part: strategy.load_model_state_dict (file already read)"] = _peak_extra(
        lambda: strategy.load_model_state_dict(held["ckpt"]["state_dict"])
    )
    peaks["part: model.load_state_dict (file already read)"] = _peak_extra(
        lambda: model.load_state_dict(held["ckpt"]["state_dict"])
    )
    held.clear()
    # The safetensors export of the full checkpoint streams tensor by tensor: its peak should
    # be the largest tensor, not the model. Baseline: the whole state read, then written.
    from shardwise.checkpoint.convert import convert_checkpoint

    export_s: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Callable[[], None]:
        def call() -> None:
            start = time.perf_counter()
            fn()
            export_s[name] = time.perf_counter() - start

        return call

    # Untimed first: the lazy imports of the first call are not the export's memory.
    convert_checkpoint(sw_file, work / "export_warmup.safetensors", to="safetensors")
    drop_file_cache(sw_file)
    peaks["export: shardwise convert to safetensors"] = _peak_extra(
        timed(
            "shardwise",
            lambda: convert_checkpoint(sw_file, work / "export.safetensors", to="safetensors"),
        )
    )
    # Where the export's memory goes: the manifest hashes the written file back in chunks.
    from shardwise.checkpoint.manifest import file_checksum

    exported = work / "export.safetensors"
    peaks["export part: file_checksum of the exported file (its manifest)"] = _peak_extra(
        lambda: file_checksum(exported)
    )
    try:
        from safetensors.torch import save_file
    except ImportError:
        save_file = None
    if save_file is not None:

        def raw_export() -> None:
            weights = torch.load(sw_file, map_location="cpu", weights_only=True)["state_dict"]
            save_file(weights, str(work / "export_raw.safetensors"))

        drop_file_cache(sw_file)
        peaks["export: torch.load+safetensors save_file"] = _peak_extra(
            timed("torch.load+save_file", raw_export)
        )
    return {
        "model_bytes": _model_bytes(model),
        "largest_tensor_bytes": max(
            t.numel() * t.element_size() for t in model.state_dict().values()
        ),
        "file_bytes": path_bytes(sw_file),
        "export_bytes": path_bytes(work / "export.safetensors"),
        "export_s": export_s,
        "peak_extra_bytes": peaks,
    }


def memory_fsdp_full_case(size: str, work_dir: str) -> dict[str, Any]:
    """One fresh rank: the RSS rank 0 adds while a full checkpoint is gathered and written."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    strategy, _model, raw_model, raw_opt = _fsdp_setup(size, work_dir, "full")
    work = Path(work_dir)
    rank = dist.get_rank()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)

    def raw_full_save() -> None:
        msd, osd = get_state_dict(raw_model, raw_opt, options=options)
        if rank == 0:
            _torch_save({"state_dict": msd, "optimizer": osd}, work / "mem_raw_full.pth")

    peaks: dict[str, int | None] = {}
    seconds: dict[str, float] = {}
    for name, fn in (
        ("shardwise", lambda: strategy.save_checkpoint(work / "mem_sw_full.pth")),
        ("get_state_dict+torch.save", raw_full_save),
    ):
        dist.barrier()
        start = time.perf_counter()
        peaks[name] = _peak_extra(fn)
        dist.barrier()
        seconds[name] = time.perf_counter() - start
    return {
        "rank": rank,
        "model_bytes": _model_bytes(raw_model),  # DTensor.numel() is the global size
        "file_bytes": path_bytes(work / "mem_sw_full.pth") if rank == 0 else None,
        "peak_extra_bytes": peaks,
        "save_s": seconds,
    }


# ----------------------------------------------------------------------------- driver side
def _best(runs: dict[str, list[float]]) -> dict[str, float]:
    return {k: min(v) for k, v in runs.items()}


def _medians(runs: dict[str, list[float]]) -> dict[str, float]:
    return {k: median(v) for k, v in runs.items()}


def _derive_full(r0: dict[str, Any]) -> dict[str, Any]:
    save, load = _best(r0["save_runs_s"]), _best(r0["load_runs_s"])
    nbytes = r0["file_bytes"]
    return {
        **r0,
        **_derive_async(r0["async_runs_s"]),
        "save_s": save,
        "save_median_s": _medians(r0["save_runs_s"]),
        "save_gbps": {k: nbytes[k] / GB / s for k, s in save.items()},
        "load_s": load,
        "load_median_s": _medians(r0["load_runs_s"]),
        "disk_read_s": min(r0["disk_read_runs_s"]),
        "disk_read_gbps": nbytes["shardwise"] / GB / min(r0["disk_read_runs_s"]),
        "ratios": {
            "save vs torch.save+fsync": ratio(save["shardwise"], save["torch.save+fsync"]),
            "save vs disk write": ratio(save["shardwise"], save["disk"]),
            "load_checkpoint vs torch.load+load_state_dict": ratio(
                load["shardwise load_checkpoint"], load["torch.load+load_state_dict (weights)"]
            ),
            "resume vs torch.load+load_state_dict x2": ratio(
                load["shardwise resume"], load["torch.load+load_state_dict (weights+optimizer)"]
            ),
        },
    }


def _derive_async(runs: dict[str, list[float]]) -> dict[str, Any]:
    best = _best(runs)
    return {
        "async_s": best,
        "async_median_s": _medians(runs),
        "async_ratios": {
            "blocked vs sync save": ratio(best["async blocked"], best["sync"]),
            "committed vs sync save": ratio(best["async committed"], best["sync"]),
        },
    }


def _derive_sharded(r0: dict[str, Any]) -> dict[str, Any]:
    save, load = _best(r0["save_runs_s"]), _best(r0["load_runs_s"])
    return {
        **r0,
        **_derive_async(r0["async_runs_s"]),
        "save_s": save,
        "save_median_s": _medians(r0["save_runs_s"]),
        "save_gbps": {k: r0["dir_bytes"][k] / GB / s for k, s in save.items()},
        "load_s": load,
        "load_median_s": _medians(r0["load_runs_s"]),
        "ratios": {
            "save vs dcp.save": ratio(save["shardwise"], save["dcp"]),
            "resume vs dcp.load+set_state_dict": ratio(load["shardwise resume"], load["dcp"]),
        },
    }


def run(quick: bool = True) -> dict[str, Any]:
    from _models import count_params

    cfg = _sizes(quick)
    size = cfg["size"]
    out: dict[str, Any] = {"model": size, "model_params": count_params(size), "targets": TARGETS}
    FSDPStrategy, why = fsdp_strategy_class()
    only_size = {"size": size}
    # The sharded case runs first and leaves its checkpoint for the full case, which resumes
    # it on one rank (resharding) beside its own loads.
    cases: list[tuple[str, int, dict[str, Any], dict[str, str] | None, Callable | None]] = [
        ("sharded", 2, cfg, None, _derive_sharded),
        ("full", 1, cfg, None, _derive_full),
        ("memory_full", 1, only_size, MEMORY_ENV, None),
        ("memory_fsdp_full", 2, only_size, MEMORY_ENV, None),
    ]
    keep: list[str] = []
    try:
        for case, world_size, kwargs, env, derive in cases:
            target = f"checkpoint_io:{case}_case"
            if world_size > 1 and FSDPStrategy is None:
                out[case] = {"status": "not available", "reason": why}
                continue
            skipped = out_of_time(20)
            if skipped:
                out[case] = skipped
                continue
            work_dir = tempfile.mkdtemp(prefix="shardwise-bench-ckpt-")
            if case == "full" and out.get("sharded", {}).get("status") == "ok":
                kwargs = {**kwargs, "sharded_dir": out["sharded"]["resume_dir"]}
            try:
                results = run_ranks(
                    target, world_size, dict(work_dir=work_dir, **kwargs), timeout=600, env=env
                )
                out[case] = {"status": "ok", **(derive(results[0]) if derive else results[0])}
            except Exception as exc:  # noqa: BLE001 - one case's failure is its result
                out[case] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            if case == "sharded" and out[case]["status"] == "ok":
                keep.append(work_dir)
            else:
                shutil.rmtree(work_dir, ignore_errors=True)
    finally:
        for work_dir in keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    full, sharded = out.get("full", {}), out.get("sharded", {})
    if full.get("status") == "ok" and RESHARDED in full["load_s"]:
        one, two = full["load_s"][RESHARDED], sharded["load_s"]["shardwise resume"]
        out["reshard"] = {
            "status": "ok",
            "resume_1_rank_s": one,
            "resume_2_ranks_s": two,
            "full_resume_1_rank_s": full["load_s"]["shardwise resume"],
            "ratio": ratio(one, two),
        }
    else:
        reason = "the sharded or the full case did not run"
        out["reshard"] = {"status": "not run", "reason": reason}
    return out


if __name__ == "__main__":
    section_main("checkpoint_io", run)
