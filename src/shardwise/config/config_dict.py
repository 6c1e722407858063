"""``ConfigDict``: the dict a config is made of (mmengine's, without the addict dependency)."""

from __future__ import annotations

import copy
import difflib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from .lazy import LazyAttr, LazyObject, lazy_to_string

__all__ = ["ConfigDict", "keeping_lazy", "merge_a_into_b"]

BASE_KEY = "_base_"
DELETE_KEY = "_delete_"

# True while a lazy config is read: its code may handle LazyObjects but must not import them
_KEEP_LAZY: ContextVar[bool] = ContextVar("shardwise_config_keep_lazy", default=False)


@contextmanager
def keeping_lazy() -> Iterator[None]:
    """Within this block a :class:`ConfigDict` hands out lazy values unbuilt."""
    token = _KEEP_LAZY.set(True)
    try:
        yield
    finally:
        _KEEP_LAZY.reset(token)


def close_keys(name: object, keys: Iterable[Any]) -> str:
    """A hint naming the keys close to ``name`` (or the keys there are, when none is close)."""
    keys = [str(k) for k in keys]
    close = difflib.get_close_matches(str(name), keys, n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(repr(k) for k in close) + "?"
    if not keys:
        return "there are no keys here"
    shown = ", ".join(repr(k) for k in keys[:20])
    return f"existing keys: {shown}" + (", ..." if len(keys) > 20 else "")


def lazy_to_strings(value: Any) -> Any:
    """``value`` with dicts as plain dicts and lazy values as their dotted paths."""
    if isinstance(value, dict):
        return {k: lazy_to_strings(v) for k, v in dict.items(value)}
    if isinstance(value, (tuple, list)):
        return type(value)(lazy_to_strings(v) for v in value)
    if isinstance(value, (LazyAttr, LazyObject)):
        return lazy_to_string(value)
    return value


def merge_a_into_b(a: dict, b: Any, allow_list_keys: bool = False, *, strict: bool = True) -> Any:
    """``a`` merged into a copy of ``b``: a dict in ``a`` merges into the dict it meets in
    ``b`` unless it holds ``_delete_=True`` (then it replaces it); other values replace.

    With ``allow_list_keys``, a digit key of ``a`` indexes into a list of ``b``
    (``{'0': dict(x=1)}`` merges into the list's first item). ``strict`` (mmengine's
    ``Config._merge_a_into_b``, for ``_base_`` files and ``--cfg-options``) refuses a dict
    meeting a value that is not one, and new dicts become :class:`ConfigDict`; otherwise
    (mmengine's ``ConfigDict.merge``) the dict replaces the value, a ``_delete_=True`` in
    ``a`` itself replaces ``b`` whole, and new dicts are kept as they are. The ``_delete_``
    keys the merge meets are popped from ``a``.
    """
    if not strict and a.pop(DELETE_KEY, False):
        b = type(b)()
    b = b.copy()
    for key, value in a.items():
        if allow_list_keys and isinstance(b, list) and str(key).isdigit():
            index = int(key)
            if index >= len(b):
                raise KeyError(f"Index {index} exceeds the length of list {b}")
            if isinstance(value, dict):
                b[index] = merge_a_into_b(value, b[index], allow_list_keys, strict=strict)
            else:  # mmengine fails here (``value.items()``); a list item is replaced
                b[index] = value
        elif isinstance(value, dict):
            replace = value.pop(DELETE_KEY, False) or key not in b
            allowed = (dict, list) if allow_list_keys else dict
            if not replace and isinstance(b[key], allowed):
                b[key] = merge_a_into_b(value, b[key], allow_list_keys, strict=strict)
            elif not replace and strict:
                raise TypeError(
                    f"{key}={value} in child config cannot inherit from base because {key} "
                    f"is a dict in the child config but is of type {type(b[key])} in base "
                    f"config. You may set `{DELETE_KEY}=True` to ignore the base config."
                )
            else:
                b[key] = ConfigDict(value) if strict else value
        else:
            b[key] = value
    return b


class ConfigDict(dict):
    """A ``dict`` whose keys are also attributes; plain dicts put into it become ``ConfigDict``.

    As mmengine's: a lazy value (an import of a ``read_base()`` config) is built when it is
    read (``cfg.type``, ``cfg['type']``, ``get``, ``pop``, ``items``, ``values``) and stays
    lazy inside (``to_dict()`` writes its dotted path); ``update`` merges nested dicts;
    ``items()`` and ``values()`` return lists.

    Example::

        >>> d = ConfigDict(optimizer=dict(type='SGD', lr=0.1))
        >>> d.optimizer.lr
        0.1
        >>> d.update(optimizer=dict(momentum=0.9))
        >>> d.to_dict()
        {'optimizer': {'type': 'SGD', 'lr': 0.1, 'momentum': 0.9}}
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        for arg in args:
            if not arg:
                continue
            if isinstance(arg, dict):
                pairs: Iterable = dict.items(arg)  # unbuilt, even from a ConfigDict
            elif isinstance(arg, Mapping):
                pairs = arg.items()
            elif isinstance(arg, tuple) and not isinstance(arg[0], tuple):
                pairs = [arg]  # ConfigDict(('key', value))
            else:
                pairs = arg
            for key, value in pairs:
                self[key] = value
        for key, value in kwargs.items():
            self[key] = value

    @classmethod
    def _hook(cls, item: Any) -> Any:
        """Plain dicts (also inside lists and tuples) as ``ConfigDict``; other dicts kept."""
        if type(item) in (dict, OrderedDict):
            return cls(item)
        if type(item) in (list, tuple):
            return type(item)(cls._hook(elem) for elem in item)
        return item

    @staticmethod
    def build_lazy(value: Any) -> Any:
        """``value``, built if it is lazy (and no lazy config is being read)."""
        if isinstance(value, (LazyAttr, LazyObject)) and not _KEEP_LAZY.get():
            return value.build()
        return value

    # -- item and attribute access

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, self._hook(value))

    def __getitem__(self, key: Any) -> Any:
        return self.build_lazy(super().__getitem__(key))

    def __getattr__(self, name: str) -> Any:
        try:
            value = dict.__getitem__(self, name)
        except KeyError:
            hint = "" if name.startswith("__") else "; " + close_keys(name, self)
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute {name!r}{hint}"
            ) from None
        return self.build_lazy(value)

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(type(self), name):
            raise AttributeError(
                f"'{type(self).__name__}' object attribute {name!r} is read-only (a method); "
                f"set the key with cfg[{name!r}] = ..."
            )
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute {name!r}"
            ) from None

    def __iter__(self) -> Iterator:
        return iter(self.keys())

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key`` (built if lazy), or ``default``."""
        return self.build_lazy(super().get(key, default))

    def pop(self, key: Any, default: Any = None) -> Any:  # type: ignore[override]
        """Removes ``key`` and returns its value (built if lazy), or ``default`` (mmengine's)."""
        return self.build_lazy(super().pop(key, default))

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def values(self) -> list:  # type: ignore[override]
        """The values, lazy ones built (a list, as mmengine's)."""
        return [self.build_lazy(v) for v in super().values()]

    def items(self) -> list:  # type: ignore[override]
        """The ``(key, value)`` pairs, lazy values built (a list, as mmengine's)."""
        return [(k, self.build_lazy(v)) for k, v in super().items()]

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Sets keys; a dict value given for a key that holds a dict is merged into it."""
        if len(args) > 1:
            raise TypeError(f"update expected at most 1 positional argument, got {len(args)}")
        other: dict = {}
        for arg in args:
            other.update(dict.items(arg) if isinstance(arg, dict) else dict(arg).items())
        other.update(kwargs)
        for key, value in other.items():
            old = dict.get(self, key)
            if isinstance(old, dict) and isinstance(value, dict):
                old.update(value)
            else:
                self[key] = value

    def merge(self, other: dict) -> None:
        """Merges ``other`` into this dict recursively; ``_delete_=True`` replaces a dict, and a
        dict replaces a value that is not one (mmengine's ``ConfigDict.merge``)."""
        merged = merge_a_into_b(copy.deepcopy(other), copy.deepcopy(self), strict=False)
        self.clear()
        for key, value in merged.items():
            self[key] = value

    # -- copies, pickling, comparison

    def __deepcopy__(self, memo: dict) -> ConfigDict:
        other = type(self)()
        memo[id(self)] = other
        for key, value in super().items():
            other[copy.deepcopy(key, memo)] = copy.deepcopy(value, memo)
        return other

    def __copy__(self) -> ConfigDict:
        other = type(self)()
        for key, value in super().items():
            other[key] = value
        return other

    copy = __copy__

    def __reduce_ex__(self, protocol: Any) -> tuple:
        return (type(self), (dict(super().items()),))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ConfigDict):
            return other.to_dict() == self.to_dict()
        if isinstance(other, dict):
            return dict(self.items()) == other
        return False

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    # -- conversion

    def _to_lazy_dict(self) -> dict:
        """Plain nested dicts, lazy values kept unbuilt."""

        def to_dict(data: Any) -> Any:
            if isinstance(data, dict):
                return {k: to_dict(v) for k, v in dict.items(data)}
            if isinstance(data, (list, tuple)):
                return type(data)(to_dict(v) for v in data)
            return data

        return to_dict(self)

    def to_dict(self) -> dict:
        """Plain nested dicts; lazy values become their dotted paths (``'torch.optim.SGD'``)."""
        return lazy_to_strings(self)
