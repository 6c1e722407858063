"""Fit y = sum(x) with a small MLP; the loop is yours, the strategy owns the rest."""

import argparse

import torch

from shardwise import build_strategy

parser = argparse.ArgumentParser()
parser.add_argument("--strategy", default="SingleDeviceStrategy")  # DDPStrategy under torchrun
parser.add_argument("--work-dir", default="work_dirs/quickstart")
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

strategy = build_strategy(
    dict(type=args.strategy, work_dir=args.work_dir, env_kwargs=dict(randomness=dict(seed=0)))
)
model, optim_wrapper, schedulers = strategy.prepare(
    torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)),
    optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-2)),
    param_scheduler=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, end=10)],
    dispatch_kwargs=dict(max_iters=args.steps),
)
data = torch.Generator().manual_seed(strategy.rank)  # each rank its own batches
for step in range(1, args.steps + 1):
    x = torch.randn(32, 8, generator=data)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    optim_wrapper.update_params(loss)
    for scheduler in schedulers:
        scheduler.step()
    if step == 1 or step % 25 == 0:
        strategy.logger.info(f"step {step}  loss {loss.item():.4f}")
strategy.save_checkpoint(f"iter_{args.steps}.pth")  # committed atomically; work_dir/last_checkpoint
