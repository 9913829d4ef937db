"""Per-image attribute and landmark targets: hand-drawn images, digits and Fashion-MNIST."""

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from raymtl.data import Pool, load_pool
from raymtl.tasks import TARGETS, Targets, register_target, targets
from raymtl.tasks.registry import compute_targets, target_outputs
from raymtl.tasks.targets import LANDMARK_NAMES, attribute_targets, landmark_targets

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
IMAGE_ATTRIBUTES = ("bright", "high_contrast", "large", "filled", "wide", "symmetric", "top_heavy")
INK = 16  # full intensity at scale 16 (digits' scale)


def draw(*strokes: tuple[slice, slice, int]) -> np.ndarray:
    """An 8x8 image with each (rows, cols, value) stroke painted in."""
    image = np.zeros((8, 8), dtype=np.uint8)
    for rows, cols, value in strokes:
        image[rows, cols] = value
    return image


# Named so the expectations below read as pictures; every pixel of a stroke is INK unless set.
HAND_IMAGES = {
    "rectangle": draw((slice(2, 6), slice(1, 7), INK)),  # rows 2-5, cols 1-6
    "L": draw((slice(1, 7), slice(1, 2), INK), (slice(6, 7), slice(2, 6), INK)),
    "cross": draw((slice(3, 4), slice(1, 6), INK), (slice(1, 6), slice(3, 4), INK)),
    "T": draw((slice(1, 2), slice(1, 6), INK), (slice(2, 7), slice(3, 4), INK)),
    "two_dots": draw((slice(2, 3), slice(2, 3), INK), (slice(2, 3), slice(5, 6), INK // 2)),
    "empty": draw((slice(0, 8), slice(0, 8), 1)),  # 1/16 < 0.1 everywhere: faint, no item
}
# (top, bottom, left, right, centroid row, centroid col) in pixels, worked out by hand.
HAND_LANDMARKS = {
    "rectangle": (2, 5, 1, 6, 3.5, 3.5),
    "L": (1, 6, 1, 5, 4.5, 2.0),  # rows (1+..+6 + 4*6)/10, cols (6*1 + 2+3+4+5)/10
    "cross": (1, 5, 1, 5, 3.0, 3.0),
    "T": (1, 6, 1, 5, 2.5, 3.0),  # rows (5*1 + 2+..+6)/10
    "two_dots": (2, 2, 2, 5, 2.0, 3.0),  # cols (2*16 + 5*8)/24
    "empty": (0, 7, 0, 7, 3.5, 3.5),  # fallback: whole image, centre
}
# Attributes whose pool medians are decided by exact statistics (worked out by hand over the
# five non-empty images), in HAND_IMAGES order; the empty image has none.
HAND_ATTRIBUTES = {
    "bright": (1, 1, 1, 1, 0, 0),  # mean 1 except two_dots 0.75; ">=" gives 4/5
    "high_contrast": (0, 0, 0, 0, 1, 0),  # std 0 except two_dots 0.25
    "large": (1, 1, 0, 1, 0, 0),  # pixels 24, 10, 9, 10, 2; median 10, ">=" gives 3/5
    "filled": (1, 0, 0, 0, 1, 0),  # box fill 1, 1/3, 9/25, 1/3, 1/2; median 9/25
    "wide": (1, 0, 0, 0, 1, 0),  # spread ratio 1.53, 0.78, 1, 0.55, huge (one row); median 1
    "symmetric": (1, 0, 1, 1, 0, 0),  # asymmetry 0, 1/2, 0, 0, 1/3
}


def make_pool(images) -> Pool:
    """A pool of 8x8 images at digits' scale, one class per image."""
    x = torch.from_numpy(np.stack(images)).unsqueeze(1)
    names = tuple(str(label) for label in range(len(images)))
    return Pool(x, torch.arange(len(images)), len(names), names, 16.0, "hand")


@pytest.fixture
def hand_pool() -> Pool:
    return make_pool(list(HAND_IMAGES.values()))


def column(result, name: str) -> list[float]:
    return result.values[:, result.names.index(name)].tolist()


def test_hand_drawn_landmarks_are_exact(hand_pool):
    landmarks = landmark_targets(hand_pool)
    assert landmarks.names == LANDMARK_NAMES
    expected = torch.tensor(list(HAND_LANDMARKS.values()), dtype=torch.float32) / 7
    torch.testing.assert_close(landmarks.values, expected)


def test_hand_drawn_attributes(hand_pool):
    attributes = attribute_targets(hand_pool)
    assert attributes.names == IMAGE_ATTRIBUTES  # no class-derived ones outside Fashion-MNIST
    for name, expected in HAND_ATTRIBUTES.items():
        assert column(attributes, name) == list(expected), name
    # Centroid depth in the box: rectangle, cross and two_dots all sit at 1/2 in exact
    # arithmetic, so only the extremes are decidable: the T is top-heavy, the L is not.
    top_heavy = dict(zip(HAND_IMAGES, column(attributes, "top_heavy"), strict=True))
    assert (top_heavy["T"], top_heavy["L"], top_heavy["empty"]) == (1.0, 0.0, 0.0)


def test_an_all_empty_pool_has_no_nan():
    pool = make_pool([np.zeros((8, 8), dtype=np.uint8)] * 3)
    attributes, landmarks = attribute_targets(pool), landmark_targets(pool)
    assert not attributes.values.isnan().any() and not attributes.values.any()
    assert landmarks.values.tolist() == [[0.0, 1.0, 0.0, 1.0, 0.5, 0.5]] * 3


def test_cache_returns_the_same_targets_and_never_mixes_pools(hand_pool):
    assert attribute_targets(hand_pool) is attribute_targets(hand_pool)
    # Same source, shape and class names but other pixels: must not be served from the cache.
    flipped = make_pool([image[::-1].copy() for image in HAND_IMAGES.values()])
    assert not torch.equal(landmark_targets(flipped).values, landmark_targets(hand_pool).values)
    # An equal copy (a new Pool object) is served from the cache.
    copy = make_pool(list(HAND_IMAGES.values()))
    assert landmark_targets(copy) is landmark_targets(hand_pool)
    built_in = {name: (spec.loss, spec.from_labels) for name, spec in TARGETS.items()}
    assert {"label", "attributes", "landmarks"} <= set(built_in)
    assert built_in["attributes"] == ("bce", False) and built_in["landmarks"] == ("mse", False)
    assert built_in["label"] == ("cross_entropy", True)


def check_targets(pool: Pool, attributes, landmarks) -> None:
    """Shapes, dtypes and ranges, balance, and no attribute that is a copy of the label."""
    count = len(pool.y)
    assert attributes.values.shape == (count, len(attributes.names))
    assert landmarks.values.shape == (count, len(LANDMARK_NAMES)) and len(LANDMARK_NAMES) >= 6
    for result in (attributes, landmarks):
        assert result.values.dtype == torch.float32 and not result.values.isnan().any()
    assert ((attributes.values == 0) | (attributes.values == 1)).all()
    assert landmarks.values.min() >= 0 and landmarks.values.max() <= 1
    rates = attributes.values.mean(dim=0)
    assert ((rates > 0.1) & (rates < 0.9)).all(), dict(
        zip(attributes.names, rates.tolist(), strict=True)
    )
    for index, name in enumerate(attributes.names):
        flags = attributes.values[:, index].bool()
        for label in range(pool.num_classes):
            assert not torch.equal(flags, pool.y == label), (name, label)
        if name in IMAGE_ATTRIBUTES:
            varies = [
                flags[pool.y == label].unique().numel() == 2 for label in range(pool.num_classes)
            ]
            assert any(varies), name


def test_digits_targets():
    pool = load_pool("digits")
    attributes, landmarks = attribute_targets(pool), landmark_targets(pool)
    assert attributes.names == IMAGE_ATTRIBUTES
    check_targets(pool, attributes, landmarks)


@pytest.mark.skipif(not FASHION_DIR.is_dir(), reason=f"no Fashion-MNIST in {FASHION_DIR}")
def test_fashion_mnist_targets(monkeypatch):
    pool = load_pool("fashion_mnist")
    monkeypatch.setattr(targets, "_CACHE", {})  # time a real build, not a cache hit
    # CPU time, not wall time: other jobs sharing the machine must not fail this test (about
    # 0.3 s idle; the wall time is about the same when the machine is not loaded).
    start = time.process_time()
    attributes, landmarks = attribute_targets(pool), landmark_targets(pool)
    assert time.process_time() - start < 5.0
    assert len(attributes.names) >= 8
    assert attributes.names[:2] == ("upper_body", "footwear")
    assert attributes.names[2:] == IMAGE_ATTRIBUTES
    check_targets(pool, attributes, landmarks)
    # The class-derived attributes are unions of classes: T-shirt/top, Pullover, Dress, Coat,
    # Shirt and Sandal, Sneaker, Ankle boot.
    assert torch.equal(
        attributes.values[:, 0].bool(), torch.isin(pool.y, torch.tensor([0, 2, 3, 4, 6]))
    )
    assert torch.equal(attributes.values[:, 1].bool(), torch.isin(pool.y, torch.tensor([5, 7, 9])))


@pytest.fixture
def registered_targets():
    before = dict(TARGETS)
    yield
    TARGETS.clear()
    TARGETS.update(before)


def test_registered_targets_are_computed_checked_and_sized(hand_pool, registered_targets):
    @register_target("ink_half", loss="cross_entropy")
    def ink_half(pool):
        """Whether an image has more ink than the median one."""
        ink = pool.x.float().sum(dim=(1, 2, 3))
        return Targets((ink > ink.median()).long(), ("light", "dark"))

    register_target("ink", "mse", ["mae"], lambda pool: pool.x.float().sum(dim=(2, 3)) / 64)
    spec = TARGETS["ink_half"]
    assert (spec.loss, spec.metrics, spec.description) == (
        "cross_entropy",
        ("accuracy",),
        "Whether an image has more ink than the median one.",
    )
    half = compute_targets("ink_half", hand_pool)
    assert half.names == ("light", "dark") and half.values.dtype == torch.int64
    assert compute_targets("ink_half", hand_pool) is half  # once per pool
    assert target_outputs(hand_pool, "ink_half", None) == 2
    ink = compute_targets("ink", hand_pool)
    assert ink.values.shape == (len(hand_pool.y), 1) and ink.names == ("ink_0",)
    assert target_outputs(hand_pool, "ink", None) == 1 and TARGETS["ink"].metrics == ("mae",)
    assert target_outputs(hand_pool, "label", (3, 5)) == 2


def test_targets_that_break_the_contract_are_refused(hand_pool, registered_targets):
    def wrong(pool):
        return torch.zeros(len(pool.y), 2)  # floats where class ids are due

    register_target("wrong", "cross_entropy", build=wrong)
    with pytest.raises(ValueError, match=r"^targets 'wrong': cross_entropy targets are \("):
        compute_targets("wrong", hand_pool)
    refused = {
        ("x", "hinge", None): "loss 'hinge' is not one of cross_entropy, bce, mse",
        ("x", "bce", ("mse",)): "metrics of loss bce are some of precision, recall, f1",
        ("label", "cross_entropy", None): "'label' is registered twice",
    }
    for (name, loss, metrics), problem in refused.items():
        with pytest.raises(ValueError) as error:
            register_target(name, loss, metrics, build=wrong)
        assert problem in str(error.value)
    with pytest.raises(ValueError, match="build must be a function build"):
        register_target("two_args", "mse", build=lambda pool, other: None)
