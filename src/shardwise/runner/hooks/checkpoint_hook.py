"""CheckpointHook: periodic, last and best checkpoints, with a limit on how many are kept."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from shardwise.checkpoint.retention import check_max_keep_ckpts
from shardwise.registry import HOOKS

from .hook import Hook

__all__ = ["CheckpointHook"]

_GREATER_KEYS = ("acc", "top", "AR@", "auc", "precision", "mAP", "mDice", "mIoU", "mAcc", "aAcc")
_LESS_KEYS = ("loss",)
_RULES = {"greater": lambda new, best: new > best, "less": lambda new, best: new < best}


@HOOKS.register_module()
class CheckpointHook(Hook):
    """Save checkpoints every ``interval`` epochs or iterations, at the end, and the best one.

    Args:
        interval: epochs (``by_epoch=True``) or iterations between saves; -1: never
            (``save_last`` and ``save_best`` still apply).
        by_epoch: count ``interval`` in epochs or in iterations.
        save_optimizer, save_param_scheduler: store their state (needed to resume).
        out_dir: where checkpoints go (default: the work dir).
        max_keep_ckpts: keep only the newest N periodic checkpoints (-1: all; None: the
            strategy's ``max_keep_ckpts``). The strategy's checkpoint engine deletes the
            outdated ones once the newer one is committed, and so does it for the previous best
            checkpoint (see :mod:`shardwise.checkpoint.retention`).
        save_last: always save after the last epoch or iteration.
        save_best: a metric name, a list of them, or ``'auto'`` (the first metric): keep the
            checkpoint with the best value as ``best_{metric}_{epoch|iter}_{n}.pth``.
        rule: ``'greater'`` or ``'less'`` (one, or one per ``save_best`` key); inferred from
            the metric name when None (``acc``, ``top``, ``mAP``... greater; ``loss`` less).
        filename_tmpl: default ``'epoch_{}.pth'`` / ``'iter_{}.pth'``.
        save_begin: the first epoch or iteration that may be saved periodically.
        async_save: handed to the strategy's ``save_checkpoint(async_save=...)`` when set
            (None: the strategy's default); with True, training blocks only while the state
            is copied to host memory.

    mmengine's ``greater_keys``, ``less_keys`` extend the inference lists; ``published_keys``,
    ``file_client_args``, ``backend_args`` and ``sync_buffer`` are accepted and ignored.
    """

    priority = "VERY_LOW"

    def __init__(
        self,
        interval: int = -1,
        by_epoch: bool = True,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        out_dir: str | None = None,
        max_keep_ckpts: int | None = None,
        save_last: bool = True,
        save_best: str | list[str] | None = None,
        rule: str | list[str] | None = None,
        greater_keys: list[str] | None = None,
        less_keys: list[str] | None = None,
        filename_tmpl: str | None = None,
        save_begin: int = 0,
        async_save: bool | None = None,
        published_keys: Any = None,
        file_client_args: dict | None = None,
        backend_args: dict | None = None,
        sync_buffer: bool = False,
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kwargs) - {"create_symlink"})  # an old mmengine option
        if unknown:
            raise TypeError(
                f"CheckpointHook got unknown arguments {unknown}; see "
                "help(shardwise.runner.CheckpointHook) for the accepted ones"
            )
        self.interval = interval
        self.by_epoch = by_epoch
        self.save_optimizer = save_optimizer
        self.save_param_scheduler = save_param_scheduler
        self.out_dir = out_dir
        if max_keep_ckpts is not None:
            check_max_keep_ckpts(max_keep_ckpts)
        self.max_keep_ckpts = max_keep_ckpts
        self.save_last = save_last
        self.filename_tmpl = filename_tmpl or ("epoch_{}.pth" if by_epoch else "iter_{}.pth")
        self.save_begin = save_begin
        self.async_save = async_save
        self.greater_keys = tuple(greater_keys or ()) + _GREATER_KEYS
        self.less_keys = tuple(less_keys or ()) + _LESS_KEYS
        self.save_best = [save_best] if isinstance(save_best, str) else list(save_best or [])
        rules = [rule] * len(self.save_best) if rule is None or isinstance(rule, str) else rule
        if len(rules) != len(self.save_best):
            raise ValueError(
                f"rule has {len(rules)} entries for {len(self.save_best)} save_best keys; give "
                "one rule, or one per key"
            )
        bad = [r for r in rules if r is not None and r not in _RULES]
        if bad:
            raise ValueError(f"rule must be 'greater', 'less' or None (inferred), got {bad}")
        if "auto" in self.save_best and len(self.save_best) > 1:
            raise ValueError("save_best='auto' cannot be combined with other keys")
        self.rules: list[str | None] = list(rules)

    def before_run(self, runner) -> None:
        self.out_dir = str(Path(self.out_dir or runner.work_dir).absolute())

    # ------------------------------------------------------------------ periodic saves
    def after_train_epoch(self, runner) -> None:
        if not self.by_epoch:
            return
        done = runner.epoch + 1
        periodic = done >= self.save_begin and self.every_n_epochs(runner, self.interval)
        if periodic or (self.save_last and self.is_last_train_epoch(runner)):
            self._save(runner, self.filename_tmpl.format(done), by_epoch=True)

    def after_train_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        if self.by_epoch:
            return
        done = runner.iter + 1
        periodic = done >= self.save_begin and self.every_n_train_iters(runner, self.interval)
        if periodic or (self.save_last and self.is_last_train_iter(runner)):
            self._save(runner, self.filename_tmpl.format(done), by_epoch=False)

    def _save(self, runner, filename: str, by_epoch: bool) -> None:
        path = str(Path(self.out_dir) / filename)
        runner.save_checkpoint(
            path,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            by_epoch=by_epoch,
            async_save=self.async_save,
            max_keep_ckpts=self.max_keep_ckpts,
        )
        runner.message_hub.update_info("last_ckpt", path)

    # ------------------------------------------------------------------ best checkpoint
    def after_val_epoch(self, runner, metrics: dict[str, float] | None = None) -> None:
        if not self.save_best or not metrics or runner.train_loop is None:
            return
        keys = [next(iter(metrics))] if self.save_best == ["auto"] else self.save_best
        hub = runner.message_hub
        single = len(keys) == 1
        for key, rule in zip(keys, self.rules):
            if key not in metrics:
                raise KeyError(
                    f"save_best={key!r} is not among the validation metrics {sorted(metrics)}; "
                    "set default_hooks.checkpoint.save_best to one of them (or 'auto')"
                )
            rule = rule or self._infer_rule(key)
            score_key = "best_score" if single else f"best_score_{key}"
            ckpt_key = "best_ckpt" if single else f"best_ckpt_{key}"
            best = hub.get_info(score_key, -math.inf if rule == "greater" else math.inf)
            value = float(metrics[key])
            if not _RULES[rule](value, best):
                continue
            unit, count = ("epoch", runner.epoch) if self.by_epoch else ("iter", runner.iter)
            name = f"best_{key.replace('/', '_')}_{unit}_{count}.pth"
            path = str(Path(self.out_dir) / name)
            hub.update_info(score_key, value)
            hub.update_info(ckpt_key, path)
            runner.save_checkpoint(
                path,
                meta=dict(epoch=runner.epoch, iter=runner.iter),
                async_save=self.async_save,
                max_keep_ckpts=1,
                series=ckpt_key,
            )
            runner.logger.info(
                "The best checkpoint so far (%s = %.4f) is saved to %s", key, value, name
            )

    def _infer_rule(self, key: str) -> str:
        if any(k.lower() in key.lower() for k in self.greater_keys):
            return "greater"
        if any(k.lower() in key.lower() for k in self.less_keys):
            return "less"
        raise ValueError(
            f"cannot tell whether a greater or a smaller {key!r} is better; set "
            "default_hooks.checkpoint.rule='greater' or 'less'"
        )
