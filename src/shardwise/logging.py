"""Rank-aware logging: rank 0 talks to the console, every rank writes its own file.

``get_logger`` configures a standard :class:`logging.Logger` (so ``shardwise.*``
module loggers propagate into the default one):

- console (stdout): rank 0 at ``log_level``; other ranks only ``ERROR`` and above;
- file: with ``log_file='work_dir/20261121_100000.log'`` rank 0 writes that file and
  rank ``r > 0`` writes ``work_dir/20261121_100000_rank{r}.log`` beside it (ranks
  cannot share one file safely);
- format: ``2026-11-21 10:00:00 [rank1] INFO shardwise - msg``; the ``[rankN]`` tag
  appears when more than one process runs.

The rank comes from the process group when it is initialised, else from the
``RANK``/``WORLD_SIZE`` variables a launcher sets; create the logger after
``init_dist`` (or under torchrun) so that each rank picks its own file.

Example::

    logger = get_logger(log_file=f'{work_dir}/{timestamp}.log')
    logger.info('epoch 1 done')
    print_log('to the most recent shardwise logger', logger='current')
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from shardwise import dist

__all__ = ["get_current_logger", "get_logger", "print_log", "written_above_bar"]

_FORMAT = "%(asctime)s%(rank_tag)s %(levelname)s %(name)s - %(message)s"
_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

_lock = threading.Lock()
_created: list[str] = []  # names of loggers set up by get_logger, oldest first


def _dist_info() -> tuple[int, int]:
    """``(rank, world_size)``: the process group's, else the launcher's variables."""
    if dist.is_distributed():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class _RankFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        rank, world_size = _dist_info()
        record.rank_tag = f" [rank{rank}]" if world_size > 1 else ""
        return super().format(record)


class _ConsoleHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is at emit time; non-zero ranks pass only errors."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):  # type: ignore[override]
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # the stream is always the current sys.stdout
        pass

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR and _dist_info()[0] != 0:
            return False
        return bool(super().filter(record))


def _rank_file(log_file: str | os.PathLike, rank: int) -> Path:
    path = Path(log_file)
    return path if rank == 0 else path.with_name(f"{path.stem}_rank{rank}{path.suffix}")


def get_logger(
    name: str = "shardwise",
    log_file: str | os.PathLike | None = None,
    log_level: int | str = "INFO",
    file_mode: str = "w",
) -> logging.Logger:
    """Return the logger ``name``, configured for this rank.

    Calling it again for the same name adds no second console handler and no second
    handler for the same file; it sets the level and adds a file handler for a new
    ``log_file``. ``file_mode`` is ``'w'`` (truncate) or ``'a'`` (append).
    """
    level = _as_level(log_level)
    with _lock:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate = False
        ours = [h for h in logger.handlers if getattr(h, "_shardwise", False)]
        if not any(isinstance(h, _ConsoleHandler) for h in ours):
            _add_handler(logger, _ConsoleHandler())
        if log_file is not None:
            path = _rank_file(log_file, _dist_info()[0]).resolve()
            files = {h.baseFilename for h in ours if isinstance(h, logging.FileHandler)}
            if str(path) not in files:
                path.parent.mkdir(parents=True, exist_ok=True)
                _add_handler(logger, logging.FileHandler(path, mode=file_mode, encoding="utf-8"))
        for handler in logger.handlers:
            if getattr(handler, "_shardwise", False):
                handler.setLevel(level)
        if name in _created:
            _created.remove(name)
        _created.append(name)
    return logger


def _as_level(log_level: int | str) -> int:
    if isinstance(log_level, int) and not isinstance(log_level, bool):
        return log_level
    if isinstance(log_level, str):
        level = logging.getLevelName(log_level.upper())
        if isinstance(level, int):
            return level
    raise ValueError(
        f"Unknown log level {log_level!r}; expected an int or one of "
        "'DEBUG', 'INFO', 'WARNING', 'ERROR', 'CRITICAL'."
    )


def _add_handler(logger: logging.Logger, handler: logging.Handler) -> None:
    handler._shardwise = True  # type: ignore[attr-defined]
    handler.setFormatter(_RankFormatter(_FORMAT, datefmt=_DATE_FORMAT))
    logger.addHandler(handler)


def get_current_logger() -> logging.Logger:
    """The logger most recently set up by :func:`get_logger` (``'shardwise'`` if none)."""
    with _lock:
        name = _created[-1] if _created else None
    return logging.getLogger(name) if name is not None else get_logger()


def print_log(
    msg: object, logger: logging.Logger | str | None = None, level: int = logging.INFO
) -> None:
    """Print ``msg`` or log it, as mmengine's ``print_log`` does.

    ``logger``: ``None`` prints to stdout; ``'silent'`` drops the message;
    ``'current'`` uses :func:`get_current_logger`; a :class:`logging.Logger` or the
    name of an existing logger logs at ``level``.
    """
    if logger is None:
        print(msg)
    elif logger == "silent":
        return
    elif logger == "current":
        get_current_logger().log(level, msg)
    elif isinstance(logger, logging.Logger):
        logger.log(level, msg)
    elif isinstance(logger, str):
        if logger not in _created and logger not in logging.Logger.manager.loggerDict:
            raise ValueError(
                f"No logger named {logger!r}; create it with get_logger({logger!r}) or pass "
                "None, 'silent', 'current' or a logging.Logger."
            )
        logging.getLogger(logger).log(level, msg)
    else:
        raise TypeError(
            "logger must be None, 'silent', 'current', a logger name or a logging.Logger, "
            f"got {type(logger).__name__}."
        )


class _AboveBar(logging.Handler):
    """A console handler's lines, written above a tqdm bar: the bar is cleared, the line
    written and flushed, then the bar redrawn below it. The level, filters (rank 0 only) and
    format stay the console handler's."""

    def __init__(self, console: logging.StreamHandler, bar_class: Any) -> None:
        super().__init__(console.level)
        self.console, self.bar_class = console, bar_class

    def filter(self, record: logging.LogRecord) -> bool:
        return bool(self.console.filter(record))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = self.console.stream
            line = self.console.format(record) + self.console.terminator
            with self.bar_class.external_write_mode(file=stream):
                stream.write(line)
                stream.flush()
        except Exception:
            self.handleError(record)


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.stderr)


@contextlib.contextmanager
def written_above_bar(
    bar_class: Any, loggers: Sequence[logging.Logger] | None = None
) -> Iterator[None]:
    """While a ``bar_class`` (tqdm) bar is on the terminal, console log lines and Python
    warnings are written above it, never into it.

    ``loggers`` (default: shardwise's current logger and the root logger): each console
    handler (a stream handler on stdout or stderr) is swapped for one that clears the bar,
    writes the line and redraws the bar; put back on exit. ``warnings.showwarning`` is
    swapped the same way while it is Python's own.

    Example::

        bar = tqdm(total=100)
        with written_above_bar(tqdm):
            logger.info('above the bar')
    """
    loggers = [get_current_logger(), logging.getLogger()] if loggers is None else loggers
    swapped: list[tuple[logging.Logger, logging.Handler, logging.Handler]] = []
    for logger in dict.fromkeys(loggers):  # each once, in order
        for handler in list(logger.handlers):
            if _is_console(handler):
                above = _AboveBar(handler, bar_class)  # type: ignore[arg-type]
                logger.handlers[logger.handlers.index(handler)] = above
                swapped.append((logger, handler, above))
    shown = warnings.showwarning
    own = shown is getattr(warnings, "_showwarning_orig", None)

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        stream = sys.stderr if file is None else file
        text = warnings.formatwarning(message, category, filename, lineno, line)
        with bar_class.external_write_mode(file=stream):
            stream.write(text)
            stream.flush()

    if own:
        warnings.showwarning = show
    try:
        yield
    finally:
        if own and warnings.showwarning is show:
            warnings.showwarning = shown
        for logger, handler, above in swapped:
            if above in logger.handlers:
                logger.handlers[logger.handlers.index(above)] = handler
