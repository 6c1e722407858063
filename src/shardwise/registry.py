"""Registries: configuration as data (``dict(type=...)``) resolved to objects.

Example::

    >>> from shardwise.registry import OPTIMIZERS
    >>> import torch
    >>> opt = OPTIMIZERS.build(dict(type='SGD', lr=0.1),
    ...                        default_args=dict(params=[torch.zeros(1, requires_grad=True)]))
    >>> type(opt).__name__
    'SGD'

A ``type`` may be a class (or any callable), a name registered in the registry, or a dotted
import path such as ``'torch.optim.AdamW'``.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "Registry",
    "build_from_cfg",
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


class Registry:
    """A name → class (or function) table with a ``build`` method.

    Args:
        name: what the registry holds, used in error messages (``'optimizer'``).
        build_func: replaces :func:`build_from_cfg` for this registry.
        locations: modules imported the first time the registry is looked up, so that the
            classes they register are available without an explicit import.
    """

    def __init__(
        self,
        name: str,
        build_func: Callable[..., Any] | None = None,
        locations: Iterable[str] = (),
    ) -> None:
        self.name = name
        self._module_dict: dict[str, Any] = {}
        self._build_func = build_func or build_from_cfg
        self._locations = list(locations)
        self._imported = not self._locations

    def __repr__(self) -> str:
        return f"Registry(name={self.name!r}, items={sorted(self._module_dict)})"

    def __len__(self) -> int:
        self._import_locations()
        return len(self._module_dict)

    def __contains__(self, key: str) -> bool:
        self._import_locations()
        return key in self._module_dict

    @property
    def module_dict(self) -> dict[str, Any]:
        self._import_locations()
        return dict(self._module_dict)

    def _import_locations(self) -> None:
        if self._imported:
            return
        self._imported = True
        for location in self._locations:
            try:
                importlib.import_module(location)
            except ModuleNotFoundError as exc:
                if exc.name != location:  # a real missing dependency, not an absent location
                    raise

    def register_module(
        self, name: str | list[str] | None = None, force: bool = False, module: Any = None
    ) -> Any:
        """Register a class or function, as a decorator or by a direct call.

        ``@REG.register_module()``, ``@REG.register_module(name='Alias')``,
        ``REG.register_module(module=cls)``; ``force=True`` replaces an existing entry.
        """
        if not isinstance(force, bool):
            raise TypeError(f"force must be a bool, got {force!r}")
        if name is not None and not isinstance(name, str | list):
            raise TypeError(f"name must be None, a str or a list of str, got {name!r}")
        if module is not None:
            self._register(module, name, force)
            return module

        def decorator(obj: Any) -> Any:
            self._register(obj, name, force)
            return obj

        return decorator

    def _register(self, module: Any, name: str | list[str] | None, force: bool) -> None:
        if not callable(module):
            raise TypeError(f"only classes and functions can be registered, got {module!r}")
        names = [module.__name__] if name is None else [name] if isinstance(name, str) else name
        for key in names:
            existing = self._module_dict.get(key)
            if existing is not None and existing is not module and not force:
                raise KeyError(
                    f"{key!r} is already registered in the {self.name} registry "
                    f"(as {_qualname(existing)}); pass force=True to replace it"
                )
            self._module_dict[key] = module

    def get(self, key: str | type | Callable[..., Any]) -> Any:
        """Return the object for a registered name, a dotted import path, or the object itself.

        Raises:
            KeyError: the name is neither registered nor importable; the message lists the
                closest registered names.
        """
        if not isinstance(key, str):
            if callable(key):
                return key
            raise TypeError(f"type must be a str, a class or a function, got {key!r}")
        self._import_locations()
        if key in self._module_dict:
            return self._module_dict[key]
        if "." in key:
            imported = _import_dotted(key)
            if imported is not None:
                return imported
        close = difflib.get_close_matches(key, list(self._module_dict), n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise KeyError(
            f"{key!r} is not in the {self.name} registry and is not an importable dotted path"
            f"{hint} Register it with @{self.name.upper()}.register_module() or give its full "
            f"import path (e.g. 'package.module.ClassName')."
        )

    def build(self, cfg: Mapping[str, Any], default_args: Mapping[str, Any] | None = None) -> Any:
        """Build an object from ``cfg`` (a mapping with a ``type`` key)."""
        return self._build_func(cfg, self, default_args)


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _import_dotted(path: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return getattr(module, attr, None)


def build_from_cfg(
    cfg: Mapping[str, Any],
    registry: Registry,
    default_args: Mapping[str, Any] | None = None,
) -> Any:
    """Build ``cfg['type']`` from ``registry`` with the rest of ``cfg`` as keyword arguments.

    ``default_args`` fill in keywords that ``cfg`` does not set.
    """
    if not isinstance(cfg, Mapping):
        raise TypeError(f"cfg must be a dict, got {type(cfg).__name__}: {cfg!r}")
    if "type" not in cfg and (default_args is None or "type" not in default_args):
        raise KeyError(
            f"a config for the {registry.name} registry needs a 'type' key, got keys {sorted(cfg)}"
        )
    if default_args is not None and not isinstance(default_args, Mapping):
        raise TypeError(f"default_args must be a dict or None, got {default_args!r}")
    kwargs = dict(cfg)
    for key, value in (default_args or {}).items():
        kwargs.setdefault(key, value)
    obj_type = kwargs.pop("type")
    obj_cls = registry.get(obj_type)
    try:
        return obj_cls(**kwargs)
    except TypeError as exc:
        name = getattr(obj_cls, "__name__", repr(obj_cls))
        raise TypeError(f"building {name} from the {registry.name} registry: {exc}") from exc


def _register_torch_optimizers(registry: Registry) -> None:
    import torch.optim

    for name in dir(torch.optim):
        obj = getattr(torch.optim, name)
        if (
            inspect.isclass(obj)
            and issubclass(obj, torch.optim.Optimizer)
            and obj is not torch.optim.Optimizer
        ):
            registry.register_module(module=obj)


MODELS = Registry("model")
OPTIMIZERS = Registry("optimizer")
OPTIM_WRAPPERS = Registry("optim_wrapper", locations=["shardwise.optim"])
OPTIM_WRAPPER_CONSTRUCTORS = Registry("optim_wrapper_constructor", locations=["shardwise.optim"])
PARAM_SCHEDULERS = Registry("param_scheduler", locations=["shardwise.optim"])
STRATEGIES = Registry("strategy", locations=["shardwise.strategies"])
MODEL_WRAPPERS = Registry("model_wrapper", locations=["shardwise.strategies"])
FUNCTIONS = Registry("function")
HOOKS = Registry("hook", locations=["shardwise.runner"])
DATASETS = Registry("dataset")
LOOPS = Registry("loop", locations=["shardwise.runner"])
METRICS = Registry("metric", locations=["shardwise.runner"])

_register_torch_optimizers(OPTIMIZERS)
