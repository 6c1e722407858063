"""Small models and training loops the strategy tests share (importable by spawned ranks)."""

from __future__ import annotations

import torch
import torch.nn as nn

from shardwise.registry import MODELS


@MODELS.register_module()
class ToyNet(nn.Module):
    """An MLP with BatchNorm and dropout, so that buffers and RNG state both matter."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(4, width),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(width, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ToyGAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Linear(2, 4)
        self.discriminator = nn.Linear(4, 1)


def toy_batch(step: int, rank: int = 0, batch: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic data per (step, rank); the model's dropout draws from the global RNG."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(batch, 4, generator=gen)
    return x, x.sum(1, keepdim=True)


def train_steps(model, optim_wrapper, schedulers, steps, rank: int = 0) -> list[float]:
    losses = []
    for step in steps:
        x, y = toy_batch(step, rank)
        with optim_wrapper.optim_context(model):
            loss = (model(x) - y).pow(2).mean()
        optim_wrapper.update_params(loss)
        for scheduler in schedulers:
            scheduler.step()
        losses.append(loss.item())
    return losses


def final_weights(strategy) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in strategy.model_state_dict().items()}
