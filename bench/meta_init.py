"""Building a 1B-parameter GPT on the meta device against building it eagerly.

Each contender runs in a fresh process (so that one's memory does not count for the other),
and reports the wall time of construction and the peak resident memory it added:

- ``eager``: ``GPT(...)`` on the CPU in fp32, with torch's default initialisation (~4.5 GB);
- ``meta``: the same inside ``torch.device('meta')`` (what ``FSDPStrategy(skip_init_weights=
  True)`` and its ``init_module()`` do): no storage, no initialisation. Reported twice: the
  first build in the process (torch loads its meta kernels then) and a second one;
- ``fsdp``: ``FSDPStrategy(skip_init_weights=True).prepare(config)`` on ``--ranks`` ranks:
  built on meta, sharded, materialised and initialised shard by shard (per-rank figures).

Usage::

    python bench/meta_init.py                  # all three, 2 ranks for fsdp
    python bench/meta_init.py --skip-fsdp      # meta against eager only
    python bench/meta_init.py --out bench/meta_init.jsonl   # also append the JSON line

Prints a Markdown table and one JSON line (machine, figures) for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

SIZE = dict(n_layer=20, n_head=16, n_embd=2048, vocab_size=32000, block_size=1024)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM := VmRSS (Linux >= 4.0)
        f.write("5")


def _model_classes():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from shardwise.registry import MODELS

    class Block(nn.Module):
        def __init__(self, n_embd: int, n_head: int) -> None:
            super().__init__()
            self.n_head = n_head
            self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.qkv = nn.Linear(n_embd, 3 * n_embd)
            self.proj = nn.Linear(n_embd, n_embd)
            self.fc = nn.Linear(n_embd, 4 * n_embd)
            self.out = nn.Linear(4 * n_embd, n_embd)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_head, -1).unbind(2)
            y = F.scaled_dot_product_attention(*(z.transpose(1, 2) for z in (q, k, v)))
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    @MODELS.register_module(force=True)
    class BenchGPT(nn.Module):
        _no_split_modules = ["Block"]

        def __init__(self, n_layer, n_head, n_embd, vocab_size, block_size) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab_size, n_embd)
            self.pos = nn.Embedding(block_size, n_embd)
            self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(n_embd)
            self.head = nn.Linear(n_embd, vocab_size, bias=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            h = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                h = block(h)
            return self.head(self.ln_f(h))

    return BenchGPT


def child(mode: str) -> dict:
    """Run one contender in this (fresh) process."""
    import torch

    import shardwise.strategies  # noqa: F401 - imported by any FSDPStrategy user, not timed

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("WORLD_SIZE", 1))))
    gpt = _model_classes()
    _reset_peak()
    before = _status_kb("VmRSS")
    start = time.perf_counter()
    if mode == "eager":
        model = gpt(**SIZE)
    elif mode == "meta":
        with torch.device("meta"):
            model = gpt(**SIZE)
        cold = time.perf_counter() - start  # torch loads its meta kernels on first use
        start = time.perf_counter()
        with torch.device("meta"):
            model = gpt(**SIZE)
    else:
        import logging

        from shardwise.strategies import FSDPStrategy

        logging.getLogger("shardwise").setLevel(logging.WARNING)
        strategy = FSDPStrategy(work_dir="/tmp/shardwise_bench_meta_init", skip_init_weights=True)
        _reset_peak()  # the process group and the logger are not the model's
        before = _status_kb("VmRSS")
        start = time.perf_counter()
        model = strategy.prepare(dict(type="BenchGPT", **SIZE))
    seconds = time.perf_counter() - start
    peak = _status_kb("VmHWM")
    params = sum(p.numel() for p in model.parameters())  # global sizes, also for DTensors
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    return dict(
        mode=mode,
        rank=int(os.environ.get("RANK", 0)),
        params=params,
        local_params=local if mode == "fsdp" else params,
        seconds=round(seconds, 3),
        first_build_seconds=round(cold, 3) if mode == "meta" else round(seconds, 3),
        peak_added_mb=round((peak - before) / 1024, 1),
        peak_rss_mb=round(peak / 1024, 1),
    )


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_child(mode: str, ranks: int) -> list[dict]:
    script = str(Path(__file__).resolve())
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // ranks))}
    if mode != "fsdp":
        cmd = [sys.executable, script, "--child", mode]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            f"--master-port={_free_port()}",
            script,
            "--child",
            mode,
        ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return [
        json.loads(line[len("RESULT ") :])
        for line in proc.stdout.splitlines()
        if line.startswith("RESULT ")
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the fsdp contender")
    parser.add_argument("--skip-fsdp", action="store_true", help="meta against eager only")
    parser.add_argument("--out", help="append the JSON line to this file")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child)), flush=True)
        return
    rows = _run_child("meta", 1) + _run_child("eager", 1)
    if not args.skip_fsdp:
        rows += sorted(_run_child("fsdp", args.ranks), key=lambda r: r["rank"])
    meta = next(r for r in rows if r["mode"] == "meta")
    eager = next(r for r in rows if r["mode"] == "eager")
    print(f"GPT {SIZE}: {meta['params'] / 1e9:.2f}B parameters\n")
    print(
        "| contender | rank | time (s) | first build in the process (s) | peak RSS added (MB) "
        "| peak RSS (MB) | params held |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['rank']} | {r['seconds']:.3f} | {r['first_build_seconds']:.3f} "
            f"| {r['peak_added_mb']:.0f} | {r['peak_rss_mb']:.0f} "
            f"| {r['local_params'] / 1e9:.3f}B |"
        )
    print(
        f"\nmeta / eager: time x{meta['first_build_seconds'] / eager['seconds']:.3f} (first "
        f"build), x{meta['seconds'] / eager['seconds']:.4f} (warm); peak memory added "
        f"x{meta['peak_added_mb'] / max(eager['peak_added_mb'], 1e-9):.4f}"
    )
    record = dict(
        bench="meta_init",
        time=time.strftime("%Y-%m-%d %H:%M:%S"),
        machine=dict(
            cpu=platform.processor() or platform.machine(),
            cores=os.cpu_count(),
            python=platform.python_version(),
            torch=__import__("torch").__version__,
        ),
        size=SIZE,
        rows=rows,
    )
    line = json.dumps(record)
    print("\n" + line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
