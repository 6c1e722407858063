"""OpenMMLab projects through shardwise's registries: mmengine's registry tree behind them.

Every OpenMMLab package (mmpretrain, mmdet, ...) registers its models, datasets, transforms,
metrics, hooks, visualizers, loops and optimizer constructors in mmengine's registry tree:
``mmpretrain.registry.MODELS`` is a child of ``mmengine.registry.MODELS``, scope
``'mmpretrain'``. Each of shardwise's root registries that a run builds from names its
counterpart there (``Registry('model', fallback='MODELS')``), and a name is looked up, for a
config whose ``default_scope`` is ``'mmpretrain'``:

1. among the names ``mmpretrain`` registers itself (:func:`package_entry`: its ``Accuracy``
   and ``VisualizationHook``, as mmengine's Runner would build them);
2. among shardwise's own entries (its ``LoggerHook``, ``OptimWrapper``, ``LinearLR`` ...,
   which take the place of mmengine's own);
3. in mmengine's tree (:func:`lookup`): the scope's registry and its ancestors, and
   ``'scope.Name'`` names (``'mmpretrain.ImageClassifier'``) with or without a default scope.

Objects found in mmengine's tree build their parts through it (a classifier its backbone, a
dataset its transforms), so mmengine's own default scope is made the config's as well, as
mmengine's Runner makes it.

The Runner trains what these registries build as mmengine's Runner does; what that takes of
mmengine is here too: recognising mmengine's objects (:func:`from_mmengine`, by their classes,
without importing mmengine), mmengine's ``Evaluator`` over a package's metrics, its worker
seeding and collate functions for its datasets, its ``Config`` for its visualizers.

The module imports nothing of shardwise, and mmengine only inside the functions that need it:
:class:`shardwise.registry.Registry` calls it when a lookup needs it and mmengine is
installed, the runner when it holds mmengine's objects. A config that names no OpenMMLab
class never imports mmengine.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
import traceback
from functools import partial
from pathlib import Path
from typing import Any

__all__ = [
    "collate_function",
    "evaluator",
    "from_mmengine",
    "has_scope",
    "log_to",
    "lookup",
    "mmengine_config",
    "mmengine_registry",
    "package_entry",
    "pass_as_mmengine_loops",
    "restore_mmengine_instances",
    "saved_mmengine_instances",
    "worker_init_fn",
]

logger = logging.getLogger(__name__)

#: The scopes that are not a package's: shardwise's own, and mmengine's root (whose entries
#: shardwise's take the place of).
NOT_PACKAGES = ("shardwise", "mmengine")


def mmengine_registry(name: str) -> Any:
    """mmengine's root registry ``name`` (``'MODELS'``), or None: mmengine is not installed,
    or ``mmengine`` is shardwise itself (mmengine's own tests run against shardwise through
    a shim that maps the name)."""
    if importlib.util.find_spec("mmengine") is None:
        return None
    registries = importlib.import_module("mmengine.registry")
    registry = getattr(registries, name, None)
    if registry is None or type(registry).__module__.startswith("shardwise."):
        return None
    return registry


def _scope_registry(root: Any, scope: str) -> Any:
    """The registry of ``scope`` in the tree under ``root`` (its package's ``registry``
    module imported first, as mmengine does), or None."""
    if scope.isidentifier() and importlib.util.find_spec(scope) is not None:
        try:
            importlib.import_module(f"{scope}.registry")
        except ModuleNotFoundError as exc:
            if exc.name not in (scope, f"{scope}.registry"):
                raise ImportError(_import_failure(scope, exc)) from None
        except Exception as exc:  # noqa: BLE001 - a package that fails inside: one line
            raise ImportError(_import_failure(scope, exc)) from None
    pending = [root]
    while pending:
        registry = pending.pop()
        if registry.scope == scope:
            return registry
        pending.extend(registry.children.values())
    return None


def _import_failure(scope: str, error: BaseException) -> str:
    """One line on why the package of ``scope`` failed to import, and the fix."""
    if isinstance(error, ModuleNotFoundError) and error.name:
        missing = error.name.partition(".")[0]
        return (
            f"the package of scope {scope!r} failed to import: it needs {error.name!r}, which "
            f"is not installed; pip install {missing} (in a version that fits {scope})"
        )
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (in {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    detail = " ".join(str(error).split()) or "no message"
    return (
        f"the package of scope {scope!r} failed to import with {type(error).__name__}: "
        f"{detail}{where}; the packages it imports do not fit each other or this torch (e.g. "
        "a torchvision built for another torch): reinstall them in versions built for this "
        "torch (the README's 'Training an OpenMMLab project')"
    )


def has_scope(fallback: str, scope: str) -> bool:
    """Whether mmengine's tree of registry ``fallback`` has a registry of ``scope``."""
    root = mmengine_registry(fallback)
    return root is not None and _scope_registry(root, scope) is not None


def package_entry(fallback: str, scope: str, key: str) -> Any:
    """What the package of ``scope`` registers itself as ``key`` in its registry of kind
    ``fallback`` (not what it inherits from mmengine's root), or None."""
    root = mmengine_registry(fallback)
    if root is None or scope in NOT_PACKAGES:
        return None
    registry = _scope_registry(root, scope)
    if registry is None:
        return None
    try:
        registry.import_from_location()
    except Exception as exc:  # noqa: BLE001 - a package's module that fails inside: one line
        raise ImportError(_import_failure(scope, exc)) from None
    found = registry.module_dict.get(key)
    if found is not None:
        _use_scope_in_mmengine(scope)
    return found


def lookup(fallback: str, key: str, scope: str | None) -> Any:
    """``key`` looked up in mmengine's tree of registry ``fallback``: in the registry of
    ``scope`` and its ancestors (the root without a scope), or, for ``'scope.Name'``, in
    that scope's registry. None when nothing is found (a dotted path that is no scope's
    name, ``'torch.float32'``, is left to shardwise's own import rule)."""
    root = mmengine_registry(fallback)
    if root is None:
        return None
    prefix, dot, _ = key.partition(".")
    if dot and _scope_registry(root, prefix) is None:
        return None
    registry = root
    if scope is not None and scope not in NOT_PACKAGES:
        registry = _scope_registry(root, scope) or root
    try:
        found = registry.get(key)
    except RuntimeError:  # mmengine's get: "Failed to get <key>" from its import fallback
        return None
    if not (inspect.isclass(found) or inspect.isroutine(found) or isinstance(found, partial)):
        return None  # nothing, or what mmengine's import fallback found (a module...)
    if registry is not root:
        _use_scope_in_mmengine(scope)
    return found


def _use_scope_in_mmengine(scope: str) -> None:
    """Make ``scope`` mmengine's default scope, as mmengine's Runner does for its config's
    ``default_scope``: the objects built from the package's registries build their parts
    (backbones, transforms, ...) in it."""
    from mmengine.registry import DefaultScope, init_default_scope

    current = DefaultScope.get_current_instance()
    if current is None or current.scope_name != scope:
        logger.debug("mmengine's default scope: %r", scope)
        init_default_scope(scope)


# --------------------------------------------------------------------------- the runner's part


def from_mmengine(obj: Any) -> bool:
    """Whether ``obj`` (or the class ``obj``) derives from a class of mmengine's (a dataset,
    model, metric, hook, visualizer of an OpenMMLab package); mmengine is not imported."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(base.__module__.partition(".")[0] == "mmengine" for base in cls.__mro__)


def pass_as_mmengine_loops(loops: list[type]) -> None:
    """Make each class of ``loops`` (shardwise's ``EpochBasedTrainLoop``...) pass the checks
    package hooks make on ``runner.train_loop`` (mmpretrain's ``PreciseBNHook`` and
    ``VisualizationHook``: ``isinstance(loop, mmengine.runner.EpochBasedTrainLoop)``): a virtual
    subclass (``ABCMeta.register``) of mmengine's class of the same name, where there is one.
    Nothing when mmengine has not been imported (no package hook can test it then)."""
    if "mmengine" not in sys.modules:
        return
    import mmengine.runner

    for cls in loops:
        theirs = getattr(mmengine.runner, cls.__name__, None)
        if isinstance(theirs, type) and hasattr(theirs, "register") and not issubclass(cls, theirs):
            theirs.register(cls)


def evaluator(metrics: list[Any]) -> Any:
    """mmengine's ``Evaluator`` over built metrics (an OpenMMLab package's metrics, mmengine's
    ``BaseMetric``: it hands them the data samples as dicts, as they expect)."""
    from mmengine.evaluator import Evaluator

    return Evaluator(metrics)


def collate_function(name: str, scope: str | None) -> Any:
    """The collate function mmengine's Runner would use for ``collate_fn=dict(type=name)``:
    mmengine's ``FUNCTIONS`` (its ``default_collate`` keeps data samples, which torch's cannot
    batch), or None."""
    return lookup("FUNCTIONS", name, scope)


def worker_init_fn(*, num_workers: int, rank: int, seed: int) -> Any:
    """mmengine's worker seeding (``num_workers * rank + worker_id + seed`` for ``random``,
    NumPy and torch), as its Runner gives every dataloader of a seeded run."""
    from mmengine.dataset import worker_init_fn as seed_worker

    return partial(seed_worker, num_workers=num_workers, rank=rank, seed=seed)


def mmengine_config(cfg: Any) -> Any:
    """``cfg`` (shardwise's ``Config``) as mmengine's ``Config``, which mmengine's visualizers
    and their backends record (``add_config``)."""
    from mmengine.config import Config

    return Config(cfg.to_dict(), filename=cfg.filename)


def log_to(log_file: str, log_level: str | int = "INFO") -> None:
    """mmengine's own messages (an OpenMMLab model's ``init_weights`` report of every
    parameter, its warnings) into the run's log file, as under mmengine's Runner: its
    current ``MMLogger`` writes there (rank 0) and on the console (warnings and above).
    Nothing when mmengine has not been imported."""
    if "mmengine" not in sys.modules:
        return
    from mmengine.logging import MMLogger

    name = f"shardwise:{log_file}"
    if not MMLogger.check_instance_created(name):
        logger = MMLogger.get_instance(name, log_file=log_file, log_level=log_level, file_mode="a")
        for handler in logger.handlers:
            if not isinstance(handler, logging.FileHandler):
                handler.setLevel(logging.WARNING)
    MMLogger.get_instance(name)  # the current instance


# --------------------------------------------------------------------------- mmengine's globals


def _managed_classes() -> list[type]:
    """mmengine's classes that keep instances by name (``ManagerMixin``: ``DefaultScope``,
    ``MMLogger``, ``MessageHub``, ``Visualizer`` and a package's subclasses), each with its
    own ``_instance_dict``; none when mmengine has not been imported."""
    if "mmengine" not in sys.modules:
        return []
    try:
        from mmengine.utils import ManagerMixin
    except ImportError:
        return []
    found, pending = [], [ManagerMixin]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if "_instance_dict" in vars(cls):
            found.append(cls)
    return found


def saved_mmengine_instances() -> dict[type, dict[str, Any]]:
    """The instances mmengine keeps by name, per class, as they are now (its default scope,
    its loggers and the current one...), for :func:`restore_mmengine_instances`."""
    return {cls: dict(cls._instance_dict) for cls in _managed_classes()}


def restore_mmengine_instances(saved: dict[type, dict[str, Any]]) -> None:
    """Put back what :func:`saved_mmengine_instances` returned: a class it did not know yet
    (mmengine imported since) is left with no instances. The file handlers of a logger
    dropped are closed (reopened, appending, if the logger is put back later)."""
    for cls in _managed_classes():
        kept = saved.get(cls, {})
        for name, instance in list(cls._instance_dict.items()):
            if kept.get(name) is not instance and isinstance(instance, logging.Logger):
                close_file_handlers(instance, keep=())
        cls._instance_dict.clear()
        cls._instance_dict.update(kept)


def close_file_handlers(logger: logging.Logger, keep: Any) -> None:
    """Close the file handlers of ``logger`` not in ``keep``; one that is used again reopens
    its file, appending."""
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler) and handler not in keep:
            handler.close()
            handler.mode = "a"
