"""``AmpOptimWrapper``: automatic mixed precision (autocast, and a gradient scaler for fp16).

Works on CPU (bf16, or fp16 with ``torch.amp.GradScaler('cpu')``) as well as on CUDA.

Example::

    >>> import torch
    >>> from shardwise.optim import AmpOptimWrapper
    >>> model = torch.nn.Linear(2, 1)
    >>> optim_wrapper = AmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
    ...                                 dtype='bfloat16')
    >>> with optim_wrapper.optim_context(model):
    ...     out = model(torch.randn(3, 2))
    >>> out.dtype
    torch.bfloat16
    >>> optim_wrapper.update_params(out.float().sum())
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from ..dtypes import parse_dtype
from ..registry import OPTIM_WRAPPERS
from .optim_wrapper import OptimWrapper

__all__ = ["AmpOptimWrapper"]

logger = logging.getLogger(__name__)

#: The names ``dtype`` may be (mmengine's).
_VALID_DTYPES = ("float16", "bfloat16", "float32", "float64")
_AUTOCAST_DTYPES = (torch.float16, torch.bfloat16)
_SCALER_KEYS = frozenset(
    name
    for name in inspect.signature(torch.amp.GradScaler.__init__).parameters
    if name not in ("self", "device")
)


def _device_type(tensor: torch.Tensor) -> str:
    """The device type a tensor computes on: a DTensor's mesh device (which stays 'cuda' when
    FSDP2 offloads the shards to CPU), else the tensor's own device."""
    if isinstance(tensor, DTensor):
        return tensor.device_mesh.device_type
    return tensor.device.type


def _resolve_dtype(dtype: str | torch.dtype | None, device_type: str) -> torch.dtype:
    """``dtype`` (float16 or bfloat16 autocast; float32/float64 turn autocasting off), or
    the device's default: float16 on CUDA, bfloat16 on the CPU."""
    if dtype is None:
        return torch.float16 if device_type == "cuda" else torch.bfloat16
    return parse_dtype(dtype, "AmpOptimWrapper dtype", names=_VALID_DTYPES)


def _check_loss_scale(loss_scale: Any) -> None:
    if isinstance(loss_scale, str):
        if loss_scale == "dynamic":
            return
        raise ValueError(
            f"loss_scale {loss_scale!r} is not a known mode; expected 'dynamic', a positive "
            "float (static scale) or a dict of GradScaler arguments"
        )
    if isinstance(loss_scale, int | float) and not isinstance(loss_scale, bool):
        if loss_scale <= 0:
            raise ValueError(f"a static loss_scale must be > 0, got {loss_scale}")
        return
    if isinstance(loss_scale, Mapping):
        unknown = sorted(set(loss_scale) - _SCALER_KEYS)
        if unknown:
            raise ValueError(
                f"loss_scale dict has unknown keys {unknown}; it holds GradScaler arguments: "
                f"{sorted(_SCALER_KEYS)}"
            )
        return
    raise TypeError(
        f"loss_scale must be 'dynamic', a positive float (static scale) or a dict of "
        f"GradScaler arguments ({sorted(_SCALER_KEYS)}), got {loss_scale!r}"
    )


@OPTIM_WRAPPERS.register_module()
class AmpOptimWrapper(OptimWrapper):
    """:class:`OptimWrapper` with automatic mixed precision.

    :meth:`optim_context` runs the forward pass under ``torch.autocast`` on the model's
    device type. A gradient scaler (``torch.amp.GradScaler(device)``, or FSDP's
    ``ShardedGradScaler`` with ``use_fsdp=True``) is created only for float16, which needs
    one; bfloat16 has float32's range and trains without.

    Args:
        loss_scale: used only with float16. ``'dynamic'`` (default): a scaler with default
            arguments; a float: static scaling at that value; a dict: ``GradScaler`` keyword
            arguments (``init_scale``, ``growth_factor``, ``backoff_factor``,
            ``growth_interval``, ``enabled``).
        dtype: ``'float16'``, ``'bfloat16'`` (or the ``torch.dtype``). ``None`` picks float16
            on CUDA and bfloat16 elsewhere (CPU autocast is fastest and safest in bf16).
            ``'float32'`` and ``'float64'`` (accepted as in mmengine) turn autocast off.
        use_fsdp: use ``ShardedGradScaler`` (for FSDP-sharded gradients).
        **kwargs: :class:`OptimWrapper` arguments (``optimizer``, ``accumulative_counts``,
            ``clip_grad``).

    The device type comes from the optimizer's first parameter (a DTensor's mesh device).
    Gradients are unscaled before clipping, so ``clip_grad`` and ``last_grad_norm`` see true
    gradients. :meth:`state_dict` holds the scaler state under ``'loss_scaler'``.
    """

    #: the dtype names ``dtype`` accepts (mmengine's attribute).
    valid_dtypes = _VALID_DTYPES

    def __init__(
        self,
        loss_scale: str | float | Mapping[str, Any] = "dynamic",
        dtype: str | torch.dtype | None = None,
        use_fsdp: bool = False,
        **kwargs: Any,
    ) -> None:
        _check_loss_scale(loss_scale)
        optimizer = kwargs.get("optimizer")
        params = [p for g in getattr(optimizer, "param_groups", []) for p in g["params"]]
        device_type = _device_type(params[0]) if params else "cpu"
        cast_dtype = _resolve_dtype(dtype, device_type)
        super().__init__(**kwargs)
        self.device_type = device_type
        self.cast_dtype = cast_dtype
        self._scale_update_param: float | None = None
        self.loss_scaler: torch.amp.GradScaler | None = None
        if cast_dtype != torch.float16:
            if not isinstance(loss_scale, str):
                logger.warning(
                    "loss_scale=%r is ignored: %s autocast needs no gradient scaler",
                    loss_scale,
                    cast_dtype,
                )
            return
        if use_fsdp:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            scaler_type: type[torch.amp.GradScaler] = ShardedGradScaler
        else:
            scaler_type = torch.amp.GradScaler
        if isinstance(loss_scale, Mapping):
            self.loss_scaler = scaler_type(device_type, **loss_scale)
        elif isinstance(loss_scale, str):  # 'dynamic'
            self.loss_scaler = scaler_type(device_type)
        else:
            self._scale_update_param = float(loss_scale)
            self.loss_scaler = scaler_type(device_type, init_scale=float(loss_scale))

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Back-propagate the (scaled, with float16) loss and count the iteration."""
        if self.loss_scaler is not None:
            loss = self.loss_scaler.scale(loss)
        loss.backward(**kwargs)
        self._after_backward()

    def step(self, **kwargs: Any) -> None:
        """Unscale and clip the gradients if ``clip_grad`` was given, then step (through the
        scaler with float16, which skips steps with non-finite gradients)."""
        if self.loss_scaler is None:
            super().step(**kwargs)
            return
        if self.clip_grad_kwargs is not None:
            self.loss_scaler.unscale_(self.optimizer)
            self._clip_grad()
        self.loss_scaler.step(self.optimizer, **kwargs)
        self.loss_scaler.update(self._scale_update_param)

    @contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        """Autocast to :attr:`cast_dtype` (float16 or bfloat16) on the model's device type, and
        skip gradient synchronisation on accumulation iterations as
        :meth:`OptimWrapper.optim_context`."""
        first = next(iter(model.parameters()), None)
        device_type = self.device_type if first is None else _device_type(first)
        with (
            super().optim_context(model),
            torch.autocast(
                device_type,
                dtype=self.cast_dtype,
                enabled=self.cast_dtype in _AUTOCAST_DTYPES,
                cache_enabled=False,
            ),
        ):
            yield

    def state_dict(self) -> dict[str, Any]:
        """The optimizer state dict, plus the scaler's under ``'loss_scaler'`` (float16)."""
        state_dict = super().state_dict()
        if self.loss_scaler is not None:
            state_dict["loss_scaler"] = self.loss_scaler.state_dict()
        return state_dict

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load the optimizer state and, when both sides have one, the scaler state."""
        state_dict = dict(state_dict)
        scaler_state = state_dict.pop("loss_scaler", None)
        super().load_state_dict(state_dict)
        if scaler_state is not None and self.loss_scaler is not None:
            self.loss_scaler.load_state_dict(scaler_state)
