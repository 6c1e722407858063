"""Registries resolve `type` by registered name, class, or dotted import path, and build."""

import functools

import pytest
import torch

from shardwise.registry import MODELS, OPTIMIZERS, Registry, build_from_cfg


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


def test_building_an_unknown_name_lists_the_closest_registered_names():
    params = [torch.zeros(1, requires_grad=True)]
    with pytest.raises(
        KeyError, match=r"AdamX is not in the shardwise::optimizer registry \(did you mean 'Adam'"
    ):
        OPTIMIZERS.build(dict(type="AdamX"), default_args=dict(params=params))
    with pytest.raises(KeyError, match="did you mean 'Adam'"):
        OPTIMIZERS.resolve("AdamX")


def test_get_of_an_unknown_name_or_dotted_path_is_none_as_in_mmengine():
    assert OPTIMIZERS.get("AdamX") is None
    assert OPTIMIZERS.get("torch.optim.NoSuchOptimizer") is None
    assert "AdamX" not in OPTIMIZERS
    assert "torch.optim.AdamW" in OPTIMIZERS
    with pytest.raises(KeyError, match="torch.optim.NoSuchOptimizer is not in"):
        OPTIMIZERS.resolve("torch.optim.NoSuchOptimizer")


def test_a_dotted_path_names_a_class_function_or_module_not_any_attribute():
    assert OPTIMIZERS.get("torch.optim") is torch.optim
    assert OPTIMIZERS.get("torch.optim.lr_scheduler.StepLR") is torch.optim.lr_scheduler.StepLR
    assert OPTIMIZERS.get("torch.float32") is None  # an attribute, neither class nor function


def test_a_module_that_fails_to_import_raises_its_own_error(tmp_path, monkeypatch):
    (tmp_path / "broken_pkg_for_registry.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        OPTIMIZERS.get("broken_pkg_for_registry.Thing")


def test_duplicate_registration_needs_force(models):
    class Other:
        pass

    with pytest.raises(KeyError, match="already registered.*force=True"):
        models.register_module(name="Linear", module=Other)
    models.register_module(name="Linear", module=Other, force=True)
    assert models.get("Linear") is Other


def test_missing_type_key_names_the_keys(models):
    with pytest.raises(KeyError, match='must contain the key "type"'):
        models.build(dict(width=1))


def test_bad_constructor_arguments_name_the_class(models):
    with pytest.raises(TypeError, match="building Linear from the model registry"):
        models.build(dict(type="Linear", depth=2))


def test_type_may_come_from_default_args(models):
    obj = models.build(dict(width=4), default_args=dict(type="Linear"))
    assert obj.width == 4


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda reg: build_from_cfg("Linear", reg), TypeError, "cfg should be a dict"),
        (lambda reg: build_from_cfg(dict(type=1000), reg), TypeError, "type must be a str"),
        (lambda reg: build_from_cfg(dict(type="Linear"), "MODELS"), TypeError, "registry must"),
        (
            lambda reg: build_from_cfg(dict(type="Linear", width=1), reg, default_args=1),
            TypeError,
            "default_args should be a dict",
        ),
        (lambda reg: reg.register_module(force=1), TypeError, "force must be a boolean"),
        (lambda reg: reg.register_module(name=7), TypeError, "name must be None, an instance"),
        (lambda reg: reg.register_module(module="x"), TypeError, "module must be Callable"),
        (lambda reg: reg.get(None), TypeError, "must be a str"),
    ],
)
def test_bad_arguments_are_refused_with_the_value_named(models, call, error, match):
    with pytest.raises(error, match=match):
        call(models)


def test_names_partials_and_lambdas_can_be_registered(models):
    def bark(word, times):
        return " ".join([word] * times)

    models.register_module(name=["bark", "woof"], module=bark)
    models.register_module("dog_bark", False, functools.partial(bark, word="woof"))
    models.register_module(name="lambda dog", module=lambda name: name)
    assert models.get("woof") is bark
    assert models.build(dict(type="dog_bark", times=2)) == "woof woof"
    assert models.build(dict(type="lambda dog", name="rex")) == "rex"
    assert len(models) == 6 and "lambda dog" in models


def test_config_and_config_dict_build_like_a_dict(models):
    from shardwise.config import Config, ConfigDict

    for cfg in (ConfigDict(type="Linear", width=3), Config(dict(type="Linear", width=3))):
        assert models.build(cfg, default_args=ConfigDict(bias=False)).bias is False


def test_the_model_registry_builds_a_sequential_from_a_list():
    model = MODELS.build(
        [dict(type="torch.nn.Linear", in_features=2, out_features=3), dict(type="torch.nn.ReLU")]
    )
    assert isinstance(model, torch.nn.Sequential)
    assert [type(m) for m in model] == [torch.nn.Linear, torch.nn.ReLU]


def test_a_class_with_named_global_instances_is_built_through_get_instance(models):
    @models.register_module()
    class Visualizer:  # mmengine's ManagerMixin protocol
        _instance_dict: dict = {}

        def __init__(self, name):
            self.name = name

        @classmethod
        def get_instance(cls, name, **kwargs):
            return cls._instance_dict.setdefault(name, cls(name, **kwargs))

    first = models.build(dict(type="Visualizer", name="vis"))
    assert models.build(dict(type="Visualizer", name="vis")) is first
    assert Visualizer._instance_dict == {"vis": first}


def test_repr_names_the_registry_and_its_entries(models):
    text = repr(models)
    assert "Registry of model" in text and "Alias" in text and "Linear" in text


def test_registries_with_locations_import_them_on_first_lookup():
    from shardwise.registry import PARAM_SCHEDULERS

    assert "LinearLR" in PARAM_SCHEDULERS
    assert "CosineAnnealingLR" in PARAM_SCHEDULERS.module_dict
