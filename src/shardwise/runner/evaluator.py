"""Evaluation: metrics that see every validation batch and return a dict of numbers.

A metric accumulates one result per sample in :meth:`BaseMetric.process`; at the end of the
pass :meth:`BaseMetric.evaluate` gathers the results of every rank (dropping the samples the
distributed sampler repeated to give every rank an equal share) and computes the metrics on
rank 0, which every rank then receives. Names and signatures are mmengine's.

Example::

    @METRICS.register_module()
    class MeanAbsError(BaseMetric):
        def process(self, data_batch, data_samples):
            _, target = data_batch
            self.results.extend((data_samples - target).abs().flatten().tolist())

        def compute_metrics(self, results):
            return {'mae': sum(results) / len(results)}

    val_evaluator = dict(type='MeanAbsError')

An OpenMMLab package's metrics (mmengine's ``BaseMetric``: ``dict(type='Accuracy', topk=(1,))``
under ``default_scope='mmpretrain'``) are evaluated by mmengine's own ``Evaluator``, as under
mmengine's Runner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from shardwise import dist
from shardwise.integrations.openmmlab_compat import PlainRun
from shardwise.registry import EVALUATOR, METRICS

__all__ = ["BaseMetric", "Evaluator", "Accuracy", "MeanLoss", "build_evaluator"]

_PLAIN = PlainRun()
_LABEL_KEYS = ("labels", "label", "targets", "target", "gt_label", "y")
_LOGIT_KEYS = ("logits", "pred_score", "preds", "pred", "scores")


class BaseMetric:
    """Base class of metrics: fill ``self.results`` with one entry per sample in
    :meth:`process`; turn the gathered entries into a dict in :meth:`compute_metrics`.

    Args:
        prefix: prepended to every metric name as ``'{prefix}/{name}'`` (mmengine's rule);
            defaults to the class attribute ``default_prefix``.
    """

    default_prefix: str | None = None

    def __init__(self, prefix: str | None = None, collect_device: str = "cpu") -> None:
        self.prefix = prefix or self.default_prefix
        self.collect_device = collect_device  # accepted for mmengine configs; results are objects
        self.results: list[Any] = []
        self.dataset_meta: dict | None = None

    def process(self, data_batch: Any, data_samples: Any) -> None:
        """Add the results of one batch to ``self.results`` (one entry per sample)."""
        raise NotImplementedError

    def compute_metrics(self, results: list[Any]) -> dict[str, float]:
        """The metrics of all the samples' results."""
        raise NotImplementedError

    def evaluate(self, size: int) -> dict[str, float]:
        """Gather every rank's results, keep the first ``size`` samples (the dataset's own),
        compute the metrics on rank 0, and return them on every rank."""
        gathered = dist.all_gather_object(self.results)
        ordered = [item for group in _interleave(gathered) for item in group]
        results = ordered[:size] if size else ordered
        self.results = []
        if not results:
            raise RuntimeError(
                f"{type(self).__name__} got no results: process() added nothing to "
                "self.results during validation (is the validation dataset empty?)"
            )
        metrics = self.compute_metrics(results) if dist.get_rank() == 0 else None
        metrics = dist.broadcast_object(metrics)
        if self.prefix:
            metrics = {f"{self.prefix}/{k}": v for k, v in metrics.items()}
        return metrics


def _interleave(per_rank: list[list[Any]]) -> list[list[Any]]:
    """Rank r holds samples r, r + W, r + 2W, ...: zip them back into dataset order."""
    longest = max((len(r) for r in per_rank), default=0)
    return [[r[i] for r in per_rank if i < len(r)] for i in range(longest)]


@METRICS.register_module()
class Accuracy(BaseMetric):
    """Top-k classification accuracy, as a fraction in [0, 1].

    Logits come from the model's validation outputs: a tensor ``(batch, classes)`` or a dict
    holding one under ``logits`` (or ``pred_score``, ``preds``, ``pred``, ``scores``). Labels
    come from the batch: the last item of a ``(inputs, labels)`` tuple or a dict entry
    ``labels`` (or ``label``, ``targets``, ``target``, ``gt_label``, ``y``).

    Reports ``accuracy`` for ``topk=1`` and ``accuracy/top{k}`` for each k otherwise.
    """

    def __init__(self, topk: int | Sequence[int] = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.topk = (topk,) if isinstance(topk, int) else tuple(topk)

    def process(self, data_batch: Any, data_samples: Any) -> None:
        logits = _find(data_samples, _LOGIT_KEYS, "logits", "the model's validation outputs")
        labels = _labels(data_batch)
        top = logits.detach().topk(max(self.topk), dim=1).indices.cpu()
        hits = top == labels.detach().cpu().view(-1, 1)
        for row in hits:
            self.results.append(tuple(bool(row[:k].any()) for k in self.topk))

    def compute_metrics(self, results: list[tuple[bool, ...]]) -> dict[str, float]:
        if self.topk == (1,):
            return {"accuracy": sum(r[0] for r in results) / len(results)}
        return {
            f"accuracy/top{k}": sum(r[i] for r in results) / len(results)
            for i, k in enumerate(self.topk)
        }


@METRICS.register_module()
class MeanLoss(BaseMetric):
    """The mean of the ``loss`` the model returns for each validation batch (its forward's
    ``dict(loss=...)``), weighted by the batch size; reported as ``loss``."""

    def process(self, data_batch: Any, data_samples: Any) -> None:
        loss = _find(data_samples, ("loss",), "loss", "the model's validation outputs")
        size = _num_samples(data_batch)
        self.results.extend([float(loss.detach().float().mean())] * size)

    def compute_metrics(self, results: list[float]) -> dict[str, float]:
        return {"loss": sum(results) / len(results)}


def _num_samples(data_batch: Any) -> int:
    if isinstance(data_batch, torch.Tensor):
        return len(data_batch)
    items = data_batch.values() if isinstance(data_batch, Mapping) else data_batch
    for item in items:
        if isinstance(item, torch.Tensor) and item.dim() > 0:
            return len(item)
    return 1


def _find(obj: Any, keys: Sequence[str], what: str, where: str) -> torch.Tensor:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        for key in keys:
            if isinstance(obj.get(key), torch.Tensor):
                return obj[key]
        found = sorted(obj)
    else:
        found = type(obj).__name__
    raise ValueError(
        f"cannot find the {what} in {where} (got {found}); return a tensor or a dict with one "
        f"of the keys {list(keys)}"
    )


def _labels(data_batch: Any) -> torch.Tensor:
    if isinstance(data_batch, Mapping):
        return _find(data_batch, _LABEL_KEYS, "labels", "the data batch")
    if isinstance(data_batch, Sequence) and data_batch and isinstance(data_batch[-1], torch.Tensor):
        return data_batch[-1]
    raise ValueError(
        f"cannot find the labels in the data batch ({type(data_batch).__name__}); yield "
        f"(inputs, labels) tuples or dicts with one of the keys {list(_LABEL_KEYS)}"
    )


@EVALUATOR.register_module()
class Evaluator:
    """Runs several metrics over the same validation pass and merges their dicts.

    Args:
        metrics: a metric, a ``METRICS`` config, or a list of them.
    """

    def __init__(self, metrics: BaseMetric | Mapping[str, Any] | Sequence[Any]) -> None:
        items = metrics if isinstance(metrics, Sequence) else [metrics]
        self.metrics = [m if isinstance(m, BaseMetric) else METRICS.build(m) for m in items]
        self._dataset_meta: dict | None = None
        for metric in self.metrics:
            if not hasattr(metric, "process") or not hasattr(metric, "evaluate"):
                raise TypeError(
                    f"{type(metric).__name__} is not a metric: it needs process() and "
                    "evaluate(size); subclass shardwise.runner.BaseMetric"
                )

    @property
    def dataset_meta(self) -> dict | None:
        """The dataset's meta information (its ``metainfo``), handed to every metric."""
        return self._dataset_meta

    @dataset_meta.setter
    def dataset_meta(self, dataset_meta: dict | None) -> None:
        self._dataset_meta = dataset_meta
        for metric in self.metrics:
            metric.dataset_meta = dataset_meta

    def process(self, data_samples: Any, data_batch: Any = None) -> None:
        """Hand one batch and the model's outputs for it to every metric."""
        for metric in self.metrics:
            metric.process(data_batch, data_samples)

    def evaluate(self, size: int) -> dict[str, float]:
        """Every metric's results over ``size`` samples, merged into one dict."""
        merged: dict[str, float] = {}
        for metric in self.metrics:
            for name, value in metric.evaluate(size).items():
                if name in merged:
                    raise ValueError(
                        f"two metrics report {name!r}; give one of them a prefix "
                        "(dict(type=..., prefix='name'))"
                    )
                merged[name] = value
        return merged


def build_evaluator(evaluator: Evaluator | Any, compat: PlainRun = _PLAIN) -> Any:
    """An :class:`Evaluator` from an evaluator, a metric, a config or a list of them
    (mmengine's ``dict(type='Evaluator', metrics=[...])`` too), or the one the Runner's
    compatibility policy ``compat`` builds over them (mmengine's over an OpenMMLab package's
    metrics). An evaluator object is returned as it is."""
    if isinstance(evaluator, Evaluator) or hasattr(evaluator, "metrics"):
        return evaluator
    if isinstance(evaluator, Mapping) and evaluator.get("type") == "Evaluator":
        evaluator = evaluator["metrics"]
    items = list(evaluator) if isinstance(evaluator, Sequence) else [evaluator]
    metrics = [METRICS.build(m) if isinstance(m, Mapping) else m for m in items]
    return compat.evaluator(metrics, Evaluator)
