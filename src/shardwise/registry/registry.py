"""Registries: configuration as data (``dict(type=...)``) resolved to objects, as in mmengine.

Example::

    >>> from shardwise.registry import OPTIMIZERS
    >>> import torch
    >>> opt = OPTIMIZERS.build(dict(type='SGD', lr=0.1),
    ...                        default_args=dict(params=[torch.zeros(1, requires_grad=True)]))
    >>> type(opt).__name__
    'SGD'

A ``type`` may be a class (or any callable), a name registered in the registry, a name with a
scope prefix (``'mmdet.ResNet'``: looked up in the registry of that scope in the same tree), or
a dotted import path such as ``'torch.optim.AdamW'``. Registries form trees: a child
(``Registry('model', parent=MODELS, scope='myproj')``) finds its parent's names, and the
:class:`DefaultScope` (or a config's ``_scope_`` key) picks the registry a build resolves names
in.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import itertools
import logging
import sys
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from shardwise.config import Config

__all__ = [
    "Registry",
    "DefaultScope",
    "init_default_scope",
    "build_from_cfg",
    "build_model_from_cfg",
    "build_runner_from_cfg",
    "build_scheduler_from_cfg",
    "RUNNERS",
    "MODELS",
    "OPTIMIZERS",
    "OPTIM_WRAPPERS",
    "OPTIM_WRAPPER_CONSTRUCTORS",
    "PARAM_SCHEDULERS",
    "STRATEGIES",
    "MODEL_WRAPPERS",
    "FUNCTIONS",
    "HOOKS",
    "DATASETS",
    "LOOPS",
    "METRICS",
]

logger = logging.getLogger(__name__)

CfgType = Mapping[str, Any] | Config


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


def init_default_scope(scope: str) -> None:
    """Make ``scope`` the current default scope (an instance named ``scope`` if new)."""
    current = DefaultScope.get_current_instance()
    if current is None or not DefaultScope.check_instance_created(scope):
        DefaultScope.get_instance(scope, scope_name=scope)
    elif current.scope_name != scope:
        logger.warning("the default scope %r is replaced by %r", current.scope_name, scope)
        DefaultScope.get_instance(f"{scope}-{next(DefaultScope._overwrites)}", scope_name=scope)


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
        self._scope = scope if scope is not None else self.infer_scope()
        self.parent = parent
        if parent is not None:
            parent._add_child(self)
        parent_build = parent.build_func if parent is not None else build_from_cfg
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
        """
        if not isinstance(key, str):
            if callable(key):
                return key
            raise TypeError(f"the key of Registry.get must be a str, got {type(key)}: {key!r}")
        self.import_from_location()
        scope, real_key = self.split_scope_key(key)
        if scope is None or scope == self._scope:
            found = self._module_dict.get(real_key)
            if found is None and scope is None:
                found = self._get_in_ancestors(real_key)
        else:
            found = self._get_in_scope(scope, real_key, key)
        if found is None and "." in key:
            found = _import_object(key)
        return found

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
            f"registry, or give its full import path (e.g. 'package.module.ClassName')."
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


def _merged_args(
    cfg: CfgType, registry: Registry, default_args: CfgType | None, needs_type: bool = True
) -> dict[str, Any]:
    """``cfg`` as a dict, with the keys of ``default_args`` it lacks; checks the arguments."""
    if not isinstance(cfg, Mapping | Config):
        raise TypeError(
            f"cfg should be a dict, ConfigDict or Config, but got {type(cfg)}: {cfg!r}; give "
            f"a config such as dict(type='ResNet', depth=50)"
        )
    if not isinstance(registry, Registry):
        raise TypeError(
            f"registry must be a mmengine.Registry object, but got {type(registry)}: "
            f"{registry!r}; here that is shardwise.registry.Registry (shardwise's "
            "mmengine-compatible Registry): pass one such as shardwise.registry.MODELS"
        )
    if not (default_args is None or isinstance(default_args, Mapping | Config)):
        raise TypeError(
            f"default_args should be a dict, ConfigDict, Config or None, but got "
            f"{type(default_args)}: {default_args!r}"
        )
    args = dict(cfg.items())
    for key, value in (default_args or {}).items():
        args.setdefault(key, value)
    if needs_type and "type" not in args:
        raise KeyError(
            f'`cfg` or `default_args` must contain the key "type", but got keys {list(cfg)} '
            f"and {list(default_args or {})}; add type= naming a class of the {registry.name} "
            f"registry"
        )
    return args


def build_from_cfg(cfg: CfgType, registry: Registry, default_args: CfgType | None = None) -> Any:
    """Build ``cfg['type']`` from ``registry`` with the rest of ``cfg`` as keyword arguments.

    ``default_args`` fill in keywords that ``cfg`` does not set. A ``_scope_`` key builds in the
    registry of that scope. A class that keeps named global instances (mmengine's
    ``ManagerMixin``: ``get_instance``) is built with ``get_instance``, so that it can be found
    by name later.

    Example::

        >>> BACKBONES = Registry('backbone')
        >>> @BACKBONES.register_module()
        ... class ResNet:
        ...     def __init__(self, depth, stages=4):
        ...         self.depth, self.stages = depth, stages
        >>> build_from_cfg(dict(type='ResNet', depth=50), BACKBONES).depth
        50
    """
    args = _merged_args(cfg, registry, default_args)
    with registry.switch_scope_and_registry(args.pop("_scope_", None)) as scoped:
        obj_cls = scoped.resolve(args.pop("type"))
        try:
            if inspect.isclass(obj_cls) and _keeps_global_instances(obj_cls):
                return obj_cls.get_instance(**args)
            return obj_cls(**args)
        except TypeError as exc:
            name = getattr(obj_cls, "__name__", repr(obj_cls))
            raise TypeError(f"building {name} from the {scoped.name} registry: {exc}") from exc


def _keeps_global_instances(cls: type) -> bool:
    return isinstance(getattr(cls, "_instance_dict", None), dict) and callable(
        getattr(cls, "get_instance", None)
    )


def build_model_from_cfg(
    cfg: CfgType | Sequence[CfgType],
    registry: Registry,
    default_args: CfgType | None = None,
) -> torch.nn.Module:
    """:func:`build_from_cfg`, but a list of configs builds an ``nn.Sequential`` of them."""
    if isinstance(cfg, list):
        return torch.nn.Sequential(*(build_from_cfg(c, registry, default_args) for c in cfg))
    return build_from_cfg(cfg, registry, default_args)


def build_runner_from_cfg(cfg: CfgType, registry: Registry) -> Any:
    """Build a runner with ``from_cfg``: the class is ``cfg['runner_type']`` (default
    ``'Runner'``), looked up in ``registry``; ``cfg`` (``runner_type`` included) is its
    argument."""
    args = _merged_args(cfg, registry, None, needs_type=False)
    with registry.switch_scope_and_registry(args.pop("_scope_", None)) as scoped:
        runner_cls = scoped.resolve(args.get("runner_type", "Runner"))
        return runner_cls.from_cfg(args)


def build_scheduler_from_cfg(
    cfg: CfgType, registry: Registry, default_args: CfgType | None = None
) -> Any:
    """Build a parameter scheduler: :func:`build_from_cfg` that also honours
    ``convert_to_iter_based=True`` (an epoch-based config turned iteration-based, with
    ``epoch_length`` from ``cfg`` or ``default_args``).

    The work is :func:`shardwise.optim.scheduler.build_param_scheduler`'s, imported from the
    registry's location.
    """
    from shardwise.optim.scheduler.builder import build_param_scheduler

    return build_param_scheduler(_merged_args(cfg, registry, default_args), registry=registry)


RUNNERS = Registry("runner", build_func=build_runner_from_cfg, locations=["shardwise.runner"])
MODELS = Registry("model", build_func=build_model_from_cfg)
OPTIMIZERS = Registry("optimizer", locations=["shardwise.optim"])  # with torch.optim's
OPTIM_WRAPPERS = Registry("optim_wrapper", locations=["shardwise.optim"])
OPTIM_WRAPPER_CONSTRUCTORS = Registry("optim_wrapper_constructor", locations=["shardwise.optim"])
PARAM_SCHEDULERS = Registry(
    "param_scheduler", build_func=build_scheduler_from_cfg, locations=["shardwise.optim"]
)
STRATEGIES = Registry("strategy", locations=["shardwise.strategies"])
MODEL_WRAPPERS = Registry("model_wrapper", locations=["shardwise.strategies"])
FUNCTIONS = Registry("function")
HOOKS = Registry("hook", locations=["shardwise.runner"])
DATASETS = Registry("dataset")
LOOPS = Registry("loop", locations=["shardwise.runner"])
METRICS = Registry("metric", locations=["shardwise.runner"])

