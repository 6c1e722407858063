"""Overhead: a training step under shardwise against the same step written in raw PyTorch.

Five cases, each in fresh processes with one intra-op thread per rank:

- ``single``: ``SingleDeviceStrategy`` against ``loss.backward(); opt.step(); opt.zero_grad()``.
- ``ddp``: ``DDPStrategy`` on 2 ranks against torch's ``DistributedDataParallel`` used directly.
- ``fsdp``: ``FSDPStrategy`` on 2 ranks against ``fully_shard`` applied by hand (each
  ``GPTBlock``, then the root), when ``shardwise.strategies.FSDPStrategy`` exists.
- ``tp``: ``FSDPStrategy(parallelism=dict(tp=2), tp_plan=...)`` on 2 ranks against the same
  model split by hand: ``parallelize_module`` with the same plan on the ``tp`` dimension of
  ``init_device_mesh('cpu', (dp, tp), mesh_dim_names=('dp_shard', 'tp'))``, then
  ``fully_shard`` on each block and the root over ``mesh['dp_shard']`` (of size 1 here).
- ``fsdp_tp``: the same on 4 ranks, ``dp_shard=2`` × ``tp=2`` (the 4 ranks share this
  machine's cores, so the step is oversubscribed alike for both contenders).

In the tensor-parallel cases each rank trains on the batch of its data-parallel rank
(tensor-parallel peers take the same one), both contenders alike.

Both contenders live in the same processes, start from the same weights, see batches of the
same shape and use ``torch.optim.AdamW`` with the same hyper-parameters; before timing, three
steps on identical batches check that they compute the same losses (the same work). Timing
alternates them in short blocks (ABBA) after a warm-up; step times are medians over all
blocks, and the ratio is the median of the per-block ratios (each shardwise block against the
raw block beside it in time), so that drift of a shared machine cancels.

Each case also profiles a few shardwise steps with cProfile and reports the seconds per step
spent in shardwise's own Python frames (an upper bound: cProfile slows Python code down), and
counts the collectives each contender calls per step (the same work makes the same calls).

    python bench/overhead.py --quick
"""

from __future__ import annotations

import copy
import cProfile
import pstats
import re
import tempfile
from typing import Any

from _common import (
    fsdp_strategy_class,
    fully_shard_blocks,
    in_rank_process,
    init_gloo,
    out_of_time,
    quiet_shardwise_logs,
    ratio,
    run_ranks,
    section_main,
    summary,
)

TARGET = 1.02
LR = 3e-4
MODEL = "small"
BATCH = 16  # per data-parallel rank
TP = 2
#: The tensor-parallel cases' GPT: half the layers of ``small`` (DTensor's per-op dispatch,
#: not arithmetic, sets a tensor-parallel step's time on CPU; fewer layers keep it short).
TP_MODEL = dict(n_layer=2, n_head=4, n_embd=128)
#: Seconds a case needs in quick mode (it is skipped, saying so, when fewer are left).
NEEDS_S = {"single": 25, "ddp": 35, "fsdp": 35, "tp": 20, "fsdp_tp": 35}
#: The tensor-parallel cases: world size and ``parallelism``.
TP_CASES = {
    "tp": (2, dict(dp_replicate=1, dp_shard=-1, tp=TP)),
    "fsdp_tp": (4, dict(dp_replicate=1, dp_shard=-1, tp=TP)),
}


def tp_plan() -> dict[str, Any]:
    """How both contenders split the GPT: the example model's own ``_tp_plan`` (attention by
    heads, the MLP by hidden units, the embedding and head by vocabulary)."""
    from _models import model_classes

    return dict(model_classes()[0]._tp_plan)


def torch_tp_plan() -> dict[str, Any]:
    """:func:`tp_plan` in torch's own styles, for ``parallelize_module`` (which takes the same
    ``*`` patterns)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "tok_emb": RowwiseParallel(input_layouts=Replicate()),
        "blocks.*.attn.q": ColwiseParallel(),
        "blocks.*.attn.k": ColwiseParallel(),
        "blocks.*.attn.v": ColwiseParallel(),
        "blocks.*.attn.proj": RowwiseParallel(),
        "blocks.*.mlp.0": ColwiseParallel(),
        "blocks.*.mlp.2": RowwiseParallel(),
        "head": ColwiseParallel(output_layouts=Replicate()),
    }


def _settings(quick: bool, case: str) -> dict[str, int]:
    # Tensor parallelism on gloo: a dozen collectives a step, whose waits make step times
    # spread by +-20% even on an idle machine; more steps than the other cases for the medians.
    if case == "fsdp_tp":  # 4 ranks on 2 cores: ~0.15 s a step
        return (
            dict(warmup=3, rounds=12, per_round=3)
            if quick
            else dict(warmup=10, rounds=40, per_round=4)
        )
    if case == "tp":  # ~70 ms a step
        return (
            dict(warmup=5, rounds=20, per_round=4)
            if quick
            else dict(warmup=30, rounds=60, per_round=4)
        )
    if case == "fsdp":  # FSDP2 on gloo all-gathers per block: ~3x the step time of DDP
        return (
            dict(warmup=4, rounds=8, per_round=3)
            if quick
            else dict(warmup=20, rounds=40, per_round=4)
        )
    return (
        dict(warmup=5, rounds=12, per_round=3) if quick else dict(warmup=30, rounds=60, per_round=4)
    )


# ----------------------------------------------------------------------------- rank side
def _make_contenders(case: str, work_dir: str):
    """``(raw_step, shardwise_step, check)``: step functions taking a batch index, and a
    function returning both contenders' losses on the same three batches."""
    import torch
    import torch.distributed as dist
    from _models import (
        GPTSize,
        block_class,
        build_gpt,
        make_batches,
        raw_step_fn,
        shardwise_step_fn,
    )

    quiet_shardwise_logs()
    rank = in_rank_process()["rank"]
    init_gloo()
    model = GPTSize(**TP_MODEL) if case in TP_CASES else MODEL
    base = build_gpt(model, seed=0)
    data_rank = rank // TP if case in TP_CASES else rank  # tensor-parallel peers: one batch
    batches = make_batches(16, BATCH, model, seed=1 + data_rank)
    optim_cfg = dict(optimizer=dict(type="AdamW", lr=LR))
    env_kwargs = dict(randomness=dict(seed=0))

    raw_model = copy.deepcopy(base)
    if case == "single":
        from shardwise.strategies import SingleDeviceStrategy

        strategy = SingleDeviceStrategy(work_dir=work_dir, env_kwargs=env_kwargs)
    elif case == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        from shardwise.strategies import DDPStrategy

        raw_model = DistributedDataParallel(raw_model)
        strategy = DDPStrategy(work_dir=work_dir, env_kwargs=env_kwargs)
    elif case == "fsdp":
        block = block_class()
        fully_shard_blocks(raw_model, block)
        FSDPStrategy, _ = fsdp_strategy_class()
        strategy = FSDPStrategy(
            work_dir=work_dir,
            env_kwargs=env_kwargs,
            model_wrapper=dict(auto_wrap_policy={block}),
            state_dict_cfg="sharded",
        )
    elif case in TP_CASES:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        block = block_class()
        world_size, parallelism = TP_CASES[case]
        mesh = init_device_mesh("cpu", (world_size // TP, TP), mesh_dim_names=("dp_shard", "tp"))
        if mesh["dp_shard"].get_local_rank() != data_rank:
            raise RuntimeError(f"rank {rank}: the raw mesh's data-parallel rank is not {data_rank}")
        parallelize_module(raw_model, mesh["tp"], torch_tp_plan())
        fully_shard_blocks(raw_model, block, mesh=mesh["dp_shard"])
        FSDPStrategy, _ = fsdp_strategy_class()
        strategy = FSDPStrategy(
            work_dir=work_dir,
            env_kwargs=env_kwargs,
            model_wrapper=dict(auto_wrap_policy={block}),
            state_dict_cfg="sharded",
            parallelism=parallelism,
            tp_plan=tp_plan(),
        )
    else:
        raise ValueError(case)
    raw_opt = torch.optim.AdamW(raw_model.parameters(), lr=LR)
    sw_model, optim_wrapper = strategy.prepare(copy.deepcopy(base), optim_wrapper=optim_cfg)
    strategy.load_model_state_dict(base.state_dict())  # prepare() ran init_weights() again
    if case in TP_CASES and strategy.data_parallel_rank != data_rank:
        raise RuntimeError(
            f"rank {rank}: FSDPStrategy's data_parallel_rank is {strategy.data_parallel_rank}, "
            f"the raw mesh's {data_rank}"
        )

    raw_step = raw_step_fn(raw_model, raw_opt, batches)
    shardwise_step = shardwise_step_fn(sw_model, optim_wrapper, batches)

    def check() -> dict[str, list[float]]:
        return {
            "raw": [raw_step(i).item() for i in range(3)],
            "shardwise": [shardwise_step(i).item() for i in range(3)],
        }

    barrier = dist.barrier if dist.is_initialized() else None
    return raw_step, shardwise_step, check, barrier


def step_case(case: str, work_dir: str, warmup: int, rounds: int, per_round: int) -> dict:
    """One rank of an overhead case: same-work check, interleaved timing, cProfile."""
    from _common import interleaved_steps

    raw_step, shardwise_step, check, barrier = _make_contenders(case, work_dir)
    losses = check()
    times = interleaved_steps(
        {"raw": raw_step, "shardwise": shardwise_step},
        warmup=warmup,
        rounds=rounds,
        per_round=per_round,
        barrier=barrier,
    )
    profile = _profile_shardwise_frames(shardwise_step, steps=5)
    collectives = {
        "raw": _count_collectives(raw_step, steps=2),
        "shardwise": _count_collectives(shardwise_step, steps=2),
    }
    return {"losses": losses, "times": times, "profile": profile, "collectives": collectives}


_COLLECTIVE = re.compile(r"gather|scatter|reduce|broadcast|barrier|all_to_all|send|recv|wait")


def _count_collectives(step, steps: int) -> dict[str, float]:
    """Calls per step of torch's collective built-ins (process-group ``c10d`` calls, as FSDP
    makes them, and functional ``c10d_functional`` ones, as DTensor makes them, with their
    waits): the same work makes the same calls."""
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(steps):
        step(i)
    profiler.disable()
    counts: dict[str, float] = {}
    for (_filename, _line, func), (_cc, calls, *_) in pstats.Stats(profiler).stats.items():
        for marker, prefix in (("_distributed_c10d.", ""), ("_c10d_functional.", "functional ")):
            op = func.split(marker, 1)[1].rstrip(">") if marker in func else ""
            if _COLLECTIVE.search(op):
                counts[prefix + op] = counts.get(prefix + op, 0.0) + calls / steps
    return dict(sorted(counts.items()))


def _profile_shardwise_frames(step, steps: int) -> dict[str, Any]:
    """Seconds per step in shardwise's own frames (tottime of functions under
    ``src/shardwise``), and the top of them."""
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(steps):
        step(i)
    profiler.disable()
    stats = pstats.Stats(profiler)
    own = []
    total = 0.0
    for (filename, line, func), (_cc, _nc, tottime, cumtime, _callers) in stats.stats.items():
        if "/shardwise/" in filename and "/bench/" not in filename:
            total += tottime
            own.append((tottime, f"{filename.split('/shardwise/')[-1]}:{line}({func})", cumtime))
    own.sort(reverse=True)
    return {
        "shardwise_self_s_per_step": total / steps,
        "profiled_step_s": stats.total_tt / steps,
        "top": [
            {"frame": name, "self_s_per_step": t / steps, "cum_s_per_step": c / steps}
            for t, name, c in own[:5]
        ],
    }


# ----------------------------------------------------------------------------- driver side
def _summarise(case: str, world_size: int, results: list[dict], settings: dict) -> dict:
    rank0 = results[0]
    raw = summary(rank0["times"]["raw"])
    sw = summary(rank0["times"]["shardwise"])
    per_round = settings["per_round"]
    # Paired ratios: each round's shardwise block against the raw block beside it in time, so
    # that drift between rounds (other processes on the machine) cancels.
    round_ratios = []
    for r in range(settings["rounds"]):
        a = rank0["times"]["shardwise"][r * per_round : (r + 1) * per_round]
        b = rank0["times"]["raw"][r * per_round : (r + 1) * per_round]
        round_ratios.append(summary(a)["median_s"] / summary(b)["median_s"])
    spread = summary(round_ratios)
    losses = rank0["losses"]
    same = all(
        abs(a - b) <= 1e-5 * max(1.0, abs(a)) for a, b in zip(losses["raw"], losses["shardwise"])
    )
    value = spread["median_s"]
    mesh = {"dp_shard": world_size // TP, "tp": TP} if case in TP_CASES else None
    return {
        "case": case,
        "world_size": world_size,
        "mesh": mesh,
        "threads_per_rank": 1,
        "shardwise_step": sw,
        "raw_step": raw,
        "ratio": value,
        "ratio_of_medians": ratio(sw["median_s"], raw["median_s"]),
        "round_ratio_p25_p75": [spread["p25_s"], spread["p75_s"]],
        "target": TARGET,
        "meets_target": value is not None and value <= TARGET,
        "same_losses": same,
        "losses": losses,
        "profile_rank0": rank0["profile"],
        "collectives_per_step_rank0": rank0.get("collectives"),
        "settings": settings,
    }


def run(quick: bool = True) -> dict[str, Any]:
    from _models import GPTSize, count_params, model_classes

    cases: dict[str, Any] = {}
    FSDPStrategy, why = fsdp_strategy_class()
    plan = [("single", 1), ("ddp", 2), ("fsdp", 2)]
    plan += [(case, world_size) for case, (world_size, _) in TP_CASES.items()]
    for case, world_size in plan:
        if case not in ("single", "ddp") and FSDPStrategy is None:
            cases[case] = {"status": "not available", "reason": why}
            continue
        settings = _settings(quick, case)
        skipped = out_of_time(NEEDS_S[case])
        if skipped:
            cases[case] = skipped
            continue
        try:
            with tempfile.TemporaryDirectory(prefix="shardwise-bench-") as work_dir:
                results = run_ranks(
                    "overhead:step_case",
                    world_size,
                    dict(case=case, work_dir=work_dir, **settings),
                    timeout=600,
                )
            cases[case] = {"status": "ok", **_summarise(case, world_size, results, settings)}
        except Exception as exc:  # noqa: BLE001 - one case's failure is its result
            cases[case] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    return {
        "model": MODEL,
        "model_params": count_params(MODEL),
        "model_source": model_classes()[2],
        "batch": BATCH,
        "tp_model": TP_MODEL,
        "tp_model_params": count_params(GPTSize(**TP_MODEL)),
        "tp_plan": tp_plan(),
        "cases": cases,
    }


if __name__ == "__main__":
    section_main("overhead", run)
