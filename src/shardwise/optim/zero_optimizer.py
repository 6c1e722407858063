"""``ZeroRedundancyOptimizer``: torch's ZeRO stage-1 optimizer, built from a config.

Each rank keeps the optimizer state of its share of the parameters only and broadcasts its
updated parameters after each step; use it with data parallelism (DDP) to divide the
optimizer state's memory by the number of ranks.

Example (in a process group)::

    >>> optim_wrapper = build_optim_wrapper(model, dict(optimizer=dict(
    ...     type='ZeroRedundancyOptimizer', optimizer_type='AdamW', lr=1e-3)))

The class is created at its first use: importing ``torch.distributed.optim`` takes ~0.7 s
(it compiles torch's functional optimizers with TorchScript), which ``import shardwise``
should not pay.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim import Optimizer

from ..registry import OPTIMIZERS

__all__ = ["build_zero_redundancy_optimizer"]  # and ZeroRedundancyOptimizer, made at first use

Params = Iterable[torch.Tensor] | Iterable[dict[str, Any]]


def __getattr__(name: str) -> Any:
    if name == "ZeroRedundancyOptimizer":
        return _zero_redundancy_optimizer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _zero_redundancy_optimizer_class() -> type[Optimizer]:
    with warnings.catch_warnings():  # torch's own use of TorchScript: nothing a user can change
        warnings.filterwarnings("ignore", r"`torch\.jit\.\w+` is deprecated", DeprecationWarning)
        from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZeroRedundancy

    class ZeroRedundancyOptimizer(TorchZeroRedundancy):
        """:class:`torch.distributed.optim.ZeroRedundancyOptimizer` whose local optimizer is
        named by ``optimizer_type`` (mmengine's form).

        Args:
            params: the parameters (or param groups) of every rank; each rank updates a share.
            optimizer_type: the local optimizer: a name in ``OPTIMIZERS`` (``'SGD'``,
                ``'AdamW'``...), a dotted import path or a class.
            **kwargs: the local optimizer's arguments (``lr``...) and torch's
                (``process_group``, ``parameters_as_bucket_view``, ``overlap_with_ddp``).
        """

        def __init__(
            self, params: Params, optimizer_type: str | type[Optimizer], **kwargs: Any
        ) -> None:
            super().__init__(params, OPTIMIZERS.resolve(optimizer_type), **kwargs)

        def state_dict(self) -> dict[str, Any]:
            """The whole optimizer state, gathered on rank 0 of the process group; ``{}`` on
            the other ranks. A collective: call it on every rank."""
            self.consolidate_state_dict(to=0)
            return super().state_dict() if self.rank == 0 else {}

    ZeroRedundancyOptimizer.__module__ = __name__
    ZeroRedundancyOptimizer.__qualname__ = "ZeroRedundancyOptimizer"  # pickled by this name
    return ZeroRedundancyOptimizer


@OPTIMIZERS.register_module(name="ZeroRedundancyOptimizer")
def build_zero_redundancy_optimizer(
    params: Params, optimizer_type: str | type[Optimizer], **kwargs: Any
) -> Optimizer:
    """A :class:`ZeroRedundancyOptimizer` (registered in ``OPTIMIZERS`` under that name)."""
    return _zero_redundancy_optimizer_class()(params, optimizer_type, **kwargs)
