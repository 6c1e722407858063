"""MessageHub: the values hooks share during a run (losses, times, the current iteration...).

Scalars keep their history (:class:`HistoryBuffer`), so that a logger can average them over
its interval; runtime information is a plain dict. Both go into checkpoints
(``checkpoint['message_hub']``), so a resumed run logs the same averages as an uninterrupted
one. The names, arguments and statistics are mmengine's (``mmengine.logging.MessageHub`` and
``HistoryBuffer``), so a hook written for mmengine reads the same keys and values here.

Example::

    hub = MessageHub()
    hub.update_scalar('train/loss', 2.5)
    hub.update_scalar('train/loss', torch.tensor(1.5))   # 0-dim tensors, numpy scalars too
    hub.get_scalar('train/loss').mean()      # 2.0
    hub.update_info('iter', 2)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["HistoryBuffer", "MessageHub"]

_PLAIN = (type(None), bool, int, float, str)
_MAX_LENGTH = 1000000  # mmengine's HistoryBuffer default


class HistoryBuffer:
    """The last ``max_length`` values of a scalar, with their counts (mmengine's
    ``HistoryBuffer``: :meth:`mean` is ``sum(values) / sum(counts)`` over the window).

    ``_log_history`` and ``_count_history`` (numpy arrays, as mmengine's) and :attr:`data`
    give the kept history.
    """

    def __init__(
        self,
        log_history: Any = (),
        count_history: Any = (),
        max_length: int = _MAX_LENGTH,
    ) -> None:
        log_history, count_history = list(log_history), list(count_history)
        if len(log_history) != len(count_history):
            raise ValueError(
                f"log_history has {len(log_history)} values and count_history "
                f"{len(count_history)}; give one count per value"
            )
        self.max_length = int(max_length)
        self._values: deque[float] = deque(log_history, maxlen=self.max_length)
        self._counts: deque[int] = deque(count_history, maxlen=self.max_length)

    def update(self, log_val: float, count: int = 1) -> None:
        """Append ``log_val`` (an int or a float) counted ``count`` times."""
        if not _is_real(log_val) or not _is_real(count):
            raise TypeError(
                f"log_val must be int or float but got {type(log_val)}, count must be int but "
                f"got {type(count)}"
            )
        self._values.append(log_val)
        self._counts.append(count)

    @property
    def _log_history(self) -> np.ndarray:
        return np.array(self._values)

    @property
    def _count_history(self) -> np.ndarray:
        return np.array(self._counts)

    @property
    def data(self) -> tuple[np.ndarray, np.ndarray]:
        """``(_log_history, _count_history)``."""
        return self._log_history, self._count_history

    def _window(self, window_size: int | None) -> list[float]:
        if window_size is not None and (
            not isinstance(window_size, int) or isinstance(window_size, bool)
        ):
            raise TypeError(f"The type of window size should be int, but got {type(window_size)}")
        if not self._values:
            raise ValueError(
                "HistoryBuffer._log_history is an empty array! please call update first"
            )
        values = list(self._values)
        return values[-window_size:] if window_size else values

    def current(self) -> float:
        """The latest value."""
        if not self._values:
            raise ValueError(
                "HistoryBuffer._log_history is an empty array! please call update first"
            )
        return self._values[-1]

    def mean(self, window_size: int | None = None) -> float:
        """``sum(values) / sum(counts)`` over the last ``window_size`` entries (all when
        None)."""
        values = self._window(window_size)
        counts = list(self._counts)[-len(values) :]
        return sum(values) / sum(counts)

    def max(self, window_size: int | None = None) -> float:
        """The largest of the last ``window_size`` values (all when None)."""
        return max(self._window(window_size))

    def min(self, window_size: int | None = None) -> float:
        """The smallest of the last ``window_size`` values (all when None)."""
        return min(self._window(window_size))

    def statistics(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """A statistic by name: ``'mean'``, ``'max'``, ``'min'`` or ``'current'``."""
        if method_name not in ("mean", "max", "min", "current"):
            raise KeyError(
                f"{method_name} has not been registered in HistoryBuffer._statistics_methods "
                "(known: mean, max, min, current)"
            )
        return getattr(self, method_name)(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._values)

    def state_dict(self) -> dict[str, Any]:
        return {
            "values": list(self._values),
            "counts": list(self._counts),
            "max_length": self.max_length,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.max_length = int(state.get("max_length", self.max_length))
        self._values = deque(state["values"], maxlen=self.max_length)
        self._counts = deque(state["counts"], maxlen=self.max_length)


class MessageHub:
    """Scalars with a history (:meth:`update_scalar`) and runtime information
    (:meth:`update_info`), as mmengine's ``MessageHub``.

    ``resumed=False`` marks a key that checkpoints leave out (mmengine's meaning).
    """

    def __init__(self) -> None:
        self.log_scalars: dict[str, HistoryBuffer] = {}
        self.runtime_info: dict[str, Any] = {}
        self._resumed_keys: dict[str, bool] = {}

    # ------------------------------------------------------------------ scalars
    def update_scalar(self, key: str, value: Any, count: int = 1, resumed: bool = True) -> None:
        """Append ``value`` (a number, a numpy scalar or a one-element tensor or array) to
        the history of ``key``."""
        checked = _valid_value(key, value)
        if not isinstance(count, int):
            raise TypeError(f"The type of count must be int. but got {type(count)}: {count}")
        self._resumed_keys[key] = resumed
        if key in self.log_scalars:
            self.log_scalars[key].update(checked, count)
        else:
            self.log_scalars[key] = HistoryBuffer([checked], [count])

    def update_scalars(
        self, log_dict: Mapping[str, Any], resumed: bool = True, *, prefix: str = ""
    ) -> None:
        """:meth:`update_scalar` for each entry (``prefix + key``); a value may be
        ``dict(value=..., count=...)``."""
        if not isinstance(log_dict, Mapping):
            raise TypeError(f"`log_dict` must be a dict!, but got {type(log_dict)}")
        for key, value in log_dict.items():
            count = 1
            if isinstance(value, Mapping):
                if "value" not in value:
                    raise KeyError(f"value must be defined in {value}")
                count = int(_valid_value(key, value.get("count", 1)))
                value = value["value"]
            self.update_scalar(prefix + key, value, count, resumed)

    def get_scalar(self, key: str) -> HistoryBuffer:
        try:
            return self.log_scalars[key]
        except KeyError:
            raise KeyError(
                f"{key} is not found in Messagehub.log_buffers: no scalar {key!r} has been "
                f"logged; logged: {sorted(self.log_scalars)}"
            ) from None

    # ------------------------------------------------------------------ runtime information
    def update_info(self, key: str, value: Any, resumed: bool = True) -> None:
        self._resumed_keys[key] = resumed
        self.runtime_info[key] = value

    def update_info_dict(self, info_dict: Mapping[str, Any], resumed: bool = True) -> None:
        if not isinstance(info_dict, Mapping):
            raise TypeError(f"`log_dict` must be a dict!, but got {type(info_dict)}")
        for key, value in info_dict.items():
            self.update_info(key, value, resumed=resumed)

    def get_info(self, key: str, default: Any = None) -> Any:
        return self.runtime_info.get(key, default)

    def pop_info(self, key: str, default: Any = None) -> Any:
        """Remove ``key`` from the runtime information; its value, or ``default``."""
        return self.runtime_info.pop(key, default)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Scalars and the runtime information made of plain values (loadable with
        ``torch.load(..., weights_only=True)``); keys updated with ``resumed=False`` are left
        out."""
        resumed = {k: v for k, v in self._resumed_keys.items() if v}
        return {
            "log_scalars": {
                k: v.state_dict()
                for k, v in self.log_scalars.items()
                if self._resumed_keys.get(k, True)
            },
            "runtime_info": {
                k: v
                for k, v in self.runtime_info.items()
                if self._resumed_keys.get(k, True) and _is_plain(v)
            },
            "resumed_keys": resumed,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key, buffer_state in state.get("log_scalars", {}).items():
            buffer = HistoryBuffer()
            buffer.load_state_dict(buffer_state)
            self.log_scalars[key] = buffer
            self._resumed_keys[key] = True
        for key, value in state.get("runtime_info", {}).items():
            self.update_info(key, value)


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float | np.number)


def _valid_value(key: str, value: Any) -> int | float:
    """``value`` as a Python number: numpy scalars, one-element arrays and tensors are
    converted (mmengine's ``MessageHub._get_valid_value``)."""
    if isinstance(value, np.ndarray | np.number):
        if value.size != 1:
            raise ValueError(f"scalar {key!r} must hold one value, got an array of {value.size}")
        return value.item()
    if isinstance(value, int | float):
        return value
    numel = getattr(value, "numel", None)
    if callable(numel):
        if numel() != 1:
            raise ValueError(f"scalar {key!r} must hold one value, got a tensor of {numel()}")
        return value.item()
    raise TypeError(
        f"scalar {key!r} must be a number, a numpy scalar or a one-element tensor, got "
        f"{type(value).__name__}: {value!r}"
    )


def _is_plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, list | tuple):
        return all(_is_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False
