"""Peer: the same model under Lightning Fabric's ``ModelParallelStrategy`` (FSDP2), side by side
with shardwise's ``FSDPStrategy`` and with ``fully_shard`` applied by hand, on 2 CPU ranks.

All contenders live in the same two processes (gloo), start from the same weights, shard each
``GPTBlock`` and then the root, and use ``torch.optim.AdamW``; three steps on identical
batches check that they compute the same losses. Figures: the step time (interleaved ABBA
blocks after a warm-up; the ratio is the median of the per-block ratios), the sharded save
time (``fabric.save`` / ``save_checkpoint`` / ``dcp.save``, each a directory written by both
ranks) and the sharded load time (``fabric.load`` / ``resume`` / ``dcp.load``), repeated in
rotating order (best of N: the disk is shared); ratios are shardwise / Lightning.

Lightning is a bench-only extra (``pip install -e '.[bench]'``); when it is missing, or when
Fabric cannot run on CPU/gloo, the exact error is the result.

    python bench/peer_lightning.py --quick
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    dcp_load,
    dcp_save,
    drop_file_cache,
    fsdp_strategy_class,
    fully_shard_blocks,
    interleaved_steps,
    median,
    out_of_time,
    path_bytes,
    quiet_shardwise_logs,
    ratio,
    run_ranks,
    section_main,
    summary,
)

LR = 3e-4
BATCH = 16


def _settings(quick: bool) -> list[dict[str, Any]]:
    """One rank launch per entry: the step bench on the small model (with its checkpoint),
    then a larger model's checkpoint alone (where bytes, not fixed costs, dominate)."""
    if quick:
        return [
            dict(size="small", steps=dict(warmup=4, rounds=6, per_round=3), repeats=6),
            dict(size="10M", steps=None, repeats=3),
        ]
    return [
        dict(size="small", steps=dict(warmup=20, rounds=30, per_round=4), repeats=11),
        dict(size="100M", steps=None, repeats=7),
    ]


# ----------------------------------------------------------------------------- rank side
def peer_case(size: str, work_dir: str, steps: dict[str, int] | None, repeats: int) -> dict:
    import lightning as L
    import torch
    import torch.distributed as dist
    from _models import (
        block_class,
        build_gpt,
        loss_of,
        make_batches,
        raw_step_fn,
        shardwise_step_fn,
    )
    from lightning.fabric.strategies import ModelParallelStrategy

    quiet_shardwise_logs()
    block = block_class()
    work = Path(work_dir)

    def parallelize(model, mesh):
        fully_shard_blocks(model, block, mesh["data_parallel"])
        return model

    world_size = int(os.environ["WORLD_SIZE"])
    fabric = L.Fabric(
        accelerator="cpu",
        devices=world_size,
        strategy=ModelParallelStrategy(
            parallelize, data_parallel_size=world_size, tensor_parallel_size=1
        ),
        precision="32-true",
    )
    fabric.launch()  # initialises the gloo process group from the environment
    rank = dist.get_rank()
    base = build_gpt(size, seed=0)
    batches = make_batches(8, BATCH if size == "small" else 2, size, seed=1 + rank)

    # Lightning: set up the module first, then the optimizer on its sharded parameters.
    l_model = fabric.setup_module(copy.deepcopy(base))
    l_opt = fabric.setup_optimizers(torch.optim.AdamW(l_model.parameters(), lr=LR))
    # Raw PyTorch.
    raw_model = copy.deepcopy(base)
    fully_shard_blocks(raw_model, block)
    raw_opt = torch.optim.AdamW(raw_model.parameters(), lr=LR)
    contenders = {"lightning": None, "raw": None}
    # shardwise, when FSDPStrategy exists.
    FSDPStrategy, why = fsdp_strategy_class()
    if FSDPStrategy is not None:
        strategy = FSDPStrategy(
            work_dir=work_dir,
            env_kwargs=dict(randomness=dict(seed=0)),
            model_wrapper=dict(auto_wrap_policy={block}),
            state_dict_cfg="sharded",
        )
        sw_model, optim_wrapper = strategy.prepare(
            copy.deepcopy(base), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR))
        )
        strategy.load_model_state_dict(base.state_dict())
        contenders["shardwise"] = None

    def lightning_step(i: int):
        loss = loss_of(l_model, batches[i % len(batches)])
        fabric.backward(loss)
        l_opt.step()
        l_opt.zero_grad()
        return loss

    raw_step = raw_step_fn(raw_model, raw_opt, batches)
    shardwise_step = shardwise_step_fn(sw_model, optim_wrapper, batches)

    step_fns = {"lightning": lightning_step, "raw": raw_step}
    if "shardwise" in contenders:
        step_fns["shardwise"] = shardwise_step
    result: dict[str, Any] = {
        "rank": rank,
        "shardwise": "ok" if FSDPStrategy is not None else f"not available: {why}",
        "losses": {name: [fn(i).item() for i in range(3)] for name, fn in step_fns.items()},
    }
    if steps is not None:
        result["times"] = interleaved_steps(step_fns, barrier=dist.barrier, **steps)
    else:  # one step each: the optimizer state exists before saving
        for fn in step_fns.values():
            fn(0)

    savers = {
        "lightning": (
            lambda p: fabric.save(p, {"model": l_model, "optimizer": l_opt}),
            lambda p: fabric.load(p, {"model": l_model, "optimizer": l_opt}),
        ),
        "raw": (
            lambda p: dcp_save(raw_model, raw_opt, p),
            lambda p: dcp_load(raw_model, raw_opt, p),
        ),
    }
    if "shardwise" in contenders:
        savers["shardwise"] = (strategy.save_checkpoint, strategy.resume)
    names = list(savers)
    save_s: dict[str, list[float]] = {n: [] for n in names}
    load_s: dict[str, list[float]] = {n: [] for n in names}
    sizes: dict[str, int] = {}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            path = work / f"{name}_{r}"
            save_s[name].append(_collective_seconds(lambda n=name, p=path: savers[n][0](p)))
            if rank == 0:
                sizes[name] = path_bytes(path)
        for name in order:
            path = work / f"{name}_{r}"
            if rank == 0:
                drop_file_cache(path)
            dist.barrier()
            load_s[name].append(_collective_seconds(lambda n=name, p=path: savers[n][1](p)))
        dist.barrier()
        if rank == 0:
            for name in names:
                shutil.rmtree(work / f"{name}_{r}", ignore_errors=True)
    result.update(save_s=save_s, load_s=load_s, bytes=sizes)
    return result


def _collective_seconds(fn) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- driver side
def _paired_ratio(times: dict[str, list[float]], a: str, b: str, per_round: int) -> dict:
    rounds = len(times[a]) // per_round
    ratios = [
        median(times[a][r * per_round : (r + 1) * per_round])
        / median(times[b][r * per_round : (r + 1) * per_round])
        for r in range(rounds)
    ]
    spread = summary(ratios)
    return {"ratio": spread["median_s"], "p25_p75": [spread["p25_s"], spread["p75_s"]]}


def _derive(rank0: dict, settings: dict) -> dict[str, Any]:
    out: dict[str, Any] = {"size": settings["size"], "shardwise": rank0["shardwise"]}
    losses = rank0["losses"]
    ref = losses["raw"]
    out["same_losses"] = {
        name: all(abs(a - b) <= 1e-5 * max(1.0, abs(a)) for a, b in zip(ref, ls))
        for name, ls in losses.items()
    }
    out["losses"] = losses
    if "times" in rank0:
        per_round = settings["steps"]["per_round"]
        out["step"] = {name: summary(ts) for name, ts in rank0["times"].items()}
        out["step_ratio"] = {
            "lightning/raw": _paired_ratio(rank0["times"], "lightning", "raw", per_round)
        }
        if "shardwise" in rank0["times"]:
            out["step_ratio"]["shardwise/lightning"] = _paired_ratio(
                rank0["times"], "shardwise", "lightning", per_round
            )
            out["step_ratio"]["shardwise/raw"] = _paired_ratio(
                rank0["times"], "shardwise", "raw", per_round
            )
    # best of N: the disk is shared and its speed jumps; the medians are kept beside
    out["save_s"] = {n: min(v) for n, v in rank0["save_s"].items()}
    out["load_s"] = {n: min(v) for n, v in rank0["load_s"].items()}
    out["save_median_s"] = {n: median(v) for n, v in rank0["save_s"].items()}
    out["load_median_s"] = {n: median(v) for n, v in rank0["load_s"].items()}
    out["save_runs_s"], out["load_runs_s"] = rank0["save_s"], rank0["load_s"]
    out["bytes"] = rank0["bytes"]
    ratios = {
        "save lightning/raw": ratio(out["save_s"]["lightning"], out["save_s"]["raw"]),
        "load lightning/raw": ratio(out["load_s"]["lightning"], out["load_s"]["raw"]),
    }
    if "shardwise" in out["save_s"]:
        for kind in ("save", "load"):
            ratios[f"{kind} shardwise/lightning"] = ratio(
                out[f"{kind}_s"]["shardwise"], out[f"{kind}_s"]["lightning"]
            )
            ratios[f"{kind} shardwise/raw"] = ratio(
                out[f"{kind}_s"]["shardwise"], out[f"{kind}_s"]["raw"]
            )
    out["ckpt_ratios"] = ratios
    return out


def run(quick: bool = True) -> dict[str, Any]:
    try:
        import lightning
    except ImportError as exc:
        return {
            "status": "not available",
            "reason": f"{exc}; install the bench extra: .venv/bin/pip install -e '.[bench]'",
        }
    from _models import count_params

    FSDPStrategy, why = fsdp_strategy_class()
    out: dict[str, Any] = {
        "lightning": lightning.__version__,
        "world_size": 2,
        "shardwise_fsdp": "available" if FSDPStrategy is not None else f"not available: {why}",
        "runs": [],
    }
    for settings in _settings(quick):
        work_dir = tempfile.mkdtemp(prefix="shardwise-bench-peer-")
        entry: dict[str, Any] = {
            "size": settings["size"],
            "model_params": count_params(settings["size"]),
        }
        skipped = out_of_time(35)
        if skipped:
            entry.update(skipped)
            out["runs"].append(entry)
            continue
        try:
            results = run_ranks(
                "peer_lightning:peer_case", 2, dict(work_dir=work_dir, **settings), timeout=600
            )
            entry.update(status="ok", **_derive(results[0], settings))
        except Exception as exc:  # noqa: BLE001 - the exact error is the result
            entry.update(status="error", error=f"{type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)
        out["runs"].append(entry)
    return out


if __name__ == "__main__":
    section_main("peer_lightning", run)
