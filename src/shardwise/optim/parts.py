"""The ``optim_wrapper`` argument of ``prepare`` / ``build_optim_wrapper`` in one shape.

It comes as an ``OptimWrapper``, an ``OptimWrapperDict``, a ``torch.optim.Optimizer``, the
config of one wrapper (``dict(optimizer=...)``, maybe with a built optimizer inside), or a dict
of those by submodule name (several optimizers, e.g. a GAN's). :func:`optim_wrapper_parts`
turns any of them into ``{name: part}`` (the name ``''`` for a single wrapper), each part an
``OptimWrapper``, a torch optimizer or one wrapper's config; everything that looks at the
argument goes through it.

Example::

    >>> optim_wrapper_parts(dict(optimizer=dict(type='SGD', lr=0.1)))
    {'': {'optimizer': {'type': 'SGD', 'lr': 0.1}}}
    >>> optim_wrapper_parts(dict(generator=dict(optimizer=...), discriminator=dict(...)))
    {'generator': {...}, 'discriminator': {...}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .optim_wrapper import OptimWrapper
from .optim_wrapper_dict import OptimWrapperDict

__all__ = ["SINGLE", "is_single_wrapper_config", "optim_wrapper_parts", "part_optimizer"]

#: The name of the only part of a single optimizer wrapper.
SINGLE = ""


def is_single_wrapper_config(cfg: Mapping[str, Any]) -> bool:
    """Whether ``cfg`` configures one wrapper (it has ``optimizer``, ``constructor`` or
    ``type``), not a dict of wrappers by submodule name."""
    return any(key in cfg for key in ("optimizer", "constructor", "type"))


def optim_wrapper_parts(optim_wrapper: Any) -> dict[str, Any]:
    """``{name: OptimWrapper | torch optimizer | one wrapper's config}`` (see the module
    docstring).

    Raises:
        TypeError: ``optim_wrapper`` is none of the accepted kinds.
    """
    if isinstance(optim_wrapper, OptimWrapperDict):
        return dict(optim_wrapper.items())
    if isinstance(optim_wrapper, OptimWrapper | torch.optim.Optimizer):
        return {SINGLE: optim_wrapper}
    if not isinstance(optim_wrapper, Mapping):
        raise TypeError(
            "optim_wrapper must be an OptimWrapper, a torch.optim.Optimizer or a config "
            f"dict, got {type(optim_wrapper).__name__}: {optim_wrapper!r}"
        )
    if is_single_wrapper_config(optim_wrapper):
        return {SINGLE: dict(optim_wrapper)}
    return dict(optim_wrapper)


def part_optimizer(part: Any) -> torch.optim.Optimizer | None:
    """The built optimizer a part holds (None: a config that builds its own)."""
    if isinstance(part, torch.optim.Optimizer):
        return part
    if isinstance(part, OptimWrapper):
        return part.optimizer
    if isinstance(part, Mapping) and isinstance(part.get("optimizer"), torch.optim.Optimizer):
        return part["optimizer"]
    return None
