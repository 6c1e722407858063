"""Strategies: where and how a model trains (one device, DDP, FSDP2)."""

from .base import BaseStrategy
from .ddp import DDPStrategy, ShardwiseDistributedDataParallel
from .single_device import SingleDeviceStrategy, revert_sync_batchnorm

__all__ = [
    "BaseStrategy",
    "SingleDeviceStrategy",
    "DDPStrategy",
    "ShardwiseDistributedDataParallel",
    "revert_sync_batchnorm",
    "build_strategy",
]


def build_strategy(cfg):
    """Build a strategy from a config (``dict(type='DDPStrategy', ...)``) or return an
    already built one."""
    from shardwise.registry import STRATEGIES

    if isinstance(cfg, BaseStrategy):
        return cfg
    return STRATEGIES.build(cfg)
