"""Section 6 of RESULTS.md: the GPU run (bench/gpu.py)."""

from __future__ import annotations

from typing import Any

from _report import Report, _r, _s


def write(rep: Report, res: dict[str, Any]) -> None:
    rep.add("## 6. GPU (bench/gpu.py)", "")
    if res.get("status") == "not available":
        rep.add(
            f"Not run: {res.get('reason')}. On a CUDA machine `make bench` measures the model "
            "FLOPs utilisation of the GPT example at ~1B parameters (bf16 FSDP2, one GPU) "
            "against the raw `fully_shard` step, and async (pinned-memory staging) against "
            "synchronous sharded saves and `torch.save`.",
            "",
        )
        rep.problems.append(f"gpu: not available ({res.get('reason')})")
        return
    if rep.section_failed("gpu", res):
        return
    step, mfu, tflops = res["step_s"], res.get("mfu") or {}, res["tflops"]
    size = res["size"]
    rep.add(
        f"{res['device']}: GPT of {res['params'] / 1e9:.2f}B parameters ({size['n_layer']} "
        f"layers, d={size['n_embd']}), batch {res['batch']}×{size['block_size']} tokens, bf16 "
        "parameters with fp32 gradient reduction, AdamW; model FLOPs 6N + 12LdT per token; "
        f"peak {res.get('peak_tflops') or 'unknown'} TFLOP/s dense bf16.",
        "",
    )
    rep.table(
        ["contender", "step", "TFLOP/s", "MFU", "peak GPU memory"],
        [
            [
                name,
                _s(step[name]),
                f"{tflops[name]:.1f}",
                f"{mfu[name]:.1%}" if name in mfu else "–",
                f"{res['peak_memory_gb']:.1f} GiB" if res.get("peak_memory_gb") else "–",
            ]
            for name in ("shardwise", "raw")
        ],
    )
    runs = res["checkpoint_runs_s"]
    best = {k: min(v) for k, v in runs.items()}
    rep.table(
        ["checkpoint figure", "shardwise", "baseline", "ratio"],
        [
            [
                f"async save blocked ({res['checkpoint_gb']:.1f} GB, pinned staging)",
                _s(best["async blocked"]),
                f"sync save {_s(best['sync'])}",
                _r(best["async blocked"] / best["sync"]),
            ],
            [
                "sync sharded save",
                _s(best["sync"]),
                f"torch.save {_s(best['torch.save'])}",
                _r(best["sync"] / best["torch.save"]),
            ],
        ],
    )
