"""Quickstart: fit y = sum(x) with a small MLP through a shardwise strategy, on CPU.

    python examples/quickstart.py                      # one process
    torchrun --nproc-per-node 2 examples/quickstart.py --strategy DDPStrategy

The training loop is yours; the strategy owns devices, the process group, the optimizer
wrapper, the schedulers and checkpoints.
"""

import argparse

import torch
import torch.nn as nn

from shardwise.strategies import build_strategy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--strategy", default="SingleDeviceStrategy")
    parser.add_argument("--work-dir", default="work_dirs/quickstart")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    strategy = build_strategy(
        dict(type=args.strategy, work_dir=args.work_dir, env_kwargs=dict(randomness=dict(seed=0)))
    )
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    model, optim_wrapper, schedulers = strategy.prepare(
        model,
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-2)),
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.1, by_epoch=False, end=20),
            dict(type="CosineAnnealingLR", by_epoch=False, begin=20, eta_min=1e-4),
        ],
        dispatch_kwargs=dict(max_iters=args.steps),
    )
    generator = torch.Generator().manual_seed(strategy.rank)
    for step in range(1, args.steps + 1):
        x = torch.randn(64, 8, generator=generator)
        with optim_wrapper.optim_context(model):
            loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        optim_wrapper.update_params(loss)
        for scheduler in schedulers:
            scheduler.step()
        if step % 50 == 0 or step == 1:
            lr = optim_wrapper.get_lr()["lr"][0]
            strategy.logger.info(f"step {step:4d}  loss {loss.item():.4f}  lr {lr:.2e}")
    strategy.save_checkpoint(f"iter_{args.steps}.pth")


if __name__ == "__main__":
    main()
