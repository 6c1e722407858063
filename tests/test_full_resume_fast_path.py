"""The plain-tensor paths of a full load (issue 20): a model and optimizer without DTensors
load through their own ``load_state_dict``, and a load's checksum check hashes mapped pages;
both give what torch's helpers and ``file_checksum`` give."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from shardwise.checkpoint import manifest
from shardwise.strategies import state_dicts

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _model_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    groups = [
        {"params": [model[2].weight, model[0].weight]},
        {"params": [model[0].bias, model[2].bias], "lr": 0.1},
    ]
    return model, torch.optim.AdamW(groups, lr=1e-3)


def _step(model, optimizer):
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_the_plain_optimizer_path_loads_what_torch_s_helper_loads():
    model, optimizer = _model_and_optimizer()
    _step(model, optimizer)
    saved = get_optimizer_state_dict(model, optimizer, options=FULL)
    saved["param_groups"][0]["lr"] = 0.5
    saved["param_groups"][1]["params"].reverse()  # another order, same parameters
    by_torch, by_plain = [_model_and_optimizer(seed=1) for _ in range(2)]
    set_optimizer_state_dict(*by_torch, copy.deepcopy(saved), options=FULL)
    by_index = state_dicts._by_index(*by_plain, copy.deepcopy(saved), FULL)
    assert by_index is not None
    by_plain[1].load_state_dict(by_index)
    a, b = by_torch[1].state_dict(), by_plain[1].state_dict()
    for ga, gb in zip(a["param_groups"], b["param_groups"]):
        assert {k: list(v) if isinstance(v, tuple) else v for k, v in ga.items()} == {
            k: list(v) if isinstance(v, tuple) else v for k, v in gb.items()
        }
    assert a["state"].keys() == b["state"].keys()
    for index, per_param in a["state"].items():
        for key, value in per_param.items():
            assert torch.equal(value, b["state"][index][key])


def test_an_optimizer_state_of_other_parameters_goes_to_torch_s_helper():
    model, optimizer = _model_and_optimizer()
    _step(model, optimizer)
    saved = get_optimizer_state_dict(model, optimizer, options=FULL)
    saved["param_groups"][0]["params"] = ["0.weight", "nope.weight"]
    assert state_dicts._by_index(model, optimizer, saved, FULL) is None


def test_a_compiled_or_broadcast_model_goes_to_torch_s_helpers():
    model, _ = _model_and_optimizer()
    assert state_dicts._plain_module(model, FULL) is model
    assert (
        state_dicts._plain_module(
            model, StateDictOptions(broadcast_from_rank0=True, full_state_dict=True)
        )
        is None
    )
    assert state_dicts._plain_module(torch.compile(model), FULL) is None


@pytest.mark.parametrize("size", [0, 1, 4096, 3 * 4096 + 17])
def test_the_mapped_checksum_is_the_file_checksum(tmp_path, monkeypatch, size):
    monkeypatch.setattr(manifest, "_WINDOW", 4096)  # several windows, the last one partial
    path = tmp_path / "f.bin"
    path.write_bytes(torch.randint(0, 256, (size,), dtype=torch.uint8).numpy().tobytes())
    assert manifest._mapped_checksum(path) == manifest.file_checksum(path)
    assert manifest._mapped_checksum(path, algorithm="crc32") == manifest.file_checksum(
        path, algorithm="crc32"
    )


SHARDED = StateDictOptions(full_state_dict=False, cpu_offload=False)


def _entries_match(ours, theirs) -> bool:
    """Two state dicts with the same keys in the same order, the same tensors (a DTensor's
    local shard), the same plain values."""
    if isinstance(theirs, dict):
        return (
            isinstance(ours, dict)
            and list(ours) == list(theirs)
            and all(_entries_match(ours[k], theirs[k]) for k in theirs)
        )
    if isinstance(theirs, list):
        return len(ours) == len(theirs) and all(map(_entries_match, ours, theirs))
    if isinstance(theirs, torch.Tensor):
        return state_dicts._same(ours, theirs) and torch.equal(ours, theirs)
    return ours == theirs


def _remembered_state_dicts(layout: str) -> list[tuple[str, bool, bool]]:
    """For each model and optimizer state taken (twice, after a change of the parameters):
    whether it is torch's helper's, and whether torch's helper ran to take it."""
    from unittest import mock

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from shardwise.optim import OptimWrapper

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    if layout == "fsdp":
        fully_shard(model[0])
        fully_shard(model)
    elif layout == "ddp":
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    wrapper = OptimWrapper(optimizer)
    seen, extra = [], torch.zeros(())
    for round_ in range(4):
        if round_ == 2:  # a parameter group added: the names are taken again
            extra = nn.Parameter(torch.ones(3))
            model.register_parameter("extra", extra)
            optimizer.add_param_group({"params": [extra], "lr": 0.5})
        loss = model(torch.randn(2, 4)).sum() + extra.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        for what in ("model", "optimizer"):
            helper = "get_model_state_dict" if what == "model" else "get_optimizer_state_dict"
            real = getattr(state_dicts, helper)
            with mock.patch.object(state_dicts, helper, side_effect=real) as called:
                ours = (
                    state_dicts.model_state(model, SHARDED)
                    if what == "model"
                    else state_dicts.get_optim_state(model, wrapper, SHARDED)
                )
            theirs = (
                get_model_state_dict(model, options=SHARDED)
                if what == "model"
                else get_optimizer_state_dict(model, optimizer, options=SHARDED)
            )
            if what == "optimizer":
                ours = {k: ours[k] for k in ("state", "param_groups")}
            seen.append((f"{what} {round_}", _entries_match(ours, theirs), called.called))
    dist.barrier()
    return seen


@pytest.mark.parametrize("layout", ["plain", "ddp", "fsdp"])
def test_a_remembered_state_dict_is_torch_s_helper_s(layout):
    # model_state and get_optim_state call torch's helpers once, then take the model's and
    # the optimizer's own state_dict() where the helper returned it as it is (renamed): the
    # same entries, the same tensors, until the parameters change
    from tests.distributed import run_distributed

    for seen in run_distributed(_remembered_state_dicts, 2, layout, init_pg=True):
        assert all(same for _, same, _ in seen), seen
        helper_ran = {what: ran for what, _, ran in seen}
        for what in ("model", "optimizer"):
            # DDP's model keys are renamed (its module. prefix): torch's helper takes each
            remembered = not (what == "model" and layout == "ddp")
            for round_, first in enumerate([True, False, True, False]):
                assert helper_ran[f"{what} {round_}"] == (first or not remembered), (what, seen)
