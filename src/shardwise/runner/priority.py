"""Hook priorities, as mmengine names them: a lower value runs earlier."""

from __future__ import annotations

from enum import Enum

__all__ = ["Priority", "get_priority"]


class Priority(Enum):
    """Named hook priorities (``HIGHEST`` = 0 runs first, ``LOWEST`` = 100 runs last)."""

    HIGHEST = 0
    VERY_HIGH = 10
    HIGH = 30
    ABOVE_NORMAL = 40
    NORMAL = 50
    BELOW_NORMAL = 60
    LOW = 70
    VERY_LOW = 90
    LOWEST = 100


def get_priority(priority: int | str | Priority) -> int:
    """The integer value of a priority given as an int (0-100), a name or a :class:`Priority`.

    Example::

        >>> get_priority('VERY_LOW'), get_priority(Priority.HIGH), get_priority(45)
        (90, 30, 45)
    """
    if isinstance(priority, Priority):
        return priority.value
    if isinstance(priority, str):
        try:
            return Priority[priority.upper()].value
        except KeyError:
            names = ", ".join(p.name for p in Priority)
            raise ValueError(
                f"unknown hook priority {priority!r}; use an int from 0 to 100 or one of {names}"
            ) from None
    if isinstance(priority, int) and not isinstance(priority, bool) and 0 <= priority <= 100:
        return priority
    raise ValueError(
        f"hook priority must be an int from 0 (first) to 100 (last), a Priority or its name, "
        f"got {priority!r}"
    )
