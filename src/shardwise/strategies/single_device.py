"""SingleDeviceStrategy: one process, one device (CUDA when available, else CPU)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from shardwise.registry import STRATEGIES

from .base import BaseStrategy
from .sync_bn import CPUSyncBatchNorm

__all__ = ["SingleDeviceStrategy", "revert_sync_batchnorm"]


def revert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every ``SyncBatchNorm`` by a ``BatchNorm{1,2,3}d``-equivalent module with
    the same parameters and running statistics (it needs no process group)."""
    if isinstance(module, nn.SyncBatchNorm | CPUSyncBatchNorm):
        converted = _SyncFreeBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
        )
        converted.load_state_dict(module.state_dict())
        converted.train(module.training)
        return converted
    for name, child in module.named_children():
        new_child = revert_sync_batchnorm(child)
        if new_child is not child:
            setattr(module, name, new_child)
    return module


class _SyncFreeBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm for any input rank (SyncBatchNorm does not record which one it replaced)."""

    def _check_input_dim(self, input):  # noqa: A002 - torch's signature
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")


@STRATEGIES.register_module()
class SingleDeviceStrategy(BaseStrategy):
    """Train on one device: the CUDA device when CUDA is available, else the CPU.

    Example::

        >>> strategy = SingleDeviceStrategy(work_dir='work_dirs/demo')
        >>> model = strategy.prepare(torch.nn.Linear(2, 1))
    """

    def _wrap_model(self, model: nn.Module, compile: Any = False) -> nn.Module:
        model = revert_sync_batchnorm(model)
        return self.compile_model(model.to(self.device), compile)
