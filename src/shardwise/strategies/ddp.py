"""DDPStrategy: data parallel training with ``DistributedDataParallel`` (CPU/gloo or CUDA/NCCL)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any

import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from shardwise import dist
from shardwise.registry import MODEL_WRAPPERS, STRATEGIES

from .base import BaseStrategy
from .fault_tolerance import FaultTolerance, check_fault_tolerance
from .sync_bn import convert_sync_batchnorm

__all__ = ["DDPStrategy", "ShardwiseDistributedDataParallel"]

_SYNC_BN = ("torch",)


@MODEL_WRAPPERS.register_module(
    name=["ShardwiseDistributedDataParallel", "MMDistributedDataParallel"]
)
class ShardwiseDistributedDataParallel(DistributedDataParallel):
    """``DistributedDataParallel`` that also runs the model's own ``train_step``,
    ``val_step`` and ``test_step`` (mmengine's ``BaseModel`` protocol).

    Inside those methods every ``self(...)`` call of the model goes through DDP's forward,
    so gradients are synchronised exactly as with ``ddp_model(...)``.
    """

    def train_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._call_step("train_step", *args, **kwargs)

    def val_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._call_step("val_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._call_step("test_step", *args, **kwargs)

    def _call_step(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with _forward_through(self):
            return getattr(self.module, name)(*args, **kwargs)


@contextmanager
def _forward_through(wrapper: DistributedDataParallel):
    """Route ``wrapper.module``'s forward through ``wrapper`` while the context is open."""
    module = wrapper.module
    original = module.forward

    def routed(*args: Any, **kwargs: Any) -> Any:
        module.forward = original  # DDP's forward calls module(...) → the real forward
        try:
            return wrapper(*args, **kwargs)
        finally:
            module.forward = routed

    module.forward = routed
    try:
        yield
    finally:
        del module.forward  # back to the class's forward


@STRATEGIES.register_module()
class DDPStrategy(BaseStrategy):
    """Distributed data parallel: every rank holds the whole model; gradients are averaged.

    Args:
        model_wrapper: the wrapper config, ``type`` from ``MODEL_WRAPPERS`` (default
            ``'ShardwiseDistributedDataParallel'``; mmengine's ``'MMDistributedDataParallel'``
            is the same class) plus DDP's keywords (``find_unused_parameters``,
            ``broadcast_buffers``, ``static_graph``, ``gradient_as_bucket_view``, ...).
        sync_bn: ``'torch'`` converts BatchNorm layers to ``SyncBatchNorm`` (on CPU to
            :class:`~shardwise.strategies.sync_bn.CPUSyncBatchNorm`, which gloo can run).
        fault_tolerance: replica-level fault tolerance on torchft (``pip install
            shardwise[ft]``): ``dict(replica_group=..., num_replica_groups=...,
            min_replicas=1, lighthouse='http://host:port')``; this launch is one replica
            group, and :attr:`fault_tolerance` (a
            :class:`~shardwise.strategies.fault_tolerance.FaultTolerance`) runs its steps.

    Example::

        >>> # torchrun --nproc-per-node 2 train.py
        >>> strategy = DDPStrategy(model_wrapper=dict(find_unused_parameters=True))
        >>> model, optim_wrapper = strategy.prepare(
        ...     model, optim_wrapper=dict(optimizer=dict(type='AdamW', lr=1e-3)))
    """

    def __init__(
        self,
        *,
        model_wrapper: Mapping[str, Any] | None = None,
        sync_bn: str | None = None,
        fault_tolerance: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._model_wrapper_cfg = _parse_own_args(model_wrapper, sync_bn)
        self._sync_bn = sync_bn
        #: The checked ``fault_tolerance`` config (None without one), known before ``prepare``.
        self.fault_tolerance_cfg = (
            None if fault_tolerance is None else check_fault_tolerance(fault_tolerance)
        )
        #: The replica group's fault tolerance (None without ``fault_tolerance``).
        self.fault_tolerance: FaultTolerance | None = None
        super().__init__(**kwargs)

    @classmethod
    def _check_kwargs(cls, kwargs: Mapping[str, Any], world_size: int, local_size: int) -> None:
        super()._check_kwargs(kwargs, world_size, local_size)
        _parse_own_args(kwargs.get("model_wrapper"), kwargs.get("sync_bn"))
        if kwargs.get("fault_tolerance") is not None:
            check_fault_tolerance(kwargs["fault_tolerance"])

    def _wrap_model(self, model: nn.Module, compile: Any = False) -> nn.Module:
        return self.compile_model(self._wrap_ddp(model), compile)

    def _wrap_ddp(self, model: nn.Module) -> nn.Module:
        if isinstance(model, DistributedDataParallel):
            return model
        model = model.to(self.device)
        if self._sync_bn == "torch":
            model = convert_sync_batchnorm(model, self.device.type)
        if self.fault_tolerance_cfg is not None:
            self.fault_tolerance = FaultTolerance(
                self.fault_tolerance_cfg, logger=self.logger, device=self.device
            )
            return self.fault_tolerance.wrap_ddp(
                self._model_wrapper_cfg, model, MODEL_WRAPPERS.build
            )
        if not dist.is_distributed():
            self.logger.warning("DDPStrategy without a process group: the model is not wrapped")
            return model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return MODEL_WRAPPERS.build(
            self._model_wrapper_cfg, default_args=dict(module=model, device_ids=device_ids)
        )

    def _register_states(self) -> None:
        super()._register_states()
        if self.fault_tolerance is not None:
            self.fault_tolerance.attach(self.checkpointer, self._wrappers())


def _parse_own_args(model_wrapper: Any, sync_bn: Any) -> dict[str, Any]:
    """The model wrapper's config (its ``type`` defaulted and checked); refuses a bad
    ``sync_bn``."""
    if sync_bn not in (None, *_SYNC_BN):
        raise ValueError(
            f"sync_bn={sync_bn!r} is not supported; use sync_bn='torch' (SyncBatchNorm) or None"
        )
    if model_wrapper is not None and not isinstance(model_wrapper, Mapping):
        raise TypeError(
            f"model_wrapper must be a dict such as dict(find_unused_parameters=True), got "
            f"{model_wrapper!r}"
        )
    cfg = dict(model_wrapper or {})
    cfg.setdefault("type", "ShardwiseDistributedDataParallel")
    MODEL_WRAPPERS.resolve(cfg["type"])  # an unknown type fails here
    return cfg
