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
