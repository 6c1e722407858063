"""The default scope: the registry tree's scope that builds resolve unprefixed names in."""

from __future__ import annotations

import itertools
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["DefaultScope"]


class DefaultScope:
    """The scope in which builds resolve unprefixed names, reachable from anywhere.

    Instances are kept by name (``get_instance``); the latest created one is current. A
    registry's ``build`` looks up names in the registry of the current scope, when its tree
    has one. This is mmengine's ``DefaultScope`` (its ``ManagerMixin`` protocol included).

    Example::

        >>> DefaultScope.get_instance('task', scope_name='shardwise').scope_name
        'shardwise'
        >>> with DefaultScope.overwrite_default_scope('myproj'):
        ...     DefaultScope.get_current_instance().scope_name
        'myproj'
    """

    _instance_dict: OrderedDict[str, DefaultScope] = OrderedDict()
    _lock = threading.RLock()
    _overwrites = itertools.count()

    def __init__(self, name: str, scope_name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a DefaultScope needs a non-empty str name, got {name!r}")
        if not isinstance(scope_name, str):
            raise TypeError(
                f"scope_name should be a string, but got {scope_name!r}; give the scope of "
                f"a registry, e.g. scope_name='shardwise'"
            )
        self._instance_name = name
        self._scope_name = scope_name

    @property
    def instance_name(self) -> str:
        return self._instance_name

    @property
    def scope_name(self) -> str:
        return self._scope_name

    @classmethod
    def get_instance(cls, name: str, **kwargs: Any) -> DefaultScope:
        """The instance called ``name``, created from ``kwargs`` (and made current) if new."""
        with cls._lock:
            if name not in cls._instance_dict:
                cls._instance_dict[name] = cls(name=name, **kwargs)
            elif kwargs:
                warnings.warn(
                    f"{cls.__name__} instance {name!r} exists already; get_instance ignores "
                    f"{kwargs}",
                    stacklevel=2,
                )
            return cls._instance_dict[name]

    @classmethod
    def get_current_instance(cls) -> DefaultScope | None:
        """The latest created instance, or None if there is none."""
        with cls._lock:
            return next(reversed(cls._instance_dict.values()), None)

    @classmethod
    def check_instance_created(cls, name: str) -> bool:
        return name in cls._instance_dict

    @classmethod
    def saved_instances(cls) -> OrderedDict[str, DefaultScope]:
        """The instances as they are now, for :meth:`restore_instances`."""
        with cls._lock:
            return cls._instance_dict.copy()

    @classmethod
    def restore_instances(cls, saved: OrderedDict[str, DefaultScope]) -> None:
        """Put back the instances :meth:`saved_instances` returned (the current one with them)."""
        with cls._lock:
            cls._instance_dict = saved.copy()

    @classmethod
    @contextmanager
    def overwrite_default_scope(cls, scope_name: str | None) -> Iterator[None]:
        """Make ``scope_name`` the current scope inside the block (no change for None)."""
        if scope_name is None:
            yield
            return
        with cls._lock:
            saved = cls._instance_dict.copy()
            cls.get_instance(f"overwrite-{next(cls._overwrites)}", scope_name=scope_name)
        try:
            yield
        finally:
            with cls._lock:
                cls._instance_dict = saved
