"""Per-image targets of grayscale pools: the offline twin of CelebA's two task groups.

Binary attributes and landmarks, fixed per image like CelebA's annotations, from its pixels
(and, for Fashion-MNIST, its class). Item pixels have x / scale > 0.1; "intensity" is theirs (0
elsewhere). Thresholds are pool medians over non-empty images, so attributes are about
balanced; on ties, ">=" replaces ">" if its rate is closer to 50%.

=============  =========================================================  ===================
attribute      1. when                                                    not a label copy
=============  =========================================================  ===================
upper_body     class in {T-shirt/top, Pullover, Dress, Coat, Shirt}        union of 5 classes
footwear       class in {Sandal, Sneaker, Ankle boot}                      union of 3 classes
bright         mean item intensity > pool median                           varies in a class
high_contrast  std of item intensities > pool median                       varies in a class
large          item pixels / image area > pool median                      varies in a class
filled         item pixels / bounding-box area > pool median               varies in a class
wide           column spread / row spread > pool median                    varies in a class
symmetric      left-right asymmetry < pool median                          varies in a class
top_heavy      centroid's depth in the bounding box < pool median          varies in a class
=============  =========================================================  ===================

upper_body and footwear: Fashion-MNIST only (known by its class names), first. A spread is the
intensity-weighted std of the row (column) index (box width / height ties a lot on 8x8 digits).
Asymmetry is sum |v - mirror(v)| / (2 sum v), mirrored about the box's centre column. The
centroid's depth in the box is (centroid_row - top + 0.5) / box height.

Landmarks, a row or column index / (side - 1): bbox_top, bbox_bottom, bbox_left, bbox_right
(extreme rows / columns with item pixels), centroid_row, centroid_col (intensity-weighted).
An empty image gets the whole image as box, its centre as centroid, every attribute 0: no NaN.

Both are registered targets (tasks/registry.py). Cache: a dict keyed by (pool.source, x's
shape and dtype, scale, class names, builder), not by id() (reused once a pool is freed); an
entry keeps its pool's x and y and serves only the same or equal ones, so pools sharing a key
are not confused. Returned tensors are shared: read-only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from raymtl.tasks.registry import Targets, register_target
from raymtl.tasks.spec import Samples

ITEM_THRESHOLD = 0.1  # a pixel belongs to the item above this fraction of the maximum intensity
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
FASHION_GROUPS = {
    "upper_body": ("T-shirt/top", "Pullover", "Dress", "Coat", "Shirt"),
    "footwear": ("Sandal", "Sneaker", "Ankle boot"),
}
LANDMARK_NAMES = (
    "bbox_top",
    "bbox_bottom",
    "bbox_left",
    "bbox_right",
    "centroid_row",
    "centroid_col",
)
# Images per block: whole-pool float temporaries (220 MB on Fashion-MNIST) page-fault for seconds.
BLOCK_SIZE = 4096


def _first_true(flags: torch.Tensor) -> torch.Tensor:
    # argmax returns the first maximum, and 0 for an all-False row (the empty-image fallback).
    return flags.to(torch.uint8).argmax(dim=1)


def _moments(profile: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Intensity-weighted mean and std of the index along (n, L) profiles; centre, 0 if empty."""
    index = torch.arange(profile.shape[1], dtype=torch.float32)
    mass = profile.sum(dim=1)
    weights = profile / mass.clamp_min(1e-12)[:, None]
    mean = (weights * index).sum(dim=1)
    spread = (weights * (index - mean[:, None]) ** 2).sum(dim=1).sqrt()
    return torch.where(mass > 0, mean, torch.tensor((profile.shape[1] - 1) / 2)), spread


def _asymmetry(item: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """sum |v - mirror(v)| / (2 sum v), mirrored about each image's bounding-box centre."""
    columns = torch.arange(item.shape[2])
    mirror = (left + right)[:, None] - columns[None, :]  # (n, W); in the box for in-box columns
    in_box = (columns >= left[:, None]) & (columns <= right[:, None])
    index = mirror.clamp(0, item.shape[2] - 1)[:, None, :].expand_as(item)
    difference = (item - item.gather(2, index)).abs() * in_box[:, None, :]
    return difference.sum(dim=(1, 2)) / (2 * item.sum(dim=(1, 2))).clamp_min(1e-12)


def _block_measures(images: torch.Tensor, scale: float) -> dict[str, torch.Tensor]:
    """Per image of an (n, C, H, W) block: landmarks in [0, 1], then attribute statistics."""
    intensity = images.float().mean(dim=1) / scale  # channels averaged: C = 1 here
    item = torch.nn.functional.threshold(intensity, ITEM_THRESHOLD, 0.0)  # x if x > t else 0
    height, width = item.shape[1:]
    row_profile, col_profile = item.sum(dim=2), item.sum(dim=1)
    rows, cols = row_profile > 0, col_profile > 0
    # Flipped, the first True is the last one; empty images get bottom = H-1, right = W-1.
    top, bottom = _first_true(rows), (height - 1) - _first_true(rows.flip(1))
    left, right = _first_true(cols), (width - 1) - _first_true(cols.flip(1))
    centroid_row, row_spread = _moments(row_profile)
    centroid_col, col_spread = _moments(col_profile)
    count = (item > 0).sum(dim=(1, 2)).float()
    mean = row_profile.sum(dim=1) / count.clamp_min(1)
    std = ((item * item).sum(dim=(1, 2)) / count.clamp_min(1) - mean**2).clamp_min(0).sqrt()
    box_height, box_width = (bottom - top + 1).float(), (right - left + 1).float()
    row_scale, col_scale = max(height - 1, 1), max(width - 1, 1)
    landmarks = (top / row_scale, bottom / row_scale, left / col_scale, right / col_scale)
    landmarks += (centroid_row / row_scale, centroid_col / col_scale)
    return {
        **dict(zip(LANDMARK_NAMES, landmarks, strict=True)),
        "bright": mean,
        "high_contrast": std,
        "large": count / (height * width),
        "filled": count / (box_height * box_width),
        "wide": col_spread / row_spread.clamp_min(1e-6),
        "symmetric": -_asymmetry(item, left, right),  # negated: low asymmetry is the attribute
        "top_heavy": -(centroid_row - top + 0.5) / box_height,  # negated: high is the attribute
    }


def _above_median(statistic: torch.Tensor, has_item: torch.Tensor) -> torch.Tensor:
    """1. where `statistic` beats the median of non-empty images; empty images get 0."""
    # With no item at all the median is NaN: every comparison is False, every attribute 0.
    median, valid = statistic[has_item].median(), max(has_item.sum().item(), 1)
    strict, loose = (statistic > median) & has_item, (statistic >= median) & has_item
    # Images can tie on the median (equal pixel counts): take the rate closer to one half.
    return min((strict, loose), key=lambda flags: abs(flags.sum().item() / valid - 0.5)).float()


def _class_attributes(pool: Samples) -> dict[str, torch.Tensor]:
    if tuple(pool.class_names) != FASHION_MNIST_CLASSES:
        return {}
    groups = {}
    for group, names in FASHION_GROUPS.items():
        labels = torch.tensor([FASHION_MNIST_CLASSES.index(name) for name in names])
        groups[group] = torch.isin(pool.y, labels).float()
    return groups


def _measure(pool: Samples) -> dict[str, torch.Tensor]:
    # One intra-op thread: these small ops gain little from more, and while other processes
    # load the CPUs, waiting on preempted threads turned a 0.3 s build into 5 s.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        blocks = [_block_measures(block, pool.scale) for block in pool.x.split(BLOCK_SIZE)]
    finally:
        torch.set_num_threads(threads)
    return {name: torch.cat([block[name] for block in blocks]) for name in blocks[0]}


def _build_attributes(pool: Samples) -> Targets:
    measures = _cached("measures", _measure, pool)
    has_item = measures["large"] > 0  # at least one item pixel
    columns = _class_attributes(pool)
    for name, statistic in measures.items():
        if name not in LANDMARK_NAMES:
            columns[name] = _above_median(statistic, has_item)
    return Targets(torch.stack(list(columns.values()), dim=1), tuple(columns))


def _build_landmarks(pool: Samples) -> Targets:
    measures = _cached("measures", _measure, pool)
    return Targets(torch.stack([measures[name] for name in LANDMARK_NAMES], dim=1), LANDMARK_NAMES)


_CACHE: dict[tuple, tuple[torch.Tensor, torch.Tensor, object]] = {}


def _cached(name: str, build: Callable[[Samples], Any], pool: Samples) -> Any:
    key = (pool.source, tuple(pool.x.shape), pool.x.dtype, pool.scale, pool.class_names, name)
    cached_x, cached_y, built = _CACHE.get(key, (None, None, None))
    same_x = cached_x is pool.x or (cached_x is not None and torch.equal(cached_x, pool.x))
    if same_x and (cached_y is pool.y or torch.equal(cached_y, pool.y)):
        return built
    built = build(pool)
    _CACHE[key] = (pool.x, pool.y, built)  # one entry per key: a differing pool replaces it
    return built


def _grey(pool: Samples, name: str) -> Samples:
    if pool.x.shape[1] != 1:
        raise ValueError(f"'{name}' needs grayscale images")
    return pool


@register_target("attributes", loss="bce")
def attribute_targets(pool: Samples) -> Targets:
    """Binary attributes of grey images (tasks/targets.py), multi-label."""
    return _cached("attributes", _build_attributes, _grey(pool, "attributes"))


@register_target("landmarks", loss="mse")
def landmark_targets(pool: Samples) -> Targets:
    """Bounding box and intensity centroid of grey images, regression."""
    return _cached("landmarks", _build_landmarks, _grey(pool, "landmarks"))
