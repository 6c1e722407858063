"""``--cfg-options key=value`` overrides, parsed with mmengine's ``DictAction`` syntax.

A value is, after its surrounding quotes are stripped and every space removed: an int, a
float, ``true``/``false`` (any case) as a bool, ``None`` as None, ``[a, b]`` a list,
``(a, b)`` a tuple (brackets nest), ``a,b`` a list, anything else the string itself.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Iterable
from typing import Any

__all__ = [
    "DictAction",
    "OverrideSyntaxError",
    "parse_value",
    "parse_override",
    "parse_cfg_options",
]


class OverrideSyntaxError(ValueError, AssertionError):
    """A malformed ``key=value`` override: a ``ValueError``, and the ``AssertionError`` that
    mmengine's ``DictAction`` raises, for code written against it."""


def _parse_scalar(text: str) -> Any:
    """An int, float, bool (``true``/``false``), ``None``, or the string itself."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text == "None":
        return None
    return text


def _next_comma(text: str, whole: str) -> int:
    """The index of the first comma of ``text`` outside brackets (its length if none)."""
    if text.count("(") != text.count(")") or text.count("[") != text.count("]"):
        raise OverrideSyntaxError(
            f"cannot parse override value {whole!r}: its brackets are not balanced in "
            f"{text!r}; close every '(' and '['"
        )
    depth = 0
    for index, char in enumerate(text):
        depth += (char in "([") - (char in ")]")
        if char == "," and depth == 0:
            return index
    return len(text)


def parse_value(text: str, _whole: str | None = None) -> Any:
    """Parses the value of a ``key=value`` override (mmengine's ``DictAction`` rules).

    Example::

        >>> parse_value('[(1, 2), [a, b], c]')
        [(1, 2), ['a', 'b'], 'c']
        >>> parse_value('0.1,None,true')
        [0.1, None, True]
    """
    whole = text if _whole is None else _whole
    text = text.strip("'\"").replace(" ", "")
    is_tuple = text.startswith("(") and text.endswith(")")
    if is_tuple or (text.startswith("[") and text.endswith("]")):
        text = text[1:-1]
    elif "," not in text:
        return _parse_scalar(text)
    values = []
    while text:
        comma = _next_comma(text, whole)
        values.append(parse_value(text[:comma], whole))
        text = text[comma + 1 :]
    return tuple(values) if is_tuple else values


def parse_override(text: str) -> tuple[str, Any]:
    """Splits ``'key=value'`` at the first ``=`` and parses the value.

    Example::

        >>> parse_override('optim_wrapper.optimizer.lr=1e-3')
        ('optim_wrapper.optimizer.lr', 0.001)
    """
    key, sep, value = text.partition("=")
    if not sep:
        raise OverrideSyntaxError(
            f"override {text!r} must have the form key=value (e.g. model.depth=50)"
        )
    return key, parse_value(value)


def parse_cfg_options(options: Iterable[str]) -> dict[str, Any]:
    """Parses ``--cfg-options`` strings into a dict for ``Config.merge_from_dict``.

    Example::

        >>> parse_cfg_options(['model.depth=101', 'gpu_ids=0,1'])
        {'model.depth': 101, 'gpu_ids': [0, 1]}
    """
    return dict(parse_override(option) for option in options)


class DictAction(argparse.Action):
    """An argparse action collecting ``key=value`` arguments into a dict (mmengine's).

    A malformed value raises :class:`OverrideSyntaxError` (a ``ValueError``) out of
    ``parse_args``, as mmengine's raises its ``AssertionError``.

    Example::

        >>> parser = argparse.ArgumentParser()
        >>> _ = parser.add_argument('--cfg-options', nargs='+', action=DictAction)
        >>> parser.parse_args(['--cfg-options', 'a.b=1', 'c=[x,y]']).cfg_options
        {'a.b': 1, 'c': ['x', 'y']}
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        options = copy.copy(getattr(namespace, self.dest, None) or {})
        if values is not None:
            options.update(parse_cfg_options([values] if isinstance(values, str) else values))
        setattr(namespace, self.dest, options)
