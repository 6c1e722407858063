"""Helpers around registries and scopes."""

from __future__ import annotations

import logging

from .default_scope import DefaultScope

__all__ = ["init_default_scope"]

logger = logging.getLogger(__name__)


def init_default_scope(scope: str) -> None:
    """Make ``scope`` the current default scope (an instance named ``scope`` if new)."""
    current = DefaultScope.get_current_instance()
    if current is None or not DefaultScope.check_instance_created(scope):
        DefaultScope.get_instance(scope, scope_name=scope)
    elif current.scope_name != scope:
        logger.warning("the default scope %r is replaced by %r", current.scope_name, scope)
        DefaultScope.get_instance(f"{scope}-{next(DefaultScope._overwrites)}", scope_name=scope)
