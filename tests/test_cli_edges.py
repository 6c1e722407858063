"""The edges of the ``shardwise`` command line: abbreviations, unknown flags, what a command
imports before it runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardwise.cli import build_parser, main


def _usage_error(capsys, *argv: str) -> str:
    """stderr of a command line argparse refuses (exit code 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_a_flag_is_not_taken_as_the_abbreviation_of_a_longer_one(capsys, tmp_path):
    config = tmp_path / "cfg.py"
    config.write_text("model = dict(type='Linear')\n")
    err = _usage_error(capsys, "train", str(config), "--nproc", "2")
    assert "unrecognized arguments: --nproc" in err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ckpt", "convert", "a", "b", "--to", "full", "--model"])


@pytest.mark.parametrize(
    ("argv", "usage", "nearest"),
    [
        (["train", "cfg.py", "--nproc", "2"], "usage: shardwise train ", "--nproc-per-node"),
        (["train", "cfg.py", "--work_dir", "w"], "usage: shardwise train ", "--work-dir"),
        (["train", "cfg.py", "--resum"], "usage: shardwise train ", "--resume"),
        (["ckpt", "inspect", "x.pth", "--jsn"], "usage: shardwise ckpt inspect ", "--json"),
        (["ckpt", "inspect", "x.pth", "--tensor"], "usage: shardwise ckpt inspect ", "--tensors"),
        (
            ["ckpt", "verify", "x.pth", "--write-manifests"],
            "usage: shardwise ckpt verify ",
            "--write-manifest",
        ),
        (
            ["ckpt", "convert", "a", "b", "--to", "full", "--model"],
            "usage: shardwise ckpt convert ",
            "--model-only",
        ),
        (["plot", "w", "--output=x.png"], "usage: shardwise plot ", "--out"),
    ],
)
def test_an_unknown_flag_prints_its_subcommands_usage_and_the_nearest_flag(
    argv, usage, nearest, capsys
):
    err = _usage_error(capsys, *argv)
    assert usage in err, err
    assert "usage: shardwise [-h] COMMAND" not in err
    bad = argv[-2] if argv[-2].startswith("--") and not argv[-1].startswith("-") else argv[-1]
    bad = bad.split("=")[0]
    assert f"unrecognized arguments: {bad}" in err or f"unrecognized arguments: {argv[-2]}" in err
    assert f"did you mean {nearest}" in err, err


def test_an_unknown_flag_with_nothing_near_names_the_flag_only(capsys):
    err = _usage_error(capsys, "ckpt", "verify", "x.pth", "--zzzzzz")
    assert "usage: shardwise ckpt verify " in err and "unrecognized arguments: --zzzzzz" in err
    assert "did you mean" not in err


def test_the_console_script_reports_an_unknown_flag_with_exit_code_2():
    proc = subprocess.run(
        [sys.executable, "-m", "shardwise.cli", "ckpt", "inspect", "x.pth", "--jsn"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "usage: shardwise ckpt inspect" in proc.stderr and "--json" in proc.stderr
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- start-up
def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter has imported after running ``code``."""
    proc = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


HEAVY = ("torch", "transformers", "mmengine", "ray", "tensorboard", "shardwise.runner.runner")


def test_building_the_command_line_imports_no_torch_runner_or_strategies():
    modules = _modules_after("import shardwise.cli; shardwise.cli.build_parser()")
    assert not [m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY]
    assert not [m for m in modules if m.startswith(("shardwise.strategies", "shardwise.runner"))]


def test_shardwise_help_imports_no_torch():
    code = (
        "import contextlib, io\n"
        "from shardwise.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['ckpt', 'verify', '--help'])\n"
        "    except SystemExit:\n"
        "        pass"
    )
    assert "torch" not in _modules_after(code)


def test_the_lazy_package_names_import_as_before():
    import shardwise
    import shardwise.checkpoint as checkpoint
    from shardwise import build_strategy
    from shardwise.checkpoint import CheckpointCommit, clean_leftovers, write_last_checkpoint
    from shardwise.checkpoint.commit import CheckpointCommit as FromCommit

    assert CheckpointCommit is FromCommit and callable(clean_leftovers)
    assert callable(write_last_checkpoint) and callable(build_strategy)
    assert set(checkpoint.__all__) <= set(dir(checkpoint))
    assert all(getattr(checkpoint, name) is not None for name in checkpoint.__all__)
    assert all(getattr(shardwise, name) is not None for name in shardwise.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        checkpoint.nope  # noqa: B018


def test_ckpt_convert_offers_every_target_convert_writes():
    from shardwise.checkpoint.commands import _TARGETS
    from shardwise.checkpoint.convert import TARGETS

    assert _TARGETS == tuple(TARGETS)


def test_a_strategy_given_as_a_string_is_one_line_naming_the_way_to_give_its_keys():
    """``--cfg-options "strategy={'type':'DDPStrategy'}"`` sets a string: refused before launch
    (it failed on every rank with a traceback)."""
    import tests.test_runner_support  # noqa: F401 - registers DropoutRegressor
    from shardwise.runner.checks import check_config

    cfg = dict(model=dict(type="DropoutRegressor"), strategy="{'type': 'DDPStrategy'}")
    with pytest.raises(TypeError, match=r"^strategy: .*--cfg-options strategy.type=DDPStrategy"):
        check_config(cfg, world_size=1, local_world_size=1)
