"""Plain transformations of a model for fully sharded data parallel training (FSDP2).

Each function takes what it needs explicitly and returns the model, as torchtitan's
``apply_fsdp`` does; :class:`~shardwise.strategies.FSDPStrategy` strings them together in its
``_wrap_model`` (the one place where their order is written), with ``fully_shard`` applied by
:func:`~shardwise.strategies.fully_shard_model`'s rules.

Example::

    >>> mesh = build_device_mesh('cpu', Degrees(dp_shard=2))
    >>> with torch.device('meta'):
    ...     model = Transformer()
    >>> model = fully_shard_model(model, mesh=mesh, auto_wrap_policy={'Block'})
    >>> model = materialize_model(model, torch.device('cpu'), seed=0)
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as torch_dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from .fsdp_config import WrapPolicy

__all__ = [
    "CHECKPOINT_PREFIX",
    "apply_activation_checkpointing",
    "clean_name",
    "has_meta_tensors",
    "init_weights",
    "materialize_model",
    "select_modules_to_shard",
]

logger = logging.getLogger(__name__)

#: What torch's ``checkpoint_wrapper`` adds to parameter names (state dict keys stay clean).
CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."
_CONTAINERS = (nn.ModuleList, nn.ModuleDict)  # no forward of their own: never sharded alone


def clean_name(name: str) -> str:
    """A parameter name without the activation-checkpointing wrapper's prefix."""
    return name.replace(CHECKPOINT_PREFIX, "")


def has_meta_tensors(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` is on the meta device."""
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def _inner(module: nn.Module) -> nn.Module:
    """The module an activation-checkpointing wrapper wraps, or the module itself."""
    inner = getattr(module, "_checkpoint_wrapped_module", None)
    return inner if isinstance(inner, nn.Module) else module


def select_modules_to_shard(
    model: nn.Module, policy: WrapPolicy | None, ignored_modules: Sequence[nn.Module] = ()
) -> list[nn.Module]:
    """The submodules that get their own ``fully_shard``, children before parents (the order
    ``fully_shard`` must be applied in); the root is never among them.

    It walks the model as FSDP1's auto-wrapping does: ``policy(module, True, numel)`` says
    whether to look inside a module, and after its children ``policy(module, False, numel)``
    (``numel``: its parameters not yet claimed by a selected submodule) whether to select it.
    Activation-checkpointing wrappers are transparent: the policy sees the wrapped module and
    the wrapper is selected. ``ModuleList``/``ModuleDict`` (no forward) and modules without
    parameters are never selected.
    """
    if policy is None:
        return []
    ignored = {id(m) for m in ignored_modules}
    selected: list[nn.Module] = []

    def visit(module: nn.Module, is_root: bool) -> int:
        view = _inner(module)
        numel = sum(p.numel() for p in view.parameters())
        if not policy(view, True, numel):
            return 0
        claimed = sum(visit(child, False) for child in view.children() if id(child) not in ignored)
        remainder = numel - claimed
        if (
            not is_root
            and remainder > 0
            and not isinstance(view, _CONTAINERS)
            and policy(view, False, remainder)
        ):
            selected.append(module)
            return numel
        return claimed

    visit(model, True)
    return selected


def apply_activation_checkpointing(
    model: nn.Module, check_fn: Any, wrapper_kwargs: Mapping[str, Any] | None = None
) -> nn.Module:
    """Wrap every submodule for which ``check_fn(module)`` is true in torch's
    ``checkpoint_wrapper`` (its activations are recomputed in backward). Parameter names gain
    ``_checkpoint_wrapped_module.``; state-dict keys do not. Returns ``model`` (the root is
    never wrapped)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing as torch_apply,
    )
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    kwargs = dict(wrapper_kwargs or {})

    def wrap(module: nn.Module) -> nn.Module:
        return checkpoint_wrapper(module, **kwargs)

    def selected(module: nn.Module) -> bool:
        return module is not model and bool(check_fn(module))

    torch_apply(model, checkpoint_wrapper_fn=wrap, check_fn=selected)
    return model


@contextlib.contextmanager
def _rank_local_rng(model: nn.Module, seed: int) -> Iterator[None]:
    """Random initialisation of shards on a CPU mesh: each rank draws from ``seed + rank``.

    DTensor gives each shard its own random stream on CUDA; on a CPU mesh it falls back to the
    local generator, so every rank would draw the same numbers for its different shard.
    Copies of one shard then differ, until :func:`_agree_on_copies`. Torch's global RNG state
    is restored.
    """
    mesh = _mesh_of(model)
    if mesh is None or mesh.device_type != "cpu":
        yield
        return
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DTensor random operators may not have")
        torch.manual_seed(seed + torch_dist.get_rank())
        yield


def _agree_on_copies(model: nn.Module, mesh: DeviceMesh) -> None:
    """The ranks that hold copies of one shard take the first copy's values: along every
    dimension of ``mesh`` (the run's whole mesh) on which a tensor is ``Replicate`` (HSDP's
    replicas, a row-wise layer's bias) or that its own mesh lacks (a norm that tensor
    parallelism leaves whole lives on the data-parallel dimensions only)."""
    names = mesh.mesh_dim_names or ()
    for tensor in (*model.parameters(), *model.buffers()):
        if not isinstance(tensor, DTensor):
            continue
        own = tensor.device_mesh.mesh_dim_names or ()
        for dim, name in enumerate(names):
            split = name in own and not tensor.placements[own.index(name)].is_replicate()
            if mesh.size(dim) > 1 and not split:
                torch_dist.broadcast(tensor._local_tensor, group=mesh.get_group(dim), group_src=0)


def _mesh_of(model: nn.Module) -> DeviceMesh | None:
    for p in model.parameters():
        if isinstance(p, DTensor):
            return p.device_mesh
    return None


def init_weights(model: nn.Module) -> None:
    """``model.init_weights()`` when the model has it, else ``reset_parameters()`` of every
    module that has one."""
    if callable(getattr(model, "init_weights", None)):
        model.init_weights()
        return
    for module in model.modules():
        if callable(getattr(module, "reset_parameters", None)):
            module.reset_parameters()


def materialize_model(
    model: nn.Module,
    device: torch.device,
    *,
    seed: int = 0,
    initialize: bool = True,
    mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Allocate a sharded model's meta tensors on ``device`` (each rank only its shards) and,
    with ``initialize``, initialise them shard-locally (:func:`init_weights`); ``mesh`` (the
    run's whole mesh; default: the mesh of the first sharded parameter) says which ranks hold
    copies of a shard, and they are made to agree.

    Plain (unsharded) parameters and buffers are then taken from rank 0 so that every rank
    agrees. Buffers that ``__init__`` computed and no ``init_weights``/``reset_parameters``
    recomputes (non-persistent tables) are lost on the meta device: recompute them there.
    """
    model.to_empty(device=device)
    if initialize:
        with _rank_local_rng(model, seed), torch.no_grad():
            init_weights(model)
            mesh = mesh or _mesh_of(model)
            if mesh is not None and mesh.device_type == "cpu":
                _agree_on_copies(model, mesh)
    if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
        plain = [p for p in model.parameters() if not isinstance(p, DTensor)]
        for tensor in (*plain, *model.buffers()):
            with torch.no_grad():
                torch_dist.broadcast(tensor.data, src=0)
    return model
