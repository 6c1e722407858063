"""The hooks every run has unless its config says otherwise (mmengine's ``default_hooks``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_HOOKS", "merge_default_hooks"]

DEFAULT_HOOKS: dict[str, dict[str, Any]] = dict(
    runtime_info=dict(type="RuntimeInfoHook"),
    timer=dict(type="IterTimerHook"),
    sampler_seed=dict(type="DistSamplerSeedHook"),
    logger=dict(type="LoggerHook"),
    param_scheduler=dict(type="ParamSchedulerHook"),
    checkpoint=dict(type="CheckpointHook", interval=1),
)


def merge_default_hooks(default_hooks: Mapping[str, Any] | None) -> dict[str, Any]:
    """:data:`DEFAULT_HOOKS` with a config's ``default_hooks`` merged in by name: ``None``
    removes a hook, a dict without ``type`` gives options to the default hook of that name,
    anything else replaces it."""
    hooks: dict[str, Any] = copy.deepcopy(DEFAULT_HOOKS)
    for name, hook in (default_hooks or {}).items():
        if hook is None:
            hooks.pop(name, None)
        elif isinstance(hook, Mapping) and "type" not in hook and name in hooks:
            hooks[name] = {**hooks[name], **hook}  # options for a default hook
        else:
            hooks[name] = hook
    return hooks
