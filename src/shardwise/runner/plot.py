"""``shardwise plot``: loss, learning-rate and validation-metric curves from the JSON-lines
logs a run writes (``WORK_DIR/<timestamp>/metrics.jsonl``), drawn into a PNG.

A work dir that was resumed holds one log per run; they are read in order and a later
record of the same iteration replaces an earlier one, so the curves show one continuous run.

Example::

    shardwise plot work_dirs/gpt            # writes work_dirs/gpt/metrics.png
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .hooks.logger_hook import METRICS_FILE

__all__ = ["find_metric_logs", "read_metrics", "plot_metrics"]

_NOT_CURVES = ("mode", "iter", "epoch", "time", "data_time", "memory")


def find_metric_logs(path: str | os.PathLike[str]) -> list[Path]:
    """The metrics logs under ``path``: a ``.jsonl`` file itself, a run's log dir, or every
    run's log dir in a work dir (oldest first)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist; pass a work dir, a log dir or a .jsonl")
    if (path / METRICS_FILE).is_file():
        return [path / METRICS_FILE]
    logs = sorted(path.glob(f"*/{METRICS_FILE}"))
    if not logs:
        raise FileNotFoundError(
            f"no {METRICS_FILE} under {path}: a training run writes one into "
            f"WORK_DIR/<timestamp>/ (LoggerHook); pass the run's work dir"
        )
    return logs


def read_metrics(path: str | os.PathLike[str]) -> dict[str, list[dict[str, Any]]]:
    """``{'train': [...], 'val': [...]}`` records sorted by iteration, later runs winning."""
    by_key: dict[tuple[str, int], dict[str, Any]] = {}
    for log in find_metric_logs(path):
        for number, line in enumerate(log.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(log.read_text(encoding="utf-8").splitlines()):
                    continue  # a line cut short by a crash
                raise ValueError(f"{log}, line {number}: not JSON: {line[:80]!r}") from None
            by_key[(record.get("mode", "train"), int(record.get("iter", 0)))] = record
    out: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    for (mode, _), record in sorted(by_key.items(), key=lambda item: item[0][1]):
        out.setdefault(mode, []).append(record)
    return out


def _curves(records: list[dict[str, Any]], keys: list[str]) -> dict[str, tuple[list, list]]:
    curves: dict[str, tuple[list, list]] = {}
    for key in keys:
        points = [(r["iter"], r[key]) for r in records if isinstance(r.get(key), int | float)]
        if points:
            curves[key] = ([p[0] for p in points], [p[1] for p in points])
    return curves


def plot_metrics(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """Draw the training loss(es), the learning rate(s) and every validation metric against
    the iteration into a PNG; returns its path (default ``<work dir>/metrics.png``)."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "shardwise plot needs matplotlib, an optional extra: pip install 'shardwise[plot]' "
            "(or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(path)
    train, val = records.get("train", []), records.get("val", [])
    train_keys = sorted({k for r in train for k in r})
    losses = _curves(train, [k for k in train_keys if "loss" in k])
    lrs = _curves(train, [k for k in train_keys if k == "lr" or k.endswith(".lr")])
    val_keys = sorted({k for r in val for k in r if k not in _NOT_CURVES})
    metrics = _curves(val, [k for k in val_keys if not k.endswith("_per_sec")])
    panels = [("training loss", losses, False), ("learning rate", lrs, True)]
    panels += [(f"validation {k}", {k: v}, False) for k, v in metrics.items()]
    panels = [p for p in panels if p[1]]
    if not panels:
        raise ValueError(f"the metrics logs under {path} hold no loss, lr or validation metric")

    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels)), squeeze=False)
    for ax, (title, curves, log_scale) in zip(axes[:, 0], panels):
        for name, (xs, ys) in curves.items():
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=name)
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        if log_scale and all(y > 0 for _, ys in curves.values() for y in ys):
            ax.set_yscale("log")
        if len(curves) > 1:
            ax.legend()
    fig.tight_layout()
    source = Path(path)
    default_dir = source if source.is_dir() else source.parent
    target = Path(out) if out is not None else default_dir / "metrics.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target
