"""Build an optimizer wrapper from a config: ``build_optim_wrapper(model, cfg)`` and the
``DefaultOptimizerConstructor`` with mmengine's parameter-wise rules (``paramwise_cfg``).

Example::

    >>> import torch
    >>> from shardwise.optim import build_optim_wrapper
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))
    >>> optim_wrapper = build_optim_wrapper(model, dict(
    ...     optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4),
    ...     paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0),
    ...     clip_grad=dict(max_norm=1.0)))
    >>> [group['weight_decay'] for group in optim_wrapper.optimizer.param_groups]
    [0.0001, 0.0, 0.0, 0.0]
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn as nn
from torch.nn import GroupNorm, LayerNorm
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.optim import Optimizer

from ..integrations.openmmlab_compat import optimizer_to_rewrap
from ..registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS, OPTIMIZERS
from .optim_wrapper import OptimWrapper

__all__ = [
    "DefaultOptimizerConstructor",
    "DefaultOptimWrapperConstructor",
    "TORCH_OPTIMIZERS",
    "TRANSFORMERS_OPTIMIZERS",
    "build_optim_wrapper",
    "register_torch_optimizers",
    "register_transformers_optimizers",
]

logger = logging.getLogger(__name__)

_NORM_TYPES = (_BatchNorm, _InstanceNorm, GroupNorm, LayerNorm)
# mmcv's deformable convolutions, recognised by class name so that mmcv is never imported.
_DCN_CLASS_NAMES = frozenset({"DeformConv2d", "ModulatedDeformConv2d"})
_DECAY_MULTS = ("bias_decay_mult", "norm_decay_mult", "dwconv_decay_mult", "flat_decay_mult")
_LR_MULTS = ("bias_lr_mult", "dcn_offset_lr_mult")


def register_torch_optimizers() -> list[str]:
    """Register every optimizer class of ``torch.optim`` in ``OPTIMIZERS`` under its name (a
    class registered already stays) and return the names, as mmengine's function does:
    torch's ``Adafactor`` as ``'TorchAdafactor'`` (``'Adafactor'`` is transformers')."""
    names = []
    for name, obj in inspect.getmembers(torch.optim, inspect.isclass):
        if issubclass(obj, Optimizer):
            key = "TorchAdafactor" if name == "Adafactor" else name
            OPTIMIZERS.register_module(name=key, module=obj)
            names.append(name)
    return names


#: The names of ``torch.optim``'s optimizers, all registered in ``OPTIMIZERS``.
TORCH_OPTIMIZERS = register_torch_optimizers()


def register_transformers_optimizers() -> list[str]:
    """Register Hugging Face transformers' ``Adafactor`` in ``OPTIMIZERS`` when transformers
    is installed, as mmengine does, and return the names; transformers is imported only when
    one is built (importing it takes seconds)."""
    if importlib.util.find_spec("transformers") is None:
        return []

    def Adafactor(params: Any, **kwargs: Any) -> Optimizer:  # noqa: N802 - the class's name
        """transformers' ``Adafactor`` (imported on first use)."""
        from transformers import Adafactor as adafactor

        return adafactor(params, **kwargs)

    OPTIMIZERS.register_module(name="Adafactor", module=Adafactor)
    return ["Adafactor"]


#: The names of transformers' optimizers registered in ``OPTIMIZERS`` (when it is installed).
TRANSFORMERS_OPTIMIZERS = register_transformers_optimizers()


def _is_dcn(module: nn.Module) -> bool:
    return any(cls.__name__ in _DCN_CLASS_NAMES for cls in type(module).__mro__)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _unwrap(model: nn.Module) -> nn.Module:
    """The wrapped module of a pure wrapper (DDP, DataParallel, anything whose parameters are
    all its ``module``'s), so that parameter names carry no ``module.`` prefix."""
    inner = getattr(model, "module", None)
    if not isinstance(inner, nn.Module):
        return model
    inner_ids = {id(p) for p in inner.parameters()}
    if all(id(p) in inner_ids for p in model.parameters()):
        return inner
    return model


@OPTIM_WRAPPER_CONSTRUCTORS.register_module(
    name=["DefaultOptimizerConstructor", "DefaultOptimWrapperConstructor"]
)
class DefaultOptimizerConstructor:
    """Builds an optimizer wrapper for a model, with parameter-wise settings.

    Calling the constructor on a model builds ``optim_wrapper_cfg['optimizer']`` from
    ``OPTIMIZERS`` over the model's parameters, then the wrapper
    (``optim_wrapper_cfg['type']``, default ``'OptimWrapper'``) from ``OPTIM_WRAPPERS`` with
    the other keys of ``optim_wrapper_cfg`` (``accumulative_counts``, ``clip_grad``...).

    ``paramwise_cfg`` (mmengine's rules; each parameter gets its own param group):

    - ``custom_keys``: ``{substring: dict(lr_mult=..., decay_mult=..., ...)}``. A parameter
      whose full name contains a key takes ``lr = base_lr * lr_mult``,
      ``weight_decay = base_wd * decay_mult`` and the dict's other entries, and no other
      rule. The longest matching key wins (ties: alphabetical order).
    - ``bias_lr_mult``: lr multiplier of biases (not of norm layers or DCN offsets).
    - ``bias_decay_mult``, ``norm_decay_mult`` (weights and biases of BatchNorm,
      InstanceNorm, GroupNorm, LayerNorm), ``dwconv_decay_mult`` (depthwise ``Conv2d``),
      ``flat_decay_mult`` (other 1-D parameters): weight-decay multipliers, applied in the
      order norm, bias, depthwise conv, flat; the first that applies wins.
    - ``dcn_offset_lr_mult``: lr multiplier of mmcv deformable-conv offset layers.
    - ``bypass_duplicate``: skip (with a warning) parameters shared by several modules
      instead of letting the optimizer reject them.

    With rules, parameters that do not require gradients are left out of the optimizer (with
    a warning), as in mmengine; without rules all parameters go in one group.

    Args:
        optim_wrapper_cfg: the wrapper config; must hold ``optimizer=dict(type=..., ...)``.
        paramwise_cfg: the rules above; ``None`` or ``{}`` puts all parameters in one group.

    Other ``paramwise_cfg`` keys are warned about (a typo is otherwise silently ignored) and
    kept for a subclass to read; a subclass that reads more keys lists them in
    :attr:`paramwise_keys`.
    """

    paramwise_keys: ClassVar[frozenset[str]] = frozenset(
        {"custom_keys", "bypass_duplicate", *_DECAY_MULTS, *_LR_MULTS}
    )

    def __init__(
        self,
        optim_wrapper_cfg: Mapping[str, Any],
        paramwise_cfg: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(optim_wrapper_cfg, Mapping):
            raise TypeError(
                f"optim_wrapper_cfg must be a dict, got {type(optim_wrapper_cfg).__name__}: "
                f"{optim_wrapper_cfg!r}"
            )
        if "optimizer" not in optim_wrapper_cfg:
            raise ValueError(
                f"optim_wrapper_cfg must contain an 'optimizer' config, got keys "
                f"{sorted(optim_wrapper_cfg)}; e.g. dict(optimizer=dict(type='AdamW', lr=1e-3))"
            )
        if paramwise_cfg is not None and not isinstance(paramwise_cfg, Mapping):
            raise TypeError(
                f"paramwise_cfg must be None or a dict, got {type(paramwise_cfg).__name__}: "
                f"{paramwise_cfg!r}"
            )
        self.optim_wrapper_cfg = dict(optim_wrapper_cfg)
        optimizer_cfg = self.optim_wrapper_cfg.pop("optimizer")
        if isinstance(optimizer_cfg, Optimizer):
            raise TypeError(
                "optim_wrapper_cfg['optimizer'] is an already built optimizer; wrap it directly "
                "with OptimWrapper(optimizer) (or OPTIM_WRAPPERS.build(dict(type=..., "
                "optimizer=optimizer))), or give its config: dict(type='SGD', lr=...)"
            )
        if not isinstance(optimizer_cfg, Mapping) or "type" not in optimizer_cfg:
            raise ValueError(
                f"optim_wrapper_cfg['optimizer'] must be a dict with a 'type' key, got "
                f"{optimizer_cfg!r}; e.g. dict(type='SGD', lr=0.01)"
            )
        self.optimizer_cfg = dict(optimizer_cfg)
        self.paramwise_cfg: dict[str, Any] = dict(paramwise_cfg or {})
        self.base_lr = self.optimizer_cfg.get("lr")
        self.base_wd = self.optimizer_cfg.get("weight_decay")
        self._validate_cfg()

    def _validate_cfg(self) -> None:
        # Resolve the types now so that a typo fails before any optimizer is built.
        self._optimizer_class()
        OPTIM_WRAPPERS.resolve(self.optim_wrapper_cfg.get("type", "OptimWrapper"))

        cfg = self.paramwise_cfg
        unknown = sorted(set(cfg) - self.paramwise_keys)
        if unknown:
            logger.warning(
                "paramwise_cfg keys %s are not among the keys %s reads (%s); unless the "
                "constructor reads them itself they have no effect: check their spelling (a "
                "subclass that reads more keys lists them in `paramwise_keys`)",
                unknown,
                type(self).__name__,
                ", ".join(sorted(self.paramwise_keys)),
            )
        for key in (*_DECAY_MULTS, *_LR_MULTS):
            if key in cfg and not _is_number(cfg[key]):
                raise TypeError(f"paramwise_cfg[{key!r}] must be a number, got {cfg[key]!r}")
        if not isinstance(cfg.get("bypass_duplicate", False), bool):
            raise TypeError(
                f"paramwise_cfg['bypass_duplicate'] must be a bool, got {cfg['bypass_duplicate']!r}"
            )
        custom_keys = cfg.get("custom_keys", {})
        if not isinstance(custom_keys, Mapping):
            raise TypeError(
                f"paramwise_cfg['custom_keys'] must be a dict of {{name substring: dict(lr_mult="
                f"..., decay_mult=...)}}, got {type(custom_keys).__name__}: {custom_keys!r}"
            )
        for key, value in custom_keys.items():
            if not isinstance(value, Mapping):
                raise TypeError(
                    f"paramwise_cfg['custom_keys'][{key!r}] must be a dict such as "
                    f"dict(lr_mult=0.1, decay_mult=0.0), got {value!r}"
                )
        decay_rules = [k for k in _DECAY_MULTS if k in cfg] + [
            f"custom_keys[{k!r}].decay_mult" for k, v in custom_keys.items() if "decay_mult" in v
        ]
        if decay_rules and self.base_wd is None:
            raise ValueError(
                f"paramwise_cfg sets {decay_rules} but the optimizer config has no "
                "weight_decay to multiply; add weight_decay=... to the optimizer config"
            )
        lr_rules = [k for k in _LR_MULTS if k in cfg] + (["custom_keys"] if custom_keys else [])
        if lr_rules and self.base_lr is None:
            raise ValueError(
                f"paramwise_cfg sets {lr_rules} but the optimizer config has no lr to multiply; "
                "add lr=... to the optimizer config"
            )

    def add_params(
        self,
        params: list[dict[str, Any]],
        module: nn.Module,
        prefix: str = "",
        is_dcn_module: bool | None = None,
    ) -> None:
        """Append one param group per parameter of ``module`` (recursively) to ``params``,
        with the ``paramwise_cfg`` rules applied. ``prefix`` is ``module``'s name."""
        cfg = self.paramwise_cfg
        custom_keys: Mapping[str, Mapping[str, Any]] = cfg.get("custom_keys", {})
        sorted_keys = sorted(sorted(custom_keys), key=len, reverse=True)
        bias_lr_mult = cfg.get("bias_lr_mult")
        bias_decay_mult = cfg.get("bias_decay_mult")
        norm_decay_mult = cfg.get("norm_decay_mult")
        dwconv_decay_mult = cfg.get("dwconv_decay_mult")
        flat_decay_mult = cfg.get("flat_decay_mult")
        dcn_offset_lr_mult = cfg.get("dcn_offset_lr_mult")
        bypass_duplicate = cfg.get("bypass_duplicate", False)

        is_norm = isinstance(module, _NORM_TYPES)
        is_dwconv = isinstance(module, nn.Conv2d) and module.in_channels == module.groups

        for name, param in module.named_parameters(recurse=False):
            full_name = f"{prefix}.{name}" if prefix else name
            group: dict[str, Any] = {"params": [param]}
            if any(param is p for g in params for p in g["params"]):
                if not bypass_duplicate:
                    raise ValueError(
                        f"some parameters appear in more than one parameter group: {full_name} "
                        "is a parameter already added under another name (tied weights); set "
                        "paramwise_cfg=dict(bypass_duplicate=True, ...) to give it to the "
                        "optimizer once"
                    )
                logger.warning(
                    "%s is a duplicate parameter; it is skipped since bypass_duplicate=True",
                    full_name,
                )
                continue
            if not param.requires_grad:
                logger.warning("%s is skipped since its requires_grad=False", full_name)
                continue

            custom = next((k for k in sorted_keys if k in f"{prefix}.{name}"), None)
            if custom is not None:
                group["lr"] = self.base_lr * custom_keys[custom].get("lr_mult", 1.0)
                if self.base_wd is not None:
                    group["weight_decay"] = self.base_wd * custom_keys[custom].get(
                        "decay_mult", 1.0
                    )
                group.update(custom_keys[custom])
            else:
                if name == "bias" and not (is_norm or is_dcn_module) and bias_lr_mult is not None:
                    group["lr"] = self.base_lr * bias_lr_mult
                if (
                    "conv_offset" in prefix
                    and is_dcn_module
                    and dcn_offset_lr_mult is not None
                    and isinstance(module, nn.Conv2d)
                ):
                    group["lr"] = self.base_lr * dcn_offset_lr_mult
                if self.base_wd is not None:
                    if is_norm and norm_decay_mult is not None:
                        group["weight_decay"] = self.base_wd * norm_decay_mult
                    elif name == "bias" and not is_dcn_module and bias_decay_mult is not None:
                        group["weight_decay"] = self.base_wd * bias_decay_mult
                    elif is_dwconv and dwconv_decay_mult is not None:
                        group["weight_decay"] = self.base_wd * dwconv_decay_mult
                    elif param.ndim == 1 and not is_dcn_module and flat_decay_mult is not None:
                        group["weight_decay"] = self.base_wd * flat_decay_mult
            params.append(group)
            settings = {k: v for k, v in group.items() if k != "params"}
            if settings:
                logger.debug("paramwise_options -- %s: %s", full_name, settings)

        child_is_dcn = _is_dcn(module)
        for child_name, child in module.named_children():
            child_prefix = f"{prefix}.{child_name}" if prefix else child_name
            self.add_params(params, child, prefix=child_prefix, is_dcn_module=child_is_dcn)

    def _optimizer_class(self) -> Any:
        """The optimizer class the config names, found in the default scope's registry."""
        with OPTIMIZERS.switch_scope_and_registry(None) as registry:
            return registry.resolve(self.optimizer_cfg["type"])

    def __call__(self, model: nn.Module) -> OptimWrapper:
        """Build the optimizer and its wrapper for ``model``'s parameters."""
        model = _unwrap(model)
        optimizer_cfg = dict(self.optimizer_cfg)
        params: list[Any] = []
        if self.paramwise_cfg:
            self.add_params(params, model)
        else:
            params = list(model.parameters())
        # the parameters go to the optimizer's first argument, whatever its name
        params_arg = next(iter(inspect.signature(self._optimizer_class()).parameters))
        optimizer_cfg[params_arg] = params
        optimizer = OPTIMIZERS.build(optimizer_cfg)
        wrapper_cfg = dict(self.optim_wrapper_cfg)
        wrapper_cfg.setdefault("type", "OptimWrapper")
        return OPTIM_WRAPPERS.build(wrapper_cfg, default_args=dict(optimizer=optimizer))


#: mmengine's name for :class:`DefaultOptimizerConstructor`.
DefaultOptimWrapperConstructor = DefaultOptimizerConstructor


def build_optim_wrapper(model: nn.Module, cfg: Mapping[str, Any]) -> OptimWrapper:
    """Build an optimizer wrapper for ``model`` from a config.

    ``cfg`` holds ``optimizer=dict(type=..., ...)`` (a registered name, a class or a dotted
    path such as ``'torch.optim.AdamW'``), optionally ``type`` (the wrapper, default
    ``'OptimWrapper'``), ``constructor`` (a registered name, a class, or a dict with ``type``
    and more constructor arguments; default ``'DefaultOptimizerConstructor'``),
    ``paramwise_cfg``, and the wrapper's own arguments (``accumulative_counts``,
    ``clip_grad``, ``dtype``...). ``cfg`` is not modified. An OpenMMLab package's constructor
    (mmengine's, such as mmpretrain's ``LearningRateDecayOptimWrapperConstructor``) builds the
    optimizer with its parameter groups; shardwise's wrapper of ``type`` wraps it.
    """
    if not isinstance(cfg, Mapping):
        raise TypeError(
            f"the optim_wrapper config must be a dict, got {type(cfg).__name__}: {cfg!r}; e.g. "
            "dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.01))"
        )
    if isinstance(cfg.get("optimizer"), Optimizer):
        raise TypeError(
            "the optim_wrapper config holds an already built optimizer; wrap it directly with "
            "OptimWrapper(optimizer) or give the optimizer as a config dict(type=..., lr=...)"
        )
    wrapper_cfg = copy.deepcopy(dict(cfg))
    constructor = wrapper_cfg.pop("constructor", "DefaultOptimizerConstructor")
    paramwise_cfg = wrapper_cfg.pop("paramwise_cfg", None)
    if isinstance(constructor, Mapping):
        constructor_cfg = dict(constructor)
    else:
        constructor_cfg = dict(type=constructor)
    constructor_cfg.update(optim_wrapper_cfg=wrapper_cfg, paramwise_cfg=paramwise_cfg)
    built = OPTIM_WRAPPER_CONSTRUCTORS.build(constructor_cfg)(model)
    grouped = optimizer_to_rewrap(built)
    if grouped is None:
        return built
    # an OpenMMLab package's constructor (mmengine's) grouped the parameters; the wrapper
    # that steps them is shardwise's, from the same settings
    settings = {k: v for k, v in wrapper_cfg.items() if k != "optimizer"}
    return OPTIM_WRAPPERS.build({"type": "OptimWrapper", **settings, "optimizer": grouped})
