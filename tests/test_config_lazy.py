"""Lazy (``with read_base():``) configs: base configs imported as modules, other imports kept
as references that are imported only when a value is read."""

from __future__ import annotations

import copy
import pickle
import sys
from pathlib import Path

import pytest
import torch

from shardwise.config import (
    Config,
    ConfigDict,
    ConfigParsingError,
    LazyAttr,
    LazyObject,
)

LAZY = Path(__file__).parent / "data" / "configs" / "lazy"


def test_a_lazy_config_imports_nothing_until_a_value_is_read(monkeypatch):
    monkeypatch.syspath_prepend(str(LAZY))
    monkeypatch.delitem(sys.modules, "shardwise_lazy_probe", raising=False)
    cfg = Config.fromfile(LAZY / "probe.py")
    assert "shardwise_lazy_probe" not in sys.modules
    assert cfg.to_dict()["model"] == {"type": "shardwise_lazy_probe.Probe", "width": 2}
    assert "shardwise_lazy_probe" not in sys.modules
    probe = cfg.model.type  # reading the value imports it
    assert probe is sys.modules["shardwise_lazy_probe"].Probe


def test_base_configs_come_from_read_base_imports_relative_to_the_file():
    cfg = Config.fromfile(LAZY / "leaf.py")
    assert cfg.optim_wrapper.optimizer.type is torch.optim.AdamW
    assert cfg.optim_wrapper.optimizer.lr == 1e-3 and cfg.optim_wrapper.optimizer.momentum == 0.9
    assert cfg.train_cfg.to_dict() == dict(by_epoch=True, max_epochs=20, val_interval=1)
    assert cfg.model.type is torch.nn.Linear and cfg.model.out_features == 3
    assert cfg.model.norm is torch.nn.BatchNorm1d and cfg.extra.type is torch.nn.GELU
    up = Config.fromfile(LAZY / "sub" / "leaf_up.py")  # from .._base_.runtime import *
    assert up.train_cfg.max_epochs == 7 and up.optim_wrapper.optimizer.type is torch.optim.SGD


def test_to_dict_writes_lazy_values_as_their_import_paths_and_leaves_imports_out():
    cfg = Config.fromfile(LAZY / "leaf.py")
    plain = cfg.to_dict()
    assert plain["optim_wrapper"]["optimizer"]["type"] == "torch.optim.AdamW"
    assert plain["model"]["act"] == {"type": "torch.nn.ReLU"}
    assert plain["model"]["norm"] == "torch.nn.BatchNorm1d"
    assert plain["extra"] == {"type": "torch.nn.GELU", "sizes": (1, 2)}
    assert not {"AdamW", "SGD", "Linear", "ReLU", "nn", "torch", "read_base"} & set(plain)
    assert {"AdamW", "torch", "read_base"} <= set(cfg.to_dict(keep_imported=True))
    lazy = cfg._to_lazy_dict()["optim_wrapper"]["optimizer"]["type"]
    assert isinstance(lazy, LazyObject) and lazy.location.endswith("leaf.py, line 4")


def test_a_module_that_is_not_installed_fails_when_built_naming_it_and_the_line():
    cfg = Config.fromfile(LAZY / "missing_module.py")  # reading needs no such module
    assert cfg.to_dict()["model"] == {"type": "not_installed_pkg.models.Net", "depth": 3}
    with pytest.raises(ModuleNotFoundError) as info:
        _ = cfg.model.type
    message = str(info.value)
    assert "not_installed_pkg.models" in message and "missing_module.py, line 3" in message


def test_a_missing_attribute_of_an_imported_module_fails_when_built(tmp_path):
    path = tmp_path / "bad_attr.py"
    path.write_text("import torch.nn as nn\nact = dict(type=nn.NoSuchLayer)\n")
    cfg = Config.fromfile(path)
    assert cfg.to_dict()["act"] == {"type": "torch.nn.NoSuchLayer"}
    with pytest.raises(ImportError, match=r"torch\.nn\.NoSuchLayer.*bad_attr\.py"):
        _ = cfg.act.type


def test_standard_library_imports_run_while_reading_and_stay_out_of_to_dict():
    cfg = Config.fromfile(LAZY / "stdlib.py")
    assert cfg.to_dict() == {
        "root": "data/coco",
        "scale": 4.0,
        "half": 0,
        "act": {"type": "torch.nn.ReLU"},
    }


def test_lazy_and_plain_configs_do_not_mix_in_one_chain():
    with pytest.raises(RuntimeError, match=r"with read_base\(\).*runtime\.py"):
        Config.fromfile(LAZY / "plain_with_lazy_base.py")
    forced = Config.fromfile(LAZY / "plain_with_lazy_base.py", lazy_import=False)
    assert forced.optim_wrapper.optimizer.type is torch.optim.SGD  # imported for real
    with pytest.raises(ConfigParsingError, match=r"leaf_delete\.py, line 1: `_base_ = \.\.\.`"):
        Config.fromfile(LAZY / "lazy_with_plain_base.py")


def test_a_read_base_import_of_a_missing_file_names_the_line_and_the_path(tmp_path):
    path = tmp_path / "cfg.py"
    path.write_text(
        "from shardwise.config import read_base\nwith read_base():\n    from .nope import *\n"
    )
    with pytest.raises(ConfigParsingError, match=r"cfg\.py, line 3: `from \.nope import.*nope\.py"):
        Config.fromfile(path)


def test_a_lazy_config_dumps_to_a_plain_config_that_reads_back_equal(tmp_path):
    cfg = Config.fromfile(LAZY / "leaf.py")
    cfg.dump(tmp_path / "dumped.py")
    assert Config.fromfile(tmp_path / "dumped.py").to_dict() == cfg.to_dict()
    assert "import" not in (tmp_path / "dumped.py").read_text()


def test_lazy_values_survive_copies_and_pickling():
    cfg = Config.fromfile(LAZY / "leaf.py")
    for other in (copy.copy(cfg), copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg))):
        assert other.to_dict() == cfg.to_dict()
        assert other._imported_names == cfg._imported_names
        assert other.optim_wrapper.optimizer.type is torch.optim.AdamW


# ----------------------------------------------------------------------------- ConfigDict


def test_config_dict_builds_lazy_values_when_read_and_keeps_them_inside():
    lazy = LazyObject("torch.optim", "SGD", "cfg.py, line 1")
    d = ConfigDict(a=lazy, b=dict(c=[dict(d=LazyAttr("Linear", LazyObject("torch.nn")))]))
    assert d.a is d["a"] is d.get("a") is torch.optim.SGD
    assert d.b.c[0].d is torch.nn.Linear and d.values()[0] is torch.optim.SGD
    assert d._to_lazy_dict()["a"] is lazy
    assert d.to_dict() == {"a": "torch.optim.SGD", "b": {"c": [{"d": "torch.nn.Linear"}]}}
    copied = ConfigDict(d)
    copied.update(b=dict(e=1))
    assert copied._to_lazy_dict()["a"] is lazy and copied.b.to_dict()["e"] == 1


def test_config_dict_update_merges_nested_dicts_and_keeps_custom_dicts():
    class Custom(dict):
        pass

    d = ConfigDict(model=dict(depth=50, head=dict(classes=10)), custom=Custom(x=1))
    d.update(model=dict(head=dict(dropout=0.5)))
    assert d.to_dict()["model"] == {"depth": 50, "head": {"classes": 10, "dropout": 0.5}}
    assert type(d.custom) is Custom and type(d.model.head) is ConfigDict
    assert d.items()[0][0] == "model" and isinstance(d.values(), list)
    with pytest.raises(AttributeError, match="'modle'.*did you mean 'model'"):
        _ = d.modle
    with pytest.raises(AttributeError, match="read-only"):
        d.items = 1


def test_circular_read_base_imports_are_an_error_naming_the_files(tmp_path):
    head = "from shardwise.config import read_base\nwith read_base():\n"
    (tmp_path / "a.py").write_text(head + "    from .b import *\n")
    (tmp_path / "b.py").write_text(head + "    from .a import *\n")
    with pytest.raises(ConfigParsingError, match=r"circular.*a\.py -> .*b\.py -> .*a\.py"):
        Config.fromfile(tmp_path / "a.py")
