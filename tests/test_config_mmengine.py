"""Configs read, merged, overridden and dumped as mmengine 0.10 does: the fixtures under
tests/data/configs read by both, compared type for type (tuple vs list, True vs 1)."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest

from shardwise.config import Config, ConfigDict

CONFIGS = Path(__file__).parent / "data" / "configs"
PLAIN = CONFIGS / "plain"
LAZY = CONFIGS / "lazy"


def typed(value):
    """``value`` with every leaf and container tagged by its type, for exact comparison."""
    if isinstance(value, dict):
        return ("dict", {k: typed(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [typed(v) for v in value])
    return (type(value).__name__, value)


def without_delete(value):
    """mmengine leaves ``_delete_`` in a dict it copied without merging; shardwise drops it."""
    if isinstance(value, dict):
        return {k: without_delete(v) for k, v in value.items() if k != "_delete_"}
    if isinstance(value, (list, tuple)):
        return type(value)(without_delete(v) for v in value)
    return value


def mmengine_config():
    return pytest.importorskip("mmengine.config").Config


def both(path, **kwargs):
    """(shardwise's, mmengine's) ``Config.fromfile(path)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Config.fromfile(path, **kwargs), mmengine_config().fromfile(str(path), **kwargs)


# ----------------------------------------------------------------------------- plain configs


@pytest.mark.parametrize("data_root", [None, "/datasets/in1k"])
@pytest.mark.parametrize("name", ["leaf.py", "leaf_delete.py", "optional_import.py"])
def test_plain_config_reads_as_mmengine_reads_it(monkeypatch, name, data_root):
    if data_root is None:
        monkeypatch.delenv("SHARDWISE_TEST_DATA_ROOT", raising=False)
    else:
        monkeypatch.setenv("SHARDWISE_TEST_DATA_ROOT", data_root)
    ours, theirs = both(PLAIN / name)
    assert typed(ours.to_dict()) == typed(without_delete(theirs.to_dict()))
    assert ours.text == theirs.text
    assert ours.env_variables == theirs.env_variables


def test_plain_config_without_predefined_variables_reads_as_mmengine_reads_it():
    ours, theirs = both(PLAIN / "leaf.py", use_predefined_variables=False)
    assert ours.name == "{{ fileBasenameNoExtension }}"
    assert typed(ours.to_dict()) == typed(without_delete(theirs.to_dict()))


def test_leaf_changes_to_base_variables_reach_the_fields_mmengine_says_they_reach():
    cfg = Config.fromfile(PLAIN / "leaf.py").to_dict()
    assert cfg["train_cfg"]["max_epochs"] == 200 and cfg["max_epochs"] == 400
    assert cfg["model"]["backbone"] == dict(
        type="ResNet", depth=50, norm_eval=True, out_indices=(3,), frozen_stages=1
    )
    assert cfg["model"]["head"] == dict(type="LinearClsHead", num_classes=10, in_channels=2048)
    assert "neck" not in cfg and cfg["fpn"] == dict(type="FPN", in_channels=[256, 512])
    dataset = cfg["train_dataloader"]["dataset"]
    assert dataset["pipeline"][1]["scale"] == 160 and cfg["crop"]["scale"] == 192
    assert dataset["val_pipeline"][1]["scale"] == cfg["pipeline"][1]["scale"] == 256
    assert cfg["train_pipeline"][0] == dict(type="LoadImageFromFile", backend="pillow")
    assert cfg["test_dataloader"]["dataset"]["pipeline"][0]["backend"] == "pillow"
    assert cfg["augment"]["policies"][1] == dict(type="Rotate", magnitude_range=(0, 30))
    assert cfg["heads"][0]["type"] == "LinearClsHead" and cfg["sizes"] == (224, 224)
    assert (cfg["name"], cfg["work_dir"]) == ("leaf", "./work_dirs/runtime")
    assert cfg["optim_wrapper"] == dict(
        optimizer=dict(type="SGD", lr=0.01, momentum=0.9), clip_grad=dict(max_norm=1.0)
    )
    assert "_delete_" not in str(Config.fromfile(PLAIN / "leaf_delete.py").to_dict())


def test_errors_mmengine_raises_are_raised_with_its_exception_types(tmp_path):
    (tmp_path / "a.py").write_text("lr = 0.1\nclip = None\n")
    (tmp_path / "b.py").write_text("lr = 0.2\n")
    (tmp_path / "dup.py").write_text("_base_ = ['a.py', 'b.py']\n")
    (tmp_path / "scalar.py").write_text("_base_ = 'a.py'\nclip = dict(max_norm=1)\n")
    for name, error in (("dup.py", KeyError), ("scalar.py", TypeError)):
        for reader in (Config, mmengine_config()):
            with pytest.raises(error):
                reader.fromfile(str(tmp_path / name))


def test_custom_imports_are_imported_or_skipped_as_mmengine_does(tmp_path):
    ours, theirs = both(PLAIN / "optional_import.py")  # allow_failed_imports=True: warns
    assert ours.to_dict() == theirs.to_dict()
    strict = tmp_path / "strict.py"
    strict.write_text("custom_imports = dict(imports=['shardwise_test_not_installed_module'])\n")
    for reader in (Config, mmengine_config()):
        with pytest.raises(ImportError, match="Failed to import custom modules from"):
            reader.fromfile(str(strict))
    assert Config.fromfile(strict, import_custom_modules=False).custom_imports.imports


# ----------------------------------------------------------------------------- lazy configs


@pytest.mark.parametrize("name", ["leaf.py", "sub/leaf_up.py", "missing_module.py"])
def test_lazy_config_reads_as_mmengine_reads_it(name):
    ours, theirs = both(LAZY / name)
    assert typed(ours.to_dict()) == typed(theirs.to_dict())
    assert ours._imported_names == theirs._imported_names
    assert ours.to_dict(keep_imported=True).keys() == theirs.to_dict(keep_imported=True).keys()


# ----------------------------------------------------------------------------- overrides, dumps

OVERRIDES = {
    "model.backbone.depth": 101,
    "model.head": dict(num_classes=3),
    "train_pipeline.1.scale": 192,
    "optim_wrapper.optimizer": dict(_delete_=True, type="AdamW", lr=1e-3),
    "train_dataloader.dataset.new_key": (1, 2),
    "randomness.seed": 0,
}


def test_merge_from_dict_merges_as_mmengine_does():
    ours, theirs = both(PLAIN / "leaf.py")
    ours.merge_from_dict(OVERRIDES)
    theirs.merge_from_dict({k: dict(v) if isinstance(v, dict) else v for k, v in OVERRIDES.items()})
    assert typed(ours.to_dict()) == typed(without_delete(theirs.to_dict()))


@pytest.mark.parametrize("path", [PLAIN / "leaf.py", LAZY / "leaf.py"])
def test_a_dump_of_either_reads_back_in_the_other(tmp_path, path):
    ours, theirs = both(path)
    ours.dump(tmp_path / "ours.py")
    theirs.dump(str(tmp_path / "theirs.py"))
    expected = typed(ours.to_dict())
    assert typed(mmengine_config().fromfile(str(tmp_path / "ours.py")).to_dict()) == expected
    assert typed(Config.fromfile(tmp_path / "theirs.py").to_dict()) == expected


def test_diff_lists_the_changed_lines_as_mmengine_does():
    first, second = Config(dict(a=1, b=2, c="x")), Config(dict(c="x", b=3, a=1))
    theirs = mmengine_config()
    assert Config.diff(first, second) == theirs.diff(theirs(dict(first)), theirs(dict(second)))
    nested = Config.diff(Config(dict(b=dict(c=[1, 2]))), Config(dict(b=dict(c=[1, 3]))))
    assert "\n-b = dict(c=[1, 2])\n" in nested and "\n+b = dict(c=[1, 3])\n" in nested


def test_config_dict_merge_and_update_work_as_mmengine_s():
    theirs_type = pytest.importorskip("mmengine.config").ConfigDict
    base = dict(model=dict(depth=50, head=dict(classes=10)), lr=0.1, sched=[dict(end=5)])
    other = dict(model=dict(head=dict(_delete_=True, dropout=0.5)), sched=[dict(end=9)], wd=0)
    results = []
    for kind in (ConfigDict, theirs_type):
        merged, updated = kind(copy.deepcopy(base)), kind(copy.deepcopy(base))
        merged.merge(copy.deepcopy(other))
        updated.update(copy.deepcopy(other))
        results.append((typed(merged.to_dict()), typed(updated.to_dict())))
    assert results[0] == results[1]
