"""A profile, not a bench section (issue 27's small-state miss): a ~10M-parameter AdamW state
(256 tensors, DTensors sharded on dim 0) saved on 2 and 4 gloo ranks by
``save_sharded_checkpoint`` with DCP's central planning (``central_plan=True``) and with each
rank planning alone (the default), against writing the same bytes with os.write + fsync on
every rank at once; medians of 5 after one warm-up, files under /tmp. Prints the load average
before each world size (the machine is shared: repeat the run). Figures: bench/RESULTS.md,
section 8.1, "Small-state save".

    python bench/small_save_profile.py
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.distributed import run_distributed


def rank_fn(root):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from shardwise.checkpoint.sharded import save_sharded_checkpoint

    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    shapes = [(320, 320)] * 96 + [(320,)] * 160  # ~9.9M parameters in 256 tensors
    model = {
        f"p{i}": distribute_tensor(torch.randn(s), mesh, [Shard(0)]) for i, s in enumerate(shapes)
    }
    optim = {
        "state": {
            k: {
                "step": torch.tensor(1.0),
                "exp_avg": distribute_tensor(torch.randn(v.shape), mesh, [Shard(0)]),
                "exp_avg_sq": distribute_tensor(torch.randn(v.shape), mesh, [Shard(0)]),
            }
            for k, v in model.items()
        },
        "param_groups": [{"lr": 1e-3, "params": list(model)}],
    }
    state = {"state_dict": model, "optimizer": optim, "meta": {"iter": 1}}
    nbytes = sum(t.to_local().numel() * 4 for t in model.values()) * 3
    out = {"central": [], "alone": [], "raw": []}
    for i in range(6):
        for mode in ("central", "alone", "raw"):
            d = os.path.join(root, f"{mode}{i}")
            os.makedirs(d, exist_ok=True)
            dist.barrier()
            t = time.perf_counter()
            if mode == "raw":
                buf = bytearray(nbytes)
                fd = os.open(os.path.join(d, f"r{rank}"), os.O_WRONLY | os.O_CREAT)
                os.write(fd, buf)
                os.fsync(fd)
                os.close(fd)
            else:
                save_sharded_checkpoint(state, d, central_plan=(mode == "central"))
            dist.barrier()
            if i:
                out[mode].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in out.items()}


if __name__ == "__main__":
    for world in (2, 4):
        print("load average", os.getloadavg())
        root = tempfile.mkdtemp(prefix="shardwise-small-save-")
        res = run_distributed(rank_fn, world, root, init_pg=True, timeout=600)
        r = res[0]
        print(
            world,
            {k: round(v, 4) for k, v in r.items()},
            "central/raw",
            round(r["central"] / r["raw"], 2),
            "alone/raw",
            round(r["alone"] / r["raw"], 2),
        )
        shutil.rmtree(root)
