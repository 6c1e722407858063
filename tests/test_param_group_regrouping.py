"""A resume lays the saved parameter groups out as its own optimizer groups the same parameters
(a pipeline stage's part of each group, one group per stage, one per parameter): each parameter
keeps the settings it was saved with, and the schedulers' per-group values follow."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shardwise.strategies.matching import regroup_optimizer_state, regroup_scheduler_states


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))


def _names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def _state(*groups: tuple[list[str], float]) -> dict:
    return {
        "state": {},
        "param_groups": [dict(lr=lr, initial_lr=lr, params=names) for names, lr in groups],
    }


def test_one_group_gathers_the_stages_groups_saved_with_the_same_settings():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    saved = _state((["0.weight", "0.bias"], 0.1), (["1.weight", "1.bias"], 0.1))
    state, mapping = regroup_optimizer_state(saved, optimizer, _names(model))
    assert mapping == [0]
    (group,) = state["param_groups"]
    assert group["lr"] == 0.1 and sorted(group["params"]) == sorted(_names(model).values())


def test_one_group_per_parameter_takes_each_parameters_saved_settings():
    model = _model()
    optimizer = torch.optim.SGD([{"params": [p]} for p in model.parameters()], lr=0.5)
    saved = _state((["0.weight", "0.bias"], 0.1), (["1.weight", "1.bias"], 0.2))
    state, mapping = regroup_optimizer_state(saved, optimizer, _names(model))
    assert mapping == [0, 0, 1, 1]
    assert [g["lr"] for g in state["param_groups"]] == [0.1, 0.1, 0.2, 0.2]


def test_groups_that_line_up_are_left_alone():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    saved = _state((list(_names(model).values()), 0.1))
    assert regroup_optimizer_state(saved, optimizer, _names(model)) == (saved, None)


def test_a_group_of_parameters_saved_with_different_settings_is_refused_naming_them():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    saved = _state((["0.weight", "0.bias"], 0.1), (["1.weight", "1.bias"], 0.2))
    with pytest.raises(ValueError, match=r"saved in groups 0 and 1, .*differ \(initial_lr, lr\)"):
        regroup_optimizer_state(saved, optimizer, _names(model))


def test_a_parameter_missing_on_either_side_is_named():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    saved = _state((["0.weight", "0.bias", "2.weight"], 0.1))
    with pytest.raises(
        ValueError, match=r"only here: 1\.weight, 1\.bias; only in the checkpoint: 2"
    ):
        regroup_optimizer_state(saved, optimizer, _names(model))


def test_the_schedulers_per_group_values_follow_the_regrouping():
    saved = [dict(base_values=[0.1, 0.2], _last_value=[0.05, 0.1], last_step=3)]
    (state,) = regroup_scheduler_states(saved, [0, 0, 1, 1])
    assert state == dict(
        base_values=[0.1, 0.1, 0.2, 0.2], _last_value=[0.05, 0.05, 0.1, 0.1], last_step=3
    )
