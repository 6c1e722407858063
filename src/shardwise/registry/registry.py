"""The :class:`Registry` class: a name → class table with ``build``, in a tree of scopes."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import itertools
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from .default_scope import DefaultScope

__all__ = ["Registry"]

logger = logging.getLogger(__name__)


class Registry:
    """A name → class (or function) table with a ``build`` method, in a tree of scopes.

    Args:
        name: what the registry holds, used in error messages (``'optimizer'``).
        build_func: builds an object from a config, called as
            ``build_func(cfg, *args, **kwargs, registry=self)``; by default the parent's, or
            :func:`build_from_cfg` for a root registry.
        parent: the registry this one extends: names not found here are looked up there.
        scope: the key under which the parent (and prefixed names such as
            ``'myproj.Net'``) find this registry; by default the top-level package of the
            module that creates it.
        locations: modules imported the first time the registry is looked up, so that the
            classes they register are available without an explicit import.
        fallback: for a root registry, the registry of the same kind in mmengine's registry
            tree (its name in ``mmengine.registry``, e.g. ``'MODELS'``), where OpenMMLab
            packages register their classes: when mmengine is installed, a name the config's
            default scope (the package) registers itself is the package's, and a name found
            nowhere here is looked up there (see :mod:`shardwise.integrations.openmmlab`).

    Example::

        >>> MODELS = Registry('model')
        >>> DETECTORS = Registry('detector', parent=MODELS, scope='det')
        >>> @DETECTORS.register_module()
        ... class FasterRCNN:
        ...     pass
        >>> MODELS.get('det.FasterRCNN') is FasterRCNN
        True
    """

    def __init__(
        self,
        name: str,
        build_func: Callable[..., Any] | None = None,
        parent: Registry | None = None,
        scope: str | None = None,
        locations: Iterable[str] = (),
        fallback: str | None = None,
    ) -> None:
        if parent is not None and not isinstance(parent, Registry):
            raise TypeError(
                f"parent must be a Registry or None, got {parent!r}; pass the registry object "
                f"itself, e.g. parent=MODELS"
            )
        if scope is not None and not isinstance(scope, str):
            raise TypeError(f"scope must be a str or None, got {scope!r}")
        self._name = name
        self._module_dict: dict[str, Any] = {}
        self._children: dict[str, Registry] = {}
        self._locations = list(locations)
        self._imported = not self._locations
        self._fallback = fallback
        self._scope = scope if scope is not None else self.infer_scope()
        self.parent = parent
        if parent is not None:
            parent._add_child(self)
        if parent is not None:
            parent_build = parent.build_func
        else:  # imported here: build_functions imports this module (as in mmengine)
            from .build_functions import build_from_cfg as parent_build
        self.build_func: Callable[..., Any] = build_func or parent_build

    @staticmethod
    def infer_scope() -> str:
        """The top-level package of the module that called ``Registry(...)``."""
        caller = sys._getframe(2)  # 0: here, 1: Registry.__init__, 2: its caller
        return caller.f_globals.get("__name__", "__main__").split(".")[0]

    @staticmethod
    def split_scope_key(key: str) -> tuple[str | None, str]:
        """``'mmdet.ResNet'`` → ``('mmdet', 'ResNet')``; ``'ResNet'`` → ``(None, 'ResNet')``."""
        scope, dot, rest = key.partition(".")
        return (scope, rest) if dot else (None, key)

    @property
    def name(self) -> str:
        return self._name

    @property
    def scope(self) -> str:
        return self._scope

    @property
    def children(self) -> dict[str, Registry]:
        return self._children

    @property
    def root(self) -> Registry:
        return self._get_root_registry()

    @property
    def module_dict(self) -> dict[str, Any]:
        self.import_from_location()
        return self._module_dict

    def __len__(self) -> int:
        self.import_from_location()
        return len(self._module_dict)

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def __repr__(self) -> str:
        rows = [f"  {key}: {_qualname(obj)}" for key, obj in sorted(self.module_dict.items())]
        return "\n".join([f"Registry of {self.name} (scope {self.scope!r}):", *rows])

    def _get_root_registry(self) -> Registry:
        *_, root = self._lineage()
        return root

    def _lineage(self) -> Iterator[Registry]:
        """This registry, its parent, ... up to the root."""
        registry: Registry | None = self
        while registry is not None:
            yield registry
            registry = registry.parent

    def _add_child(self, registry: Registry) -> None:
        if registry.scope in self._children:
            raise ValueError(
                f"scope {registry.scope!r} exists in the {self.name} registry already; give "
                f"the new {registry.name!r} registry another scope= "
            )
        self._children[registry.scope] = registry

    def _search_child(self, scope: str) -> Registry | None:
        """The registry of ``scope`` in this subtree (depth first), or None."""
        if self._scope == scope:
            return self
        for child in self._children.values():
            found = child._search_child(scope)
            if found is not None:
                return found
        return None

    def import_from_location(self) -> None:
        """Import the modules in ``locations`` (once), so that they register their classes."""
        if self._imported:
            return
        self._imported = True
        for location in self._locations:
            _import_if_present(location)

    @contextmanager
    def switch_scope_and_registry(self, scope: str | None) -> Iterator[Registry]:
        """Make ``scope`` the default scope inside the block and yield its registry.

        The registry is the one of the current default scope in this registry's tree (for
        ``scope=None``: the scope already current); this registry when there is no default
        scope or the tree has no registry of that scope.
        """
        with DefaultScope.overwrite_default_scope(scope):
            current = DefaultScope.get_current_instance()
            yield self if current is None else self._registry_of_scope(current.scope_name)

    def _registry_of_scope(self, scope: str) -> Registry:
        root = self._get_root_registry()
        found = root._search_child(scope)
        if found is None:
            _import_scope_registry(scope)
            found = root._search_child(scope)
        if found is None and _mmengine_has_scope(root, scope):
            return self  # its names are looked up in mmengine's tree (see get)
        if found is None:
            logger.warning(
                "no registry of scope %r in the %r registry tree; the %r registry of scope %r "
                "builds instead. Check the scope name, or import the package that creates "
                "that registry",
                scope,
                root.name,
                self.name,
                self.scope,
            )
            return self
        return found

    def get(self, key: str | Callable[..., Any]) -> Any:
        """The object registered as ``key``, or None if there is none.

        ``'Name'`` is looked up here, then in the parent and the ancestors;
        ``'scope.Name'`` in the registry of that scope (a child here, or any registry of the
        tree); failing that, a dotted ``key`` is imported (``'torch.optim.AdamW'``). A class
        or function is returned as it is.

        Under a root with a ``fallback`` and with mmengine installed, an OpenMMLab package's
        classes are found too: a ``'Name'`` that the current default scope's package
        registers itself is that package's (looked up first, as mmengine would), and a key
        found nowhere else is looked up in mmengine's tree.
        """
        if not isinstance(key, str):
            if callable(key):
                return key
            raise TypeError(f"the key of Registry.get must be a str, got {type(key)}: {key!r}")
        self.import_from_location()
        scope, real_key = self.split_scope_key(key)
        found = self._get_in_package(real_key) if scope is None else None
        if found is not None:
            return found
        if scope is None or scope == self._scope:
            found = self._module_dict.get(real_key)
            if found is None and scope is None:
                found = self._get_in_ancestors(real_key)
        else:
            found = self._get_in_scope(scope, real_key, key)
        if found is None and "." in key:
            found = _import_object(key)
        if found is None:
            found = self._get_in_mmengine(key)
        return found

    def _get_in_package(self, key: str) -> Any:
        """What the default scope's OpenMMLab package registers itself as ``key`` (in
        mmengine's tree), or None (no such scope, or one of shardwise's tree)."""
        root = self._get_root_registry()
        scope = _default_scope_name()
        if root._fallback is None or scope is None or scope == root._scope:
            return None
        if root._search_child(scope) is not None or not _mmengine_installed():
            return None
        return _openmmlab().package_entry(root._fallback, scope, key)

    def _get_in_mmengine(self, key: str) -> Any:
        """``key`` looked up in mmengine's tree under the default scope, or None."""
        root = self._get_root_registry()
        if root._fallback is None or not _mmengine_installed():
            return None
        return _openmmlab().lookup(root._fallback, key, _default_scope_name())

    def _get_in_ancestors(self, key: str) -> Any:
        for registry in itertools.islice(self._lineage(), 1, None):
            registry.import_from_location()
            if key in registry._module_dict:
                return registry._module_dict[key]
        return None

    def _get_in_scope(self, scope: str, real_key: str, key: str) -> Any:
        if scope not in self._children:
            _import_scope_registry(scope)
        if scope in self._children:
            return self._children[scope].get(real_key)
        root = self._get_root_registry()
        if scope == root._scope or scope in root._children:
            return root.get(key)
        return None

    def resolve(self, obj_type: str | Callable[..., Any]) -> Any:
        """The class or function a config's ``type`` names: like :meth:`get`, but a name
        that resolves to nothing is a ``KeyError`` listing the closest registered names."""
        if not isinstance(obj_type, str):
            if callable(obj_type):
                return obj_type
            raise TypeError(
                f"type must be a str or valid type, but got {type(obj_type)}: {obj_type!r}; "
                f"give a registered name, a dotted import path or a class"
            )
        found = self.get(obj_type)
        if found is None:
            raise KeyError(self._not_found(obj_type))
        return found

    def _not_found(self, key: str) -> str:
        names = [name for reg in self._lineage() for name in reg._module_dict]
        close = difflib.get_close_matches(key, names, n=5, cutoff=0.5)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        return (
            f"{key} is not in the {self.scope}::{self.name} registry{hint}. Check the spelling "
            f"of {key!r}, register the class with register_module() of the {self.name} "
            f"registry, or give its full import path (e.g. 'package.module.ClassName')"
            + self._openmmlab_hint(key, close_matches=bool(close))
            + "."
        )

    def _openmmlab_hint(self, key: str, close_matches: bool) -> str:
        """Where an OpenMMLab package's class would have been found (for the error); without
        mmengine, only for a name with no close match here."""
        root = self._get_root_registry()
        if root._fallback is None or "." in key:
            return ""
        scope = _default_scope_name()
        if scope is not None and scope != root._scope and _mmengine_installed():
            if scope.isidentifier() and importlib.util.find_spec(scope) is None:
                return f"; the default scope's package {scope!r} is not installed"
            return f" (nor in mmengine's registry tree under the default scope {scope!r})"
        if scope is not None:
            return ""
        if not _mmengine_installed():
            return "" if close_matches else "; an OpenMMLab package's class needs mmengine"
        return (
            "; an OpenMMLab package's class needs the package's scope: set the config's "
            f"default_scope (e.g. default_scope='mmpretrain') or write 'mmpretrain.{key}'"
        )

    def build(self, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        """Build an object from ``cfg`` with :attr:`build_func` (by default
        :func:`build_from_cfg`: ``cfg['type']`` called with the other keys and
        ``default_args=`` filling in the keys ``cfg`` lacks)."""
        return self.build_func(cfg, *args, **kwargs, registry=self)

    def register_module(
        self,
        name: str | Sequence[str] | None = None,
        force: bool = False,
        module: Any = None,
    ) -> Any:
        """Register a class or function, as a decorator or by a direct call.

        ``@REG.register_module()``, ``@REG.register_module(name='Alias')`` (or a list of
        names), ``REG.register_module(module=cls)``; ``force=True`` replaces an existing entry.
        """
        if not isinstance(force, bool):
            raise TypeError(f"force must be a boolean, but got {type(force)}: {force!r}")
        if not (name is None or isinstance(name, str) or _is_seq_of_str(name)):
            raise TypeError(
                f"name must be None, an instance of str, or a sequence of str, but got "
                f"{type(name)}: {name!r}"
            )
        if module is not None:
            self._register_module(module, name, force)
            return module

        def decorator(obj: Any) -> Any:
            self._register_module(obj, name, force)
            return obj

        return decorator

    def _register_module(self, module: Any, name: str | Sequence[str] | None, force: bool) -> None:
        if not callable(module):
            raise TypeError(
                f"module must be Callable, but got {type(module)}: {module!r}; register a "
                f"class or a function"
            )
        names = [module.__name__] if name is None else [name] if isinstance(name, str) else name
        for key in names:
            existing = self._module_dict.get(key)
            if existing is not None and existing is not module and not force:
                raise KeyError(
                    f"{key} is already registered in {self.name} at "
                    f"{getattr(existing, '__module__', '?')} (as {_qualname(existing)}); pass "
                    f"force=True to replace it"
                )
            self._module_dict[key] = module


def _is_seq_of_str(value: Any) -> bool:
    return isinstance(value, Sequence) and all(isinstance(item, str) for item in value)


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _import_if_present(module_name: str) -> Any:
    """The module, or None if it (or a package above it) does not exist; an import error
    from inside an existing module propagates."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            return None
        raise


def _default_scope_name() -> str | None:
    current = DefaultScope.get_current_instance()
    return None if current is None else current.scope_name


def _mmengine_installed() -> bool:
    return importlib.util.find_spec("mmengine") is not None


def _openmmlab() -> Any:
    """The bridge to mmengine's registry tree (imported when a lookup needs it)."""
    from shardwise.integrations import openmmlab

    return openmmlab


def _mmengine_has_scope(root: Registry, scope: str) -> bool:
    """Whether ``scope`` is an OpenMMLab package's (in mmengine's tree of ``root``'s kind;
    of models for a root without a ``fallback``)."""
    if not _mmengine_installed():
        return False
    return _openmmlab().has_scope(root._fallback or "MODELS", scope)


def _import_scope_registry(scope: str) -> None:
    """Import ``<scope>.registry`` if there is one: a package's registries join the tree."""
    if scope.isidentifier():
        _import_if_present(f"{scope}.registry")


def _import_object(path: str) -> Any:
    """The class, function or module a dotted path names, or None.

    As in mmengine, an attribute wins over a submodule of the same name (``mmcv.ops.nms``).
    """
    parts = path.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    obj = _import_if_present(parts[0])
    for depth, part in enumerate(parts[1:], start=2):
        if obj is None:
            return None
        found = getattr(obj, part, None)
        if found is None and inspect.ismodule(obj):
            found = _import_if_present(".".join(parts[:depth]))
        obj = found
    is_named = inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)
    return obj if is_named or isinstance(obj, partial) else None
