"""shardwise.logging: rank-aware console and per-rank files, print_log."""

from __future__ import annotations

import io
import logging
import sys
import uuid
from pathlib import Path

import pytest

import shardwise.logging
from shardwise import dist
from shardwise.logging import get_current_logger, get_logger, print_log
from tests.distributed import run_distributed


def _unique_name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def keep_current_logger(monkeypatch):
    """Loggers made here do not stay 'current' for the tests that run after these."""
    monkeypatch.setattr(shardwise.logging, "_created", list(shardwise.logging._created))


@pytest.fixture
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


# --------------------------------------------------------------------------- two ranks


def _log_from_each_rank(log_dir: str) -> str:
    console = io.StringIO()
    sys.stdout = console  # the console handler writes to the current sys.stdout
    logger = get_logger("exp", log_file=Path(log_dir) / "20261121_100000.log")
    rank = dist.get_rank()
    logger.info("info from rank %d", rank)
    logger.error("error from rank %d", rank)
    for handler in logger.handlers:
        handler.flush()
    sys.stdout = sys.__stdout__
    return console.getvalue()


@pytest.fixture(scope="module")
def two_rank_logs(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logs")
    consoles = run_distributed(_log_from_each_rank, 2, str(log_dir), init_pg=True, timeout=120)
    return log_dir, consoles


def test_every_rank_writes_its_own_log_file_with_its_rank_tag(two_rank_logs):
    log_dir, _ = two_rank_logs
    assert sorted(p.name for p in log_dir.iterdir()) == [
        "20261121_100000.log",
        "20261121_100000_rank1.log",
    ]
    rank0 = (log_dir / "20261121_100000.log").read_text()
    rank1 = (log_dir / "20261121_100000_rank1.log").read_text()
    assert "[rank0] INFO exp - info from rank 0" in rank0
    assert "[rank1] INFO exp - info from rank 1" in rank1
    assert "rank 1" not in rank0 and "rank 0" not in rank1


def test_only_rank0_logs_info_to_the_console(two_rank_logs):
    _, (console0, console1) = two_rank_logs
    assert "[rank0] INFO exp - info from rank 0" in console0
    assert "info from rank 1" not in console1
    assert "[rank1] ERROR exp - error from rank 1" in console1


# --------------------------------------------------------------------------- one process


def test_console_line_has_time_level_and_name_without_rank_tag(capsys, single_process):
    name = _unique_name()
    get_logger(name).info("hello")
    line = capsys.readouterr().out.strip()
    assert line.endswith(f" INFO {name} - hello")
    assert "[rank" not in line


def test_non_zero_rank_console_shows_only_errors(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    logger = get_logger(_unique_name(), log_file=tmp_path / "run.log")
    logger.info("quiet")
    logger.error("loud")
    out = capsys.readouterr().out
    assert "quiet" not in out and "[rank1] ERROR" in out
    text = (tmp_path / "run_rank1.log").read_text()
    assert "quiet" in text and "loud" in text
    assert not (tmp_path / "run.log").exists()


def test_get_logger_twice_does_not_duplicate_handlers(capsys, tmp_path, single_process):
    name = _unique_name()
    first = get_logger(name, log_file=tmp_path / "a.log")
    second = get_logger(name, log_file=tmp_path / "a.log", log_level="DEBUG")
    assert first is second
    assert len(first.handlers) == 2
    second.debug("once")
    assert capsys.readouterr().out.count("once") == 1
    assert (tmp_path / "a.log").read_text().count("once") == 1


def test_log_level_filters_messages(capsys, single_process):
    logger = get_logger(_unique_name(), log_level="warning")
    logger.info("dropped")
    logger.warning("kept")
    out = capsys.readouterr().out
    assert "dropped" not in out and "kept" in out


def test_unknown_log_level_is_rejected():
    with pytest.raises(ValueError, match="'LOUD'"):
        get_logger(_unique_name(), log_level="LOUD")


@pytest.fixture
def shardwise_logger():
    """The library's 'shardwise' logger, put back as it was afterwards (other tests use it)."""
    logger = logging.getLogger("shardwise")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    for handler in logger.handlers:
        if handler not in saved[0]:
            handler.close()
    logger.handlers[:], logger.level, logger.propagate = saved


def test_module_loggers_propagate_to_the_shardwise_logger(capsys, single_process, shardwise_logger):
    get_logger("shardwise")
    logging.getLogger("shardwise.dist").info("from a module")
    assert "INFO shardwise.dist - from a module" in capsys.readouterr().out


# --------------------------------------------------------------------------- print_log


def test_print_log_destinations(capsys, single_process):
    print_log("plain")
    assert capsys.readouterr().out == "plain\n"

    print_log("nothing", logger="silent")
    assert capsys.readouterr().out == ""

    name = _unique_name()
    logger = get_logger(name)
    assert get_current_logger() is logger
    print_log("current", logger="current", level=logging.WARNING)
    assert f"WARNING {name} - current" in capsys.readouterr().out

    print_log("by object", logger=logger)
    print_log("by name", logger=name)
    out = capsys.readouterr().out
    assert "by object" in out and "by name" in out


def test_print_log_rejects_an_unknown_logger():
    with pytest.raises(ValueError, match="no-such-logger"):
        print_log("x", logger="no-such-logger")
    with pytest.raises(TypeError):
        print_log("x", logger=3)  # type: ignore[arg-type]
