"""``OptimWrapper``: one interface for stepping an optimizer, with gradient accumulation,
gradient clipping and skipped gradient synchronisation on accumulation steps.

Example::

    >>> import torch
    >>> from shardwise.optim import OptimWrapper
    >>> model = torch.nn.Linear(2, 1)
    >>> optim_wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
    ...                              accumulative_counts=2, clip_grad=dict(max_norm=1.0))
    >>> for x in torch.randn(4, 3, 2):
    ...     with optim_wrapper.optim_context(model):
    ...         loss = model(x).sum()
    ...     optim_wrapper.update_params(loss)  # steps on every 2nd call
    >>> optim_wrapper.inner_count
    4
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as torch_dist
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer

from ..registry import OPTIM_WRAPPERS
from .base import BaseOptimWrapper

__all__ = ["OptimWrapper", "clip_grad_norm_"]

logger = logging.getLogger(__name__)

# Accepted keys of ``clip_grad`` per clipping type (besides ``type``), and the required ones.
_CLIP_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "norm": (
        frozenset({"max_norm", "norm_type", "error_if_nonfinite", "foreach"}),
        frozenset({"max_norm"}),
    ),
    "value": (frozenset({"clip_value", "foreach"}), frozenset({"clip_value"})),
}


def by_mesh(params: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``params`` grouped by the mesh of their gradients (plain gradients together).

    Gradients on different meshes (a tensor-parallel block on dp × tp, a head on dp alone)
    and plain ones cannot share one kernel; each mesh's norm is reduced over that mesh."""
    groups: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        mesh = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
        groups.setdefault(mesh, []).append(p)
    return list(groups.values())


def clip_grad_norm_(
    parameters: torch.Tensor | Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float | str = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
    group: Any = None,
) -> torch.Tensor:
    """:func:`torch.nn.utils.clip_grad_norm_` that is also right for sharded (DTensor) grads.

    The norm of DTensor gradients (FSDP2, tensor parallel) is reduced across their mesh with
    ``full_tensor()``, so the returned total norm is the global one on every rank and every
    shard is scaled by the same coefficient. Plain and DTensor gradients may be mixed.
    ``group``: a process group whose ranks hold *other* parameters (pipeline stages); the norm
    is combined across it too (every rank of it must call, with gradients or without).

    Returns:
        The total norm of all gradients, a plain tensor.
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    with_grad = [p for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    partitions = by_mesh(with_grad)
    if not partitions and group is None:
        return torch.tensor(0.0)
    norms = []
    for part in partitions:
        norm = torch.nn.utils.get_total_norm([p.grad for p in part], norm_type, False, foreach)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        norms.append(norm)
    if group is not None:
        device = with_grad[0].grad.device if with_grad else torch.device("cpu")
        total_norm = _norm_across(norms, norm_type, group, device)
    elif len(norms) == 1:
        total_norm = norms[0]
    else:
        stacked = torch.stack([n.to(norms[0].device) for n in norms])
        if math.isinf(norm_type):
            total_norm = stacked.max()
        else:
            total_norm = stacked.pow(norm_type).sum().pow(1.0 / norm_type)
    if error_if_nonfinite and not torch.isfinite(total_norm):
        raise RuntimeError(
            f"the total norm of order {norm_type} of the gradients is non-finite "
            f"({total_norm.item()}), so it cannot be clipped; set "
            "clip_grad=dict(..., error_if_nonfinite=False) to clip anyway"
        )
    for part in partitions:
        torch.nn.utils.clip_grads_with_norm_(part, max_norm, total_norm, foreach)
    return total_norm


def _norm_across(
    norms: list[torch.Tensor], norm_type: float, group: Any, device: torch.device
) -> torch.Tensor:
    """The norm of order ``norm_type`` of ``norms`` and of the other ranks' of ``group``
    (summed in float64, reduced on ``device``: the gradients', which the group's backend
    serves)."""
    local = torch.zeros((), dtype=torch.float64)
    for norm in norms:
        norm = norm.detach().to("cpu", torch.float64)
        local = torch.maximum(local, norm) if math.isinf(norm_type) else local + norm**norm_type
    local = local.to(device)
    op = torch_dist.ReduceOp.MAX if math.isinf(norm_type) else torch_dist.ReduceOp.SUM
    torch_dist.all_reduce(local, op=op, group=group)
    return local if math.isinf(norm_type) else local ** (1.0 / norm_type)


def _has_batch_norm(model: nn.Module) -> bool:
    return any(isinstance(m, _BatchNorm) for m in model.modules())


def _check_count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


@OPTIM_WRAPPERS.register_module()
class OptimWrapper(BaseOptimWrapper):
    """Wraps a ``torch.optim.Optimizer`` with mmengine's ``OptimWrapper`` interface.

    Args:
        optimizer: the optimizer that updates the parameters.
        accumulative_counts: gradients are accumulated over this many calls of
            :meth:`update_params`; the parameters are updated on every N-th call. The loss is
            divided by N, except in a trailing window shorter than N (see
            :meth:`initialize_count_status`), where it is divided by the window's true size.
        clip_grad: ``dict(type='norm', max_norm=..., norm_type=2, error_if_nonfinite=False)``
            (``type`` defaults to ``'norm'``; :func:`clip_grad_norm_`) or
            ``dict(type='value', clip_value=...)`` (:func:`torch.nn.utils.clip_grad_value_`).
            Clipping happens in :meth:`step`, before the optimizer steps. The total gradient
            norm is kept in :attr:`last_grad_norm`, in :meth:`get_log_vars` and, when
            :attr:`message_hub` is set, as its ``'train/grad_norm'`` scalar (as mmengine).

    Attributes:
        message_hub: ``None``, or a message hub (``update_scalar(key, value)``) that the
            owner of the run attaches to receive ``'train/grad_norm'``.

    Parameter groups, hyper-parameters and state dicts: see :class:`BaseOptimWrapper`.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        accumulative_counts: int = 1,
        clip_grad: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer instance, got "
                f"{type(optimizer).__name__}: {optimizer!r}; to build one from a config use "
                "shardwise.optim.build_optim_wrapper(model, dict(optimizer=dict(type=...)))"
            )
        _check_count("accumulative_counts", accumulative_counts, 1)
        clip_type, clip_kwargs = self._parse_clip_grad(clip_grad)

        super().__init__(optimizer)
        self._accumulative_counts = accumulative_counts
        self.clip_grad_kwargs = clip_kwargs
        self.clip_grad_type = clip_type
        self.last_grad_norm: float | None = None
        #: A process group whose ranks hold other parameters (pipeline stages): the gradient
        #: norm is combined across it (see :func:`clip_grad_norm_`).
        self.clip_group: Any = None
        self.message_hub: Any = None
        # Counts of update_params/backward calls; _max_counts == -1 until
        # initialize_count_status is called, and then the trailing window shorter than
        # _accumulative_counts has _remainder_counts iterations.
        self._inner_count = 0
        self._max_counts = -1
        self._remainder_counts = -1
        # The FSDP2 module whose gradient sync this wrapper turned off; it is turned back on
        # after the next backward (FSDP2 reads the flag during backward, not forward).
        self._unsynced_module: nn.Module | None = None

    @staticmethod
    def _parse_clip_grad(
        clip_grad: Mapping[str, Any] | None,
    ) -> tuple[str | None, dict[str, Any] | None]:
        if clip_grad is None:
            return None, None
        if not isinstance(clip_grad, Mapping):
            raise TypeError(
                f"clip_grad must be None or a dict, got {type(clip_grad).__name__}: "
                f"{clip_grad!r}; e.g. clip_grad=dict(type='norm', max_norm=1.0) or "
                "clip_grad=dict(type='value', clip_value=0.5)"
            )
        kwargs = dict(clip_grad)
        clip_type = kwargs.pop("type", "norm")
        if clip_type not in _CLIP_KEYS:
            raise ValueError(
                f"clip_grad type {clip_type!r} does not exist; expected one of 'norm', 'value' "
                "(e.g. clip_grad=dict(type='norm', max_norm=1.0))"
            )
        accepted, required = _CLIP_KEYS[clip_type]
        unknown = sorted(set(kwargs) - accepted)
        if unknown:
            raise ValueError(
                f"clip_grad of type {clip_type!r} got unknown keys {unknown}; accepted keys are "
                f"{sorted(accepted)}"
            )
        missing = sorted(required - set(kwargs))
        if missing:
            raise ValueError(
                f"clip_grad of type {clip_type!r} needs {missing}, got {dict(clip_grad)!r}; "
                f"e.g. clip_grad=dict(type={clip_type!r}, {missing[0]}=1.0)"
            )
        return clip_type, kwargs

    # ------------------------------------------------------------------ updating parameters

    def update_params(
        self,
        loss: torch.Tensor,
        step_kwargs: dict[str, Any] | None = None,
        zero_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Scale ``loss`` for accumulation, back-propagate it, and step and zero the
        gradients when this is an update iteration (:meth:`should_update`)."""
        loss = self.scale_loss(loss)
        self.backward(loss)
        if self.should_update():
            self.step(**(step_kwargs or {}))
            self.zero_grad(**(zero_kwargs or {}))

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward(**kwargs)`` and count the iteration.

        Note that :meth:`update_params` divides the loss by the accumulation count
        (:meth:`scale_loss`) before calling this; calling ``backward`` directly does not.
        """
        loss.backward(**kwargs)
        self._after_backward()

    def _after_backward(self) -> None:
        """Bookkeeping every ``backward`` (also a subclass's) must do after back-propagation."""
        self._inner_count += 1
        self._restore_grad_sync()

    def step(self, **kwargs: Any) -> None:
        """Clip the gradients if ``clip_grad`` was given, then ``optimizer.step(**kwargs)``."""
        if self.clip_grad_kwargs is not None:
            self._clip_grad()
        self.optimizer.step(**kwargs)

    def zero_grad(self, **kwargs: Any) -> None:
        """``optimizer.zero_grad(**kwargs)``."""
        self.optimizer.zero_grad(**kwargs)

    def _clip_grad(self) -> None:
        assert self.clip_grad_kwargs is not None
        params = [
            p
            for group in self.optimizer.param_groups
            for p in group["params"]
            if p.requires_grad and p.grad is not None
        ]
        if not params and self.clip_group is None:
            return
        if self.clip_grad_type == "norm":
            kwargs = dict(self.clip_grad_kwargs, group=self.clip_group)
            self.last_grad_norm = float(clip_grad_norm_(params, **kwargs))
            if self.message_hub is not None:
                self.message_hub.update_scalar("train/grad_norm", self.last_grad_norm)
        else:
            for part in by_mesh(params):
                torch.nn.utils.clip_grad_value_(part, **self.clip_grad_kwargs)

    # ------------------------------------------------------------------ gradient accumulation

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Divide ``loss`` by the number of iterations accumulated in the current window."""
        if self._accumulative_counts == 1:
            factor = 1
        elif self._max_counts == -1:
            factor = self._accumulative_counts
        elif self._inner_count < self._max_counts - self._remainder_counts:
            factor = self._accumulative_counts
        else:
            factor = self._remainder_counts
            if factor <= 0:
                raise RuntimeError(
                    f"iteration {self._inner_count} is past max_counts={self._max_counts} given "
                    "to initialize_count_status; call it again with the right init_counts and "
                    "max_counts"
                )
        return loss / factor

    def should_update(self) -> bool:
        """Whether the iteration just back-propagated ends an accumulation window."""
        return (
            self._inner_count % self._accumulative_counts == 0
            or self._inner_count == self._max_counts
        )

    def should_sync(self) -> bool:
        """Whether the next backward must synchronise gradients (it ends a window).

        Called before the backward, hence ``_inner_count + 1``.
        """
        next_count = self._inner_count + 1
        return next_count % self._accumulative_counts == 0 or next_count == self._max_counts

    def initialize_count_status(self, model: nn.Module, init_counts: int, max_counts: int) -> None:
        """Set the iteration counter and the total number of iterations.

        Without it a trailing window shorter than ``accumulative_counts`` never steps. With
        it, the last ``max_counts % accumulative_counts`` iterations form their own window and
        their loss is divided by that window's size (``max_counts=10,
        accumulative_counts=4``: iterations 9 and 10 are scaled by 1/2 and step at 10).

        Warns when ``init_counts`` is not a multiple of ``accumulative_counts`` (a resumed
        window has lost its earlier gradients) and when ``model`` has BatchNorm layers while
        accumulating (their statistics see small batches).
        """
        _check_count("init_counts", init_counts, 0)
        _check_count("max_counts", max_counts, 0)
        if init_counts > max_counts:
            raise ValueError(
                f"init_counts ({init_counts}) must not exceed max_counts ({max_counts})"
            )
        self._inner_count = init_counts
        self._max_counts = max_counts
        if init_counts % self._accumulative_counts != 0:
            logger.warning(
                "Resumed iteration number %d is not divisible by accumulative_counts=%d, which "
                "means the gradients of some iterations are lost and the result may be "
                "influenced slightly.",
                init_counts,
                self._accumulative_counts,
            )
        if self._accumulative_counts > 1 and _has_batch_norm(model):
            logger.warning(
                "Gradient accumulation may slightly decrease performance because the model has "
                "BatchNorm layers."
            )
        self._remainder_counts = max_counts % self._accumulative_counts

    @contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        """Run the forward pass in this context to skip gradient synchronisation on iterations
        that do not update the parameters.

        DDP (a model with ``no_sync``): the forward runs under ``model.no_sync()``. FSDP2 (a
        model with ``set_requires_gradient_sync``): sync is turned off now and turned back on
        after this wrapper's next :meth:`backward` (FSDP2 reads it in backward). Other models:
        nothing to skip.
        """
        if self.should_sync():
            self._restore_grad_sync()
            yield
        elif hasattr(model, "no_sync"):
            with model.no_sync():
                yield
        elif hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(False)
            self._unsynced_module = model
            yield
        else:
            yield

    def _restore_grad_sync(self) -> None:
        if self._unsynced_module is not None:
            self._unsynced_module.set_requires_gradient_sync(True)
            self._unsynced_module = None

    # ------------------------------------------------------------------ logging, counters

    def get_log_vars(self) -> dict[str, float]:
        """Scalars worth logging after a step: ``grad_norm`` once norm clipping has run."""
        return {} if self.last_grad_norm is None else {"grad_norm": self.last_grad_norm}

    @property
    def inner_count(self) -> int:
        """The number of iterations back-propagated so far (or set by
        :meth:`initialize_count_status`)."""
        return self._inner_count

    @property
    def max_counts(self) -> int:
        """The total number of iterations, -1 until :meth:`initialize_count_status`."""
        return self._max_counts

    @property
    def accumulative_counts(self) -> int:
        return self._accumulative_counts

    def __repr__(self) -> str:
        return (
            f"Type: {type(self).__name__}\n"
            f"_accumulative_counts: {self._accumulative_counts}\n"
            f"optimizer: \n{self.optimizer!r}\n"
        )
