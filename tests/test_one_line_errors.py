"""Mistakes a new user makes on the command line: each is one line on stderr that names the
value, where it came from and the fix, and ``shardwise train`` exits 2 before anything is
written. (Storage and launcher cases: ``tests/test_object_storage.py``,
``tests/test_cli_train.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardwise.cli import main
from tests.test_cli_train import TINY


@pytest.fixture
def config(tmp_path) -> str:
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return str(path)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("shardwise train: error:"), err
    assert err.count("\n") == 1, err  # one line, no traceback
    return err.strip()


def test_a_missing_load_from_flag_names_the_flag_and_the_cli_s_resume(tmp_path, config, capsys):
    missing = tmp_path / "nope.pth"
    assert (
        main(["train", config, "--work-dir", str(tmp_path / "w"), "--load-from", str(missing)]) == 2
    )
    err = _one_line(capsys)
    assert f"--load-from {missing}: no such checkpoint" in err
    assert "--resume" in err and "resume=True" not in err
    assert not (tmp_path / "w").exists()


def test_a_missing_load_from_in_the_config_names_the_config_key(tmp_path, config, capsys):
    Path(config).write_text(TINY + f"\nload_from = {str(tmp_path / 'nope.pth')!r}\n")
    assert main(["train", config, "--work-dir", str(tmp_path / "w")]) == 2
    err = _one_line(capsys)
    assert "load_from=" in err and "resume=True" in err


def test_a_scheduler_end_taken_from_max_iters_says_where_it_came_from(tmp_path, config, capsys):
    Path(config).write_text(
        TINY + "\nparam_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, "
        "end=5), dict(type='CosineAnnealingLR', by_epoch=False, begin=50)]\n"
        "train_cfg = dict(by_epoch=False, max_iters=100)\n"
    )
    args = ["train", config, "--work-dir", str(tmp_path / "w")]
    assert main([*args, "--cfg-options", "train_cfg.max_iters=20"]) == 2
    err = _one_line(capsys)
    assert "param_scheduler[1]" in err and "begin=50" in err
    assert "end=20 (from train_cfg.max_iters=20" in err
    assert "train_cfg.max_iters" in err.split("end=20 (from")[1].split(")", 1)[1]  # the fix


@pytest.mark.parametrize(
    "module, words",
    [
        (
            "nosuch_package_xyz",
            ["'nosuch_package_xyz'", "pip install nosuch_package_xyz", "PYTHONPATH"],
        ),
        ("tests.broken_import_xyz", ["'tests.broken_import_xyz'", "PYTHONPATH"]),
    ],
    ids=["package-not-installed", "module-not-found"],
)
def test_a_custom_import_that_is_missing_is_one_line_naming_the_fix(
    tmp_path, config, capsys, module, words
):
    Path(config).write_text(TINY.replace("tests.test_runner_support", module))
    assert main(["train", config, "--work-dir", str(tmp_path / "w")]) == 2
    err = _one_line(capsys)
    for word in words:
        assert word in err


def test_a_custom_import_that_raises_inside_the_package_is_one_line(tmp_path, capsys, monkeypatch):
    package = tmp_path / "pkg" / "mislinked_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    config = tmp_path / "c.py"
    config.write_text(TINY.replace("tests.test_runner_support", "mislinked_pkg"))
    assert main(["train", str(config), "--work-dir", str(tmp_path / "w")]) == 2
    err = _one_line(capsys)
    assert "'mislinked_pkg'" in err and "RuntimeError" in err
    assert "operator torchvision::nms does not exist" in err
    assert "reinstall" in err


@pytest.mark.parametrize(
    "failure, words",
    [
        ("raise RuntimeError('operator torchvision::nms does not exist')", ["RuntimeError"]),
        ("import not_installed_dependency_xyz", ["pip install not_installed_dependency_xyz"]),
    ],
    ids=["mislinked-dependency", "missing-dependency"],
)
def test_a_default_scope_package_that_fails_to_import_is_one_line(
    tmp_path, capsys, monkeypatch, failure, words
):
    pytest.importorskip("mmengine", reason="a default_scope package is looked up through it")
    package = tmp_path / "pkg" / "broken_scope_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(failure + "\n")
    (package / "registry.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    config = tmp_path / "c.py"
    config.write_text("default_scope = 'broken_scope_pkg'\nmodel = dict(type='ImageClassifier')\n")
    assert main(["train", str(config), "--work-dir", str(tmp_path / "w")]) == 2
    err = _one_line(capsys)
    assert "'broken_scope_pkg'" in err
    for word in words:
        assert word in err
