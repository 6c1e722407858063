"""Parameter schedulers (mmengine-compatible)."""

__all__: list[str] = []
