"""GPU, on a CUDA machine: model FLOPs utilisation of the GPT example at about 1B parameters
(bf16 FSDP2 on one GPU) and the checkpoint figures with pinned-memory staging.

- **MFU**: ``FSDPStrategy`` with ``mixed_precision=dict(param_dtype='bf16', reduce_dtype='fp32')``
  and ``skip_init_weights`` on one GPU (a one-rank process group), AdamW, sequences of 1024
  tokens. Model FLOPs per token: ``6 N + 12 L d T`` (N parameters without the embeddings, L
  layers, width d, T tokens of context: PaLM's count, attention included). MFU: achieved FLOP/s
  over the GPU's peak dense bf16 FLOP/s (a table by device name; an unknown GPU gets the
  achieved TFLOP/s alone). Baseline, interleaved in the same process: the raw PyTorch step of
  the same model under ``fully_shard`` with the same ``MixedPrecisionPolicy``.
- **Checkpoint**: a sharded ``save_checkpoint`` with ``async_save=True`` (the state staged to
  pinned host memory) against a synchronous one of the same state, alternating, and against
  ``torch.save`` of the same tensors copied to the CPU.

- **Peak GPU memory**: ``torch.cuda.max_memory_allocated`` while each contender is built and
  takes its first two steps (optimizer state included), above what was allocated before it:
  shardwise's first, then the raw loop's (the bytes allocated do not depend on what else is
  resident).

The result names each figure's ratio to its baseline and the issue's targets (``targets``,
``met``): MFU >= 40 %, shardwise's step <= 1.02x the raw step's, async blocking <= 5 % of a
synchronous save, peak memory <= 1.05x the raw loop's.

Without CUDA the section reports itself as not available. ``SHARDWISE_BENCH_GPU_ON_CPU=1`` (or
``SHARDWISE_GPU_CHECK_ON_CPU=1``, the dry run of ``make gpu-check``) runs the same code on the CPU
at a toy size: a check of this script, not a figure (``dry_run: true``; no memory figures).

    python bench/gpu.py [--full] [--out FILE]
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from _common import (
    RankError,
    fully_shard_blocks,
    gpt_fsdp_strategy,
    interleaved_steps,
    median,
    quiet_shardwise_logs,
    run_ranks,
    section_main,
)
from checkpoint_engine import _local_tensors, time_saves

ON_CPU = "SHARDWISE_BENCH_GPU_ON_CPU"
CHECK_ON_CPU = "SHARDWISE_GPU_CHECK_ON_CPU"
PARTIAL = "partial.json"  # the MFU and memory figures, written before the checkpoint part
LR = 3e-4
#: The issue's targets: (figure, comparison, bound).
TARGETS = {
    "mfu": (">=", 0.40),
    "step_ratio": ("<=", 1.02),
    "async_blocking_ratio": ("<=", 0.05),
    "peak_memory_ratio": ("<=", 1.05),
}
#: Peak dense bf16 tensor-core FLOP/s by device-name fragment (most specific first).
PEAK_BF16 = [
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
]


def _config(on_cpu: bool, quick: bool) -> dict[str, Any]:
    from _models import GPTSize

    if on_cpu:
        return dict(size=GPTSize(n_layer=2, n_head=2, n_embd=64, block_size=64), batch=2, steps=2)
    size = GPTSize(n_layer=20, n_head=16, n_embd=2048, block_size=1024)  # ~1.0B parameters
    return dict(size=size, batch=8, steps=10 if quick else 20)


def _peak(name: str) -> float | None:
    return next((flops for fragment, flops in PEAK_BF16 if fragment in name), None)


def dry_run() -> bool:
    """Whether this is the CPU check of the script (no figures)."""
    return os.environ.get(ON_CPU) == "1" or os.environ.get(CHECK_ON_CPU) == "1"


def _met(figures: dict[str, Any]) -> dict[str, bool | None]:
    """Each target met (None where the figure is missing, or on a dry run)."""
    out: dict[str, bool | None] = {}
    for name, (op, bound) in TARGETS.items():
        value = figures.get(name)
        if value is None or figures.get("dry_run"):
            out[name] = None
        else:
            out[name] = value >= bound if op == ">=" else value <= bound
    return out


def gpu_case(work_dir: str, quick: bool) -> dict[str, Any]:
    """One process on one GPU: peak memory and MFU of both contenders, then the checkpoint
    figures."""
    import dataclasses

    import torch
    from _models import block_class, build_gpt, loss_of, make_batches
    from torch.distributed.fsdp import MixedPrecisionPolicy

    quiet_shardwise_logs()
    on_cpu = dry_run()
    device = torch.device("cpu" if on_cpu else "cuda")
    cuda = device.type == "cuda"
    cfg = _config(on_cpu, quick)
    size = cfg["size"]
    batches = [tuple(t.to(device) for t in batch) for batch in make_batches(2, cfg["batch"], size)]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def allocated() -> int:
        return torch.cuda.memory_allocated() if cuda else 0

    def start_peak() -> int:
        if cuda:
            sync()
            torch.cuda.reset_peak_memory_stats()
        return allocated()

    def peak_above(base: int) -> float | None:
        if not cuda:
            return None
        sync()
        return (torch.cuda.max_memory_allocated() - base) / 2**30

    # shardwise: built on the meta device, sharded, materialised on the GPU
    base = start_peak()
    strategy = gpt_fsdp_strategy(
        work_dir,
        model_wrapper=dict(mixed_precision=dict(param_dtype="bf16", reduce_dtype="fp32")),
        state_dict_cfg="sharded",
        skip_init_weights=True,
    )
    model, optim_wrapper = strategy.prepare(
        build_gpt(size, device="meta"), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR))
    )

    def shardwise_step(i: int) -> None:
        with optim_wrapper.optim_context(model):
            loss = loss_of(model, batches[i % 2])
        optim_wrapper.update_params(loss)
        sync()

    for i in range(2):
        shardwise_step(i)
    peak = {"shardwise": peak_above(base)}

    # the raw loop: the same model under fully_shard, the same policy, torch's AdamW
    base = start_peak()
    raw = build_gpt(size, device=device)
    fully_shard_blocks(
        raw, block_class(), mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32)
    )
    raw_opt = torch.optim.AdamW(raw.parameters(), lr=LR)

    def raw_step(i: int) -> None:
        loss_of(raw, batches[i % 2]).backward()
        raw_opt.step()
        raw_opt.zero_grad()
        sync()

    for i in range(2):
        raw_step(i)
    peak["raw"] = peak_above(base)

    times = interleaved_steps(
        {"shardwise": shardwise_step, "raw": raw_step}, warmup=1, rounds=cfg["steps"], per_round=1
    )
    n_params = sum(p.numel() for p in model.parameters())
    embeddings = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
    d = dataclasses.asdict(size)
    flops_per_token = (
        6 * (n_params - embeddings) + 12 * d["n_layer"] * d["n_embd"] * d["block_size"]
    )
    tokens = cfg["batch"] * d["block_size"]
    name = "CPU (a check of the script)" if on_cpu else torch.cuda.get_device_name()
    peak_flops = None if on_cpu else _peak(name)
    step = {k: median(v) for k, v in times.items()}
    paired = [a / b for a, b in zip(times["shardwise"], times["raw"])]
    achieved = {k: flops_per_token * tokens / v for k, v in step.items()}
    out: dict[str, Any] = {
        "dry_run": on_cpu,
        "device": name,
        "torch": torch.__version__,
        "params": n_params,
        "size": d,
        "batch": cfg["batch"],
        "flops_per_token": flops_per_token,
        "step_s": step,
        "step_runs_s": times,
        "step_ratio": step["shardwise"] / step["raw"],
        "step_ratio_paired": median(paired),
        "tflops": {k: v / 1e12 for k, v in achieved.items()},
        "peak_tflops": None if peak_flops is None else peak_flops / 1e12,
        "peak_note": None
        if peak_flops is not None
        else "peak dense bf16 FLOP/s unknown for this device: achieved TFLOP/s only",
        "mfu": None if peak_flops is None else {k: v / peak_flops for k, v in achieved.items()},
        "peak_memory_gb": None if not cuda else torch.cuda.max_memory_allocated() / 2**30,
        "peak_memory_gib": peak,
        "peak_memory_ratio": None if not cuda else peak["shardwise"] / peak["raw"],
    }
    # what is measured so far survives a checkpoint part that fails or runs out of time
    Path(work_dir, PARTIAL).write_text(json.dumps(out))
    raw = raw_opt = None  # free the baseline's memory before the checkpoint figures
    if cuda:
        torch.cuda.empty_cache()

    work = Path(work_dir)
    local = _local_tensors(strategy)  # on the GPU: torch.save copies them out itself
    strategy.save_checkpoint(work / "warmup", async_save=True)  # pinned buffers, gloo group
    strategy.wait_for_checkpoint()
    shutil.rmtree(work / "warmup", ignore_errors=True)  # the disk holds one checkpoint at a time

    runs, _ = time_saves(strategy, local, work, 2 if quick else 4)
    best = {k: min(v) for k, v in runs.items()}
    out["checkpoint_runs_s"] = runs
    out["checkpoint_gb"] = sum(t.numel() * t.element_size() for t in local.values()) / 1e9
    out["async_blocking_ratio"] = best["async blocked"] / best["sync"]
    out["sync_vs_torch_save_ratio"] = best["sync"] / best["torch.save"]
    out["mfu_shardwise"] = None if out["mfu"] is None else out["mfu"]["shardwise"]
    out["targets"] = {k: f"{op} {bound}" for k, (op, bound) in TARGETS.items()}
    out["met"] = _met({**out, "mfu": out["mfu_shardwise"]})
    return out


def run(quick: bool = True) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available() and not dry_run():
        return {"status": "not available", "reason": "no CUDA device on this machine"}
    work_dir = tempfile.mkdtemp(prefix="shardwise-bench-gpu-")
    env = {ON_CPU: "1"} if dry_run() else None
    try:
        return run_ranks(
            "gpu:gpu_case", 1, dict(work_dir=work_dir, quick=quick), timeout=1500, env=env
        )[0]
    except RankError as exc:
        partial = Path(work_dir, PARTIAL)
        if not partial.exists():
            raise
        return {**json.loads(partial.read_text()), "status": "error", "error": str(exc)}
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    section_main("gpu", run)
