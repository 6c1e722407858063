"""ZeroRedundancyOptimizer built from a config (mmengine's ``optimizer_type`` form), on 2 ranks."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from shardwise.optim import ZeroRedundancyOptimizer, build_optim_wrapper
from tests.distributed import run_distributed

CFG = dict(type="ZeroRedundancyOptimizer", optimizer_type="SGD", lr=0.1, momentum=0.9)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def _train(optimizer_cfg: dict, paramwise_cfg: dict | None, steps: int = 3) -> tuple:
    model = _model()
    optim_wrapper = build_optim_wrapper(
        model, dict(optimizer=optimizer_cfg, paramwise_cfg=paramwise_cfg)
    )
    torch.manual_seed(1)  # the same data on every rank: the update is the plain optimizer's
    for _ in range(steps):
        optim_wrapper.update_params(model(torch.randn(6, 4)).pow(2).mean())
    return model, optim_wrapper


def _zero_matches_plain_sgd(paramwise_cfg: dict | None) -> tuple[int, dict, bool]:
    model, optim_wrapper = _train(CFG, paramwise_cfg)
    reference, _ = _train(dict(type="SGD", lr=0.1, momentum=0.9), paramwise_cfg)
    optimizer = optim_wrapper.optimizer
    assert isinstance(optimizer, ZeroRedundancyOptimizer)
    assert isinstance(optimizer.optim, torch.optim.SGD)  # the local optimizer of this rank
    same = all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))
    state = optimizer.state_dict()  # a collective: every rank calls it
    groups = [sorted(k for k in g if k != "params") for g in state.get("param_groups", [])]
    return optimizer.rank, {"n_state": len(state.get("state", {})), "groups": groups}, same


@pytest.mark.parametrize("paramwise_cfg", [None, dict(custom_keys={"0.": dict(lr_mult=0.5)})])
def test_zero_trains_like_its_local_optimizer_and_gathers_its_state_on_rank0(paramwise_cfg):
    results = run_distributed(_zero_matches_plain_sgd, 2, paramwise_cfg, init_pg=True)
    by_rank = {rank: (summary, same) for rank, summary, same in results}
    assert by_rank[0][1] and by_rank[1][1]  # every rank holds the plain optimizer's parameters
    assert by_rank[0][0]["n_state"] == 4  # rank 0 holds the momentum of all 4 parameters
    assert by_rank[1][0] == {"n_state": 0, "groups": []}  # the other ranks get {}


def test_zero_without_optimizer_type_is_a_type_error():
    with pytest.raises(TypeError, match="optimizer_type"):
        build_optim_wrapper(_model(), dict(optimizer=dict(type="ZeroRedundancyOptimizer", lr=0.1)))


def test_importing_shardwise_optim_leaves_torch_zero_unimported():
    # torch.distributed.optim compiles its functional optimizers with TorchScript on import
    # (~0.7 s, ~70 deprecation warnings): only a ZeroRedundancyOptimizer user pays for it
    code = "import sys, shardwise.optim; print('torch.distributed.optim' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
