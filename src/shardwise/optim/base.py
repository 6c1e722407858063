"""``BaseOptimWrapper``: what every optimizer wrapper offers (mmengine's interface).

A training step calls :meth:`~BaseOptimWrapper.update_params` (or ``backward``, ``step``,
``zero_grad``); parameter schedulers change :attr:`~BaseOptimWrapper.param_groups`;
checkpoints hold :meth:`~BaseOptimWrapper.state_dict`. A wrapper of another kind subclasses
it and implements the four updating methods.

Example::

    >>> import torch
    >>> class PlainWrapper(BaseOptimWrapper):
    ...     def update_params(self, loss):
    ...         self.backward(loss)
    ...         self.step()
    ...         self.zero_grad()
    ...     def backward(self, loss, **kwargs):
    ...         loss.backward(**kwargs)
    ...     def step(self, **kwargs):
    ...         self.optimizer.step(**kwargs)
    ...     def zero_grad(self, **kwargs):
    ...         self.optimizer.zero_grad(**kwargs)
    >>> PlainWrapper(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)).get_lr()
    {'lr': [0.1]}
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch
from torch.optim import Optimizer

__all__ = ["BaseOptimWrapper"]


class BaseOptimWrapper(ABC):
    """Wraps ``optimizer``; subclasses implement how the parameters are updated.

    With several parameter groups the wrapper also tracks ``base_param_settings`` (the
    optimizer's defaults, as mmengine does): it is the last entry of :attr:`param_groups`,
    so parameter schedulers move it too, and :meth:`get_lr` reports it as ``base_lr``.
    """

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer
        self.base_param_settings: dict[str, Any] | None = None
        if len(optimizer.param_groups) > 1:
            self.base_param_settings = {"params": [], **optimizer.defaults}

    @abstractmethod
    def update_params(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Update the parameters from ``loss``."""

    @abstractmethod
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Back-propagate ``loss``."""

    @abstractmethod
    def zero_grad(self, **kwargs: Any) -> None:
        """Zero the gradients (``Optimizer.zero_grad``)."""

    @abstractmethod
    def step(self, **kwargs: Any) -> None:
        """Update the parameters from their gradients (``Optimizer.step``)."""

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The optimizer's param groups, plus ``base_param_settings`` last when it exists."""
        if self.base_param_settings is not None:
            return self.optimizer.param_groups + [self.base_param_settings]
        return self.optimizer.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        """The optimizer's defaults."""
        return self.optimizer.defaults

    def get_lr(self) -> dict[str, list[float]]:
        """``{'lr': [per group]}``, plus ``'base_lr'`` with several groups."""
        result: dict[str, list[float]] = {}
        if self.base_param_settings is not None:
            result["base_lr"] = [self.base_param_settings["lr"]]
        result["lr"] = [group["lr"] for group in self.optimizer.param_groups]
        return result

    def get_momentum(self) -> dict[str, list[float]]:
        """``{'momentum': [per group]}``: ``momentum`` (SGD), ``betas[0]`` (Adam family), or 0."""
        momentum = []
        for group in self.optimizer.param_groups:
            if "momentum" in group:
                momentum.append(group["momentum"])
            elif "betas" in group:
                momentum.append(group["betas"][0])
            else:
                momentum.append(0)
        return {"momentum": momentum}

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state dict, plus ``base_param_settings`` with several groups."""
        state_dict = self.optimizer.state_dict()
        if self.base_param_settings is not None:
            state_dict["base_param_settings"] = dict(self.base_param_settings)
        return state_dict

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a state dict from :meth:`state_dict` (or a bare optimizer state dict).

        ``state_dict`` itself is not modified.
        """
        state_dict = dict(state_dict)
        base = state_dict.pop("base_param_settings", None)
        self.optimizer.load_state_dict(state_dict)
        if base is not None and self.base_param_settings is not None:
            self.base_param_settings.update({k: v for k, v in base.items() if k != "params"})
