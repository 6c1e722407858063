"""Hooks of OpenMMLab packages (mmengine's ``Hook`` subclasses: mmpretrain's ``PreciseBNHook``,
mmengine's ``EMAHook``...) under shardwise's Runner: what they test of the runner, made true,
and what cannot run, said before the run starts.

- Package hooks test the training loop's class: ``isinstance(runner.train_loop,
  mmengine.runner.EpochBasedTrainLoop)`` (mmpretrain's ``PreciseBNHook`` recomputes the
  BatchNorm statistics only then; its ``VisualizationHook`` picks the step to draw at).
  shardwise's loops are made virtual subclasses of mmengine's loops of the same name when such
  a hook is added (:func:`adopt`); a hook whose module tests loop classes the run's training
  loop is none of (the fault-tolerant loop) is named in one warning (:func:`check`).
- mmengine's ``EMAHook`` deep-copies the model in ``before_run``, which a model sharded by
  FSDP refuses; :func:`check` refuses the run first, on every rank, in one line
  (:class:`PackageHookRefused`).

Example (what ``HookList`` does)::

    adopt(hook)                  # when a package's hook is added
    check(runner, runner.hooks)  # before the first ``before_run``
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from torch.distributed.fsdp import FSDPModule

from shardwise.integrations import openmmlab
from shardwise.integrations.openmmlab_compat import is_package_hook

__all__ = ["PackageHookRefused", "adopt", "check"]

#: mmengine's loop classes a package hook may test ``runner.train_loop`` against.
_MMENGINE_TRAIN_LOOPS = ("EpochBasedTrainLoop", "IterBasedTrainLoop")


class PackageHookRefused(ValueError):
    """A package's hook that cannot run under this run's strategy (every rank alike)."""


def adopt(hook: Any) -> None:
    """Before a package's ``hook`` (an mmengine ``Hook``) runs: shardwise's loops pass its
    ``isinstance`` tests against mmengine's loops of the same name
    (:func:`~shardwise.integrations.openmmlab.pass_as_mmengine_loops`)."""
    if not is_package_hook(hook):
        return
    from ..loops import EpochBasedTrainLoop, IterBasedTrainLoop, TestLoop, ValLoop

    openmmlab.pass_as_mmengine_loops([EpochBasedTrainLoop, IterBasedTrainLoop, ValLoop, TestLoop])


def check(runner: Any, hooks: Iterable[Any]) -> None:
    """Before ``before_run``: refuse a package hook that cannot run under the runner's strategy
    (:class:`PackageHookRefused`), and warn once, naming them, of package hooks whose
    loop-specific work will be skipped (they test the training loop's class against mmengine's
    and this run's loop is none of them)."""
    hooks = [hook for hook in hooks if is_package_hook(hook)]
    model = getattr(runner, "model", None)
    sharded = model is not None and any(isinstance(m, FSDPModule) for m in model.modules())
    for hook in hooks:
        if sharded and _is_mmengine_class(hook, "EMAHook"):
            raise PackageHookRefused(
                f"{type(hook).__name__} (mmengine's EMAHook) cannot run under "
                f"{type(runner.strategy).__name__}: its before_run deep-copies the model, whose "
                "parameters FSDP has sharded (torch: 'FSDP does not support deepcopy'), and "
                "shardwise has no sharded EMA; train with DDPStrategy (EMAHook works there, the "
                "EMA weights saved in every checkpoint) or remove EMAHook from custom_hooks"
            )
    if getattr(runner, "optim_wrapper", None) is None:  # val() or test(): no training loop
        return
    from ..loops import EpochBasedTrainLoop, IterBasedTrainLoop

    loop = runner.train_loop
    stands_in = isinstance(loop, (EpochBasedTrainLoop, IterBasedTrainLoop))  # see adopt()
    skipped = [
        type(hook).__name__
        for hook in hooks
        if (tested := _loop_classes_tested(hook))
        and not stands_in
        and not isinstance(loop, tuple(tested))
    ]
    if skipped:
        runner.logger.warning(
            "%s test(s) the training loop's class against mmengine's %s, and this run's %s is "
            "none of them: what they do for those loops is skipped",
            ", ".join(skipped),
            " and ".join(_MMENGINE_TRAIN_LOOPS),
            type(loop).__name__,
        )


def _is_mmengine_class(obj: Any, name: str) -> bool:
    """Whether ``obj``'s class is, or derives from, mmengine's class ``name``."""
    return any(
        cls.__name__ == name and cls.__module__.partition(".")[0] == "mmengine"
        for cls in type(obj).__mro__
    )


def _loop_classes_tested(hook: Any) -> list[type]:
    """mmengine's training-loop classes that the module of ``hook``'s class holds (imported to
    test ``runner.train_loop`` against them), read from the loaded module."""
    module = sys.modules.get(type(hook).__module__)
    found = []
    for name in _MMENGINE_TRAIN_LOOPS:
        cls = getattr(module, name, None)
        if isinstance(cls, type) and cls.__module__.partition(".")[0] == "mmengine":
            found.append(cls)
    return found
