"""LogProcessor: turns the message hub's scalars into the values and the line a logger writes.

mmengine's ``LogProcessor`` (``log_processor=dict(...)`` in a config, ``runner.log_processor``):
after an iteration, :meth:`LogProcessor.get_log_after_iter` gives ``(tag, log_str)``: the
values to record (smoothed over ``window_size`` iterations for the keys that match
``mean_pattern``, the latest value for the others, plus ``epoch``/``iter``) and the console
line; after a validation or test epoch, :meth:`LogProcessor.get_log_after_epoch` gives the
metrics and their line. The keys, the statistics and the line are mmengine's, so a hook
that calls them (or a config that sets ``custom_cfg``) works unchanged.

Example::

    log_processor = dict(
        window_size=20,
        by_epoch=True,
        custom_cfg=[dict(data_src='loss', method_name='max', log_name='loss_max',
                         window_size='global')],
    )
"""

from __future__ import annotations

import copy
import datetime
import re
from collections import OrderedDict
from itertools import chain
from typing import Any

import numpy as np
import torch

from shardwise.registry import LOG_PROCESSORS

__all__ = ["LogProcessor"]

_MODES = ("train", "val", "test")


@LOG_PROCESSORS.register_module()
class LogProcessor:
    """Formats the logged values of training, validation and testing.

    Args:
        window_size: iterations the values matching ``mean_pattern`` are averaged over.
        by_epoch: ``Epoch(train) [e][i/n]`` headers (iteration within the epoch) or
            ``Iter(train) [i/N]`` (the global iteration).
        custom_cfg: more statistics, each ``dict(data_src=..., method_name='mean' | 'max' |
            'min' | 'current', window_size=int | 'epoch' | 'global', log_name=...)``
            (``log_name`` defaults to ``data_src``, which it then replaces).
        num_digits: digits of the numbers in the line.
        log_with_hierarchy: keep the ``train/``, ``val/``, ``test/`` prefixes in the tag.
        mean_pattern: the keys averaged over ``window_size``; the others show their latest
            value.

    ``by_epoch_follows_loop`` (shardwise): when true, ``LoggerHook`` sets ``by_epoch`` to the
    training loop's before training. The Runner sets it when the config does not give
    ``by_epoch`` (mmengine's default, True, would print ``Epoch(train)`` headers for an
    iteration-based run, whose mmengine configs say ``by_epoch=False``).
    """

    by_epoch_follows_loop: bool = False

    def __init__(
        self,
        window_size: int = 10,
        by_epoch: bool = True,
        custom_cfg: list[dict] | None = None,
        num_digits: int = 4,
        log_with_hierarchy: bool = False,
        mean_pattern: str = r".*(loss|time|data_time|grad_norm).*",
    ) -> None:
        self.window_size = window_size
        self.by_epoch = by_epoch
        self.custom_cfg = list(custom_cfg) if custom_cfg else []
        self.num_digits = num_digits
        self.log_with_hierarchy = log_with_hierarchy
        self.mean_pattern = re.compile(mean_pattern)
        self._check_custom_cfg()

    # ------------------------------------------------------------------ after an iteration
    def get_log_after_iter(self, runner, batch_idx: int, mode: str) -> tuple[dict, str]:
        """``(tag, log_str)`` after iteration ``batch_idx`` of the ``mode`` loop."""
        if mode not in _MODES:
            raise AssertionError(f"mode must be one of {_MODES}, got {mode!r}")
        parsed_cfg = self._parse_windows_size(runner, batch_idx, self.custom_cfg)
        log_tag = self._collect_scalars(parsed_cfg, runner, mode)
        if self.log_with_hierarchy:
            tag = self._collect_scalars(parsed_cfg, runner, mode, True)
        else:
            tag = copy.deepcopy(log_tag)

        lr_parts = []
        for key, value in tag.items():
            if key.endswith("lr"):
                key = self._remove_prefix(key, f"{mode}/")
                log_tag.pop(key)
                lr_parts.append(f"{key}: {value:.{self.num_digits}e}")
        training = _has_train_loop(runner)
        if self.by_epoch:
            length = self._get_dataloader_size(runner, mode)
            cur_iter = str(self._get_iter(runner, batch_idx)).rjust(len(str(length)))
            if mode in ("train", "val"):
                cur_epoch = self._get_epoch(runner, mode)
                epoch_str = f"[{cur_epoch}]"
                if training:  # right-aligned under the widest epoch number
                    epoch_str = epoch_str.rjust(len(str(runner.max_epochs)) + 3, " ")
                tag["epoch"] = cur_epoch
                log_str = f"Epoch({mode}){epoch_str}[{cur_iter}/{length}]  "
            else:
                log_str = f"Epoch({mode}) [{cur_iter}/{length}]  "
        elif mode == "train":
            cur_iter = str(self._get_iter(runner, batch_idx)).rjust(len(str(runner.max_iters)))
            log_str = f"Iter({mode}) [{cur_iter}/{runner.max_iters}]  "
        else:
            length = self._get_dataloader_size(runner, mode)
            cur_iter = str(batch_idx + 1).rjust(len(str(length)))
            log_str = f"Iter({mode}) [{cur_iter}/{length}]  "
        tag["iter"] = runner.iter + 1 if training else 0
        log_str += " ".join(lr_parts) + "  "

        hub = runner.message_hub
        if all(k in log_tag for k in ("time", "data_time")) and "eta" in hub.runtime_info:
            eta = datetime.timedelta(seconds=int(hub.get_info("eta")))
            log_str += f"eta: {eta}  "
            log_str += (
                f"time: {log_tag.pop('time'):.{self.num_digits}f}  "
                f"data_time: {log_tag.pop('data_time'):.{self.num_digits}f}  "
            )
        if torch.cuda.is_available():
            memory = self._get_max_memory(runner)
            log_str += f"memory: {memory}  "
            tag["memory"] = memory
        if mode in ("train", "val"):
            items = []
            for name, value in log_tag.items():
                if mode == "val" and not name.startswith("val/loss"):
                    continue
                if isinstance(value, float):
                    value = f"{value:.{self.num_digits}f}"
                items.append(f"{name}: {value}")
            log_str += "  ".join(items)
        return tag, log_str

    # ------------------------------------------------------------------ after an epoch
    def get_log_after_epoch(
        self, runner, batch_idx: int, mode: str, with_non_scalar: bool = False
    ) -> tuple[dict, str]:
        """``(tag, log_str)`` after a validation or test epoch: the metrics of this epoch (each
        as computed: a metric named ``loss`` is not averaged with earlier epochs' as under
        mmengine), then the mean ``time`` and ``data_time`` of the epoch; ``with_non_scalar``
        adds the metrics that are not one number (kept as runtime information) to the tag."""
        if mode not in ("val", "test"):
            raise AssertionError(
                f"`_get_metric_log_str` only accept val or test mode, but got {mode}"
            )
        length = self._get_dataloader_size(runner, mode)
        if not self.by_epoch:
            log_str = f"Iter({mode}) [{length}/{length}]  "
        elif mode == "val":
            log_str = f"Epoch({mode}) [{self._get_epoch(runner, mode)}][{length}/{length}]  "
        else:
            log_str = f"Epoch({mode}) [{length}/{length}]  "

        custom_cfg = copy.deepcopy(self.custom_cfg)
        custom_keys = [self._remove_prefix(cfg["data_src"], f"{mode}/") for cfg in custom_cfg]
        for key in ("time", "data_time"):  # the epoch's mean
            if key not in custom_keys:
                custom_cfg.append(dict(data_src=key, window_size="epoch", method_name="mean"))
        parsed_cfg = self._parse_windows_size(runner, batch_idx, custom_cfg)
        # this pass's values: its metrics as computed (mmengine averages a metric matching
        # mean_pattern, such as a validation ``loss``, over the last window_size passes)
        scalars = self._collect_scalars(
            parsed_cfg, runner, mode, self.log_with_hierarchy, latest=True
        )
        non_scalars = self._collect_non_scalars(runner, mode)

        tag: dict[str, Any] = OrderedDict()
        time_tag: dict[str, Any] = OrderedDict()
        timing = (f"{mode}/time", f"{mode}/data_time", "time", "data_time")
        for key, value in scalars.items():  # shardwise's throughput with the timings
            (time_tag if key in timing or key.endswith("_per_sec") else tag)[key] = value
        items = []
        for name, value in chain(tag.items(), non_scalars.items(), time_tag.items()):
            if isinstance(value, float):
                value = f"{value:.{self.num_digits}f}"
            if isinstance(value, torch.Tensor | np.ndarray):
                value = f"\n{value}\n"
            items.append(f"{name}: {value}")
        log_str += "  " + "  ".join(items)
        if with_non_scalar:
            tag.update(non_scalars)
        tag.update(time_tag)
        return tag, log_str

    # ------------------------------------------------------------------ collecting
    def _collect_scalars(
        self,
        custom_cfg: list[dict],
        runner,
        mode: str,
        reserve_prefix: bool = False,
        latest: bool = False,
    ) -> dict[str, Any]:
        """The ``mode`` scalars: averaged over ``window_size`` (``mean_pattern``; with
        ``latest``, none is) or the latest value, then the ``custom_cfg`` statistics."""
        custom_cfg = copy.deepcopy(custom_cfg)
        tag: dict[str, Any] = OrderedDict()
        scalars = OrderedDict()
        for prefixed, buffer in runner.message_hub.log_scalars.items():
            if prefixed.startswith(mode):
                key = prefixed if reserve_prefix else self._remove_prefix(prefixed, f"{mode}/")
                scalars[key] = buffer
        for key, buffer in scalars.items():
            if not latest and re.search(self.mean_pattern, key) is not None:
                tag[key] = buffer.mean(self.window_size)
            else:
                tag[key] = buffer.current()
        for log_cfg in custom_cfg:
            data_src = log_cfg.pop("data_src")
            log_name = log_cfg.pop("log_name", data_src)
            if reserve_prefix:
                data_src, log_name = f"{mode}/{data_src}", f"{mode}/{log_name}"
            if data_src in scalars:
                tag[log_name] = scalars[data_src].statistics(**log_cfg)
        return tag

    def _collect_non_scalars(self, runner, mode: str) -> dict[str, Any]:
        """The ``mode`` runtime information (the metrics that are not one number)."""
        infos = OrderedDict()
        for prefixed, value in runner.message_hub.runtime_info.items():
            if prefixed.startswith(mode):
                key = (
                    prefixed
                    if self.log_with_hierarchy
                    else self._remove_prefix(prefixed, f"{mode}/")
                )
                infos[key] = value
        return infos

    @staticmethod
    def _remove_prefix(string: str, prefix: str) -> str:
        return string[len(prefix) :] if string.startswith(prefix) else string

    # ------------------------------------------------------------------ custom_cfg
    def _check_custom_cfg(self) -> None:
        """No ``window_size='epoch'`` when counting iterations; no ``log_name`` twice."""
        seen = set()
        for log_cfg in self.custom_cfg:
            if "data_src" not in log_cfg:
                raise AssertionError(f"each custom_cfg entry needs 'data_src', got {log_cfg}")
            log_name = log_cfg.get("log_name", log_cfg["data_src"])
            if log_name in seen:
                raise AssertionError(
                    f"Found duplicate {log_name} for {log_cfg['data_src']}. Please check your "
                    "`custom_cfg` for `log_processor`: give each statistic its own log_name "
                    "(a data_src without log_name may be overridden only once)"
                )
            seen.add(log_name)
        for log_cfg in self.custom_cfg:
            if not self.by_epoch and log_cfg.get("window_size") == "epoch":
                raise AssertionError("window_size cannot be epoch if LoggerHook.by_epoch is False.")

    def _parse_windows_size(
        self, runner, batch_idx: int, custom_cfg: list[dict] | None = None
    ) -> list[dict]:
        """``custom_cfg`` with ``'epoch'`` (the iterations of this epoch) and ``'global'``
        (all iterations) as numbers."""
        custom_cfg = copy.deepcopy(self.custom_cfg if custom_cfg is None else custom_cfg)
        for log_cfg in custom_cfg:
            window_size = log_cfg.get("window_size")
            if window_size is None or isinstance(window_size, int):
                continue
            if window_size == "epoch":
                log_cfg["window_size"] = batch_idx + 1
            elif window_size == "global":
                log_cfg["window_size"] = runner.iter + 1
            else:
                raise TypeError(
                    f"window_size should be int, epoch or global, but got invalid {window_size}"
                )
        return custom_cfg

    # ------------------------------------------------------------------ positions
    def _get_max_memory(self, runner) -> int:
        """The peak CUDA memory allocated since the last line, in MiB (then reset)."""
        device = getattr(runner.model, "output_device", None)
        memory = torch.cuda.max_memory_allocated(device=device) // (1024 * 1024)
        torch.cuda.reset_peak_memory_stats(device)
        return int(memory)

    def _get_iter(self, runner, batch_idx: int) -> int:
        return batch_idx + 1 if self.by_epoch else runner.iter + 1

    def _get_epoch(self, runner, mode: str) -> int:
        if mode == "train":
            return runner.epoch + 1
        if mode == "val":
            return runner.epoch if _has_train_loop(runner) else 0
        raise ValueError(f"runner mode should be 'train' or 'val', but got {mode}")

    def _get_cur_loop(self, runner, mode: str) -> Any:
        if mode == "train":
            return runner.train_loop
        return runner.val_loop if mode == "val" else runner.test_loop

    def _get_dataloader_size(self, runner, mode: str) -> int:
        return len(self._get_cur_loop(runner, mode).dataloader)


def _has_train_loop(runner) -> bool:
    """Whether the runner's training loop is built (mmengine: ``runner._train_loop`` is
    neither None nor a config)."""
    loop = getattr(runner, "_train_loop", None)
    return not (loop is None or isinstance(loop, dict))
