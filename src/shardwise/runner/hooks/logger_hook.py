"""LoggerHook: a progress bar, a console line every ``interval`` iterations, a JSON-lines
metrics file and (when installed) TensorBoard.

What rank 0 writes:

- a tqdm progress bar over all training iterations, with ETA, loss and LR, when stdout and
  stderr are a terminal (console lines and warnings are written above it, never into it; in
  a file or a pipe the console lines, which carry the iteration and the ETA, are the
  progress);
- the first iteration of a run that starts from scratch, on the console only (the starting
  loss; the records below stay mmengine's);
- every ``interval`` iterations a console line such as
  ``Iter(train) [ 40/600]  lr: 1.0000e-03  eta: 0:01:52  time: 0.2010  data_time: 0.0008
  tokens_per_sec: 20377  loss: 2.4431`` (averages over the iterations since the last line);
- the same values as one JSON object per line in ``log_dir/metrics.jsonl``:
  ``{"mode": "train", "iter": 40, "epoch": 0, "lr": 0.001, "loss": 2.4431, ...}``, and
  ``{"mode": "val", "iter": 40, "epoch": 0, "accuracy": 0.97}`` after each validation
  (``"mode": "test"`` after a test);
- TensorBoard scalars in ``log_dir/tensorboard`` when ``tensorboard`` is importable;
- each record's numbers, at its ``iter``, to the runner's visualizer's trackers
  (``visualizer=dict(vis_backends=[...])``; see :func:`shardwise.visualization.tracked_scalars`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shardwise.logging import written_above_bar
from shardwise.registry import HOOKS
from shardwise.visualization import tracked_scalars

from .hook import Hook

__all__ = ["LoggerHook", "METRICS_FILE"]

METRICS_FILE = "metrics.jsonl"
_CURRENT = ("lr",)  # shown as their latest value; everything else is averaged
_TIMING = ("time", "data_time", "tokens_per_sec", "samples_per_sec")


@HOOKS.register_module()
class LoggerHook(Hook):
    """Logs training, validation and test values on rank 0; see the module docstring.

    Args:
        interval: iterations between console lines and JSON records.
        ignore_last: skip the record of an epoch's last iterations when they do not complete
            an interval (mmengine's meaning); the run's very last iteration is always logged.
        progress_bar: show a tqdm bar (rank 0 only, in a terminal or a notebook).
        tensorboard: write TensorBoard scalars; ``None`` means "when it is installed".
        log_metric_by_epoch: label validation lines by epoch in an epoch-based loop.

    mmengine's ``interval_exp_name``, ``out_dir``, ``out_suffix``, ``keep_local``,
    ``file_client_args`` and ``backend_args`` are checked as mmengine checks them (same
    exceptions and messages) and kept as attributes; shardwise does not copy the logs to
    ``out_dir``.
    """

    priority = "BELOW_NORMAL"

    def __init__(
        self,
        interval: int = 10,
        ignore_last: bool = True,
        progress_bar: bool = True,
        tensorboard: bool | None = None,
        log_metric_by_epoch: bool = True,
        interval_exp_name: int = 1000,
        out_dir: str | None = None,
        out_suffix: str | Sequence[str] = (".json", ".log", ".py", "yaml"),
        keep_local: bool = True,
        file_client_args: dict | None = None,
        backend_args: dict | None = None,
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
        self.interval = interval
        self.interval_exp_name = interval_exp_name
        self.out_dir = out_dir
        self.out_suffix = out_suffix
        self.keep_local = keep_local
        self.file_client_args = file_client_args
        self.backend_args = backend_args
        self.ignore_last = ignore_last
        self.progress_bar = progress_bar
        self.tensorboard = tensorboard
        self.log_metric_by_epoch = log_metric_by_epoch
        self.json_path: Path | None = None
        self._json = None
        self._writer = None
        self._visualizer = None
        self._hierarchy = False
        self._bar = None
        self._redirect = contextlib.ExitStack()

    # ------------------------------------------------------------------ set-up and tear-down
    def before_run(self, runner) -> None:
        if runner.rank != 0:
            return
        self.json_path = Path(runner.log_dir) / METRICS_FILE
        self._json = open(self.json_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in after_run
        if self.tensorboard is not False:
            self._writer = _summary_writer(Path(runner.log_dir) / "tensorboard", self.tensorboard)
        self._visualizer = getattr(runner, "visualizer", None)
        processor = getattr(runner, "log_processor", None)
        self._hierarchy = bool(getattr(processor, "log_with_hierarchy", False))

    def before_train(self, runner) -> None:
        if runner.rank == 0 and self.progress_bar and _bar_fits_the_console():
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
        self.close()

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
        if runner.rank != 0:
            return
        hub = runner.message_hub
        if self._bar is not None:
            self._bar.update(1)
            postfix = {}
            if "train/loss" in hub.log_scalars:
                postfix["loss"] = f"{hub.get_scalar('train/loss').mean(self.interval):.4f}"
            if "train/lr" in hub.log_scalars:
                postfix["lr"] = f"{hub.get_scalar('train/lr').current():.3e}"
            self._bar.set_postfix(postfix, refresh=False)
        if not self._should_log(runner, batch_idx):
            if runner.iter == 0:  # a fresh run's first iteration: its starting loss, console only
                self._console(runner, self._train_line(runner, batch_idx, self._values(hub, 1)))
            return
        done = runner.iter + 1
        window = max(done - hub.get_info("logger/last_iter", 0), 1)
        hub.update_info("logger/last_iter", done)
        values = self._values(hub, window)
        record = {"mode": "train", "iter": done, "epoch": runner.epoch, **values}
        self._write(record, step=done)
        self._console(runner, self._train_line(runner, batch_idx, values))

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

    def _should_log(self, runner, batch_idx: int) -> bool:
        if self.every_n_train_iters(runner, self.interval):
            return True
        if runner.iter + 1 == runner.max_iters:
            return True
        loader = runner.train_loop.dataloader
        by_epoch = runner.train_loop.by_epoch
        return by_epoch and not self.ignore_last and self.end_of_epoch(loader, batch_idx)

    def _train_line(self, runner, batch_idx: int, values: dict[str, float]) -> str:
        loop = runner.train_loop
        if loop.by_epoch:
            length = len(loop.dataloader)
            head = (
                f"Epoch(train) [{runner.epoch + 1}][{batch_idx + 1:>{len(str(length))}}/{length}]"
            )
        else:
            total = runner.max_iters
            head = f"Iter(train) [{runner.iter + 1:>{len(str(total))}}/{total}]"
        lrs = [k for k in values if k == "lr" or k.endswith(".lr")]
        timing = [k for k in _TIMING if k in values]
        rest = [k for k in values if k not in lrs and k not in timing]
        parts = [head] + [f"{k}: {values[k]:.4e}" for k in lrs]
        if "time" in values:
            remaining = (runner.max_iters - runner.iter - 1) * values["time"]
            parts.append(f"eta: {datetime.timedelta(seconds=int(remaining))}")
        parts += [f"{k}: {_fmt(values[k])}" for k in timing + rest]
        return "  ".join(parts)

    # ------------------------------------------------------------------ validation and test
    def after_val_epoch(self, runner, metrics: dict[str, float] | None = None) -> None:
        training = runner.train_loop is not None and runner.iter > 0
        if training and runner.train_loop.by_epoch and self.log_metric_by_epoch:
            head = f"Epoch(val) [{runner.epoch}]"
        elif training:
            head = f"Iter(val) [{runner.iter}]"
        else:
            head = "Val"
        self._log_metrics(runner, metrics, "val", head)

    def after_test_epoch(self, runner, metrics: dict[str, float] | None = None) -> None:
        self._log_metrics(runner, metrics, "test", "Test")

    def _log_metrics(self, runner, metrics: dict[str, Any] | None, mode: str, head: str) -> None:
        """One console line and one ``mode`` record of the numeric metrics (rank 0)."""
        if runner.rank != 0 or not metrics:
            return
        numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        self._console(runner, "  ".join([head] + [f"{k}: {_fmt(v)}" for k, v in numbers.items()]))
        record = {"mode": mode, "iter": runner.iter, "epoch": runner.epoch, **numbers}
        self._write(record, step=runner.iter, prefix=f"{mode}/")

    # ------------------------------------------------------------------ output
    def _console(self, runner, text: str) -> None:
        runner.logger.info(text)

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
            self._visualizer.add_scalars(scalars, step=step)


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
            f"{file_client_args!r}"
        )
    if file_client_args is not None and backend_args is not None:
        raise ValueError(
            '"file_client_args" and "backend_args" cannot be set at the same time. Give '
            "backend_args only (file_client_args is mmengine's older name)."
        )
    if not isinstance(keep_local, bool):
        raise TypeError(f"keep_local must be a boolean, got {keep_local!r}")
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


def _fmt(value: float) -> str:
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:.0f}"
    if value != 0 and abs(value) < 1e-3:
        return f"{value:.4e}"
    return f"{value:.4f}"


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
