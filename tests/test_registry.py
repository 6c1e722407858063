"""Registries resolve `type` by registered name, class, or dotted import path."""

import pytest
import torch

from shardwise.registry import OPTIMIZERS, Registry, build_from_cfg


@pytest.fixture()
def models():
    reg = Registry("model")

    @reg.register_module()
    class Linear:
        def __init__(self, width, bias=True):
            self.width, self.bias = width, bias

    reg.register_module(name="Alias", module=Linear)
    return reg


def test_build_by_registered_name(models):
    obj = models.build(dict(type="Linear", width=3))
    assert (obj.width, obj.bias) == (3, True)
    assert models.get("Alias") is models.get("Linear")


def test_build_by_class_and_default_args(models):
    cls = models.get("Linear")
    obj = build_from_cfg(dict(type=cls), models, default_args=dict(width=5, bias=False))
    assert (obj.width, obj.bias) == (5, False)


def test_cfg_value_wins_over_default_args(models):
    assert models.build(dict(type="Linear", width=2), default_args=dict(width=9)).width == 2


def test_build_by_dotted_import_path():
    params = [torch.zeros(2, requires_grad=True)]
    opt = OPTIMIZERS.build(dict(type="torch.optim.AdamW", lr=0.5), default_args=dict(params=params))
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["lr"] == 0.5


def test_every_torch_optimizer_is_registered_by_class_name():
    for name in ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "LBFGS", "Adamax", "NAdam"):
        assert OPTIMIZERS.get(name) is getattr(torch.optim, name)


def test_unknown_name_lists_the_closest_registered_names():
    with pytest.raises(KeyError, match=r"'AdamX' is not in the optimizer registry.*'Adam'"):
        OPTIMIZERS.get("AdamX")


def test_unknown_dotted_path_is_a_key_error():
    with pytest.raises(KeyError, match="torch.optim.NoSuchOptimizer"):
        OPTIMIZERS.get("torch.optim.NoSuchOptimizer")


def test_duplicate_registration_needs_force(models):
    class Other:
        pass

    with pytest.raises(KeyError, match="already registered.*force=True"):
        models.register_module(name="Linear", module=Other)
    models.register_module(name="Linear", module=Other, force=True)
    assert models.get("Linear") is Other


def test_missing_type_key_names_the_keys(models):
    with pytest.raises(KeyError, match="needs a 'type' key"):
        models.build(dict(width=1))


def test_bad_constructor_arguments_name_the_class(models):
    with pytest.raises(TypeError, match="building Linear from the model registry"):
        models.build(dict(type="Linear", depth=2))
