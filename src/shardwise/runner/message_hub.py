"""MessageHub: the values hooks share during a run (losses, times, the current iteration...).

Scalars keep a short history, so that a logger can average them over its interval; runtime
information is a plain dict. Both go into checkpoints (``checkpoint['message_hub']``), so a
resumed run logs the same averages as an uninterrupted one.

Example::

    hub = MessageHub()
    hub.update_scalar('train/loss', 2.5)
    hub.update_scalar('train/loss', 1.5)
    hub.get_scalar('train/loss').mean()      # 2.0
    hub.update_info('iter', 2)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

__all__ = ["HistoryBuffer", "MessageHub"]

_PLAIN = (type(None), bool, int, float, str)


class HistoryBuffer:
    """The last ``max_length`` values of a scalar, with their counts."""

    def __init__(self, max_length: int = 1000) -> None:
        self._values: deque[float] = deque(maxlen=max_length)
        self._counts: deque[int] = deque(maxlen=max_length)

    def update(self, value: float, count: int = 1) -> None:
        self._values.append(float(value))
        self._counts.append(int(count))

    def current(self) -> float:
        """The latest value."""
        if not self._values:
            raise ValueError("the history is empty")
        return self._values[-1]

    def mean(self, window: int | None = None) -> float:
        """The mean of the last ``window`` values (all kept values when None)."""
        values = list(self._values)[-window:] if window else list(self._values)
        if not values:
            raise ValueError("the history is empty")
        return sum(values) / len(values)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def data(self) -> tuple[list[float], list[int]]:
        return list(self._values), list(self._counts)

    def state_dict(self) -> dict[str, Any]:
        return {"values": list(self._values), "counts": list(self._counts)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._values.clear()
        self._counts.clear()
        self._values.extend(float(v) for v in state["values"])
        self._counts.extend(int(c) for c in state["counts"])


class MessageHub:
    """Scalars with a history (:meth:`update_scalar`) and runtime information
    (:meth:`update_info`)."""

    def __init__(self) -> None:
        self.log_scalars: dict[str, HistoryBuffer] = {}
        self.runtime_info: dict[str, Any] = {}

    def update_scalar(self, key: str, value: float, count: int = 1) -> None:
        self.log_scalars.setdefault(key, HistoryBuffer()).update(value, count)

    def update_scalars(self, values: Mapping[str, float], prefix: str = "") -> None:
        for key, value in values.items():
            self.update_scalar(prefix + key, value)

    def get_scalar(self, key: str) -> HistoryBuffer:
        try:
            return self.log_scalars[key]
        except KeyError:
            raise KeyError(
                f"no scalar {key!r} has been logged; logged: {sorted(self.log_scalars)}"
            ) from None

    def update_info(self, key: str, value: Any) -> None:
        self.runtime_info[key] = value

    def update_info_dict(self, info: Mapping[str, Any]) -> None:
        self.runtime_info.update(info)

    def get_info(self, key: str, default: Any = None) -> Any:
        return self.runtime_info.get(key, default)

    def state_dict(self) -> dict[str, Any]:
        """Scalars and the runtime information made of plain values (loadable with
        ``torch.load(..., weights_only=True)``)."""
        return {
            "log_scalars": {k: v.state_dict() for k, v in self.log_scalars.items()},
            "runtime_info": {k: v for k, v in self.runtime_info.items() if _is_plain(v)},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key, buffer_state in state.get("log_scalars", {}).items():
            buffer = HistoryBuffer()
            buffer.load_state_dict(buffer_state)
            self.log_scalars[key] = buffer
        self.runtime_info.update(state.get("runtime_info", {}))


def _is_plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, list | tuple):
        return all(_is_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False
