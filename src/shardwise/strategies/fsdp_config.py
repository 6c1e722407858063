"""FSDPStrategy's configuration: mmengine/FSDP1 vocabulary in, FSDP2 settings out.

Every user-facing config of :class:`~shardwise.strategies.FSDPStrategy` is normalised here, once,
at the boundary, into small frozen dataclasses that the sharding code works on:

- ``model_wrapper`` → :class:`FSDPConfig` (:func:`parse_model_wrapper`);
- ``state_dict_cfg`` → :class:`StateDictSettings` (:func:`parse_state_dict_cfg`);
- ``activation_checkpointing`` → :class:`ActivationCheckpointing`
  (:func:`parse_activation_checkpointing`).

Bad values raise ``TypeError`` (wrong kind of value) or ``ValueError`` (right kind, unknown
value) naming the value, what is accepted and, where there is one, the fix.

Example::

    >>> cfg = parse_model_wrapper(dict(sharding_strategy='SHARD_GRAD_OP',
    ...                                mixed_precision=dict(param_dtype='bf16')))
    >>> cfg.reshard_after_forward, cfg.mp_policy.param_dtype
    (False, torch.bfloat16)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FullStateDictConfig,
    LocalStateDictConfig,
    MixedPrecisionPolicy,
    OffloadPolicy,
    ShardedStateDictConfig,
    StateDictType,
)
from torch.distributed.fsdp.fully_sharded_data_parallel import (
    FullOptimStateDictConfig,
    LocalOptimStateDictConfig,
    OptimStateDictConfig,
    ShardedOptimStateDictConfig,
    StateDictConfig,
)

from shardwise.checkpoint.formats import FORMATS, FULL, LOCAL, SHARDED, CheckpointFormat
from shardwise.dtypes import parse_dtype
from shardwise.registry import FUNCTIONS

__all__ = [
    "DEFAULT_SHARDER_NAMES",
    "FSDP1_ONLY_KEYS",
    "SHARDING_STRATEGIES",
    "ActivationCheckpointing",
    "FSDPConfig",
    "StateDictSettings",
    "ModuleSelector",
    "WrapPolicy",
    "parse_activation_checkpointing",
    "parse_model_wrapper",
    "parse_state_dict_cfg",
    "parse_module_selector",
    "parse_wrap_policy",
]

#: FSDP1's ``auto_wrap_policy`` signature: ``policy(module, recurse, nonwrapped_numel) -> bool``.
#: With ``recurse=True`` it says whether to look inside ``module``; with ``recurse=False``
#: whether ``module`` gets its own ``fully_shard``.
WrapPolicy = Callable[[nn.Module, bool, int], bool]

#: ``model_wrapper['type']`` values that select the default sharder (mmengine's names too).
DEFAULT_SHARDER_NAMES = frozenset(
    {"fully_shard_model", "MMFullyShardedDataParallel", "FullyShardedDataParallel"}
)

#: FSDP1 keys that FSDP2 needs no equivalent for: accepted, logged once, ignored.
FSDP1_ONLY_KEYS = {
    "use_orig_params": "FSDP2 always keeps the original parameters (as DTensors)",
    "limit_all_gathers": "FSDP2 limits in-flight all-gathers itself",
    "device_id": "FSDP2 places shards on the mesh's device",
    "sync_module_states": "the strategy starts every rank from rank 0's weights",
    "forward_prefetch": "FSDP2 prefetches implicitly",
    "backward_prefetch": "FSDP2 prefetches implicitly",
    "param_init_fn": "use skip_init_weights=True: shards are materialised and initialised",
    "process_group": "the strategy builds the device mesh",
    "auto_wrap_policy_kwargs": "give the keywords in auto_wrap_policy=dict(type=..., **kwargs)",
}

SHARDING_STRATEGIES = (
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "HYBRID_SHARD",
    "_HYBRID_SHARD_ZERO2",
    "NO_SHARD",
)


def _example(key: str) -> str:
    examples = {
        "sharding_strategy": "sharding_strategy='FULL_SHARD'",
        "mixed_precision": "mixed_precision=dict(param_dtype='bf16', reduce_dtype='fp32')",
        "cpu_offload": "cpu_offload=True or cpu_offload=dict(offload_params=True)",
        "auto_wrap_policy": "auto_wrap_policy={'TransformerBlock'} or "
        "auto_wrap_policy=dict(min_num_params=1e7)",
    }
    return examples.get(key, "")


# ---------------------------------------------------------------------------- module selectors
ModuleSelector = Callable[[nn.Module], bool]


def _classes_and_names(items: Iterable[Any], what: str) -> tuple[tuple[type, ...], frozenset[str]]:
    classes, names = [], []
    for item in items:
        if isinstance(item, type) and issubclass(item, nn.Module):
            classes.append(item)
        elif isinstance(item, str):
            names.append(item)
        else:
            raise TypeError(
                f"{what} holds {item!r}; a collection of module classes or class names is "
                "expected, e.g. {'TransformerBlock'} or {torch.nn.TransformerEncoderLayer}"
            )
    return tuple(classes), frozenset(names)


def _class_selector(classes: tuple[type, ...], names: frozenset[str]) -> ModuleSelector:
    def selects(module: nn.Module) -> bool:
        return isinstance(module, classes) or type(module).__name__ in names

    selects.module_classes = (classes, names)  # type: ignore[attr-defined]
    return selects


def parse_module_selector(value: Any, what: str) -> ModuleSelector:
    """Which modules a setting selects (``auto_wrap_policy``, ``activation_checkpointing``'s
    ``check_fn``), as a predicate ``(module) -> bool``.

    Accepted: a module class or class name, or a set/list/tuple of them (the predicate then
    has ``module_classes = (classes, names)``); the name of a function in ``FUNCTIONS`` (a
    string that names one is taken as that function, else as a class name); ``dict(type=...,
    **kwargs)``: a function in ``FUNCTIONS`` or a dotted path, bound to ``kwargs``; a callable.
    """
    if isinstance(value, str):
        found = FUNCTIONS.get(value)  # a registered name or a dotted path
        if callable(found) and not isinstance(found, type):
            return found
        if isinstance(found, type) and issubclass(found, nn.Module):
            value = found
    if isinstance(value, str) or (isinstance(value, type) and issubclass(value, nn.Module)):
        return _class_selector(*_classes_and_names([value], what))
    if isinstance(value, set | frozenset | list | tuple):
        return _class_selector(*_classes_and_names(value, what))
    if isinstance(value, Mapping) and "type" in value:
        cfg = dict(value)
        fn = FUNCTIONS.resolve(cfg.pop("type"))
        return functools.partial(fn, **cfg) if cfg else fn
    if callable(value):
        return value
    raise TypeError(
        f"{what} must be module classes or class names, a function (registered name, "
        f"dict(type=...) or a callable), got {type(value).__name__}: {value!r}"
    )


def _accepts_positional(fn: Callable[..., Any], count: int) -> bool:
    try:
        inspect.signature(fn).bind(*([None] * count))
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): assume it does
        return True
    return True


# ---------------------------------------------------------------------------- wrap policies
def _size_policy(min_num_params: int) -> WrapPolicy:
    def policy(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        return nonwrapped_numel >= min_num_params

    return policy


def _selector_policy(selects: ModuleSelector) -> WrapPolicy:
    def policy(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        return recurse or bool(selects(module))

    if hasattr(selects, "module_classes"):
        policy.module_classes = selects.module_classes  # type: ignore[attr-defined]
    return policy


def parse_wrap_policy(value: Any, what: str = "auto_wrap_policy") -> WrapPolicy | None:
    """Normalise an ``auto_wrap_policy`` to FSDP1's callable signature (:data:`WrapPolicy`).

    Accepted: None; whatever :func:`parse_module_selector` accepts; a callable with FSDP1's
    ``(module, recurse, nonwrapped_numel)`` signature; ``dict(min_num_params=N)``: every
    module holding at least ``N`` parameters not already sharded in a submodule.
    """
    if value is None:
        return None
    if isinstance(value, Mapping) and "type" not in value:
        if set(value) != {"min_num_params"}:
            raise ValueError(
                f"{what}={value!r}: a dict needs 'type' (a function in the FUNCTIONS "
                "registry or a dotted path, with its keyword arguments) or only "
                f"'min_num_params'; e.g. {_example('auto_wrap_policy')}"
            )
        threshold = value["min_num_params"]
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise TypeError(f"{what} min_num_params must be a number, got {threshold!r}")
        if threshold <= 0:
            raise ValueError(f"{what} min_num_params must be positive, got {threshold}")
        return _size_policy(int(threshold))
    try:
        selects = parse_module_selector(value, what)
    except TypeError as exc:
        raise TypeError(f"{exc}; or dict(min_num_params=N); e.g. {_example(what)}") from None
    if hasattr(selects, "module_classes") or not _accepts_positional(selects, 3):
        if not _accepts_positional(selects, 1):
            raise TypeError(
                f"{what} {selects!r} must take (module, recurse, nonwrapped_numel) as FSDP1's "
                "auto-wrap policies do, or (module) and return whether that module gets its "
                "own fully_shard"
            )
        return _selector_policy(selects)
    return selects  # FSDP1's (module, recurse, nonwrapped_numel)


# ---------------------------------------------------------------------------- model_wrapper
@dataclass(frozen=True)
class FSDPConfig:
    """What the default sharder does, in FSDP2 terms.

    Attributes:
        wrap_policy: which submodules get their own ``fully_shard`` (the root always does);
            None: the model's ``_no_split_modules`` if it declares them, else only the root.
        reshard_after_forward: free the gathered parameters after forward (ZeRO-3) or keep
            them until backward (ZeRO-2).
        mesh_kind: ``'shard'``: a 1-D mesh over every rank (FULL_SHARD, SHARD_GRAD_OP);
            ``'hybrid'``: a 2-D (replicate, shard) mesh (HYBRID_SHARD); ``'replicate'``: a
            (world, 1) mesh, every rank holds everything (NO_SHARD).
        replicate_size: size of the replicate dimension of a hybrid mesh; None: the number
            of nodes (shard within a node, replicate across nodes, as FSDP1 does).
        mp_policy, offload_policy: FSDP2's policies.
        buffer_dtype: floating-point buffers are cast to it once, before sharding.
        ignored_modules: modules whose parameters are left unsharded.
        ignored_fsdp1_keys: FSDP1-only keys that were given (and are ignored).
    """

    wrap_policy: WrapPolicy | None = None
    reshard_after_forward: bool | int = True
    mesh_kind: str = "shard"
    replicate_size: int | None = None
    mp_policy: MixedPrecisionPolicy = field(default_factory=MixedPrecisionPolicy)
    offload_policy: OffloadPolicy = field(default_factory=OffloadPolicy)
    buffer_dtype: torch.dtype | None = None
    ignored_modules: tuple[nn.Module, ...] = ()
    ignored_fsdp1_keys: tuple[str, ...] = ()


def _parse_sharding_strategy(value: Any) -> str:
    if value is None:
        return "FULL_SHARD"
    name = getattr(value, "name", value)  # FSDP1's ShardingStrategy enum
    if not isinstance(name, str):
        raise TypeError(
            f"sharding_strategy must be a name or torch's ShardingStrategy, got "
            f"{type(value).__name__}: {value!r}; e.g. {_example('sharding_strategy')}"
        )
    if name.upper() not in SHARDING_STRATEGIES:
        raise ValueError(
            f"sharding_strategy={value!r} is not one of {list(SHARDING_STRATEGIES)}; "
            f"e.g. {_example('sharding_strategy')}"
        )
    return name.upper()


_MP_KEYS = {"param_dtype", "reduce_dtype", "buffer_dtype", "output_dtype", "cast_forward_inputs"}
_MP_FSDP1_KEYS = {
    "keep_low_precision_grads",
    "cast_root_forward_inputs",
    "_module_classes_to_ignore",
}


def _parse_mixed_precision(
    value: Any,
) -> tuple[MixedPrecisionPolicy, torch.dtype | None, list[str]]:
    if value is None:
        return MixedPrecisionPolicy(), None, []
    if isinstance(value, MixedPrecisionPolicy):
        return value, None, []
    if dataclasses.is_dataclass(value) and hasattr(value, "param_dtype"):  # FSDP1 MixedPrecision
        value = {k: getattr(value, k) for k in ("param_dtype", "reduce_dtype", "buffer_dtype")}
    if isinstance(value, str | torch.dtype):
        value = dict(param_dtype=value)
    if not isinstance(value, Mapping):
        raise TypeError(
            f"mixed_precision must be a dict, a dtype, MixedPrecisionPolicy or FSDP1's "
            f"MixedPrecision, got {type(value).__name__}: {value!r}; "
            f"e.g. {_example('mixed_precision')}"
        )
    unknown = sorted(set(value) - _MP_KEYS - _MP_FSDP1_KEYS)
    if unknown:
        raise ValueError(
            f"mixed_precision has unknown keys {unknown}; accepted: {sorted(_MP_KEYS)}"
        )
    policy = MixedPrecisionPolicy(
        param_dtype=parse_dtype(value.get("param_dtype"), "mixed_precision.param_dtype"),
        reduce_dtype=parse_dtype(value.get("reduce_dtype"), "mixed_precision.reduce_dtype"),
        output_dtype=parse_dtype(value.get("output_dtype"), "mixed_precision.output_dtype"),
        cast_forward_inputs=bool(value.get("cast_forward_inputs", True)),
    )
    buffer_dtype = parse_dtype(value.get("buffer_dtype"), "mixed_precision.buffer_dtype")
    ignored = [f"mixed_precision.{k}" for k in sorted(set(value) & _MP_FSDP1_KEYS)]
    return policy, buffer_dtype, ignored


def _parse_cpu_offload(value: Any) -> OffloadPolicy:
    if value is None or value is False:
        return OffloadPolicy()
    if isinstance(value, OffloadPolicy):
        return value
    if value is True:
        return CPUOffloadPolicy()
    if hasattr(value, "offload_params") and not isinstance(value, Mapping):  # FSDP1 CPUOffload
        value = dict(offload_params=value.offload_params)
    if not isinstance(value, Mapping):
        raise TypeError(
            f"cpu_offload must be a bool, a dict or CPUOffloadPolicy, got "
            f"{type(value).__name__}: {value!r}; e.g. {_example('cpu_offload')}"
        )
    unknown = sorted(set(value) - {"offload_params", "pin_memory"})
    if unknown:
        raise ValueError(
            f"cpu_offload has unknown keys {unknown}; accepted: ['offload_params', 'pin_memory']"
        )
    if not value.get("offload_params", True):
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=bool(value.get("pin_memory", True)))


def _parse_replicate_size(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"replicate_size must be a positive int (how many replicas of each shard a "
            f"HYBRID_SHARD run keeps), got {value!r}"
        )
    return value


_MESH_KIND = {
    "FULL_SHARD": "shard",
    "SHARD_GRAD_OP": "shard",
    "HYBRID_SHARD": "hybrid",
    "_HYBRID_SHARD_ZERO2": "hybrid",
    "NO_SHARD": "replicate",
}
_NATIVE_KEYS = {
    "type",
    "auto_wrap_policy",
    "sharding_strategy",
    "mixed_precision",
    "cpu_offload",
    "replicate_size",
    "reshard_after_forward",
    "ignored_modules",
}


def parse_model_wrapper(cfg: Mapping[str, Any] | None) -> FSDPConfig:
    """Translate a ``model_wrapper`` config of the default sharder into an :class:`FSDPConfig`.

    Keys: ``auto_wrap_policy`` (see :func:`parse_wrap_policy`), ``sharding_strategy``
    (``FULL_SHARD``, ``SHARD_GRAD_OP``, ``HYBRID_SHARD``, ``_HYBRID_SHARD_ZERO2``, ``NO_SHARD``,
    as names or FSDP1's enum), ``replicate_size`` (HYBRID_SHARD), ``mixed_precision``,
    ``cpu_offload``, ``reshard_after_forward`` (overrides the strategy's choice),
    ``ignored_modules``, and FSDP1's keys that FSDP2 does not need (:data:`FSDP1_ONLY_KEYS`).
    """
    cfg = dict(cfg or {})
    unknown = sorted(set(cfg) - _NATIVE_KEYS - set(FSDP1_ONLY_KEYS))
    if unknown:
        raise ValueError(
            f"model_wrapper has unknown keys {unknown}; the default sharder accepts "
            f"{sorted(_NATIVE_KEYS | set(FSDP1_ONLY_KEYS))}. A custom sharder registered in "
            "MODEL_WRAPPERS (model_wrapper=dict(type='MySharder', ...)) receives any keys"
        )
    strategy = _parse_sharding_strategy(cfg.get("sharding_strategy"))
    replicate_size = _parse_replicate_size(cfg.get("replicate_size"))
    if replicate_size is not None and strategy not in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        raise ValueError(
            f"replicate_size={replicate_size} applies to HYBRID_SHARD only, but "
            f"sharding_strategy is {strategy!r}; set sharding_strategy='HYBRID_SHARD' or drop "
            "replicate_size"
        )
    reshard = strategy in ("FULL_SHARD", "HYBRID_SHARD")
    if "reshard_after_forward" in cfg:
        reshard = cfg["reshard_after_forward"]
        if not isinstance(reshard, bool | int):
            raise TypeError(f"reshard_after_forward must be a bool or an int, got {reshard!r}")
    mp_policy, buffer_dtype, ignored_mp_keys = _parse_mixed_precision(cfg.get("mixed_precision"))
    ignored = cfg.get("ignored_modules") or ()
    if isinstance(ignored, nn.Module) or not all(isinstance(m, nn.Module) for m in ignored):
        raise TypeError(f"ignored_modules must be a list of nn.Module instances, got {ignored!r}")
    return FSDPConfig(
        wrap_policy=parse_wrap_policy(cfg.get("auto_wrap_policy")),
        reshard_after_forward=reshard,
        mesh_kind=_MESH_KIND[strategy],
        replicate_size=replicate_size,
        mp_policy=mp_policy,
        offload_policy=_parse_cpu_offload(cfg.get("cpu_offload")),
        buffer_dtype=buffer_dtype,
        ignored_modules=tuple(ignored),
        ignored_fsdp1_keys=(*sorted(set(cfg) & set(FSDP1_ONLY_KEYS)), *ignored_mp_keys),
    )


# ---------------------------------------------------------------------------- state_dict_cfg
_FORMAT_OF_TYPE = {
    StateDictType.FULL_STATE_DICT: FULL,
    StateDictType.SHARDED_STATE_DICT: SHARDED,
    StateDictType.LOCAL_STATE_DICT: LOCAL,
}
_TYPE_OF_FORMAT = {v: k for k, v in _FORMAT_OF_TYPE.items()}
_ConfigClasses = tuple[type[StateDictConfig], type[OptimStateDictConfig]]
_CONFIG_CLASSES: dict[CheckpointFormat, _ConfigClasses] = {
    FULL: (FullStateDictConfig, FullOptimStateDictConfig),
    SHARDED: (ShardedStateDictConfig, ShardedOptimStateDictConfig),
    LOCAL: (LocalStateDictConfig, LocalOptimStateDictConfig),
}
_CONFIG_BY_NAME: dict[str, type] = {
    cls.__name__: cls for pair in _CONFIG_CLASSES.values() for cls in pair
}


@dataclass(frozen=True)
class StateDictSettings:
    """How checkpoints are written: ``format`` (:data:`~shardwise.checkpoint.formats.FULL`,
    ``SHARDED`` or ``LOCAL``) and
    mmengine's/FSDP1's view of the same choice (``state_dict_type`` and the two configs).

    For ``'full'``, ``state_dict_config.rank0_only`` gathers the full state onto rank 0 only
    (the others get an empty dict) and ``offload_to_cpu`` moves it to the CPU.
    """

    format: CheckpointFormat
    state_dict_type: StateDictType
    state_dict_config: StateDictConfig
    optim_state_dict_config: OptimStateDictConfig

    @property
    def rank0_only(self) -> bool:
        return bool(getattr(self.state_dict_config, "rank0_only", False))

    @property
    def offload_to_cpu(self) -> bool:
        return bool(getattr(self.state_dict_config, "offload_to_cpu", False))


def _settings_for(fmt: CheckpointFormat) -> StateDictSettings:
    model_cls, optim_cls = _CONFIG_CLASSES[fmt]
    kwargs = dict(offload_to_cpu=True, rank0_only=True) if fmt.gathered else {}
    return StateDictSettings(fmt, _TYPE_OF_FORMAT[fmt], model_cls(**kwargs), optim_cls(**kwargs))


def _parse_state_dict_type(value: Any) -> StateDictType:
    if isinstance(value, StateDictType):
        return value
    if isinstance(value, str):
        if value in StateDictType.__members__:
            return StateDictType[value]
        if value in FORMATS:
            return _TYPE_OF_FORMAT[FORMATS[value]]
        raise ValueError(
            f"state_dict_type={value!r} is not one of {list(StateDictType.__members__)} "
            f"(or {list(FORMATS)})"
        )
    raise TypeError(
        f"state_dict_type must be a str or torch's StateDictType, got "
        f"{type(value).__name__}: {value!r}; e.g. state_dict_type='FULL_STATE_DICT'"
    )


def _build_config(value: Any, base: type, what: str, fmt: CheckpointFormat, index: int) -> Any:
    expected = _CONFIG_CLASSES[fmt][index]
    if value is None:
        defaults = _settings_for(fmt)
        return defaults.state_dict_config if index == 0 else defaults.optim_state_dict_config
    if isinstance(value, Mapping):
        kwargs = dict(value)
        cls = kwargs.pop("type", expected)
        if isinstance(cls, str):
            if cls not in _CONFIG_BY_NAME:
                raise ValueError(f"{what} type {cls!r} is not one of {sorted(_CONFIG_BY_NAME)}")
            cls = _CONFIG_BY_NAME[cls]
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(f"{what} type must be a subclass of {base.__name__}, got {cls!r}")
        try:
            value = cls(**kwargs)
        except TypeError as exc:
            raise TypeError(f"{what}={dict(value)!r}: {exc}") from exc
    if not isinstance(value, base):
        raise TypeError(
            f"{what} must be a dict(type=..., ...) or a {base.__name__} such as "
            f"{expected.__name__}(), got {type(value).__name__}: {value!r}"
        )
    if not isinstance(value, expected):
        raise ValueError(
            f"{what} is a {type(value).__name__}, which does not fit state_dict_type "
            f"{_TYPE_OF_FORMAT[fmt].name}; use {expected.__name__}"
        )
    return value


def parse_state_dict_cfg(cfg: Any) -> StateDictSettings:
    """Normalise ``state_dict_cfg``: ``'sharded'``, ``'full'``, ``'local'``, or mmengine's
    ``dict(state_dict_type=..., state_dict_config=..., optim_state_dict_config=...)`` whose
    values may be enums/config objects, their names, or ``dict(type=..., **kwargs)``."""
    if isinstance(cfg, str):
        if cfg not in FORMATS:
            raise ValueError(
                f"state_dict_cfg={cfg!r} is not one of {list(FORMATS)}; or give "
                "mmengine's dict(state_dict_type='FULL_STATE_DICT', ...)"
            )
        return _settings_for(FORMATS[cfg])
    if not isinstance(cfg, Mapping):
        raise TypeError(
            f"state_dict_cfg must be a str ('sharded', 'full', 'local') or a dict, got "
            f"{type(cfg).__name__}: {cfg!r}"
        )
    unknown = sorted(set(cfg) - {"state_dict_type", "state_dict_config", "optim_state_dict_config"})
    if unknown:
        raise ValueError(
            f"state_dict_cfg has unknown keys {unknown}; accepted: state_dict_type, "
            "state_dict_config, optim_state_dict_config"
        )
    if "state_dict_type" in cfg:
        fmt = _FORMAT_OF_TYPE[_parse_state_dict_type(cfg["state_dict_type"])]
    else:  # infer it from the config object, else the default
        fmt = SHARDED
        given = cfg.get("state_dict_config")
        given_cls = given.get("type") if isinstance(given, Mapping) else type(given)
        given_cls = _CONFIG_BY_NAME.get(given_cls, given_cls)
        for candidate, (model_cls, _) in _CONFIG_CLASSES.items():
            if given_cls is model_cls:
                fmt = candidate
    return StateDictSettings(
        fmt,
        _TYPE_OF_FORMAT[fmt],
        _build_config(cfg.get("state_dict_config"), StateDictConfig, "state_dict_config", fmt, 0),
        _build_config(
            cfg.get("optim_state_dict_config"),
            OptimStateDictConfig,
            "optim_state_dict_config",
            fmt,
            1,
        ),
    )


# ---------------------------------------------------------------------------- checkpointing
@dataclass(frozen=True)
class ActivationCheckpointing:
    """Which modules recompute their activations in backward (``check_fn(module) -> bool``)
    and the keyword arguments of torch's ``checkpoint_wrapper``."""

    check_fn: Callable[[nn.Module], bool]
    wrapper_kwargs: Mapping[str, Any] = field(default_factory=dict)


def parse_activation_checkpointing(cfg: Any) -> ActivationCheckpointing | None:
    """Normalise ``activation_checkpointing=dict(check_fn=..., **wrapper_kwargs)``."""
    if cfg is None:
        return None
    if not isinstance(cfg, Mapping):
        raise TypeError(
            f"activation_checkpointing must be a dict such as "
            f"dict(check_fn={{'TransformerBlock'}}), got {type(cfg).__name__}: {cfg!r}"
        )
    kwargs = dict(cfg)
    if "check_fn" not in kwargs:
        raise ValueError(
            f"activation_checkpointing={cfg!r} needs check_fn, which selects the modules to "
            "checkpoint; e.g. activation_checkpointing=dict(check_fn={'TransformerBlock'})"
        )
    check_fn = parse_module_selector(kwargs.pop("check_fn"), "activation_checkpointing check_fn")
    impl = kwargs.get("checkpoint_impl")
    if isinstance(impl, str):
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl

        names = {"reentrant": CheckpointImpl.REENTRANT, "no_reentrant": CheckpointImpl.NO_REENTRANT}
        if impl.lower() not in names:
            raise ValueError(
                f"activation_checkpointing checkpoint_impl={impl!r} is not one of {list(names)}"
            )
        kwargs["checkpoint_impl"] = names[impl.lower()]
    return ActivationCheckpointing(check_fn, kwargs)
