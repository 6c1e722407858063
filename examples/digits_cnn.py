"""A small CNN with BatchNorm on scikit-learn's bundled 8x8 handwritten digits.

The data ships inside scikit-learn (``sklearn.datasets.load_digits``: 1797 images, no
download). Every fifth image is held out for validation. Train it with::

    shardwise train examples/digits_ddp.py --nproc-per-node 2

The config uses ``DDPStrategy(sync_bn='torch')``: the BatchNorm layers become synchronised
BatchNorm, which on CPU is shardwise's ``CPUSyncBatchNorm`` (it runs on gloo).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

from shardwise.registry import DATASETS, MODELS


@DATASETS.register_module()
class Digits(Dataset):
    """``(image, label)`` pairs: images of shape (1, 8, 8) scaled to [0, 1]; ``split`` is
    ``'train'`` (4 of every 5 images) or ``'val'`` (every fifth)."""

    def __init__(self, split: str = "train") -> None:
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise ImportError(
                "the digits example needs scikit-learn: pip install 'shardwise[examples]'"
            ) from None
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        digits = load_digits()
        held_out = torch.arange(len(digits.target)) % 5 == 0
        keep = held_out if split == "val" else ~held_out
        self.images = torch.tensor(digits.images, dtype=torch.float32)[keep].unsqueeze(1) / 16
        self.labels = torch.tensor(digits.target)[keep]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]


def conv_bn(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
    )


@MODELS.register_module()
class DigitsCNN(nn.Module):
    """Three conv-BatchNorm-ReLU blocks and a linear classifier.

    ``forward(images, labels)`` returns ``dict(loss=..., logits=...)``: the loss for the
    runner's default train step, the logits for the ``Accuracy`` metric.
    """

    def __init__(self, width: int = 32, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            conv_bn(1, width),
            conv_bn(width, width),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            conv_bn(width, 2 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(2 * width, num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None):
        logits = self.classifier(self.features(images))
        if labels is None:
            return logits
        return dict(loss=F.cross_entropy(logits, labels), logits=logits)
