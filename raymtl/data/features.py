"""Φ: the feature map users apply to their own images before the one-shot clustering.

Ali & Arafa (docs/ALGORITHMS.md, One-shot clustering HFL): Φ = identity on 28×28 grey images
(d = 784); for colour images the convolutional features of an ImageNet-pretrained
ResNet-18 (d = 512). Here the pretrained weights are only used when they are already
in the local torch hub cache (nothing is downloaded); otherwise Φ(x) = P·vec(x) with a
fixed seeded Gaussian P ∈ R^{d×m}/√d shared by every user (same seed for all).

    feature_map(x, kind, seed, dim) -> (Φ(x) ∈ R^{n×d} float64 numpy, kind actually used)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

FEATURE_MAPS = ("auto", "identity", "pretrained", "random_projection")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_BATCH = 256


def pretrained_weights() -> Path | None:
    """A ResNet-18 checkpoint already in the torch hub cache, or None (never downloads)."""
    directory = Path(torch.hub.get_dir()) / "checkpoints"
    found = sorted(directory.glob("resnet18*.pth")) if directory.is_dir() else []
    return found[0] if found else None


def resolve(kind: str, channels: int) -> str:
    """The map `auto` stands for: identity for grey, pretrained or projection for colour."""
    if kind not in FEATURE_MAPS:
        raise ValueError(f"feature_map: {kind!r} is not one of {', '.join(FEATURE_MAPS)}")
    if kind == "auto":
        if channels == 1:
            return "identity"
        kind = "pretrained"
    if kind == "pretrained" and (channels != 3 or pretrained_weights() is None):
        return "random_projection"  # no local weights (or not RGB): the seeded fallback
    return kind


def random_projection(x: torch.Tensor, seed: int, dim: int) -> np.ndarray:
    """Φ(x) = P·vec(x), P ~ N(0, 1/d) of shape (d, m), identical for every user of a seed."""
    flat = x.detach().to("cpu", torch.float64).flatten(1)
    generator = torch.Generator().manual_seed(seed)
    projection = torch.randn(flat.shape[1], dim, generator=generator, dtype=torch.float64)
    return (flat @ projection / dim**0.5).numpy()


@torch.no_grad()
def resnet18_features(x: torch.Tensor) -> np.ndarray:
    """ImageNet ResNet-18 convolutional features (global-average-pooled, d = 512)."""
    from torchvision.models import resnet18

    network = resnet18(weights=None)
    network.load_state_dict(torch.load(pretrained_weights(), map_location="cpu"))
    network.fc = torch.nn.Identity()
    network.eval()
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    images = x.detach().to("cpu", torch.float32)
    chunks = [network((batch - mean) / std) for batch in images.split(_BATCH)]
    return torch.cat(chunks).to(torch.float64).numpy()


def feature_map(x: torch.Tensor, kind: str, seed: int, dim: int = 256) -> tuple[np.ndarray, str]:
    """Φ(x) as an (n, d) float64 array, and which map was used."""
    used = resolve(kind, int(x.shape[1]))
    if used == "identity":
        return x.detach().to("cpu", torch.float64).flatten(1).numpy(), used
    if used == "pretrained":
        return resnet18_features(x), used
    return random_projection(x, seed, dim), used
