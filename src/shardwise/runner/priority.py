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
    """The integer value of a priority given as an int (0-100), a name or a :class:`Priority`
    (mmengine's exceptions: ``ValueError`` out of range, ``TypeError`` for another type,
    ``KeyError`` for an unknown name).

    Example::

        >>> get_priority('VERY_LOW'), get_priority(Priority.HIGH), get_priority(45)
        (90, 30, 45)
    """
    if isinstance(priority, Priority):
        return priority.value
    if isinstance(priority, int) and not isinstance(priority, bool):
        if not 0 <= priority <= 100:
            raise ValueError(
                f"priority must be between 0 and 100 (0 runs first, 100 last), got {priority}"
            )
        return priority
    if isinstance(priority, str):
        try:
            return Priority[priority.upper()].value
        except KeyError:
            names = ", ".join(p.name for p in Priority)
            raise UnknownPriorityError(
                f"unknown hook priority {priority!r}; use an int from 0 to 100 or one of {names}"
            ) from None
    raise TypeError(
        "priority must be an integer or Priority enum value (or its name), got "
        f"{type(priority).__name__}: {priority!r}"
    )


class UnknownPriorityError(KeyError, ValueError):
    """A priority name that :class:`Priority` lacks (a ``KeyError``, as mmengine raises)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
