"""A stand-in OpenMMLab package's classes, written as mmpretrain writes its own: a
``BaseModel`` with a data preprocessor and dropout, a ``BaseDataset`` with a pipeline (a random
transform, then packing into a data element), a ``BaseMetric`` named ``Accuracy`` (as
shardwise's own metric is), an optimizer wrapper constructor of its own (mmengine's kind, which
builds mmengine's wrapper), a parameter scheduler of its own (mmengine's kind, which takes a
torch optimizer), and a hook that records every loss."""

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.dataset import BaseDataset
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.model import BaseDataPreprocessor, BaseModel
from mmengine.optim import DefaultOptimWrapperConstructor, StepLR
from mmengine.registry import OPTIM_WRAPPERS, OPTIMIZERS
from mmengine.structures import BaseDataElement

from .registry import (
    DATASETS,
    HOOKS,
    METRICS,
    MODELS,
    OPTIM_WRAPPER_CONSTRUCTORS,
    PARAM_SCHEDULERS,
    TRANSFORMS,
)


@DATASETS.register_module()
class Blobs(BaseDataset):
    """``n`` points in 4-d around one of 3 centres; the label is the centre."""

    def __init__(self, n: int = 24, **kwargs):
        self.n = n
        super().__init__(**kwargs)

    def load_data_list(self):
        rng = np.random.RandomState(0)
        labels = rng.randint(0, 3, self.n)
        points = rng.normal(size=(self.n, 4)) + 2.0 * np.eye(3, 4)[labels]
        return [dict(x=p.astype(np.float32), label=int(y)) for p, y in zip(points, labels)]


@TRANSFORMS.register_module()
class Jitter:
    """Adds NumPy noise (NumPy's global generator, as OpenMMLab's random transforms use)."""

    def __call__(self, results):
        results["x"] = results["x"] + np.random.normal(scale=0.1, size=4).astype(np.float32)
        return results


@TRANSFORMS.register_module()
class Pack:
    def __call__(self, results):
        sample = BaseDataElement(gt_label=torch.tensor(results["label"]))
        return dict(inputs=torch.from_numpy(results["x"]), data_samples=sample)


@MODELS.register_module()
class StackInputs(BaseDataPreprocessor):
    def forward(self, data, training=False):
        data = self.cast_data(data)
        return dict(inputs=torch.stack(data["inputs"]), data_samples=data["data_samples"])


@MODELS.register_module()
class TinyClassifier(BaseModel):
    def __init__(self, data_preprocessor=None, init_cfg=None):
        super().__init__(data_preprocessor=data_preprocessor or dict(type="StackInputs"))
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))

    def init_weights(self):
        nn.init.normal_(self.net[0].weight, std=0.5)  # a draw from torch's generator

    def forward(self, inputs, data_samples=None, mode="tensor"):
        logits = self.net(inputs)
        if mode == "loss":
            labels = torch.stack([sample.gt_label for sample in data_samples])
            return dict(loss=F.cross_entropy(logits, labels))
        if mode == "predict":
            for sample, row in zip(data_samples, logits):
                sample.pred = row
            return data_samples
        return logits


@METRICS.register_module()
class Accuracy(BaseMetric):
    default_prefix = "fakemm"

    def process(self, data_batch, data_samples):
        for sample in data_samples:  # dicts: mmengine's Evaluator hands them over so
            self.results.append(int(sample["pred"].argmax()) == int(sample["gt_label"]))

    def compute_metrics(self, results):
        return dict(top1=sum(results) / len(results))


@HOOKS.register_module()
class RecordLosses(Hook):
    """Every iteration's loss and the last validation's metrics, as JSON in ``out``."""

    def __init__(self, out):
        self.out = Path(out)
        self.losses = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.losses.append(float(outputs["loss"]))
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "losses.json").write_text(json.dumps(self.losses))

    def after_val_epoch(self, runner, metrics=None):
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "metrics.json").write_text(
            json.dumps({k: float(v) for k, v in metrics.items()})
        )


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class SlowFirstLayer(DefaultOptimWrapperConstructor):
    """The first layer's parameters at half the learning rate (as mmpretrain's layer-decay
    constructor groups a ViT's layers), built with mmengine's registries."""

    def __call__(self, model):
        first = [p for n, p in model.named_parameters() if n.startswith("net.0.")]
        rest = [p for n, p in model.named_parameters() if not n.startswith("net.0.")]
        groups = [dict(params=first, lr=self.base_lr * 0.5), dict(params=rest)]
        optimizer = OPTIMIZERS.build(dict(self.optimizer_cfg, params=groups))
        wrapper_cfg = dict(self.optim_wrapper_cfg)
        wrapper_cfg.setdefault("type", "OptimWrapper")
        return OPTIM_WRAPPERS.build(wrapper_cfg, default_args=dict(optimizer=optimizer))


@PARAM_SCHEDULERS.register_module()
class HalvingLR(StepLR):
    """Every parameter group's learning rate halved every 3 steps."""

    def __init__(self, optimizer, **kwargs):
        super().__init__(optimizer, step_size=3, gamma=0.5, **kwargs)
