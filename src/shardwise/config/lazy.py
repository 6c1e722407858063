"""Lazy references to imported objects, as a ``read_base()`` config's imports become.

In a lazy config, ``from torch.optim import AdamW`` does not import anything: ``AdamW`` is a
:class:`LazyObject` naming the module and the object, and ``AdamW.betas`` a :class:`LazyAttr`.
They are imported when built, which a :class:`~shardwise.config.ConfigDict` does when a value is
read from it; ``to_dict()`` writes them as their dotted paths (``'torch.optim.AdamW'``).
Behaviour, names and string forms are mmengine's (``mmengine.config.lazy``).

Example::

    >>> obj = LazyObject('collections', 'OrderedDict', 'cfg.py, line 3')
    >>> str(obj), obj.module
    ('OrderedDict', 'collections')
    >>> obj.build().__name__
    'OrderedDict'
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["LazyObject", "LazyAttr", "read_base"]


def _import(module: str, location: str | None) -> Any:
    """Imports ``module``; an ImportError names the config line that imported it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise type(e)(
            f"Failed to import {module} in {location} for {e}; install the package that "
            "provides it, or fix the import in the config"
        ) from e


class LazyObject:
    """A module, or an object of a module, imported only when :meth:`build` is called.

    Args:
        module: the module's dotted name; a list of names for ``import a.b`` /
            ``import a.c`` (built as the top-level package ``a``).
        imported: the object's name inside ``module`` (``None`` for the module itself).
        location: ``'<config file>, line <n>'`` of the import, named in errors.
    """

    def __init__(
        self,
        module: str | list[str] | tuple[str, ...],
        imported: str | None = None,
        location: str | None = None,
    ) -> None:
        if not isinstance(module, str) and not (
            isinstance(module, (list, tuple)) and all(isinstance(m, str) for m in module)
        ):
            raise TypeError(f"module must be a str or a list of str, got {module!r}")
        if imported is not None and not isinstance(imported, str):
            raise TypeError(f"imported must be a str or None, got {imported!r}")
        self._module = module
        self._imported = imported
        self.location = location

    def build(self) -> Any:
        """The imported module or object."""
        if not isinstance(self._module, str):  # ``import a.b``, ``import a.c``: package ``a``
            for name in self._module:
                _import(name, self.location)
            return _import(self.module, self.location)
        module = _import(self._module, self.location)
        if self._imported is None:
            return module
        if not hasattr(module, self._imported):
            raise ImportError(
                f"Failed to import {self._imported} from {self._module} in {self.location}: "
                f"{self._module} has no attribute {self._imported!r}"
            )
        return getattr(module, self._imported)

    @property
    def module(self) -> str:
        """The module's dotted name (the top-level package for ``import a.b``)."""
        if isinstance(self._module, str):
            return self._module
        return self._module[0].split(".")[0]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self} (imported lazily at {self.location}) cannot be called while the config "
            "is read; import it from the standard library, or call it in the code that "
            "builds the config's objects"
        )

    def __deepcopy__(self, memo: dict) -> LazyObject:
        return LazyObject(self._module, self._imported, self.location)

    def __getattr__(self, name: str) -> LazyAttr:
        location = self.location.split(", line")[0] if self.location is not None else None
        return LazyAttr(name, self, location)

    def __str__(self) -> str:
        return self._imported if self._imported is not None else self.module

    __repr__ = __str__

    # pickle looks these up on the instance: without them __getattr__ would answer
    def __getstate__(self) -> dict:
        return self.__dict__

    def __setstate__(self, state: dict) -> None:
        self.__dict__ = state


class LazyAttr:
    """An attribute of a :class:`LazyObject` (or of another ``LazyAttr``), e.g. ``nn.ReLU``."""

    def __init__(
        self, name: str, source: LazyObject | LazyAttr, location: str | None = None
    ) -> None:
        self.name = name
        self.source = source
        if isinstance(source, LazyAttr):
            self._module = f"{source._module}.{source.name}"
        elif not isinstance(source._module, str):  # ``import a.b``: attributes of ``a``
            self._module = str(source)
        elif source._imported is None:  # ``import a.b as c``: ``c.x`` lives in ``a.b``
            self._module = source._module
        else:  # ``from a import b``: ``b.x`` lives in ``a.b``
            self._module = f"{source._module}.{source}"
        self.location = location

    @property
    def module(self) -> str:
        return self._module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self.module}.{self.name} (imported lazily in {self.location}) cannot be called "
            "while the config is read"
        )

    def __getattr__(self, name: str) -> LazyAttr:
        return LazyAttr(name, self)

    def __deepcopy__(self, memo: dict) -> LazyAttr:
        return LazyAttr(self.name, self.source)

    def build(self) -> Any:
        """The attribute of the built source."""
        obj = self.source.build()
        try:
            return getattr(obj, self.name)
        except AttributeError:
            raise ImportError(
                f"Failed to import {self.module}.{self.name} in {self.location}: "
                f"{self.module} has no attribute {self.name!r}"
            ) from None

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__

    def __getstate__(self) -> dict:
        return self.__dict__

    def __setstate__(self, state: dict) -> None:
        self.__dict__ = state


def lazy_to_string(value: LazyObject | LazyAttr) -> str:
    """The dotted path ``to_dict()`` writes for a lazy value (mmengine's form)."""
    return f"{value.module}.{value}"


@contextmanager
def read_base() -> Iterator[None]:
    """Marks the imports of base configs in a lazy config; does nothing when run.

    Example (a config file)::

        from shardwise.config import read_base  # or: from mmengine.config import read_base

        with read_base():
            from .._base_.default_runtime import *
    """
    yield
