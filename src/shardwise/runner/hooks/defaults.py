"""The hooks every run has unless its config says otherwise (mmengine's ``default_hooks``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_HOOKS", "merge_default_hooks", "with_preemption"]

DEFAULT_HOOKS: dict[str, dict[str, Any]] = dict(
    runtime_info=dict(type="RuntimeInfoHook"),
    timer=dict(type="IterTimerHook"),
    sampler_seed=dict(type="DistSamplerSeedHook"),
    logger=dict(type="LoggerHook"),
    param_scheduler=dict(type="ParamSchedulerHook"),
    checkpoint=dict(type="CheckpointHook", interval=1),
    preemption=dict(type="PreemptionHook"),
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


def with_preemption(default_hooks: Any, preemption: Any) -> Any:
    """``default_hooks`` with a config's ``preemption`` options for the preemption hook."""
    if preemption is None:
        return default_hooks
    if not isinstance(preemption, Mapping):
        raise TypeError(
            f"preemption must be a dict such as dict(signals=['SIGTERM', 'SIGUSR1'], "
            f"requeue=True), got {preemption!r}"
        )
    hooks = dict(default_hooks or {})
    hooks["preemption"] = {**dict(hooks.get("preemption") or {}), **preemption}
    return hooks
