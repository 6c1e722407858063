"""Synchronised BatchNorm that also works on CPU (gloo).

``torch.nn.SyncBatchNorm`` only runs on accelerators, and DDP refuses it on CPU modules.
:class:`CPUSyncBatchNorm` computes the batch statistics over every rank with differentiable
all-reduces, so gradients flow through the global mean and variance as they do in
``SyncBatchNorm``. :func:`convert_sync_batchnorm` picks the right one for the device.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

__all__ = ["CPUSyncBatchNorm", "convert_sync_batchnorm"]


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks whose gradient is the sum of every rank's gradient."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        tensor = tensor.clone()
        dist.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    return _AllReduceSum.apply(tensor, group)


class CPUSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics are those of the whole global batch."""

    def __init__(self, *args, process_group: dist.ProcessGroup | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:  # noqa: A002 - torch's name
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        group = self.process_group or (dist.group.WORLD if dist.is_initialized() else None)
        if not self.training or group is None or dist.get_world_size(group) == 1:
            return super().forward(input)
        dims = [0, *range(2, input.dim())]
        shape = [1, -1] + [1] * (input.dim() - 2)
        count = torch.tensor([input.numel() / input.shape[1]], dtype=input.dtype)
        total = all_reduce(count, group)
        mean = all_reduce(input.sum(dims), group) / total
        centred = input - mean.view(shape)
        var = all_reduce(centred.pow(2).sum(dims), group) / total
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), total.item())
        out = centred * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, n: float) -> None:
        self.num_batches_tracked.add_(1)
        momentum = 1.0 / self.num_batches_tracked.item() if self.momentum is None else self.momentum
        unbiased = var * n / max(n - 1, 1)
        self.running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
        self.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)


def convert_sync_batchnorm(
    module: nn.Module, device_type: str, process_group: dist.ProcessGroup | None = None
) -> nn.Module:
    """Replace BatchNorm layers by synchronised ones: ``torch.nn.SyncBatchNorm`` on an
    accelerator, :class:`CPUSyncBatchNorm` on the CPU."""
    if device_type != "cpu":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, CPUSyncBatchNorm
    ):
        converted = CPUSyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            process_group=process_group,
            device=module.running_mean.device if module.running_mean is not None else None,
        )
        converted.load_state_dict(module.state_dict())
        converted.train(module.training)
        return converted
    for name, child in module.named_children():
        new_child = convert_sync_batchnorm(child, device_type, process_group)
        if new_child is not child:
            setattr(module, name, new_child)
    return module
