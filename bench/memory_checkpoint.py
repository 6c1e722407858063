"""The memory tier (``memory_checkpoint``) on the 25M GPT with AdamW (~305 MB of state),
each figure against its baseline measured in the same run, on this machine:

1. **added step time, one process** (one intra-op thread: the other core is free for the
   snapshot's copy, write and bookkeeping): training steps with a snapshot after every step
   against the same steps without, alternating in blocks (ABBA) on one prepared strategy.
   Target: <= 3.5 % (Gemini's figure).
2. **added step time, 2 ranks** (one thread each: both cores train, none is free): FSDP over
   gloo, each rank its own failure domain (``failure_domain=1``: the snapshot replicated to the
   other rank), a snapshot every step, and every 10 steps, against no snapshot; the floor is a
   plain copy of the same bytes (each rank's state into preallocated buffers, timed on the
   same ranks between the blocks). Targets: added time <= 1.2x the copy (every step), <= 3.5 %
   (every 10 steps).
3. **an asynchronous storage save's added loop time, one process**: a 12-step loop with a save
   after steps 4 and 8 (to the local disk, sharded) against the same loop without saves, and
   with synchronous saves, the three side by side in each round; the ratio of the median
   over rounds of (async loop - that round's loop without) to that of the sync loop's.
   Target: <= 0.1.
4. **recovery after a node loss** (2 ranks, one a node; node 1's memory removed): a restarted
   run's seconds from its start to the end of its first step, resuming from memory (the
   snapshot gathered from rank 0's own memory and the replica it holds for rank 1), from the
   disk (the sharded checkpoint of the same step, its pages evicted from the page cache), and
   from ``s3://`` (moto's server in this process), with the bytes each tier read or received.

    python bench/memory_checkpoint.py --out memory_checkpoint.json      # ~15 min on 2 cores
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from _common import (
    drop_file_cache,
    gpt_fsdp_strategy,
    median,
    path_bytes,
    ratio,
    run_ranks,
    section_main,
)

SIZE = "25M"
BATCH = 8
TARGETS = {"one process": 0.035, "two ranks every step / copy": 1.2, "two ranks every 10": 0.035}
ASYNC_TARGET = 0.1
#: The steps of the 12-step loop after which it saves: every 4 steps, but not after the last
#: (an asynchronous save's wait there would hold the loop for its whole write: the steps after
#: a save are what it overlaps)
SAVE_AT = (4, 8)


def _prepare(work_dir: str, memory: dict[str, Any] | None, **kwargs: Any):
    import torch
    from _models import PRESETS, build_gpt, make_batches

    strategy = gpt_fsdp_strategy(work_dir, memory_checkpoint=memory, **kwargs)
    model, wrapper = strategy.prepare(
        build_gpt(SIZE), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=3e-4))
    )
    batches = make_batches(8, BATCH, PRESETS[SIZE], seed=strategy.rank)
    torch.manual_seed(0)
    return strategy, model, wrapper, batches


def _step(model, wrapper, batches, i: int) -> float:
    from _models import loss_of

    with wrapper.optim_context(model):
        loss = loss_of(model, batches[i % len(batches)])
    wrapper.update_params(loss)
    return float(loss)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _state_bytes(strategy) -> int:
    from torch.distributed.tensor import DTensor

    from shardwise.tree import map_tensors

    total = [0]

    def count(t):
        local = t.to_local() if isinstance(t, DTensor) else t
        total[0] += local.numel() * local.element_size()
        return t

    map_tensors(count, strategy.checkpointer.state())
    return total[0]


def _plain_copy_s(strategy, repeats: int = 3) -> float:
    """The floor: this rank's state tensors copied into preallocated buffers."""
    import torch
    from torch.distributed.tensor import DTensor

    from shardwise.tree import map_tensors

    tensors: list[torch.Tensor] = []
    map_tensors(
        lambda t: tensors.append(t.to_local() if isinstance(t, DTensor) else t),
        strategy.checkpointer.state(),
    )
    buffers = [torch.empty_like(t) for t in tensors]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for buffer, t in zip(buffers, tensors, strict=True):
            buffer.copy_(t)
        times.append(time.perf_counter() - start)
    return min(times)


def _exchange_s(strategy, repeats: int = 3) -> float | None:
    """The transfer floor of replication here: this rank's state bytes sent to its peer while
    the peer's are received (the tier's gloo group, nothing else running); None alone."""
    import torch
    import torch.distributed as dist

    from shardwise.checkpoint.memory import _exchange

    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    size = _state_bytes(strategy)
    out, back = torch.empty(size, dtype=torch.uint8), torch.empty(size, dtype=torch.uint8)
    rank, world = dist.get_rank(), dist.get_world_size()
    group = strategy.checkpointer.memory.stager.group()
    times = []
    for _ in range(repeats):
        _barrier()
        start = time.perf_counter()
        _exchange([out], [back], (rank + 1) % world, (rank - 1) % world, group)
        times.append(time.perf_counter() - start)
    return min(times)


def overhead(root: str, intervals: list[int], rounds: int, per_round: int) -> dict[str, Any]:
    """One rank: blocks of ``per_round`` steps without snapshots and with a snapshot every
    ``interval`` steps (each interval in ``intervals``), alternating; per-step seconds."""
    memory = dict(interval=1, replicas=1, dir=os.path.join(root, "shm{domain}"), failure_domain=1)
    strategy, model, wrapper, batches = _prepare(os.path.join(root, "work"), memory)
    tier = strategy.checkpointer.memory
    counter = [0]

    def run_block(interval: int | None) -> list[float]:
        times = []
        for _ in range(per_round):
            _barrier()
            start = time.perf_counter()
            _step(model, wrapper, batches, counter[0])
            counter[0] += 1
            if interval is not None and counter[0] % interval == 0:
                tier.snapshot(counter[0], {})
            times.append(time.perf_counter() - start)
        tier.wait()
        return times

    for interval in [None, *intervals]:  # warm-up: buffers, the group, the page cache of shm
        run_block(interval)
    times: dict[str, list[float]] = {"none": [], **{f"every {i}": [] for i in intervals}}
    names = list(times)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            interval = None if name == "none" else int(name.split()[1])
            times[name] += run_block(interval)
    return dict(
        times=times,
        state_bytes=_state_bytes(strategy),
        copy_s=_plain_copy_s(strategy),
        exchange_s=_exchange_s(strategy),
        blocked_s=tier.blocked_s / max(tier.snapshots, 1),
        write_s=tier.seconds["write"] / max(tier.snapshots, 1),
        replicate_s=tier.seconds["replicate"] / max(tier.snapshots, 1),
    )


def async_loop(root: str, repeats: int) -> dict[str, Any]:
    """One process: a 12-step loop with a save after steps 4 and 8 (none, async, sync),
    alternating; each loop's seconds (the loop ends when the last save is committed)."""
    strategy, model, wrapper, batches = _prepare(
        os.path.join(root, "work"), None, state_dict_cfg="sharded"
    )

    def loop(mode: str, tag: int) -> float:
        start = time.perf_counter()
        for i in range(12):
            _step(model, wrapper, batches, i)
            if mode != "none" and (i + 1) in SAVE_AT:
                strategy.save_checkpoint(
                    f"{mode}_{tag}_{i}", async_save=mode == "async", max_keep_ckpts=2, series=mode
                )
        strategy.wait_for_checkpoint()
        return time.perf_counter() - start

    for mode in ("none", "async", "sync"):
        loop(mode, -1)
    times: dict[str, list[float]] = {"none": [], "async": [], "sync": []}
    for r in range(repeats):
        for mode in ("none", "async", "sync") if r % 2 == 0 else ("sync", "async", "none"):
            times[mode].append(loop(mode, r))
    return times


def recovery(root: str, shm: str, tier: str, url: str | None) -> dict[str, Any]:
    """One rank of a restarted run after node 1's loss: seconds to the end of its first step,
    and what it read (memory: from its node and from peers; storage: the checkpoint's bytes)."""
    start = time.perf_counter()
    memory = dict(interval=1, replicas=1, dir=os.path.join(shm, "shm{domain}"), failure_domain=1)
    work_dir = url if tier == "s3" else os.path.join(root, "work")
    strategy, model, wrapper, batches = _prepare(
        work_dir, memory if tier == "memory" else None, state_dict_cfg="sharded"
    )
    prepared = time.perf_counter()
    read: dict[str, Any] = {}
    if tier == "memory":
        resumed = strategy.checkpointer.load_or_resume(resume=True)
        read["tier"] = (
            "memory" if resumed and "memory_step" in resumed.get("meta", {}) else "storage"
        )
        gathered = strategy.checkpointer.memory.recovered
        read.update(local_mb=gathered.local_bytes / 1e6, fetched_mb=gathered.fetched_bytes / 1e6)
    else:
        strategy.resume(f"{work_dir}/iter_4")
        read["tier"] = tier
    resumed_at = time.perf_counter()
    _step(model, wrapper, batches, 5)
    _barrier()
    end = time.perf_counter()
    return dict(
        to_first_step_s=end - start,
        build_s=prepared - start,
        resume_s=resumed_at - prepared,
        **read,
    )


def snapshot_and_save(root: str, shm: str, url: str | None) -> dict[str, Any]:
    """The run that is lost: 4 steps, a memory snapshot every step, a sharded checkpoint of
    step 4 to the disk (and to ``url``)."""
    memory = dict(interval=1, replicas=1, dir=os.path.join(shm, "shm{domain}"), failure_domain=1)
    strategy, model, wrapper, batches = _prepare(
        os.path.join(root, "work"), memory, state_dict_cfg="sharded"
    )
    tier = strategy.checkpointer.memory
    for i in range(4):
        _step(model, wrapper, batches, i)
        tier.snapshot(i + 1, {})
    tier.wait()
    strategy.save_checkpoint(os.path.join(root, "work", "iter_4"))
    if url:
        strategy.save_checkpoint(f"{url}/iter_4")
    return {}


# ---------------------------------------------------------------------- the driver
def _per_round(
    times: dict[str, list[float]], base: str, rounds: int, per_round: int
) -> dict[str, list[float]]:
    """Per contender, each round's (its block's median step / the base block's) - 1."""
    out = {}
    for name, ts in times.items():
        if name == base:
            continue
        out[name] = [
            median(ts[r * per_round : (r + 1) * per_round])
            / median(times[base][r * per_round : (r + 1) * per_round])
            - 1
            for r in range(rounds)
        ]
    return out


def _ratios(
    times: dict[str, list[float]], base: str, rounds: int, per_round: int
) -> dict[str, float]:
    """Per contender, the median over rounds of (its block's median step / the base block's)
    - 1: the added step time."""
    return {n: median(per) for n, per in _per_round(times, base, rounds, per_round).items()}


def _slowest(results: list[dict[str, Any]], key: str = "times") -> dict[str, list[float]]:
    names = results[0][key]
    return {
        n: [max(r[key][n][i] for r in results) for i in range(len(results[0][key][n]))]
        for n in names
    }


def _s3_server():
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        return None
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        FSSPEC_S3_ENDPOINT_URL=f"http://127.0.0.1:{port}",
    )
    import boto3

    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}").create_bucket(Bucket="bench")
    return server


def run(quick: bool = True) -> dict[str, Any]:
    # ~15 min on 2 cores (run_all runs it in --full only); one process: 16 rounds of 4 steps
    # (a step's time varies by 5-10 % here, more than the figure measured: a round's figure
    # spreads over several percent, and 8 rounds' medians differed by 3 points between runs)
    rounds, one_rounds = 4, 16
    result: dict[str, Any] = {"size": SIZE, "batch": BATCH}
    with tempfile.TemporaryDirectory(prefix="shardwise-bench-memory-", dir="/dev/shm") as root:
        one = run_ranks(
            "memory_checkpoint:overhead",
            1,
            dict(root=os.path.join(root, "one"), intervals=[1], rounds=one_rounds, per_round=4),
            timeout=1800,
        )[0]
        per = _per_round(one["times"], "none", one_rounds, 4)["every 1"]
        quartiles = statistics.quantiles(per, n=4)
        result["one_process"] = dict(
            added=median(per),
            rounds=one_rounds,
            added_iqr=[quartiles[0], quartiles[2]],
            step_s=median(one["times"]["none"]),
            snapshot_step_s=median(one["times"]["every 1"]),
            state_mb=one["state_bytes"] / 1e6,
            blocked_s=one["blocked_s"],
            write_s=one["write_s"],
            target=TARGETS["one process"],
        )
        shutil.rmtree(os.path.join(root, "one"), ignore_errors=True)
        two = run_ranks(
            "memory_checkpoint:overhead",
            2,
            dict(
                root=os.path.join(root, "two"),
                intervals=[1, 10],
                rounds=rounds,
                per_round=10,
            ),
            timeout=2400,
        )
        per = 10
        times = _slowest(two)
        added = _ratios(times, "none", rounds, per)
        step = median(times["none"])
        copy_s = max(r["copy_s"] for r in two)
        result["two_ranks"] = dict(
            step_s=step,
            every1_step_s=median(times["every 1"]),
            every10_step_s=median(times["every 10"]),
            added_every1=added["every 1"],
            added_every10=added["every 10"],
            added_every1_s=added["every 1"] * step,
            copy_s=copy_s,
            over_copy=added["every 1"] * step / copy_s,
            exchange_s=max(r["exchange_s"] for r in two),
            state_mb_per_rank=max(r["state_bytes"] for r in two) / 1e6,
            write_s=max(r["write_s"] for r in two),
            replicate_s=max(r["replicate_s"] for r in two),
            targets=dict(
                over_copy=TARGETS["two ranks every step / copy"],
                every10=TARGETS["two ranks every 10"],
            ),
        )
        shutil.rmtree(os.path.join(root, "two"), ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="shardwise-bench-memory-") as disk:
        loops = run_ranks(
            "memory_checkpoint:async_loop",
            1,
            dict(root=disk, repeats=3 if quick else 10),
            timeout=1800,
        )[0]
        # each round's loops side by side (the machine's pace drifts by more than a save
        # costs over a run of rounds): the median over rounds of each contender's time added
        # to that round's loop without saves
        none = median(loops["none"])
        added = {
            m: median([t - n for t, n in zip(loops[m], loops["none"], strict=True)])
            for m in ("async", "sync")
        }
        result["async_save"] = dict(
            loop_none_s=none,
            loop_async_s=none + added["async"],
            loop_sync_s=none + added["sync"],
            added_async=added["async"] / none,
            added_sync=added["sync"] / none,
            ratio=ratio(added["async"], added["sync"]),
            target=ASYNC_TARGET,
        )
    result["recovery"] = _recovery()
    return result


def _recovery() -> dict[str, Any]:
    server = _s3_server()
    url = None if server is None else "s3://bench/memory-recovery"
    out: dict[str, Any] = {"s3": "moto[server] is not installed" if server is None else "moto"}
    with (
        tempfile.TemporaryDirectory(prefix="shardwise-bench-recovery-", dir="/dev/shm") as shm,
        tempfile.TemporaryDirectory(prefix="shardwise-bench-recovery-") as root,
    ):  # the memory tier in /dev/shm, the storage checkpoint on the disk
        args = dict(root=root, shm=shm, url=url)
        run_ranks("memory_checkpoint:snapshot_and_save", 2, args, timeout=1200)
        shutil.rmtree(os.path.join(shm, "shm1"))  # node 1 is lost, and its memory
        checkpoint = os.path.join(root, "work", "iter_4")
        checkpoint_bytes = path_bytes(checkpoint)
        for tier in ("memory", "disk", *(["s3"] if url else [])):
            drop_file_cache(checkpoint)  # a restarted job reads storage, not the page cache
            ranks = run_ranks("memory_checkpoint:recovery", 2, dict(args, tier=tier), timeout=1200)
            out[tier] = dict(
                to_first_step_s=max(r["to_first_step_s"] for r in ranks),
                build_s=max(r["build_s"] for r in ranks),
                resume_s=max(r["resume_s"] for r in ranks),
                resumed_from=ranks[0]["tier"],
            )
            if tier == "memory":  # what the ranks gathered: from their own node, from peers
                for key in ("local_mb", "fetched_mb"):
                    out[tier][key] = sum(r[key] for r in ranks)
        out["checkpoint_mb"] = checkpoint_bytes / 1e6
    if server is not None:
        server.stop()
    return out


if __name__ == "__main__":
    section_main("memory_checkpoint", run)
