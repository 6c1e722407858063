"""``Config``: a configuration read from a file, or built from a dict."""

from __future__ import annotations

import argparse
import copy
import difflib
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from . import lazy_reading, reading
from .config_dict import ConfigDict, close_keys, keeping_lazy, merge_a_into_b
from .dumping import render

__all__ = ["Config", "add_args"]

RESERVED_KEYS = ("filename", "text", "pretty_text", "env_variables")


def add_args(
    parser: argparse.ArgumentParser, cfg: Mapping, prefix: str = ""
) -> argparse.ArgumentParser:
    """Adds a ``--key`` option to ``parser`` for each (nested: ``--a.b``) value of ``cfg``."""
    for key, value in cfg.items():
        name = f"--{prefix}{key}"
        if isinstance(value, str):
            parser.add_argument(name)
        elif isinstance(value, bool):
            parser.add_argument(name, action="store_true")
        elif isinstance(value, (int, float)):
            parser.add_argument(name, type=type(value))
        elif isinstance(value, dict):
            add_args(parser, value, f"{prefix}{key}.")
        elif isinstance(value, (list, tuple)):
            parser.add_argument(name, type=type(value[0]) if value else str, nargs="+")
        else:
            warnings.warn(f"cannot parse key {prefix}{key} of type {type(value)}", stacklevel=2)
    return parser


class Config:
    """A configuration: a :class:`ConfigDict`, the file it came from and that file's text.

    mmengine's ``Config``: keys are reached as attributes or items; ``fromfile`` reads
    ``_base_``-style and lazy (``with read_base():``) ``.py`` configs and ``.json``/``.yaml``
    ones exactly as mmengine 0.10 reads them (see :mod:`shardwise.config.reading` and
    :mod:`shardwise.config.lazy_reading`).

    Args:
        cfg_dict: the configuration (plain dicts in it become :class:`ConfigDict`).
        cfg_text: the text it was read from (default: the file's text, if ``filename``).
        filename: the file it was read from, if any.
        env_variables: the environment variables the file used.
        format_python_code: accepted for mmengine's signature; the text is not reformatted.

    Example::

        >>> cfg = Config(dict(optimizer=dict(type='SGD', lr=0.1)))
        >>> cfg.optimizer.lr, cfg['optimizer']['type'], 'optimizer' in cfg
        (0.1, 'SGD', True)
    """

    def __init__(
        self,
        cfg_dict: Mapping[str, Any] | None = None,
        cfg_text: str | None = None,
        filename: str | os.PathLike | None = None,
        env_variables: dict | None = None,
        format_python_code: bool = True,
    ) -> None:
        if cfg_dict is None:
            cfg_dict = {}
        if not isinstance(cfg_dict, Mapping):
            raise TypeError(f"cfg_dict must be a dict, but got {type(cfg_dict)}")
        for key in cfg_dict:
            if key in RESERVED_KEYS:
                raise KeyError(f"{key} is reserved for config file; rename the key")
        if not isinstance(cfg_dict, ConfigDict):
            cfg_dict = ConfigDict(cfg_dict)
        filename = None if filename is None else str(filename)
        if cfg_text:
            text = cfg_text
        elif filename:
            text = Path(filename).read_text(encoding="utf-8")
        else:
            text = ""
        state = dict(
            _cfg_dict=cfg_dict,
            _filename=filename,
            _format_python_code=format_python_code,
            _imported_names=set(),
            _text=text,
            _env_variables={} if env_variables is None else env_variables,
        )
        for name, value in state.items():
            object.__setattr__(self, name, value)

    # ------------------------------------------------------------------ reading

    @staticmethod
    def fromfile(
        filename: str | os.PathLike,
        use_predefined_variables: bool = True,
        import_custom_modules: bool = True,
        use_environment_variables: bool = True,
        lazy_import: bool | None = None,
        format_python_code: bool = True,
    ) -> Config:
        """Reads a ``.py``, ``.json`` or ``.yaml``/``.yml`` config and its bases.

        Args:
            use_predefined_variables: replace ``{{ fileDirname }}`` and the like.
            import_custom_modules: import the modules named by the config's
                ``custom_imports=dict(imports=[...], allow_failed_imports=False)``.
            use_environment_variables: replace ``{{$NAME:default}}``.
            lazy_import: read as a lazy (``read_base()``) config; ``None``: as the file is.

        Example::

            cfg = Config.fromfile('configs/resnet_fsdp.py')
        """
        filename = str(filename)
        path = os.path.abspath(os.path.expanduser(filename))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"config file not found: {path}")
        reading.check_format(path)
        if lazy_import is False or (lazy_import is None and not Config._is_lazy_import(path)):
            cfg_dict, cfg_text, env_variables = Config._file2dict(
                filename, use_predefined_variables, use_environment_variables, lazy_import
            )
            reading.strip_delete_keys(cfg_dict)
            if import_custom_modules and cfg_dict.get("custom_imports", None):
                reading.import_custom_modules(cfg_dict["custom_imports"])
            return Config(cfg_dict, cfg_text, filename, env_variables)
        with keeping_lazy():
            cfg_dict, imported_names = lazy_reading.parse_lazy_import(filename)
        reading.strip_delete_keys(cfg_dict)
        cfg = Config(cfg_dict, filename=filename, format_python_code=format_python_code)
        object.__setattr__(cfg, "_imported_names", imported_names)
        return cfg

    @staticmethod
    def fromstring(cfg_str: str, file_format: str) -> Config:
        """Reads a config from its text, in the format ``file_format`` (``'.py'``, ...)."""
        reading.check_format(f"config text{file_format}")
        if file_format != ".py" and "dict(" in cfg_str:
            warnings.warn('Please check "file_format", the file format may be .py', stacklevel=2)
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", suffix=file_format, delete=False
        ) as temp_file:
            temp_file.write(cfg_str)
        try:
            return Config.fromfile(temp_file.name)
        finally:
            os.remove(temp_file.name)

    @staticmethod
    def auto_argparser(description: str | None = None) -> tuple[argparse.ArgumentParser, Config]:
        """A parser of ``CONFIG`` plus a ``--key`` option per value of the config named on
        the command line, and that config."""
        partial = argparse.ArgumentParser(description=description)
        partial.add_argument("config", help="config file path")
        cfg = Config.fromfile(partial.parse_known_args()[0].config)
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument("config", help="config file path")
        add_args(parser, cfg)
        return parser, cfg

    # mmengine's private helpers, for code written against them
    _file2dict = staticmethod(reading.file2dict)
    _merge_a_into_b = staticmethod(merge_a_into_b)
    _dict_to_config_dict = staticmethod(reading.dict_to_config_dict)
    _get_cfg_path = staticmethod(reading.get_cfg_path)
    _substitute_base_vars = staticmethod(reading.substitute_base_vars)
    _is_lazy_import = staticmethod(lazy_reading.is_lazy_import)

    @staticmethod
    def _validate_py_syntax(filename: str | os.PathLike) -> None:
        """Raises ``SyntaxError`` (naming the file and line) if a ``.py`` config is not Python."""
        compile(Path(filename).read_text(encoding="utf-8"), str(filename), "exec")

    @staticmethod
    def _substitute_predefined_vars(filename: str | os.PathLike, temp_config_name: str) -> None:
        text = Path(filename).read_text(encoding="utf-8")
        text = reading.substitute_predefined_vars(text, str(filename))
        Path(temp_config_name).write_text(text, encoding="utf-8")

    @staticmethod
    def _substitute_env_variables(filename: str | os.PathLike, temp_config_name: str) -> dict:
        text, used = reading.substitute_env_variables(Path(filename).read_text(encoding="utf-8"))
        Path(temp_config_name).write_text(text, encoding="utf-8")
        return used

    @staticmethod
    def _pre_substitute_base_vars(filename: str | os.PathLike, temp_config_name: str) -> dict:
        text, placeholders = reading.pre_substitute_base_vars(
            Path(filename).read_text(encoding="utf-8")
        )
        Path(temp_config_name).write_text(text, encoding="utf-8")
        return placeholders

    # ------------------------------------------------------------------ properties

    @property
    def filename(self) -> str | None:
        """The path of the file the config was read from, as given (``None`` if none)."""
        return self._filename

    @property
    def text(self) -> str:
        """The text the config was read from (each file's, for a config with bases)."""
        return self._text

    @property
    def env_variables(self) -> dict:
        """The environment variables the config's files used."""
        return self._env_variables

    @property
    def pretty_text(self) -> str:
        """The config as ``.py`` source, keys sorted (non-literal values by their ``repr``)."""
        return render(self.to_dict(), ".py", strict=False)

    def to_dict(self, keep_imported: bool = False) -> dict:
        """The config as plain nested dicts; lazy values as dotted paths; names a lazy config
        imported left out unless ``keep_imported``."""
        return self._without_imported(self._cfg_dict.to_dict(), keep_imported)

    def _to_lazy_dict(self, keep_imported: bool = False) -> dict:
        return self._without_imported(self._cfg_dict._to_lazy_dict(), keep_imported)

    def _without_imported(self, cfg: dict, keep_imported: bool) -> dict:
        if keep_imported:
            return cfg
        return {k: v for k, v in cfg.items() if k not in self._imported_names}

    # ------------------------------------------------------------------ writing

    def dump(self, file: str | os.PathLike | None = None) -> str | None:
        """Writes the config to ``file``, in the format its extension names.

        A ``.py`` dump loads back equal; it holds only Python literals (a class or function
        raises ``TypeError`` naming its key: write it as an import path string such as
        ``'torch.optim.AdamW'``, which the registries resolve; lazy values are written so). JSON
        turns tuples into lists. With no ``file``, returns the text in the format of
        :attr:`filename` (``.py`` if none).

        Example::

            cfg.dump(Path(cfg.work_dir) / 'config.py')
        """
        if file is None:
            if self._filename is None or self._filename.endswith(".py"):
                return self.pretty_text
            return render(self.to_dict(), os.path.splitext(self._filename)[1])
        text = render(self.to_dict(), os.path.splitext(str(file))[1])
        Path(file).write_text(text, encoding="utf-8")
        return None

    @staticmethod
    def diff(cfg1: str | Config, cfg2: str | Config) -> str:
        """A unified diff of two configs' ``pretty_text`` (each line followed by a newline,
        as mmengine prints it)."""
        texts = [
            (Config.fromfile(c) if isinstance(c, (str, os.PathLike)) else c).pretty_text
            for c in (cfg1, cfg2)
        ]
        lines = difflib.unified_diff(texts[0].split("\n"), texts[1].split("\n"))
        return "".join(line + "\n" for line in lines) + "\n"

    def merge_from_dict(self, options: Mapping[str, Any], allow_list_keys: bool = True) -> None:
        """Applies overrides keyed by dotted paths, as from ``--cfg-options``.

        A path's intermediate keys must exist (a typo raises ``KeyError`` naming the close
        keys; mmengine would create them); an intermediate ``None`` becomes a dict (so
        ``optim_wrapper.clip_grad.max_norm=1`` sets a ``clip_grad=None``). A digit indexes
        into a list (``'param_scheduler.0.end'``) when ``allow_list_keys``. A dict value is
        merged into the dict it replaces (``_delete_=True`` replaces it instead). Nothing
        changes if any path is bad.

        Example::

            >>> cfg = Config(dict(model=dict(depth=50), sched=[dict(end=10)]))
            >>> cfg.merge_from_dict({'model.depth': 101, 'sched.0.end': 20, 'model.pre': True})
            >>> cfg.to_dict()
            {'model': {'depth': 101, 'pre': True}, 'sched': [{'end': 20}]}
        """
        tree: dict = {}
        for dotted, value in options.items():
            *parents, last = str(dotted).split(".")
            node, existing = tree, self._cfg_dict
            for i, part in enumerate(parents):
                existing = _step(existing, part, dotted, parents[:i], allow_list_keys)
                node = node.setdefault(part, ConfigDict())
                if existing is None:
                    node["_delete_"] = True
            _step(existing, last, dotted, parents, allow_list_keys, last=True)
            node[last] = value
        merged = merge_a_into_b(tree, self._cfg_dict, allow_list_keys=allow_list_keys)
        reading.strip_delete_keys(merged)
        object.__setattr__(self, "_cfg_dict", merged)

    # ------------------------------------------------------------------ mapping protocol

    def __getattr__(self, name: str) -> Any:
        try:
            cfg_dict = object.__getattribute__(self, "_cfg_dict")
        except AttributeError:  # while unpickling, before __setstate__
            raise AttributeError(name) from None
        return getattr(cfg_dict, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in RESERVED_KEYS:
            raise AttributeError(f"{name!r} is a read-only Config attribute")
        if isinstance(value, dict):
            value = ConfigDict(value)
        self._cfg_dict[name] = value

    def __delattr__(self, name: str) -> None:
        delattr(self._cfg_dict, name)

    def __getitem__(self, key: str) -> Any:
        return self._cfg_dict[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key in RESERVED_KEYS:
            raise KeyError(f"{key} is reserved for config file")
        if isinstance(value, dict):
            value = ConfigDict(value)
        self._cfg_dict[key] = value

    def __delitem__(self, key: str) -> None:
        del self._cfg_dict[key]

    def __contains__(self, key: object) -> bool:
        return key in self._cfg_dict

    def __iter__(self) -> Iterator[str]:
        return iter(self._cfg_dict)

    def __len__(self) -> int:
        return len(self._cfg_dict)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (built if lazy), or ``default`` if absent."""
        return self._cfg_dict.get(key, default)

    def __repr__(self) -> str:
        return f"Config (path: {self.filename}): {self._cfg_dict.__repr__()}"

    # ------------------------------------------------------------------ copies, pickling

    def __copy__(self) -> Config:
        other = type(self).__new__(type(self))
        other.__dict__.update(self.__dict__)
        object.__setattr__(other, "_cfg_dict", self._cfg_dict.copy())
        return other

    copy = __copy__

    def __deepcopy__(self, memo: dict) -> Config:
        other = type(self).__new__(type(self))
        memo[id(self)] = other
        for key, value in self.__dict__.items():
            object.__setattr__(other, key, copy.deepcopy(value, memo))
        return other

    def __getstate__(self) -> tuple:
        return (
            self._cfg_dict,
            self._filename,
            self._text,
            self._env_variables,
            self._format_python_code,
            self._imported_names,
        )

    def __setstate__(self, state: tuple) -> None:
        names = (
            "_cfg_dict",
            "_filename",
            "_text",
            "_env_variables",
            "_format_python_code",
            "_imported_names",
        )
        for name, value in zip(names, state):
            object.__setattr__(self, name, value)


def _step(
    node: Any, key: str, dotted: str, before: list[str], allow_list_keys: bool, last: bool = False
) -> Any:
    """Checks that an override path can go from ``node`` through ``key``; returns the value
    there (``None`` for a new last key)."""
    where = repr(".".join(before)) if before else "the config"
    if isinstance(node, list):
        if not allow_list_keys:
            raise TypeError(
                f"cannot override {dotted!r}: {where} is a list; pass allow_list_keys=True to "
                "index into it"
            )
        if not (key.isdigit() and int(key) < len(node)):
            raise KeyError(
                f"cannot override {dotted!r}: {where} is a list of {len(node)} items, so "
                f"{key!r} must be an index from 0 to {len(node) - 1}"
            )
        return node[int(key)]
    if isinstance(node, dict):
        if key not in node and not last:
            raise KeyError(
                f"cannot override {dotted!r}: {key!r} is not a key of {where}; "
                + close_keys(key, node)
            )
        return dict.get(node, key)
    if node is None:
        return None  # an intermediate None becomes a dict
    raise TypeError(
        f"cannot override {dotted!r}: {where} holds {node!r} (of type {type(node).__name__}), "
        f"not a dict or list; override {where} itself"
    )
