"""Read checkpoints written by mmengine 0.10 without mmengine, and without running their pickles.

mmengine's ``Runner.save_checkpoint`` writes ``{'meta', 'state_dict', 'message_hub',
'optimizer', 'param_schedulers'}``. All of it is tensors and plain values except:

- ``message_hub`` (``MessageHub.state_dict()``) maps each logged scalar to a
  ``mmengine.logging.history_buffer.HistoryBuffer``, an object whose histories are numpy
  arrays (``max_length``, ``_log_history``, ``_count_history``) and whose
  ``statistics_methods`` pickle as ``builtins.getattr(HistoryBuffer, 'mean')`` (and ``'min'``,
  ``'max'``, ``'current'``);
- numpy values: runtime information such as a ``best_score`` that a metric computed with
  numpy, arrays in ``meta['dataset_meta']`` (mmpose keeps its keypoint ``sigmas`` there);
- checkpoints of early mmengine releases pickle the ``mmengine.logging.message_hub.MessageHub``
  itself (0.10's ``MessageHub.load_state_dict`` still accepts one);
- a OneCycle scheduler's state holds its ``anneal_func``, a static method, which pickles as
  ``builtins.getattr(OneCycleParamScheduler, '_annealing_cos')`` (or ``'_annealing_linear'``).

``torch.load(weights_only=True)`` refuses all of these. :func:`mmengine_safe_globals`
allows exactly them while a load runs: numpy's array and scalar rebuilders, under numpy 1's
and numpy 2's module names, with the dtypes of bools, numbers and strings; under mmengine's
class names, this module's stand-ins :class:`HistoryBuffer` and :class:`MessageHub`, which
only take the attributes the file gives them, and :class:`OneCycleParamScheduler`, which
is never built; and, under ``builtins.getattr``, :func:`mmengine_getattr`, which accepts
exactly the calls above (:data:`GETATTR_NAMES`) and returns the attribute's full name, a
string. No mmengine code runs, installed or not, and every other global, or ``getattr`` on
anything else, is refused.
:func:`mmengine_to_plain` then replaces the stand-ins by plain data: a HistoryBuffer by
``{'values', 'counts', 'max_length'}`` (the shape of
:meth:`shardwise.runner.HistoryBuffer.state_dict`), a MessageHub by its ``state_dict()``
shape. ``load_full_checkpoint`` does both on every read.

mmengine writes the optimizer's state as ``Optimizer.state_dict()`` does, keyed by the
parameters' positions; :func:`optimizer_state_by_name` keys it by parameter name, as
shardwise's strategies load it.

Example::

    with mmengine_safe_globals():
        checkpoint = torch.load('epoch_12.pth', map_location='cpu', weights_only=True)
    checkpoint = mmengine_to_plain(checkpoint)
    checkpoint['message_hub']['log_scalars']['train/loss']['values'][-1]   # 0.4127

Not covered: objects of other mmengine classes (a ``ConfigDict``), statistics a program
registered with
``HistoryBuffer.register_statistics`` (they pickle as the function's own global) and
numpy object or structured arrays; such a file is refused, naming the global.
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

__all__ = [
    "GETATTR_NAMES",
    "HistoryBuffer",
    "MessageHub",
    "OneCycleParamScheduler",
    "SAFE_GLOBALS",
    "mmengine_getattr",
    "mmengine_safe_globals",
    "mmengine_to_plain",
    "optimizer_state_by_name",
]


class _StandIn:
    """An object that holds the attributes unpickling gives it, and does nothing else."""

    mmengine_name = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:  # a REDUCE with arguments: mmengine's pickles never call the class
            raise pickle.UnpicklingError(
                f"the file calls {type(self).mmengine_name} with arguments; mmengine pickles "
                "only its attributes"
            )

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict) or not all(_is_attribute_name(k) for k in state):
            raise pickle.UnpicklingError(
                f"the state of {type(self).mmengine_name} must be a dict of attribute names, "
                f"got {_describe(state)}"
            )
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"<stand-in for {type(self).mmengine_name}: {sorted(vars(self))}>"


class HistoryBuffer(_StandIn):
    """Stands in for ``mmengine.logging.history_buffer.HistoryBuffer``: ``max_length``,
    ``_log_history`` and ``_count_history`` (numpy arrays)."""

    mmengine_name = "mmengine.logging.history_buffer.HistoryBuffer"


class MessageHub(_StandIn):
    """Stands in for ``mmengine.logging.message_hub.MessageHub``, pickled whole by early
    mmengine releases: ``_log_scalars``, ``_runtime_info``, ``_resumed_keys``..."""

    mmengine_name = "mmengine.logging.message_hub.MessageHub"


class OneCycleParamScheduler:
    """Stands in for ``mmengine.optim.scheduler.param_scheduler.OneCycleParamScheduler``,
    which a file names only to reach its annealing functions; never built."""

    mmengine_name = "mmengine.optim.scheduler.param_scheduler.OneCycleParamScheduler"

    def __new__(cls, *args: Any, **kwargs: Any) -> OneCycleParamScheduler:
        raise pickle.UnpicklingError(
            f"the file builds a {cls.mmengine_name}; mmengine's checkpoints only name its "
            "annealing functions"
        )


GETATTR_NAMES: dict[type, frozenset[str]] = {
    HistoryBuffer: frozenset({"current", "max", "mean", "min"}),
    OneCycleParamScheduler: frozenset({"_annealing_cos", "_annealing_linear"}),
}
"""The ``getattr(owner, name)`` calls mmengine 0.10's checkpoints hold: a HistoryBuffer's
statistic methods and a OneCycle scheduler's ``anneal_func``."""


def mmengine_getattr(owner: Any, name: Any) -> str:
    """Stands in for ``builtins.getattr`` in a file: a call of :data:`GETATTR_NAMES` gives the
    attribute's full name, e.g. ``getattr(HistoryBuffer, 'mean')`` the string
    ``'mmengine.logging.history_buffer.HistoryBuffer.mean'``; any other call is refused."""
    if isinstance(owner, type) and isinstance(name, str) and name in GETATTR_NAMES.get(owner, ()):
        return f"{owner.mmengine_name}.{name}"
    allowed = "; ".join(
        f"{cls.mmengine_name}: {', '.join(sorted(names))}" for cls, names in GETATTR_NAMES.items()
    )
    raise pickle.UnpicklingError(
        f"the file calls builtins.getattr({_global_name(owner)}, {name!r}); mmengine's "
        f"checkpoints call getattr only for {allowed}"
    )


def _global_name(obj: Any) -> str:
    if not isinstance(obj, type):
        return f"a {type(obj).__module__}.{type(obj).__qualname__} object"
    return getattr(obj, "mmengine_name", f"{obj.__module__}.{obj.__qualname__}")


def _is_attribute_name(key: Any) -> bool:
    return isinstance(key, str) and key.isidentifier() and not key.startswith("__")


def _describe(state: Any) -> str:
    if isinstance(state, dict):
        return "keys " + ", ".join(sorted(map(repr, state)))
    return type(state).__name__


def _numpy_globals() -> list[Any]:
    """numpy's array and scalar rebuilders under both module names (a checkpoint written
    with numpy 1 names ``numpy.core.multiarray``, one with numpy 2 ``numpy._core``), and the
    dtype classes of bools, numbers and strings (a ``BUILD`` on a dtype checks its class)."""
    try:
        multiarray = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # numpy 1, before the numpy._core rename
        multiarray = importlib.import_module("numpy.core.multiarray")
    named = [(np.ndarray, "numpy.ndarray"), (np.dtype, "numpy.dtype")]
    for package in ("numpy.core", "numpy._core"):
        named.append((multiarray._reconstruct, f"{package}.multiarray._reconstruct"))
        named.append((multiarray.scalar, f"{package}.multiarray.scalar"))
    dtype_classes = {type(np.dtype(code)) for code in "?bBhHiIlLqQefdFDUS"}
    return named + sorted(dtype_classes, key=lambda cls: cls.__name__)


SAFE_GLOBALS: tuple[Any, ...] = (
    *((cls, cls.mmengine_name) for cls in (HistoryBuffer, MessageHub, OneCycleParamScheduler)),
    (mmengine_getattr, "builtins.getattr"),
    *_numpy_globals(),
)
"""What :func:`mmengine_safe_globals` allows, as ``torch.serialization.safe_globals`` takes it."""


@contextmanager
def mmengine_safe_globals() -> Iterator[None]:
    """Let ``torch.load(weights_only=True)`` accept mmengine's and numpy's objects
    (:data:`SAFE_GLOBALS`) inside the block, and only there.

    Entries someone already allowed stay allowed after the block. torch keeps the allowlist
    process-wide, so a load in another thread during the block sees these entries too.
    """
    allowed = set(torch.serialization.get_safe_globals())
    with torch.serialization.safe_globals([g for g in SAFE_GLOBALS if g not in allowed]):
        yield


def mmengine_to_plain(tree: Any) -> Any:
    """``tree`` with every stand-in replaced by plain data (dicts and lists are changed in
    place, so an ``OrderedDict`` state dict keeps its ``_metadata``).

    Raises:
        ValueError: a stand-in's attributes are not of the types mmengine writes.
    """
    if isinstance(tree, torch.Tensor):
        return tree
    if isinstance(tree, HistoryBuffer):
        return _history_buffer_to_plain(vars(tree))
    if isinstance(tree, MessageHub):
        return _message_hub_to_plain(vars(tree))
    if isinstance(tree, dict):
        for key, value in list(tree.items()):
            plain = mmengine_to_plain(value)
            if plain is not value:
                tree[key] = plain
    elif isinstance(tree, list):
        tree[:] = [mmengine_to_plain(value) for value in tree]
    elif type(tree) is tuple:
        plain = tuple(mmengine_to_plain(value) for value in tree)
        if any(p is not v for p, v in zip(plain, tree)):
            return plain
    return tree


def _history_buffer_to_plain(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "values": _sequence(state, "_log_history", HistoryBuffer),
        "counts": _sequence(state, "_count_history", HistoryBuffer),
        "max_length": state.get("max_length"),
    }


def _message_hub_to_plain(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "log_scalars": mmengine_to_plain(_mapping(state, "_log_scalars")),
        "runtime_info": mmengine_to_plain(_mapping(state, "_runtime_info")),
        "resumed_keys": _mapping(state, "_resumed_keys"),
    }


def _sequence(state: dict[str, Any], name: str, kind: type[_StandIn]) -> list[Any]:
    value = state.get(name, [])
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list | tuple):
        return list(value)
    raise ValueError(f"{kind.mmengine_name}.{name} is a {type(value).__name__}, not an array")


def _mapping(state: dict[str, Any], name: str) -> dict[str, Any]:
    value = state.get(name, {})
    if not isinstance(value, dict):
        raise ValueError(
            f"{MessageHub.mmengine_name}.{name} is a {type(value).__name__}, not a dict"
        )
    return dict(value)


def optimizer_state_by_name(
    state: Mapping[str, Any], optimizer: torch.optim.Optimizer, model: torch.nn.Module
) -> dict[str, Any]:
    """``state`` keyed by parameter name, as shardwise's strategies load it.

    mmengine writes ``Optimizer.state_dict()``, which numbers the parameters in the order of
    the optimizer's ``param_groups``; the i-th number of a saved group is the i-th parameter
    of the same group of ``optimizer`` (built as the saving run built it), named as in
    ``model.named_parameters()``. A state keyed by name already is returned unchanged.

    Raises:
        ValueError: the saved groups differ in number or size from ``optimizer``'s.
    """
    saved_groups = state["param_groups"]
    if not any(isinstance(index, int) for group in saved_groups for index in group["params"]):
        return dict(state)
    names = {param: name for name, param in model.named_parameters()}
    live_groups = [[names[param] for param in group["params"]] for group in optimizer.param_groups]
    saved_sizes = [len(group["params"]) for group in saved_groups]
    if saved_sizes != [len(group) for group in live_groups]:
        raise ValueError(
            f"the optimizer state has parameter groups of sizes {saved_sizes}, the optimizer "
            f"{[len(group) for group in live_groups]}; build the optimizer (its paramwise_cfg "
            "and frozen parameters) as the run that saved the checkpoint did"
        )
    name_of = {
        index: name
        for group, live in zip(saved_groups, live_groups)
        for index, name in zip(group["params"], live)
    }
    return {
        **state,
        "state": {name_of[index]: value for index, value in state["state"].items()},
        "param_groups": [
            {**group, "params": live} for group, live in zip(saved_groups, live_groups)
        ],
    }
