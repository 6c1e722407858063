"""Config text: ``.py`` source (``pretty_text``, ``dump``), JSON and YAML.

The ``.py`` text lists keys sorted at every level, as mmengine's ``pretty_text`` does (so that
``Config.diff`` compares configs whatever order they were written in), with ``dict(k=v)``
where the keys are names and ``{'k': v}`` where they are not.
"""

from __future__ import annotations

import json
import keyword
import math
from collections.abc import Mapping
from typing import Any

import yaml

__all__ = ["render"]

_LINE_LENGTH = 100


def _sorted_items(mapping: Mapping) -> list:
    return sorted(mapping.items(), key=lambda item: str(item[0]))


def _is_name(key: Any) -> bool:
    return isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)


def _py_literal(value: Any, key: str, strict: bool, braces: bool, indent: int = 0) -> str:
    """Python source for ``value``; with ``strict``, a non-literal raises ``TypeError``."""
    pad = " " * (indent + 4)
    if isinstance(value, Mapping):
        use_kw = not braces and all(_is_name(k) for k in value)
        parts = [
            (f"{k}=" if use_kw else f"{k!r}: ")
            + _py_literal(v, f"{key}.{k}", strict, braces, indent + 4)
            for k, v in _sorted_items(value)
        ]
        opening, closing = ("dict(", ")") if use_kw else ("{", "}")
    elif isinstance(value, (list, tuple)):
        parts = [
            _py_literal(v, f"{key}.{i}", strict, braces, indent + 4) for i, v in enumerate(value)
        ]
        opening, closing = ("[", "]") if isinstance(value, list) else ("(", ")")
    elif type(value) is float and not math.isfinite(value):
        return f"float('{value}')"
    elif type(value) in (type(None), bool, int, float, str, bytes) or not strict:
        return repr(value)
    else:
        hint = ""
        if hasattr(value, "__module__") and hasattr(value, "__qualname__"):
            hint = f", e.g. {value.__module__ + '.' + value.__qualname__!r}"
        raise TypeError(
            f"cannot dump config key {key!r}: {value!r} (a {type(value).__name__}) is not a "
            "Python literal; dump writes only None, bool, int, float, str, bytes, list, "
            f"tuple and dict. Use an import path string instead{hint}"
        )
    trailer = "," if isinstance(value, tuple) and len(value) == 1 else ""
    one_line = opening + ", ".join(parts) + trailer + closing
    if len(one_line) + indent <= _LINE_LENGTH - 20 and "\n" not in one_line:
        return one_line
    lines = parts
    if not isinstance(value, Mapping) and not any("\n" in p for p in parts):
        lines = [""]  # a long list of scalars: fill the lines
        for part in parts:
            if lines[-1] and len(pad) + len(lines[-1]) + len(part) + 2 > _LINE_LENGTH:
                lines.append("")
            lines[-1] += f"{part}, "
        lines = [line.removesuffix(", ") for line in lines]
    return opening + "\n" + "".join(f"{pad}{p},\n" for p in lines) + " " * indent + closing


def _check_plain(value: Any, key: str) -> Any:
    """``value`` checked to be JSON/YAML data; a class or function raises ``TypeError``."""
    if isinstance(value, Mapping):
        return {k: _check_plain(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_check_plain(v, f"{key}.{i}") for i, v in enumerate(value))
    if type(value) in (type(None), bool, int, float, str):
        return value
    raise TypeError(
        f"cannot dump config key {key!r}: {value!r} (a {type(value).__name__}) is not "
        "JSON/YAML data (None, bool, int, float, str, list, tuple, dict)"
    )


class _TupleDumper(yaml.SafeDumper):
    """YAML's safe dumper, writing tuples as ``!!python/tuple`` (as mmengine's dumps do)."""


_TupleDumper.add_representer(
    tuple,
    lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:python/tuple", data),
)


def render(data: Mapping, fmt: str, strict: bool = True) -> str:
    """The text of ``data`` as a ``.py``, ``.json`` or ``.yaml``/``.yml`` config.

    With ``strict``, a ``.py`` text holds only literals (anything else raises ``TypeError``
    naming its key); without, other values are written as their ``repr``.
    """
    if fmt == ".py":
        bad = [k for k in data if not _is_name(k)]
        if bad and strict:
            raise ValueError(
                f"cannot dump top-level keys {bad} to a .py config (they are not Python "
                "names); dump to .json or .yaml instead"
            )
        braces = "dict" in data  # a top-level ``dict = ...`` would shadow the builtin
        return "".join(
            f"{k} = {_py_literal(v, str(k), strict, braces)}\n" for k, v in _sorted_items(data)
        )
    plain = {k: _check_plain(v, str(k)) for k, v in data.items()}
    if fmt == ".json":
        return json.dumps(plain)
    if fmt in (".yaml", ".yml"):
        return yaml.dump(plain, Dumper=_TupleDumper, allow_unicode=True)
    raise ValueError(
        f"unsupported config file extension {fmt!r}; expected one of .py, .json, .yaml, .yml"
    )
