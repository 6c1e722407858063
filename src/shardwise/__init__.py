"""shardwise: training strategies for PyTorch (CPU, one GPU, DDP, FSDP2)."""

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "build_strategy"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `import shardwise.registry` does not import every strategy.
    if name == "build_strategy":
        from .strategies import build_strategy

        return build_strategy
    raise AttributeError(f"module 'shardwise' has no attribute {name!r}")
