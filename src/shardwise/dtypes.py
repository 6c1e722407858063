"""Dtype names in configs and on the command line: one table, one parser.

Example::

    >>> parse_dtype('bf16', 'mixed_precision.param_dtype')
    torch.bfloat16
    >>> parse_dtype('float12', 'dtype')
    ValueError: dtype='float12' is not a dtype name it accepts; use one of ['float32', ...]
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch

__all__ = ["DTYPE_NAMES", "parse_dtype"]

#: Every name a config may give a floating-point dtype by.
DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
}


def parse_dtype(
    value: Any, what: str = "dtype", *, names: Collection[str] | None = None
) -> torch.dtype | None:
    """The ``torch.dtype`` that ``value`` names (a dtype, a name such as ``'bf16'`` or
    ``'torch.float16'``, or None); ``names`` restricts it to these names (and their dtypes).

    Raises:
        ValueError: an unknown or excluded name or dtype (naming ``what`` and the choices).
        TypeError: neither a dtype, a string nor None.
    """
    table = DTYPE_NAMES if names is None else {name: DTYPE_NAMES[name] for name in names}
    if value is None:
        return None
    if isinstance(value, str):
        dtype = table.get(value.removeprefix("torch.").lower())
    elif isinstance(value, torch.dtype):
        dtype = value if value in table.values() else None
    else:
        raise TypeError(
            f"{what} must be a torch.dtype, a dtype name such as 'bf16' or None, got "
            f"{type(value).__name__}: {value!r}"
        )
    if dtype is None:
        raise ValueError(
            f"{what}={value!r} is not a dtype name it accepts; use one of {list(table)} or "
            "the torch.dtype of one"
        )
    return dtype
