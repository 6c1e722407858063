"""SyncBN on CPU: two ranks with half a batch each behave as one BatchNorm on the whole batch."""

import torch
import torch.nn as nn

from shardwise.strategies.single_device import revert_sync_batchnorm
from shardwise.strategies.sync_bn import CPUSyncBatchNorm, convert_sync_batchnorm
from tests.distributed import run_distributed


def _batch():
    return torch.randn(8, 3, 5, 5, generator=torch.Generator().manual_seed(0))


def _half_batch_on_each_rank():
    import torch.distributed as dist

    torch.manual_seed(0)
    model = convert_sync_batchnorm(nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)), "cpu")
    x = _batch().chunk(2)[dist.get_rank()].requires_grad_()
    out = model(x)
    offset = dist.get_rank() * out.numel()
    (out * torch.arange(offset, offset + out.numel()).view_as(out)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    for g in grads:
        dist.all_reduce(g)  # the sum over ranks equals the single-process gradient
    return out.detach(), x.grad, grads, model[1].running_mean, model[1].running_var


def test_cpu_sync_batchnorm_matches_batchnorm_on_the_global_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    x = _batch().requires_grad_()
    out = model(x)
    (out * torch.arange(out.numel()).view_as(out)).sum().backward()
    results = run_distributed(_half_batch_on_each_rank, 2, init_pg=True)
    torch.testing.assert_close(torch.cat([r[0] for r in results]), out.detach())
    torch.testing.assert_close(torch.cat([r[1] for r in results]), x.grad, atol=1e-4, rtol=1e-4)
    for got, expected in zip(results[0][2], [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, expected, atol=5e-2, rtol=1e-4)  # bias grads ~ 0
    torch.testing.assert_close(results[0][3], model[1].running_mean)
    torch.testing.assert_close(results[0][4], model[1].running_var)


def test_conversion_keeps_parameters_and_reverts():
    bn = nn.BatchNorm1d(3)
    bn.running_mean.fill_(2.0)
    synced = convert_sync_batchnorm(nn.Sequential(bn), "cpu")
    assert isinstance(synced[0], CPUSyncBatchNorm)
    assert torch.equal(synced[0].running_mean, torch.full((3,), 2.0))
    reverted = revert_sync_batchnorm(synced)
    assert not isinstance(reverted[0], CPUSyncBatchNorm)
    assert torch.equal(reverted[0].running_mean, torch.full((3,), 2.0))
    assert reverted(torch.randn(4, 3)).shape == (4, 3)
