"""A tiny image folder for the OpenMMLab example, generated (no download): mmpretrain's
``CustomDataset`` layout, one folder per class, the class names the folders' names::

    data/train/red/0.png ... data/train/blue/31.png     (32 images a class)
    data/val/red/0.png   ... data/val/blue/7.png        (8 images a class)

Each 32x32 image is noise in which the channel of its class is brighter: learnable, not at once.
Deterministic. Run from the repository root (``resnet18.py`` reads ``data/``)::

    .venv/bin/python examples/openmmlab/make_images.py          # or: ... make_images.py DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ("red", "green", "blue")  # the brighter channel, in RGB order
PER_CLASS = {"train": 32, "val": 8}
SIZE = 32


def make_images(root: Path) -> None:
    rng = np.random.default_rng(0)
    for split, count in PER_CLASS.items():
        for channel, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = rng.integers(0, 160, (SIZE, SIZE, 3))
                pixels[..., channel] += 60
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i}.png")


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "data")
    make_images(root)
    print(f"{root}/train/<class>/*.png and {root}/val/<class>/*.png, classes {', '.join(CLASSES)}")
