"""CheckpointHook: periodic, last and best checkpoints, with a limit on how many are kept."""

from __future__ import annotations

import hashlib
import io
import math
import os
import shutil
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

from shardwise.checkpoint.agreement import on_every_rank
from shardwise.checkpoint.retention import check_max_keep_ckpts
from shardwise.checkpoint.storage import (
    check_storage,
    delete_objects,
    exists,
    is_url,
    list_objects,
    object_info,
    protocol_of,
    read_object,
    set_storage_options,
    write_object,
)
from shardwise.config import redact_secrets
from shardwise.registry import HOOKS

from .hook import Hook

__all__ = ["CheckpointHook"]

_LOCAL_BACKENDS = (None, "local", "disk")


@HOOKS.register_module()
class CheckpointHook(Hook):
    """Save checkpoints every ``interval`` epochs or iterations, at the end, and the best one.

    Args:
        interval: epochs (``by_epoch=True``) or iterations between saves; -1: never
            (``save_last`` and ``save_best`` still apply).
        by_epoch: count ``interval`` in epochs or in iterations.
        save_optimizer, save_param_scheduler: store their state (needed to resume).
        out_dir: where checkpoints go: the work dir by default; else, as in mmengine,
            ``out_dir/<last directory of work_dir>``; a local directory or an object-store
            URL (``s3://bucket/ckpts``, any fsspec URL; ``last_checkpoint`` stays in the work
            dir, naming the URL, as mmengine writes it).
        max_keep_ckpts: keep only the newest N periodic checkpoints (-1: all; None: the
            strategy's ``max_keep_ckpts``). The strategy's checkpoint engine deletes the
            outdated ones once the newer one is committed, and so does it for the previous best
            checkpoint (see :mod:`shardwise.checkpoint.retention`); the kept steps are
            published as the runtime information ``keep_ckpt_ids``, as in mmengine.
        save_last: always save after the last epoch or iteration.
        save_best: a metric name, a list of them, or ``'auto'`` (the first metric): keep the
            checkpoint with the best value as ``best_{metric}_{epoch|iter}_{n}.pth``.
        rule: ``'greater'`` or ``'less'`` (one, or one per ``save_best`` key); inferred from
            the metric name when None (``greater_keys``: ``acc``, ``top``, ``mAP``...;
            ``less_keys``: ``loss``).
        greater_keys, less_keys: replace the names the rule is inferred from.
        filename_tmpl: default ``'epoch_{}.pth'`` / ``'iter_{}.pth'``.
        published_keys: after training, also write the last and best checkpoints with only
            these keys, as ``<name>-<sha256[:8]>.pth`` (mmengine's publishing).
        save_begin: the first epoch or iteration that may be saved periodically.
        async_save: handed to the strategy's ``save_checkpoint(async_save=...)`` when set
            (None: the strategy's default); with True, training blocks only while the state
            is copied to host memory.
        file_client_args, backend_args: mmengine's storage options. With a URL ``out_dir``,
            the client's options for it (fsspec's: s3fs's ``endpoint_url``, ``key``,
            ``secret``, ``client_kwargs``...), ``backend`` being absent, ``'fsspec'`` or the
            URL's protocol; with a local ``out_dir``, only ``backend='local'`` (or ``'disk'``).

    The attributes are mmengine's: ``out_dir`` (resolved in ``before_train``),
    ``key_indicators`` and ``rules`` (the ``save_best`` keys and their rules),
    ``best_ckpt_path`` (one key) or ``best_ckpt_path_dict`` (several), ``last_ckpt``,
    ``file_backend`` / ``file_client`` (``join_path``, ``isfile``...).
    """

    out_dir: str
    priority = "VERY_LOW"

    rule_map = {"greater": lambda x, y: x > y, "less": lambda x, y: x < y}
    init_value_map = {"greater": -math.inf, "less": math.inf}
    _default_greater_keys = [
        "acc",
        "top",
        "AR@",
        "auc",
        "precision",
        "mAP",
        "mDice",
        "mIoU",
        "mAcc",
        "aAcc",
    ]
    _default_less_keys = ["loss"]

    def __init__(
        self,
        interval: int = -1,
        by_epoch: bool = True,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        out_dir: str | os.PathLike[str] | None = None,
        max_keep_ckpts: int | None = None,
        save_last: bool = True,
        save_best: str | list[str] | None = None,
        rule: str | list[str] | None = None,
        greater_keys: str | Sequence[str] | None = None,
        less_keys: str | Sequence[str] | None = None,
        file_client_args: dict | None = None,
        filename_tmpl: str | None = None,
        backend_args: dict | None = None,
        published_keys: str | Sequence[str] | None = None,
        save_begin: int = 0,
        async_save: bool | None = None,
        sync_buffer: bool = False,
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kwargs) - {"create_symlink"})  # an old mmengine option
        if unknown:
            raise TypeError(
                f"CheckpointHook got unknown arguments {unknown}; see "
                "help(shardwise.runner.CheckpointHook) for the accepted ones"
            )
        if file_client_args is not None and backend_args is not None:
            raise ValueError(
                '"file_client_args" and "backend_args" cannot be set at the same time. '
                "Give backend_args only (file_client_args is mmengine's older name)."
            )
        for name, args in (("file_client_args", file_client_args), ("backend_args", backend_args)):
            _check_backend_args(name, args, out_dir)
        if max_keep_ckpts is not None:
            check_max_keep_ckpts(max_keep_ckpts)
        if save_begin < 0:
            raise ValueError(f"save_begin should not be less than 0, but got {save_begin}")
        self.interval = interval
        self.by_epoch = by_epoch
        self.save_optimizer = save_optimizer
        self.save_param_scheduler = save_param_scheduler
        self.out_dir = out_dir  # type: ignore[assignment]  # resolved in before_train
        self.max_keep_ckpts = max_keep_ckpts
        self.save_last = save_last
        self.file_client_args = file_client_args
        self.backend_args = backend_args
        self._storage_options = _storage_options(backend_args or file_client_args)
        self.filename_tmpl = filename_tmpl or ("epoch_{}.pth" if by_epoch else "iter_{}.pth")
        self.save_begin = save_begin
        self.async_save = async_save
        self.args = dict(kwargs)
        self.last_ckpt: str | None = None

        save_best = _check_save_best(save_best)
        self.save_best = save_best
        rules = _check_rules(rule, save_best)
        self.greater_keys = _keys(greater_keys, self._default_greater_keys, "greater_keys")
        self.less_keys = _keys(less_keys, self._default_less_keys, "less_keys")
        if save_best is not None:
            self.is_better_than: dict[str, Any] = {}
            self._init_rule(rules, save_best)
            if len(self.key_indicators) == 1:
                self.best_ckpt_path: str | None = None
            else:
                self.best_ckpt_path_dict: dict[str, str | None] = {}
        self.published_keys = _check_published_keys(published_keys)
        self._in_training = False

    def _init_rule(self, rules: list[str | None], key_indicators: list[str]) -> None:
        """``self.rules`` and ``self.key_indicators``: one rule per key, inferred from the
        key when None (exact name first, then substring; case-insensitive), as mmengine."""
        if len(rules) == 1:
            rules = rules * len(key_indicators)
        self.rules: list[str | None] = []
        for rule, key in zip(rules, key_indicators):
            if rule is not None and rule not in self.rule_map:
                raise UnknownRuleError(
                    f"rule must be greater, less or None, but got {rule}. Set "
                    "default_hooks.checkpoint.rule='greater' or 'less'."
                )
            if rule is None and key != "auto":
                rule = self._infer_rule(key)
            if rule is not None:
                self.is_better_than[key] = self.rule_map[rule]
            self.rules.append(rule)
        self.key_indicators = list(key_indicators)

    def _infer_rule(self, key: str) -> str:
        lower = key.lower()
        greater = {k.lower() for k in self.greater_keys}
        less = {k.lower() for k in self.less_keys}
        if lower in greater:
            return "greater"
        if lower in less:
            return "less"
        if any(k in lower for k in greater):
            return "greater"
        if any(k in lower for k in less):
            return "less"
        raise ValueError(
            f"Cannot infer the rule for key {key}, thus a specific rule must be specified: "
            "set default_hooks.checkpoint.rule='greater' or 'less'"
        )

    # ------------------------------------------------------------------ set-up
    def before_train(self, runner) -> None:
        """Resolve ``out_dir`` and take the best and kept checkpoints a resumed run recorded
        in the message hub."""
        self._in_training = True
        work_dir = str(runner.work_dir)
        if self.out_dir is None:
            self.out_dir = work_dir
        elif str(self.out_dir) != work_dir:
            if is_url(self.out_dir) and self._storage_options:
                set_storage_options(str(self.out_dir), self._storage_options)
            basename = os.path.basename(work_dir.rstrip(os.sep))
            self.out_dir = os.path.join(str(self.out_dir), basename)
        self.file_backend = self.file_client = _LocalFiles()
        if is_url(self.out_dir):  # refused on every rank, or on none
            out_dir = self.out_dir
            on_every_rank(lambda: check_storage(out_dir, "out_dir"), f"checking {out_dir}")
            self.file_backend = self.file_client = _ObjectFiles()
        runner.logger.info("Checkpoints will be saved to %s.", self.out_dir)
        hub = runner.message_hub
        if self.save_best is not None:
            if len(self.key_indicators) == 1:
                self.best_ckpt_path = hub.get_info("best_ckpt")
            else:
                for key in self.key_indicators:
                    self.best_ckpt_path_dict[key] = hub.get_info(f"best_ckpt_{key}")
        if self.max_keep_ckpts is not None and self.max_keep_ckpts > 0:
            kept = list(hub.get_info("keep_ckpt_ids") or [])[-self.max_keep_ckpts :]
            self.keep_ckpt_ids: deque[int] = deque(kept, self.max_keep_ckpts)

    def after_train(self, runner) -> None:
        """Publish the last and best checkpoints when ``published_keys`` is set."""
        self._in_training = False
        if self.published_keys is None:
            return
        runner.strategy.wait_for_checkpoint()
        paths = [self.last_ckpt] if self.save_last else []
        paths.append(getattr(self, "best_ckpt_path", None))
        paths += list(getattr(self, "best_ckpt_path_dict", {}).values())
        for path in paths:
            if path is not None and runner.rank == 0:
                self._publish_model(runner, path)

    # ------------------------------------------------------------------ periodic saves
    def after_train_epoch(self, runner) -> None:
        if not self.by_epoch:
            return
        if self.every_n_epochs(runner, self.interval, self.save_begin) or (
            self.save_last and self.is_last_train_epoch(runner)
        ):
            runner.logger.info("Saving checkpoint at %d epochs", runner.epoch + 1)
            self._save_checkpoint(runner)

    def after_train_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        if self.by_epoch:
            return
        if self.every_n_train_iters(runner, self.interval, self.save_begin) or (
            self.save_last and self.is_last_train_iter(runner)
        ):
            runner.logger.info("Saving checkpoint at %d iterations", runner.iter + 1)
            self._save_checkpoint(runner)

    def _save_checkpoint(self, runner) -> None:
        if self.by_epoch:
            step = runner.epoch + 1
            meta = dict(epoch=step, iter=runner.iter)
        else:
            step = runner.iter + 1
            meta = dict(epoch=runner.epoch, iter=step)
        self._save_checkpoint_with_step(runner, step, meta)

    def _save_checkpoint_with_step(self, runner, step: int, meta: dict[str, int]) -> None:
        keep = getattr(self, "keep_ckpt_ids", None)
        if keep is not None and (not keep or keep[-1] != step):
            keep.append(step)  # the deque drops the oldest; the strategy deletes its file
            runner.message_hub.update_info("keep_ckpt_ids", list(keep))
        self.last_ckpt = os.path.join(self.out_dir, self.filename_tmpl.format(step))
        runner.message_hub.update_info("last_ckpt", self.last_ckpt)
        runner.save_checkpoint(
            self.last_ckpt,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            async_save=self.async_save,
            max_keep_ckpts=self.max_keep_ckpts,
        )

    # ------------------------------------------------------------------ best checkpoint
    def after_val_epoch(self, runner, metrics: dict[str, Any] | None = None) -> None:
        """Save the best checkpoint so far (training only: a ``val()`` run saves nothing)."""
        if not metrics:
            if self.save_best:
                runner.logger.warning(
                    "Since `metrics` is an empty dict, the behavior to save the best "
                    "checkpoint will be skipped in this evaluation."
                )
            return
        if not self.save_best or not self._in_training:
            return
        self._save_best_checkpoint(runner, metrics)

    def _save_best_checkpoint(self, runner, metrics: dict[str, Any]) -> None:
        if self.by_epoch:
            ckpt_filename = self.filename_tmpl.format(runner.epoch)
            cur_type, cur_time = "epoch", runner.epoch
        else:
            ckpt_filename = self.filename_tmpl.format(runner.iter)
            cur_type, cur_time = "iter", runner.iter
        meta = dict(epoch=runner.epoch, iter=runner.iter)
        if "auto" in self.key_indicators:
            self._init_rule(self.rules, [next(iter(metrics))])
        hub = runner.message_hub
        single = len(self.key_indicators) == 1
        updated = False
        for key, rule in zip(self.key_indicators, self.rules):
            if key not in metrics:
                raise KeyError(
                    f"save_best={key!r} is not among the validation metrics {sorted(metrics)}; "
                    "set default_hooks.checkpoint.save_best to one of them (or 'auto')"
                )
            score = metrics[key]
            score_key = "best_score" if single else f"best_score_{key}"
            ckpt_key = "best_ckpt" if single else f"best_ckpt_{key}"
            best = hub.get_info(score_key, self.init_value_map[rule])
            if score is None or not self.is_better_than[key](score, best):
                continue
            updated = True
            value = float(score)
            hub.update_info(score_key, value)
            name = f"best_{key}_{ckpt_filename}".replace("/", "_")
            path = os.path.join(self.out_dir, name)
            if single:
                self.best_ckpt_path = path
            else:
                self.best_ckpt_path_dict[key] = path
            hub.update_info(ckpt_key, path)
            runner.save_checkpoint(
                path,
                save_optimizer=False,
                save_param_scheduler=False,
                meta=meta,
                by_epoch=False,
                async_save=self.async_save,
                max_keep_ckpts=1,  # the previous best goes once this one is committed
                series=ckpt_key,
            )
            runner.logger.info(
                "The best checkpoint with %.4f %s at %d %s is saved to %s.",
                value,
                key,
                cur_time,
                cur_type,
                name,
            )
        # the periodic checkpoint of this step, saved before, records the previous best: save
        # it again so that a resumed run knows (and retires) the current one
        if updated and self.last_ckpt is not None:
            self._save_checkpoint_with_step(runner, cur_time, meta)

    # ------------------------------------------------------------------ publishing
    def _publish_model(self, runner, ckpt_path: str) -> None:
        """``ckpt_path`` with only ``published_keys``, as ``<name>-<sha256[:8]>.pth``."""
        if not self.file_backend.isfile(ckpt_path):  # a sharded checkpoint is a directory
            runner.logger.warning(
                "published_keys: %s is not a single-file checkpoint (a sharded one?); it is "
                "not published (publishing rewrites one file). Save a full checkpoint to publish.",
                ckpt_path,
            )
            return
        source = io.BytesIO(read_object(ckpt_path)) if is_url(ckpt_path) else ckpt_path
        checkpoint = torch.load(source, map_location="cpu", weights_only=True)
        removed = [key for key in list(checkpoint) if key not in self.published_keys]
        for key in removed:
            checkpoint.pop(key)
        if removed:
            runner.logger.info(
                "Key %s will be removed because they are not found in published_keys. If you "
                "want to keep them, please set `%s` in published_keys",
                removed,
                removed,
            )
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        sha = hashlib.sha256(buffer.getvalue()).hexdigest()
        final_path = os.path.splitext(ckpt_path)[0] + f"-{sha[:8]}.pth"
        if is_url(final_path):
            write_object(final_path, buffer.getvalue())
        else:
            with open(final_path, "wb") as f:
                f.write(buffer.getvalue())
        runner.logger.info("The checkpoint (%s) is published to %s.", ckpt_path, final_path)


class UnknownRuleError(KeyError, ValueError):
    """A ``rule`` other than ``'greater'``/``'less'`` (a ``KeyError``, as mmengine raises)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class _LocalFiles:
    """The part of mmengine's file backend a checkpoint hook uses, for local paths."""

    name = "LocalBackend"

    def join_path(self, filepath: str | os.PathLike[str], *filepaths: str) -> str:
        return os.path.join(filepath, *filepaths)

    def isfile(self, filepath: str | os.PathLike[str]) -> bool:
        return os.path.isfile(filepath)

    def isdir(self, filepath: str | os.PathLike[str]) -> bool:
        return os.path.isdir(filepath)

    def exists(self, filepath: str | os.PathLike[str]) -> bool:
        return os.path.exists(filepath)

    def remove(self, filepath: str | os.PathLike[str]) -> None:
        os.remove(filepath)

    def rmtree(self, dir_path: str | os.PathLike[str]) -> None:
        shutil.rmtree(dir_path)


class _ObjectFiles:
    """mmengine's file backend methods a checkpoint hook uses, for an ``out_dir`` URL."""

    name = "FsspecBackend"

    def join_path(self, filepath: str, *filepaths: str) -> str:
        return "/".join([str(filepath).rstrip("/"), *filepaths])

    def isfile(self, filepath: str) -> bool:
        return object_info(filepath) is not None

    def isdir(self, filepath: str) -> bool:
        return not self.isfile(filepath) and exists(filepath)

    def exists(self, filepath: str) -> bool:
        return exists(filepath)

    def remove(self, filepath: str) -> None:
        delete_objects([filepath])

    def rmtree(self, dir_path: str) -> None:
        delete_objects([f"{dir_path}/{rel}" for rel in list_objects(dir_path)])


def _check_backend_args(name: str, args: dict | None, out_dir: Any) -> None:
    """mmengine's ``backend_args``: a local backend for a local ``out_dir``; fsspec's
    options (``backend`` absent, ``'fsspec'`` or the URL's protocol) for a URL."""
    if args is None:
        return
    backend = args.get("backend")
    if is_url(out_dir) and backend in (None, "fsspec", protocol_of(out_dir)):
        return
    if not is_url(out_dir) and backend in _LOCAL_BACKENDS:
        return
    raise ValueError(
        f"CheckpointHook({name}={redact_secrets(args, storage=True)!r}, out_dir={out_dir!r}): "
        "shardwise reaches storage "
        "through its paths: a local (or mounted) out_dir with backend='local', or an fsspec "
        "URL such as out_dir='s3://bucket/prefix' with the client's options in backend_args "
        "(backend absent or 'fsspec'; e.g. endpoint_url, key, secret)"
    )


def _storage_options(args: dict | None) -> dict[str, Any]:
    """fsspec's options in mmengine's ``backend_args`` (all but ``backend``)."""
    return {k: v for k, v in (args or {}).items() if k != "backend"}


def _check_save_best(save_best: Any) -> list[str] | None:
    if save_best is None:
        return None
    if isinstance(save_best, str):
        return [save_best]
    if not (isinstance(save_best, list) and all(isinstance(k, str) for k in save_best)):
        raise AssertionError(
            f'"save_best" should be a str or list of str or None, but got {type(save_best)}'
        )
    if "auto" in save_best and len(save_best) != 1:
        raise AssertionError('Only support one "auto" in "save_best" list.')
    if len(save_best) != len(set(save_best)):
        raise AssertionError(f'Find duplicate element in "save_best": {save_best}.')
    return list(save_best)


def _check_rules(rule: Any, save_best: list[str] | None) -> list[str | None]:
    if rule is None or isinstance(rule, str):
        return [rule]
    if not (isinstance(rule, list) and all(isinstance(r, str) for r in rule)):
        raise AssertionError(f'"rule" should be a str or list of str or None, but got {type(rule)}')
    if len(rule) not in (1, len(save_best or [])):
        raise AssertionError(
            f'Number of "rule" must be 1 or the same as number of "save_best", but got {len(rule)}.'
        )
    return list(rule)


def _keys(keys: Any, default: list[str], name: str) -> Sequence[str]:
    """mmengine's handling of ``greater_keys``/``less_keys``: None gives the defaults, a str
    becomes a one-element tuple, a list or tuple is kept."""
    if keys is None:
        return default
    if not isinstance(keys, list | tuple):
        keys = (keys,)
    if not all(isinstance(k, str) for k in keys):
        raise AssertionError(f"{name} must be a str or a sequence of str, got {keys!r}")
    return keys


def _check_published_keys(keys: Any) -> list[str] | None:
    if keys is None:
        return None
    if isinstance(keys, str):
        return [keys]
    if not (isinstance(keys, list | tuple) and all(isinstance(k, str) for k in keys)):
        raise TypeError(
            f'"published_keys" should be a str or a sequence of str or None, but got {type(keys)}'
        )
    if len(keys) != len(set(keys)):
        raise AssertionError(f'Find duplicate elements in "published_keys": {keys}.')
    return list(keys)
