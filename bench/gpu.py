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

Without CUDA the section reports itself as not available. ``SHARDWISE_BENCH_GPU_ON_CPU=1`` runs
the same code on the CPU at a toy size: a check of this script, not a figure.

    python bench/gpu.py
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from _common import (
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
LR = 3e-4
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
    return dict(size=size, batch=8, steps=5 if quick else 20)


def _peak(name: str) -> float | None:
    return next((flops for fragment, flops in PEAK_BF16 if fragment in name), None)


def gpu_case(work_dir: str, quick: bool) -> dict[str, Any]:
    """One process on one GPU: the MFU figures, then the checkpoint figures."""
    import dataclasses

    import torch
    from _models import block_class, build_gpt, loss_of, make_batches
    from torch.distributed.fsdp import MixedPrecisionPolicy

    quiet_shardwise_logs()
    on_cpu = os.environ.get(ON_CPU) == "1"
    device = torch.device("cpu" if on_cpu else "cuda")
    cfg = _config(on_cpu, quick)
    size = cfg["size"]
    strategy = gpt_fsdp_strategy(
        work_dir,
        model_wrapper=dict(mixed_precision=dict(param_dtype="bf16", reduce_dtype="fp32")),
        state_dict_cfg="sharded",
        skip_init_weights=True,
    )
    model, optim_wrapper = strategy.prepare(
        build_gpt(size, device="meta"), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR))
    )
    raw = build_gpt(size, device=device)
    fully_shard_blocks(
        raw, block_class(), mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32)
    )
    raw_opt = torch.optim.AdamW(raw.parameters(), lr=LR)
    batches = [tuple(t.to(device) for t in batch) for batch in make_batches(2, cfg["batch"], size)]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def shardwise_step(i: int) -> None:
        with optim_wrapper.optim_context(model):
            loss = loss_of(model, batches[i % 2])
        optim_wrapper.update_params(loss)
        sync()

    def raw_step(i: int) -> None:
        loss_of(raw, batches[i % 2]).backward()
        raw_opt.step()
        raw_opt.zero_grad()
        sync()

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
    peak = None if on_cpu else _peak(name)
    step = {k: median(v) for k, v in times.items()}
    achieved = {k: flops_per_token * tokens / v for k, v in step.items()}
    out: dict[str, Any] = {
        "device": name,
        "params": n_params,
        "size": d,
        "batch": cfg["batch"],
        "step_s": step,
        "step_runs_s": times,
        "tflops": {k: v / 1e12 for k, v in achieved.items()},
        "peak_tflops": None if peak is None else peak / 1e12,
        "mfu": None if peak is None else {k: v / peak for k, v in achieved.items()},
        "peak_memory_gb": None if on_cpu else torch.cuda.max_memory_allocated() / 2**30,
    }
    raw = raw_opt = None  # free the baseline's memory before the checkpoint figures

    work = Path(work_dir)
    local = _local_tensors(strategy)  # on the GPU: torch.save copies them out itself
    strategy.save_checkpoint(work / "warmup", async_save=True)  # pinned buffers, gloo group
    strategy.wait_for_checkpoint()

    runs, _ = time_saves(strategy, local, work, 2 if quick else 4)
    out["checkpoint_runs_s"] = runs
    out["checkpoint_gb"] = sum(t.numel() * t.element_size() for t in local.values()) / 1e9
    return out


def run(quick: bool = True) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available() and os.environ.get(ON_CPU) != "1":
        return {"status": "not available", "reason": "no CUDA device on this machine"}
    work_dir = tempfile.mkdtemp(prefix="shardwise-bench-gpu-")
    try:
        return run_ranks("gpu:gpu_case", 1, dict(work_dir=work_dir, quick=quick), timeout=1500)[0]
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    section_main("gpu", run)
