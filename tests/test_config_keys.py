"""A top-level config key that is a near miss of one the Runner reads (``train_cgf``) is
warned about before launch, once, or refused with ``--strict-keys``; the many names real
OpenMMLab configs define for themselves (``train_pipeline``, ``data_root``...) are not."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from shardwise.cli import main
from shardwise.config import Config
from shardwise.runner import Runner
from shardwise.runner.config_keys import near_misses
from tests.test_cli_train import TINY, train

CORPUS = (
    Path(os.environ.get("SHARDWISE_SHARED", Path(__file__).parents[2] / "shared"))
    / "corpus"
    / "openmmlab-configs"
)

TYPO = "\ntrain_cgf = dict(by_epoch=False, max_iters=2)\n"


def test_near_misses_are_typos_of_the_runner_s_keys_not_a_config_s_own_names():
    keys = ["train_cgf", "modle", "optim_wraper", "val_evalutor", "work_dirs", "Model"]
    own = [
        "train_pipeline",
        "data_root",
        "bgr_mean",
        "dataset_type",
        "gallery_dataloader",
        "query_dataloader",
        "test_dataset",
        "OptimWrapper",
        "Resize",
        "lr",
        "resume_from",
    ]
    assert near_misses(keys + own) == [
        ("train_cgf", "train_cfg"),
        ("modle", "model"),
        ("optim_wraper", "optim_wrapper"),
        ("val_evalutor", "val_evaluator"),
        ("work_dirs", "work_dir"),
        ("Model", "model"),
    ]


def test_a_near_miss_in_the_config_file_is_warned_once_before_launch(tmp_path):
    config = tmp_path / "typo.py"
    config.write_text(TINY + TYPO)
    proc = train(str(config), tmp_path / "w", "--nproc-per-node", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    warning = "config key 'train_cgf' is not one the Runner reads; did you mean 'train_cfg'?"
    assert out.count(warning) == 1, out[-3000:]
    assert proc.stderr.startswith(warning)  # from the launcher, before the workers start
    assert "--strict-keys" in out


def test_strict_keys_refuses_a_near_miss_in_one_line(tmp_path, capsys):
    config = tmp_path / "typo.py"
    config.write_text(TINY + TYPO)
    assert main(["train", str(config), "--work-dir", str(tmp_path / "w"), "--strict-keys"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("shardwise train: error: config key 'train_cgf'")
    assert "did you mean 'train_cfg'" in err
    assert not (tmp_path / "w").exists()
    with pytest.raises(KeyError, match="did you mean 'train_cfg'"):
        Runner.check_cfg(Config.fromfile(config), strict_keys=True)


@pytest.mark.skipif(
    not CORPUS.is_dir() and not os.environ.get("CI"),
    reason=f"the OpenMMLab config corpus is not here ({CORPUS}; set SHARDWISE_SHARED)",
)
def test_no_config_of_the_openmmlab_corpus_has_a_near_miss():
    from shardwise.runner.config_keys import check_top_level_keys

    heard: list[str] = []
    listener = logging.Handler()
    listener.emit = lambda record: heard.append(record.getMessage())
    checks_log = logging.getLogger("shardwise.runner.config_keys")
    checks_log.addHandler(listener)
    try:
        check_top_level_keys({"modle": dict(type="Net")})  # the listener hears a warning
        assert [message[:40] for message in heard] == ["config key 'modle' is not one the Runner"]
        heard.clear()
        read, warned = 0, []
        for path in sorted(CORPUS.rglob("*.py")):
            try:
                cfg = Config.fromfile(path, import_custom_modules=False)
            except Exception:  # noqa: BLE001 - a config that needs mmdet...: not about its keys
                continue
            read += 1
            check_top_level_keys(cfg)
            warned += [(str(path.relative_to(CORPUS)), *m) for m in near_misses(cfg.keys())]
    finally:
        checks_log.removeHandler(listener)
    assert read > 1000
    assert warned == [] and heard == []
