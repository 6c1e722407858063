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
