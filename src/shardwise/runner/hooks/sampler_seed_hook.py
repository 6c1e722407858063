"""DistSamplerSeedHook: a new shuffle every epoch."""

from __future__ import annotations

from shardwise.registry import HOOKS

from .hook import Hook

__all__ = ["DistSamplerSeedHook"]


@HOOKS.register_module()
class DistSamplerSeedHook(Hook):
    """Before every training epoch, tell the training sampler the epoch (``set_epoch``), so
    that it shuffles differently each epoch and identically on every rank. (The
    iteration-based loop sets the epoch itself each time it restarts the data.)"""

    priority = "NORMAL"

    def before_train_epoch(self, runner) -> None:
        loop = runner.train_loop
        loader = loop.dataloader
        epoch = getattr(loop, "data_epoch", runner.epoch)
        for sampler in (
            getattr(loader, "sampler", None),
            getattr(getattr(loader, "batch_sampler", None), "sampler", None),
        ):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
