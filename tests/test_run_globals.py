"""A Runner restores every global it sets when its ``train()``, ``val()`` or ``test()`` ends:
two Runners one after the other in one process (an OpenMMLab-style one, then a plain one,
the first's work dir deleted in between) find nothing of each other: default scopes
(shardwise's and mmengine's), logger handlers (shardwise's, mmengine's ``MMLogger``),
storage options, visualizers. ``check_config`` leaves both default scopes as it found them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.distributed import REPO

pytest.importorskip("mmengine", reason="the first run is an OpenMMLab package's")


def test_two_runners_in_one_process_find_nothing_of_each_other(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "two_runners.py"), str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Error" not in proc.stderr, proc.stderr[-4000:]  # no FileNotFoundError of a logger
    report = json.loads(proc.stdout.split("REPORT ", 1)[1])
    before = report["before"]
    assert report["between_stages"] == before
    assert list(report["val_after_train"]) == ["fakemm/top1"]  # built in fakemm's scope
    assert report["after_first"] == before
    assert report["after_second"] == before
    inside = report["inside_second"]
    assert report["first_log_dir"] not in json.dumps(inside)
    assert inside["shardwise_scope"] == inside["mmengine_scope"] == []
    assert inside["storage_options"] == {}
    assert len(inside["visualizers"]) == 1  # the second's own
    assert [name for name in inside["mmengine_loggers"] if "first" in name] == []


def test_check_config_leaves_both_default_scopes_as_it_found_them(tmp_path, monkeypatch):
    from mmengine.registry import DefaultScope as MMEngineScope

    from shardwise.runner.checks import check_config
    from tests.test_openmmlab import FAKE, FAKE_CONFIG

    monkeypatch.syspath_prepend(str(FAKE))
    for scope in (MMEngineScope,):
        monkeypatch.setattr(scope, "_instance_dict", type(scope._instance_dict)())
    from shardwise.config import Config
    from shardwise.registry import DefaultScope

    config = tmp_path / "fake.py"
    config.write_text(FAKE_CONFIG.format(iters=2, out=tmp_path / "out"))
    shardwise_before = list(DefaultScope._instance_dict)
    check_config(Config.fromfile(config))
    assert list(DefaultScope._instance_dict) == shardwise_before
    assert MMEngineScope.get_current_instance() is None
