"""A user's own dataset and model, as a raymtl plugin: `bars`, seeded 12x12 grey images of a
bar in one of four orientations, and `tiny_cnn`, a small CNN defined here.

Name this file in an experiment's `plugins:` list, then use `data.name: bars` and
`model.name: tiny_cnn` with any built-in algorithm. It imports nothing but the public
`raymtl.extend`; swap `make_bars` for your own arrays (np.load of an .npz, a folder of
images) and keep the rest.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from raymtl.extend import FedModel, Pool, register_dataset, register_model

ORIENTATIONS = ("horizontal", "vertical", "diagonal", "anti_diagonal")


def make_bars(num_samples: int, size: int, noise: float, seed: int) -> tuple[np.ndarray, ...]:
    """(images uint8 (N, 1, size, size), labels int64 (N,)): one bar of length size/2 per
    image, at a random place, in the orientation its label names, over Gaussian noise."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(num_samples) % len(ORIENTATIONS))
    images = rng.normal(0.0, noise, size=(num_samples, size, size))
    length = size // 2
    steps = np.arange(length)
    for image, label in zip(images, labels, strict=True):
        row, col = rng.integers(0, size - length + 1, size=2)
        rows, cols = {
            0: (np.full(length, row + length // 2), col + steps),
            1: (row + steps, np.full(length, col + length // 2)),
            2: (row + steps, col + steps),
            3: (row + steps, col + length - 1 - steps),
        }[int(label)]
        image[rows, cols] += 1.0
    pixels = np.clip(images, 0.0, 1.0) * 255
    return pixels.round().astype(np.uint8)[:, None], labels.astype(np.int64)


@register_dataset("bars")
def load_bars(
    root: str | None = None,
    download: bool = False,
    seed: int = 0,
    num_samples: int = 1200,
    size: int = 12,
    noise: float = 0.2,
) -> Pool:
    """Seeded 12x12 grey images of a bar: horizontal, vertical or diagonal (4 classes).

    The whole dataset as one Pool; raymtl partitions it among the clients. `root` and
    `download` are every source's arguments (unused: the arrays are made here); `seed` is
    the experiment's seed; the other keywords are `data.params`.
    """
    # A bad value is one line naming its field, as raymtl's own sources do.
    for field, value, least in (("num_samples", num_samples, 4), ("size", size, 4)):
        if value < least:
            raise ValueError(f"data.params.{field}: {value} must be >= {least}")
    if noise < 0:
        raise ValueError(f"data.params.noise: {noise} must be >= 0")
    images, labels = make_bars(num_samples, size, noise, seed)
    return Pool(
        x=torch.from_numpy(images),
        y=torch.from_numpy(labels),
        num_classes=len(ORIENTATIONS),
        class_names=ORIENTATIONS,
        scale=255.0,  # x / scale lies in [0, 1]
        source="bars (made by my_data.py)",
    )


@register_model
class TinyCNN(FedModel):
    """Two 3x3 convolutions (the backbone, shared features) and a linear head."""

    name = "tiny_cnn"
    description = "two-conv CNN from examples/own_data (backbone + linear head)"

    def __init__(self, input_shape, num_classes, width: int = 8):
        channels = input_shape[0]
        backbone = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveMaxPool2d(2),  # a bar anywhere in a quadrant: its strongest response
            nn.Flatten(),  # forward is head(backbone(x)): the head takes flat features
        )
        feature_dim = 2 * width * 2 * 2
        super().__init__(backbone, nn.Linear(feature_dim, num_classes), feature_dim)
