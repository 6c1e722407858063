"""Reading ``_base_``-style config files (``.py``, ``.json``, ``.yaml``) as mmengine 0.10 does.

One file is read in these steps (:func:`file2dict`), each a function here:

1. its text gets ``{{ fileDirname }}``-style predefined variables, ``{{$ENV_VAR:default}}``
   environment variables, and a placeholder string for each ``{{_base_.a.b}}``;
2. its ``_base_`` files are read (recursively) into one dict, ``base``; two bases may not
   define the same key;
3. a ``.py`` file runs with ``_base_`` bound to that dict (so ``_base_.a.b = 1`` and
   ``_base_.pop('x')`` change what the file inherits); a ``.json``/``.yaml`` file is parsed;
4. the placeholders are replaced by the base values they name, and the file's own keys are
   merged over ``base`` (dicts recursively; ``_delete_=True`` replaces instead).

Values keep mmengine's identities: a base value read through ``_base_`` is the same object,
so a file that changes it changes what it inherits.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import os
import re
import traceback
import types
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .config_dict import BASE_KEY, DELETE_KEY, ConfigDict, close_keys, merge_a_into_b
from .lazy_reading import assigns_base, is_lazy_import

__all__ = ["file2dict", "dict_to_config_dict", "get_cfg_path"]

DEPRECATION_KEY = "_deprecation_"
SUPPORTED_EXTENSIONS = (".py", ".json", ".yaml", ".yml")

_BASE_VAR = re.compile(r"\{\{\s*" + BASE_KEY + r"\.([\w\.]+)\s*\}\}")
_ENV_VAR = re.compile(r"\{\{['\"]?\s*\$(\w+)\s*\:\s*(\S*?)\s*['\"]?\}\}")


class ConfigFormatError(OSError, ValueError):
    """A config file format other than ``.py``/``.json``/``.yaml``/``.yml``.

    An ``OSError`` as mmengine raises, and a ``ValueError`` for callers that catch bad input.
    """


def check_format(filename: str) -> None:
    """Raises :class:`ConfigFormatError` unless ``filename`` ends with a supported extension."""
    ext = os.path.splitext(filename)[1]
    if ext not in SUPPORTED_EXTENSIONS:
        raise ConfigFormatError(
            f"unsupported config format {ext!r} ({filename}); "
            f"expected one of {', '.join(SUPPORTED_EXTENSIONS)}"
        )


# ----------------------------------------------------------------------------- text


def substitute_predefined_vars(text: str, filename: str) -> str:
    """``{{ fileDirname }}``, ``{{ fileBasename }}``, ``{{ fileBasenameNoExtension }}`` and
    ``{{ fileExtname }}`` replaced by those of ``filename``."""
    basename = os.path.basename(filename)
    values = dict(
        fileDirname=os.path.dirname(filename),
        fileBasename=basename,
        fileBasenameNoExtension=os.path.splitext(basename)[0],
        fileExtname=os.path.splitext(filename)[1],
    )
    for key, value in values.items():
        value = value.replace("\\", "/")
        text = re.sub(r"\{\{\s*" + key + r"\s*\}\}", lambda _, v=value: v, text)
    return text


def substitute_env_variables(text: str) -> tuple[str, dict[str, str]]:
    """``{{$NAME:default}}`` (also quoted: ``{{'$NAME:default'}}``) replaced by the environment
    variable ``NAME``, or ``default`` when unset; returns the text and the variables used."""
    used: dict[str, str] = {}
    for name, default in _ENV_VAR.findall(text):
        value = os.environ.get(name, default)
        if name in os.environ:
            used[name] = value
        if not value:
            raise KeyError(
                f"`{name}` cannot be found in `os.environ`. Please set `{name}` in environment "
                "or give a default value."
            )
        pattern = r"\{\{['\"]?\s*\$" + name + r"\s*\:\s*" + re.escape(default) + r"\s*['\"]?\}\}"
        text = re.sub(pattern, lambda _, v=value: v, text)
    return text, used


def pre_substitute_base_vars(text: str) -> tuple[str, dict[str, str]]:
    """Each ``{{_base_.a.b}}`` replaced by a quoted placeholder string; returns the text and
    ``{placeholder: 'a.b'}`` for :func:`substitute_base_vars`."""
    placeholders = {}
    for name in set(_BASE_VAR.findall(text)):
        placeholder = f"_{name}_{uuid.uuid4().hex.lower()[:6]}"
        placeholders[placeholder] = name
        pattern = r"\{\{\s*" + BASE_KEY + r"\." + re.escape(name) + r"\s*\}\}"
        text = re.sub(pattern, f'"{placeholder}"', text)
    return text, placeholders


class _MissingBaseVar(KeyError):
    """A ``{{_base_.a.b}}`` whose path is not in the bases (reworded by :func:`file2dict`)."""


def _base_value(name: str, base_cfg: Any) -> Any:
    """The value at the dotted ``name`` in ``base_cfg``."""
    value = base_cfg
    keys = name.split(".")
    for i, key in enumerate(keys):
        if not isinstance(value, dict) or key not in value:
            where = ".".join([BASE_KEY, *keys[:i]]) if i else "the base configs"
            if isinstance(value, dict):
                hint = close_keys(key, value)
            else:
                hint = f"{where} is a {type(value).__name__}, not a dict"
            raise _MissingBaseVar(name, f"no key {key!r} in {where}; {hint}")
        value = value[key]
    return value


def substitute_base_vars(cfg: Any, placeholders: dict[str, str], base_cfg: dict) -> Any:
    """A copy of ``cfg`` with each placeholder string replaced by the base value it names
    (that value itself, not a copy, as mmengine).

    As mmengine's, every container is deep-copied on its own, level by level, so a value the
    file bound to a name and used in two places becomes two values: a ``_delete_=True`` in
    it then replaces the base's dict in both places (one shared dict would lose the marker to
    the first merge, and the second place would merge into the base's keys).
    """
    cfg = copy.deepcopy(cfg)
    if isinstance(cfg, dict):
        for key, item in cfg.items():
            if isinstance(item, str) and item in placeholders:
                cfg[key] = _base_value(placeholders[item], base_cfg)
            elif isinstance(item, (list, tuple, dict)):
                cfg[key] = substitute_base_vars(item, placeholders, base_cfg)
    elif isinstance(cfg, tuple):
        cfg = tuple(substitute_base_vars(item, placeholders, base_cfg) for item in cfg)
    elif isinstance(cfg, list):
        cfg = [substitute_base_vars(item, placeholders, base_cfg) for item in cfg]
    elif isinstance(cfg, str) and cfg in placeholders:
        cfg = _base_value(placeholders[cfg], base_cfg)
    return cfg


def _line_of(text: str, pattern: str) -> int:
    """The 1-based line of the first match of ``pattern`` in ``text`` (0 if none)."""
    match = re.search(pattern, text)
    return text.count("\n", 0, match.start()) + 1 if match else 0


# ----------------------------------------------------------------------------- bases


def _base_files(filename: str, text: str) -> tuple[list[str], int]:
    """The ``_base_`` entries of a config's (substituted) text, and the line naming them."""
    if filename.endswith(".py"):
        tree = ast.parse(text, filename=filename)
        node = next((n for n in tree.body if assigns_base(n)), None)
        if node is None:
            return [], 0
        expression = ast.Expression(body=node.value)  # type: ignore[attr-defined]
        bases = eval(compile(expression, filename, "eval"), {})
        line = node.lineno
    else:
        bases = _load_data(filename, text).get(BASE_KEY, [])
        line = _line_of(text, BASE_KEY)
    return (bases if isinstance(bases, list) else [bases]), line


class _RemoveBaseAssign(ast.NodeTransformer):
    """Drops every ``_base_ = ...`` (the bases are read before the file runs)."""

    def visit_Assign(self, node: ast.Assign) -> ast.Assign | None:
        return None if assigns_base(node) else node


def _installed_path(package: str) -> str:
    """The folder of an installed package."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise ModuleNotFoundError(f"{package} is not installed, please install {package}")
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return os.path.dirname(spec.origin or "")


def get_cfg_path(cfg_path: str, filename: str) -> tuple[str, str | None]:
    """The path of a ``_base_`` entry of ``filename``, and its scope.

    ``'../x.py'`` is relative to ``filename``'s folder (scope ``None``); ``'mmdet::a/b.py'``
    is the config ``a/b.py`` shipped with the installed package ``mmdet`` (scope ``'mmdet'``).
    """
    if "::" not in cfg_path:
        return os.path.join(os.path.dirname(filename), cfg_path), None
    scope, _, relative = cfg_path.partition("::")
    if "::" in relative or not re.match(r"\w*::\w*/\w*", cfg_path):
        raise ValueError(
            f"external base config {cfg_path!r} must look like 'package::folder/config.py', "
            "e.g. 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'"
        )
    return os.path.join(_installed_path(scope), ".mim", "configs", relative), scope


def dict_to_config_dict(cfg: Any, scope: str | None = None, has_scope: bool = True) -> Any:
    """``cfg`` with every dict (also in lists and tuples) a new :class:`ConfigDict`; with a
    ``scope``, the outermost dicts that have a ``type`` get ``_scope_=scope``."""
    if isinstance(cfg, dict):
        if has_scope and "type" in cfg:
            has_scope = False
            if scope is not None and cfg.get("_scope_", None) is None:
                cfg["_scope_"] = scope
        cfg = ConfigDict(cfg)
        for key, value in cfg.items():
            cfg[key] = dict_to_config_dict(value, scope=scope, has_scope=has_scope)
    elif isinstance(cfg, tuple):
        cfg = tuple(dict_to_config_dict(c, scope, has_scope=has_scope) for c in cfg)
    elif isinstance(cfg, list):
        cfg = [dict_to_config_dict(c, scope, has_scope=has_scope) for c in cfg]
    return cfg


# ----------------------------------------------------------------------------- one file


class _TupleLoader(yaml.SafeLoader):
    """YAML's safe loader, plus the ``!!python/tuple`` tag that dumps of tuples carry."""


_TupleLoader.add_constructor(
    "tag:yaml.org,2002:python/tuple",
    lambda loader, node: tuple(loader.construct_sequence(node, deep=True)),
)


def _load_data(filename: str, text: str) -> dict:
    """The mapping in a ``.json``/``.yaml`` config's text."""
    try:
        data = json.loads(text) if filename.endswith(".json") else yaml.load(text, _TupleLoader)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"cannot parse config file {filename}: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"config file {filename} must hold a mapping at the top level, "
            f"got a {type(data).__name__}"
        )
    return data


def _run_py(filename: str, text: str, base: ConfigDict) -> dict:
    """Runs a ``.py`` config's (substituted) text with ``_base_`` bound to ``base``; returns
    its top-level names, less modules, functions and ``__dunder__`` names."""
    tree = _RemoveBaseAssign().visit(ast.parse(text, filename=filename))
    namespace: dict[str, Any] = {BASE_KEY: base, "__file__": filename}
    given = set(namespace)
    # one namespace for globals and locals, so that the config's functions see its names
    exec(compile(tree, filename, "exec"), namespace, namespace)
    return {
        key: value
        for key, value in namespace.items()
        if key not in given
        and not key.startswith("__")
        and not isinstance(value, (types.FunctionType, types.ModuleType))
    }


def _read_bases(
    filename: str, text: str, options: dict, chain: tuple[str, ...]
) -> tuple[ConfigDict, list[str], dict]:
    """The merged dict of a file's ``_base_`` files, their texts and environment variables."""
    base = ConfigDict()
    texts: list[str] = []
    env: dict = {}
    entries, line = _base_files(filename, text)
    for entry in entries:
        path, scope = get_cfg_path(entry, filename)
        where = f"{filename}, line {line}" if line else filename
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{where}: the {BASE_KEY} file {entry!r} does not exist (looked for "
                f"{os.path.normpath(path)}); fix the path, which is relative to {filename}"
            )
        cfg, cfg_text, cfg_env = file2dict(path, **options, _chain=chain)
        texts.append(cfg_text)
        env.update(cfg_env)
        duplicates = base.keys() & cfg.keys()
        if duplicates:
            raise KeyError(
                f"Duplicate key is not allowed among bases. Duplicate keys: {duplicates} "
                f"({where}: {path} defines them again)"
            )
        base.update(dict_to_config_dict(cfg, scope))
    return base, texts, env


def file2dict(
    filename: str,
    use_predefined_variables: bool = True,
    use_environment_variables: bool = True,
    lazy_import: bool | None = None,
    *,
    _chain: tuple[str, ...] = (),
) -> tuple[dict, str, dict]:
    """Reads one ``_base_``-style config file and its bases.

    Returns ``(cfg_dict, cfg_text, env_variables)``: the merged dict, the texts of the file
    and its bases (each headed by its path), and the environment variables used.
    """
    filename = _checked_path(filename, lazy_import, _chain)
    source = Path(filename).read_text(encoding="utf-8")
    text = substitute_predefined_vars(source, filename) if use_predefined_variables else source
    env: dict = {}
    if use_environment_variables:
        text, env = substitute_env_variables(text)
    text, placeholders = pre_substitute_base_vars(text)
    options = dict(
        use_predefined_variables=use_predefined_variables,
        use_environment_variables=use_environment_variables,
        lazy_import=lazy_import,
    )
    base, texts, base_env = _read_bases(filename, text, options, (*_chain, filename))
    cfg = _run_py(filename, text, base) if filename.endswith(".py") else _load_data(filename, text)
    _warn_deprecation(cfg, filename)
    cfg = _with_base_values(cfg, placeholders, base, filename, source)
    cfg.pop(BASE_KEY, None)
    merged = merge_a_into_b(cfg, base)
    texts.append(filename + "\n" + source)
    own = {k: v for k, v in merged.items() if not k.startswith("__")}
    return own, "\n".join(texts), {**env, **base_env}


def _checked_path(filename: str, lazy_import: bool | None, chain: tuple[str, ...]) -> str:
    """The absolute path of a config file that exists, has a supported format, is not lazy
    (unless ``lazy_import`` says how to read it) and is not in its own ``_base_`` chain."""
    filename = os.path.abspath(os.path.expanduser(filename))
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'file "{filename}" does not exist')
    check_format(filename)
    if lazy_import is None and is_lazy_import(filename):
        raise RuntimeError(
            "The configuration file type in the inheritance chain must match the current "
            'configuration file type, either "lazy_import" or non-"lazy_import". You got this '
            "error since you use the syntax like `with read_base(): ...` or import non-builtin "
            f"module in {filename}"
            + (f", a {BASE_KEY} file of {chain[-1]}" if chain else "")
            + "; read it with lazy_import=False, or make every file of the chain use "
            "`with read_base():`"
        )
    if filename in chain:
        cycle = " -> ".join((*chain[chain.index(filename) :], filename))
        raise ValueError(f"circular {BASE_KEY} inheritance: {cycle}")
    return filename


def _with_base_values(
    cfg: dict, placeholders: dict[str, str], base: ConfigDict, filename: str, source: str
) -> dict:
    """:func:`substitute_base_vars`, its error naming the file, line and key."""
    try:
        return substitute_base_vars(cfg, placeholders, base)
    except _MissingBaseVar as e:
        name, why = e.args
        line = _line_of(source, r"\{\{\s*" + BASE_KEY + r"\." + re.escape(name) + r"\s*\}\}")
        raise KeyError(f"{filename}, line {line}: {{{{{BASE_KEY}.{name}}}}}: {why}") from None


def _warn_deprecation(cfg: dict, filename: str) -> None:
    """Warns (``DeprecationWarning``) about a file that sets ``_deprecation_``."""
    if DEPRECATION_KEY not in cfg:
        return
    info = cfg.pop(DEPRECATION_KEY)
    message = f"The config file {filename} will be deprecated in the future."
    if "expected" in info:
        message += f" Please use {info['expected']} instead."
    if "reference" in info:
        message += f" More information can be found at {info['reference']}"
    warnings.warn(message, DeprecationWarning, stacklevel=2)


def strip_delete_keys(value: Any) -> None:
    """Removes, in place, every ``_delete_`` key left in dicts that were never merged."""
    if isinstance(value, dict):
        dict.pop(value, DELETE_KEY, None)
        for item in dict.values(value):
            strip_delete_keys(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            strip_delete_keys(item)


def import_custom_modules(custom_imports: Mapping) -> None:
    """Imports the modules a config names in ``custom_imports=dict(imports=[...])`` (one name
    or a list); with ``allow_failed_imports=True`` one that fails is skipped with a warning."""
    keys = set(custom_imports) if isinstance(custom_imports, Mapping) else None
    if keys is None or "imports" not in keys or keys - {"imports", "allow_failed_imports"}:
        raise TypeError(
            f"custom_imports must be a dict with 'imports' (and 'allow_failed_imports'), e.g. "
            f"dict(imports=['my_package.models']), got {custom_imports!r}"
        )
    imports = custom_imports["imports"]
    names = [imports] if isinstance(imports, str) else imports
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"custom_imports must name modules as a str or a list of str, got {imports!r}"
        )
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any failure inside the package: one line
            if not custom_imports.get("allow_failed_imports", False):
                raise ImportError(_import_failure(name, e)) from None
            warnings.warn(f"{name} failed to import and is ignored.", UserWarning, stacklevel=2)


#: mmengine's words, kept so that a script matching them still does.
_FAILED = "Failed to import custom modules from custom_imports: "


def _find_spec(name: str) -> Any:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _import_failure(name: str, error: BaseException) -> str:
    """One line on why ``custom_imports`` could not import ``name``, and the fix."""
    skip = "or set allow_failed_imports=True to go on without it"
    top = name.partition(".")[0]
    if isinstance(error, ModuleNotFoundError) and error.name:
        missing = error.name.partition(".")[0]
        if missing == top and _find_spec(top) is None:
            return (
                f"{_FAILED}{name!r}: no module named {top!r}; pip "
                f"install {top} (if it is a package), or set PYTHONPATH to the folder that "
                f"holds it, {skip}"
            )
        if missing == top:
            return (
                f"{_FAILED}{name!r}: no module named {error.name!r}; "
                f"check the name, or set PYTHONPATH to the folder that holds it, {skip}"
            )
        if missing != top:
            return (
                f"{_FAILED}{name!r} failed: it needs {error.name!r}, which "
                f"is not installed; pip install {missing}, {skip}"
            )
    where = ""
    frames = traceback.extract_tb(error.__traceback__)
    if frames:
        where = f" (in {Path(frames[-1].filename).name}:{frames[-1].lineno})"
    detail = " ".join(str(error).split()) or "no message"
    return (
        f"{_FAILED}{name!r} failed with {type(error).__name__}: {detail}"
        f"{where}; the installed packages it imports do not fit each other or this torch: "
        f"reinstall them in versions built for torch (pip install --force-reinstall ...), "
        f"{skip}"
    )
