"""materialize: scaling, rotation, fixed patch masks and task relabelling."""

import numpy as np
import pytest
import torch

from raymtl.data import ClientShard, Pool, materialize


def make_pool(num_samples=20, shape=(1, 4, 4), num_classes=10):
    x = torch.randint(0, 256, (num_samples, *shape), generator=torch.Generator().manual_seed(0))
    y = torch.arange(num_samples) % num_classes
    names = tuple(str(label) for label in range(num_classes))
    return Pool(x.to(torch.uint8), y, num_classes, names, 255.0, "test")


def make_shard(train, test, client_id=0, rotation=0, mask_prob=0.0, task_classes=None):
    return ClientShard(
        client_id, np.asarray(train), np.asarray(test), 0, rotation, mask_prob, 0, task_classes
    )


def test_scales_to_unit_float_and_keeps_labels():
    pool = make_pool()
    data = materialize(pool, make_shard([3, 5, 7], [1]), seed=0)
    assert data.train_x.dtype == torch.float32
    assert torch.equal(data.train_x, pool.x[[3, 5, 7]].float() / 255)
    assert data.train_y.tolist() == [3, 5, 7] and data.test_y.tolist() == [1]
    assert (data.num_classes, data.input_shape) == (10, (1, 4, 4))


@pytest.mark.parametrize("rotation", [90, 180, 270, -90])
def test_rotation_matches_hand_rotated_tensor(rotation):
    pool = make_pool()
    data = materialize(pool, make_shard([0, 2], [4], rotation=rotation), seed=0)
    expected = torch.rot90(pool.x[[0, 2]].float() / 255, k=rotation // 90, dims=(-2, -1))
    assert torch.equal(data.train_x, expected)
    assert not torch.equal(data.train_x, pool.x[[0, 2]].float() / 255)


def ones_pool(num_samples, height=8, width=8):
    x = torch.ones(num_samples, 1, height, width)
    return Pool(x, torch.zeros(num_samples, dtype=torch.int64), 1, ("only",), 1.0, "test")


def test_mask_zeroes_whole_2x2_patches_at_the_right_rate():
    pool = ones_pool(2000)
    shard = make_shard(np.arange(1500), np.arange(1500, 2000), mask_prob=0.3)
    data = materialize(pool, shard, seed=0)
    patches = data.train_x.unfold(-2, 2, 2).unfold(-2, 2, 2)  # (N, 1, 4, 4, 2, 2)
    patch_sums = patches.sum(dim=(-2, -1))
    assert set(patch_sums.unique().tolist()) == {0.0, 4.0}  # all-or-nothing per patch
    assert (patch_sums == 0).float().mean().item() == pytest.approx(0.3, abs=0.02)
    assert (data.test_x == 0).float().mean().item() == pytest.approx(0.3, abs=0.03)


def test_mask_is_fixed_per_seed_and_client():
    pool = ones_pool(50)
    shard = make_shard(np.arange(40), np.arange(40, 50), mask_prob=0.5)
    first, again = materialize(pool, shard, seed=3), materialize(pool, shard, seed=3)
    assert torch.equal(first.train_x, again.train_x) and torch.equal(first.test_x, again.test_x)
    other_client = make_shard(np.arange(40), np.arange(40, 50), client_id=1, mask_prob=0.5)
    assert not torch.equal(first.train_x, materialize(pool, other_client, seed=3).train_x)
    assert not torch.equal(first.train_x, materialize(pool, shard, seed=4).train_x)


def test_mask_covers_odd_sizes():
    data = materialize(ones_pool(200, 5, 5), make_shard(np.arange(150), [150], mask_prob=0.5), 0)
    assert data.input_shape == (1, 5, 5)
    assert 0 < (data.train_x[..., 4, 4] == 0).float().mean() < 1


def test_zero_mask_prob_keeps_everything():
    data = materialize(ones_pool(10), make_shard(np.arange(8), [8, 9]), seed=0)
    assert bool((data.train_x == 1).all())


def test_relabels_with_task_classes():
    pool = make_pool()
    data = materialize(pool, make_shard([3, 7, 13], [17], task_classes=(7, 3)), seed=0)
    assert data.train_y.tolist() == [1, 0, 1] and data.test_y.tolist() == [0]
    assert data.num_classes == 2


def test_relabel_rejects_labels_outside_the_task():
    with pytest.raises(ValueError, match="task_classes"):
        materialize(make_pool(), make_shard([3, 4], [7], task_classes=(3, 7)), seed=0)
