"""The Runner's hooks, kept in priority order and called by stage name."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from shardwise.registry import HOOKS

from ..priority import Priority, get_priority
from . import package_hooks
from .hook import Hook

__all__ = ["HookList"]

logger = logging.getLogger(__name__)


class HookList:
    """Hooks in the order they are called: by priority, and among equal priorities in the
    order they were added (mmengine's ``Runner.register_hook``)."""

    def __init__(self) -> None:
        self._hooks: list[Hook] = []

    def __iter__(self) -> Iterator[Hook]:
        return iter(self._hooks)

    def __len__(self) -> int:
        return len(self._hooks)

    def add(
        self, hook: Hook | Mapping[str, Any], priority: int | str | Priority | None = None
    ) -> Hook:
        """Insert a hook (object or ``HOOKS`` config, whose ``priority`` key is taken) by
        priority; ``priority`` overrides the hook's own."""
        if isinstance(hook, Mapping):
            cfg = dict(hook)
            priority = cfg.pop("priority", None) if priority is None else priority
            hook = HOOKS.build(cfg)
        elif not (isinstance(hook, Hook) or _is_hook(hook)):
            raise TypeError(
                f"a hook must be a Hook or a config dict with 'type', got {type(hook).__name__}"
            )
        package_hooks.adopt(hook)
        if priority is not None:
            hook.priority = priority
        value = get_priority(hook.priority)
        index = len(self._hooks)
        while index > 0 and get_priority(self._hooks[index - 1].priority) > value:
            index -= 1
        self._hooks.insert(index, hook)
        return hook

    def call(self, runner: Any, fn_name: str, **kwargs: Any) -> None:
        """``fn_name(runner, **kwargs)`` on every hook that has it, in order (a ``TypeError``
        names the hook: mostly a method whose signature is not the stage's). Before
        ``before_run``, the package hooks are checked against the run
        (:func:`~.package_hooks.check`: one that cannot run refused, one that will skip
        its work named)."""
        if fn_name == "before_run":
            package_hooks.check(runner, self._hooks)
        for hook in self._hooks:
            method = getattr(hook, fn_name, None)
            if method is None:
                continue
            try:
                method(runner, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{exc} in {hook!r}.{fn_name}") from exc

    def close(self, *more: Any) -> None:
        """After a failure: let every hook (and ``more`` objects) release what it holds
        (files, progress bars, trackers' runs); a failing ``close`` is logged, not raised."""
        for hook in [*self._hooks, *more]:
            close = getattr(hook, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001 - the original error matters more
                    logger.exception("closing %r failed", hook)


def _is_hook(obj: Any) -> bool:
    """A hook of another class tree (mmengine's ``Hook``: an OpenMMLab package's hooks): it
    has a ``priority`` and the stage methods, which the runner calls as mmengine's does."""
    return hasattr(obj, "priority") and all(callable(getattr(obj, n, None)) for n in Hook.stages)
