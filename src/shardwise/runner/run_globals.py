"""What a Runner sets of the process, put back when it is done, so that runs in one process (a
notebook, a sweep, a test suite) see nothing of each other.

A run sets, for itself: shardwise's default scope and mmengine's (a registry lookup into an
OpenMMLab package makes it mmengine's, as mmengine's Runner does), the ``shardwise`` logger's
file handler (its console handler stays: ``runner.logger`` still prints after ``train()``),
mmengine's ``MMLogger`` writing into the run's log file (and so every instance mmengine keeps
by name), the current visualizer, and the storage options of a ``CheckpointHook``'s
``out_dir``. :class:`RunGlobals` records them as they were when the Runner was created; when
``train()``, ``val()`` or ``test()`` ends (or the Runner's construction fails) it puts them
back, keeping the run's own to set again if the Runner is used once more (``test()`` after
``train()``).

Example::

    run_globals = RunGlobals()           # as the process is before the run
    ...                                  # the run sets its scope, logger, options
    with run_globals.entered():          # train(): the run's globals, then the process's
        ...
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from shardwise.checkpoint.storage import restore_storage_options, saved_storage_options
from shardwise.integrations import openmmlab
from shardwise.registry import DefaultScope
from shardwise.visualization import Visualizer

__all__ = ["RunGlobals", "creating_run_globals", "restoring_globals"]

#: The logger the strategy sets up (``get_logger('shardwise', log_file=...)``).
_LOGGER = "shardwise"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class _Globals:
    scopes: Any
    storage: dict[str, dict[str, Any]]
    files: list[logging.Handler]  # the logger's file handlers (its console one stays)
    visualizers: Any
    mmengine: dict[type, dict[str, Any]]

    @classmethod
    def now(cls) -> _Globals:
        logger = logging.getLogger(_LOGGER)
        return cls(
            scopes=DefaultScope.saved_instances(),
            storage=saved_storage_options(),
            files=[h for h in logger.handlers if isinstance(h, logging.FileHandler)],
            visualizers=Visualizer.saved_instances(),
            mmengine=openmmlab.saved_mmengine_instances(),
        )

    def put_back(self) -> None:
        DefaultScope.restore_instances(self.scopes)
        restore_storage_options(self.storage)
        logger = logging.getLogger(_LOGGER)
        openmmlab.close_file_handlers(logger, keep=self.files)
        others = [h for h in logger.handlers if not isinstance(h, logging.FileHandler)]
        logger.handlers = others + self.files
        Visualizer.restore_instances(self.visualizers)
        openmmlab.restore_mmengine_instances(self.mmengine)


class RunGlobals:
    """The process's globals before a run (taken when created), and the run's own."""

    def __init__(self) -> None:
        self._outside = _Globals.now()
        self._inside: _Globals | None = None
        self._depth = 0  # test() called from within train(): the outermost call restores

    def leave(self) -> None:
        """Keep the run's globals and put back the process's."""
        self._inside = _Globals.now()
        self._outside.put_back()

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """The run's globals inside the block (set again if it was left), the process's
        after it."""
        if self._depth == 0 and self._inside is not None:
            self._inside.put_back()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.leave()


def restoring_globals(method: F) -> F:
    """``Runner.train``/``val``/``test`` inside their runner's :meth:`RunGlobals.entered`."""

    @functools.wraps(method)
    def wrapped(runner: Any, *args: Any, **kwargs: Any) -> Any:
        run_globals = getattr(runner, "run_globals", None)
        if run_globals is None:  # a subclass that did not call Runner.__init__
            return method(runner, *args, **kwargs)
        with run_globals.entered():
            return method(runner, *args, **kwargs)

    return wrapped  # type: ignore[return-value]


def creating_run_globals(init: F) -> F:
    """``Runner.__init__`` that first records the process's globals (``runner.run_globals``)
    and puts them back if it fails."""

    @functools.wraps(init)
    def wrapped(runner: Any, *args: Any, **kwargs: Any) -> None:
        runner.run_globals = RunGlobals()
        try:
            init(runner, *args, **kwargs)
        except BaseException:
            runner.run_globals.leave()
            raise

    return wrapped  # type: ignore[return-value]
