"""Pipeline parallelism: a pp=2 step through ``FSDPStrategy`` against torch's raw
``torch.distributed.pipelining``, and the bubble each schedule measures.

One pair of fresh processes (2 gloo ranks, one intra-op thread each) runs both parts:

- *Overhead* (``ratio``): ``FSDPStrategy(parallelism=dict(pp=2), pipeline=dict(schedule,
  n_microbatches=4))`` and ``strategy.pipeline.train_step((x, y), optim_wrapper)`` (what the
  Runner calls) against the same split built by hand: a copy of the GPT without the other
  stage's modules (the embeddings and blocks 0-1 on rank 0; blocks 2-3, the final norm and
  the head on rank 1), a ``PipelineStage`` of it, torch's ``Schedule1F1B`` / ``ScheduleGPipe``
  with the same microbatches and ``loss_fn`` (cross-entropy / 4, ``scale_grads=False``, as
  shardwise's), then ``torch.optim.AdamW``'s step and ``zero_grad``. No ``fully_shard`` on
  either side (pp alone has nothing to shard: shardwise leaves such stages plain); a third,
  diagnostic contender is the raw stage ``fully_shard``-ed over a data-parallel mesh of size
  1. All start from the same weights (the raw stage takes shardwise's) and
  train on the same batches; three steps check that they compute the same losses. Timing
  alternates them in blocks (ABBA) after a warm-up; the ratio is the median of the per-block
  ratios, as in ``bench/overhead.py``; each step's CPU time (``time.process_time``, the
  process's own work, which other load on the cores does not stretch) is compared the same
  way; shardwise's own Python frames are profiled, and the collectives each makes are
  counted.
- *Bubble*: for each schedule (GPipe, 1F1B, Interleaved1F1B with 2 stages per rank: 4
  stages of one block), shardwise's stages are instrumented: every call of a stage's
  ``forward_one_chunk`` / ``backward_one_chunk`` (and the last stage's loss) is timed on its
  rank (*busy*: the compute of the stage), as is every wait for a peer's send/recv
  (``_wait_batch_p2p``). Each step of the schedule (``schedule.step`` alone, after a barrier
  that starts the ranks together; the optimizer step is outside) gives, per rank,
  ``bubble = 1 - busy / wall``; the figure is the median over steps of the mean over the two
  ranks. Theory (equal stages, free communication): ``(p-1)/(m+p-1)`` for GPipe and 1F1B with
  ``p`` stages and ``m`` microbatches, ``(p-1)/(v*m+p-1)`` for Interleaved1F1B with ``v``
  stages per rank (``p`` ranks). The measured idle time includes what theory leaves out:
  sends/receives over gloo, the schedule's own Python, unequal stages (the last one holds the
  head and the loss), and, on a shared 2-core machine, a rank waiting for a core.

    python bench/pipeline.py --quick
"""

from __future__ import annotations

import copy
import os
import statistics
import tempfile
import time
from typing import Any

from _common import (
    fsdp_strategy_class,
    in_rank_process,
    init_gloo,
    interleaved_steps,
    out_of_time,
    quiet_shardwise_logs,
    ratio,
    run_ranks,
    section_main,
    summary,
)

TARGET = 1.02
LR = 3e-4
#: The GPT of ``examples/chargpt.py`` ("small": 4 blocks, width 128, 0.8M parameters).
MODEL = "small"
BATCH = 16  # sequences of 64 characters a step
N_MICROBATCHES = 4
PP = 2
#: The schedules whose step is compared with torch's raw one (quick mode: the first).
RATIO_SCHEDULES = ("1F1B", "GPipe")
#: The schedules whose bubble is measured, with their stages per rank.
BUBBLE_SCHEDULES = {"GPipe": 1, "1F1B": 1, "Interleaved1F1B": 2}
#: The microbatch counts of the bubble measurement (quick mode: the first).
BUBBLE_MICROBATCHES = (4, 8)
NEEDS_S = 45


def theoretical_bubble(schedule: str, pp: int, n_microbatches: int, stages_per_rank: int) -> float:
    """The idle fraction of a rank under equal stages and free communication:
    ``(p-1)/(m+p-1)``, or ``(p-1)/(v*m+p-1)`` with ``v`` stages per rank (interleaved)."""
    v = stages_per_rank if schedule == "Interleaved1F1B" else 1
    return (pp - 1) / (v * n_microbatches + pp - 1)


def _settings(quick: bool) -> dict[str, int]:
    if quick:
        return dict(warmup=4, rounds=10, per_round=3, bubble_warmup=3, bubble_steps=12)
    return dict(warmup=10, rounds=24, per_round=4, bubble_warmup=4, bubble_steps=30)


# ----------------------------------------------------------------------------- rank side
def _loss(outputs, targets):
    import torch.nn.functional as F

    return F.cross_entropy(outputs.flatten(0, 1), targets.flatten()) / N_MICROBATCHES


def _shardwise(
    base, work_dir: str, schedule: str, stages_per_rank: int, n_microbatches: int = N_MICROBATCHES
):
    FSDPStrategy, why = fsdp_strategy_class()
    if FSDPStrategy is None:
        raise RuntimeError(f"FSDPStrategy is not available: {why}")
    pipeline = dict(schedule=schedule, n_microbatches=n_microbatches)
    if stages_per_rank > 1:
        pipeline["stages_per_rank"] = stages_per_rank
    strategy = FSDPStrategy(
        work_dir=work_dir,
        env_kwargs=dict(randomness=dict(seed=0)),
        parallelism=dict(pp=PP),
        pipeline=pipeline,
    )
    model, wrapper = strategy.prepare(
        copy.deepcopy(base), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR))
    )
    return strategy, model, wrapper


def hand_split(base, rank: int):
    """Rank ``rank``'s stage of the GPT, split by hand: a copy without the other stage's
    modules (the blocks keep their names)."""
    stage = copy.deepcopy(base)
    half = len(stage.blocks) // 2
    drop = range(half, len(stage.blocks)) if rank == 0 else range(half)
    for i in drop:
        del stage.blocks._modules[str(i)]
    if rank == 0:
        stage.ln_f = stage.head = None
    else:
        stage.tok_emb = stage.pos_emb = None
    return stage


def _raw(base, rank: int, weights: dict, schedule: str, shard_mesh=None):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    module = hand_split(base, rank)
    missing, unexpected = module.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"rank {rank}: the hand split's names differ: {missing} {unexpected}")
    if shard_mesh is not None:  # the diagnostic contender: what shardwise does to a stage
        fully_shard(module, mesh=shard_mesh)
    stage = PipelineStage(module, rank, PP, torch.device("cpu"), group=dist.group.WORLD)
    cls = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe}[schedule]
    sched = cls(stage, n_microbatches=N_MICROBATCHES, loss_fn=_loss, scale_grads=False)
    return module, torch.optim.AdamW(module.parameters(), lr=LR), sched


def _full_weights(model) -> dict:
    from torch.distributed.tensor import DTensor

    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in model.named_parameters()
    }


def ratio_case(work_dir: str, schedule: str, warmup: int, rounds: int, per_round: int) -> dict:
    """One rank of the overhead case: same-work check, interleaved timing, cProfile."""
    import torch
    import torch.distributed as dist
    from _models import build_gpt, make_batches
    from overhead import _count_collectives, _profile_shardwise_frames

    quiet_shardwise_logs()
    init_gloo()
    rank = in_rank_process()["rank"]
    base = build_gpt(MODEL, seed=0)
    batches = make_batches(8, BATCH, MODEL, seed=1)  # pp alone: both ranks see every batch
    strategy, sw_model, wrapper = _shardwise(base, work_dir, schedule, 1)
    pipe = strategy.pipeline
    weights = _full_weights(sw_model)
    _, raw_opt, raw_sched = _raw(base, rank, weights, schedule)
    # Diagnostic: the raw stage with fully_shard over a data-parallel mesh of size 1 (what
    # FSDPStrategy did to each stage before pp-only stages were left plain).
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (PP, 1), mesh_dim_names=("pp", "dp_shard"))
    _, fs_opt, fs_sched = _raw(base, rank, weights, schedule, shard_mesh=mesh["dp_shard"])
    last = rank == PP - 1

    def shardwise_step(i: int) -> torch.Tensor:
        return pipe.train_step(batches[i % len(batches)], wrapper)["loss"]

    def raw_step_fn(sched, opt):
        def step(i: int) -> torch.Tensor:
            x, y = batches[i % len(batches)]
            losses: list = []
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=y, losses=losses)
            opt.step()
            opt.zero_grad()
            return torch.stack(losses).sum() if losses else torch.tensor(float("nan"))

        return step

    raw_step = raw_step_fn(raw_sched, raw_opt)
    fs_step = raw_step_fn(fs_sched, fs_opt)
    cpu: dict[str, list[float]] = {}

    def cpu_timed(name: str, fn):
        """``fn`` recording each call's CPU seconds of this process (all its threads): the
        work a step does, which other processes sharing the cores do not stretch."""
        cpu[name] = []

        def step(i: int):
            start = time.process_time()
            out = fn(i)
            cpu[name].append(time.process_time() - start)
            return out

        return step

    losses = {
        "raw": [raw_step(i).item() for i in range(3)],
        "raw_fully_shard": [fs_step(i).item() for i in range(3)],
        "shardwise": [shardwise_step(i).item() for i in range(3)],
    }
    contenders = {"raw": raw_step, "shardwise": shardwise_step, "raw_fully_shard": fs_step}
    times = interleaved_steps(
        {name: cpu_timed(name, fn) for name, fn in contenders.items()},
        warmup=warmup,
        rounds=rounds,
        per_round=per_round,
        barrier=dist.barrier,
    )
    cpu_times = {name: values[warmup:] for name, values in cpu.items()}
    profile = _profile_shardwise_frames(shardwise_step, steps=5)
    collectives = {
        "raw": _count_collectives(raw_step, steps=2),
        "shardwise": _count_collectives(shardwise_step, steps=2),
    }
    return {
        "profile_categories": {
            name: _where(step) for name, step in (("raw", raw_step), ("shardwise", shardwise_step))
        },
        "rank": rank,
        "last_stage": last,
        "losses": losses,
        "times": times,
        "cpu_times": cpu_times,
        "profile": profile,
        "collectives": collectives,
    }


def _where(step, steps: int = 4) -> dict[str, float]:
    """Seconds per step by where cProfile puts them (total time of the frames of FSDP,
    DTensor, the optimizer, the pipelining schedule), for the measured reason of a gap."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(steps):
        step(i)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    groups = {
        "fsdp (torch/distributed/fsdp)": "torch/distributed/fsdp/",
        "DTensor (torch/distributed/tensor)": "torch/distributed/tensor/",
        "optimizer (torch/optim)": "torch/optim/",
        "pipelining schedule/stage": "torch/distributed/pipelining/",
        "shardwise": "/shardwise/",
    }
    out = {name: 0.0 for name in groups}
    for (filename, _line, _func), (_cc, _nc, tottime, _cum, _callers) in stats.items():
        for name, marker in groups.items():
            if marker in filename and "/bench/" not in filename:
                out[name] += tottime / steps
    out["profiled_step_s"] = sum(v[2] for v in stats.values()) / steps
    return out


def bubble_case(work_dir: str, warmup: int, steps: int, microbatches: list[int]) -> dict:
    """One rank of the bubble measurement: per schedule, every step's wall, busy (the stages'
    forward/backward compute and the loss) and peer-wait seconds on this rank."""
    import torch
    import torch.distributed as dist
    import torch.distributed.pipelining.schedules as schedules
    from _models import build_gpt, make_batches

    quiet_shardwise_logs()
    init_gloo()
    rank = in_rank_process()["rank"]
    base = build_gpt(MODEL, seed=0)
    batches = make_batches(8, BATCH, MODEL, seed=1)
    clock = {"busy": 0.0, "wait": 0.0}

    def timed(fn, key: str):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                clock[key] += time.perf_counter() - start

        return call

    original_wait = schedules._wait_batch_p2p
    schedules._wait_batch_p2p = timed(original_wait, "wait")
    out: dict[str, Any] = {}
    try:
        cases = [(s, v, m) for m in microbatches for s, v in BUBBLE_SCHEDULES.items()]
        for schedule, per_rank, m in cases:
            strategy, _, wrapper = _shardwise(base, work_dir, schedule, per_rank, m)
            pipe = strategy.pipeline
            for stage in pipe.stages:
                for name in ("forward_one_chunk", "backward_one_chunk"):
                    setattr(stage, name, timed(getattr(stage, name), "busy"))
            pipe.schedule._maybe_compute_loss = timed(pipe.schedule._maybe_compute_loss, "busy")
            rows = []
            for i in range(warmup + steps):
                x, y = batches[i % len(batches)]
                losses: list = []
                dist.barrier()
                clock["busy"] = clock["wait"] = 0.0
                start = time.perf_counter()
                if pipe.has_first:
                    pipe.schedule.step(x, target=y if pipe.has_last else None, losses=losses)
                else:
                    pipe.schedule.step(target=y if pipe.has_last else None, losses=losses)
                wall = time.perf_counter() - start
                wrapper.zero_grad()
                if i >= warmup:
                    rows.append({"wall_s": wall, "busy_s": clock["busy"], "wait_s": clock["wait"]})
            out[f"{schedule} m={m}"] = {
                "schedule": schedule,
                "stages_per_rank": per_rank,
                "n_microbatches": m,
                "stage_ids": list(pipe.stage_ids),
                "steps": rows,
            }
            del strategy, pipe, wrapper
            torch.distributed.barrier()
    finally:
        schedules._wait_batch_p2p = original_wait
    return {"rank": rank, "schedules": out}


# ----------------------------------------------------------------------------- driver side
def _block_ratios(times: dict, a: str, b: str, settings: dict) -> dict:
    """The spread (median, p25, p75) of the per-block ratios of median times ``a`` / ``b``."""
    per_round, ratios = settings["per_round"], []
    for r in range(settings["rounds"]):
        block = slice(r * per_round, (r + 1) * per_round)
        ratios.append(summary(times[a][block])["median_s"] / summary(times[b][block])["median_s"])
    return summary(ratios)


def _summarise_ratio(schedule: str, results: list[dict], settings: dict) -> dict:
    rank0 = results[0]
    raw = summary(rank0["times"]["raw"])
    sw = summary(rank0["times"]["shardwise"])
    spread = _block_ratios(rank0["times"], "shardwise", "raw", settings)
    losses = next(r["losses"] for r in results if r["last_stage"])
    same = all(
        abs(a - b) <= 1e-5 * max(1.0, abs(a))
        for other in ("shardwise", "raw_fully_shard")
        for a, b in zip(losses["raw"], losses[other], strict=True)
    )
    value = spread["median_s"]
    fs = summary(rank0["times"]["raw_fully_shard"])
    fs_ratio = _block_ratios(rank0["times"], "shardwise", "raw_fully_shard", settings)["median_s"]
    cpu = {}
    for r in results:
        if "cpu_times" in r:
            c = _block_ratios(r["cpu_times"], "shardwise", "raw", settings)
            cpu[f"rank{r['rank']}"] = {
                "shardwise_cpu_s": summary(r["cpu_times"]["shardwise"])["median_s"],
                "raw_cpu_s": summary(r["cpu_times"]["raw"])["median_s"],
                "ratio": c["median_s"],
                "ratio_p25_p75": [c["p25_s"], c["p75_s"]],
            }
    return {
        "raw_fully_shard_step": fs,
        "ratio_to_raw_fully_shard": fs_ratio,
        "cpu_per_step": cpu,
        "profile_categories": {f"rank{r['rank']}": r["profile_categories"] for r in results},
        "schedule": schedule,
        "world_size": PP,
        "shardwise_step": sw,
        "raw_step": raw,
        "ratio": value,
        "ratio_of_medians": ratio(sw["median_s"], raw["median_s"]),
        "round_ratio_p25_p75": [spread["p25_s"], spread["p75_s"]],
        "target": TARGET,
        "meets_target": value <= TARGET,
        "same_losses": same,
        "losses": losses,
        "profile": {f"rank{r['rank']}": r["profile"] for r in results},
        "collectives_per_step": {f"rank{r['rank']}": r["collectives"] for r in results},
        "settings": settings,
    }


def _summarise_bubble(results: list[dict]) -> dict:
    out = {}
    for key, case in results[0]["schedules"].items():
        schedule, per_rank, m = case["schedule"], case["stages_per_rank"], case["n_microbatches"]
        per_step = list(zip(*(r["schedules"][key]["steps"] for r in results), strict=True))
        fractions = [
            statistics.mean(1 - s["busy_s"] / s["wall_s"] for s in step) for step in per_step
        ]
        ranks = {}
        for r in results:
            rows = r["schedules"][key]["steps"]
            ranks[f"rank{r['rank']}"] = {
                "stage_ids": r["schedules"][key]["stage_ids"],
                "wall_s": statistics.median(s["wall_s"] for s in rows),
                "busy_s": statistics.median(s["busy_s"] for s in rows),
                "peer_wait_s": statistics.median(s["wait_s"] for s in rows),
                "bubble": statistics.median(1 - s["busy_s"] / s["wall_s"] for s in rows),
            }
        spread = summary(fractions)
        out[key] = {
            "schedule": schedule,
            "stages_per_rank": per_rank,
            "n_stages": PP * per_rank,
            "n_microbatches": m,
            "microbatch": BATCH // m,
            "measured": spread["median_s"],
            "measured_p25_p75": [spread["p25_s"], spread["p75_s"]],
            "theoretical": theoretical_bubble(schedule, PP, m, per_rank),
            "ranks": ranks,
            "steps": len(fractions),
        }
    return out


def run(quick: bool = True) -> dict[str, Any]:
    from _models import count_params, model_classes

    settings = _settings(quick)
    result: dict[str, Any] = {
        "model": MODEL,
        "model_params": count_params(MODEL),
        "model_source": model_classes()[2],
        "batch": BATCH,
        "n_microbatches": N_MICROBATCHES,
        "pp": PP,
        "threads_per_rank": 1,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    FSDPStrategy, why = fsdp_strategy_class()
    if FSDPStrategy is None:
        return {**result, "status": "not available", "reason": why}
    cases: dict[str, Any] = {}
    for schedule in RATIO_SCHEDULES[:1] if quick else RATIO_SCHEDULES:
        skipped = out_of_time(NEEDS_S / 2)
        if skipped:
            cases[schedule] = skipped
            continue
        kwargs = {k: settings[k] for k in ("warmup", "rounds", "per_round")}
        try:
            with tempfile.TemporaryDirectory(prefix="shardwise-bench-") as work_dir:
                ranks = run_ranks(
                    "pipeline:ratio_case",
                    PP,
                    dict(work_dir=work_dir, schedule=schedule, **kwargs),
                    timeout=600,
                )
            cases[schedule] = {"status": "ok", **_summarise_ratio(schedule, ranks, kwargs)}
        except Exception as exc:  # noqa: BLE001 - one case's failure is its result
            cases[schedule] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    result["cases"] = cases
    skipped = out_of_time(NEEDS_S / 2)
    if skipped:
        result["bubble"] = skipped
    else:
        try:
            with tempfile.TemporaryDirectory(prefix="shardwise-bench-") as work_dir:
                ranks = run_ranks(
                    "pipeline:bubble_case",
                    PP,
                    dict(
                        work_dir=work_dir,
                        warmup=settings["bubble_warmup"],
                        steps=settings["bubble_steps"],
                        microbatches=list(
                            BUBBLE_MICROBATCHES[:1] if quick else BUBBLE_MICROBATCHES
                        ),
                    ),
                    timeout=600,
                )
            result["bubble"] = {"status": "ok", "schedules": _summarise_bubble(ranks)}
        except Exception as exc:  # noqa: BLE001
            result["bubble"] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


if __name__ == "__main__":
    section_main("pipeline", run)
