"""LoggerHook: mmengine's LoggerHook over ``runner.log_processor``, plus a progress bar, a
JSON-lines metrics file and (when installed) TensorBoard.

What rank 0 writes:

- every ``interval`` iterations of an epoch (mmengine's ``every_n_inner_iters``; an
  iteration-based loop counts the run's iterations), at an epoch's end when
  ``ignore_last=False`` or the epoch is not longer than ``interval`` (epoch-based loops), and
  at the run's last iteration, the console line :meth:`LogProcessor.get_log_after_iter
  <shardwise.runner.LogProcessor.get_log_after_iter>` makes, such as
  ``Iter(train) [ 40/600]  lr: 1.0000e-03  eta: 0:01:52  time: 0.2010  data_time: 0.0008
  tokens_per_sec: 20377.1234  loss: 2.4431`` (a custom ``LogProcessor`` registered in
  ``LOG_PROCESSORS``, or ``log_processor=dict(custom_cfg=..., window_size=...)``, changes it
  as under mmengine); ``Exp name: ...`` every ``interval_exp_name`` iterations and at an
  epoch's end; the validation and test iterations' lines every ``interval`` iterations and
  :meth:`~shardwise.runner.LogProcessor.get_log_after_epoch`'s line after each validation and
  test;
- the first iteration of a run that starts from scratch, on the console only (the starting
  loss; the records below stay mmengine's);
- before training, one line saying what the training loss in the lines and in
  ``metrics.jsonl`` is: the lines show it smoothed over the log processor's ``window_size``
  iterations (mmengine's), the records the mean since the previous record;
- a tqdm progress bar over all training iterations, with ETA, the loss as the lines show it
  (``loss 2.4431 (smoothed over 10)``) and the LR, when stdout and stderr are a terminal
  (console lines and warnings are written above it, never into it; in a file or a pipe the
  console lines, which carry the iteration and the ETA, are the progress);
- at each logged training iteration one JSON object per line in ``log_dir/metrics.jsonl``:
  ``{"mode": "train", "iter": 40, "epoch": 0, "lr": 0.001, "loss": 2.4431, ...}`` (the
  ``train/`` scalars averaged over the iterations since the last record, learning rates as
  they are; the log processor's own statistics, ``custom_cfg``'s ``log_name`` entries, added),
  and ``{"mode": "val", "iter": 40, "epoch": 0, "accuracy": 0.97}`` after each validation
  (``"mode": "test"`` after a test, whose tag is also written as mmengine writes it, to
  ``log_dir/<timestamp>.json``);
- TensorBoard scalars in ``log_dir/tensorboard`` when ``tensorboard`` is importable;
- each record's numbers, at its ``iter``, to the runner's visualizer's trackers
  (``visualizer=dict(vis_backends=[...])``; see :func:`shardwise.visualization.tracked_scalars`):
  the JSON lines and the trackers hold the same values.

After the run, with ``out_dir``, the log directory's files ending with ``out_suffix`` are
copied to ``out_dir/<the work dir's last directory>/`` (removed locally with
``keep_local=False``), as mmengine copies them; shardwise copies to local paths only.

Where the config does not give ``log_processor``'s ``by_epoch``, the log processor follows
the training loop (``Iter(train)`` lines for an iteration-based loop, where mmengine's
default would print ``Epoch(train)``); see :attr:`LogProcessor.by_epoch_follows_loop
<shardwise.runner.LogProcessor.by_epoch_follows_loop>`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardwise import dist
from shardwise.config import redact_secrets
from shardwise.logging import written_above_bar
from shardwise.registry import HOOKS
from shardwise.visualization import tracked_scalars

from .hook import Hook

__all__ = ["LoggerHook", "METRICS_FILE"]

METRICS_FILE = "metrics.jsonl"
_CURRENT = ("lr",)  # recorded as their latest value; everything else is averaged
_LOCAL_BACKENDS = (None, "local", "disk")
# _END_OF_DATA: mmengine's LoggerHook also logs an iteration-based run at iteration
# len(dataloader) (its batch_idx is the run's iteration there, so "the end of the epoch" is the
# end of the first pass over the data only); shardwise logs an iteration-based run every
# ``interval`` iterations and at its last, as it counts the run as one epoch.


@HOOKS.register_module()
class LoggerHook(Hook):
    """Logs training, validation and test values through ``runner.log_processor`` on rank
    0; see the module docstring.

    Args:
        interval: iterations between console lines and JSON records (within an epoch).
        ignore_last: skip the line of an epoch's last iterations when they do not complete
            an interval (mmengine's meaning); the run's very last iteration is always logged.
        interval_exp_name: iterations between ``Exp name: ...`` lines.
        out_dir: where the logs are copied after the run (joined with the work dir's last
            directory); None: not copied.
        out_suffix: the endings of the files copied.
        keep_local: keep the local files once copied.
        file_client_args, backend_args: mmengine's storage options; only a local backend
            (``backend='local'`` or ``'disk'``) is accepted.
        log_metric_by_epoch: kept for mmengine's configs (shardwise records validation
            metrics at the iteration they were computed).
        progress_bar: show a tqdm bar (rank 0 only, in a terminal or a notebook).
        tensorboard: write TensorBoard scalars; ``None`` means "when it is installed".
    """

    priority = "BELOW_NORMAL"

    def __init__(
        self,
        interval: int = 10,
        ignore_last: bool = True,
        interval_exp_name: int = 1000,
        out_dir: str | os.PathLike[str] | None = None,
        out_suffix: str | Sequence[str] = (".json", ".log", ".py", "yaml"),
        keep_local: bool = True,
        file_client_args: dict | None = None,
        log_metric_by_epoch: bool = True,
        backend_args: dict | None = None,
        progress_bar: bool = True,
        tensorboard: bool | None = None,
    ) -> None:
        _check_logger_args(
            interval,
            ignore_last,
            interval_exp_name,
            out_dir,
            out_suffix,
            keep_local,
            file_client_args,
            backend_args,
        )
        if file_client_args is not None:
            logging.getLogger("shardwise").warning(
                '"file_client_args" will be deprecated in future. Please use "backend_args" instead'
            )
        self.interval = interval
        self.interval_exp_name = interval_exp_name
        self.out_dir = None if out_dir is None else str(out_dir)
        self._out_root = self.out_dir
        self.out_suffix = out_suffix
        self.keep_local = keep_local
        self.file_client_args = file_client_args
        self.backend_args = backend_args
        if self.out_dir is not None:
            self.file_backend = self.file_client = _LocalFiles()
        self.ignore_last = ignore_last
        self.progress_bar = progress_bar
        self.tensorboard = tensorboard
        self.log_metric_by_epoch = log_metric_by_epoch
        self.json_log_path: str | None = None
        self.json_path: Path | None = None
        self._json = None
        self._writer = None
        self._visualizer = None
        self._hierarchy = False
        self._bar = None
        self._window = interval
        self._redirect = contextlib.ExitStack()

    # ------------------------------------------------------------------ set-up and tear-down
    def before_run(self, runner) -> None:
        """Resolve ``out_dir``; open the metrics file, TensorBoard (rank 0)."""
        if self._out_root is not None:
            basename = os.path.basename(str(runner.work_dir).rstrip(os.sep))
            self.out_dir = self.file_backend.join_path(self._out_root, basename)
            runner.logger.info(
                f"Text logs will be saved to {self.out_dir} after the training process."
            )
        self.json_log_path = f"{runner.timestamp}.json"
        if not _rank0():
            return
        self.json_path = Path(runner.log_dir) / METRICS_FILE
        self._json = open(self.json_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in after_run
        if self.tensorboard is not False:
            self._writer = _summary_writer(Path(runner.log_dir) / "tensorboard", self.tensorboard)
        self._visualizer = getattr(runner, "visualizer", None)
        processor = getattr(runner, "log_processor", None)
        self._hierarchy = bool(getattr(processor, "log_with_hierarchy", False))

    def before_train(self, runner) -> None:
        """The log processor follows the loop (when the config left ``by_epoch`` to it); the
        progress bar (rank 0, in a terminal)."""
        processor = getattr(runner, "log_processor", None)
        if getattr(processor, "by_epoch_follows_loop", False):
            by_epoch = getattr(runner.train_loop, "by_epoch", None)
            if isinstance(by_epoch, bool):
                processor.by_epoch = by_epoch
        self._window = _window_size(processor, self.interval)
        if _rank0() and isinstance(getattr(processor, "window_size", None), int):
            runner.logger.info(
                f"Training loss: the log lines show it smoothed over the last {self._window} "
                "iterations (log_processor window_size); metrics.jsonl and shardwise plot "
                "record the mean of the iterations since the previous record (every "
                f"{self.interval})"
            )
        if _rank0() and self.progress_bar and _bar_fits_the_console():
            from tqdm.auto import tqdm

            # console lines and warnings are written above the bar, never into it
            self._redirect = contextlib.ExitStack()
            self._redirect.enter_context(
                written_above_bar(tqdm, [runner.logger, logging.getLogger()])
            )
            self._bar = tqdm(
                total=runner.max_iters,
                initial=runner.iter,
                desc="train",
                unit="it",
                leave=True,
                **_bar_layout(),
            )

    def after_train(self, runner) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._redirect.close()

    def after_run(self, runner) -> None:
        """Close the files; copy the logs to ``out_dir`` (rank 0)."""
        self.close()
        if self.out_dir is None or not _rank0():
            return
        log_dir = Path(runner.log_dir)
        suffixes = (self.out_suffix,) if isinstance(self.out_suffix, str) else self.out_suffix
        copied = []
        for path in sorted(log_dir.rglob("*")):
            if not path.is_file() or not path.name.endswith(tuple(suffixes)):
                continue
            filename = path.relative_to(log_dir).as_posix()
            out_path = self.file_backend.join_path(self.out_dir, filename)
            self.file_backend.put_text(path.read_text(encoding="utf-8"), out_path)
            copied.append(path)
            runner.logger.info(f"The file {path} has been uploaded to {out_path}.")
            if not self.keep_local:
                runner.logger.info(
                    f"{path} was removed due to the `self.keep_local=False`. You can check "
                    f"the running logs in {out_path}"
                )
        if not self.keep_local:
            removed = {path.resolve() for path in copied}
            for handler in runner.logger.handlers:  # the log file is closed before removal
                if isinstance(handler, logging.FileHandler):
                    if Path(handler.baseFilename).resolve() in removed:
                        handler.close()
            for path in copied:
                path.unlink()

    def close(self) -> None:
        """Close the progress bar, the metrics file and the TensorBoard writer."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._redirect.close()
        if self._json is not None:
            self._json.close()
            self._json = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # ------------------------------------------------------------------ training
    def after_train_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        """mmengine's: the experiment name, then the log processor's line at the interval
        (shardwise also: the progress bar, the first and the last iteration, the record)."""
        if not _rank0():
            return
        self._advance_bar(runner)
        if self.every_n_train_iters(runner, self.interval_exp_name) or self.end_of_epoch(
            runner.train_dataloader, batch_idx
        ):
            runner.logger.info(f"Exp name: {runner.experiment_name}")
        if self.every_n_inner_iters(batch_idx, self.interval):
            pass
        elif (
            getattr(runner.train_loop, "by_epoch", True)
            and self.end_of_epoch(runner.train_dataloader, batch_idx)
            and (not self.ignore_last or len(runner.train_dataloader) <= self.interval)
        ):
            pass  # the epoch's last iterations (mmengine's rule; see _END_OF_DATA)
        elif runner.iter + 1 == runner.max_iters:
            pass  # the run's last iteration (shardwise's)
        else:
            if runner.iter == 0:  # a fresh run's first iteration: its starting loss, console only
                _, log_str = runner.log_processor.get_log_after_iter(runner, batch_idx, "train")
                runner.logger.info(log_str)
            return
        tag, log_str = runner.log_processor.get_log_after_iter(runner, batch_idx, "train")
        runner.logger.info(log_str)
        if self._json is None:  # no metrics file (before_run did not run): mmengine's way
            runner.visualizer.add_scalars(tag, step=runner.iter + 1, file_path=self.json_log_path)
            return
        hub = runner.message_hub
        done = runner.iter + 1
        window = max(done - hub.get_info("logger/last_iter", 0), 1)
        hub.update_info("logger/last_iter", done)
        values = self._values(hub, window)
        for key, value in tag.items():  # the log processor's own statistics (custom_cfg)
            name = key[len("train/") :] if key.startswith("train/") else key
            if name not in values and name not in ("epoch", "iter") and _is_number(value):
                values[name] = value
        record = {"mode": "train", "iter": done, "epoch": runner.epoch, **values}
        self._write(record, step=done)

    def _advance_bar(self, runner) -> None:
        if self._bar is None:
            return
        hub = runner.message_hub
        self._bar.update(1)
        postfix = []  # the loss as the log lines show it
        if "train/loss" in hub.log_scalars:
            loss = hub.get_scalar("train/loss").mean(self._window)
            postfix.append(f"loss {loss:.4f} (smoothed over {self._window})")
        if "train/lr" in hub.log_scalars:
            postfix.append(f"lr {hub.get_scalar('train/lr').current():.3e}")
        self._bar.set_postfix_str(", ".join(postfix), refresh=False)

    @staticmethod
    def _values(hub, window: int) -> dict[str, float]:
        """The ``train/`` scalars: learning rates as they are now, the rest averaged over the
        last ``window`` iterations."""
        values = {}
        for key, buffer in hub.log_scalars.items():
            if key.startswith("train/"):
                name = key[len("train/") :]
                current = name in _CURRENT or name.endswith(".lr")
                values[name] = buffer.current() if current else buffer.mean(window)
        return values

    # ------------------------------------------------------------------ validation and test
    def after_val_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        """The log processor's line every ``interval`` validation iterations."""
        if _rank0() and self.every_n_inner_iters(batch_idx, self.interval):
            _, log_str = runner.log_processor.get_log_after_iter(runner, batch_idx, "val")
            runner.logger.info(log_str)

    def after_test_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        """The log processor's line every ``interval`` test iterations."""
        if _rank0() and self.every_n_inner_iters(batch_idx, self.interval):
            _, log_str = runner.log_processor.get_log_after_iter(runner, batch_idx, "test")
            runner.logger.info(log_str)

    def after_val_epoch(self, runner, metrics: dict[str, float] | None = None) -> None:
        """The log processor's line of the validation; the ``val`` record."""
        if not _rank0():
            return
        tag, log_str = runner.log_processor.get_log_after_epoch(
            runner, len(runner.val_dataloader), "val"
        )
        runner.logger.info(log_str)
        if self._json is None:  # no metrics file (before_run did not run): mmengine's way
            trained = not _train_loop_unbuilt(runner)
            position = runner.epoch if self.log_metric_by_epoch else runner.iter
            runner.visualizer.add_scalars(
                tag, step=position if trained else 0, file_path=self.json_log_path
            )
            return
        self._record_metrics(runner, metrics, "val")

    def after_test_epoch(self, runner, metrics: dict[str, float] | None = None) -> None:
        """The log processor's line of the test; its tag in ``log_dir/<timestamp>.json``
        (mmengine's file); the ``test`` record."""
        if not _rank0():
            return
        tag, log_str = runner.log_processor.get_log_after_epoch(
            runner, len(runner.test_dataloader), "test", with_non_scalar=True
        )
        runner.logger.info(log_str)
        json_log_path = self.json_log_path or f"{runner.timestamp}.json"
        with open(os.path.join(runner.log_dir, json_log_path), "w", encoding="utf-8") as file:
            json.dump(self._process_tags(tag), file)
        if self._json is not None:
            self._record_metrics(runner, metrics, "test")

    @staticmethod
    def _process_tags(tags: dict) -> OrderedDict:
        """The tag's values as JSON types (tensors and arrays as lists; others dropped)."""

        def process(value: Any) -> Any:
            if isinstance(value, list | tuple):
                return [process(item) for item in value]
            if isinstance(value, dict):
                return {k: process(v) for k, v in value.items()}
            if isinstance(value, str | int | float | bool) or value is None:
                return value
            if isinstance(value, torch.Tensor | np.ndarray):
                return value.tolist()
            return None

        return OrderedDict(process(tags))

    def _record_metrics(self, runner, metrics: dict[str, Any] | None, mode: str) -> None:
        """One ``mode`` record of the numeric metrics (rank 0)."""
        numbers = {k: v for k, v in (metrics or {}).items() if _is_number(v)}
        if numbers:
            record = {"mode": mode, "iter": runner.iter, "epoch": runner.epoch, **numbers}
            self._write(record, step=runner.iter, prefix=f"{mode}/")

    # ------------------------------------------------------------------ output
    def _write(self, record: dict[str, Any], step: int, prefix: str = "train/") -> None:
        if self._json is not None:
            self._json.write(json.dumps(record) + "\n")
            self._json.flush()
        if self._writer is not None:
            for key, value in record.items():
                if key not in ("mode", "iter", "epoch") and isinstance(value, int | float):
                    self._writer.add_scalar(prefix + key, value, step)
        if self._visualizer is not None:  # the trackers get what the JSON line has
            scalars = tracked_scalars(record, prefix if self._hierarchy else "")
            self._visualizer.add_scalars(scalars, step=step, file_path=self.json_log_path)


def _window_size(processor: Any, default: int) -> int:
    """The iterations the log processor smooths the training loss over (``default`` for a
    processor without ``window_size``)."""
    window = getattr(processor, "window_size", None)
    return window if isinstance(window, int) and window > 0 else default


def _rank0() -> bool:
    """Whether this process logs: rank 0 of the run (mmengine's logger prints there)."""
    return dist.get_rank() == 0


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _train_loop_unbuilt(runner) -> bool:
    """mmengine's check (reading ``runner.epoch`` would build the training loop)."""
    loop = getattr(runner, "_train_loop", None)
    return loop is None or isinstance(loop, dict)


class _LocalFiles:
    """The part of mmengine's file backend LoggerHook uses, for local paths."""

    name = "LocalBackend"

    def join_path(self, filepath: str | os.PathLike[str], *filepaths: str) -> str:
        return os.path.join(filepath, *filepaths)

    def put_text(self, obj: str, filepath: str | os.PathLike[str]) -> None:
        Path(filepath).parent.mkdir(parents=True, exist_ok=True)
        Path(filepath).write_text(obj, encoding="utf-8")


def _bar_fits_the_console() -> bool:
    """Whether a bar can be drawn without breaking the console lines: stdout and stderr are
    both a terminal (a bar redraws itself in place, which a file or a pipe keeps as
    fragments, and lines sent through a pipe reach the terminal in the middle of the bar),
    or tqdm draws into a notebook widget."""
    from tqdm.autonotebook import tqdm
    from tqdm.std import tqdm as text_tqdm

    if tqdm is not text_tqdm:  # a notebook's widget
        return True
    return all(_is_terminal(stream) for stream in (sys.stdout, sys.stderr))


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def _check_logger_args(
    interval: Any,
    ignore_last: Any,
    interval_exp_name: Any,
    out_dir: Any,
    out_suffix: Any,
    keep_local: Any,
    file_client_args: Any,
    backend_args: Any,
) -> None:
    """mmengine's checks of ``LoggerHook``'s arguments, with its exceptions and messages
    (and the value that was given)."""
    if not isinstance(interval, int) or isinstance(interval, bool):
        raise TypeError(f"interval must be an integer, got {type(interval).__name__}: {interval!r}")
    if interval <= 0:
        raise ValueError(f"interval must be greater than 0, got {interval}")
    if not isinstance(ignore_last, bool):
        raise TypeError(f"ignore_last must be a boolean, got {ignore_last!r}")
    if not isinstance(interval_exp_name, int) or isinstance(interval_exp_name, bool):
        raise TypeError(f"interval_exp_name must be an integer, got {interval_exp_name!r}")
    if interval_exp_name <= 0:
        raise ValueError(f"interval_exp_name must be greater than 0, got {interval_exp_name}")
    if out_dir is not None and not isinstance(out_dir, str | os.PathLike):
        raise TypeError(f"out_dir must be a str or Path object, got {out_dir!r}")
    if out_dir is None and file_client_args is not None:
        raise ValueError(
            'file_client_args should be "None" when `out_dir` is not specified, got '
            f"{redact_secrets(file_client_args, storage=True)!r}"
        )
    if file_client_args is not None and backend_args is not None:
        raise ValueError(
            '"file_client_args" and "backend_args" cannot be set at the same time. Give '
            "backend_args only (file_client_args is mmengine's older name)."
        )
    if not isinstance(keep_local, bool):
        raise TypeError(f"keep_local must be a boolean, got {keep_local!r}")
    for name, args in (("file_client_args", file_client_args), ("backend_args", backend_args)):
        if (
            isinstance(args, dict)
            and out_dir is not None
            and args.get("backend") not in _LOCAL_BACKENDS
        ):
            raise ValueError(
                f"LoggerHook({name}={redact_secrets(args, storage=True)!r}): shardwise copies the "
                "logs to a local or shared filesystem; only backend='local' (or 'disk') is "
                "supported. Mount the storage and set out_dir to its path."
            )
    if out_dir is not None and "://" in str(out_dir):
        raise ValueError(
            f"LoggerHook(out_dir={out_dir!r}): shardwise copies the logs to local paths only; "
            "mount the storage and give its path"
        )
    if not isinstance(out_suffix, str) and not (
        isinstance(out_suffix, list | tuple) and all(isinstance(s, str) for s in out_suffix)
    ):
        raise TypeError(
            "out_suffix should be a string or a sequence of string, but got "
            f"{type(out_suffix)}: {out_suffix!r}"
        )


def _bar_layout() -> dict[str, Any]:
    """tqdm's layout options: the terminal's own size and frequent updates (a height where the
    terminal reports none, as some CI ptys do, or tqdm hides the bar)."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError):
        return dict(mininterval=0.2)
    layout: dict[str, Any] = dict(mininterval=0.2)
    if size.columns > 0:
        layout["dynamic_ncols"] = True
    if size.lines <= 0:
        layout["nrows"] = 24
    return layout


def _summary_writer(path: Path, required: bool | None):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        if required:
            raise ImportError(
                "LoggerHook(tensorboard=True) needs the tensorboard package: "
                "pip install 'shardwise[tensorboard]' (or pip install tensorboard)"
            ) from exc
        return None
    return SummaryWriter(str(path))
