"""DefaultOptimizerConstructor's parameter-wise rules and build_optim_wrapper (mmengine's)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn as nn

from shardwise.optim import (
    AmpOptimWrapper,
    DefaultOptimizerConstructor,
    DefaultOptimWrapperConstructor,
    OptimWrapper,
    build_optim_wrapper,
)
from shardwise.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIMIZERS

BASE_LR = 0.01
BASE_WD = 0.9
MOMENTUM = 0.0001
SGD_CFG = dict(type="SGD", lr=BASE_LR, weight_decay=BASE_WD, momentum=MOMENTUM)
PARAMWISE = dict(
    bias_lr_mult=2,
    bias_decay_mult=0.5,
    norm_decay_mult=0,
    dwconv_decay_mult=0.1,
    dcn_offset_lr_mult=0.1,
    flat_decay_mult=0.3,
)


class SubModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 2, kernel_size=1, groups=2)  # depthwise
        self.gn = nn.GroupNorm(2, 2)
        self.param1 = nn.Parameter(torch.ones(1))


class ExampleModel(nn.Module):
    """mmengine's test model: a flat param, convs with and without bias, norms, a depthwise
    conv in a submodule."""

    def __init__(self) -> None:
        super().__init__()
        self.param1 = nn.Parameter(torch.ones(1))
        self.conv1 = nn.Conv2d(3, 4, kernel_size=1, bias=False)
        self.conv2 = nn.Conv2d(4, 2, kernel_size=1)
        self.bn = nn.BatchNorm2d(2)
        self.sub = SubModel()


class PseudoDataParallel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.module = ExampleModel()


def _settings(optim_wrapper: OptimWrapper, model: nn.Module) -> dict[str, tuple[float, float]]:
    """{parameter name: (lr, weight_decay)} from the built optimizer's param groups."""
    groups = optim_wrapper.optimizer.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(len(g["params"]) == 1 for g in groups)
    return {names[id(g["params"][0])]: (g["lr"], g["weight_decay"]) for g in groups}


def _expected_paramwise(prefix: str = "") -> dict[str, tuple[float, float]]:
    lr, wd = BASE_LR, BASE_WD
    expected = {
        "param1": (lr, wd * 0.3),  # flat
        "conv1.weight": (lr, wd),
        "conv2.weight": (lr, wd),
        "conv2.bias": (lr * 2, wd * 0.5),  # bias
        "bn.weight": (lr, 0.0),  # norm
        "bn.bias": (lr, 0.0),  # norm: no bias lr mult
        "sub.param1": (lr, wd * 0.3),
        "sub.conv1.weight": (lr, wd * 0.1),  # depthwise
        "sub.conv1.bias": (lr * 2, wd * 0.5),  # bias wins over depthwise
        "sub.gn.weight": (lr, 0.0),
        "sub.gn.bias": (lr, 0.0),
    }
    return {prefix + k: v for k, v in expected.items()}


def test_without_paramwise_cfg_all_parameters_share_one_group():
    model = ExampleModel()
    optim_wrapper = DefaultOptimizerConstructor(dict(optimizer=SGD_CFG))(model)
    assert isinstance(optim_wrapper, OptimWrapper)
    (group,) = optim_wrapper.optimizer.param_groups
    assert group["params"] == list(model.parameters())
    assert optim_wrapper.optimizer.defaults["momentum"] == MOMENTUM


def test_paramwise_rules_set_lr_and_weight_decay_per_parameter():
    model = ExampleModel()
    optim_wrapper = DefaultOptimizerConstructor(dict(optimizer=SGD_CFG), PARAMWISE)(model)
    settings = _settings(optim_wrapper, model)
    assert list(settings) == [n for n, _ in model.named_parameters()]
    assert settings == _expected_paramwise()
    assert all(g["momentum"] == MOMENTUM for g in optim_wrapper.optimizer.param_groups)


def test_a_data_parallel_wrapper_is_looked_through():
    model = PseudoDataParallel()
    optim_wrapper = DefaultOptimizerConstructor(dict(optimizer=SGD_CFG), PARAMWISE)(model)
    assert _settings(optim_wrapper, model) == _expected_paramwise("module.")


def test_custom_keys_take_precedence_and_the_longest_key_wins():
    model = ExampleModel()
    paramwise_cfg = dict(
        custom_keys={
            "param1": dict(lr_mult=10),
            "sub": dict(lr_mult=0.1, decay_mult=0),
            "sub.gn": dict(lr_mult=0.01),
            "non_exist_key": dict(lr_mult=0.0),
        },
        norm_decay_mult=0.5,
    )
    optim_wrapper = DefaultOptimizerConstructor(dict(optimizer=SGD_CFG), paramwise_cfg)(model)
    lr, wd = BASE_LR, BASE_WD
    assert _settings(optim_wrapper, model) == (
        {
            "param1": (lr * 10, wd),
            "conv1.weight": (lr, wd),
            "conv2.weight": (lr, wd),
            "conv2.bias": (lr, wd),
            "bn.weight": (lr, wd * 0.5),
            "bn.bias": (lr, wd * 0.5),
            "sub.param1": (lr * 10, wd),  # 'param1' is longer than 'sub'
            "sub.conv1.weight": (lr * 0.1, 0.0),
            "sub.conv1.bias": (lr * 0.1, 0.0),
            "sub.gn.weight": (lr * 0.01, wd),  # custom keys skip norm_decay_mult
            "sub.gn.bias": (lr * 0.01, wd),
        }
    )
    # The custom settings themselves are kept in the group, as mmengine does.
    assert optim_wrapper.optimizer.param_groups[0]["lr_mult"] == 10


def test_custom_keys_of_equal_length_match_in_alphabetical_order():
    model = nn.Sequential()
    model.add_module("ab", nn.Linear(1, 1))
    paramwise_cfg = dict(custom_keys={"b.": dict(lr_mult=2), "ab": dict(lr_mult=3)})
    optim_wrapper = DefaultOptimizerConstructor(dict(optimizer=SGD_CFG), paramwise_cfg)(model)
    assert [g["lr"] for g in optim_wrapper.optimizer.param_groups] == [BASE_LR * 3] * 2


def test_frozen_parameters_are_left_out_when_rules_apply(caplog):
    # mmengine's rule (it changed from keeping them with default settings): with paramwise
    # rules a frozen parameter gets no group; without rules every parameter is handed over
    model = ExampleModel()
    model.conv1.requires_grad_(False)
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        optim_wrapper = DefaultOptimizerConstructor(dict(optimizer=SGD_CFG), PARAMWISE)(model)
    expected = _expected_paramwise()
    del expected["conv1.weight"]
    assert _settings(optim_wrapper, model) == expected
    assert "conv1.weight is skipped since its requires_grad=False" in caplog.text
    (group,) = DefaultOptimizerConstructor(dict(optimizer=SGD_CFG))(model).optimizer.param_groups
    assert group["params"] == list(model.parameters())


def test_shared_parameters_need_bypass_duplicate(caplog):
    model = ExampleModel()
    model.conv3 = nn.Sequential(model.conv1)  # conv1's weight under a second name
    with pytest.raises(
        ValueError, match=r"more than one parameter group: conv3\.0\.weight .*bypass_duplicate=True"
    ):
        DefaultOptimizerConstructor(dict(optimizer=SGD_CFG), PARAMWISE)(model)
    paramwise_cfg = dict(PARAMWISE, bypass_duplicate=True)
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        optim_wrapper = DefaultOptimizerConstructor(dict(optimizer=SGD_CFG), paramwise_cfg)(model)
    assert "duplicate" in caplog.text
    assert _settings(optim_wrapper, model) == _expected_paramwise()


def test_several_param_groups_report_base_lr():
    model = ExampleModel()
    paramwise_cfg = dict(custom_keys={"conv1.weight": dict(lr_mult=0.1)})
    optim_wrapper = DefaultOptimizerConstructor(
        dict(optimizer=dict(type="SGD", lr=0.1)), paramwise_cfg
    )(model)
    lrs = optim_wrapper.get_lr()
    assert lrs["base_lr"] == [0.1]
    # 'conv1.weight' also matches 'sub.conv1.weight' (index 7): keys match as substrings.
    assert lrs["lr"] == [0.1, 0.1 * 0.1] + [0.1] * 5 + [0.1 * 0.1] + [0.1] * 3


def test_a_paramwise_key_no_rule_reads_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        constructor = DefaultOptimizerConstructor(dict(optimizer=SGD_CFG), dict(invalid_mult=1))
    assert "paramwise_cfg keys ['invalid_mult']" in caplog.text
    assert "check their spelling" in caplog.text
    assert constructor.paramwise_cfg == dict(invalid_mult=1)


class ConvLrConstructor(DefaultOptimizerConstructor):
    """mmengine's example of a custom constructor: it reads its own ``conv1_lr_mult``."""

    def __call__(self, model):
        lr_mult = self.paramwise_cfg.get("conv1_lr_mult", 1.0)
        groups = [
            {"params": [p], **({"lr": self.base_lr * lr_mult} if n.startswith("conv1") else {})}
            for n, p in model.named_parameters()
        ]
        return OPTIMIZERS.build(dict(self.optimizer_cfg, params=groups))


def test_a_subclass_reads_its_own_paramwise_keys():
    constructor = ConvLrConstructor(dict(optimizer=SGD_CFG), dict(conv1_lr_mult=5))
    optimizer = constructor(ExampleModel())
    assert [g["lr"] for g in optimizer.param_groups][:3] == [BASE_LR, BASE_LR * 5, BASE_LR]


def test_a_subclass_lists_the_keys_it_reads_to_silence_the_warning(caplog):
    class Declared(ConvLrConstructor):
        paramwise_keys = ConvLrConstructor.paramwise_keys | {"conv1_lr_mult"}

    with caplog.at_level(logging.WARNING, logger="shardwise"):
        Declared(dict(optimizer=SGD_CFG), dict(conv1_lr_mult=5))
    assert not caplog.records


# ---------------------------------------------------------------------- build_optim_wrapper


@pytest.mark.parametrize("optimizer_type", ["AdamW", torch.optim.AdamW, "torch.optim.AdamW"])
def test_build_optim_wrapper_resolves_the_optimizer_type(optimizer_type):
    cfg = dict(optimizer=dict(type=optimizer_type, lr=1e-3))
    optim_wrapper = build_optim_wrapper(nn.Linear(2, 1), cfg)
    assert type(optim_wrapper) is OptimWrapper
    assert isinstance(optim_wrapper.optimizer, torch.optim.AdamW)
    assert optim_wrapper.get_lr() == {"lr": [1e-3]}


def test_build_optim_wrapper_passes_wrapper_arguments_and_leaves_cfg_untouched():
    cfg = dict(
        type="AmpOptimWrapper",
        dtype="bfloat16",
        optimizer=dict(type="SGD", lr=0.1, weight_decay=1e-4),
        accumulative_counts=4,
        clip_grad=dict(type="value", clip_value=1.0),
        paramwise_cfg=dict(bias_decay_mult=0.0),
    )
    snapshot = copy.deepcopy(cfg)
    model = nn.Linear(2, 1)
    optim_wrapper = build_optim_wrapper(model, cfg)
    assert isinstance(optim_wrapper, AmpOptimWrapper)
    assert optim_wrapper.cast_dtype == torch.bfloat16
    assert optim_wrapper.accumulative_counts == 4
    assert optim_wrapper.clip_grad_type == "value"
    assert [g["weight_decay"] for g in optim_wrapper.optimizer.param_groups] == [1e-4, 0.0]
    assert cfg == snapshot


@pytest.mark.parametrize(
    "constructor",
    [
        "DefaultOptimWrapperConstructor",
        DefaultOptimizerConstructor,
        dict(type="DefaultOptimizerConstructor"),
    ],
)
def test_build_optim_wrapper_accepts_a_constructor_by_name_class_or_config(constructor):
    cfg = dict(optimizer=SGD_CFG, constructor=constructor, paramwise_cfg=PARAMWISE)
    model = ExampleModel()
    optim_wrapper = build_optim_wrapper(model, cfg)
    assert _settings(optim_wrapper, model) == _expected_paramwise()


def test_mmengine_constructor_name_is_the_same_class():
    assert DefaultOptimWrapperConstructor is DefaultOptimizerConstructor
    assert OPTIM_WRAPPER_CONSTRUCTORS.get("DefaultOptimWrapperConstructor") is (
        DefaultOptimizerConstructor
    )


@pytest.mark.parametrize(
    ("paramwise_cfg", "optimizer", "error", "match"),
    [
        (dict(custom_keys=[0.1]), SGD_CFG, TypeError, "custom_keys'\\] must be a dict"),
        (dict(custom_keys={"sub": 0.1}), SGD_CFG, TypeError, "\\['sub'\\] must be a dict"),
        (dict(bias_lr_mult="2"), SGD_CFG, TypeError, "must be a number"),
        (dict(bypass_duplicate=1), SGD_CFG, TypeError, "must be a bool"),
        (dict(norm_decay_mult=0), dict(type="SGD", lr=0.1), ValueError, "no weight_decay"),
        (
            dict(custom_keys={"sub": dict(decay_mult=0)}),
            dict(type="SGD", lr=0.1),
            ValueError,
            "add weight_decay",
        ),
        (dict(bias_lr_mult=2), dict(type="SGD"), ValueError, "no lr to multiply"),
        ([("norm_decay_mult", 0)], SGD_CFG, TypeError, "paramwise_cfg must be None or a dict"),
    ],
)
def test_bad_paramwise_cfg_is_rejected_before_building(paramwise_cfg, optimizer, error, match):
    with pytest.raises(error, match=match):
        DefaultOptimizerConstructor(dict(optimizer=optimizer), paramwise_cfg)


@pytest.mark.parametrize(
    ("cfg", "error", "match"),
    [
        ([("optimizer", SGD_CFG)], TypeError, "must be a dict"),
        (dict(type="OptimWrapper"), ValueError, "must contain an 'optimizer'"),
        (dict(optimizer=dict(lr=0.1)), ValueError, "with a 'type' key"),
        (dict(optimizer=dict(type="SDG", lr=0.1)), KeyError, "did you mean 'SGD'"),
        (dict(type="OptimWraper", optimizer=SGD_CFG), KeyError, "OptimWraper"),
        (dict(optimizer=SGD_CFG, constructor="NoSuchConstructor"), KeyError, "NoSuch"),
    ],
)
def test_bad_optim_wrapper_cfg_is_rejected(cfg, error, match):
    with pytest.raises(error, match=match):
        build_optim_wrapper(nn.Linear(1, 1), cfg)


def test_a_built_optimizer_in_the_config_is_pointed_to_optim_wrapper():
    model = nn.Linear(1, 1)
    cfg = dict(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="OptimWrapper\\(optimizer\\)"):
        build_optim_wrapper(model, cfg)


# ---------------------------------------------------------------------- mmengine as the oracle


class DuplicateModel(ExampleModel):
    """mmengine's ExampleDuplicateModel: conv3 is conv1 under a second name."""

    def __init__(self) -> None:
        super().__init__()
        self.conv3 = nn.Sequential(self.conv1)


def _frozen_conv1(model: nn.Module) -> nn.Module:
    model.conv1.requires_grad_(False)
    return model


MMENGINE_CASES = {
    "no_rules": (ExampleModel, None),
    "rules": (ExampleModel, PARAMWISE),
    "data_parallel": (PseudoDataParallel, PARAMWISE),
    "frozen": (lambda: _frozen_conv1(ExampleModel()), PARAMWISE),
    "custom_keys": (
        ExampleModel,
        dict(
            custom_keys={"param1": dict(lr_mult=10), "sub": dict(lr_mult=0.1, decay_mult=0)},
            norm_decay_mult=0.5,
        ),
    ),
    "bypass_duplicate": (DuplicateModel, dict(PARAMWISE, bypass_duplicate=True)),
    "frozen_duplicate": (
        lambda: _frozen_conv1(DuplicateModel()),
        dict(PARAMWISE, bypass_duplicate=True),
    ),
}


def _groups(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[tuple[list[str], dict]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [
        ([names[id(p)] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
        for g in optimizer.param_groups
    ]


@pytest.mark.parametrize("case", sorted(MMENGINE_CASES))
def test_param_groups_are_mmengine_s(case):
    mm_optim = pytest.importorskip("mmengine.optim")
    make_model, paramwise_cfg = MMENGINE_CASES[case]
    model = make_model()
    cfg = dict(type="OptimWrapper", optimizer=SGD_CFG)
    expected = mm_optim.DefaultOptimWrapperConstructor(cfg, copy.deepcopy(paramwise_cfg))(model)
    actual = DefaultOptimizerConstructor(cfg, copy.deepcopy(paramwise_cfg))(model)
    assert _groups(actual.optimizer, model) == _groups(expected.optimizer, model)


def test_every_torch_optimizer_is_registered_under_its_name():
    from shardwise.optim.constructor import TORCH_OPTIMIZERS

    mm_builder = pytest.importorskip("mmengine.optim.optimizer.builder")
    assert set(TORCH_OPTIMIZERS) == set(mm_builder.TORCH_OPTIMIZERS)
    for name in TORCH_OPTIMIZERS:  # Adafactor under mmengine's name: 'Adafactor' is transformers'
        key = "TorchAdafactor" if name == "Adafactor" else name
        assert OPTIMIZERS.get(key) is getattr(torch.optim, name) is mm_builder.OPTIMIZERS.get(key)


def test_an_optimizer_of_the_default_scope_takes_the_parameters_as_its_first_argument():
    # mmengine's test: a downstream project registers an optimizer whose first argument is not
    # named `params` in its own registry; the default scope selects it
    from shardwise.registry import DefaultScope, Registry

    custom = Registry("custom optimizer", scope="custom_scope", parent=OPTIMIZERS)

    @custom.register_module()
    class CustomSGD(torch.optim.SGD):
        def __init__(self, model_params, **kwargs):
            super().__init__(params=model_params, **kwargs)

    try:
        model = ExampleModel()
        with DefaultScope.overwrite_default_scope("custom_scope"):
            optim_wrapper = build_optim_wrapper(
                model, dict(optimizer=dict(type="CustomSGD", lr=0.1))
            )
        assert type(optim_wrapper.optimizer) is CustomSGD
        assert optim_wrapper.optimizer.param_groups[0]["params"] == list(model.parameters())
    finally:
        OPTIMIZERS.children.pop("custom_scope")


def test_adafactor_names_follow_mmengine():
    """As mmengine registers them: torch's Adafactor as 'TorchAdafactor', transformers' as
    'Adafactor' (built without importing transformers until then)."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from shardwise.optim.constructor import TRANSFORMERS_OPTIMIZERS
    from shardwise.registry import OPTIMIZERS

    assert OPTIMIZERS.get("TorchAdafactor") is torch.optim.Adafactor
    assert TRANSFORMERS_OPTIMIZERS == ["Adafactor"]
    params = torch.nn.Linear(2, 2).parameters()
    built = OPTIMIZERS.build(dict(type="Adafactor", params=params, lr=1e-3, relative_step=False))
    assert isinstance(built, transformers.Adafactor)
