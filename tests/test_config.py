"""Config files, inheritance, overrides and dumps, as a user of ``shardwise.config`` sees them."""

from __future__ import annotations

import argparse
import collections
import copy
import json
import pickle
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from shardwise.config import (
    Config,
    ConfigDict,
    DictAction,
    parse_cfg_options,
    parse_override,
    parse_value,
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# ----------------------------------------------------------------------------- loading


def test_py_config_top_level_names_become_keys(tmp_path):
    path = write(
        tmp_path / "cfg.py",
        """
        import math
        from collections import OrderedDict

        def helper(x):
            return x * 2

        __private__ = 1
        _hidden = 3
        lr = helper(0.05)
        model = dict(type='Linear', in_features=4, act=None, sizes=(1, 2))
        optimizer = dict(type=OrderedDict, eps=math.sqrt(1e-16))
        """,
    )
    cfg = Config.fromfile(path)
    # modules, functions and __dunder__ names are dropped; a class stays, as in mmengine
    assert set(cfg) == {"OrderedDict", "_hidden", "lr", "model", "optimizer"}
    assert cfg.lr == 0.1
    assert cfg.model.sizes == (1, 2)
    assert cfg.optimizer.type is collections.OrderedDict
    assert cfg.filename == str(path)
    assert cfg.text.startswith(str(path) + "\n") and "helper(0.05)" in cfg.text


def test_py_config_importing_a_third_party_module_reads_it_lazily(tmp_path):
    path = write(
        tmp_path / "cfg.py",
        """
        import math
        from torch.optim import AdamW

        def helper(x):
            return x * 2

        lr = helper(0.05)
        optimizer = dict(type=AdamW, eps=math.sqrt(1e-16))
        """,
    )
    cfg = Config.fromfile(path)
    assert cfg.optimizer.type is torch.optim.AdamW  # imported when read
    plain = cfg.to_dict()  # imported names left out, the lazy import as its path
    assert set(plain) == {"helper", "lr", "optimizer"}
    assert plain["optimizer"] == {"type": "torch.optim.AdamW", "eps": 1e-08}


def test_json_and_yaml_configs_load(tmp_path):
    data = {"model": {"type": "Linear", "layers": [1, 2]}, "lr": 0.1, "flag": None}
    json_cfg = Config.fromfile(write(tmp_path / "cfg.json", json.dumps(data)))
    yaml_cfg = Config.fromfile(write(tmp_path / "cfg.yaml", yaml.safe_dump(data)))
    yml_cfg = Config.fromfile(write(tmp_path / "cfg.yml", yaml.safe_dump(data)))
    assert json_cfg.to_dict() == yaml_cfg.to_dict() == yml_cfg.to_dict() == data
    assert yaml_cfg.model.layers == [1, 2]


def test_attribute_and_item_access_reach_nested_values():
    cfg = Config(dict(model=dict(backbone=dict(depth=50)), sched=[dict(type="LinearLR")]))
    assert cfg.model.backbone.depth == cfg["model"]["backbone"]["depth"] == 50
    assert isinstance(cfg.model, ConfigDict) and isinstance(cfg.sched[0], ConfigDict)
    assert cfg.sched[0].type == "LinearLR"
    assert "model" in cfg and "missing" not in cfg
    assert cfg.get("missing", 7) == 7 and cfg.model.get("neck") is None
    assert list(cfg) == ["model", "sched"] and len(cfg) == 2
    cfg.model.backbone.frozen = True
    cfg["work_dir"] = "runs"
    cfg.extra = dict(a=1)
    assert cfg.model.backbone["frozen"] is True and cfg.work_dir == "runs"
    assert isinstance(cfg.extra, ConfigDict)
    plain = cfg.to_dict()
    assert type(plain["model"]) is dict and type(plain["sched"][0]) is dict


def test_missing_attribute_raises_attribute_error_naming_the_key():
    cfg = Config(dict(optimizer=dict(lr=0.1)))
    with pytest.raises(AttributeError, match="'optimzer'.*did you mean 'optimizer'"):
        _ = cfg.optimzer
    with pytest.raises(AttributeError, match="'momentum'"):
        _ = cfg.optimizer.momentum
    assert not hasattr(cfg.optimizer, "momentum")


def test_config_copies_deepcopies_and_pickles(tmp_path):
    write(tmp_path / "c.py", "model = dict(depth=50)\nt = (1, None)\n")
    cfg = Config(dict(model=dict(depth=50), t=(1, None)), filename=tmp_path / "c.py")
    deep = copy.deepcopy(cfg)
    deep.model.depth = 101
    assert cfg.model.depth == 50
    shallow = cfg.copy()
    shallow.new_key = 1
    assert "new_key" not in cfg
    loaded = pickle.loads(pickle.dumps(cfg))
    assert loaded.to_dict() == cfg.to_dict() and loaded.filename == cfg.filename
    assert loaded.text == cfg.text == (tmp_path / "c.py").read_text()
    assert isinstance(loaded.model, ConfigDict)
    assert pickle.loads(pickle.dumps(cfg.model)) == {"depth": 50}


def test_pretty_text_and_repr_show_the_values_with_keys_sorted():
    cfg = Config(dict(model=dict(type="Linear", bias=False), lr=0.1))
    assert cfg.pretty_text == "lr = 0.1\nmodel = dict(bias=False, type='Linear')\n"
    assert "'Linear'" in repr(cfg) and "lr" in repr(cfg)


# ----------------------------------------------------------------------------- inheritance


def test_single_base_is_merged_recursively(tmp_path):
    write(tmp_path / "base.py", "model = dict(type='Net', depth=50, head=dict(classes=10))\nlr=1")
    child = write(
        tmp_path / "child.py",
        """
        _base_ = './base.py'
        model = dict(depth=101, head=dict(dropout=0.5))
        """,
    )
    cfg = Config.fromfile(child)
    assert cfg.to_dict() == {
        "model": {"type": "Net", "depth": 101, "head": {"classes": 10, "dropout": 0.5}},
        "lr": 1,
    }


def test_list_of_bases_of_mixed_formats_merge(tmp_path):
    write(tmp_path / "model.py", "model = dict(type='Net', depth=50)")
    write(tmp_path / "sched.yaml", "sched:\n  type: StepLR\n  step: 3\n")
    write(tmp_path / "runtime.json", json.dumps({"lr": 0.2, "seed": 0}))
    child = write(
        tmp_path / "child.py",
        """
        _base_ = ['model.py', 'sched.yaml', 'runtime.json']
        sched = dict(step=5)
        """,
    )
    cfg = Config.fromfile(child)
    assert cfg.to_dict() == {
        "model": {"type": "Net", "depth": 50},
        "sched": {"type": "StepLR", "step": 5},
        "lr": 0.2,
        "seed": 0,
    }


def test_two_bases_defining_one_key_is_an_error_naming_it(tmp_path):
    write(tmp_path / "a.py", "lr = 0.1\nseed = 0")
    write(tmp_path / "b.yaml", "lr: 0.2\n")
    child = write(tmp_path / "child.py", "_base_ = ['a.py', 'b.yaml']\n")
    with pytest.raises(KeyError, match=r"Duplicate key.*'lr'.*child\.py.*b\.yaml"):
        Config.fromfile(child)


def test_delete_key_replaces_the_base_dict(tmp_path):
    write(tmp_path / "base.py", "optim = dict(type='SGD', lr=0.1, momentum=0.9)")
    child = write(
        tmp_path / "child.py",
        """
        _base_ = 'base.py'
        optim = dict(_delete_=True, type='AdamW', lr=1e-3)
        """,
    )
    assert Config.fromfile(child).optim.to_dict() == {"type": "AdamW", "lr": 1e-3}


def test_child_dict_over_base_scalar_needs_delete(tmp_path):
    write(tmp_path / "base.py", "clip = None\nsched = 'step'")
    for key in ("clip", "sched"):
        bad = write(tmp_path / "bad.py", f"_base_ = 'base.py'\n{key} = dict(max_norm=1)")
        with pytest.raises(TypeError, match=f"{key}.*_delete_=True"):
            Config.fromfile(bad)
    child = write(
        tmp_path / "child.py", "_base_ = 'base.py'\nclip = dict(_delete_=True, max_norm=1)"
    )
    assert Config.fromfile(child).clip.to_dict() == {"max_norm": 1}


def test_base_in_subfolder_resolves_relative_to_each_file(tmp_path):
    write(tmp_path / "_base_" / "models" / "net.py", "model = dict(type='Net')")
    write(tmp_path / "_base_" / "default.py", "_base_ = 'models/net.py'\nseed = 1")
    child = write(tmp_path / "exp" / "child.yaml", "_base_: ../_base_/default.py\nseed: 2\n")
    assert Config.fromfile(child).to_dict() == {"model": {"type": "Net"}, "seed": 2}


def test_py_config_reads_base_values_through_base_variable(tmp_path):
    write(tmp_path / "base.py", "optimizer = dict(type='SGD', lr=0.1)")
    child = write(
        tmp_path / "child.py",
        """
        _base_ = 'base.py'
        optimizer = dict(lr=_base_.optimizer.lr * 2)
        """,
    )
    assert Config.fromfile(child).optimizer.to_dict() == {"type": "SGD", "lr": 0.2}


def test_base_cycle_raises_naming_the_files(tmp_path):
    write(tmp_path / "a.py", "_base_ = 'b.py'")
    write(tmp_path / "b.py", "_base_ = 'a.py'")
    with pytest.raises(ValueError, match=r"circular _base_.*a\.py -> .*b\.py -> .*a\.py"):
        Config.fromfile(tmp_path / "a.py")


# ----------------------------------------------------------------------------- errors


def test_missing_file_error_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py"):
        Config.fromfile(tmp_path / "nope.py")


def test_missing_base_file_error_names_the_config_the_line_and_the_path(tmp_path):
    write(tmp_path / "base.py", "a = 1")
    child = write(tmp_path / "child.py", "x = 1\n_base_ = [\n    'base.py', 'gone.yaml']\n")
    with pytest.raises(FileNotFoundError, match=r"child\.py, line 2: .*'gone\.yaml'.*gone\.yaml"):
        Config.fromfile(child)
    data = write(tmp_path / "child.yaml", "x: 1\n_base_: ../nowhere/base.py\n")
    with pytest.raises(FileNotFoundError, match=r"child\.yaml, line 2: .*nowhere/base\.py"):
        Config.fromfile(data)


def test_unknown_base_variable_error_names_the_config_the_line_and_the_key(tmp_path):
    write(tmp_path / "base.py", "model = dict(backbone=dict(depth=50))")
    child = write(
        tmp_path / "child.py",
        """
        _base_ = 'base.py'
        neck = dict(depth={{_base_.model.backbone.depht}})
        """,
    )
    with pytest.raises(KeyError, match=r"child\.py, line 3: .*'depht'.*did you mean 'depth'"):
        Config.fromfile(child)
    orphan = write(tmp_path / "orphan.py", "x = {{_base_.lr}}\n")
    with pytest.raises(KeyError, match=r"orphan\.py, line 1: .*'lr' in the base configs"):
        Config.fromfile(orphan)


def test_unset_environment_variable_without_default_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SHARDWISE_TEST_UNSET", raising=False)
    path = write(tmp_path / "cfg.py", "root = '{{$SHARDWISE_TEST_UNSET:}}'\n")
    with pytest.raises(KeyError, match="SHARDWISE_TEST_UNSET"):
        Config.fromfile(path)
    monkeypatch.setenv("SHARDWISE_TEST_UNSET", "/data")
    cfg = Config.fromfile(path)
    assert cfg.root == "/data" and cfg.env_variables == {"SHARDWISE_TEST_UNSET": "/data"}


def test_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path / "broken.py", "a = 1\nb = dict(x=\n")
    with pytest.raises(SyntaxError) as info:
        Config.fromfile(path)
    assert info.value.filename == str(path) and info.value.lineno == 2
    assert "broken.py" in str(info.value) and "line 2" in str(info.value)


def test_runtime_error_in_py_config_points_at_the_file(tmp_path):
    path = write(tmp_path / "boom.py", "a = 1\nb = undefined_name\n")
    with pytest.raises(NameError) as info:
        Config.fromfile(path)
    assert info.traceback[-1].path == path and info.traceback[-1].lineno == 1  # 0-based


def test_invalid_json_names_the_file_and_line(tmp_path):
    path = write(tmp_path / "bad.json", '{"a": 1,\n "b": }')
    with pytest.raises(ValueError, match=r"bad\.json.*line 2"):
        Config.fromfile(path)


def test_unknown_extension_names_it_and_the_accepted_ones(tmp_path):
    path = write(tmp_path / "cfg.toml", "a = 1")
    with pytest.raises(ValueError, match=r"'\.toml'.*\.py, \.json, \.yaml, \.yml"):
        Config.fromfile(path)
    with pytest.raises(OSError):  # what mmengine raises
        Config.fromstring("a = 1", ".toml")


# ----------------------------------------------------------------------------- text, helpers


def test_predefined_variables_name_the_file_they_are_in(tmp_path):
    write(tmp_path / "base" / "paths.py", "here = '{{ fileDirname }}'\nname = '{{fileBasename}}'")
    child = write(tmp_path / "child.py", "_base_ = 'base/paths.py'\nown = '{{ fileExtname }}'")
    cfg = Config.fromfile(child)
    assert cfg.to_dict() == dict(here=str(tmp_path / "base"), name="paths.py", own=".py")
    raw = Config.fromfile(child, use_predefined_variables=False)
    assert raw.own == "{{ fileExtname }}"


def test_fromstring_reads_config_text_of_each_format():
    assert Config.fromstring("a = dict(b=(1, 2))", ".py").to_dict() == {"a": {"b": (1, 2)}}
    assert Config.fromstring('{"a": [1]}', ".json").to_dict() == {"a": [1]}
    assert Config.fromstring("a: [1]\n", ".yaml").to_dict() == {"a": [1]}


def test_deprecated_config_warns_naming_its_replacement(tmp_path):
    path = write(tmp_path / "old.py", "_deprecation_ = dict(expected='new.py')\na = 1\n")
    with pytest.warns(DeprecationWarning, match=r"old\.py will be deprecated.*new\.py"):
        cfg = Config.fromfile(path)
    assert cfg.to_dict() == {"a": 1}


def test_auto_argparser_offers_an_option_per_value(tmp_path, monkeypatch):
    path = write(tmp_path / "cfg.py", "lr = 0.1\nname = 'x'\nflag = False\nmodel = dict(depth=50)")
    monkeypatch.setattr("sys.argv", ["train.py", str(path)])
    parser, cfg = Config.auto_argparser()
    args = parser.parse_args([str(path), "--lr", "0.5", "--model.depth", "18", "--flag"])
    assert (args.lr, getattr(args, "model.depth"), args.flag, args.name) == (0.5, 18, True, None)
    assert cfg.filename == str(path)


# ----------------------------------------------------------------------------- overrides


OVERRIDE_VALUES = [
    ("1", 1),
    ("-3", -3),
    ("0.5", 0.5),
    ("1e-3", 1e-3),
    ("true", True),
    ("False", False),
    ("None", None),
    ("none", "none"),  # only ``None`` is None
    ("[1,2]", [1, 2]),
    ("[]", []),
    ("()", ()),
    ("a,b,c", ["a", "b", "c"]),
    ("a,b,", ["a", "b"]),
    ("(1,2)", (1, 2)),
    ("(1,)", (1,)),
    ("[(1, 2), [a, b], c]", [(1, 2), ["a", "b"], "c"]),
    ("[[1]]", [[1]]),
    ("'x'", "x"),  # surrounding quotes are stripped
    ('"1,2"', [1, 2]),
    ("'true'", True),
    ("hello world", "helloworld"),  # spaces are removed
    ("it's", "it's"),
    ("torch.optim.AdamW", "torch.optim.AdamW"),
    ("", ""),
]


@pytest.mark.parametrize(("text", "expected"), OVERRIDE_VALUES)
def test_override_values_parse_as_mmengine_s_dict_action(text, expected):
    value = parse_value(text)
    assert value == expected and type(value) is type(expected)


def test_override_values_parse_as_mmengine_itself_parses_them():
    mmengine_config = pytest.importorskip("mmengine.config")
    for text, _ in OVERRIDE_VALUES:
        ours, theirs = parse_value(text), mmengine_config.DictAction._parse_iterable(text)
        assert ours == theirs and type(ours) is type(theirs), text


def test_override_value_with_unbalanced_brackets_is_an_error():
    with pytest.raises(ValueError, match=r"'\[1,2'.*not balanced"):
        parse_value("[1,2")
    with pytest.raises(AssertionError):  # what mmengine's DictAction raises
        parse_value("[(a,b), [1,2], false")


def test_override_strings_split_at_the_first_equals_sign():
    assert parse_override("work_dir=runs/a=b") == ("work_dir", "runs/a=b")
    assert parse_cfg_options(["model.depth=101", "gpu_ids=0,1", "model.depth=18"]) == {
        "model.depth": 18,
        "gpu_ids": [0, 1],
    }
    with pytest.raises(ValueError, match="key=value"):
        parse_override("model.depth")


def test_dict_action_collects_cfg_options():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cfg-options", nargs="+", action=DictAction)
    args = parser.parse_args(["--cfg-options", "a.b=1", "c=[x,y]", "--cfg-options", "a.b=2"])
    assert args.cfg_options == {"a.b": 2, "c": ["x", "y"]}
    with pytest.raises(ValueError, match="not balanced"):  # out of parse_args, as mmengine
        parser.parse_args(["--cfg-options", "a=[(x,y), z"])


def test_override_nested_key_list_index_and_new_leaf():
    cfg = Config(
        dict(
            model=dict(backbone=dict(depth=50)),
            sched=[dict(type="LinearLR", end=5), dict(type="StepLR")],
            optim=dict(clip_grad=None),
        )
    )
    cfg.merge_from_dict(
        parse_cfg_options(
            [
                "model.backbone.depth=101",
                "sched.0.end=10",
                "sched.1=None",
                "model.backbone.frozen=true",
                "optim.clip_grad.max_norm=1.0",
                "seed=3",
            ]
        )
    )
    assert cfg.to_dict() == {
        "model": {"backbone": {"depth": 101, "frozen": True}},
        "sched": [{"type": "LinearLR", "end": 10}, None],
        "optim": {"clip_grad": {"max_norm": 1.0}},
        "seed": 3,
    }


def test_override_with_dict_value_merges_unless_delete():
    cfg = Config(dict(optim=dict(type="SGD", lr=0.1)))
    cfg.merge_from_dict({"optim": dict(lr=0.2)})
    assert cfg.optim.to_dict() == {"type": "SGD", "lr": 0.2}
    cfg.merge_from_dict({"optim": dict(_delete_=True, type="AdamW")})
    assert cfg.optim.to_dict() == {"type": "AdamW"}
    assert isinstance(cfg.optim, ConfigDict)


def test_override_typo_raises_key_error_naming_path_and_close_match():
    cfg = Config(dict(model=dict(backbone=dict(depth=50)), lr=0.1))
    with pytest.raises(KeyError, match=r"'model\.backbon\.depth'.*'backbon'.*'backbone'"):
        cfg.merge_from_dict({"lr": 1.0, "model.backbon.depth": 101})
    assert cfg.lr == 0.1  # nothing was applied
    with pytest.raises(KeyError, match=r"'modle'.*did you mean 'model'"):
        cfg.merge_from_dict({"modle.backbone.depth": 101})


def test_override_bad_list_index_and_path_through_scalar_raise():
    cfg = Config(dict(sched=[dict(end=1)], lr=0.1))
    with pytest.raises(KeyError, match=r"'sched' is a list of 1.*'3'"):
        cfg.merge_from_dict({"sched.3.end": 2})
    with pytest.raises(TypeError, match=r"'lr' holds 0\.1"):
        cfg.merge_from_dict({"lr.value": 2})
    with pytest.raises(TypeError, match="'sched' is a list.*allow_list_keys=True"):
        cfg.merge_from_dict({"sched.0.end": 2}, allow_list_keys=False)
    with pytest.raises(TypeError, match="lr.*_delete_=True"):
        cfg.merge_from_dict({"lr": dict(value=2)})
    assert cfg.to_dict() == {"sched": [{"end": 1}], "lr": 0.1}


# ----------------------------------------------------------------------------- dumping

ROUND_TRIP = dict(
    model=dict(type="Net", sizes=(1, 2), single=(3,), act=None, bias=False, nested=[dict(a=[])]),
    quotes='it\'s "quoted"\n',
    scale=float("inf"),
    weird_keys={"with-dash": 1, 2: "int key"},
    empty=dict(),
    long=list(range(60)),
)


def test_py_dump_loads_back_equal(tmp_path):
    cfg = Config(ROUND_TRIP)
    cfg.dump(tmp_path / "out.py")
    assert Config.fromfile(tmp_path / "out.py").to_dict() == ROUND_TRIP
    assert cfg.dump() == (tmp_path / "out.py").read_text()


def test_py_dump_of_loaded_inherited_config_round_trips(tmp_path):
    write(tmp_path / "base.py", "model = dict(type='Net', depth=50)")
    write(tmp_path / "child.py", "_base_ = 'base.py'\nmodel = dict(depth=101)\ndict = 3")
    cfg = Config.fromfile(tmp_path / "child.py")
    cfg.dump(tmp_path / "out.py")
    assert Config.fromfile(tmp_path / "out.py").to_dict() == cfg.to_dict()


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_json_and_yaml_dumps_load_back_equal_json_with_tuples_as_lists(tmp_path, suffix):
    data = dict(model=dict(type="Net", sizes=(1, 2), act=None), lr=0.1, names=["a", "b'c"])
    Config(data).dump(tmp_path / f"out{suffix}")
    loaded = Config.fromfile(tmp_path / f"out{suffix}").to_dict()
    sizes = [1, 2] if suffix == ".json" else (1, 2)
    assert loaded == dict(
        model=dict(type="Net", sizes=sizes, act=None), lr=0.1, names=data["names"]
    )
    assert type(loaded["model"]["sizes"]) is type(sizes)


def test_json_and_yaml_dumps_are_written_as_mmengine_writes_them(tmp_path):
    fileio = pytest.importorskip("mmengine.fileio")
    data = dict(b=dict(sizes=(1, 2), act=None), a=[0.1, "x"])
    for suffix in (".json", ".yaml"):
        Config(data).dump(tmp_path / f"out{suffix}")
        theirs = fileio.dump(data, file_format=suffix[1:])
        assert (tmp_path / f"out{suffix}").read_text() == theirs


def test_dump_refuses_non_literal_values_naming_the_key(tmp_path):
    cfg = Config(dict(optimizer=dict(type=pickle.Pickler)))
    with pytest.raises(TypeError, match=r"'optimizer\.type'.*import path.*'_pickle\.Pickler'"):
        cfg.dump(tmp_path / "out.py")
    with pytest.raises(TypeError, match=r"'optimizer\.type'"):
        cfg.dump(tmp_path / "out.json")
    assert not (tmp_path / "out.py").exists()
    assert "Pickler" in cfg.pretty_text  # display still works


def test_dump_to_unknown_extension_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"'\.toml'"):
        Config(dict(a=1)).dump(tmp_path / "out.toml")
