"""``OptimWrapperDict``: several named optimizer wrappers (e.g. a GAN's generator and
discriminator) saved, loaded and logged as one.

Example::

    >>> import torch
    >>> from shardwise.optim import OptimWrapper, OptimWrapperDict
    >>> gen, disc = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    >>> wrappers = OptimWrapperDict(
    ...     generator=OptimWrapper(torch.optim.Adam(gen.parameters(), lr=1e-3)),
    ...     discriminator=OptimWrapper(torch.optim.SGD(disc.parameters(), lr=0.1)))
    >>> wrappers.get_lr()
    {'generator.lr': [0.001], 'discriminator.lr': [0.1]}
    >>> wrappers['generator'].update_params(gen(torch.randn(1, 2)).sum())
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn

from ..registry import OPTIM_WRAPPERS
from .optim_wrapper import OptimWrapper

__all__ = ["OptimWrapperDict"]


@OPTIM_WRAPPERS.register_module()
class OptimWrapperDict(OptimWrapper):
    """A dict of :class:`OptimWrapper` by name, with mmengine's ``OptimWrapperDict`` surface.

    Which wrapper a loss belongs to is the model's business, so :meth:`update_params`,
    :meth:`backward`, :meth:`step` and :meth:`optim_context` raise ``NotImplementedError``:
    call them on ``wrappers[name]``. :meth:`zero_grad` zeroes every wrapper (as mmengine).
    """

    def __init__(self, **optim_wrappers: OptimWrapper) -> None:
        for name, wrapper in optim_wrappers.items():
            if not isinstance(wrapper, OptimWrapper):
                raise TypeError(
                    f"OptimWrapperDict takes OptimWrapper instances, got {name}="
                    f"{type(wrapper).__name__}; wrap the optimizer first: "
                    f"{name}=OptimWrapper(optimizer)"
                )
        self.optim_wrappers: dict[str, OptimWrapper] = dict(optim_wrappers)

    def _not_here(self, method: str) -> NotImplementedError:
        names = ", ".join(repr(k) for k in self.optim_wrappers) or "<none>"
        return NotImplementedError(
            f"OptimWrapperDict does not know which optimizer `{method}` is for; call it on one "
            f"of its wrappers ({names}), e.g. optim_wrapper[name].{method}(...)"
        )

    def update_params(  # type: ignore[override]
        self,
        loss: torch.Tensor,
        step_kwargs: dict[str, Any] | None = None,
        zero_kwargs: dict[str, Any] | None = None,
    ) -> None:
        raise self._not_here("update_params")

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        raise self._not_here("backward")

    def step(self, **kwargs: Any) -> None:
        raise self._not_here("step")

    def zero_grad(self, **kwargs: Any) -> None:
        """Zero the gradients of every wrapper."""
        for wrapper in self.optim_wrappers.values():
            wrapper.zero_grad(**kwargs)

    @contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        raise self._not_here("optim_context")
        yield  # pragma: no cover

    def initialize_count_status(self, model: nn.Module, cur_iter: int, max_iters: int) -> None:
        """Forward to every wrapper (mmengine's argument names)."""
        for wrapper in self.optim_wrappers.values():
            wrapper.initialize_count_status(model, cur_iter, max_iters)

    @property
    def param_groups(self) -> dict[str, list[dict[str, Any]]]:  # type: ignore[override]
        """``{name: wrapper.param_groups}``."""
        return {name: w.param_groups for name, w in self.optim_wrappers.items()}

    @property
    def defaults(self) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        return {name: w.defaults for name, w in self.optim_wrappers.items()}

    def get_lr(self) -> dict[str, list[float]]:
        """``{'{name}.lr': [...]}`` (and ``'{name}.base_lr'`` where a wrapper has one)."""
        result: dict[str, list[float]] = {}
        for name, wrapper in self.optim_wrappers.items():
            lrs = wrapper.get_lr()
            if "base_lr" in lrs:
                result[f"{name}.base_lr"] = lrs["base_lr"]
            result[f"{name}.lr"] = lrs["lr"]
        return result

    def get_momentum(self) -> dict[str, list[float]]:
        """``{'{name}.momentum': [...]}``."""
        return {
            f"{name}.momentum": w.get_momentum()["momentum"]
            for name, w in self.optim_wrappers.items()
        }

    def get_log_vars(self) -> dict[str, float]:
        """Each wrapper's log scalars, prefixed ``'{name}.'``."""
        return {
            f"{name}.{key}": value
            for name, w in self.optim_wrappers.items()
            for key, value in w.get_log_vars().items()
        }

    def state_dict(self) -> dict[str, Any]:
        """``{name: wrapper.state_dict()}``."""
        return {name: w.state_dict() for name, w in self.optim_wrappers.items()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load ``{name: state_dict}``; every name must be one of this dict's wrappers."""
        unknown = sorted(set(state_dict) - set(self.optim_wrappers))
        if unknown:
            raise KeyError(
                f"state_dict has optimizer wrappers {unknown} that this OptimWrapperDict "
                f"does not have (it has {sorted(self.optim_wrappers)})"
            )
        for name, wrapper_state in state_dict.items():
            self.optim_wrappers[name].load_state_dict(wrapper_state)

    def items(self) -> Iterator[tuple[str, OptimWrapper]]:
        yield from self.optim_wrappers.items()

    def values(self) -> Iterator[OptimWrapper]:
        yield from self.optim_wrappers.values()

    def keys(self) -> Iterator[str]:
        yield from self.optim_wrappers.keys()

    def __getitem__(self, key: str) -> OptimWrapper:
        if key not in self.optim_wrappers:
            raise KeyError(
                f"no optimizer wrapper named {key!r} in this OptimWrapperDict; it has "
                f"{sorted(self.optim_wrappers)}"
            )
        return self.optim_wrappers[key]

    def __contains__(self, key: object) -> bool:
        return key in self.optim_wrappers

    def __len__(self) -> int:
        return len(self.optim_wrappers)

    def __iter__(self) -> Iterator[str]:
        return iter(self.optim_wrappers)

    def __repr__(self) -> str:
        return "".join(f"name: {name}\n{w!r}" for name, w in self.optim_wrappers.items())
