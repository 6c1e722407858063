"""Reading lazy (``with read_base():``) config files as mmengine 0.10 does.

A lazy config inherits with imports::

    from mmengine.config import read_base
    from torch.optim import AdamW

    with read_base():
        from .._base_.default_runtime import *      # a base config, relative to this file

    optim_wrapper = dict(optimizer=dict(type=AdamW, lr=1e-3))

The imports inside ``with read_base():`` read those config files (recursively) and bring
their names in, as Python's ``import`` would. Every other import of a module outside the
standard library becomes a :class:`~shardwise.config.LazyObject`: nothing is imported while the
config is read (``mmpretrain`` need not be installed to read an mmpretrain config); the object
is imported when the config's value is read. Imports from ``mmengine.config`` (``read_base``)
are served by ``shardwise.config``. Imported names are left out of ``to_dict()``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from .config_dict import BASE_KEY, ConfigDict
from .lazy import LazyObject

__all__ = ["ConfigParsingError", "is_lazy_import", "parse_lazy_import"]

# imported for real: the config vocabulary (read_base) of mmengine and of shardwise
_CONFIG_MODULES = ("mmengine.config", "shardwise.config")


class ConfigParsingError(RuntimeError):
    """A lazy (``read_base()``) config that cannot be parsed."""


def is_builtin_module(name: str) -> bool:
    """Whether an import of ``name`` runs for real in a lazy config: the standard library and
    the config modules. (mmengine asks where the module's file lies, which in a virtual
    environment counts ``os`` and ``math`` as third-party; the standard library's list of its
    own modules does not.)"""
    if name.startswith("."):
        return False
    if _is_config_module(name):
        return True
    return name.split(".")[0] in sys.stdlib_module_names


def _is_config_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in _CONFIG_MODULES)


def _is_read_base(node: ast.With) -> bool:
    expr = node.items[0].context_expr
    return (
        len(node.items) == 1
        and isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id == "read_base"
    )


def _where(filename: str, node: ast.AST) -> str:
    return f"{filename}, line {getattr(node, 'lineno', '?')}"


def is_lazy_import(filename: str) -> bool:
    """Whether a config file is a lazy one: it has ``with read_base():``, a relative import,
    or an import of a module outside the standard library before any ``_base_ = ...``."""
    if not filename.endswith(".py"):
        return False
    tree = ast.parse(Path(filename).read_text(encoding="utf-8"), filename=filename)
    for node in ast.walk(tree):
        if assigns_base(node):
            return False
        if isinstance(node, ast.With):
            if not _is_read_base(node):
                raise ConfigParsingError(
                    f"{_where(filename, node)}: only the `read_base()` context manager can be "
                    "used in a config"
                )
            return True
        if isinstance(node, ast.ImportFrom):
            if node.level:
                return True
            if node.module == "mmengine" and [a.name for a in node.names] == ["Config"]:
                continue
            if isinstance(node.module, str) and not is_builtin_module(node.module):
                return True
        if isinstance(node, ast.Import) and any(
            not is_builtin_module(alias.name) for alias in node.names
        ):
            return True
    return False


def assigns_base(node: ast.AST) -> bool:
    """Whether ``node`` is ``_base_ = ...``."""
    return (
        isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == BASE_KEY
    )


def _take_base_imports(filename: str, body: list[ast.stmt]) -> list[ast.ImportFrom]:
    """The ``from ... import`` statements of the first ``with read_base():`` block; the block
    is replaced in ``body`` by its statements."""
    for index, node in enumerate(body):
        if assigns_base(node):
            raise ConfigParsingError(
                f"{_where(filename, node)}: `{BASE_KEY} = ...` in a lazy config. The "
                "configuration file type in the inheritance chain must match the current "
                'configuration file type, either "lazy_import" or non-"lazy_import"; mark the '
                "inherited config files with `with read_base(): from .base import *`"
            )
        if not isinstance(node, ast.With):
            continue
        if not _is_read_base(node):
            raise ConfigParsingError(
                f"{_where(filename, node)}: only the `read_base()` context manager can be used "
                "in a config"
            )
        for statement in node.body:
            if not isinstance(statement, ast.ImportFrom) or statement.module is None:
                raise ConfigParsingError(
                    f"{_where(filename, statement)}: only `from <config module> import ...` "
                    "can be written in `with read_base():`"
                )
        body[index : index + 1] = node.body
        return node.body  # type: ignore[return-value]
    return []


def _base_module_path(filename: str, node: ast.ImportFrom) -> str:
    """The file a ``from <module> import`` in ``with read_base():`` names."""
    module = node.module or ""
    if node.level:
        parents = [".."] * (node.level - 1)
        path = os.path.join(os.path.dirname(filename), *parents, module.replace(".", "/") + ".py")
    else:
        package, *rest = module.split(".")
        if not rest:
            raise ConfigParsingError(
                f"{_where(filename, node)}: a base config must be a module inside a package, "
                f"not the package {package} (e.g. `from mmdet.configs.retinanet import *`)"
            )
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigParsingError(
                f"{_where(filename, node)}: cannot find the package {package!r} of the base "
                f"config {module}; install it"
            )
        root = list(spec.submodule_search_locations)[0]
        path = os.path.join(root, *rest[:-1], rest[-1] + ".py")
    if not os.path.isfile(path):
        raise ConfigParsingError(
            f"{_where(filename, node)}: `from {'.' * node.level}{module} import ...` in "
            f"`with read_base():` names {os.path.normpath(path)}, which does not exist; fix "
            "the module path (relative imports are relative to the config's folder)"
        )
    return path


def _lazy_assign(name: str, node: ast.AST, *args: Any, **kwargs: Any) -> ast.Assign:
    """``name = LazyObject(*args, **kwargs)`` at ``node``'s position."""
    call = ast.Call(
        func=ast.Name(id="LazyObject", ctx=ast.Load()),
        args=[ast.Constant(arg) for arg in args],
        keywords=[ast.keyword(arg=k, value=ast.Constant(v)) for k, v in kwargs.items()],
    )
    assign = ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=call)
    return ast.fix_missing_locations(ast.copy_location(assign, node))


class _ImportTransformer(ast.NodeTransformer):
    """Replaces imports: of base configs by their names (put in ``global_dict``), of
    third-party modules by ``LazyObject`` assignments; records every imported name."""

    def __init__(self, global_dict: dict, base_dict: dict, filename: str) -> None:
        self.global_dict = global_dict
        self.base_dict = base_dict
        self.filename = filename
        self.imported: set[str] = set()

    def visit_ImportFrom(self, node: ast.ImportFrom) -> Any:
        module = f"{node.level * '.'}{node.module}"
        if is_builtin_module(module):
            for alias in node.names:
                if alias.name == "*":
                    raise ConfigParsingError(
                        f"{_where(self.filename, node)}: `from {module} import *` is only "
                        "allowed for base configs in `with read_base():`"
                    )
                self.imported.add(alias.asname or alias.name)
            if _is_config_module(module):
                node.module = "shardwise.config"  # read_base, Config: also without mmengine
            return node
        if module in self.base_dict:
            self._import_base(node, self.base_dict[module])
            return None
        assigns = []
        for alias in node.names:
            if alias.name == "*":
                raise ConfigParsingError(
                    f"{_where(self.filename, node)}: `from {module} import *` is only allowed "
                    "for base configs in `with read_base():`"
                )
            name = alias.asname or alias.name
            location = f"{self.filename}, line {getattr(alias, 'lineno', node.lineno)}"
            assigns.append(_lazy_assign(name, alias, module, alias.name, location))
            self.imported.add(name)
        return assigns

    def _import_base(self, node: ast.ImportFrom, base: ConfigDict) -> None:
        for alias in node.names:
            if alias.name == "*":
                self.global_dict.update(dict.items(base))
                return
            if alias.name not in base:
                raise ImportError(
                    f"{_where(self.filename, node)}: cannot import {alias.name!r} from the base "
                    f"config {node.level * '.'}{node.module}, which defines "
                    f"{', '.join(map(repr, base)) or 'nothing'}"
                )
            self.global_dict[alias.asname or alias.name] = dict.__getitem__(base, alias.name)

    def visit_Import(self, node: ast.Import) -> Any:
        if len(node.names) != 1:
            raise ConfigParsingError(
                f"{_where(self.filename, node)}: import one module per line in a config"
            )
        alias = node.names[0]
        if alias.asname is None:
            if is_builtin_module(alias.name):  # mmengine keeps such a module in to_dict()
                self.imported.add(alias.name.split(".")[0])
            return node  # ``import a.b`` of a third-party module: _gather_plain_imports
        self.imported.add(alias.asname)
        if is_builtin_module(alias.name.split(".")[0]):
            return node
        return _lazy_assign(
            alias.asname, node, alias.name, location=f"{self.filename}, line {node.lineno}"
        )


def _gather_plain_imports(tree: ast.Module, filename: str) -> set[str]:
    """Replaces the top-level ``import a.b`` / ``import a.c`` of third-party modules by one
    ``a = LazyObject(['a.b', 'a.c'])`` per package; returns the packages' names."""
    imported: dict[str, list[str]] = defaultdict(list)
    lines: dict[str, int] = {}
    body: list[ast.stmt] = []
    for node in tree.body:
        if not isinstance(node, ast.Import):
            body.append(node)
            continue
        for alias in node.names:
            if is_builtin_module(alias.name):
                body.append(node)
                continue
            package = alias.name.split(".")[0]
            lines.setdefault(package, getattr(alias, "lineno", node.lineno))
            imported[package].append(alias.name)
    for package, names in imported.items():
        location = f"{filename}, line {lines[package]}"
        body.insert(0, _lazy_assign(package, tree.body[0], tuple(names), location=location))
    tree.body = body
    return set(imported)


def parse_lazy_import(filename: str, _chain: tuple[str, ...] = ()) -> tuple[ConfigDict, set]:
    """Reads a lazy config: returns its dict (lazy values unbuilt) and the names it imported.

    Call within :func:`~shardwise.config.config_dict.keeping_lazy`, so that the config's code
    handles its base configs' lazy values without importing them.
    """
    if os.path.realpath(filename) in map(os.path.realpath, _chain):
        raise ConfigParsingError(
            "circular `read_base()` imports: " + " -> ".join((*_chain, filename))
        )
    tree = ast.parse(Path(filename).read_text(encoding="utf-8"), filename=filename)
    base_dict: dict[str, ConfigDict] = {}
    base_imported: set[str] = set()
    for node in _take_base_imports(filename, tree.body):
        path = _base_module_path(filename, node)
        base_cfg, names = parse_lazy_import(path, (*_chain, filename))
        base_dict[f"{node.level * '.'}{node.module}"] = base_cfg
        base_imported |= names
    global_dict: dict[str, Any] = {"LazyObject": LazyObject, "__file__": filename}
    transformer = _ImportTransformer(global_dict, base_dict, filename)
    tree = transformer.visit(tree)
    plain_imports = _gather_plain_imports(tree, filename)
    exec(compile(ast.fix_missing_locations(tree), filename, "exec"), global_dict, global_dict)
    own = {
        key: value
        for key, value in global_dict.items()
        if not key.startswith("__") and key != "LazyObject"
    }
    return _to_config_dict(own), transformer.imported | plain_imports | base_imported


def _to_config_dict(value: Any) -> Any:
    """Every dict (also in lists and tuples) a :class:`ConfigDict`, lazy values unbuilt."""
    if isinstance(value, dict):
        out = ConfigDict()
        for key, item in dict.items(value):
            out[key] = _to_config_dict(item)
        return out
    if isinstance(value, (tuple, list)):
        return type(value)(_to_config_dict(item) for item in value)
    return value
