"""Config files: ``.py`` (with ``_base_`` inheritance), ``.json`` and ``.yaml``; overrides.

Example::

    >>> cfg = Config(dict(model=dict(type='Linear', in_features=4)))
    >>> cfg.model.in_features
    4
    >>> cfg.merge_from_dict(parse_cfg_options(['model.in_features=8', 'lr=0.1']))
    >>> cfg.model.in_features, cfg.lr
    (8, 0.1)

The vocabulary is mmengine's: a config file may name ``_base_`` files (one path or a list,
relative to the file, of any supported format) whose dicts it extends; nested dicts are
merged recursively, and ``_delete_=True`` in a child dict replaces the base dict instead.
A ``.py`` config may read merged base values through the variable ``_base_``
(``lr = _base_.optimizer.lr * 2``).

Differences from mmengine, on purpose: several ``_base_`` files may define the same key
(later files are merged over earlier ones); a child dict replaces a base value of ``None``;
an override (``--cfg-options``) whose intermediate key does not exist is an error naming
the close matches instead of silently creating it; ``dump`` to ``.py`` writes only Python
literals and refuses anything else (a class, a function) with a ``TypeError`` naming the key.
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import importlib
import json
import keyword
import math
import os
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "Config",
    "ConfigDict",
    "DictAction",
    "parse_value",
    "parse_override",
    "parse_cfg_options",
]

BASE_KEY = "_base_"
DELETE_KEY = "_delete_"
SUPPORTED_EXTENSIONS = (".py", ".json", ".yaml", ".yml")
RESERVED_KEYS = ("filename", "pretty_text")
_LINE_LENGTH = 100


def _close_keys(name: object, keys: Iterable[Any]) -> str:
    """A hint listing the keys close to ``name`` (or all keys when none is close)."""
    keys = [str(k) for k in keys]
    close = difflib.get_close_matches(str(name), keys, n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(repr(k) for k in close) + "?"
    if not keys:
        return "there are no keys here"
    shown = ", ".join(repr(k) for k in keys[:20])
    return f"existing keys: {shown}" + (", ..." if len(keys) > 20 else "")


def _wrap(value: Any) -> Any:
    """Turns dicts (also inside lists and tuples) into :class:`ConfigDict`."""
    if isinstance(value, ConfigDict):
        return value
    if isinstance(value, Mapping):
        return ConfigDict(value)
    if type(value) is list:
        return [_wrap(v) for v in value]
    if type(value) is tuple:
        return tuple(_wrap(v) for v in value)
    return value


def _unwrap(value: Any) -> Any:
    """Turns :class:`ConfigDict` (also inside lists and tuples) back into plain dicts."""
    if isinstance(value, Mapping):
        return {k: _unwrap(v) for k, v in value.items()}
    if type(value) is list:
        return [_unwrap(v) for v in value]
    if type(value) is tuple:
        return tuple(_unwrap(v) for v in value)
    return value


class ConfigDict(dict):
    """A ``dict`` whose keys are also attributes; nested dicts become ``ConfigDict`` too.

    Example::

        >>> d = ConfigDict(optimizer=dict(type='SGD', lr=0.1))
        >>> d.optimizer.lr
        0.1
        >>> d.optimizer.momentum = 0.9
        >>> d.to_dict()
        {'optimizer': {'type': 'SGD', 'lr': 0.1, 'momentum': 0.9}}
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.update(*args, **kwargs)

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, _wrap(value))

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            hint = "" if name.startswith("__") else "; " + _close_keys(name, self)
            raise AttributeError(f"config has no key {name!r}{hint}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(f"config has no key {name!r}") from None

    def copy(self) -> ConfigDict:
        """A shallow copy (nested values are shared)."""
        return ConfigDict(self)

    __copy__ = copy

    def to_dict(self) -> dict:
        """A deep conversion to plain ``dict`` (lists and tuples are rebuilt)."""
        return _unwrap(self)


# ----------------------------------------------------------------------------- loading


def _merge(child: Mapping, base: Mapping, prefix: str = "") -> dict:
    """``child`` merged over ``base`` recursively; neither is modified.

    A dict in ``child`` with ``_delete_=True`` replaces the base value instead of being
    merged into it; ``_delete_`` keys never reach the result.
    """
    child = dict(child)
    out = {} if child.pop(DELETE_KEY, False) else dict(base)
    for key, value in child.items():
        if isinstance(value, Mapping):
            old = out.get(key)
            if isinstance(old, Mapping):
                out[key] = _merge(value, old, f"{prefix}{key}.")
            elif old is None or value.get(DELETE_KEY, False):
                out[key] = _merge(value, {}, f"{prefix}{key}.")
            else:
                raise TypeError(
                    f"cannot merge the dict {prefix}{key}={_unwrap(value)!r} into its base "
                    f"value {old!r} (a {type(old).__name__}); add {DELETE_KEY}=True to the "
                    "dict to replace the base value"
                )
        else:
            out[key] = value
    return out


def _base_paths(spec: Any, path: Path, where: str) -> list[Path]:
    """Resolves a ``_base_`` value (a path or a list of paths) relative to ``path``."""
    items = [spec] if isinstance(spec, (str, os.PathLike)) else spec
    if not isinstance(items, (list, tuple)) or not all(
        isinstance(p, (str, os.PathLike)) for p in items
    ):
        raise ValueError(f"{where}: {BASE_KEY} must be a path or a list of paths, got {spec!r}")
    return [path.parent / Path(p).expanduser() for p in items]


def _read_py(path: Path, stack: tuple[Path, ...]) -> tuple[dict, dict]:
    """Executes a ``.py`` config; returns (its own names, the merged dict of its bases)."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))  # a SyntaxError names the file and line
    base: dict = {}
    has_base = False
    body = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        if len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id == BASE_KEY:
            where = f"{path}, line {node.lineno}"
            try:
                spec = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError):
                raise ValueError(
                    f"{where}: {BASE_KEY} must be a literal path or list of paths"
                ) from None
            has_base = True
            for base_path in _base_paths(spec, path, where):
                base = _merge(_load(base_path, stack, included_by=path), base)
        else:
            body.append(node)
    tree.body = body
    namespace: dict[str, Any] = {"__file__": str(path), "__name__": "__shardwise_config__"}
    if has_base:
        namespace[BASE_KEY] = ConfigDict(copy.deepcopy(base))
    exec(compile(tree, str(path), "exec"), namespace)
    skipped = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)
    own = {
        name: value
        for name, value in namespace.items()
        if not name.startswith("__") and name != BASE_KEY and not isinstance(value, skipped)
    }
    return own, base


def _read_data(path: Path, stack: tuple[Path, ...]) -> tuple[dict, dict]:
    """Reads a ``.json``/``.yaml`` config; returns (its own keys, the merged dict of its bases)."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"cannot parse config file {path}: {e}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(
            f"config file {path} must hold a mapping at the top level, got a {type(data).__name__}"
        )
    base: dict = {}
    if BASE_KEY in data:
        for base_path in _base_paths(data.pop(BASE_KEY), path, str(path)):
            base = _merge(_load(base_path, stack, included_by=path), base)
    return data, base


def _load(path: Path, stack: tuple[Path, ...] = (), included_by: Path | None = None) -> dict:
    """Loads one config file and its bases into a plain merged dict."""
    path = Path(os.path.abspath(path))
    if path in stack:
        chain = " -> ".join(str(p) for p in (*stack[stack.index(path) :], path))
        raise ValueError(f"circular {BASE_KEY} inheritance: {chain}")
    if not path.is_file():
        where = f" (a {BASE_KEY} of {included_by})" if included_by else ""
        raise FileNotFoundError(f"config file not found: {path}{where}")
    if path.suffix not in SUPPORTED_EXTENSIONS:
        raise ValueError(
            f"unsupported config file extension {path.suffix!r} ({path}); "
            f"expected one of {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    reader = _read_py if path.suffix == ".py" else _read_data
    own, base = reader(path, (*stack, path))
    return _merge(own, base)


# ----------------------------------------------------------------------------- dumping


def _py_literal(value: Any, key: str, strict: bool, braces: bool, indent: int = 0) -> str:
    """Python source for ``value``; with ``strict``, a non-literal raises ``TypeError``."""
    pad = " " * (indent + 4)
    if isinstance(value, Mapping):
        use_kw = not braces and all(
            isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k in value
        )
        parts = [
            (f"{k}=" if use_kw else f"{k!r}: ")
            + _py_literal(v, f"{key}.{k}", strict, braces, indent + 4)
            for k, v in value.items()
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
    """``value`` with tuples as lists, for JSON/YAML; a non-data value raises ``TypeError``."""
    if isinstance(value, Mapping):
        return {k: _check_plain(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_check_plain(v, f"{key}.{i}") for i, v in enumerate(value)]
    if type(value) in (type(None), bool, int, float, str):
        return value
    raise TypeError(
        f"cannot dump config key {key!r}: {value!r} (a {type(value).__name__}) is not "
        "JSON/YAML data (None, bool, int, float, str, list, dict)"
    )


def _render(data: Mapping, fmt: str, strict: bool = True) -> str:
    """The text of ``data`` as a ``.py``, ``.json`` or ``.yaml`` config."""
    if fmt == ".py":
        bad = [k for k in data if not (isinstance(k, str) and k.isidentifier())]
        bad += [k for k in data if keyword.iskeyword(str(k))]
        if bad and strict:
            raise ValueError(
                f"cannot dump top-level keys {bad} to a .py config (they are not Python "
                "names); dump to .json or .yaml instead"
            )
        braces = "dict" in data  # a top-level ``dict = ...`` would shadow the builtin
        return "".join(f"{k} = {_py_literal(v, str(k), strict, braces)}\n" for k, v in data.items())
    plain = {k: _check_plain(v, str(k)) for k, v in data.items()}
    if fmt == ".json":
        return json.dumps(plain, indent=4) + "\n"
    if fmt in (".yaml", ".yml"):
        return yaml.safe_dump(plain, sort_keys=False, default_flow_style=False)
    raise ValueError(
        f"unsupported config file extension {fmt!r}; "
        f"expected one of {', '.join(SUPPORTED_EXTENSIONS)}"
    )


# ----------------------------------------------------------------------------- Config


class Config:
    """A configuration: a :class:`ConfigDict` plus the file it came from.

    Keys are reached as attributes or items; ``Config`` also supports ``in``, ``len``,
    iteration, ``get``, ``keys``/``values``/``items``, ``copy``/``deepcopy`` and pickle.

    Args:
        cfg_dict: the configuration (nested dicts become :class:`ConfigDict`).
        filename: the file it was read from, if any.

    Example::

        >>> cfg = Config(dict(optimizer=dict(type='SGD', lr=0.1)))
        >>> cfg.optimizer.lr, cfg['optimizer']['type'], 'optimizer' in cfg
        (0.1, 'SGD', True)
    """

    def __init__(
        self, cfg_dict: Mapping[str, Any] | None = None, filename: str | os.PathLike | None = None
    ) -> None:
        if cfg_dict is None:
            cfg_dict = {}
        if not isinstance(cfg_dict, Mapping):
            raise TypeError(f"cfg_dict must be a dict, got a {type(cfg_dict).__name__}")
        reserved = [k for k in cfg_dict if k in RESERVED_KEYS]
        if reserved:
            raise KeyError(f"config keys {reserved} are reserved (Config attributes)")
        object.__setattr__(self, "_cfg_dict", ConfigDict(cfg_dict))
        object.__setattr__(self, "_filename", None if filename is None else str(filename))

    @staticmethod
    def fromfile(filename: str | os.PathLike, import_custom_modules: bool = True) -> Config:
        """Reads a ``.py``, ``.json`` or ``.yaml``/``.yml`` config and its ``_base_`` files.

        With ``import_custom_modules``, the modules named by the config's
        ``custom_imports=dict(imports=[...], allow_failed_imports=False)`` are imported (so
        that the classes they register can be built), as mmengine does.

        Example::

            cfg = Config.fromfile('configs/resnet_fsdp.py')
        """
        path = Path(os.path.abspath(Path(filename).expanduser()))
        cfg = Config(_load(path), filename=path)
        custom = cfg.get("custom_imports")
        if import_custom_modules and custom:
            _import_modules(custom.get("imports", []), custom.get("allow_failed_imports", False))
        return cfg

    @property
    def filename(self) -> str | None:
        """The absolute path of the file the config was read from (``None`` if none)."""
        return self._filename

    @property
    def pretty_text(self) -> str:
        """The config as ``.py`` source (non-literal values shown by their ``repr``)."""
        return _render(self._cfg_dict, ".py", strict=False)

    def to_dict(self) -> dict:
        """The config as plain nested dicts."""
        return self._cfg_dict.to_dict()

    def dump(self, file: str | os.PathLike | None = None) -> str | None:
        """Writes the config to ``file`` in the format its extension names.

        A ``.py`` dump loads back equal; it holds only Python literals (None, bool, int,
        float, str, bytes, list, tuple, dict) and a value of any other kind (a class, a
        function) raises ``TypeError`` naming its key: write such a value as an import
        path string (``'torch.optim.AdamW'``), which the registries resolve. JSON and YAML
        dumps turn tuples into lists. With no ``file``, returns the text in the format of
        :attr:`filename` (``.py`` if none).

        Example::

            cfg.dump(Path(cfg.work_dir) / 'config.py')
        """
        if file is None:
            fmt = Path(self._filename).suffix if self._filename else ".py"
            return _render(self._cfg_dict, fmt)
        path = Path(file)
        text = _render(self._cfg_dict, path.suffix)
        path.write_text(text, encoding="utf-8")
        return None

    def merge_from_dict(self, options: Mapping[str, Any], allow_list_keys: bool = True) -> None:
        """Applies overrides keyed by dotted paths, as from ``--cfg-options``.

        A path's intermediate keys must exist (a typo raises ``KeyError`` naming the close
        keys); its last key may be new. An integer component indexes into a list
        (``'param_scheduler.0.end'``) when ``allow_list_keys``. A dict value is merged into
        an existing dict (``_delete_=True`` replaces it). Nothing changes if any path is bad.

        Example::

            >>> cfg = Config(dict(model=dict(depth=50), sched=[dict(end=10)]))
            >>> cfg.merge_from_dict({'model.depth': 101, 'sched.0.end': 20, 'model.pre': True})
            >>> cfg.to_dict()
            {'model': {'depth': 101, 'pre': True}, 'sched': [{'end': 20}]}
        """
        new = copy.deepcopy(self._cfg_dict)
        for dotted, value in options.items():
            parts = str(dotted).split(".")
            node: Any = new
            for i, part in enumerate(parts):
                is_last = i == len(parts) - 1
                where = repr(".".join(parts[:i])) if i else "the config"
                if isinstance(node, list):
                    if not (allow_list_keys and part.isdigit() and int(part) < len(node)):
                        raise KeyError(
                            f"cannot override {dotted!r}: {where} is a list of {len(node)} "
                            f"items, so {part!r} must be an index from 0 to {len(node) - 1}"
                        )
                    key: Any = int(part)
                elif isinstance(node, dict):
                    if part not in node and not is_last:
                        raise KeyError(
                            f"cannot override {dotted!r}: {part!r} is not a key of {where}; "
                            + _close_keys(part, node)
                        )
                    key = part
                else:
                    raise KeyError(
                        f"cannot override {dotted!r}: {where} holds {node!r} (of type "
                        f"{type(node).__name__}), not a dict or list; override {where} itself"
                    )
                if is_last:
                    old = node[key] if isinstance(node, list) else node.get(key)
                    if isinstance(value, Mapping) and isinstance(old, Mapping):
                        value = _merge(value, old)
                    elif isinstance(value, Mapping):
                        value = _merge(value, {})
                    node[key] = _wrap(value)
                elif node[key] is None and isinstance(node, dict):
                    node[key] = ConfigDict()  # ``clip_grad=None`` then ``clip_grad.max_norm=1``
                node = node[key]
        object.__setattr__(self, "_cfg_dict", new)

    # -- mapping protocol, delegated to the ConfigDict

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` if absent."""
        return self._cfg_dict.get(key, default)

    def keys(self) -> Any:
        return self._cfg_dict.keys()

    def values(self) -> Any:
        return self._cfg_dict.values()

    def items(self) -> Any:
        return self._cfg_dict.items()

    def __getattr__(self, name: str) -> Any:
        try:
            cfg_dict = object.__getattribute__(self, "_cfg_dict")
        except AttributeError:  # during unpickling, before __setstate__
            raise AttributeError(name) from None
        return getattr(cfg_dict, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in RESERVED_KEYS:
            raise AttributeError(f"{name!r} is a read-only Config attribute")
        self._cfg_dict[name] = value

    def __delattr__(self, name: str) -> None:
        delattr(self._cfg_dict, name)

    def __getitem__(self, key: str) -> Any:
        return self._cfg_dict[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key in RESERVED_KEYS:
            raise KeyError(f"{key!r} is reserved (a Config attribute)")
        self._cfg_dict[key] = value

    def __delitem__(self, key: str) -> None:
        del self._cfg_dict[key]

    def __contains__(self, key: object) -> bool:
        return key in self._cfg_dict

    def __iter__(self) -> Iterator[str]:
        return iter(self._cfg_dict)

    def __len__(self) -> int:
        return len(self._cfg_dict)

    def __repr__(self) -> str:
        return f"Config (path: {self._filename}): {self._cfg_dict!r}"

    def copy(self) -> Config:
        """A shallow copy: top-level keys are independent, nested values shared."""
        return Config(self._cfg_dict.copy(), self._filename)

    __copy__ = copy

    def __getstate__(self) -> dict:
        return {"cfg_dict": self._cfg_dict, "filename": self._filename}

    def __setstate__(self, state: dict) -> None:
        object.__setattr__(self, "_cfg_dict", state["cfg_dict"])
        object.__setattr__(self, "_filename", state["filename"])


def _import_modules(names: str | Sequence[str], allow_failed: bool) -> None:
    """Imports the modules a config names in ``custom_imports``."""
    for name in [names] if isinstance(names, str) else names:
        try:
            importlib.import_module(name)
        except ImportError:
            if not allow_failed:
                raise


# ----------------------------------------------------------------------------- overrides

_CLOSE = {"(": ")", "[": "]"}


def _split_top_level(text: str) -> list[str]:
    """Splits ``text`` at the commas outside brackets and quotes."""
    parts: list[str] = []
    stack: list[str] = []
    quote = ""
    start = 0
    at_item_start = True  # a quote opens a string only at the start of an item
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
            continue
        if char.isspace():
            continue
        if char in "'\"" and at_item_start:
            quote = char
        elif char in _CLOSE:
            stack.append(_CLOSE[char])
        elif char in ")]":
            if not stack or stack.pop() != char:
                raise ValueError(f"unbalanced {char!r} in {text!r}")
        elif char == "," and not stack:
            parts.append(text[start:i])
            start = i + 1
        at_item_start = char in ",(["
    if stack or quote:
        raise ValueError(f"unclosed {(stack[-1:] or [quote])[0]!r} in {text!r}")
    parts.append(text[start:])
    return parts


def parse_value(text: str) -> Any:
    """Parses the value of a ``key=value`` override.

    ``1`` → int, ``0.5``/``1e-3`` → float, ``true``/``False`` → bool, ``None``/``none``/
    ``null`` → None, ``[1,2]`` → list, ``(1,2)`` → tuple (brackets nest), ``a,b,c`` → list,
    ``'x'``/``"x"`` → the string inside, anything else → the string itself. Put a value in
    quotes to keep it a string (``"'1,2'"``).

    Example::

        >>> parse_value('[(1, 2), [a, b], c]')
        [(1, 2), ['a', 'b'], 'c']
        >>> parse_value('0.1,none,"1"')
        [0.1, None, '1']
    """
    text = text.strip()
    try:
        items = _split_top_level(text)
    except ValueError as e:
        raise ValueError(
            f"cannot parse override value {text!r}: {e}; quote it to pass a string"
        ) from None
    if len(items) > 1:
        if not items[-1].strip():  # ``a,b,`` is ``[a, b]``
            items.pop()
        return [parse_value(item) for item in items]
    if len(text) >= 2 and text[0] in _CLOSE and text[-1] == _CLOSE[text[0]]:
        try:
            inner = _split_top_level(text[1:-1])
        except ValueError:  # ``[1][2]``: the brackets are not a pair; a plain string
            inner = None
        if inner is not None:
            if not inner[-1].strip():
                inner.pop()
            values = [parse_value(item) for item in inner]
            return values if text[0] == "[" else tuple(values)
    if len(text) >= 2 and text[0] in "'\"" and text[-1] == text[0]:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text[1:-1]
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    return text


def parse_override(text: str) -> tuple[str, Any]:
    """Splits ``'key=value'`` at the first ``=`` and parses the value.

    Example::

        >>> parse_override('optim_wrapper.optimizer.lr=1e-3')
        ('optim_wrapper.optimizer.lr', 0.001)
    """
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"override {text!r} must have the form key=value (e.g. model.depth=50)")
    return key, parse_value(value)


def parse_cfg_options(options: Iterable[str]) -> dict[str, Any]:
    """Parses ``--cfg-options`` strings into a dict for :meth:`Config.merge_from_dict`.

    Example::

        >>> parse_cfg_options(['model.depth=101', 'gpu_ids=0,1'])
        {'model.depth': 101, 'gpu_ids': [0, 1]}
    """
    return dict(parse_override(option) for option in options)


class DictAction(argparse.Action):
    """An argparse action collecting ``key=value`` arguments into a dict (as mmengine's).

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
        options = dict(getattr(namespace, self.dest, None) or {})
        values = [values] if isinstance(values, str) else values
        try:
            options.update(parse_cfg_options(values))
        except ValueError as e:
            raise argparse.ArgumentError(self, str(e)) from None
        setattr(namespace, self.dest, options)
