"""Scale: how step, save and load times grow with the model size and the world size.

Sizes: 10M, 100M and 1B parameters. World sizes 1, 2, 4:
one process with ``SingleDeviceStrategy`` (full checkpoint), ``DDPStrategy`` on 2 and 4 ranks
(full checkpoint, written by rank 0) and ``FSDPStrategy`` on 2 and 4 ranks (sharded checkpoint,
model built on the meta device and initialised shard by shard), one intra-op thread per rank.
Note that this machine's cores bound it: 4 ranks share 2 cores. ``--quick`` (``make bench``,
10 minutes in all) leaves out 100M on 4 ranks, which alone takes minutes here, and runs 1B on
FSDP with 2 ranks only. The 1B rows train with plain SGD: AdamW's two moments would take the
state to 18 GB, more than this machine's 24 GB leave to a run, so their checkpoints hold the
weights alone (4 bytes per parameter against AdamW's 12), and they run without the raw copy.

Every figure has its baseline from the same processes: the step against the raw PyTorch loop
(plain module / ``DistributedDataParallel`` / ``fully_shard``, interleaved), the save against
writing the same bytes with ``os.write`` + ``fsync`` (every rank its share, at once), the load
(``resume``: weights, optimizer, RNG) against reading the checkpoint's files after evicting
them from the page cache. A configuration whose memory estimate does not fit this machine runs
without the raw copy, or is skipped, and says so.

Writes the table's data and ``bench/scale.png``. ``SHARDWISE_SCALE_ROWS`` (e.g.
``1B:fsdp:2,10M:fsdp:4``) runs only those rows (a single row's re-measurement; its JSON goes
to ``--out``, not into RESULTS.md).

    python bench/scale.py --quick
    SHARDWISE_SCALE_ROWS=1B:fsdp:2 python bench/scale.py --quick --out /tmp/scale_1b.json
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    BENCH,
    GB,
    _meminfo_kb,
    disk_write_seconds,
    drop_file_cache,
    fsdp_strategy_class,
    fully_shard_blocks,
    init_gloo,
    interleaved_steps,
    median,
    out_of_time,
    path_bytes,
    quiet_shardwise_logs,
    ratio,
    run_ranks,
    section_main,
)

LR = 3e-4
BATCH = 2
CHART = BENCH / "scale.png"


LAYOUTS = [("single", 1), ("ddp", 2), ("fsdp", 2), ("ddp", 4), ("fsdp", 4)]


def _plan(quick: bool) -> list[tuple[str, str, int]]:
    """``(size, strategy, world size)`` of every row."""
    rows = [(size, kind, n) for size in ("10M", "100M") for kind, n in LAYOUTS]
    rows += [("1B", "fsdp", 2)] if quick else [("1B", k, n) for k, n in LAYOUTS]
    only = os.environ.get("SHARDWISE_SCALE_ROWS")
    if only:
        wanted = {tuple(row.split(":")) for row in only.split(",")}
        rows = [r for r in rows if (r[0], r[1], str(r[2])) in wanted]
    return rows


def _optimizer(params: int) -> str:
    return "SGD" if params > 5e8 else "AdamW"  # see the module docstring


def _batch(params: int) -> int:
    return 1 if params > 5e8 else BATCH  # a 1B step on 2 cores: ~25 s per sequence


def _memory_plan(params: int, kind: str, world_size: int) -> tuple[bool, str | None]:
    """``(with_raw, skip_reason)`` from an estimate of the bytes all ranks together need:
    per replica 16 bytes/parameter (fp32 weights, gradients, AdamW's two moments; 8 with
    SGD), once for shardwise and once for the raw copy, plus a full checkpoint read on every
    rank (12 bytes/parameter, 4 with SGD) unless sharded."""
    available = (_meminfo_kb("MemAvailable") or 0) * 1024 * 0.7
    adamw = _optimizer(params) == "AdamW"
    per_copy = (16 if adamw else 8) * params * (1 if kind == "fsdp" else world_size)
    load = 0 if kind == "fsdp" else (12 if adamw else 4) * params * world_size
    if 2 * per_copy + load <= available:
        return True, None
    if per_copy + load <= available:
        return False, None
    need = (per_copy + load) / GB
    return False, (
        f"needs ~{need:.0f} GB (16 B/param per replica + checkpoint reads), "
        f"{available / GB:.0f} GB usable here"
    )


def _cost_guess(params: int, kind: str, world_size: int) -> float:
    """Seconds a configuration took on the 2-core machine of RESULTS.md (roughly)."""
    per_100m = {"single": 12, "ddp": 30, "fsdp": 25}[kind] * (1.5 if world_size == 4 else 1)
    return 6 + per_100m * params / 1e8 / (3 if params > 5e8 else 1)  # 1B: batch 1, SGD


# ----------------------------------------------------------------------------- rank side
def scale_case(size: str, kind: str, work_dir: str, with_raw: bool, steps: int, saves: int) -> dict:
    """One rank: prepare, interleaved steps (shardwise vs raw), save vs the disk's write
    floor, resume vs the disk's read floor."""
    import torch
    import torch.distributed as dist
    from _models import block_class, build_gpt, count_params, loss_of, make_batches

    from shardwise.strategies import DDPStrategy, SingleDeviceStrategy

    quiet_shardwise_logs()
    init_gloo()
    distributed = dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1

    def barrier() -> None:
        if distributed:
            dist.barrier()

    env_kwargs = dict(randomness=dict(seed=0))
    params = count_params(size)
    optimizer = _optimizer(params)
    optim_cfg = dict(optimizer=dict(type=optimizer, lr=LR))
    start = time.perf_counter()
    if kind == "fsdp":
        FSDPStrategy, _ = fsdp_strategy_class()
        strategy = FSDPStrategy(
            work_dir=work_dir,
            env_kwargs=env_kwargs,
            model_wrapper=dict(auto_wrap_policy={block_class()}),
            state_dict_cfg="sharded",
            skip_init_weights=True,
        )
        model = build_gpt(size, device="meta")
    else:
        cls = SingleDeviceStrategy if kind == "single" else DDPStrategy
        strategy = cls(work_dir=work_dir, env_kwargs=env_kwargs)
        model = build_gpt(size)
    sw_model, optim_wrapper = strategy.prepare(model, optim_wrapper=optim_cfg)
    barrier()
    prepare_s = time.perf_counter() - start
    batches = make_batches(4, _batch(params), size, seed=1 + rank)

    def shardwise_step(i: int) -> None:
        with optim_wrapper.optim_context(sw_model):
            loss = loss_of(sw_model, batches[i % len(batches)])
        optim_wrapper.update_params(loss)

    step_fns = {"shardwise": shardwise_step}
    if with_raw:
        raw_model = build_gpt(size)
        if kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            raw_model = DistributedDataParallel(raw_model)
        elif kind == "fsdp":
            fully_shard_blocks(raw_model, block_class())
        raw_opt = getattr(torch.optim, optimizer)(raw_model.parameters(), lr=LR)

        def raw_step(i: int) -> None:
            loss_of(raw_model, batches[i % len(batches)]).backward()
            raw_opt.step()
            raw_opt.zero_grad()

        step_fns["raw"] = raw_step
    times = interleaved_steps(
        step_fns, warmup=1, rounds=steps, per_round=1, barrier=barrier if distributed else None
    )

    work = Path(work_dir)
    path = work / f"{size}_{kind}_{world_size}.ckpt"
    floor = work / f"floor_{rank}.bin"
    save_runs, floor_runs, share = [], [], 0
    for _ in range(saves):  # best of N: this machine's disk is shared and its speed jumps
        if path.exists() and rank == 0:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        barrier()
        t0 = time.perf_counter()
        strategy.save_checkpoint(path)
        barrier()
        save_runs.append(time.perf_counter() - t0)
        if not share:
            total_bytes = path_bytes(path) if rank == 0 else 0
            total_bytes = _broadcast_int(total_bytes, distributed)
            share = total_bytes // (world_size if kind == "fsdp" else 1)
        barrier()
        t0 = time.perf_counter()
        if kind == "fsdp" or rank == 0:  # the floor writes what each rank wrote
            disk_write_seconds(floor, share)
        barrier()
        floor_runs.append(time.perf_counter() - t0)
        floor.unlink(missing_ok=True)
    save_s, floor_write_s = min(save_runs), min(floor_runs)

    if rank == 0:
        drop_file_cache(path)
    barrier()
    t0 = time.perf_counter()
    strategy.resume(path)
    barrier()
    load_s = time.perf_counter() - t0
    if rank == 0:
        drop_file_cache(path)
    barrier()
    t0 = time.perf_counter()
    _read_all(path, rank, world_size, sharded=kind == "fsdp")
    barrier()
    floor_read_s = time.perf_counter() - t0
    barrier()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return {
        "rank": rank,
        "optimizer": optimizer,
        "prepare_s": prepare_s,
        "step_s": {k: median(v) for k, v in times.items()},
        "step_runs_s": times,
        "save_s": save_s,
        "save_runs_s": save_runs,
        "floor_write_s": floor_write_s,
        "floor_write_runs_s": floor_runs,
        "load_s": load_s,
        "floor_read_s": floor_read_s,
        "bytes": total_bytes,
        "peak_rss_gb": _peak_rss_gb(),
    }


def _broadcast_int(value: int, distributed: bool) -> int:
    if not distributed:
        return value
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(t, src=0)
    return int(t.item())


def _read_all(path: Path, rank: int, world_size: int, sharded: bool) -> None:
    """What a loader must read at least: each rank its share of a sharded directory's files,
    or the whole file on every rank for a full checkpoint (every rank loads it)."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    if sharded:
        files = files[rank::world_size]
    for file in files:
        with open(file, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass


def _peak_rss_gb() -> float:
    from _common import proc_status_kb

    return round((proc_status_kb("VmHWM") or 0) / 2**20, 2)


# ----------------------------------------------------------------------------- driver side
def run(quick: bool = True) -> dict[str, Any]:
    from _models import count_params

    FSDPStrategy, why = fsdp_strategy_class()
    rows: list[dict[str, Any]] = []
    for size, kind, world_size in _plan(quick):
        params = count_params(size)
        row: dict[str, Any] = {
            "size": size,
            "params": params,
            "strategy": kind,
            "world_size": world_size,
        }
        rows.append(row)
        if kind == "fsdp" and FSDPStrategy is None:
            row.update(status="not available", reason=why)
            continue
        with_raw, skip = _memory_plan(params, kind, world_size)
        if skip:
            row.update(status="skipped", reason=skip)
            continue
        if quick and world_size == 4 and params > 5e7:
            # 4 ranks of 100M on 2 cores take minutes: `make bench` has 10 in all
            row.update(status="not run", reason="quick mode (time); --full runs it")
            continue
        late = out_of_time(_cost_guess(params, kind, world_size))
        if late:
            row.update(late)
            continue
        raw_note = None
        if quick and with_raw and params > 5e8:
            with_raw, raw_note = False, "no raw copy in quick mode (time)"
        steps = 3 if params < 5e7 else (2 if world_size <= 2 and params < 5e8 else 1)
        saves = 2 if params < 5e7 else 1
        work_dir = tempfile.mkdtemp(prefix="shardwise-bench-scale-")
        try:
            results = run_ranks(
                "scale:scale_case",
                world_size,
                dict(
                    size=size,
                    kind=kind,
                    work_dir=work_dir,
                    with_raw=with_raw,
                    steps=steps,
                    saves=saves,
                ),
                timeout=1800 if params > 5e8 else 600,
            )
            r0 = results[0]
            row.update(
                status="ok",
                optimizer=r0["optimizer"],
                batch=_batch(params),
                with_raw=with_raw,
                raw_note=raw_note,
                prepare_s=r0["prepare_s"],
                step_s=r0["step_s"]["shardwise"],
                raw_step_s=r0["step_s"].get("raw"),
                step_ratio=ratio(r0["step_s"]["shardwise"], r0["step_s"].get("raw")),
                save_s=r0["save_s"],
                floor_write_s=r0["floor_write_s"],
                save_ratio=ratio(r0["save_s"], r0["floor_write_s"]),
                load_s=r0["load_s"],
                floor_read_s=r0["floor_read_s"],
                load_ratio=ratio(r0["load_s"], r0["floor_read_s"]),
                ckpt_gb=r0["bytes"] / GB,
                peak_rss_gb_per_rank=[r["peak_rss_gb"] for r in results],
            )
        except Exception as exc:  # noqa: BLE001 - one configuration's failure is its row
            row.update(status="error", error=f"{type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)
    chart = _chart(rows)
    return {"batch": BATCH, "rows": rows, "chart": chart}


def _chart(rows: list[dict[str, Any]]) -> str | None:
    """``bench/scale.png``: step, save and load time against the parameter count (top row,
    one line per strategy and world size) and against the world size (bottom row, one line
    per strategy and model size; world size 1 is SingleDeviceStrategy); baselines dashed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        return None
    ok = [r for r in rows if r.get("status") == "ok"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    panels = [
        ("step_s", "raw_step_s", "step time (s)"),
        ("save_s", "floor_write_s", "save time (s)"),
        ("load_s", "floor_read_s", "resume time (s)"),
    ]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def lines(ax, groups, x_key, key, base):
        for i, (label, members) in enumerate(groups):
            pts = sorted((r[x_key], r[key], r.get(base)) for r in members)
            color = colors[i % len(colors)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=label)
            basepts = [(p[0], p[2]) for p in pts if p[2] is not None]
            if basepts:
                xs, ys = zip(*basepts)
                ax.plot(xs, ys, "x--", color=color, alpha=0.45)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)

    layouts = sorted({(r["strategy"], r["world_size"]) for r in ok}, key=lambda k: (k[1], k[0]))
    by_layout = [
        (f"{kind} x{ws}", [r for r in ok if (r["strategy"], r["world_size"]) == (kind, ws)])
        for kind, ws in layouts
    ]
    by_size = []
    for size in sorted(
        {r["size"] for r in ok}, key=lambda s: min(r["params"] for r in ok if r["size"] == s)
    ):
        single = [r for r in ok if r["size"] == size and r["strategy"] == "single"]
        for kind in ("ddp", "fsdp"):
            members = single + [r for r in ok if r["size"] == size and r["strategy"] == kind]
            if len(members) > len(single):
                by_size.append((f"{kind} {size}", members))
    for col, (key, base, title) in enumerate(panels):
        top, bottom = axes[0][col], axes[1][col]
        lines(top, by_layout, "params", key, base)
        top.set_xscale("log")
        top.set_xlabel("parameters")
        top.set_title(f"{title} vs model size")
        lines(bottom, by_size, "world_size", key, base)
        bottom.set_xticks([1, 2, 4])
        bottom.set_xlabel("world size (ranks; 1 = SingleDeviceStrategy)")
        bottom.set_title(f"{title} vs world size")
    dashed = Line2D(
        [], [], color="gray", linestyle="--", marker="x", label="baseline (same colour)"
    )
    for row in (0, 1):
        handles, labels = axes[row][0].get_legend_handles_labels()
        axes[row][0].legend(handles + [dashed], labels + [dashed.get_label()], fontsize=7)
    fig.suptitle(
        "shardwise (solid) against its same-run baselines (dashed): raw loop / disk write / "
        "disk read"
    )
    fig.tight_layout()
    fig.savefig(CHART, dpi=100)
    plt.close(fig)
    return str(CHART.relative_to(BENCH.parent))


if __name__ == "__main__":
    section_main("scale", run)
