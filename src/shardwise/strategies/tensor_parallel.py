"""Tensor-parallel plans: which module is split how, from a config, the model, or a function.

A plan comes in one of three forms (``FSDPStrategy(tp_plan=...)``):

1. ``'auto'``: the model's own plan, ``_tp_plan`` (Hugging Face transformers models carry one,
   e.g. Llama; any model may declare one), else ``config.base_model_tp_plan``;
2. a dict mapping module-name patterns (``*`` matches one name, as in
   ``'blocks.*.attn.q'``) to styles: ``'colwise'``, ``'rowwise'``, ``'sequence_parallel'``,
   ``'replicate'``, Hugging Face's names for them (:data:`STYLE_NAMES`), a dict
   ``dict(type='colwise', output_layouts='replicate', ...)`` giving the layouts embeddings and
   LM heads need, or a ``ParallelStyle`` object;
3. a function ``parallelize_fn(model, mesh) -> model`` (Lightning's convention) that applies
   tensor parallelism itself on ``mesh['tp']``.

Everything about a plan that can be wrong is refused on every rank alike, before the model is
split (so no rank waits for one that failed): an unknown style (when the config is read), a
pattern that matches no module (naming the nearest module names), ``tp`` not dividing a split
dimension or a head count.

Example::

    >>> plan = parse_tp_plan({'blocks.*.attn.q': 'colwise', 'blocks.*.attn.proj': 'rowwise',
    ...                       'head': dict(type='colwise', output_layouts='replicate')})
    >>> styles = resolve_styles(model, plan, tp=2)  # {'blocks.0.attn.q': ColwiseParallel()...}
    >>> model = apply_tensor_parallel(model, mesh, plan, styles)
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from shardwise.registry import FUNCTIONS

__all__ = [
    "STYLE_NAMES",
    "ReplicateParallel",
    "TensorParallelPlan",
    "apply_tensor_parallel",
    "parse_tp_plan",
    "resolve_styles",
]

_EXAMPLE = "tp_plan={'blocks.*.attn.q': 'colwise', 'blocks.*.attn.proj': 'rowwise'}"


class ReplicateParallel(ParallelStyle):
    """The module's parameters become DTensors replicated over the tensor-parallel mesh
    (so that FSDP shards them alike on every tensor-parallel rank); inputs and outputs stay
    plain tensors, the same on every tensor-parallel rank."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def replicate_params(name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for key, param in list(mod.named_parameters(recurse=False)):
                replicated = distribute_tensor(param, mesh, [Replicate()])
                mod.register_parameter(key, nn.Parameter(replicated, param.requires_grad))

        def to_dtensor(mod: nn.Module, inputs: Any, mesh: DeviceMesh) -> Any:
            return tuple(
                DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
                else x
                for x in inputs
            )

        def to_local(mod: nn.Module, outputs: Any, mesh: DeviceMesh) -> Any:
            return outputs.to_local() if isinstance(outputs, DTensor) else outputs

        return distribute_module(module, device_mesh, replicate_params, to_dtensor, to_local)


_STYLE_CLASSES: dict[str, type[ParallelStyle]] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "sequence_parallel": SequenceParallel,
    "replicate": ReplicateParallel,
}
#: Hugging Face transformers' names (in models' ``_tp_plan``) for the same styles.
_ALIASES: dict[str, tuple[str, dict[str, str]]] = {
    "colwise_rep": ("colwise", dict(output_layouts="replicate")),
    "colwise_gather_output": ("colwise", dict(output_layouts="replicate")),
    "rowwise_split_input": ("rowwise", dict(input_layouts="replicate")),
    "embedding_rowwise": ("rowwise", dict(input_layouts="replicate")),
    "embedding_colwise": ("colwise", dict(input_layouts="replicate", output_layouts="replicate")),
    "replicated_with_grad_allreduce": ("replicate", {}),
}
#: Every style name a plan may use.
STYLE_NAMES = (*_STYLE_CLASSES, *_ALIASES)
_LAYOUT_KEYS = {"input_layouts", "output_layouts", "desired_input_layouts"}
_SHARD = re.compile(r"shard\((-?\d+)\)")


def _layout(value: Any, where: str) -> Any:
    if isinstance(value, Placement):
        return value
    if isinstance(value, list | tuple):
        return type(value)(_layout(v, where) for v in value)
    if isinstance(value, str):
        name = value.strip().lower()
        if name == "replicate":
            return Replicate()
        match = _SHARD.fullmatch(name.replace(" ", ""))
        if match:
            return Shard(int(match.group(1)))
    raise ValueError(
        f"{where}: layout {value!r} is not 'replicate' or 'shard(N)' (or a torch Placement)"
    )


def _style(spec: Any, pattern: str) -> ParallelStyle:
    """A ``ParallelStyle`` from a name, ``dict(type=name, **layouts)`` or a style object."""
    if isinstance(spec, ParallelStyle):
        return spec
    where = f"tp_plan[{pattern!r}]"
    if isinstance(spec, Mapping):
        kwargs = dict(spec)
        name = kwargs.pop("type", None)
    else:
        name, kwargs = spec, {}
    if not isinstance(name, str) or name not in STYLE_NAMES:
        close = difflib.get_close_matches(str(name), STYLE_NAMES, n=3)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise ValueError(
            f"{where}={spec!r} is not a tensor-parallel style{hint}; styles: "
            f"{list(STYLE_NAMES)}, dict(type=style, input_layouts=..., output_layouts=...) or "
            "a torch ParallelStyle"
        )
    name, defaults = _ALIASES.get(name, (name, {}))
    kwargs = {**defaults, **kwargs}
    kwargs = {k: _layout(v, where) if k in _LAYOUT_KEYS else v for k, v in kwargs.items()}
    try:
        return _STYLE_CLASSES[name](**kwargs)
    except TypeError as exc:
        raise TypeError(f"{where}={spec!r}: {exc}") from None


@dataclass(frozen=True)
class TensorParallelPlan:
    """A parsed ``tp_plan``: ``auto`` (the model's own), ``styles`` (pattern → style) or
    ``fn`` (``parallelize_fn(model, mesh)``)."""

    auto: bool = False
    styles: Mapping[str, ParallelStyle] = field(default_factory=dict)
    fn: Callable[[nn.Module, DeviceMesh], Any] | None = None

    def describe(self) -> str:
        if self.auto:
            return "the model's own plan"
        if self.fn is not None:
            return getattr(self.fn, "__name__", repr(self.fn))
        return f"{len(self.styles)} pattern(s)"


def parse_tp_plan(value: Any) -> TensorParallelPlan | None:
    """Check a ``tp_plan`` (see the module docstring) without a model: style names, layouts,
    the kind of value. A string other than ``'auto'`` names a function in ``FUNCTIONS`` (or
    a dotted path)."""
    if value is None:
        return None
    if value == "auto":
        return TensorParallelPlan(auto=True)
    if isinstance(value, str):
        found = FUNCTIONS.get(value)
        if not callable(found):
            raise ValueError(
                f"tp_plan={value!r} is neither 'auto' nor a function registered in FUNCTIONS "
                f"(or a dotted path); give 'auto', a dict such as {_EXAMPLE}, or a callable "
                "parallelize_fn(model, mesh)"
            )
        return TensorParallelPlan(fn=found)
    if isinstance(value, Mapping):
        bad = [k for k in value if not isinstance(k, str) or not k]
        if bad:
            raise TypeError(f"tp_plan's keys must be module-name patterns, got {bad!r}")
        return TensorParallelPlan(styles={k: _style(v, k) for k, v in value.items()})
    if callable(value):
        return TensorParallelPlan(fn=value)
    raise TypeError(
        f"tp_plan must be 'auto', a dict of module-name patterns to styles or a callable "
        f"parallelize_fn(model, mesh), got {type(value).__name__}: {value!r}; e.g. {_EXAMPLE}"
    )


def _model_plan(model: nn.Module) -> Mapping[str, Any]:
    plan = getattr(model, "_tp_plan", None)
    if not plan:
        plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None)
    if not plan or not isinstance(plan, Mapping):
        raise ValueError(
            f"tp_plan='auto' needs a model that carries its tensor-parallel plan, and "
            f"{type(model).__name__} has none (Hugging Face transformers models have one in "
            "_tp_plan or config.base_model_tp_plan, e.g. Llama; any model may set a _tp_plan "
            f"dict); give the plan instead, e.g. {_EXAMPLE}, or a callable "
            "parallelize_fn(model, mesh)"
        )
    return plan


def _matches(pattern: str, name: str) -> bool:
    atoms, parts = pattern.split("."), name.split(".")
    return len(atoms) == len(parts) and all(map(fnmatch.fnmatchcase, parts, atoms))


def resolve_styles(model: nn.Module, plan: TensorParallelPlan, tp: int) -> dict[str, ParallelStyle]:
    """The style of each module ``plan`` selects, by full name; refuses a pattern that
    matches nothing (the model's own plan may name modules this model does not have), a
    module two patterns select, and ``tp`` not dividing a split dimension or a head count."""
    if plan.fn is not None:
        return {}
    given = plan.styles
    if plan.auto:
        given = {pattern: _style(spec, pattern) for pattern, spec in _model_plan(model).items()}
    names = [name for name, _ in model.named_modules() if name]
    styles: dict[str, ParallelStyle] = {}
    chosen_by: dict[str, str] = {}
    for pattern, style in given.items():
        matched = [name for name in names if _matches(pattern, name)]
        if not matched and not plan.auto:
            raise ValueError(
                f"tp_plan pattern {pattern!r} matches no module of {type(model).__name__}; "
                f"nearest module names: {_nearest(pattern, names)} (* matches one name)"
            )
        for name in matched:
            if name in chosen_by:
                raise ValueError(
                    f"tp_plan selects {name!r} twice, by {chosen_by[name]!r} and {pattern!r}; "
                    "make the patterns disjoint"
                )
            chosen_by[name], styles[name] = pattern, style
    modules = dict(model.named_modules())
    for name, style in styles.items():
        _check_split(name, modules[name], style, tp)
    if styles:
        _check_head_counts(model, tp)
    return styles


def _nearest(pattern: str, names: list[str]) -> list[str]:
    generalised = sorted({re.sub(r"(?<=\.)\d+(?=\.|$)", "*", n) for n in names})
    close = difflib.get_close_matches(pattern, generalised, n=3, cutoff=0.4)
    return close or generalised[:5]


def _check_split(name: str, module: nn.Module, style: ParallelStyle, tp: int) -> None:
    split: tuple[str, int] | None = None
    if isinstance(module, nn.Linear):
        if isinstance(style, ColwiseParallel):
            split = ("out_features", module.out_features)
        elif isinstance(style, RowwiseParallel):
            split = ("in_features", module.in_features)
    elif isinstance(module, nn.Embedding):
        if isinstance(style, ColwiseParallel):
            split = ("embedding_dim", module.embedding_dim)
        elif isinstance(style, RowwiseParallel):
            split = ("num_embeddings", module.num_embeddings)
    if split is not None and split[1] % tp:
        raise ValueError(
            f"tp={tp} does not divide {name}.{split[0]}={split[1]}, which its "
            f"{type(style).__name__} splits; choose tp among "
            f"{[d for d in range(1, split[1] + 1) if split[1] % d == 0][:8]} or leave {name!r} "
            "out of tp_plan"
        )


#: Attributes that hold a head count: every tensor-parallel rank must hold whole heads.
_HEAD_ATTRS = (
    "num_attention_heads",
    "num_key_value_heads",
    "n_head",
    "n_heads",
    "num_heads",
    "n_kv_heads",
    "num_kv_heads",
)


def _check_head_counts(model: nn.Module, tp: int) -> None:
    holders = [("config", getattr(model, "config", None))]
    holders += [(name or type(model).__name__, m) for name, m in model.named_modules()]
    for where, holder in holders:
        for attr in _HEAD_ATTRS:
            count = getattr(holder, attr, None) if holder is not None else None
            if isinstance(count, int) and not isinstance(count, bool) and count % tp:
                raise ValueError(
                    f"tp={tp} does not divide {where}.{attr}={count}: each tensor-parallel rank "
                    f"must hold whole attention heads; choose tp among "
                    f"{[d for d in range(1, count + 1) if count % d == 0]}"
                )


def apply_tensor_parallel(
    model: nn.Module,
    mesh: DeviceMesh,
    plan: TensorParallelPlan,
    styles: Mapping[str, ParallelStyle],
) -> nn.Module:
    """Split ``model`` over ``mesh['tp']``: ``parallelize_module`` with ``styles`` (from
    :func:`resolve_styles`), or the plan's ``parallelize_fn(model, mesh)`` on the whole mesh.
    Works on a model on the meta device."""
    if plan.fn is not None:
        result = plan.fn(model, mesh)
        return model if result is None else result
    return parallelize_module(model, mesh["tp"], dict(styles))
