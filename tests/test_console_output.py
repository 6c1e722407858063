"""What a run prints to the console: log lines and the progress bar never share a line, in a
terminal (the lines are written above the bar, which is then redrawn) and in a file or a
pipe (no bar there: the console lines, which carry the iteration and the ETA, are the
progress). The first iteration is logged, so that the starting loss is on the console."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed import REPO

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (INFO|WARNING|ERROR) [\w.]+ - ")
BAR_LINE = re.compile(r"^train: +\d+%\|.*\| *\d+/40 \[[^\]]*\]$")
BAR_PIECE = re.compile(r"\d+/40 \[|it/s|s/it|\d+%\|")
WARNING_LINE = re.compile(r"^\S*console_run\.py:\d+: UserWarning: a warning at iteration 7$")


def _command(work_dir: Path) -> list[str]:
    return [sys.executable, "-m", "tests.console_run", str(work_dir)]


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows for ``raw``: a carriage return moves back to the line's
    start and what follows overwrites it (tqdm's way of redrawing its bar)."""
    lines = []
    for line in raw.replace("\r\n", "\n").split("\n"):
        cells: list[str] = []
        for piece in line.split("\r"):
            cells[: len(piece)] = piece
        lines.append("".join(cells).rstrip())
    return [line for line in lines if line]


def _run_in_a_terminal(work_dir: Path) -> str:
    """Everything the run writes to stdout and stderr, both the same pseudo-terminal."""
    pty = pytest.importorskip("pty")
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    proc = subprocess.Popen(
        _command(work_dir), cwd=REPO, stdin=slave, stdout=slave, stderr=slave, close_fds=True
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode("utf-8", errors="replace")


def _check_log_lines(lines: list[str]) -> None:
    """Each log line whole and alone on its line, the expected ones all there in order."""
    for line in lines:
        if LOG_LINE.match(line):
            assert not BAR_PIECE.search(line.split(" - ", 1)[1]), line  # no bar glued on
    heads = [re.search(r"Iter\(train\) \[ ?(\d+)/40\]", line) for line in lines]
    logged = [int(h.group(1)) for h in heads if h]
    assert [i for i in logged if i != 1] == [10, 20, 30, 40]  # (1: the first-iteration test)
    assert sum("a module's line at iteration 7" in line for line in lines) == 1


def test_in_a_terminal_log_lines_are_written_above_the_bar(tmp_path):
    raw = _run_in_a_terminal(tmp_path)
    assert "\r" in raw and "train:" in raw  # a bar was drawn
    screen = _screen(raw)
    _check_log_lines(screen)
    for line in screen:  # every line: a log line, the warning (and its source line), a bar
        assert (
            LOG_LINE.match(line)
            or WARNING_LINE.match(line)
            or line.strip().startswith("warnings.warn(")
            or BAR_LINE.match(line)
        ), line
    bars = [line for line in screen if BAR_LINE.match(line)]
    assert len(bars) == 1 and screen[-1] == bars[0] and "40/40" in bars[0]  # drawn once, last


def test_in_a_file_or_pipe_the_console_lines_are_the_progress(tmp_path):
    proc = subprocess.run(
        _command(tmp_path),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "\r" not in proc.stdout  # nothing redrawn in place
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    _check_log_lines(lines)
    for line in lines:
        assert (
            LOG_LINE.match(line)
            or WARNING_LINE.match(line)
            or line.strip().startswith("warnings.warn(")
        ), line


def test_the_first_iteration_is_on_the_console_and_the_records_are_mmengines(tmp_path, capsys):
    """Iteration 1's line shows the starting loss; the metrics file keeps mmengine's records
    (every ``interval`` iterations and the last), their windows unchanged."""
    from tests.console_run import main

    with pytest.warns(UserWarning, match="iteration 7"):
        main(str(tmp_path))
    stdout = capsys.readouterr().out
    first = next(line for line in stdout.splitlines() if "Iter(train) [ 1/40]" in line)
    (metrics,) = tmp_path.glob("*/metrics.jsonl")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["iter"] for r in records] == [10, 20, 30, 40]
    starting_loss = float(first.split("loss: ")[1].split()[0])
    assert starting_loss > records[0]["loss"]  # the loss at iteration 1, above the later means
